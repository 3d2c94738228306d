"""A real tiny model made to write chosen tokens: the tests' way to drive the rollout engine through
tool calls, malformed output and end of turn on cue, with real forwards and real KV caches."""

import torch


class Scripted(torch.nn.Module):
    """The model plus a position-keyed logit bias: greedy decoding writes `script[p]` at position p."""

    def __init__(self, model, script: dict[int, int], bias: float = 30.0):
        super().__init__()
        self.inner, self.script, self.bias = model, script, bias
        self.config, self.generation_config = model.config, model.generation_config

    @classmethod
    def writing(cls, model, tok, prompt_len: int, text: str, bias: float = 50.0) -> "Scripted":
        """Writes `text` right after a prompt of `prompt_len` tokens, then ends the turn."""
        ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
        return cls(model, {prompt_len + i: t for i, t in enumerate(ids)}, bias)

    def forward(self, *, input_ids, position_ids, **kw):
        out = self.inner(input_ids=input_ids, position_ids=position_ids, **kw)
        pos = position_ids[:, -out.logits.shape[1]:]
        for b in range(pos.shape[0]):
            for t in range(pos.shape[1]):
                tok = self.script.get(int(pos[b, t]) + 1)
                if tok is not None:
                    out.logits[b, t, tok] += self.bias
        return out
