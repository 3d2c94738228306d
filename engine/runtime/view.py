"""What a person watching a run sees, and the coordinator's health checks.

One dense line per step (always logged; CI and pipes get exactly that). On a terminal a live
`rich` panel under the step lines (and every log line, printed above it through its console)
shows the step, every rollout instance (bucket, TP, ranks,
trajectories in flight and migrating), the layout, and the last step's reward, rollout tokens/s,
migrations and staleness. Heartbeats are checked here (every worker beats from a thread each
second, whatever its main thread does): a worker silent for `straggler_s` is named by rank and
last announced role, and named again when it is back (the run goes on: its peers only waited);
one silent for `rank_timeout_s` ends the run (the launcher tears it down; the newest checkpoint
stays as it was).

Other processes share the terminal: a worker's log lines go to rank 0 (`ToCoordinator`, a
`LogLine` message), which prints them above the panel.

Invariants (tests/engine/runtime/test_e2e.py, tests/engine/runtime/test_view.py): the per-step line carries step, reward,
the rollout's own tokens/s, migrations, why a step trained nothing (in full the first time), and the layout when it changed; a silent rank is named once when it falls silent and once
when it is back; a heartbeat older than the rank timeout raises RuntimeError naming the rank;
with the panel up, log lines reach its console (above the panel) and go straight out again once it closes.
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


SKIPPED = {"no signal": "every group's rewards were equal, so every GRPO advantage was 0",
           "non-finite loss": "its loss was not finite (the update was dropped, the weights kept)"}


def skip_reason(row: dict) -> str | None:
    """Why the step trained nothing (a key of `SKIPPED`), or None when it trained."""
    if row.get("train/stepped") != 0:
        return None
    return "non-finite loss" if row.get("train/nonfinite_skipped") else "no signal"


def step_text(row: dict, num_steps: int, *, layout_changed: bool) -> str:
    """The per-step line: times, the rollout's rate, reward, trajectories, migrations (the run's total), staleness;
    why nothing was trained in place of the training time when it was not (`SKIPPED` says it in full once);
    the layout when it changed (it is in the live panel otherwise)."""
    reconfig = f" reconfig {_s(row['reconfig_s'])}" if row["reconfig_s"] else ""
    skipped = skip_reason(row)
    sync = f" sync {_s(row['sync_s'])}" if row["sync_s"] or not skipped else ""  # no update, no weights to send
    train = f"train skipped: {skipped}" if skipped else f"train {_s(row['train_s'])}"
    # a typical step fits 120 columns on a terminal, where the live view prints it as it is
    text = (f"step {row['step']}/{num_steps} {_s(row['step_s'])} | rollout {_s(row['rollout_s'])} "
            f"{rollout_rate(row):.0f} tok/s | {train}{sync}{reconfig} | "
            f"reward {row['reward_mean']:.3f} | {row['trajectories']} traj | migr {row['migrations']} "
            f"stale {row['staleness_max']}")
    if layout_changed:
        text += f" | layout {row['role_map_desc']}"
    return text


class ToCoordinator(logging.Handler):
    """A worker's log handler while rank 0 draws its live panel on the shared terminal: a line written
    straight there shifted the panel, whose next refresh then erased that line and left the panel's
    title and top border in the scrollback; each line goes to rank 0 as a `LogLine` instead."""

    def __init__(self, send, formatter: logging.Formatter | None):
        """`send(text)`: delivers a line to rank 0 (the worker's mailbox)."""
        super().__init__()
        self.send = send
        self.setFormatter(formatter)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.send(self.format(record))
        except Exception:  # a mailbox gone at teardown: the line goes where logging's error handler says
            self.handleError(record)

    @classmethod
    def install(cls, send) -> list[tuple[logging.Handler, logging.Handler]]:
        """Replace the root logger's terminal handlers by this one (same format); returns what to restore."""
        root, swapped = logging.getLogger(), []
        for handler in list(root.handlers):
            if isinstance(handler, logging.StreamHandler) and getattr(handler.stream, "isatty", lambda: False)():
                mine = cls(send, handler.formatter)
                root.removeHandler(handler)
                root.addHandler(mine)
                swapped.append((handler, mine))
        return swapped

    @staticmethod
    def restore(swapped: list[tuple[logging.Handler, logging.Handler]]) -> None:
        root = logging.getLogger()
        for handler, mine in swapped:
            root.removeHandler(mine)
            root.addHandler(handler)


class StepView:
    def __init__(self, console=None):
        """`console`: the rich console of the live panel (None: one on stdout when it is a terminal, else no panel)."""
        self._last_health = time.monotonic()
        self._silent: dict[int, tuple[float, str]] = {}  # rank named silent -> (wall time of its last beat, role)
        self._console = console
        self._live = None
        self._last_row: dict | None = None
        self._tick_t = 0.0
        self._streams: list[tuple[logging.StreamHandler, object]] = []  # log handlers moved onto the panel's console
        self._explained: set[str] = set()  # skip reasons said in full once
        if console is None and sys.stdout.isatty():
            from rich.console import Console

            self._console = Console()
        if self._console is not None:
            from rich.live import Live

            before = (sys.stdout, sys.stderr)
            # refreshed by `tick` on the coordinator's thread only: no refresh thread interleaves with the log
            # lines other threads (the scoring pool) print above the panel
            self._live = Live(console=self._console, auto_refresh=False, transient=True)
            self._live.start()  # on a terminal it redirects sys.stdout/stderr: what they get prints above the panel
            self._follow_redirect(before)

    def _follow_redirect(self, before: tuple) -> None:
        """Log handlers hold the stream they were made with, so their lines bypassed the panel's redirect
        and its next refresh drew over them (the planner's decisions never showed on a terminal, and each
        step left a stray border in the scrollback): point them at the redirected streams until `close`."""
        now = {id(before[0]): sys.stdout, id(before[1]): sys.stderr}
        for handler in logging.getLogger().handlers + log.handlers:
            stream = getattr(handler, "stream", None)
            if isinstance(handler, logging.StreamHandler) and id(stream) in now and now[id(stream)] is not stream:
                self._streams.append((handler, stream))
                handler.setStream(now[id(stream)])

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
        self._live.update(table, refresh=True)

    def close(self) -> None:
        """The panel goes (it is transient: nothing of it stays in the scrollback) and log lines go straight out again."""
        if self._live is not None:
            self._live.stop()
            self._live = None
        for handler, stream in self._streams:
            handler.setStream(stream)
        self._streams.clear()

    def print_line(self, text: str) -> None:
        """Another process's log line (a worker's, `LogLine`): above the panel on a terminal, else to stderr as is."""
        if self._console is not None:
            self._console.print(text, highlight=False, markup=False)
        else:
            print(text, file=sys.stderr, flush=True)

    def step_line(self, row: dict, num_steps: int) -> None:
        line = step_text(row, num_steps, layout_changed=self._last_row is None
                         or self._last_row.get("role_map_desc") != row.get("role_map_desc"))
        self._last_row = row
        reason = skip_reason(row)
        if reason and reason not in self._explained:  # the line says it in two words; the first time, in full
            self._explained.add(reason)
            line += f"\n  (train skipped: {reason}: {SKIPPED[reason]})"

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
