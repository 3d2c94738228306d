"""Device detection: cuda (nccl), npu (hccl), cpu (gloo), and the per-rank device.

`detect(requested)` resolves `--device auto|cpu|cuda|npu` to a `DeviceInfo`. torch_npu is
imported only when an NPU is asked for or looks present (docs/platform.md: importing it without CANN
breaks `import torch`, so presence is sniffed from the filesystem first).

The process-group backend string always carries gloo for CPU tensors ("cpu:gloo,cuda:nccl"), so
that object messages and CPU-side collectives work on every device kind.

Per rank: the device is bound before any process group exists (`set_rank_device`, called by
engine/runtime/launch.py); the coordinator stays on CPU; worker ranks map to local devices in order,
and ranks beyond the device count share them. A group whose members share a device is gloo-only
(`group_backend`), and a trainer or TP group that would share one is refused
(`check_compute_group`), because NCCL/HCCL allow one rank per device in a communicator.

Peak memory has one measurer, `peak_memory_mb(device)`: this process's peak host resident set and
its device allocator's peak, in MB (2**20 bytes). The host peak is the kernel's (getrusage
ru_maxrss: the process's whole life, the image it was exec'd from included) until
`reset_peak_memory()` opens a window; from then on it is the peak since the reset (VmHWM, which
the reset lowers through /proc/self/clear_refs). The workers' and the launcher's `peak_rss_mb*`
in summary.json and bench/trainer_memory.py's peaks all come from it.

Invariants (tests/engine/test_devices.py): asking for a device that is absent raises RuntimeError with
the fix; `auto` on a machine without accelerators is cpu/gloo; the backend string always has
gloo; the device per rank and the backend per group follow the rules above; the host peak is
ru_maxrss until a reset, then rises with what is touched after it; the device peak is 0 on CPU
and the allocator's peak on an accelerator.
"""

from __future__ import annotations

import glob
import importlib.util
import logging
import os
import socket
from dataclasses import dataclass

import torch

from runlog import peak_rss_mb

log = logging.getLogger(__name__)

DEVICE_KINDS = ("auto", "cpu", "cuda", "npu")
_BACKEND = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}


@dataclass(frozen=True)
class DeviceInfo:
    kind: str  # "cpu" | "cuda" | "npu"
    count: int  # local accelerators (for cpu: the number of cores)

    @property
    def backend(self) -> str:
        return _BACKEND[self.kind]

    @property
    def dist_backend(self) -> str:
        """Backend string for init_process_group: gloo for CPU tensors plus the device's own."""
        if self.kind == "cpu":
            return "gloo"
        return f"cpu:gloo,{self.kind}:{self.backend}"

    def torch_device(self, local_index: int) -> torch.device:
        if self.kind == "cpu":
            return torch.device("cpu")
        return torch.device(self.kind, local_index % max(self.count, 1))

    def default_nproc(self) -> int:
        """Ranks to spawn by default: one per accelerator; 4 on CPU (enough for 2 roles + TP2)."""
        return self.count if self.kind != "cpu" else 4


def _npu_present() -> bool:
    if importlib.util.find_spec("torch_npu") is None:
        return False
    return bool(glob.glob("/dev/davinci[0-9]*")) or "ASCEND_RT_VISIBLE_DEVICES" in os.environ


def _npu_count() -> int:
    import torch_npu  # noqa: F401  (registers torch.npu; only imported when an NPU is wanted)

    return torch.npu.device_count()


def detect(requested: str = "auto") -> DeviceInfo:
    if requested not in DEVICE_KINDS:
        raise ValueError(f"--device {requested!r} is not one of {DEVICE_KINDS}")
    if requested in ("auto", "cuda") and torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return DeviceInfo("cuda", torch.cuda.device_count())
    if requested == "cuda":
        raise RuntimeError(
            "--device cuda: no CUDA device is visible (torch.cuda.is_available() is False, "
            f"torch {torch.__version__}); install a CUDA build of torch or run with --device cpu"
        )
    if requested in ("auto", "npu") and _npu_present():
        n = _npu_count()
        if n > 0:
            return DeviceInfo("npu", n)
    if requested == "npu":
        raise RuntimeError(
            "--device npu: no Ascend NPU is visible (needs torch-npu from requirements-npu.txt, CANN, "
            "and /dev/davinci*); set LIBRA_NPU=1 for run.sh on an Ascend host, or run with --device cpu"
        )
    return DeviceInfo("cpu", os.cpu_count() or 1)


def rank_device_index(rank: int, local_rank: int) -> int | None:
    """Local accelerator index of a process; None for the coordinator (global rank 0), which stays on CPU.

    A worker on the coordinator's node (its first global rank is 0, `rank - local_rank == 0`)
    skips the coordinator's local slot: local rank l uses device l - 1. On other nodes of a
    torchrun job there is no coordinator, so local rank l uses device l.
    """
    if rank == 0:
        return None
    return local_rank - 1 if rank - local_rank == 0 else local_rank


def rank_device(info: DeviceInfo, rank: int, local_rank: int) -> torch.device:
    index = rank_device_index(rank, local_rank)
    if info.kind == "cpu" or index is None:
        return torch.device("cpu")
    return info.torch_device(index)


def set_rank_device(info: DeviceInfo, rank: int, local_rank: int, *, threads: int) -> torch.device:
    """Bind this process to its device (before any process group exists) and cap CPU threads."""
    torch.set_num_threads(max(1, threads))
    device = rank_device(info, rank, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    elif device.type == "npu":
        _npu_count()
        torch.npu.set_device(device)
    return device


def device_key(device: torch.device) -> str:
    """Where a rank computes, comparable across ranks and nodes: "host/cuda:3"."""
    return f"{socket.gethostname()}/{device}"


def group_backend(kind: str, member_keys: list[str]) -> str | None:
    """Backend for a new group: None (inherit "cpu:gloo,<dev>:<nccl|hccl>") unless members share a device.

    NCCL and HCCL refuse a communicator with two ranks on one device, so a group whose members
    share one (several ranks per GPU) is gloo-only; its tensors are staged through host memory.
    """
    if kind == "cpu" or len(set(member_keys)) == len(member_keys):
        return None
    return "gloo"


def check_compute_group(kind: str, member_keys: list[str], what: str) -> None:
    """A trainer (FSDP2) or TP group needs the device collectives: refuse members that share a device."""
    shared = sorted({k for k in member_keys if member_keys.count(k) > 1})
    if kind != "cpu" and shared:
        raise ValueError(f"{what} would put {len(member_keys)} ranks on {len(set(member_keys))} device(s) ({', '.join(shared)} "
                         f"shared); {kind} collectives need one rank per device: pass --nproc <= the device count, "
                         "or use --system static so training stays on one rank")


def empty_cache(device: torch.device) -> None:
    """Return cached blocks of the device allocator (after freeing rollout memory); on CPU, the C heap's."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
    elif device.type == "npu":
        torch.npu.empty_cache()
    else:
        trim_host_heap()


_MALLOC_TRIM: list = []  # [libc.malloc_trim or None], looked up once


def trim_host_heap() -> bool:
    """Give the C heap's free pages back to the OS (glibc `malloc_trim(0)`); False where libc has none.

    PyTorch's CPU tensors under glibc's mmap threshold (up to 32 MB) come from the heap, and pages a
    forward pass freed stay resident while the backward allocates others: trimming between them cut a
    2k-token SmolLM2 training step's peak RSS from 3.0 to 2.65 GB at the same speed (a fixed
    MALLOC_MMAP_THRESHOLD_ cut less and was 30% slower)."""
    if not _MALLOC_TRIM:
        import ctypes
        import ctypes.util

        try:
            _MALLOC_TRIM.append(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim)
        except (OSError, AttributeError):
            _MALLOC_TRIM.append(None)
    if _MALLOC_TRIM[0] is None:
        return False
    _MALLOC_TRIM[0](0)
    return True


@dataclass(frozen=True)
class PeakMemory:
    """This process's peak memory in MB: `host_mb` its resident set, `device_mb` its accelerator allocator's."""

    host_mb: float
    device_mb: float = 0.0


_PEAK_WINDOW: list[bool] = []  # [True] once reset_peak_memory lowered this process's VmHWM


def _proc_status_mb(field: str) -> float:
    """A kB field of /proc/self/status (VmRSS, VmHWM) in MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _accelerator(device: torch.device | str | None):
    """torch.cuda or torch.npu for an accelerator device; None for the CPU (or no device)."""
    kind = torch.device(device).type if device is not None else "cpu"
    return {"cuda": getattr(torch, "cuda", None), "npu": getattr(torch, "npu", None)}.get(kind)


def peak_memory_mb(device: torch.device | str | None = None) -> PeakMemory:
    """Peak host RSS of this process (ru_maxrss; after `reset_peak_memory`, the peak since then) and the
    device allocator's peak (`max_memory_allocated`; 0.0 for the CPU or no device), in MB."""
    if _PEAK_WINDOW:
        host = _proc_status_mb("VmHWM")
    else:
        host = peak_rss_mb()
    acc = _accelerator(device)
    return PeakMemory(host, acc.max_memory_allocated(device) / 2**20 if acc is not None else 0.0)


def reset_peak_memory(device: torch.device | str | None = None) -> bool:
    """Start a new peak window: the host peak restarts at the current RSS (/proc/self/clear_refs), the
    device's at what it holds now. False where the host peak cannot be reset (no /proc)."""
    acc = _accelerator(device)
    if acc is not None:
        acc.reset_peak_memory_stats(device)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
    except OSError:
        return False
    if not _PEAK_WINDOW:
        _PEAK_WINDOW.append(True)
    return True


def rss_mb() -> float:
    """This process's resident set now, in MB (/proc/self/status VmRSS)."""
    return _proc_status_mb("VmRSS")
