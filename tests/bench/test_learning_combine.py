"""``bench/learning.py --combine``: runs of one SLM-Lab entry made at different times pool into one record whose
score is the mean over all their sessions, and runs that are not of one entry, budget and seed set are refused."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_learning", REPO / "bench/learning.py")
learning = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(learning)


def part(seeds: list[int], ma: list[float], frames: int = 200_000, **extra) -> dict:
    """A record as ``run_entry`` writes it, for ``sac_cartpole`` with ``--sessions len(seeds)``."""
    return {"spec_file": "benchmark/sac/sac_cartpole.json", "spec_name": "sac_cartpole", "env": "CartPole-v1",
            "algorithm": "SAC", "published": 406.1, "platform": "linux", "cpus": 2,
            "overrides": {"sessions": len(seeds)}, "frames_per_session": [frames] * len(seeds),
            "session_seeds": seeds, "total_reward_ma_sessions": ma,
            "slm_total_reward_ma_sessions": [m - 10 for m in ma],
            "best_total_reward_ma_sessions": [500.0] * len(seeds), "load1_start": 1.0, "load1_end": 2.0,
            "wall_s": 100.0, "predir": f"run{seeds[0]}", "trial_graph": f"g{seeds[0]}.png", **extra}


def test_combine_is_the_mean_over_every_pooled_session(tmp_path):
    out = tmp_path / "learning.json"
    out.write_text(json.dumps({"a": part([7, 8], [500.0, 400.0]), "b": part([91, 92], [300.0, 200.0])}))
    assert learning.main(["--out", str(out), "--combine", "sac_cartpole", "a", "b"]) == 0
    rec = json.loads(out.read_text())["sac_cartpole"]
    assert rec["sessions"] == 4 and rec["session_seeds"] == [7, 8, 91, 92]
    assert rec["total_reward_ma"] == 350.0 and rec["total_reward_ma_min"] == 200.0
    assert rec["total_reward_ma_iqm"] == 350.0  # the mean of the middle two of 200, 300, 400, 500
    assert 200.0 <= rec["total_reward_ma_ci"][0] < 350.0 < rec["total_reward_ma_ci"][1] <= 500.0
    assert rec["slm_total_reward_ma"] == 340.0
    assert rec["met"] is False and rec["overrides"] == {} and rec["combined_from"] == ["a", "b"]
    assert rec["wall_s"] == 200.0 and rec["fps"] is None


@pytest.mark.parametrize("other, why", [
    (part([8, 9], [500.0, 500.0]), "share a session seed"),
    (part([91, 92], [500.0, 500.0], frames=100_000), "not a run of"),
    (part([91, 92], [500.0, 500.0], spec_name="sac_lunar"), "not a run of"),
    ({**part([91, 92], [500.0, 500.0]), "session_seeds": None}, "no recorded session seeds"),
])
def test_combine_refuses_parts_of_another_entry_budget_or_seed(tmp_path, other, why):
    data = {"a": part([7, 8], [500.0, 400.0]), "b": other}
    with pytest.raises(SystemExit, match=why):
        learning.combine(data, ["a", "b"])


def test_file_stem_has_no_link_breaking_characters():
    assert learning.file_stem("sac_pendulum@sessions=1#2") == "sac_pendulum_sessions1_2"
    assert learning.file_stem("ppo_pendulum") == "ppo_pendulum"


def test_recorded_spec_file_names_no_machine_path(tmp_path):
    slm = tmp_path / "cache" / "slm_lab_specs" / "v5.3.0" / "benchmark" / "sac" / "sac_pendulum.json"
    assert learning.recorded_spec_file(slm) == "benchmark/sac/sac_pendulum.json"
    assert learning.recorded_spec_file(REPO / "specs" / "benchmark" / "atari.json") == "specs/benchmark/atari.json"
    assert learning.recorded_spec_file(tmp_path / "mine.json") == str(tmp_path / "mine.json")


def test_combine_refuses_parts_with_other_set_overrides(tmp_path):
    out = tmp_path / "learning.json"
    a = part([7], [500.0])
    b = part([8], [400.0])
    b["overrides"]["set"] = ["env=ALE/Pong-v5"]
    out.write_text(json.dumps({"a": a, "b": b}))
    with pytest.raises(SystemExit, match="not a run of"):
        learning.main(["--out", str(out), "--combine", "k", "a", "b"])


def test_combine_pools_parts_that_differ_only_in_their_seed(tmp_path):
    """Two 2-session runs of one spec, one with ``--set meta.random_seed=3``: one record of 4 sessions whose
    overrides keep the shared ``--set`` and drop the seed."""
    a = part([1, 2], [1100.0, 1400.0])
    b = part([3, 4], [900.0, 1200.0])
    a["overrides"]["set"] = ["env.vectorization=envpool"]
    b["overrides"]["set"] = ["env.vectorization=envpool", "meta.random_seed=3"]
    rec = learning.combine({"a": a, "b": b}, ["a", "b"])
    assert rec["session_seeds"] == [1, 2, 3, 4] and rec["total_reward_ma"] == 1150.0
    assert rec["overrides"] == {"set": ["env.vectorization=envpool"]}
    b["overrides"]["set"] = ["env.vectorization=sync", "meta.random_seed=3"]
    with pytest.raises(SystemExit, match="not a run of"):
        learning.combine({"a": a, "b": b}, ["a", "b"])


def test_set_overrides_reach_lab_and_the_key(tmp_path, monkeypatch):
    seen = {}

    def fake_run_entry(spec_file, name, data_dir, max_frame, sessions, log_path, resume, extra_sets):
        seen.update(name=name, sets=extra_sets, log=log_path.name)
        return {"spec_name": name, "sessions": 1, "total_reward_ma": -20.0, "slm_total_reward_ma": -20.5,
                "total_reward_ma_sessions": [-20.0], "total_reward_ma_iqm": -20.0,
                "total_reward_ma_ci": [-20.0, -20.0], "published": None, "met": None, "wall_s": 1.0, "fps": 1.0,
                "trial_graph": str(tmp_path / "g.png")}
    monkeypatch.setattr(learning, "run_entry", fake_run_entry)
    spec = tmp_path / "atari.json"
    spec.write_text("{}")
    out = tmp_path / "learning.json"
    assert learning.main([str(spec), "ppo_atari", "--set", "env=ALE/Pong-v5", "--max-frame", "1000",
                          "--data-dir", str(tmp_path), "--out", str(out)]) == 0
    assert seen["sets"] == ("env=ALE/Pong-v5",)
    key = "ppo_atari@env=ALE/Pong-v5@max_frame=1000"
    assert list(json.loads(out.read_text())) == [key]
    assert seen["log"] == learning.file_stem(key) + ".log" and "/" not in seen["log"]


def test_set_without_equals_exits_2(tmp_path, capsys):
    spec = tmp_path / "atari.json"
    spec.write_text("{}")
    with pytest.raises(SystemExit) as exc:
        learning.main([str(spec), "ppo_atari", "--set", "env", "--out", str(tmp_path / "o.json")])
    assert exc.value.code == 2 and "--set expects KEY=VALUE" in capsys.readouterr().err


def test_graph_draws_one_curve_per_record_over_all_its_parts_sessions(tmp_path, monkeypatch):
    """``--graph``: a combined record's curve pools its parts' sessions; the band is the per-frame IQM and CI."""
    from orchestrator.report import compare

    finals = {"r1": [100.0, 200.0], "r2": [300.0, 400.0], "r3": [50.0, 60.0]}
    frames = [1000, 2000]

    def fake_trial_dfs(predir, only):
        assert only == 0
        name = Path(predir).name
        return {0: {s: pd.DataFrame({"frame": frames, "total_reward_ma": [0.0, v]})
                    for s, v in enumerate(finals[name])}}
    monkeypatch.setattr(compare, "trial_dfs", fake_trial_dfs)
    data = {"pooled": {"env": "Hopper-v5", "predir": ["r1", "r2"]}, "one": {"env": "Hopper-v5", "predir": "r3"}}
    out = tmp_path / "img" / "g.png"
    curves = learning.graph(data, ["sync=pooled", "envpool=one"], tmp_path, out)
    assert [(c.label, c.sessions) for c in curves] == [("sync", 4), ("envpool", 2)]
    assert curves[0].band.loc[2000, "iqm"] == 250.0 and curves[1].band.loc[2000, "iqm"] == 55.0
    assert curves[1].band.loc[2000, "low"] >= 50.0 and curves[1].band.loc[2000, "high"] <= 60.0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(SystemExit, match="LABEL=KEY"):
        learning.graph(data, ["pooled"], tmp_path, out)
    with pytest.raises(SystemExit, match="no record"):
        learning.graph(data, ["x=missing"], tmp_path, out)
