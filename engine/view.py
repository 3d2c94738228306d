"""What a person watching a run sees, and the coordinator's health checks.

One dense line per step (always logged; CI and pipes get exactly that). On a terminal a live
`rich` panel under the step lines shows the step, every rollout instance (bucket, TP, ranks,
trajectories in flight and migrating), the layout, and the last step's reward, tokens/s,
migrations and staleness. Heartbeats are checked here: a worker silent longer than `rank_timeout_s` is
reported by rank and last announced role, and the run stops (the launcher tears it down).

Invariants (tests/test_e2e.py): the per-step line carries step, reward, tokens/s, migrations
and the layout; a stale heartbeat raises RuntimeError naming the rank.
"""

from __future__ import annotations

import logging
import sys
import time

log = logging.getLogger("libra")


class StepView:
    def __init__(self):
        self._last_health = time.monotonic()
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
            table.caption = (f"last step: reward {r['reward_mean']:.3f}  {r['tokens'] / max(r['step_s'], 1e-9):.0f} tok/s  "
                             f"migrations so far {r['migrations']}  staleness {r['staleness_max']}")
        self._live.update(table)

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def step_line(self, row: dict, num_steps: int) -> None:
        tok_s = row["tokens"] / max(row["step_s"], 1e-9)
        line = (f"[libra] step {row['step']}/{num_steps} {row['step_s']:.1f}s (rollout {row['rollout_s']:.1f} "
                f"train {row['train_s']:.1f} sync {row['sync_s']:.2f} reconfig {row['reconfig_s']:.1f}) | "
                f"reward {row['reward_mean']:.3f} | {row['trajectories']} traj {row['tokens']} tok {tok_s:.0f} tok/s | "
                f"migrations so far {row['migrations']} staleness {row['staleness_max']} | {row['role_map_desc']}")
        self._last_row = row
        if self._console is not None:
            self._console.print(line, highlight=False, markup=False)
        else:
            log.info("%s", line)

    def check_health(self, mailbox, world_size: int, rank_timeout_s: float, now: float) -> None:
        t = time.monotonic()
        if t - self._last_health < 2.0:
            return
        self._last_health = t
        wall = time.time()
        for rank in range(1, world_size):
            beat = mailbox.last_beat_and_role(rank)
            if beat is not None and wall - beat[0] > rank_timeout_s:
                raise RuntimeError(f"rank {rank} ({beat[1]}) sent no heartbeat for {wall - beat[0]:.0f} s "
                                   f"(limit {rank_timeout_s:.0f} s) at t={now:.0f}s; it is hung")
