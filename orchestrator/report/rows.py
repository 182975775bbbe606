"""How the console and log.txt write a value and a train_df row: floats to 4 significant digits, the rest as
``str``; a row as ``key=value`` pairs in its column order (``format_row``: the line ``log.txt`` gets per row)."""

from __future__ import annotations

from typing import Any


def format_value(value: Any) -> str:
    """``value`` as the console and log.txt show it: a float to 4 significant digits (``0.0003``, ``1.235e+04``,
    ``nan``), anything else as ``str``."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def format_row(row: dict[str, Any]) -> str:
    """A train_df row as one line of ``key=value`` pairs separated by spaces, in the row's order."""
    return " ".join(f"{key}={format_value(value)}" for key, value in row.items())
