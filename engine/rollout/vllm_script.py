"""A vLLM logits processor that makes greedy decoding write chosen tokens on cue (tests and benches only).

The vLLM side of tests/scripted_model.py and bench/rollout.py's `bias_policy`: a real model whose
greedy output is steered at chosen positions, so the vLLM backend can be driven through tool calls,
malformed calls and ends of turn exactly like the torch engine. Per request, from
`SamplingParams.extra_args` (the engine's `sampling_extra_args`): `libra_script` {position: token}
with `libra_bias`, and/or `libra_banned` token ids with `libra_ban`. At the position p being
written, banned tokens lose `libra_ban`, then `script[p]` gains `libra_bias`; p counts the whole
context (prompt, earlier turns and tool output) as the torch engine's position ids do. A request
with neither gets no processor. Give the class to the engine as
`engine_kwargs={"logits_processors": [ScriptLogits]}`: it is module-level so that vLLM's engine core,
a spawned process, can import it. Imports vLLM: only import this module where vLLM is installed.

Invariant (tests/engine/rollout/test_vllm_engine.py): with the same script, the vLLM backend's tool trajectories
equal the torch engine's with `Scripted`.
"""

from __future__ import annotations

from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

__all__ = ["ScriptLogits"]


class ScriptLogits(AdapterLogitsProcessor):
    @classmethod
    def validate_params(cls, params):
        pass

    def is_argmax_invariant(self) -> bool:
        return False  # it moves the argmax: greedy decoding must see it

    def new_req_logits_processor(self, params):
        extra = params.extra_args or {}
        script, banned = extra.get("libra_script") or {}, list(extra.get("libra_banned", ()))
        if not script and not banned:
            return None
        script = {int(k): int(v) for k, v in script.items()}  # int keys may arrive as str after serialisation
        bias, ban = extra.get("libra_bias", 0.0), extra.get("libra_ban", 0.0)

        def apply(prompt_ids, output_ids, logits):
            if banned:
                logits[banned] -= ban
            tok = script.get(len(prompt_ids) + len(output_ids))
            if tok is not None:
                logits[tok] += bias
            return logits

        return apply
