"""Analytic time model: prefill, decode, training, weight sync, reconfiguration per hardware x model x TP.

The planner and the simulator ask this module how long things take; nothing here measures.

Algorithm (roofline plus communication):
1. Decode step of a batch B with mean context C on TP t: per device it reads the weights it
   touches (all of them for a dense model; for an MoE the experts B tokens hit) and the KV cache
   of B x C tokens, divided by t, and does 2 x active_params x B flops (+ attention) divided by t.
   time = max(bytes / bandwidth, flops / peak) + 2 all-reduces per layer of B x hidden values
   (ring: 2 (t-1)/t x size / link bandwidth + a latency of log2(t) rounds per all-reduce).
2. Prefill of N tokens: flops-bound at `prefill_mfu`, with the same per-layer TP all-reduces.
3. Training: 6 x active_params x tokens flops (+ `train_recompute_flops` for the log-prob pass)
   over `num_devices x peak x train_mfu`. With h idle rollout instances helping k trainer ranks
   (`elastic_train_s`), the batch splits evenly by tokens over k + h slots: the trainer takes k/(k+h)
   of it on its k ranks, each helper 1/(k+h) on its one device, in parallel; then each helper hands
   a float32 gradient split over the k trainer ranks (senders in parallel, so a trainer rank
   receives h/k of a full gradient): 4 x params / link bandwidth x max(1, h/k).
4. Weight sync: the bf16 weights cross the node interconnect once (broadcast is pipelined), plus a
   small fixed cost per receiving device. Reconfiguration: group rebuild plus moved devices'
   weight loads.

Published figures this model is checked against (tests/scheduler/test_scheduler_costmodel.py asserts the
model's side of each row):

| figure | published | model |
|---|---|---|
| Qwen2.5-7B (7.6B params) single-stream decode, A100-80G, TP1 | ~7.5 ms/token floor = 15.2 GB / 2.04 TB/s [1]; vLLM measures ~9-12 ms | 7.5 ms at bw_util=1.0, 8.8 ms at the default 0.85 |
| same, TP2 / TP4 speedup per token | 1.5-1.8x / 2.2-3.0x (TP all-reduce bound) [2][3] | 1.7x / 2.5x |
| Qwen3-14B single-stream decode, A800, TP8 vs TP1 | high-TP instance "2-3x faster" per token (Libra paper) | 3.4x (all-reduce latency x log2 TP) |
| same on 910B3 (1.6 TB/s, HCCS) | as above | 2.9x |
| decode tokens/s per device at the KV-memory batch cap, Qwen3-14B, 4k context, A800 | (what decides a throughput TP) | TP1 1,066 (31 seqs fit), TP2 1,616, TP4 1,849, TP8 1,663: KV memory, not bandwidth, makes TP1 the slowest per device |
| Llama-2-70B decode on H100 vs A100 | ~1.6-1.8x (3.35 vs 2.04 TB/s) [1] | 1.64x (bandwidth ratio) |
| FSDP / Megatron training MFU | 40-58% at 7-70B on A100/H100 [4][5] | train_mfu = 0.45 default |
| Ascend 910B3 | ~313 TFLOPS fp16, 1.6 TB/s HBM, 64 GB [6] | table entry |

[1] NVIDIA A100/H100/H200 datasheets; Databricks "LLM inference performance engineering" (2023).
[2] vLLM docs/benchmarks on tensor-parallel decode; [3] Pope et al., "Efficiently Scaling
Transformer Inference" (2022). [4] PyTorch FSDP paper (Zhao et al., VLDB 2023): 57% MFU GPT-175B;
[5] torchtitan (Liang et al., 2024) Llama-3 8B/70B 38-50% MFU. [6] Huawei Ascend 910B specs as
reported by the Libra paper's testbed (arXiv 2606.03077) and vendor sheets; approximate.

Invariants (tests/scheduler/test_scheduler_costmodel.py): every time is positive and finite; decode time
is non-decreasing in batch and context and, per token, TP>1 is faster than TP1 for models whose
weights dominate; training time scales as 1/num_devices; training with no helper is `train_s` exactly,
and with helpers never faster than its slower part; `calibrate_cpu` rejects missing or
non-positive measurements with a message naming them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from scheduler.layout import VALID_TP

GB = 1e9
GRAD_BYTES_PER_PARAM = 4  # a helper hands its gradient to the trainer ranks in float32, whatever its weights' dtype
HELPER_MEM_FRAC = 0.9  # of a rollout device's memory its weights and a gradient in their dtype may take to help


@dataclass(frozen=True, kw_only=True)
class Hardware:
    name: str  # short key, e.g. "a100"
    peak_flops: float  # dense bf16/fp16 flops per second per device
    mem_bw_bytes_s: float  # HBM (or DRAM) bandwidth per device
    mem_bytes: float  # device memory
    link_bw_bytes_s: float  # per-direction device-to-device bandwidth inside the node
    link_latency_s: float  # cost of one small all-reduce on 2 devices (one round; tp devices take log2(tp))
    group_rebuild_s: float  # cost of rebuilding process groups at a step boundary

    def __post_init__(self) -> None:
        for f in ("peak_flops", "mem_bw_bytes_s", "mem_bytes", "link_bw_bytes_s"):
            v = getattr(self, f)
            if not v > 0:
                raise ValueError(f"Hardware {self.name!r}: {f}={v} must be > 0; give the measured or datasheet value")
        if self.link_latency_s < 0 or self.group_rebuild_s < 0:
            raise ValueError(
                f"Hardware {self.name!r}: link_latency_s={self.link_latency_s}, group_rebuild_s="
                f"{self.group_rebuild_s} must be >= 0; use 0 to ignore them"
            )


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    name: str  # short key, e.g. "qwen3-4b"
    num_params: float  # total parameters
    num_active_params: float  # parameters used per token (== num_params for dense models)
    num_layers: int  # transformer blocks
    hidden: int  # model width
    num_kv_heads: int  # key/value heads (GQA)
    head_dim: int  # per-head dimension
    bytes_per_param: int = 2  # bf16 weights
    num_heads: int = 0  # attention (query) heads; TP must divide them (0 = unknown, no constraint)

    def __post_init__(self) -> None:
        if not 0 < self.num_active_params <= self.num_params:
            raise ValueError(
                f"ModelSpec {self.name!r}: num_active_params={self.num_active_params} must be in "
                f"(0, num_params={self.num_params}]; use num_params for a dense model"
            )
        if min(self.num_layers, self.hidden, self.num_kv_heads, self.head_dim, self.bytes_per_param) < 1:
            raise ValueError(f"ModelSpec {self.name!r}: layer/width/head sizes must be >= 1, got {self}")

    def tp_divides(self, tp: int) -> bool:
        """Whether a TP-`tp` instance can shard this model's attention heads."""
        return self.num_heads == 0 or self.num_heads % tp == 0

    @property
    def weight_bytes(self) -> float:
        return self.num_params * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> float:
        return 2.0 * self.num_layers * self.num_kv_heads * self.head_dim * self.bytes_per_param


HARDWARE: dict[str, Hardware] = {
    # A800 = A100 with NVLink capped at 400 GB/s bidirectional.
    "a800": Hardware(name="a800", peak_flops=312e12, mem_bw_bytes_s=2.039e12, mem_bytes=80 * GB,
                     link_bw_bytes_s=200 * GB, link_latency_s=12e-6, group_rebuild_s=2.0),
    "a100": Hardware(name="a100", peak_flops=312e12, mem_bw_bytes_s=2.039e12, mem_bytes=80 * GB,
                     link_bw_bytes_s=300 * GB, link_latency_s=12e-6, group_rebuild_s=2.0),
    "h100": Hardware(name="h100", peak_flops=989e12, mem_bw_bytes_s=3.35e12, mem_bytes=80 * GB,
                     link_bw_bytes_s=450 * GB, link_latency_s=10e-6, group_rebuild_s=2.0),
    "h200": Hardware(name="h200", peak_flops=989e12, mem_bw_bytes_s=4.8e12, mem_bytes=141 * GB,
                     link_bw_bytes_s=450 * GB, link_latency_s=10e-6, group_rebuild_s=2.0),
    "910b3": Hardware(name="910b3", peak_flops=313e12, mem_bw_bytes_s=1.6e12, mem_bytes=64 * GB,
                      link_bw_bytes_s=196 * GB, link_latency_s=20e-6, group_rebuild_s=3.0),
    # Measured by `python -m bench.scheduler` on the 2-core dev boxes (numpy fp32 matmul, memcpy;
    # gloo broadcast 0.7-0.8 GB/s and ~1.5 ms small round trip from docs/platform.md).
    "cpu": Hardware(name="cpu", peak_flops=50e9, mem_bw_bytes_s=8 * GB, mem_bytes=24 * GB,
                    link_bw_bytes_s=0.75 * GB, link_latency_s=1.5e-3, group_rebuild_s=0.05),
}

MODELS: dict[str, ModelSpec] = {
    "qwen3-4b": ModelSpec(name="qwen3-4b", num_params=4.02e9, num_active_params=4.02e9, num_layers=36,
                          hidden=2560, num_kv_heads=8, head_dim=128, num_heads=32),
    "qwen3-14b": ModelSpec(name="qwen3-14b", num_params=14.8e9, num_active_params=14.8e9, num_layers=40,
                           hidden=5120, num_kv_heads=8, head_dim=128, num_heads=40),
    "qwen3-30b-a3b": ModelSpec(name="qwen3-30b-a3b", num_params=30.5e9, num_active_params=3.3e9, num_layers=48,
                               hidden=2048, num_kv_heads=4, head_dim=128, num_heads=32),
    "qwen2.5-7b": ModelSpec(name="qwen2.5-7b", num_params=7.62e9, num_active_params=7.62e9, num_layers=28,
                            hidden=3584, num_kv_heads=4, head_dim=128, num_heads=28),
    "smollm2-135m": ModelSpec(name="smollm2-135m", num_params=134.5e6, num_active_params=134.5e6, num_layers=30,
                              hidden=576, num_kv_heads=3, head_dim=64, num_heads=9),
    # The tests' tiny random Qwen2/Llama (hidden 64, 2 layers): fp32 on CPU.
    "tiny": ModelSpec(name="tiny", num_params=150e3, num_active_params=150e3, num_layers=2, hidden=64,
                      num_kv_heads=2, head_dim=32, bytes_per_param=4, num_heads=4),
}


@dataclass(frozen=True, kw_only=True)
class CostModelConfig:
    bw_util: float = 0.85  # fraction of HBM bandwidth decode kernels reach
    decode_flops_util: float = 0.5  # fraction of peak a decode step reaches when compute-bound
    prefill_mfu: float = 0.5  # model flops utilisation of prefill
    train_mfu: float = 0.45  # model flops utilisation of the trainer (FSDP: 40-58% published)
    train_recompute_flops: float = 2.0  # extra flops per param-token for the log-prob recompute pass
    sync_per_device_s: float = 0.01  # fixed per-receiver cost of a weight sync (handshake, version check)
    optimizer_bytes_per_param: float = 16.0  # bf16 weights + fp32 master + Adam moments, FSDP-sharded

    def __post_init__(self) -> None:
        for f in ("bw_util", "decode_flops_util", "prefill_mfu", "train_mfu"):
            v = getattr(self, f)
            if not 0 < v <= 1:
                raise ValueError(f"CostModelConfig: {f}={v} must be in (0, 1]; it is a utilisation fraction")
        if self.train_recompute_flops < 0 or self.sync_per_device_s < 0 or self.optimizer_bytes_per_param <= 0:
            raise ValueError(
                f"CostModelConfig: train_recompute_flops={self.train_recompute_flops} and sync_per_device_s="
                f"{self.sync_per_device_s} must be >= 0 and optimizer_bytes_per_param="
                f"{self.optimizer_bytes_per_param} > 0"
            )


def shared_core_slowdown(busy: float, cores: int, measured_busy: float = 1) -> float:
    """How much slower work runs with `busy` processes on `cores` shared cores than it did when it
    was measured with `measured_busy` of them (processor sharing: each gets cores/busy of a core)."""
    return max(1.0, busy / cores) / max(1.0, measured_busy / cores)


class CostModel:
    """Predicted seconds for the operations the planner trades off (see the module docstring)."""

    step_overhead_s = 0.0  # the control plane's fixed cost per step (a measured profile knows it)
    shared_cores = 0  # CPU cores every rank shares (a measured CPU profile knows it); 0: a device per rank
    prices_split = True  # False: it cannot price moving ranks between training and rollout (the planner keeps the split)

    def __init__(self, hw: Hardware, model: ModelSpec, cfg: CostModelConfig | None = None) -> None:
        self.hw, self.model, self.cfg = hw, model, cfg or CostModelConfig()

    def _allreduce_s(self, num_bytes: float, tp: int) -> float:
        if tp <= 1:
            return 0.0
        # Small all-reduces (decode moves a few KB per layer) run latency-bound in log2(tp) rounds
        # (NCCL tree / recursive doubling; Thakur et al. 2005), so TP8 pays 3x the TP2 latency. A
        # fixed latency per all-reduce made TP8 decode 5.5x faster than TP1 for a 14B model, where
        # published TP scaling saturates near 3x and the paper's long bucket is "2-3x faster".
        latency_s = self.hw.link_latency_s * math.log2(tp)
        return 2.0 * (tp - 1) / tp * num_bytes / self.hw.link_bw_bytes_s + latency_s

    def _tp_comm_s(self, num_tokens: int, tp: int) -> float:
        # Megatron-style TP: one all-reduce after attention and one after the MLP, per layer.
        per = self._allreduce_s(num_tokens * self.model.hidden * self.model.bytes_per_param, tp)
        return 2 * self.model.num_layers * per

    def _weight_bytes_touched(self, batch: int) -> float:
        m = self.model
        if m.num_active_params >= m.num_params:
            return m.weight_bytes
        # MoE: each token touches `active` params; a batch touches at most all experts.
        frac = min(1.0, batch * m.num_active_params / m.num_params)
        return max(m.num_active_params, frac * m.num_params) * m.bytes_per_param

    def decode_step_s(self, batch: int, context_tokens: float, tp: int) -> float:
        """One decode iteration of `batch` sequences (a time-averaged batch may be fractional)."""
        batch, tp = max(1.0, float(batch)), max(1, int(tp))
        m, hw, c = self.model, self.hw, self.cfg
        kv_shards = min(tp, m.num_kv_heads)  # KV heads replicate once TP exceeds their count
        num_bytes = self._weight_bytes_touched(batch) / tp + batch * max(0.0, context_tokens) * m.kv_bytes_per_token / kv_shards
        flops = (2.0 * m.num_active_params * batch + 4.0 * m.num_layers * m.hidden * batch * max(0.0, context_tokens)) / tp
        compute_s = max(num_bytes / (hw.mem_bw_bytes_s * c.bw_util), flops / (hw.peak_flops * c.decode_flops_util))
        return compute_s + self._tp_comm_s(batch, tp)

    def prefill_s(self, num_tokens: int, tp: int) -> float:
        """Prefill (or re-prefill after a migration) of `num_tokens` tokens on one TP-`tp` instance."""
        n, tp = max(1, int(num_tokens)), max(1, int(tp))
        m = self.model
        flops = 2.0 * m.num_active_params * n + 2.0 * m.num_layers * m.hidden * n * n
        weights_s = m.weight_bytes / tp / (self.hw.mem_bw_bytes_s * self.cfg.bw_util)
        return max(flops / tp / (self.hw.peak_flops * self.cfg.prefill_mfu), weights_s) + self._tp_comm_s(n, tp)

    def train_s(self, num_tokens: int, num_devices: int) -> float:
        """One trainer update over `num_tokens` tokens on `num_devices` FSDP ranks."""
        if num_devices < 1:
            raise ValueError(f"train_s: num_devices={num_devices} must be >= 1; give training at least one device")
        per_token = (6.0 + self.cfg.train_recompute_flops) * self.model.num_active_params
        return per_token * max(0, num_tokens) / (num_devices * self.hw.peak_flops * self.cfg.train_mfu)

    def elastic_train_s(self, num_tokens: int, num_trainer: int, num_helpers: int) -> float:
        """One trainer update over `num_tokens` tokens on `num_trainer` FSDP ranks helped by `num_helpers` idle TP1
        rollout instances (module docstring, 3): the slower of the two parts, then the gradient hand-off.

        Where the ranks share cores (a CPU profile) each part was measured with its own ranks busy; here
        every training process runs at once, so each part is slowed to k + h busy processes (the simulator
        slows the whole further by whatever else runs beside them: `elastic_measured_busy`)."""
        if num_helpers <= 0:
            return self.train_s(num_tokens, num_trainer)
        k, h = num_trainer, num_helpers
        trainer_s = self.train_s(num_tokens * k / (k + h), k)
        helper_s = self.train_s(num_tokens / (k + h), 1)
        if self.shared_cores:
            trainer_s *= shared_core_slowdown(k + h, self.shared_cores, self.train_measured_busy(k))
            helper_s *= shared_core_slowdown(k + h, self.shared_cores, 1)
        return max(trainer_s, helper_s) + self.grad_handoff_s(k, h)

    def elastic_measured_busy(self, num_trainer: int, num_helpers: int) -> int:
        """Processes that were busy in what `elastic_train_s` prices (without helpers: `train_measured_busy`)."""
        return self.train_measured_busy(num_trainer) if num_helpers <= 0 else num_trainer + num_helpers

    def grad_handoff_s(self, num_trainer: int, num_helpers: int) -> float:
        """Seconds for `num_helpers` helpers to hand their float32 gradients to `num_trainer` trainer ranks: each
        sends a full gradient split over the ranks, all at once, so a trainer rank receives h/k of one."""
        if num_helpers <= 0:
            return 0.0
        full_s = GRAD_BYTES_PER_PARAM * self.model.num_params / self.link_bw_bytes_s()
        return full_s * max(1.0, num_helpers / max(1, num_trainer))

    def link_bw_bytes_s(self) -> float:
        """Bytes per second one device sends another (a profile derives it from its measured weight broadcast)."""
        return self.hw.link_bw_bytes_s

    def helper_fits(self) -> bool:
        """Whether a TP1 rollout device can help train: its weights and a gradient in their dtype (cast to float32
        as it is sent) fit its memory; a micro-batch's activations are small beside them, its KV cache is idle."""
        return 2 * self.model.weight_bytes <= HELPER_MEM_FRAC * self.hw.mem_bytes

    def sync_s(self, num_rollout_devices: int, num_trainer_devices: int = 1, colocated: bool = False) -> float:
        """Trainer -> rollout weight transfer: the FSDP trainer gathers the full weights, then a
        pipelined broadcast (bytes cross the link once); colocated ranks load them locally instead."""
        if num_rollout_devices < 1:
            return 0.0
        t = max(1, num_trainer_devices)
        gather_s = self.model.weight_bytes * (t - 1) / t / self.hw.link_bw_bytes_s
        send_s = 0.0 if colocated else self.model.weight_bytes / self.hw.link_bw_bytes_s
        return gather_s + send_s + self.cfg.sync_per_device_s * num_rollout_devices

    def host_fits(self, num_trainer: int, num_rollout: int) -> bool:
        """Whether a run's ranks fit the host's memory (a measured CPU profile knows; a device per rank: yes)."""
        return True

    def train_measured_busy(self, num_devices: int) -> int:
        """Processes that were busy when `train_s(.., num_devices)` was measured (a profile measured a few
        rank counts and extrapolates the others as if each rank had a core of its own)."""
        return num_devices

    def on_shared_cores(self, rollout_s: float, train_s: float, *, num_rollout: int, num_trainer: int,
                        overlap: bool) -> tuple[float, float]:
        """(rollout_s, train_s) of one step where every rank shares `shared_cores` cores (a CPU profile;
        unchanged where each rank has a device). Each stage was measured with its own ranks busy; in a
        run it also shares the cores with the other stage for the part of its time they `overlap`
        (a pipelined split: the next step's rollout runs while the trainer trains), so each process
        gets cores / busy of a core (the simulator's processor sharing, on average over the step).
        Measured (bench.trainer beside busy processes, 2 cores, SmolLM2): two FSDP ranks train at 1.32x
        one alone, 0.86x beside one busy process and 1.01x beside two; processor sharing predicts
        1.32, 0.88 and 0.99."""
        if not self.shared_cores:
            return rollout_s, train_s
        cores, measured = self.shared_cores, self.train_measured_busy(num_trainer)
        roll, train = rollout_s, train_s
        for _ in range(64):  # the overlap depends on the shared times: a damped fixed point
            beside_rollout = num_trainer * min(1.0, train / roll) if overlap and roll > 0 else 0.0
            beside_train = num_rollout * min(1.0, roll / train) if overlap and train > 0 else 0.0
            new = ((roll + rollout_s * shared_core_slowdown(num_rollout + beside_rollout, cores)) / 2,
                   (train + train_s * shared_core_slowdown(num_trainer + beside_train, cores, measured)) / 2)
            if new == (roll, train):
                break
            roll, train = new
        return roll, train

    def reconfig_s(self, num_moved_devices: int, trainer_moved: bool = True, busy_ranks: int = 0) -> float:
        """Switching `num_moved_devices` ranks to a new role: rebuild groups, load their new state
        (the trainer's hand-off when its group changes; else only the weights of the next sync).
        `busy_ranks`: ranks running meanwhile, which matters only where they share cores (a CPU profile)."""
        if num_moved_devices <= 0:
            return 0.0
        if not trainer_moved:
            return self.hw.group_rebuild_s
        load_s = self.model.weight_bytes * self.cfg.optimizer_bytes_per_param / self.model.bytes_per_param
        return self.hw.group_rebuild_s + load_s / self.hw.link_bw_bytes_s * min(1.0, num_moved_devices / 8)

    # ---- memory feasibility ---------------------------------------------------------------
    def kv_capacity_tokens(self, tp: int, mem_frac: float = 0.9) -> float:
        """Tokens of KV cache a TP-`tp` instance holds in the memory its weight shards leave (`mem_frac`
        of the devices' memory: vLLM's gpu_memory_utilization). The one KV-capacity formula: `max_batch`
        (the planner) and the simulator's instances both read it."""
        m, tp = self.model, max(1, int(tp))
        free = tp * self.hw.mem_bytes * mem_frac - m.weight_bytes
        # Past num_kv_heads, TP replicates KV heads, so the instance stores more KV per token.
        per_token = m.kv_bytes_per_token * tp / min(tp, m.num_kv_heads)
        return max(0.0, free) / per_token

    def max_batch(self, context_tokens: float, tp: int, mem_frac: float = 0.9) -> int:
        """Sequences of `context_tokens` whose KV cache fits next to the weights on a TP-`tp` instance (at least 1)."""
        return max(1, int(self.kv_capacity_tokens(tp, mem_frac) / max(1.0, context_tokens)))

    def valid_tp(self) -> tuple[int, ...]:
        """TP degrees of `VALID_TP` that divide the model's attention heads."""
        return tuple(tp for tp in VALID_TP if self.model.tp_divides(tp))

    def min_rollout_tp(self, kv_reserve_frac: float = 0.2) -> int:
        """Smallest valid TP whose weight shard leaves `kv_reserve_frac` of memory for KV."""
        for tp in self.valid_tp():
            if self.model.weight_bytes / tp <= (1.0 - kv_reserve_frac) * self.hw.mem_bytes:
                return tp
        return self.valid_tp()[-1]

    def min_train_devices(self, headroom_frac: float = 0.3) -> int:
        """Fewest FSDP ranks whose sharded weights + optimizer state leave `headroom_frac` for activations."""
        state = self.model.num_params * self.cfg.optimizer_bytes_per_param
        return max(1, math.ceil(state / ((1.0 - headroom_frac) * self.hw.mem_bytes)))


class MemoizedCost:
    """A cost model with its step-time queries memoised: a layout search asks for the same (batch,
    context, TP) hundreds of thousands of times (819k prefill calls over 960 distinct arguments in a
    1,024-device run). Exact by default; with `ctx_quantum` q > 0, contexts and prompt lengths are
    rounded to the middle of their q-token bin first (the simulator's 64 changes a step time by well
    under 1% and makes far more queries repeat). Everything else is the wrapped model's."""

    MAX_ENTRIES = 200_000  # cleared when full, so a long run's memory stays bounded

    def __init__(self, cost, ctx_quantum: int = 0) -> None:
        self.cost, self.q, self.half_q = cost, ctx_quantum, ctx_quantum // 2
        self.shared_cores = getattr(cost, "shared_cores", 0)  # read per event by the simulator: no __getattr__ detour
        self._memo: dict[tuple, float] = {}  # max_batch
        self._decode: dict[tuple, float] = {}  # one table per query, keyed by its arguments alone
        self._prefill: dict[tuple, float] = {}
        self._int_tables: dict[tuple, dict[int, float]] = {}  # `int_table`

    def int_table(self, name: tuple) -> dict[int, float]:
        """A table, one per `name`, that a caller keys by one integer of its own making: the simulator's
        per-event step times (`sim.instance.SimInstance`), looked up without a call nor a tuple per query.
        Its owner keeps it under `MAX_ENTRIES`, as this model keeps its memo."""
        table = self._int_tables.get(name)
        if table is None:
            table = self._int_tables[name] = {}
        return table

    def _put(self, key: tuple, value, memo: dict | None = None):
        memo = self._memo if memo is None else memo
        if len(memo) >= self.MAX_ENTRIES:
            memo.clear()
        memo[key] = value
        return value

    def __getattr__(self, name: str):
        return getattr(self.cost, name)

    def decode_step_s(self, batch: float, context_tokens: float, tp: int) -> float:
        q = self.q
        if q:
            context_tokens = int(context_tokens) // q * q + self.half_q
        key = (batch, context_tokens, tp)
        t = self._decode.get(key)
        if t is None:
            t = self._put(key, self.cost.decode_step_s(batch, context_tokens, tp), self._decode)
        return t

    def prefill_s(self, num_tokens: int, tp: int) -> float:
        q = self.q
        if q:
            num_tokens = max(1, int(num_tokens) // q * q + self.half_q)
        key = (num_tokens, tp)
        t = self._prefill.get(key)
        if t is None:
            t = self._put(key, self.cost.prefill_s(num_tokens, tp), self._prefill)
        return t

    def max_batch(self, context_tokens: float, tp: int, mem_frac: float = 0.9) -> int:
        key = ("m", context_tokens, tp, mem_frac)
        b = self._memo.get(key)
        if b is None:
            b = self._put(key, self.cost.max_batch(context_tokens, tp, mem_frac))
        return b


def calibrate_cpu(timings: dict[str, float], *, base: Hardware | None = None) -> Hardware:
    """Turn microbenchmark numbers into a `Hardware` (keys: flops_per_s, mem_bytes_per_s, and
    optionally link_bytes_per_s, link_latency_s, mem_bytes). The benchmark lives in bench/."""
    need = ("flops_per_s", "mem_bytes_per_s")
    missing = [k for k in need if k not in timings]
    if missing:
        raise ValueError(f"calibrate_cpu: timings {sorted(timings)} lack {missing}; run `python -m bench.scheduler` to measure them")
    bad = {k: v for k, v in timings.items() if not (isinstance(v, (int, float)) and v > 0 and math.isfinite(v))}
    if bad:
        raise ValueError(f"calibrate_cpu: timings {bad} must be positive finite numbers; re-run the microbenchmark")
    base = base or HARDWARE["cpu"]
    return dataclasses.replace(
        base,
        peak_flops=float(timings["flops_per_s"]),
        mem_bw_bytes_s=float(timings["mem_bytes_per_s"]),
        link_bw_bytes_s=float(timings.get("link_bytes_per_s", base.link_bw_bytes_s)),
        link_latency_s=float(timings.get("link_latency_s", base.link_latency_s)),
        mem_bytes=float(timings.get("mem_bytes", base.mem_bytes)),
    )


def get_cost_model(hardware: str, model: str, cfg: CostModelConfig | None = None) -> CostModel:
    """CostModel from table keys, with a ValueError listing the valid keys."""
    if hardware not in HARDWARE:
        raise ValueError(f"unknown hardware {hardware!r}; choose one of {sorted(HARDWARE)}")
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; choose one of {sorted(MODELS)}")
    return CostModel(HARDWARE[hardware], MODELS[model], cfg)
