"""The trajectory record that flows rollout -> coordinator -> trainer (plain data, no torch).

A trajectory keeps token ids exactly as generated: the trainer never re-tokenizes text. Every
position i of `token_ids` has a `loss_mask[i]` (1: the policy sampled it; 0: prompt, chat
template or tool output), a behaviour log-prob `logprobs[i]` (0.0 where the mask is 0) and the
policy version that produced it `versions[i]` (-1 where the mask is 0). Positions before
`prompt_len` are the prompt.

Invariants (tests/engine/test_trajectory.py): all per-token lists have the same length; mask is 0 on
the prompt; `to_dict`/`from_dict` round-trip exactly; `policy_versions` lists the distinct
versions that produced model tokens.
"""

from __future__ import annotations

import dataclasses

from dataclasses import asdict, dataclass, field


@dataclass(kw_only=True)
class Trajectory:
    request_id: str  # unique per started trajectory (the ledger key)
    task_id: str
    group_id: str  # the GRPO group: n samples of one prompt in one step share it
    prompt_len: int
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    turns: list[tuple[int, int]] = field(default_factory=list)  # [start, end) of each model turn
    tool_outcomes: list[tuple[str, str, str]] = field(default_factory=list)  # OutcomeState per tool call
    tool_latency_s: list[float] = field(default_factory=list)
    reward: float | None = None
    finish_reason: str = ""  # "stop" | "max_turns" | "max_tokens" | "submit" | ...
    instances: list[int] = field(default_factory=list)  # rollout instances it ran on, in order (migrations)
    final_text: str = ""
    score_s: float = 0.0  # the episode's final scoring, as the rollout rank waited for it

    def check(self) -> Trajectory:
        n = len(self.token_ids)
        assert len(self.loss_mask) == n and len(self.logprobs) == n and len(self.versions) == n, (
            f"{self.request_id}: per-token lists differ: ids={n} mask={len(self.loss_mask)} "
            f"logprobs={len(self.logprobs)} versions={len(self.versions)}"
        )
        assert not any(self.loss_mask[: self.prompt_len]), f"{self.request_id}: loss mask set on the prompt"
        return self

    def truncated(self, max_tokens: int) -> Trajectory:
        """A copy cut to its first `max_tokens` tokens (turns clipped), or self when it fits."""
        if self.num_tokens <= max_tokens:
            return self
        n = max_tokens
        return dataclasses.replace(self, token_ids=self.token_ids[:n], loss_mask=self.loss_mask[:n], logprobs=self.logprobs[:n],
                                   versions=self.versions[:n], turns=[(a, min(b, n)) for a, b in self.turns if a < n],
                                   prompt_len=min(self.prompt_len, n)).check()

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def signal_tokens(self) -> int:
        """Tokens in context when the first tool result came back: where the second model turn starts (all if one turn)."""
        return self.turns[1][0] if len(self.turns) > 1 else self.num_tokens

    @property
    def num_model_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def policy_versions(self) -> list[int]:
        return sorted({v for v, m in zip(self.versions, self.loss_mask) if m})

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Trajectory:
        d = dict(d)
        d["turns"] = [tuple(t) for t in d.get("turns", [])]
        d["tool_outcomes"] = [tuple(t) for t in d.get("tool_outcomes", [])]
        return cls(**d)
