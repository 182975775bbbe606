"""``bench/batched_learning.py`` (docs/batched-seeds.md "Learning"): a tiny run of both variants records the same
seeds, its separate sessions are the lab's plain sessions row for row, its scores are the lab's session metrics, and
its IQMs, CIs and verdicts are the lab's statistics of the recorded scores; ``--rescore`` recomputes the same."""

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

    # the separate variant is the lab's plain session of each seed, row for row, and its scores the lab's metrics
    from bench.batched_seeds import spec_file
    from orchestrator.report.metrics import compute_random_baseline, session_metrics
    from orchestrator.session.loop import Session
    from orchestrator.spec.load import load_spec

    rand = compute_random_baseline("CartPole-v1", None)
    assert record["random_baseline"] == rand
    spec = load_spec(str(spec_file("ppo_cartpole")), "ppo_cartpole", OVERRIDES)
    for k, seed in enumerate((SEED, SEED + 1)):
        session = Session(spec, seed, session=k)
        session.run_rl()
        df = session.train_df
        session.close()
        rec = runs["separate"][k]
        for column, values in rec["curve"].items():
            assert values == [None if math.isnan(v) else v for v in df[column].tolist()], (seed, column)
        assert rec["scores"] == {"total_reward_ma": df["total_reward_ma"].iloc[-1],
                                 "strength": session_metrics(df, rand["mean"])[0]["strength"]}
    for r in runs["batched"]:
        assert r["scores"]["total_reward_ma"] == final_ma(r["curve"])

    # the verdicts are the lab's IQM and bootstrap CI of the recorded scores
    from orchestrator.report import stats

    for key in ("total_reward_ma", "strength"):
        v = record["verdict"][key]
        for variant in ("separate", "batched"):
            values = np.array([r["scores"][key] for r in runs[variant]])
            assert v[variant]["iqm"] == stats.iqm(values) and v[variant]["ci"] == list(stats.bootstrap_ci(values))
        assert v["iqm_diff"] == v["batched"]["iqm"] - v["separate"]["iqm"]
        low, high = v["iqm_diff_ci"]
        assert low <= v["iqm_diff"] <= high and v["agree"] == (low <= 0 <= high)
        assert v["ci_overlap"] == (v["batched"]["ci"][0] <= v["separate"]["ci"][1]
                                   and v["separate"]["ci"][0] <= v["batched"]["ci"][1])
    # the IQM curve's last point is the IQM of the final total_reward_ma (every session logs at the same frames)
    for variant in ("separate", "batched"):
        assert record["iqm_curves"][variant]["frame"][-1] == FRAMES
        assert record["iqm_curves"][variant]["iqm"][-1] == record["verdict"]["total_reward_ma"][variant]["iqm"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size < 100_000

    from bench.batched_learning import first_divergent_frame, main, table

    assert record["first_divergent_frame"] == {str(a["seed"]): first_divergent_frame(a, b)
                                               for a, b in zip(runs["separate"], runs["batched"])}
    a = {"curve": {"frame": [256, 512, 768], "epi": [3, 7, 9], "total_reward": [None, 20.0, 21.0],
                   "total_reward_ma": [None, 20.0, 20.5]}}
    b = json.loads(json.dumps(a))
    assert first_divergent_frame(a, b) is None
    b["curve"]["total_reward"][2] = 21.5
    assert first_divergent_frame(a, b) == 768
    b["curve"]["epi"][1] = 8
    assert first_divergent_frame(a, b) == 512

    v = record["verdict"]["total_reward_ma"]
    assert f"| `ppo_cartpole` | 2 | {FRAMES:,} | `total_reward_ma` | {v['batched']['iqm']:.1f} " in table([str(out)])

    # --rescore of the file (its analysis dropped) writes the same record again
    stripped = {k: v for k, v in json.loads(out.read_text()).items()
                if k not in ("verdict", "iqm_curves", "first_divergent_frame")}
    for r in stripped["sessions"]["separate"] + stripped["sessions"]["batched"]:
        del r["scores"]
    out.write_text(json.dumps(stripped))
    png.unlink()
    assert main(["--rescore", str(out), "--graph", str(png)]) == 0
    assert json.loads(out.read_text()) == record and png.exists()
