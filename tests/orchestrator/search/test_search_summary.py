"""A search's summary table reads every column from the same committed rows: a search stopped right after a session
committed its checkpoint, before the session directory's copy of train_df was written, shows that checkpoint's
``frame`` and ``total_reward_ma`` next to the ``strength`` the analysis computes from it (not ``frame`` 0 and NaN).
"""

import io
import json
import math
import re

import numpy as np
import pandas as pd
from lab_helpers import SPECS

from orchestrator.search.report import analyze, report_summary
from orchestrator.session.loop import TRAIN_COLUMNS
from orchestrator.spec.load import load_spec
from orchestrator.store import predir as predir_mod
from orchestrator.store.checkpoint import CheckpointStore

LR = "agent.net.optim_spec.lr"
SEARCH = ["meta.max_trial=2", "meta.max_session=1", "env.max_frame=4000", "meta.random_seed=3",
          'search={"agent.net.optim_spec.lr__loguniform": [1e-4, 1e-2]}']


def parquet(returns: list[float], frames: list[int]) -> bytes:
    """train_df bytes in the session's column order: ``returns`` at ``frames``, their moving average."""
    ma = pd.Series(returns).expanding().mean().tolist()
    df = pd.DataFrame({"frame": frames, "opt_step": [10 * i for i in range(len(frames))], "total_reward": returns,
                       "total_reward_ma": ma, "loss": 0.5, "lr": 1e-3, "entropy": 0.6})
    buf = io.BytesIO()
    df.reindex(columns=list(TRAIN_COLUMNS)).to_parquet(buf)
    return buf.getvalue()


def test_a_session_stopped_between_its_commit_and_its_export_has_one_frame_in_every_column(tmp_path, capsys):
    spec = load_spec(SPECS, "ppo_cartpole", SEARCH)
    predir = tmp_path / "data" / "ppo_cartpole_2026_01_02_030405"
    (predir / "info").mkdir(parents=True)
    (predir / "info/random_baseline.json").write_text(json.dumps({"env": "CartPole-v1", "max_t": None,
                                                                  "mean": 10.0}))
    committed = {0: ([20.0, 40.0, 60.0], [500, 1000, 1500]), 1: ([15.0, 25.0], [500, 1000])}
    for t, (returns, frames) in committed.items():
        predir_mod.save_specs(str(predir), {**spec, "meta": {**spec["meta"]}}, t, [100 + t])
        (predir / f"t{t}").mkdir(exist_ok=True)
        (predir / f"t{t}/trial.json").write_text(json.dumps({"trial": t, "values": {LR: 1e-3 * (t + 1)},
                                                             "status": "running"}))
        store = CheckpointStore(predir_mod.session_dir(str(predir), t, 0))
        store.commit(frames[-1], {"state.pt": b"x", "train_df.parquet": parquet(returns, frames)},
                     {"total_reward_ma": float(np.mean(returns))})
    # t0's copy was exported at its earlier commit (frame 1000); t1 was stopped before any export
    (predir / "t0/s0/train_df.parquet").write_bytes(parquet([20.0, 40.0], [500, 1000]))
    assert not (predir / "t1/s0/train_df.parquet").exists()

    df = analyze(str(predir), spec).set_index("trial")
    assert df.loc[0, "frame"] == 1500 and df.loc[0, "total_reward_ma"] == 40.0  # (20+40+60)/3, the committed row
    assert df.loc[1, "frame"] == 1000 and df.loc[1, "total_reward_ma"] == 20.0
    for t in (0, 1):  # strength: mean of (return - random baseline 10) over the same committed rows
        assert df.loc[t, "strength"] == np.mean(np.array(committed[t][0]) - 10.0)
        assert math.isfinite(df.loc[t, "strength"])
    trial_df = pd.read_parquet(predir / "info/trial_df.parquet")
    assert trial_df.groupby("trial")["frame"].max().to_dict() == {0: 1500, 1: 1000}

    report_summary(str(predir), spec, analyze(str(predir), spec), interrupted=True)
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if re.match(r"\s*t\d ", line)}
    assert rows["t0"][-2:] == ["40", "1500"] and rows["t1"][-2:] == ["20", "1000"]
