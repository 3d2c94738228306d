"""The torch rollout engine: the shared turn logic (engine/rollout/turns.py) over a `BatchRunner`.

`RolloutEngine(model, tokenizer, cfg)` is a `TurnEngine` whose decode backend is a `BatchRunner`
(engine/rollout/runner.py) over the model in this process:
  - Join: prefill only the not-yet-cached tokens of the joining requests (one padded batch on
    their parked KV; a GRPO group's identical fresh prompts once), sample their next tokens, and
    admit the ones whose turn goes on into the batched cache (up to `max_batch`).
  - Decode: one batched decode step for the running rows; a row whose turn ends leaves the batch:
    with a tool call it parks its KV (the next join prefills only the tool's output), otherwise
    its KV is dropped.
  - Weights: loaded in place between steps; in-flight sequences keep their KV and continue
    (partial rollout), unless `recompute_kv_on_update` (AReaL): then every request's KV is dropped
    and the running ones rejoin first, re-prefilled on the new weights.
Sampling draws from a per-request generator, so a request's tokens do not depend on which other
requests share the batch. Log-probs are of the temperature-scaled distribution before top-p.

Colocated runs (verl style) call `offload()` before training and `reload()` before the weight
update, so the trainer gets the rollout's device memory while it trains.

TP instances: every rank calls `step()` in lockstep; only the leader schedules, samples and
talks to the env; `BatchRunner` broadcasts each KV op to the followers, which replay it.

`kv_cache` and `linears` pick the runner's KV cache and CPU linears (engine/rollout/runner.py): the
defaults are the engine's own, the others the baselines bench/decode.py measures it against.

Invariants (tests/engine/rollout/): with pauses, joins, cancellations and migrations, greedy
tokens equal decoding each trajectory alone and log-probs match within 1e-5; the turn logic's
invariants (engine/rollout/turns.py) hold.
"""

from __future__ import annotations

from engine.rollout.api import Finished, MigrationState, Progress, RolloutConfig, RolloutRequest, ToolReturned
from engine.rollout.runner import BatchRunner
from engine.rollout.turns import TurnEngine, eos_ids

__all__ = ["RolloutEngine", "RolloutConfig", "RolloutRequest", "MigrationState", "ToolReturned", "Progress", "Finished", "eos_ids"]


class RolloutEngine(TurnEngine):
    """The turn logic over a `BatchRunner` of `model` in this process (a TP shard of it with `tp_group`)."""

    def __init__(self, model, tokenizer, cfg: RolloutConfig, *, device="cpu", policy_version: int = 0, tp_group=None,
                 instance_id: int = 0, recompute_kv_on_update: bool = False, kv_cache: str = "inplace", linears: str = "onednn"):
        runner = BatchRunner(model, device=device, tp_group=tp_group, temperature=cfg.temperature, top_p=cfg.top_p,
                             kv_cache=kv_cache, linears=linears)
        super().__init__(runner, tokenizer, cfg, policy_version=policy_version, instance_id=instance_id,
                         recompute_kv_on_update=recompute_kv_on_update, generation_config=getattr(model, "generation_config", None))

    def policy_model(self, policy_version: int):
        """The model this engine decodes with, at `policy_version` (queued weights applied first): an idle instance
        that joins training (engine/trainer/elastic.py) computes gradients with it. Only for a TP1 instance."""
        if self.runner.tp_group is not None:
            raise ValueError(f"instance {self.instance_id} is a TP instance: only a TP1 instance's model is whole")
        if self._pending_weights is not None:
            self._apply_weights(*self._pending_weights)
        if self.policy_version != policy_version:
            raise RuntimeError(f"instance {self.instance_id} holds policy version {self.policy_version}, "
                               f"not {policy_version}: it cannot compute that step's gradient")
        return self.runner.model
