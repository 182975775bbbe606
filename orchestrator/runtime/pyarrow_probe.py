"""Patch of pyarrow's pandas probe: Parquet through pyarrow without importing pandas.

Checked on: pyarrow 26 (``CHECKED_ON``). Fallback: where pyarrow no longer probes, or probes elsewhere, the patch
does nothing and pandas is imported as before. Measured gain: about 100 MB RSS and 1 s of each session process
that writes Parquet before it imports pandas (docs/BENCHMARKS.md "Process memory"), 2% of the 45 s CartPole
``train`` of "Start-up and exit" and a tenth of a CartPole session's RSS. ``tests/test_architecture.py``
fails when a new pyarrow stops importing pandas on its probe (the patch is then no longer needed).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

CHECKED_ON = "pyarrow==26"


class _NoPandas:
    """A ``sys.meta_path`` finder that refuses ``import pandas`` (``skip_pandas_probe``)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "pandas":
            raise ImportError("pandas is not imported by this process yet")


def skip_pandas_probe() -> None:
    """Keep pyarrow from importing pandas (~100 MB RSS, ~1 s) in a process that has not imported it.

    pyarrow (26) probes for pandas the first time it converts Python objects (``pa.array``,
    ``Table.from_pylist``: to recognize pandas objects among them) and imports it when installed. A process
    that has not imported pandas holds no pandas object, so the probe is made to fail once, now: pyarrow then
    records "no pandas" for recognizing objects, and imports pandas for real on the first call that needs it
    (``to_pandas``, ``Table.from_pandas``, ``pandas.read_parquet``). A no-op once pandas is imported.
    """
    import sys

    if "pandas" in sys.modules:
        return
    blocker = _NoPandas()
    sys.meta_path.insert(0, blocker)
    try:
        pa.array([0])
    finally:
        sys.meta_path.remove(blocker)


