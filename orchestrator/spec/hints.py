"""The "did you mean" hint of every bad-input message about a spec: the closest valid word, case-insensitively."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(word: str, options: Iterable[str], cutoff: float = 0.6) -> str:
    """``"; did you mean 'X'?"`` for the option closest to ``word`` (``difflib``, case-insensitive: ``PPo`` finds
    ``PPO``, ``Adamm`` finds ``Adam``), or '' when none is close (similarity below ``cutoff``)."""
    by_lower: dict[str, str] = {}
    for option in options:
        by_lower.setdefault(str(option).lower(), str(option))
    close = difflib.get_close_matches(str(word).lower(), list(by_lower), n=1, cutoff=cutoff)
    return f"; did you mean '{by_lower[close[0]]}'?" if close else ""
