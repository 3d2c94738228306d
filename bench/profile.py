"""Profile this machine for the planner and the simulator: `python -m bench.profile --model tiny`.

The command line of `engine/runtime/profile.py`, which measures (decode and prefill with the rollout
engine's BatchRunner, training and the full-weight gather, weight sync, group rebuild, a role
switch's hand-off, the step overhead) and writes a `scheduler.profile.HardwareProfile` JSON
(default `profiles/<model>-<device>.json`); `--quick` is what a run's `--planner.profile auto`
measures once per machine and model. Same flags and output as `python -m engine.runtime.profile`:
see its docstring for what each figure is.

Last line: `profile: PATH`. Pass the file to a run with `--planner.profile PATH`, to the
simulator with `SimConfig(profile=PATH)`, and to `python -m bench.fidelity --profile PATH`. On a
loaded 2-core box every figure is noisy; run it when the machine is quiet.
"""

from __future__ import annotations

from engine.runtime.profile import main as _main


def main() -> None:
    _main(description=__doc__.splitlines()[0])


if __name__ == "__main__":
    main()
