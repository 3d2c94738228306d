"""This machine's measured cost profile, measured once per model, device kind and machine, and cached.

A real run with `--planner.profile auto` (the default) plans on what this machine measured with the
runtime's own code (`scheduler/profile.py`), not on the analytic tables:
1. Key: the model, the device kind and a fingerprint of the machine: host name, CPU model, core
   count, torch version, and `PROFILE_VERSION` (bumped when what `engine.runtime.profile --quick`
   measures changes, so old entries are measured again).
2. Look up `<dir>/<model>-<device>-<hash of the key>.json`; dir: `$LIBRA_PROFILE_DIR`, else
   `profiles/` under the model cache (`$LIBRA_CACHE_DIR`, default ~/.cache/libra). A hit whose
   recorded key matches is used as it is.
3. Miss, `refresh`, or a cache file that does not load or records another key (warned): run
   `python -m engine.runtime.profile --quick` in a subprocess (its progress lines go to the log as
   they come; why a subprocess: engine/runtime/profile.py), stamp the key into the profile's meta
   and rename it into place, all under an exclusive lock on the entry, so two runs that start
   together measure once and neither reads half a file.

Invariants (tests/engine/runtime/test_profile_cache.py): a hit measures nothing; a miss measures once and the next
lookup hits; another fingerprint is another entry; a corrupt or foreign entry is measured again
with a warning; a failed measurement raises with its output and leaves no entry.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from scheduler.profile import HardwareProfile

log = logging.getLogger("libra")

PROFILE_VERSION = 3  # bump when engine.runtime.profile --quick changes what it measures: cached entries are measured again
# 2: the rollout engine's CPU linears run oneDNN (engine/rollout/cpu_linear.py), so its decode and prefill times changed
ROOT = Path(__file__).resolve().parents[2]


def profile_dir() -> Path:
    from engine.models import cache_root

    return Path(os.environ.get("LIBRA_PROFILE_DIR") or cache_root() / "profiles")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def fingerprint(model: str, device: str) -> dict:
    """What a cached profile must have been measured with to stand for this run."""
    import torch

    spec = model if model in ("tiny", "smollm2") else str(Path(model).resolve())
    return {"model": spec, "device": device, "host": platform.node(), "cpu": _cpu_model(), "cores": os.cpu_count() or 1,
            "torch": torch.__version__, "profile_version": PROFILE_VERSION}


def entry_path(model: str, device: str, key: dict) -> Path:
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", Path(model.rstrip("/")).name)[:40]
    return profile_dir() / f"{name}-{device}-{digest}.json"


def measure_quick(model: str, out: Path) -> None:
    """`python -m engine.runtime.profile --quick` into `out`, its progress lines logged as they come."""
    cmd = [sys.executable, "-m", "engine.runtime.profile", "--quick", "--model", model, "--out", str(out)]
    with tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True)
        for line in proc.stdout:
            log.info("[libra profile] %s", line.rstrip())
        rc = proc.wait()
        if rc != 0:
            err.seek(0)
            last = ([line for line in err.read().splitlines() if line.strip()] or ["no error output"])[-1]
            raise RuntimeError(f"measuring this machine's profile failed (exit {rc}): {last}; run `python "
                               f"{' '.join(cmd[1:])}` to see all of it, or pass --planner.profile none to plan on the "
                               f"analytic tables")


def _load_entry(path: Path, key: dict) -> HardwareProfile:
    """The cached profile at `path`; ValueError when it does not load or was measured for another key."""
    profile = HardwareProfile.load(path)
    if profile.meta.get("fingerprint") != key:
        raise ValueError(f"it records {profile.meta.get('fingerprint')}, not {key}")
    return profile


def _usable(path: Path, key: dict, *, warn: bool = True) -> tuple[Path, HardwareProfile, str] | None:
    """The cached entry as `cached_profile` returns it; None (warned when a file is there) when it is not usable."""
    if not path.is_file():
        return None
    try:
        profile = _load_entry(path, key)
    except (ValueError, FileNotFoundError) as exc:
        if warn:
            log.warning("[libra] cached profile %s is unusable (%s); measuring this machine again", path, exc)
        return None
    return path, profile, f"cached: measured {profile.meta.get('date', '?')} in {profile.meta.get('measured_s', 0):.0f} s"


def is_cached(model: str, device: str) -> bool:
    """Whether `cached_profile` would find a usable entry (and so measure nothing); it warns, this does not."""
    key = fingerprint(model, device)
    return _usable(entry_path(model, device, key), key, warn=False) is not None


def cached_profile(model: str, device: str, *, refresh: bool = False,
                   measure: Callable[[str, Path], None] = measure_quick) -> tuple[Path, HardwareProfile, str]:
    """(path, profile, how it was got) for this machine: the cached entry, or a new measurement cached."""
    key = fingerprint(model, device)
    path = entry_path(model, device, key)
    if not refresh and (hit := _usable(path, key)):
        return hit
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RuntimeError(f"cannot create the profile cache {path.parent} ({exc}); set LIBRA_PROFILE_DIR to a writable "
                           f"directory, or pass --planner.profile none to plan on the analytic tables") from exc
    with open(path.with_name(f".{path.name}.lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("[libra] waiting for another run that is measuring %s (no time limit; it takes ~1 minute)", path)
            fcntl.flock(lock, fcntl.LOCK_EX)
            if hit := _usable(path, key):  # that run's measurement is as fresh as ours would be
                return hit
        log.info("[libra] measuring this machine's costs for the planner (%s on %s, once; cached in %s)",
                 model, device, path.parent)
        t0 = time.monotonic()
        tmp = path.with_name(f".{path.name}.measuring{os.getpid()}")
        try:
            measure(model, tmp)
            profile = HardwareProfile.load(tmp)
        finally:
            tmp.unlink(missing_ok=True)
        measured_s = round(time.monotonic() - t0, 1)
        profile = dataclasses.replace(profile, meta={**profile.meta, "fingerprint": key, "measured_s": measured_s})
        profile.save(path)
    return path, profile, f"measured now in {measured_s:.0f} s"
