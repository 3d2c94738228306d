"""Shared pytest set-up: offline hub, loopback gloo, the repo root on sys.path, the `gpu` marker,
one measured-profile cache per session."""

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session", autouse=True)
def _shared_profile_cache(tmp_path_factory):
    """Every real run of a session plans on one measured tiny profile (engine/runtime/profile_cache.py): the
    first run measures it (~10 s), the others read it; never the user's own cache."""
    if "LIBRA_PROFILE_DIR" not in os.environ:
        os.environ["LIBRA_PROFILE_DIR"] = str(tmp_path_factory.mktemp("profiles"))


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA/NPU device (skipped on CPU)")
    config.addinivalue_line("markers", "slow: takes more than ~20 s on 2 CPU cores")


def pytest_collection_modifyitems(config, items):
    import pytest

    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except Exception:
        has_gpu = False
    if not has_gpu:
        skip = pytest.mark.skip(reason="no CUDA device")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
