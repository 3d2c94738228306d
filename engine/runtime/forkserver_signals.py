"""Imported by spawn's forkserver only (engine/runtime/launch.py PRELOAD); nothing else imports it.

The forkserver shares the launcher's process group, and every rank dies with it (PR_SET_PDEATHSIG),
so a stop signal sent to the group (a closed terminal's SIGHUP, `kill -TERM -PGID`) or to every
process (systemd, Slurm) would kill all ranks before the coordinator could write its checkpoint.
The forkserver ignores SIGTERM and SIGHUP instead (a no-op handler) (it already ignores SIGINT); the launcher turns
the signal into a graceful stop, and the forkserver still exits when the launcher does (its pipe
closes). Each rank sets its own handlers at start (`engine.runtime.launch._route_stop_signals`).
"""

import signal



def _ignore(_signum, _frame) -> None:
    """A no-op handler rather than SIG_IGN, which every process exec'd below would inherit."""


for _sig in (signal.SIGTERM, signal.SIGHUP):
    signal.signal(_sig, _ignore)
