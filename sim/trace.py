"""Recorded traces: load a real run's trajectories as a workload, write the simulator's own, replay.

Trace format (a run dir): `metrics.jsonl` (docs/design.md fields, one row per step) and
`trajectories.jsonl`, one JSON object per finished trajectory:
`{"step" (the step that admitted it, from 1 as in every output; a trace's steps are read in order,
so one written from 0 before 2026-12-07 loads the same), "request_id", "task_id", "num_tokens", "prompt_len", "turns": [[start, end], ...],
"tool_outcomes": [[tool, size, status], ...], "tool_latency_s": [...], "instances": [...]}`, and
optionally `"env_start_s"` (episode start), `"score_s"` (final scoring) and `"reward"`, which the
simulator charges and uses to skip a no-signal trainer step as the real trainer does.
`turns` are [start, end) token positions of the model turns; the gap between one turn's end and
the next one's start is the tool output (with its chat template) that was prefilled.

Fidelity: `sim.run.replay(run_dir, ...)` plays these recorded trajectories through the simulator
and compares the predicted step times with the measured ones.

Invariants (tests/sim/test_sim_trace.py): write -> load round-trips every TrajSpec exactly; a
trace written by the simulator replays to the same step times (error 0); malformed records
raise ValueError naming the line.
"""

from __future__ import annotations

import json
from pathlib import Path

from scheduler.api import OutcomeState
from sim.workload import TrajSpec


def spec_to_record(spec: TrajSpec, step: int, instances: list[int]) -> dict:
    turns, pos = [], spec.prompt_tokens
    for i, n in enumerate(spec.turn_tokens):
        turns.append([pos, pos + n])
        pos += n + (spec.tool_output_tokens[i] if i < len(spec.tool_output_tokens) else 0)
    return {
        "step": step, "request_id": spec.request_id, "task_id": spec.prompt_id, "num_tokens": spec.total_tokens,
        "prompt_len": spec.prompt_tokens, "turns": turns, "tool_outcomes": [list(o) for o in spec.tool_outcomes],
        "tool_latency_s": list(spec.tool_latency_s), "instances": list(instances),
        "env_start_s": spec.start_s, "score_s": spec.score_s, "reward": spec.reward,
    }


def record_to_spec(rec: dict, where: str = "") -> TrajSpec:
    try:
        turns = [(int(a), int(b)) for a, b in rec["turns"]]
        prompt = int(rec["prompt_len"])
        outcomes = tuple(OutcomeState(*map(str, o)) for o in rec["tool_outcomes"])
        latencies = tuple(float(x) for x in rec["tool_latency_s"])
        num_tokens = int(rec["num_tokens"])
        rid, tid = str(rec["request_id"]), str(rec["task_id"])
        start_s, score_s = float(rec.get("env_start_s", 0.0)), float(rec.get("score_s", 0.0))
        reward = None if rec.get("reward") is None else float(rec["reward"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"trace record {where}: {e!r}; each record needs the fields listed in sim/trace.py") from e
    if not turns or any(b <= a for a, b in turns) or turns[0][0] < prompt:
        raise ValueError(f"trace record {where}: turns={turns} must be non-empty [start, end) spans after prompt_len={prompt}")
    gaps = [turns[i + 1][0] - turns[i][1] for i in range(len(turns) - 1)]
    if any(g < 0 for g in gaps) or len(outcomes) < len(gaps) or len(latencies) < len(gaps):
        raise ValueError(
            f"trace record {where}: {len(turns)} turns need {len(gaps)} non-negative tool gaps, outcomes and "
            f"latencies; got gaps={gaps}, {len(outcomes)} outcomes, {len(latencies)} latencies"
        )
    spec = TrajSpec(request_id=rid, prompt_id=tid, prompt_tokens=prompt, turn_tokens=tuple(b - a for a, b in turns),
                    tool_outcomes=outcomes[: len(gaps)], tool_output_tokens=tuple(gaps),
                    tool_latency_s=latencies[: len(gaps)], start_s=start_s, score_s=score_s, reward=reward)
    if spec.total_tokens > num_tokens:
        raise ValueError(f"trace record {where}: turns end at {spec.total_tokens} tokens past num_tokens={num_tokens}")
    return spec


class TraceWorkload:
    """A workload whose batch j is the trajectories the trace recorded at its j-th step."""

    def __init__(self, by_step: dict[int, list[TrajSpec]], name: str = "trace"):
        self.steps = sorted(by_step)
        self.by_step = by_step
        self.name = name

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    @classmethod
    def load(cls, run_dir: Path) -> TraceWorkload:
        path = Path(run_dir) / "trajectories.jsonl"
        if not path.exists():
            raise ValueError(f"no trace at {path}; a real run writes trajectories.jsonl into its --out dir")
        by_step: dict[int, list[TrajSpec]] = {}
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            rec = json.loads(line)
            by_step.setdefault(int(rec["step"]), []).append(record_to_spec(rec, f"{path}:{i}"))
        if not by_step:
            raise ValueError(f"trace {path} holds no trajectories")
        return cls(by_step, name=Path(run_dir).name)

    def batch(self, step: int, num_prompts: int, samples_per_prompt: int) -> list[TrajSpec]:
        if step >= len(self.steps):
            raise ValueError(f"trace has {len(self.steps)} steps; step {step} asked for; set SimConfig.steps <= {len(self.steps)}")
        return list(self.by_step[self.steps[step]])


def write_trajectories(path: Path, finished: list) -> None:
    """Write the simulator's finished requests (SimRequest) in the real runtime's trace format."""
    with open(path, "w") as f:
        for req in finished:
            f.write(json.dumps(spec_to_record(req.spec, req.batch + 1, req.instances)) + "\n")  # steps count from 1
