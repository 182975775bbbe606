"""Tracking cost per train_df log row (orchestrator/report/tracking.py), outside the step loop: the time
``SessionTracker.log`` takes for one row (the worst case, a checkpoint at every log row), per
backend, on a local data dir; plus the one-off open + close time. No training: rows are synthetic
train_df rows (15 columns). Usage:

    python bench/tracking_cost.py [--rows 500] [--out bench/results/tracking_cost.json]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from types import SimpleNamespace

from orchestrator.report.tracking import SessionTracker
from orchestrator.session.loop import TRAIN_COLUMNS
from orchestrator.spec.load import load_spec
from orchestrator.store import storage

CASES = {
    "tensorboard": [],
    "tensorboard + wandb (offline)": ["meta.tracking=wandb", 'meta.tracking_options={"mode": "offline"}'],
    "tensorboard + mlflow (file store)": ["meta.tracking=mlflow"],
}


def row(i: int) -> dict:
    """A synthetic train_df row at frame 1000 (i + 1)."""
    return {c: float(i) * 0.5 + k for k, c in enumerate(TRAIN_COLUMNS)} | {"frame": 1000 * (i + 1), "refill": False}


def measure(name: str, overrides: list[str], rows: int, root: str) -> dict:
    """ms per row of ``SessionTracker.log`` (one row per call) and seconds to open + close."""
    if "mlflow" in name:
        overrides = overrides + [f'meta.tracking_options={{"tracking_uri": "file://{root}/mlruns"}}']
    spec = load_spec("specs/benchmark/cartpole.json", "ppo_cartpole", overrides)
    tracker = SessionTracker(spec, os.path.join(root, f"ppo_cartpole_2026_01_0{len(name) % 9 + 1}_000000"), 0, 0)
    session = SimpleNamespace(train_rows=[], eval_rows=[])
    tracker.start(session, None)
    for i in range(rows):
        session.train_rows.append(row(i))
        tracker.log(session, committed=session.train_rows[-1]["frame"])
    tracker.close(session, session.train_rows[-1]["frame"])
    return {"case": name, "rows": rows, "ms_per_row": 1000 * tracker.seconds / rows,
            "open_close_s": tracker.setup_seconds}


def main() -> None:
    """The command line (usage in the module docstring): runs the benchmark and writes its results file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=500)
    parser.add_argument("--out", default="bench/results/tracking_cost.json")
    args = parser.parse_args()
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3's file store opt-in (bench only)
    with tempfile.TemporaryDirectory() as root:
        results = [measure(name, overrides, args.rows, root) for name, overrides in CASES.items()]
    for r in results:
        print(f"{r['case']:<36} {r['ms_per_row']:.2f} ms per log row, open+close {r['open_close_s']:.2f} s")
    storage.write_text(args.out, json.dumps({"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                             "results": results}, indent=2))


if __name__ == "__main__":
    main()
