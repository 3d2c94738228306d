"""Synthetic agentic workloads: long-tailed multi-turn trajectories that drift over training.

A workload turns (step, prompt, sample) into a `TrajSpec`: prompt tokens, decode tokens of each
model turn, and for each tool call its outcome state, output tokens and latency. The simulator
never looks inside a spec except to play it out, so a recorded trace (`sim/trace.py`) can stand
in for a synthetic workload.

Algorithm (per trajectory):
1. Draw a latent difficulty from z ~ N(0, 1), capped at `max_difficulty`: `tail_shape`
   "lognormal" gives `L = exp(tail_sigma * z)`; with `tail_sigma = ln(10) / 2.326 ~= 0.99` the
   p99 of L is ~10x its median, the figure the Libra paper and RollPacker/APRIL report for
   agentic rollouts (p99 ~10x median; the last 10% of requests take up to half of the rollout
   time). "pareto" maps the same z through its quantile to a Pareto(`tail_alpha`) of median 1
   (p99/median = 50^(1/alpha): 26x at alpha 1.2), a power-law tail far heavier at the top.
2. Samples of one prompt share part of their difficulty (`prompt_share`): hard prompts are hard
   for the whole GRPO group.
3. Turns = base_turns * L^turn_exponent, tokens per turn = base_turn_tokens * L^(1 -
   turn_exponent) * lognormal jitter; both scaled by the drift factor of the step
   (`1 + drift * step / num_steps`: positive drift = trajectories grow as the policy learns
   to use tools, negative = they shrink).
4. Each tool return is the causal signal C-MLFQ reads: harder trajectories fail more often and
   return larger payloads, so (tool, size, status) prefixes predict the remaining length.

Profiles: `swe` (R2E-Gym: long prompts, many turns, slow test runs), `search` (Search-R1: short
turns, retrieval payloads, fast tools), `math` (DAPO-Math: few turns of long reasoning); any env
can ship its own as a JSON file of `WorkloadProfile` fields (`load_profile`, or `bench=path.json`).

Invariants (tests/sim/test_sim_workload.py): specs are a pure function of (profile, seed, step,
prompt); zero tail gives identical trajectories; the default tails have p99/median in [5, 20].
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

from scheduler.api import OutcomeState
from scheduler.layout_model import Workload

TAIL_SIGMA_P99_10X = math.log(10.0) / 2.326  # sigma of a lognormal whose p99 is 10x its median


@dataclass(frozen=True, kw_only=True)
class WorkloadProfile:
    name: str  # bench name: "swe", "search", "math", or anything custom
    prompt_tokens: int  # median prompt length
    base_turns: float  # median number of model turns (tool calls + 1)
    max_turns: int  # hard cap on model turns (the env's max_turns)
    base_turn_tokens: float  # median decode tokens per model turn
    max_turn_tokens: int  # cap on decode tokens per turn (max_new_tokens)
    tail_sigma: float = TAIL_SIGMA_P99_10X  # lognormal sigma of difficulty; 0 = no tail
    tail_shape: str = "lognormal"  # "lognormal" (tail_sigma) or "pareto" (tail_alpha)
    tail_alpha: float = 1.5  # Pareto shape when tail_shape="pareto": smaller = heavier tail
    max_context_tokens: int = 65536  # context window: a trajectory is cut (max_tokens) when it fills it
    max_difficulty: float = 40.0  # cap on the difficulty multiplier
    turn_exponent: float = 0.5  # share of difficulty that becomes more turns (rest: longer turns)
    turn_jitter: float = 0.3  # lognormal sigma of per-turn token noise
    prompt_share: float = 0.5  # share of difficulty (in log space) common to a prompt's samples
    drift: float = 0.0  # relative growth of lengths and turns from the first to the last step
    tools: tuple[str, ...] = ("bash",)  # tool names the trajectory calls, cycled
    tool_latency_s: float = 1.0  # median tool latency
    tool_latency_sigma: float = 0.8  # lognormal sigma of tool latency
    fail_base: float = 0.1  # failure probability of a tool call at difficulty 1
    output_tokens: tuple[int, int, int] = (64, 512, 2048)  # tool output tokens: small/medium/large
    bucket_max_tokens: tuple[int, int] = (4096, 12288)  # rollout bucket limits a user would set for it

    def __post_init__(self) -> None:
        if self.max_context_tokens <= self.prompt_tokens:
            raise ValueError(
                f"workload {self.name}: max_context_tokens={self.max_context_tokens} must exceed "
                f"prompt_tokens={self.prompt_tokens}; leave room to generate"
            )
        for name in ("prompt_tokens", "max_turns", "max_turn_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"workload {self.name}: {name}={getattr(self, name)} must be >= 1; give a positive count")
        if self.base_turns < 1 or self.base_turn_tokens < 1:
            raise ValueError(
                f"workload {self.name}: base_turns={self.base_turns}, base_turn_tokens={self.base_turn_tokens} "
                "must both be >= 1; a trajectory has at least one turn of one token"
            )
        if self.tail_sigma < 0 or self.turn_jitter < 0 or self.tool_latency_sigma < 0:
            raise ValueError(
                f"workload {self.name}: tail_sigma={self.tail_sigma}, turn_jitter={self.turn_jitter}, "
                f"tool_latency_sigma={self.tool_latency_sigma} must be >= 0; use 0 for no spread"
            )
        if not 0.0 <= self.turn_exponent <= 1.0 or not 0.0 <= self.prompt_share <= 1.0:
            raise ValueError(
                f"workload {self.name}: turn_exponent={self.turn_exponent}, prompt_share={self.prompt_share} "
                "must lie in [0, 1]; they split a share of the difficulty"
            )
        if self.drift <= -1.0:
            raise ValueError(f"workload {self.name}: drift={self.drift} must be > -1 so lengths stay positive")
        if not self.tools:
            raise ValueError(f"workload {self.name}: tools is empty; name at least one tool")
        if self.tail_shape not in ("lognormal", "pareto") or self.tail_alpha <= 0:
            raise ValueError(f"workload {self.name}: tail_shape={self.tail_shape!r}, tail_alpha={self.tail_alpha}; "
                             "use tail_shape 'lognormal' or 'pareto' and tail_alpha > 0 (e.g. 1.2)")


# Medians follow the public descriptions of the paper's three workloads (R2E-Gym, Search-R1,
# DAPO-Math with a Python tool) at Qwen3-14B scale; the tails follow the p99 ~10x median figure.
PROFILES: dict[str, WorkloadProfile] = {
    "swe": WorkloadProfile(
        name="swe", prompt_tokens=2048, base_turns=8, max_turns=50, base_turn_tokens=256,
        max_turn_tokens=4096, max_context_tokens=65536, tools=("bash", "edit", "run_tests"), tool_latency_s=2.0,
        tool_latency_sigma=1.0, fail_base=0.15, output_tokens=(96, 768, 3072), drift=0.3,
        bucket_max_tokens=(8192, 24576),
    ),
    "search": WorkloadProfile(
        name="search", prompt_tokens=384, base_turns=3, max_turns=10, base_turn_tokens=192,
        max_turn_tokens=2048, max_context_tokens=16384, tools=("search",), tool_latency_s=0.4, tool_latency_sigma=0.5,
        fail_base=0.1, output_tokens=(128, 640, 1536), drift=0.2,
        bucket_max_tokens=(2048, 6144),
    ),
    "math": WorkloadProfile(
        name="math", prompt_tokens=256, base_turns=2, max_turns=6, base_turn_tokens=1536,
        max_turn_tokens=16384, max_context_tokens=32768, turn_exponent=0.25, tools=("python",), tool_latency_s=0.3,
        tool_latency_sigma=0.6, fail_base=0.2, output_tokens=(32, 256, 1024), drift=0.4,
        bucket_max_tokens=(4096, 12288),
    ),
}


@dataclass(frozen=True, slots=True)
class TrajSpec:
    """Everything the simulator needs to play one trajectory out; known in advance only to the oracle."""

    request_id: str
    prompt_id: str
    prompt_tokens: int
    turn_tokens: tuple[int, ...]  # decode tokens of each model turn
    tool_outcomes: tuple[OutcomeState, ...]  # one per tool call (= len(turn_tokens) - 1)
    tool_output_tokens: tuple[int, ...]
    tool_latency_s: tuple[float, ...]
    # measured in real runs (trace replay); synthetic workloads leave them at 0 / None
    start_s: float = 0.0  # the env's episode start (the coordinator starts a step's episodes one by one)
    score_s: float = 0.0  # the final scoring after the last turn (on the rollout rank's thread pool)
    reward: float | None = None  # None: unknown, the trainer counts the trajectory as carrying signal

    @property
    def decode_tokens(self) -> int:
        return sum(self.turn_tokens)

    @property
    def signal_tokens(self) -> int:
        """Tokens in context when the first tool result came back (all of them if it called no tool)."""
        if not self.tool_outcomes:
            return self.total_tokens
        return self.prompt_tokens + self.turn_tokens[0] + self.tool_output_tokens[0]

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + sum(self.turn_tokens) + sum(self.tool_output_tokens)


def profile_from_env_summary(summary: dict) -> WorkloadProfile:
    """A profile fitted to `python -m envs.profile`'s profile.json (median/p90/p99 per quantity)."""
    turns, per_turn, out = summary["turns"], summary["tokens_per_turn"], summary["tool_output_tokens"]
    lat = summary["tool_latency_s"] or {"tool": {"median": 0.0, "p99": 0.0}}
    med_lat = sorted(q["median"] for q in lat.values())[len(lat) // 2]
    p99_lat = max(q["p99"] for q in lat.values())
    # lognormal sigma from the p99/median ratio of a trajectory's decode tokens (turns x tokens/turn)
    spread = (max(turns["p99"], 1.0) * max(per_turn["p99"], 1.0)) / (max(turns["median"], 1.0) * max(per_turn["median"], 1.0))
    return WorkloadProfile(
        name=str(summary.get("bench", "env")), prompt_tokens=max(1, int(summary["prompt_tokens"]["median"])),
        base_turns=max(1.0, turns["median"]), max_turns=max(1, int(math.ceil(turns["p99"] * 1.5))),
        base_turn_tokens=max(1.0, per_turn["median"]), max_turn_tokens=max(1, int(per_turn["p99"] * 2)),
        max_context_tokens=max(int(summary["prompt_tokens"]["p99"]) * 2, 32768),
        tail_sigma=math.log(max(spread, 1.0)) / 2.326, turn_jitter=0.0, drift=0.0,
        tools=tuple(lat) if summary["tool_latency_s"] else ("tool",),
        tool_latency_s=max(med_lat, 1e-3), tool_latency_sigma=math.log(max(p99_lat, 1e-3) / max(med_lat, 1e-3)) / 2.326,
        output_tokens=(max(1, int(out["median"] / 2)), max(1, int(out["median"])), max(1, int(out["p99"]))),
    )


def load_profile(path: Path) -> WorkloadProfile:
    """An env profile from JSON: WorkloadProfile fields (lists become tuples), or envs/profile.py's profile.json."""
    raw = json.loads(Path(path).read_text())
    if "tokens_per_turn" in raw:
        return profile_from_env_summary(raw)
    known = {f.name for f in dataclasses.fields(WorkloadProfile)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"workload profile {path}: unknown fields {unknown}; known: {sorted(known)}")
    return WorkloadProfile(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()})


def get_profile(name: str, **overrides) -> WorkloadProfile:
    """A built-in profile by bench name, or an env profile from a `.json` path; then overrides."""
    if name.endswith(".json"):
        return dataclasses.replace(load_profile(Path(name)), **overrides)
    if name not in PROFILES:
        raise ValueError(f"unknown workload {name!r}; pick one of {sorted(PROFILES)} or load a trace")
    return dataclasses.replace(PROFILES[name], **overrides)


class SyntheticWorkload:
    """Samples `TrajSpec`s from a profile; deterministic per (seed, step, prompt, sample)."""

    def __init__(self, profile: WorkloadProfile, *, seed: int, num_steps: int, num_dataset_prompts: int = 64):
        self.profile = profile
        self.seed = seed
        self.num_steps = max(1, num_steps)
        self.num_dataset_prompts = num_dataset_prompts
        self.name = profile.name
        self._z_prompt: dict[int, float] = {}  # dataset prompt -> its shared difficulty draw
        # every outcome state, [tool][size][status] (sizes small/medium/large, statuses success/failure/timeout)
        self._outcomes = [[[OutcomeState(tool, size, status) for status in ("success", "failure", "timeout")]
                           for size in ("small", "medium", "large")] for tool in profile.tools]

    def drift_factor(self, step: int) -> float:
        return 1.0 + self.profile.drift * min(step, self.num_steps) / self.num_steps

    def batch(self, step: int, num_prompts: int, samples_per_prompt: int) -> list[TrajSpec]:
        out = []
        for p in range(num_prompts):
            # prompts come from a finite dataset and recur every epoch, as in real RL runs
            # (length predictors learn per prompt); a prompt's shared difficulty is fixed.
            d = (step * num_prompts + p) % self.num_dataset_prompts
            z_prompt = self._z_prompt.get(d)
            if z_prompt is None:
                # int-only tuples: str hashes are salted per process and would break determinism
                z_prompt = self._z_prompt[d] = random.Random(hash((self.seed, d, -1)) & 0xFFFFFFFF).gauss(0.0, 1.0)
            rng = random.Random(hash((self.seed, step, p)) & 0xFFFFFFFF)
            for s in range(samples_per_prompt):
                out.append(self._one(rng, step, f"d{d}", f"s{step}-p{p}-{s}", z_prompt))
        return out

    def _one(self, rng: random.Random, step: int, prompt_id: str, request_id: str, z_prompt: float) -> TrajSpec:
        pf = self.profile
        gauss, uniform, exp = rng.gauss, rng.random, math.exp  # gauss() is gauss(0.0, 1.0)
        share = pf.prompt_share
        z = math.sqrt(share) * z_prompt + math.sqrt(1.0 - share) * gauss()
        difficulty = min(difficulty_of(pf, z), pf.max_difficulty)
        drift = self.drift_factor(step)
        num_turns = int(round(pf.base_turns * difficulty**pf.turn_exponent * drift))
        num_turns = max(1, min(pf.max_turns, num_turns))
        per_turn = pf.base_turn_tokens * difficulty ** (1.0 - pf.turn_exponent) * drift
        jitter, max_turn = pf.turn_jitter, pf.max_turn_tokens
        turns = [int(per_turn * exp(jitter * gauss())) for _ in range(num_turns)]
        turns = [1 if t < 1 else max_turn if t > max_turn else t for t in turns]  # max(1, min(max_turn, t))
        outcomes, out_tokens, latencies = [], [], []
        p_fail = min(0.9, pf.fail_base * math.sqrt(difficulty))
        p_timeout = 0.1 * p_fail
        p_large = min(0.8, 0.1 * difficulty)
        p_medium = p_large + 0.4  # below it (and above p_large): medium
        tools, sizes = self._outcomes, pf.output_tokens
        num_kinds = len(tools)
        latency_s, latency_sigma = pf.tool_latency_s, pf.tool_latency_sigma
        for i in range(num_turns - 1):
            u = uniform()
            status = 2 if u < p_timeout else 1 if u < p_fail else 0  # timeout, failure, success
            v = uniform()
            size = 2 if v < p_large else 1 if v < p_medium else 0  # large, medium, small
            outcomes.append(tools[i % num_kinds][size][status])
            out_tokens.append(sizes[size])
            latencies.append(latency_s * exp(latency_sigma * gauss()))
        turns, out_tokens = _truncate(pf.prompt_tokens, pf.max_context_tokens, turns, out_tokens)
        num_tools = len(turns) - 1
        if num_tools < len(outcomes):  # cut short: the calls after its last turn never ran
            outcomes, out_tokens, latencies = outcomes[:num_tools], out_tokens[:num_tools], latencies[:num_tools]
        return TrajSpec(
            request_id=request_id,
            prompt_id=prompt_id,
            prompt_tokens=pf.prompt_tokens,
            turn_tokens=tuple(turns),
            tool_outcomes=tuple(outcomes),
            tool_output_tokens=tuple(out_tokens),
            tool_latency_s=tuple(latencies),
        )


def difficulty_of(pf: WorkloadProfile, z: float) -> float:
    """The latent difficulty of a standard-normal draw `z` under the profile's tail shape (docstring, 1)."""
    if pf.tail_shape == "lognormal":
        return math.exp(pf.tail_sigma * z)
    tail = 0.5 * math.erfc(z / math.sqrt(2.0))  # P(Z > z), exact far into the tail
    return (2.0 * max(tail, 1e-300)) ** (-1.0 / pf.tail_alpha)  # Pareto quantile over its median 2^(1/alpha)


def _truncate(prompt: int, max_context: int, turns: list[int], out_tokens: list[int]) -> tuple[list[int], list[int]]:
    """Cut the trajectory where its context fills the window (the env ends it with max_tokens)."""
    if prompt + sum(turns) + sum(out_tokens) < max_context - 1 and min(turns, default=0) >= 0 \
            and min(out_tokens, default=0) >= 0:
        return turns, out_tokens  # every partial sum below stays under the window: nothing is cut
    used = prompt
    for i, t in enumerate(turns):
        if used + t >= max_context:
            return turns[:i] + [max(1, max_context - used)], out_tokens[:i]
        used += t
        if i < len(out_tokens):
            if used + out_tokens[i] >= max_context - 1:
                return turns[: i + 1], out_tokens[:i]
            used += out_tokens[i]
    return turns, out_tokens


def tail_stats(specs: list[TrajSpec]) -> dict[str, float]:
    """p50/p99 of total tokens and the share of decode tokens in the longest 10% of trajectories."""
    totals = sorted(s.total_tokens for s in specs)
    decode = sorted((s.decode_tokens for s in specs), reverse=True)
    n = len(totals)
    p50 = totals[n // 2]
    p99 = totals[min(n - 1, int(0.99 * n))]
    top = sum(decode[: max(1, n // 10)])
    return {"p50_tokens": p50, "p99_tokens": p99, "p99_over_p50": p99 / p50, "top10_decode_share": top / sum(decode)}


PRIOR_SEED = 7919  # the bench prior's own draw: no preset runs this seed, so the prior never sees a run's own samples
PRIOR_STEPS = 4  # steps of the prior's sample (a few hundred trajectories at the paper's batch sizes)


def prior_workload(bench: str, *, trajectories_per_step: int, samples_per_prompt: int, train_epochs: int = 1):
    """What libra's planner knows before step 1: the bench's default profile (no scenario overrides,
    its own seed), as the length sample of `scheduler.layout_model.Workload`; None for a profile
    file or trace, whose bench declares no prior."""
    if bench not in PROFILES:
        return None
    wl = SyntheticWorkload(PROFILES[bench], seed=PRIOR_SEED, num_steps=PRIOR_STEPS)
    specs = [s for step in range(PRIOR_STEPS)
             for s in wl.batch(step, max(1, trajectories_per_step // samples_per_prompt), samples_per_prompt)]
    total = sum(s.total_tokens for s in specs)
    return Workload(trajectory_tokens=tuple(s.total_tokens for s in specs), num_trajectories=trajectories_per_step,
                    train_tokens=total / PRIOR_STEPS * train_epochs,
                    tool_s_per_token=sum(sum(s.tool_latency_s) for s in specs) / max(1, total),
                    decode_frac=min(1.0, max(1e-3, sum(s.decode_tokens for s in specs) / max(1, total))),
                    signal_tokens=tuple(s.signal_tokens for s in specs))
