"""``bench/batched_learning.py`` (docs/batched-seeds.md "Learning"): a tiny run of both variants records the same
seeds, its separate sessions are the lab's plain sessions row for row, and its IQMs, CIs and verdict are the lab's
statistics of the recorded scores."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
FRAMES, SEED = 1024, 3
OVERRIDES = ["meta.rigorous_eval=0", f"env.max_frame={FRAMES}", "meta.log_frequency=256"]


def final_ma(curve):
    """The last non-NaN total_reward_ma of a recorded curve (NaN recorded as None)."""
    return [v for v in curve["total_reward_ma"] if v is not None][-1]


def test_batched_learning_records_the_same_seeds_and_the_labs_statistics(tmp_path):
    out, png = tmp_path / "learning.json", tmp_path / "learning.png"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(REPO / "bench/batched_learning.py"), "--spec", "ppo_cartpole", "--seeds", "2",
           "--seed", str(SEED), "--frames", str(FRAMES), "--override", "meta.log_frequency=256", "--out", str(out),
           "--graph", str(png)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["session_seeds"] == [SEED, SEED + 1] and record["frames_per_seed"] == FRAMES
    runs = record["sessions"]
    for variant in ("separate", "batched"):
        assert [(r["seed"], r["session"], r["frame"]) for r in runs[variant]] == [(SEED, 0, FRAMES),
                                                                                  (SEED + 1, 1, FRAMES)]
        assert [r["curve"]["frame"] for r in runs[variant]] == [[256, 512, 768, 1024]] * 2

    # the separate variant is the lab's plain session of each seed, row for row
    from bench.batched_seeds import spec_file
    from orchestrator.session.loop import Session
    from orchestrator.spec.load import load_spec

    spec = load_spec(str(spec_file("ppo_cartpole")), "ppo_cartpole", OVERRIDES)
    for k, seed in enumerate((SEED, SEED + 1)):
        session = Session(spec, seed, session=k)
        session.run_rl()
        df = session.train_df
        session.close()
        for column, values in runs["separate"][k]["curve"].items():
            expected = [None if math.isnan(v) else v for v in df[column].tolist()]
            assert values == expected, (seed, column)
        assert runs["separate"][k]["score"] == final_ma(runs["separate"][k]["curve"]) == df["total_reward_ma"].iloc[-1]

    # the verdict is the lab's IQM and bootstrap CI of the recorded final total_reward_ma
    from orchestrator.report import stats

    v = record["verdict"]
    scores = {variant: [final_ma(r["curve"]) for r in runs[variant]] for variant in runs}
    for variant in ("separate", "batched"):
        assert v[variant]["iqm"] == stats.iqm(np.array(scores[variant])) == np.mean(scores[variant])
        assert v[variant]["ci"] == list(stats.bootstrap_ci(np.array(scores[variant])))
    assert v["iqm_diff"] == v["batched"]["iqm"] - v["separate"]["iqm"]
    low, high = v["iqm_diff_ci"]
    assert low <= v["iqm_diff"] <= high and v["agree"] == (low <= 0 <= high)
    assert v["ci_overlap"] == (v["batched"]["ci"][0] <= v["separate"]["ci"][1]
                               and v["separate"]["ci"][0] <= v["batched"]["ci"][1])
    # the IQM curve's last point is the IQM of the final scores (every session logs at the same frames)
    for variant in ("separate", "batched"):
        assert record["iqm_curves"][variant]["frame"][-1] == FRAMES
        assert record["iqm_curves"][variant]["iqm"][-1] == v[variant]["iqm"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size < 100_000

    table = subprocess.run([sys.executable, str(REPO / "bench/batched_learning.py"), "--table", str(out)], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=120)
    assert table.returncode == 0, table.stderr[-3000:]
    row = table.stdout.strip().splitlines()[-1]
    assert row.startswith(f"| `ppo_cartpole` | 2 | {FRAMES:,} | {v['batched']['iqm']:.1f} ")
