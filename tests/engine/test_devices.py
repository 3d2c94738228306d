"""Device detection: CPU fallback, clear errors for absent devices, backend strings; peak memory."""

import pytest
import torch

from engine.devices import DeviceInfo, detect


def test_auto_on_a_machine_without_accelerators_is_cpu_gloo():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    info = detect("auto")
    assert (info.kind, info.backend, info.dist_backend) == ("cpu", "gloo", "gloo")
    assert info.default_nproc() == 4


def test_absent_cuda_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(RuntimeError, match="--device cuda: no CUDA device is visible .* run with --device cpu"):
        detect("cuda")


def test_absent_npu_is_a_clear_error():
    with pytest.raises(RuntimeError, match="--device npu: no Ascend NPU is visible"):
        detect("npu")


def test_unknown_device_kind():
    with pytest.raises(ValueError, match=r"--device 'tpu' is not one of"):
        detect("tpu")


def test_accelerator_backends_keep_gloo_for_cpu_tensors():
    assert DeviceInfo("cuda", 8).dist_backend == "cpu:gloo,cuda:nccl"
    assert DeviceInfo("npu", 8).dist_backend == "cpu:gloo,npu:hccl"
    assert DeviceInfo("cuda", 8).default_nproc() == 8


# ---- per-rank device and per-group backend: decided the same way on CPU as on a GPU node --------
from engine.devices import check_compute_group, group_backend, rank_device, rank_device_index  # noqa: E402


def test_coordinator_stays_on_cpu_and_workers_take_devices_in_order():
    # our launcher / single-node torchrun: local rank == global rank, rank 0 coordinates
    assert [rank_device_index(r, r) for r in range(5)] == [None, 0, 1, 2, 3]
    # a second node of a multi-node torchrun (global ranks 9..16, no coordinator there)
    assert [rank_device_index(9 + lr, lr) for lr in range(3)] == [0, 1, 2]
    cuda = DeviceInfo("cuda", 2)
    assert [str(rank_device(cuda, r, r)) for r in range(5)] == ["cpu", "cuda:0", "cuda:1", "cuda:0", "cuda:1"]
    assert {str(rank_device(DeviceInfo("cpu", 2), r, r)) for r in range(4)} == {"cpu"}


def test_backend_per_group():
    assert group_backend("cuda", ["h/cuda:0", "h/cuda:1"]) is None  # default: cpu:gloo,cuda:nccl
    assert group_backend("npu", ["h/npu:0", "h2/npu:0"]) is None  # same index on another host is another device
    assert group_backend("cuda", ["h/cuda:0", "h/cuda:0"]) == "gloo"
    assert group_backend("cpu", ["h/cpu", "h/cpu"]) is None
    check_compute_group("cuda", ["h/cuda:0", "h/cuda:1"], "trainer")
    check_compute_group("cpu", ["h/cpu", "h/cpu"], "trainer")
    with pytest.raises(ValueError, match=r"TP2 would put 2 ranks on 1 device\(s\) \(h/cuda:3 shared\)"):
        check_compute_group("cuda", ["h/cuda:3", "h/cuda:3"], "TP2")


def test_trimming_the_host_heap_gives_freed_pages_back():
    """glibc keeps freed heap chunks resident; trim_host_heap (malloc_trim) gives their pages back to the OS. Many
    1 MB tensors on the heap freed, but for the last one, which pins the heap's top (no automatic trim)."""
    import psutil

    from engine.devices import trim_host_heap

    if not trim_host_heap():
        pytest.skip("this libc has no malloc_trim")
    big = torch.ones(4 << 20)
    del big  # freeing a 16 MB mmapped chunk raises glibc's mmap threshold above 1 MB: the next ones come from the heap
    keep = [torch.ones(1 << 18) for _ in range(400)]  # 400 x 1 MB, touched
    last = keep.pop()
    before = psutil.Process().memory_info().rss
    del keep
    held = psutil.Process().memory_info().rss
    trim_host_heap()
    after = psutil.Process().memory_info().rss
    assert last.sum() > 0
    assert after < held - 200 * 2**20, (before >> 20, held >> 20, after >> 20)


# ---- peak memory: one measurer for the host RSS peak and the device allocator's peak -----------
def test_peak_memory_is_the_kernels_lifetime_peak_and_zero_on_the_device_of_a_cpu():
    """Until a reset the host peak is getrusage's ru_maxrss, what summary.json's peak_rss_mb always was."""
    import resource

    from engine.devices import peak_memory_mb

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    peak = peak_memory_mb()
    assert before <= peak.host_mb <= resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    assert peak.device_mb == 0.0 and peak_memory_mb(torch.device("cpu")).device_mb == 0.0


WINDOW = """
import json, torch
from engine.devices import peak_memory_mb, reset_peak_memory, rss_mb
big = torch.ones(64 << 20)  # 256 MB, touched
del big
lifetime = peak_memory_mb().host_mb
if not reset_peak_memory():
    raise SystemExit(3)
after_reset, now = peak_memory_mb().host_mb, rss_mb()
mid = torch.ones(32 << 20)  # 128 MB, touched
print(json.dumps([lifetime, after_reset, now, peak_memory_mb().host_mb, float(mid[0])]))
"""


def test_a_reset_opens_a_peak_window():
    """After reset_peak_memory the host peak restarts at the RSS of now and rises with what is touched after."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    proc = subprocess.run([sys.executable, "-c", WINDOW], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])  # its own process: a reset here would change pytest's
    if proc.returncode == 3:
        pytest.skip("no /proc/self/clear_refs here")
    assert proc.returncode == 0, proc.stderr
    lifetime, after_reset, now, later, _ = json.loads(proc.stdout.splitlines()[-1])
    assert after_reset < lifetime - 200 and abs(after_reset - now) < 32
    assert later > now + 100


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_the_device_peak_is_the_allocators(monkeypatch):
    from engine import devices
    from engine.devices import peak_memory_mb, reset_peak_memory

    monkeypatch.setattr(devices, "_PEAK_WINDOW", [])  # the reset's host window stays this test's
    dev = torch.device("cuda", 0)
    x = torch.empty(64 << 20, dtype=torch.uint8, device=dev)
    assert peak_memory_mb(dev).device_mb >= 64
    del x
    reset_peak_memory(dev)
    assert peak_memory_mb(dev).device_mb < 64
