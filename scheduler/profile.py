"""Measured hardware profiles: what `python -m bench.profile` timed on a machine, as a cost model.

Profile-then-simulate (the Vidur approach): instead of a roofline over published figures, the
planner and the simulator read the times this machine measured with the real runtime code.
A profile (JSON, `HardwareProfile.save`, written atomically) holds, for one model on one device kind:
  - decode: seconds per decode step of the rollout engine, per (batch, context) point, TP 1;
  - prefill: seconds per prefill of N tokens, TP 1;
  - train_tokens_per_s: trainer throughput per number of trainer ranks (FSDP2 over gloo on CPU);
  - sync_s: one weight broadcast (trainer -> every rollout rank); gather_s: the trainer's
    full-weight gather before it, per number of FSDP trainer ranks (a colocated sync is that
    gather and a local load, no broadcast); group_rebuild_s: one role-map
    change's process-group rebuild; reconfig_s: a role change that moves the trainer group
    (hand-off save, rebuild, the new group built and loaded, a sync); one that moves rollout
    ranks only costs the rebuild and a sync;
  - step_overhead_s: the control plane's fixed cost per step (messages, waits, bookkeeping);
  - cores: on a CPU every rank (and every tool process) shares these cores, so the simulator
    slows everything that runs by busy processes / cores once they outnumber the cores, and the
    planner prices each stage beside the other (`CostModel.on_shared_cores`); each time above
    was measured with that many processes busy (decode and prefill: one).

`ProfiledCostModel` answers the `CostModel` questions from those points: decode is bilinear in
(log2 batch, context) on the measured grid and linear beyond it; prefill piecewise linear in the
tokens; training uses the measured rank count, or the log-log scaling between the measured ones
for others; TP > 1 scales the TP-1 time by the analytic model's TP ratio (CPU runs here measure
TP 1 only); a helper's float32 gradient hand-off to the trainer (`CostModel.elastic_train_s`) is as many
bytes as the measured sync broadcast, so it takes that long. Memory questions (max batch, minimum TP)
stay analytic on the profile's hardware.

Invariants (tests/scheduler/test_scheduler_profile.py): a profile round-trips through JSON; the profiled
model returns exactly the measured times at measured points and is monotone between them; a
malformed or incomplete profile is refused with a message naming the field and the command that
writes one.
"""

from __future__ import annotations

import bisect
import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from scheduler.costmodel import GRAD_BYTES_PER_PARAM, HARDWARE, MODELS, CostModel, ModelSpec, shared_core_slowdown

FIX = "write one with `python -m bench.profile --model M --out FILE`"
HANDOFF_RANKS = 2  # ranks bench.profile times a role switch's trainer hand-off on
HOST_MEM_FRAC = 0.8  # of the host's memory a CPU run's ranks may take at their peaks (the launcher, tools and OS need the rest)


@dataclass(frozen=True, kw_only=True)
class HardwareProfile:
    model: str  # the model name the runtime was given (tiny, smollm2, a directory)
    arch: str  # the cost model's ModelSpec key used for memory and TP ratios
    device: str  # cpu | cuda | npu
    hardware: str  # the HARDWARE key memory questions use
    decode: tuple[tuple[int, int, float], ...]  # (batch, context tokens, seconds per decode step), TP 1
    prefill: tuple[tuple[int, float], ...]  # (tokens, seconds), TP 1
    train_tokens_per_s: dict[int, float]  # trainer ranks -> tokens/s
    sync_s: float
    group_rebuild_s: float
    reconfig_s: float
    step_overhead_s: float = 0.0
    gather_s: dict[int, float] = field(default_factory=dict)  # trainer ranks -> full-weight gather seconds; {} = free
    cores: int = 0  # CPU cores the ranks of a run share (device cpu); 0: every rank has a device of its own
    # host memory (device cpu: every rank's memory is the host's): peak RSS of one trainer rank per trainer rank
    # count, of one rollout rank, and the host's total; {} / 0: unknown (not checked)
    trainer_rss_bytes: dict[int, float] = field(default_factory=dict)
    rollout_rss_bytes: float = 0.0
    host_mem_bytes: float = 0.0
    meta: dict = field(default_factory=dict)  # host, torch version, date, threads: for the reader
    spec: dict = field(default_factory=dict)  # the ModelSpec's fields of a model outside the tables ({}: MODELS[arch])

    @property
    def model_spec(self) -> ModelSpec:
        return ModelSpec(**self.spec) if self.spec else MODELS[self.arch]

    def __post_init__(self) -> None:
        for name in ("decode", "prefill", "train_tokens_per_s"):
            if not getattr(self, name):
                raise ValueError(f"profile: {name} is empty; {FIX}")
        times = [t for *_, t in self.decode] + [t for _, t in self.prefill] + list(self.train_tokens_per_s.values())
        times += [self.sync_s, self.group_rebuild_s, self.reconfig_s, *self.gather_s.values()]
        if not all(isinstance(t, (int, float)) and math.isfinite(t) and t > 0 for t in times) or self.step_overhead_s < 0 \
                or self.cores < 0:
            raise ValueError(f"profile: every measured time must be a positive finite number; {FIX}")
        sizes = [*self.trainer_rss_bytes.values(), self.rollout_rss_bytes, self.host_mem_bytes]
        if not all(isinstance(b, (int, float)) and math.isfinite(b) and b >= 0 for b in sizes):
            raise ValueError(f"profile: trainer_rss_bytes, rollout_rss_bytes and host_mem_bytes must be finite and >= 0; {FIX}")
        if self.spec:
            try:
                ModelSpec(**self.spec)
            except TypeError as exc:
                raise ValueError(f"profile: malformed spec ({exc}); {FIX}") from None
        if (self.arch not in MODELS and not self.spec) or self.hardware not in HARDWARE:
            raise ValueError(f"profile: arch {self.arch!r} / hardware {self.hardware!r} not in the cost model tables "
                             f"({sorted(MODELS)} / {sorted(HARDWARE)}); {FIX}")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["train_tokens_per_s"] = {str(k): v for k, v in self.train_tokens_per_s.items()}
        d["gather_s"] = {str(k): v for k, v in self.gather_s.items()}
        d["trainer_rss_bytes"] = {str(k): v for k, v in self.trainer_rss_bytes.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict) -> HardwareProfile:
        try:
            return cls(model=d["model"], arch=d["arch"], device=d["device"], hardware=d["hardware"],
                       decode=tuple((int(b), int(c), float(t)) for b, c, t in d["decode"]),
                       prefill=tuple((int(n), float(t)) for n, t in d["prefill"]),
                       train_tokens_per_s={int(k): float(v) for k, v in d["train_tokens_per_s"].items()},
                       sync_s=float(d["sync_s"]), group_rebuild_s=float(d["group_rebuild_s"]),
                       reconfig_s=float(d["reconfig_s"]), step_overhead_s=float(d.get("step_overhead_s", 0.0)),
                       gather_s={int(k): float(v) for k, v in d.get("gather_s", {}).items()},
                       cores=int(d.get("cores", 0)),
                       trainer_rss_bytes={int(k): float(v) for k, v in d.get("trainer_rss_bytes", {}).items()},
                       rollout_rss_bytes=float(d.get("rollout_rss_bytes", 0.0)),
                       host_mem_bytes=float(d.get("host_mem_bytes", 0.0)),
                       meta=dict(d.get("meta", {})), spec=dict(d.get("spec", {})))
        except KeyError as exc:
            raise ValueError(f"profile lacks the field {exc.args[0]!r}; {FIX}") from None
        except (TypeError, ValueError) as exc:
            raise ValueError(f"profile: malformed value ({exc}); {FIX}") from None

    def save(self, path: Path) -> Path:
        """Write atomically (a temp file renamed into place): a reader never sees half a profile."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(self.to_dict(), indent=1))
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: Path) -> HardwareProfile:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"profile {path} does not exist; {FIX}")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"profile {path} is not valid JSON ({exc}); {FIX}") from None
        return cls.from_dict(data)


def _interp(xs: list[float], ys: list[float], x: float) -> float:
    """Piecewise linear through (xs, ys) (xs sorted); linear extension past both ends, never below 0."""
    if len(xs) == 1:
        return ys[0] * (x / xs[0] if xs[0] > 0 else 1.0)
    i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0)) if x1 != x0 else y0


class ProfiledCostModel(CostModel):
    """The CostModel interface answered from a measured `HardwareProfile` (see the module docstring)."""

    def __init__(self, profile: HardwareProfile, model: ModelSpec | None = None):
        super().__init__(HARDWARE[profile.hardware], model or profile.model_spec)
        self.profile = profile
        self.step_overhead_s = profile.step_overhead_s
        self.shared_cores = profile.cores
        grid: dict[int, dict[int, float]] = {}
        for b, c, t in profile.decode:
            grid.setdefault(c, {})[b] = t
        self._contexts = sorted(grid)
        self._decode = {c: (sorted(grid[c]), [grid[c][b] for b in sorted(grid[c])]) for c in self._contexts}
        pre = sorted(profile.prefill)
        self._prefill = ([float(n) for n, _ in pre], [t for _, t in pre])
        self._train = sorted(profile.train_tokens_per_s.items())
        gathers = sorted(profile.gather_s.items())
        self._gather = ([float(k) for k, _ in gathers], [v for _, v in gathers])

    def _tp_ratio(self, tp: int, batch: float, context: float) -> float:
        return 1.0 if tp <= 1 else super().decode_step_s(batch, context, tp) / super().decode_step_s(batch, context, 1)

    def _decode_at(self, context: int, batch: float) -> float:
        batches, times = self._decode[context]
        return _interp([math.log2(b) for b in batches], times, math.log2(max(1.0, batch)))

    def decode_step_s(self, batch: int, context_tokens: float, tp: int) -> float:
        batch = max(1.0, float(batch))
        cs = self._contexts
        by_ctx = [self._decode_at(c, batch) for c in cs]
        t = _interp([float(c) for c in cs], by_ctx, max(0.0, context_tokens)) if len(cs) > 1 else by_ctx[0]
        return max(t, 1e-6) * self._tp_ratio(tp, batch, context_tokens)

    def prefill_s(self, num_tokens: int, tp: int) -> float:
        t = _interp(*self._prefill, float(max(1, num_tokens)))
        return max(t, 1e-6) * self._tp_ratio(tp, 1.0, float(num_tokens))

    def train_s(self, num_tokens: int, num_devices: int) -> float:
        if num_devices < 1:
            raise ValueError(f"train_s: num_devices={num_devices} must be >= 1; give training at least one device")
        measured = dict(self._train)
        if num_devices in measured:
            tps = measured[num_devices]
        elif len(self._train) == 1:
            (k, v), = self._train
            tps = v * num_devices / k  # one point: assume linear scaling (say so: the profile has one rank count)
        else:  # log-log through the two nearest measured counts
            (k0, v0), (k1, v1) = min(zip(self._train, self._train[1:]), key=lambda p: abs(math.log(num_devices / p[0][0])))
            slope = math.log(v1 / v0) / math.log(k1 / k0)
            tps = v0 * (num_devices / k0) ** slope
        return max(0, num_tokens) / tps

    def host_need_bytes(self, num_trainer: int, num_rollout: int) -> float:
        """Peak host memory of a CPU run's ranks: each trainer rank's measured peak RSS (a fixed part plus the
        sharded state, a + b / k through the measured rank counts) and each rollout rank's (a colocated rank
        counts as both). 0 where the profile measured no memory."""
        if self.profile.device != "cpu" or not self.profile.trainer_rss_bytes or not self.profile.rollout_rss_bytes:
            return 0.0  # a device per rank holds its own state
        pts = sorted(self.profile.trainer_rss_bytes.items())
        (k0, r0), (k1, r1) = pts[0], pts[-1]
        shard = (r0 - r1) / (1 / k0 - 1 / k1) if k1 != k0 else 0.0  # the part FSDP divides among the ranks
        per_trainer = max(0.0, r1 - shard / k1 + shard / max(1, num_trainer))
        return num_trainer * per_trainer + num_rollout * self.profile.rollout_rss_bytes

    def host_fits(self, num_trainer: int, num_rollout: int) -> bool:
        need = self.host_need_bytes(num_trainer, num_rollout)
        return not need or not self.profile.host_mem_bytes or need <= HOST_MEM_FRAC * self.profile.host_mem_bytes

    def train_measured_busy(self, num_devices: int) -> int:
        # a measured count ran that many ranks; past the largest, the log-log extrapolation is per rank of its own
        return min(num_devices, max(k for k, _ in self._train))

    def sync_s(self, num_rollout_devices: int, num_trainer_devices: int = 1, colocated: bool = False) -> float:
        if num_rollout_devices < 1:
            return 0.0
        gather = _interp(*self._gather, float(num_trainer_devices)) if self._gather[0] else 0.0
        return gather + (0.0 if colocated else self.profile.sync_s)

    def link_bw_bytes_s(self) -> float:
        # bench.profile times the broadcast of num_params float32 values (engine/runtime/profile.py `measure_comm`):
        # a helper's float32 gradient is as many bytes, so its hand-off costs one measured sync
        return GRAD_BYTES_PER_PARAM * self.model.num_params / self.profile.sync_s

    def reconfig_s(self, num_moved_devices: int, trainer_moved: bool = True, busy_ranks: int = 0) -> float:
        if num_moved_devices <= 0:
            return 0.0
        if not trainer_moved:
            return self.profile.group_rebuild_s + self.profile.sync_s
        # the hand-off was timed on HANDOFF_RANKS ranks alone; during a run the other ranks keep
        # decoding on the same cores (measured: smollm2 on 2 cores, 34 s against 13 s alone)
        if not self.profile.cores or busy_ranks <= HANDOFF_RANKS:
            return self.profile.reconfig_s
        return self.profile.reconfig_s * shared_core_slowdown(busy_ranks, self.profile.cores, HANDOFF_RANKS)


def load_cost_model(path: str | Path) -> ProfiledCostModel:
    return ProfiledCostModel(HardwareProfile.load(Path(path)))
