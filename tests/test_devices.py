"""Device detection: CPU fallback, clear errors for absent devices, backend strings."""

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
