"""``bench/update_cost.py`` (docs/BENCHMARKS.md "Throughput vs Stable-Baselines3", the allocator setting): a short
run of both variants writes its JSON, and the allocator's effect shows in the page faults (the variant with glibc's
defaults faults far more), so
the script cannot silently compare a process with itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_update_cost_runs_both_allocator_variants(tmp_path):
    out = tmp_path / "update_cost.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(REPO / "bench/update_cost.py"), "--algo", "sac", "--frames", "400",
                           "--rounds", "1", "--out", str(out)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(out.read_text())
    runs = {r["variant"]: r for r in record["runs"]}
    assert set(runs) == {"lab", "glibc"}
    for r in runs.values():  # 400 frames, one gradient step per frame at frames 100, 101, ..., 400
        assert r["frames"] == 400 and r["updates"] == 301 and r["update_ms"] > 0
    assert runs["glibc"]["minor_page_faults"] > 5 * runs["lab"]["minor_page_faults"]
