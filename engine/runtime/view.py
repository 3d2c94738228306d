"""What a person watching a run sees, and the coordinator's health checks.

One dense line per step (always logged; CI and pipes get exactly that). On a terminal a live
`rich` panel under the step lines shows the step, every rollout instance (bucket, TP, ranks,
trajectories in flight and migrating), the layout, and the last step's reward, rollout tokens/s,
migrations and staleness. Heartbeats are checked here (every worker beats from a thread each
second, whatever its main thread does): a worker silent for `straggler_s` is named by rank and
last announced role, and named again when it is back (the run goes on: its peers only waited);
one silent for `rank_timeout_s` ends the run (the launcher tears it down; the newest checkpoint
stays as it was).

Invariants (tests/engine/runtime/test_e2e.py, tests/engine/runtime/test_view.py): the per-step line carries step, reward,
the rollout's own tokens/s, migrations, why a step trained nothing, and the layout when it changed; a silent rank is named once when it falls silent and once
when it is back; a heartbeat older than the rank timeout raises RuntimeError naming the rank.
"""

from __future__ import annotations

import logging
import sys
import time

log = logging.getLogger("libra")


def rollout_rate(row: dict) -> float:
    """Tokens per second of the step's own rollout (admission to its last trajectory): a step's wall time can
    be near 0 when the pipeline had its batch ready, which made tokens / step_s read 210,727 tok/s."""
    return row["tokens"] / max(row["rollout_s"], 1e-9)


def _s(seconds: float) -> str:
    return f"{seconds:.1f}s" if seconds < 10 else f"{seconds:.0f}s"


def step_text(row: dict, num_steps: int, *, layout_changed: bool) -> str:
    """The per-step line: times, the rollout's rate, reward, trajectories, migrations (the run's total), staleness;
    why nothing was trained when it was not; the layout when it changed (it is in the live panel otherwise)."""
    reconfig = f" reconfig {_s(row['reconfig_s'])}" if row["reconfig_s"] else ""
    # a typical step fits 120 columns on a terminal, where the live view prints it as it is
    text = (f"step {row['step']}/{num_steps} {_s(row['step_s'])} | rollout {_s(row['rollout_s'])} "
            f"{rollout_rate(row):.0f} tok/s | train {_s(row['train_s'])} sync {_s(row['sync_s'])}{reconfig} | "
            f"reward {row['reward_mean']:.3f} | {row['trajectories']} traj | migr {row['migrations']} "
            f"stale {row['staleness_max']}")
    if row.get("train/stepped") == 0:
        text += (" | trained nothing: a non-finite loss" if row.get("train/nonfinite_skipped")
                 else " | trained nothing: every group's rewards were equal (no signal)")
    if layout_changed:
        text += f" | layout {row['role_map_desc']}"
    return text


class StepView:
    def __init__(self):
        self._last_health = time.monotonic()
        self._silent: dict[int, tuple[float, str]] = {}  # rank named silent -> (wall time of its last beat, role)
        self._console = None
        self._live = None
        self._last_row: dict | None = None
        self._tick_t = 0.0
        if sys.stdout.isatty():
            from rich.console import Console
            from rich.live import Live

            self._console = Console()
            self._live = Live(console=self._console, refresh_per_second=4, transient=True)
            self._live.start()

    def tick(self, now: float, role_map, reqs, step: int, num_steps: int) -> None:
        """Terminal only: the live panel (step, per-instance in-flight, layout, last step's figures)."""
        if self._live is None or time.monotonic() - self._tick_t < 0.25:
            return
        self._tick_t = time.monotonic()
        from rich.table import Table

        table = Table(title=f"libra step {step + 1}/{num_steps}  t={now:.0f}s  {role_map.describe()}", expand=False)
        for col in ("instance", "bucket", "TP", "ranks", "in flight", "migrating"):
            table.add_column(col)
        for inst in role_map.instances:
            mine = [r for r in reqs.values() if r.instance_id == inst.instance_id]
            table.add_row(str(inst.instance_id), inst.bucket, str(inst.tp), ",".join(map(str, inst.ranks)),
                          str(len(mine)), str(sum(r.migrating for r in mine)))
        r = self._last_row
        if r is not None:
            table.caption = (f"last step: reward {r['reward_mean']:.3f}  {rollout_rate(r):.0f} tok/s in rollout  "
                             f"migrations {r['migrations']}  staleness {r['staleness_max']}")
        self._live.update(table)

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def step_line(self, row: dict, num_steps: int) -> None:
        line = step_text(row, num_steps, layout_changed=self._last_row is None
                         or self._last_row.get("role_map_desc") != row.get("role_map_desc"))
        self._last_row = row
        if self._console is not None:
            self._console.print(line, highlight=False, markup=False)
        else:
            log.info("%s", line)

    def check_health(self, mailbox, world_size: int, rank_timeout_s: float, now: float, straggler_s: float = 10.0) -> None:
        t = time.monotonic()
        if t - self._last_health < 1.0:
            return
        self._last_health = t
        wall = time.time()
        for rank in range(1, world_size):
            beat = mailbox.last_beat_and_role(rank)
            if beat is None:
                continue
            silent_s, role = wall - beat[0], beat[1]
            if silent_s > rank_timeout_s:
                raise RuntimeError(f"rank {rank} ({role}) sent no heartbeat for {silent_s:.0f} s "
                                   f"(limit --launch.rank-timeout-s {rank_timeout_s:.0f}) at t={now:.0f}s; it is hung")
            if silent_s > straggler_s and rank not in self._silent:
                self._silent[rank] = beat
                log.warning("[libra] rank %d (%s) sent no heartbeat for %.0f s: it is not running (stopped, swapping, "
                            "a native hang?) and its peers wait for it; the run goes on when it is back and stops "
                            "after --launch.rank-timeout-s %.0f s", rank, role, silent_s, rank_timeout_s)
            elif rank in self._silent and beat[0] > self._silent[rank][0]:
                self.heard_from(rank)

    def silent(self) -> str:
        """The ranks named silent and not back, for an error that gives up waiting on them."""
        return "; ".join(f"rank {r} ({role}) sent no heartbeat for {time.time() - last:.0f} s: it is hung"
                         for r, (last, role) in sorted(self._silent.items()))

    def heard_from(self, rank: int) -> None:
        """A rank named silent beat or sent a message again: say so (once)."""
        if rank in self._silent:
            last, role = self._silent.pop(rank)
            log.warning("[libra] rank %d (%s) is back after %.0f s without a heartbeat", rank, role, time.time() - last)
