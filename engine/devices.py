"""Device detection: cuda (nccl), npu (hccl), cpu (gloo), and the per-rank device.

`detect(requested)` resolves `--device auto|cpu|cuda|npu` to a `DeviceInfo`. torch_npu is
imported only when an NPU is asked for or looks present (PLATFORM.md: importing it without CANN
breaks `import torch`, so presence is sniffed from the filesystem first).

The process-group backend string always carries gloo for CPU tensors ("cpu:gloo,cuda:nccl"), so
that object messages and CPU-side collectives work on every device kind.

Invariants (tests/test_devices.py): asking for a device that is absent raises RuntimeError with
the fix; `auto` on a machine without accelerators is cpu/gloo; the backend string always has gloo.
"""

from __future__ import annotations

import glob
import importlib.util
import logging
import os
from dataclasses import dataclass

import torch

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


def set_rank_device(info: DeviceInfo, local_index: int, *, threads: int) -> torch.device:
    """Bind this process to its device and cap CPU threads (ranks share the cores)."""
    torch.set_num_threads(max(1, threads))
    device = info.torch_device(local_index)
    if info.kind == "cuda":
        torch.cuda.set_device(device)
    elif info.kind == "npu":
        _npu_count()
        torch.npu.set_device(device)
    return device
