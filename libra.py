"""Libra command line: parse config -> plan placement -> spawn ranks -> run -> tear down.

    python libra.py --bench swe                    # a real run with the defaults for this machine
    python libra.py --bench swe --plan-only        # print the placement and exit
    python libra.py --bench swe --sim --compare    # the simulator, every system, cluster scale
    python libra.py --help                         # every flag, generated from config.py
    python libra.py export RUN_DIR --to DIR        # the trained policy as a Hugging Face directory

Under torchrun (`torchrun --nproc-per-node 9 libra.py ...`) global rank 0 is the coordinator
and the others are workers, exactly as with our own launcher.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from pathlib import Path

log = logging.getLogger("libra")


def _setup_logging() -> None:
    logging.basicConfig(level=os.environ.get("LIBRA_LOG", "INFO"), format="%(asctime)s %(message)s", datefmt="%H:%M:%S")


def _run_dir(cfg) -> Path:
    if cfg.run.resume:
        return Path(cfg.run.resume)
    if cfg.run.out:
        return Path(cfg.run.out)
    kind = "sim-" if cfg.run.sim else ""
    what = "compare" if cfg.run.compare else cfg.run.system
    # under torchrun every process must pick the same directory: use the job's run id
    stamp = os.environ.get("TORCHELASTIC_RUN_ID") or time.strftime("%Y%m%d-%H%M%S")
    name = cfg.run.env.rpartition(":")[2].lower() if cfg.run.env else cfg.run.bench
    return Path("runs") / f"{name}-{kind}{what}-{stamp}"


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP (kill, docker/systemctl stop, Slurm preemption, a closed terminal): the same
    path as Ctrl-C. The launcher forwards it to the coordinator, which checkpoints the last trained step
    and writes the trace and summary (engine/runtime/launch.py), and the run ends with one line and a defined
    exit code."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stopped(signum, _frame):
    raise Stopped(signum)


def main(argv: list[str] | None = None) -> int:
    previous = {sig: signal.signal(sig, _raise_stopped) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        return _main(argv)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _main(argv: list[str] | None) -> int:
    _setup_logging()
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["export"]:
        from engine.runtime.export import main as export_main

        return export_main(argv[1:])
    from config import parse_args

    try:
        cfg = parse_args(argv, device_kind_of=_device_kind)
        if not cfg.run.plan_only:
            from engine.runtime.preflight import check_run_inputs

            check_run_inputs(cfg, _run_dir(cfg))
        if cfg.run.sim:
            return _simulate(cfg, argv)
        from engine.runtime.run import plan_placement, placement_table, run, run_compare, start_ranks_early

        if not cfg.run.plan_only:
            start_ranks_early(cfg)
        cfg, info, role_map = plan_placement(cfg)  # the config as the launcher resolved it (allowed TP degrees)
        if cfg.run.compare:
            return run_compare(cfg, info, _run_dir(cfg))
        if cfg.run.plan_only:
            print(placement_table(role_map, info, cfg))
            return 0
        return run(cfg, info, role_map, _run_dir(cfg))
    except (ValueError, RuntimeError, OSError) as exc:  # OSError: a missing file, a full disk, permissions
        log.error("libra: %s", exc)
        return 2 if isinstance(exc, ValueError) else 1
    except KeyboardInterrupt as exc:
        signum = exc.signum if isinstance(exc, Stopped) else signal.SIGINT
        done = "its last trained step is checkpointed" if getattr(exc, "results", None) else "every rank was torn down"
        log.error("libra: stopped by %s; %s", signal.Signals(signum).name, done)
        return 128 + signum  # the shell's code for death by that signal: 130 SIGINT, 143 SIGTERM, 129 SIGHUP


def _device_kind(requested: str) -> str:
    from engine.devices import detect

    return detect(requested).kind


def _simulate(cfg, argv: list[str]) -> int:
    """The simulator, with the flags given that mean something there (the others are refused: sim/config.py)."""
    from config import given_keys
    from sim.run import run_from_libra_config

    return run_from_libra_config(cfg, _run_dir(cfg), given_keys(argv))


def _exit(code: int) -> None:
    """End the process. A torchrun rank ends the way a child of our own launcher does (multiprocessing
    ends those with `os._exit`): outputs flushed, interpreter finalization skipped. Finalization races
    gloo's worker threads, which may still be freeing the last collective's work and its tensors; one
    that needs the GIL then is killed mid-destructor and the rank aborts after a finished run
    (pytorch/pytorch#179291), so torchrun reports a failure for a run that succeeded."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # the test engine/runtime/run.py uses for torchrun
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    _exit(main())
