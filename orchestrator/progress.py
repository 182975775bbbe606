"""Live progress of sessions (frame, fps, total_reward_ma, ETA) with ``rich``."""

from __future__ import annotations

import math
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


class SessionProgress:
    """One progress bar per session key (e.g. ``t0_s1``), updated from train_df rows.

    Use as a context manager. ``disable=True`` prints nothing (tests, ``--quiet``).
    """

    def __init__(self, disable: bool = False) -> None:
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("fps {task.fields[fps]:>6}"), TextColumn("ma {task.fields[ma]:>7}"),
            TextColumn("{task.fields[status]}"), TimeRemainingColumn(), disable=disable, transient=False)
        self.tasks: dict[str, Any] = {}

    def __enter__(self) -> "SessionProgress":
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def update(self, key: str, row: dict[str, Any], max_frame: int, status: str = "") -> None:
        """Show a session's latest log row (frame of max_frame, fps, total_reward_ma)."""
        fmt = lambda v: "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1f}"  # noqa: E731
        fields = {"fps": fmt(row.get("fps")), "ma": fmt(row.get("total_reward_ma")), "status": status}
        if key not in self.tasks:
            self.tasks[key] = self.progress.add_task(key, total=max_frame, **fields)
        self.progress.update(self.tasks[key], completed=row.get("frame", 0), total=max_frame, **fields)

    def status(self, key: str, status: str) -> None:
        """Set the status text of a session (e.g. ``done``, ``restarting``)."""
        if key in self.tasks:
            self.progress.update(self.tasks[key], status=status)
