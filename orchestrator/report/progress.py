"""Live progress of sessions (frame, fps, total_reward_ma, ETA) with ``rich``.

On a terminal: one live bar per session. Otherwise (output piped, ``nohup``, a CI log): one plain
line per session at most every ``PLAIN_INTERVAL_S`` seconds, and on every status change.
"""

from __future__ import annotations

import math
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

PLAIN_INTERVAL_S = 10.0


def _fmt(value: Any) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.1f}"


class SessionProgress:
    """One progress bar per session key (e.g. ``t0_s1``), updated from train_df rows.

    Use as a context manager. ``disable=True`` prints nothing (tests, ``--quiet``). ``console``:
    where to draw (default: stdout); when it is not a terminal only plain lines are printed.
    """

    def __init__(self, disable: bool = False, console: Console | None = None) -> None:
        console = console or Console()
        self.disable = disable
        self.plain = not disable and not console.is_terminal
        # not a terminal: the bars only track state for the plain lines, and are never rendered
        # (not even once at the end, which would print a block of bars into a log)
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("fps {task.fields[fps]:>6}"), TextColumn("ma {task.fields[ma]:>7}"),
            TextColumn("{task.fields[status]}"), TimeRemainingColumn(), console=console,
            disable=disable or self.plain, transient=False)
        self.tasks: dict[str, Any] = {}
        self.last_line: dict[str, float] = {}  # key -> monotonic time of its last plain line

    def __enter__(self) -> "SessionProgress":
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def update(self, key: str, row: dict[str, Any], max_frame: int, status: str = "", line: bool = False) -> None:
        """Show a session's latest log row (frame of max_frame, fps, total_reward_ma); ``line``: print its plain line
        now (output that is not a terminal) even within ``PLAIN_INTERVAL_S`` of the last one."""
        fields = {"fps": _fmt(row.get("fps")), "ma": _fmt(row.get("total_reward_ma")), "status": status}
        if key not in self.tasks:
            self.tasks[key] = self.progress.add_task(key, total=max_frame, **fields)
        self.progress.update(self.tasks[key], completed=row.get("frame", 0), total=max_frame, **fields)
        if self.plain and (line or time.monotonic() - self.last_line.get(key, -math.inf) >= PLAIN_INTERVAL_S):
            self.print_line(key)

    def status(self, key: str, status: str) -> None:
        """Set the status text of a session (e.g. ``done``, ``restarting``)."""
        if key in self.tasks:
            self.progress.update(self.tasks[key], status=status)
            if self.plain:
                self.print_line(key)

    def print_line(self, key: str) -> None:
        """One plain progress line of a session (for output that is not a terminal)."""
        task = self.progress.tasks[self.tasks[key]]
        f = task.fields
        print(f"{key} frame {int(task.completed)}/{int(task.total or 0)} fps {f['fps']} "
              f"total_reward_ma {f['ma']} {f['status']}".rstrip(), flush=True)
        self.last_line[key] = time.monotonic()
