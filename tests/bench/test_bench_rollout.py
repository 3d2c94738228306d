"""bench.rollout's generate baseline ends a turn where the engine does: at eos, or once `</tool_call>` is written."""

from bench.rollout import CALL, _turn_end
from engine.models import load_tokenizer


def test_a_generate_turn_ends_after_the_whole_close_tag_not_at_the_opening_bracket():
    tok = load_tokenizer("smollm2")  # `</tool_call>` is five tokens; its last, `>`, also closes `<tool_call>`
    call = tok.encode(CALL, add_special_tokens=False)
    tail = tok.encode(" and then some more text", add_special_tokens=False)
    eos = {tok.eos_token_id}
    assert _turn_end(tok, call + tail, eos) == len(call)
    assert _turn_end(tok, call[:3] + [tok.eos_token_id] + tail, eos) == 4
    assert _turn_end(tok, tail, eos) == len(tail)
