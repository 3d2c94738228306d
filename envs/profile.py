"""Workload profiles: play a scripted agent over a bench's tasks and write what the simulator needs.

    python -m envs.profile --bench search [--num-tasks 50] [--agent oracle|wrong] [--out DIR]

Algorithm:
1. Build the env through the registry and take the bench's scripted agent (`oracle_actions` or
   `wrong_actions` of envs/<bench>.py; swe's come from envs/swe/env.py).
2. For each task, play its assistant messages in order: every tool call runs for real (sandbox,
   BM25, pytest), and each turn records its decode tokens, the tool outputs' tokens, latency and
   outcome state (tool, size class, status); the first message without calls is the answer.
3. Write `DIR/trajectories.jsonl` in the trace format of sim/trace.py (one record per task; a
   turn with several calls becomes one gap whose outcome is the last call's and whose latency is
   the sum) and `DIR/profile.json` with the distributions (median, p90, p99, mean) of turns per
   trajectory, tokens per turn, tool latency per tool, tool output tokens, and the counts of
   outcome-state sequences; print them as a table.

Tokens are approximated as UTF-8 bytes / 4 (envs/ imports no tokenizer); a policy-driven profile
with real token counts comes from a real run's trajectories (sim/trace.py reads those too).

Invariants (tests/envs/test_envs_toy.py): the written trace loads with sim.trace.record_to_spec; the
same seed writes the same records apart from latencies.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import time
from collections import Counter
from pathlib import Path

from envs.base import Env, Task, ToolResult
from envs.toolcalls import parse_tool_calls
from envs.registry import BENCHES, make_env, scripted_agents

logger = logging.getLogger(__name__)


def approx_tokens(text: str) -> int:
    return max(1, math.ceil(len(text.encode("utf-8", "replace")) / 4))


def quantiles(xs: list[float]) -> dict[str, float]:
    """Nearest-rank median, p90, p99 and the mean; zeros for an empty list."""
    if not xs:
        return {"median": 0.0, "p90": 0.0, "p99": 0.0, "mean": 0.0, "n": 0}
    s = sorted(xs)

    def rank(q: float) -> float:
        return float(s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))])

    return {"median": rank(0.5), "p90": rank(0.9), "p99": rank(0.99), "mean": sum(s) / len(s), "n": len(s)}


def play(env: Env, task: Task, actions: list[str]) -> tuple[dict, float]:
    """Play one task; returns (trace record as in sim/trace.py, reward)."""
    prompt_len = sum(approx_tokens(m["content"]) for m in task.messages) + approx_tokens(json.dumps(task.tools))
    turns, outcomes, latencies, pos = [], [], [], prompt_len
    episode = env.start(task)
    try:
        final = actions[-1] if actions else ""
        for action in actions:
            n = approx_tokens(action)
            turns.append([pos, pos + n])
            pos += n
            calls = parse_tool_calls(action)
            if not calls:
                final = action
                break
            results: list[ToolResult] = [episode.execute(c) for c in calls]
            pos += sum(approx_tokens(r.text) + 8 for r in results)  # + the <tool_response> wrapping
            outcomes.append(list(results[-1].outcome()))
            latencies.append(sum(r.latency_s for r in results))
            if results[-1].done:
                final = action
                break
        reward = episode.score(final)
    finally:
        episode.close()
    record = {"step": 1, "request_id": f"profile-{task.task_id}", "task_id": task.task_id, "num_tokens": pos,
              "prompt_len": prompt_len, "turns": turns, "tool_outcomes": outcomes, "tool_latency_s": latencies,
              "instances": [], "reward": reward}
    return record, reward


def summarize(bench: str, agent: str, records: list[dict]) -> dict:
    turn_tokens = [b - a for r in records for a, b in r["turns"]]
    gaps = [r["turns"][i + 1][0] - r["turns"][i][1] for r in records for i in range(len(r["turns"]) - 1)]
    by_tool: dict[str, list[float]] = {}
    for r in records:
        for (tool, _, _), lat in zip(r["tool_outcomes"], r["tool_latency_s"]):
            by_tool.setdefault(tool, []).append(lat)
    sequences = Counter(json.dumps(r["tool_outcomes"]) for r in records)
    return {
        "bench": bench, "agent": agent, "num_trajectories": len(records), "token_estimate": "utf8_bytes/4",
        "reward_mean": sum(r["reward"] for r in records) / max(1, len(records)),
        "turns": quantiles([len(r["turns"]) for r in records]),
        "prompt_tokens": quantiles([r["prompt_len"] for r in records]),
        "tokens_per_turn": quantiles(turn_tokens),
        "tool_output_tokens": quantiles(gaps),
        "tool_latency_s": {tool: quantiles(xs) for tool, xs in sorted(by_tool.items())},
        "outcome_states": dict(Counter("/".join(o) for r in records for o in r["tool_outcomes"]).most_common()),
        "outcome_sequences": dict(sequences.most_common(50)),
    }


def profile(bench: str, *, num_tasks: int, seed: int = 0, agent: str = "oracle", out: Path | None = None) -> dict:
    env = make_env(bench, seed=seed, num_tasks=num_tasks)
    oracle, wrong = scripted_agents(bench)
    act = oracle if agent == "oracle" else wrong
    try:
        records = [play(env, t, act(t))[0] for t in env.tasks()]
    finally:
        env.close()
    summary = summarize(bench, agent, records)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        (out / "profile.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def format_table(summary: dict) -> str:
    rows = [("turns per trajectory", summary["turns"]), ("prompt tokens", summary["prompt_tokens"]),
            ("tokens per turn", summary["tokens_per_turn"]), ("tool output tokens", summary["tool_output_tokens"])]
    rows += [(f"latency_s {tool}", q) for tool, q in summary["tool_latency_s"].items()]
    lines = [f"bench={summary['bench']} agent={summary['agent']} trajectories={summary['num_trajectories']} "
             f"reward_mean={summary['reward_mean']:.3f} (tokens ~ {summary['token_estimate']})",
             f"{'quantity':<24}{'median':>10}{'p90':>10}{'p99':>10}{'mean':>10}"]
    for name, q in rows:
        lines.append(f"{name:<24}{q['median']:>10.3g}{q['p90']:>10.3g}{q['p99']:>10.3g}{q['mean']:>10.3g}")
    top = list(summary["outcome_states"].items())[:6]
    lines.append("outcome states: " + ", ".join(f"{k}={v}" for k, v in top))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Profile a bench with a scripted agent for the simulator.")
    ap.add_argument("--bench", choices=BENCHES, required=True)
    ap.add_argument("--num-tasks", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--agent", choices=("oracle", "wrong"), default="oracle")
    ap.add_argument("--out", type=Path, default=None, help="default runs/profile-<bench>")
    args = ap.parse_args(argv)
    out = args.out or Path("runs") / f"profile-{args.bench}"
    t0 = time.monotonic()
    summary = profile(args.bench, num_tasks=args.num_tasks, seed=args.seed, agent=args.agent, out=out)
    print(format_table(summary))
    print(f"wrote {out}/trajectories.jsonl and {out}/profile.json in {time.monotonic() - t0:.1f} s")
    print(f"profile_turns_median: {summary['turns']['median']:g}")


if __name__ == "__main__":
    main()
