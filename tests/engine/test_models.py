"""Model loading and the chat template with tools."""

import json

import pytest
import torch

from engine.chat import SPECIAL_STRINGS, parse_tool_calls, render_text, tool_response_text
from engine.models import build_tiny, cache_root, load_policy, model_arch_name, render_prompt, render_tool_response
from envs.base import ToolCall, ToolCallError

TOOLS = ({"type": "function", "function": {"name": "calc", "description": "add", "parameters": {"type": "object", "properties": {}}}},)


@pytest.fixture(scope="module")
def tiny():
    return build_tiny(0)


def test_tiny_is_deterministic_and_small(tiny):
    model, tok = tiny
    model2, tok2 = build_tiny(0)
    other, _ = build_tiny(1)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), model2.state_dict().values()))
    assert not torch.equal(model.model.embed_tokens.weight, other.model.embed_tokens.weight)
    assert tok.get_vocab() == tok2.get_vocab() and len(tok) == 512 == model.config.vocab_size
    assert [tok.encode(s, add_special_tokens=False) for s in SPECIAL_STRINGS] == [[1], [2], [3], [4], [5], [6]]
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id == 0


def test_render_prompt_and_tool_response_round_trip(tiny):
    _, tok = tiny
    messages = ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+3?"})
    ids = render_prompt(tok, messages, TOOLS)
    text = tok.decode(ids, skip_special_tokens=False)
    assert text == render_text(messages, TOOLS)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n") and text.endswith("<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n")
    assert json.dumps(TOOLS[0]) in text
    resp = render_tool_response(tok, "5")
    assert tok.decode(resp, skip_special_tokens=False) == "<|im_end|>\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert tool_response_text(["a", "b"], close_turn=False) == (
        "\n<|im_start|>user\n<tool_response>\na\n</tool_response>\n<tool_response>\nb\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_history_with_tool_calls_renders_hermes():
    text = render_text([{"role": "user", "content": "hi"},
                        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "calc", "arguments": {"x": 1}}}]},
                        {"role": "tool", "content": "2"}], ())
    assert text == ('<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{"name": "calc", "arguments": {"x": 1}}\n'
                    "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n2\n</tool_response><|im_end|>\n<|im_start|>assistant\n")


def test_parse_tool_calls_never_raises():
    calls = parse_tool_calls('x <tool_call>\n{"name": "calc", "arguments": {"x": 1}}\n</tool_call> <tool_call>{oops</tool_call>')
    assert isinstance(calls[0], ToolCall) and calls[0].name == "calc" and calls[0].arguments == {"x": 1}
    assert isinstance(calls[1], ToolCallError)


def test_unknown_spec_says_pass_a_local_path(tmp_path):
    with pytest.raises(ValueError, match="--model 'Qwen/Qwen3-4B' is not 'tiny', 'smollm2' or a local HF checkpoint directory"):
        load_policy("Qwen/Qwen3-4B", device="cpu")
    with pytest.raises(ValueError, match="pass its local path"):
        load_policy(str(tmp_path), device="cpu")


def test_model_arch_name():
    assert model_arch_name("tiny") == "tiny" and model_arch_name("smollm2") == "smollm2-135m"
    assert model_arch_name("/ckpt/Qwen3-4B/") == "qwen3-4b"


def test_a_checkpoint_outside_the_cost_tables_gets_a_spec_of_its_own_shape(tmp_path):
    """A local dir under a name the tables lack: the cost model's ModelSpec is read off its config (not another
    model's row: a 4B model's memory made the planner ask 4 trainer ranks of a 1M-parameter model)."""
    from engine.models import build_tiny, model_spec, save_policy_dir
    from scheduler.costmodel import MODELS

    model, tok = build_tiny(0, head_dim=64)
    spec = model_spec(str(save_policy_dir(model, tok, tmp_path / "my-finetune")))
    assert spec.name == "my-finetune" and spec.num_params == sum(p.numel() for p in model.parameters())
    assert (spec.num_layers, spec.hidden, spec.num_heads, spec.num_kv_heads, spec.head_dim) == (2, 256, 4, 2, 64)
    assert model_spec("smollm2") is MODELS["smollm2-135m"]


def test_local_dir_round_trip(tiny, tmp_path):
    model, tok = tiny
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, ltok = load_policy(str(tmp_path), device="cpu")
    ids = torch.tensor([render_prompt(ltok, ({"role": "user", "content": "hi"},), ())])
    assert ids[0].tolist() == render_prompt(tok, ({"role": "user", "content": "hi"},), ())
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-6)


@pytest.mark.slow
@pytest.mark.skipif(not (cache_root() / "smollm2-135m-instruct" / "config.json").is_file(), reason="SmolLM2 not converted yet (23 s)")
def test_smollm2_loads_from_cache_and_chats():
    model, tok = load_policy("smollm2", device="cpu")
    assert 134_000_000 < sum(p.numel() for p in model.parameters()) < 136_000_000
    assert tok.encode("<|im_end|>", add_special_tokens=False) == [tok.eos_token_id]
    assert len(render_prompt(tok, ({"role": "user", "content": "Say hi."},), TOOLS)) > 100
    ids = render_prompt(tok, ({"role": "user", "content": "Say hi."},), ())
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), model.config.vocab_size) and torch.isfinite(logits).all()
