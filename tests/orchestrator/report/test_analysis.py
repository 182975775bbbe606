"""Analysis: SLM-Lab metrics against hand-computed values, the cached random baseline, graphs after
train / train@latest / lab analyze with resume markers, and ``lab ls``."""

import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest
from lab_helpers import only_predir, overrides, run_cli

from orchestrator.report import analysis
from orchestrator.report import graphs as graphs_mod
from orchestrator.report import metrics as metrics_mod
from orchestrator.report.graphs import PNG_SIGNATURE
from orchestrator.report.metrics import session_metrics, trial_metrics
from orchestrator.spec.load import load_spec
from orchestrator.store import predir as predir_mod
from orchestrator.store.checkpoint import CheckpointStore

SPECS = str(Path(__file__).resolve().parents[3] / "specs/benchmark/cartpole.json")
TINY = ["meta.max_session=1", "meta.log_frequency=400", "meta.random_seed=3"]


def train_df(returns, frames=(1000, 2000, 3000, 4000), opt_steps=(0, 10, 20, 30)) -> pd.DataFrame:
    return pd.DataFrame({"frame": frames, "opt_step": opt_steps, "total_reward": returns})


# ---------------------------------------------------------------- metrics, hand-computed

def test_session_metrics_match_hand_computed_values():
    # R = [10, 30, 20, 50], R_rand = 10 -> str = [0, 20, 10, 40]
    scalar, local = session_metrics(train_df([10.0, 30.0, 20.0, 50.0]), rand_return=10.0)
    assert scalar["final_return_ma"] == pytest.approx(27.5)               # (10+30+20+50)/4
    assert scalar["strength"] == pytest.approx(17.5)                      # (0+20+10+40)/4
    assert scalar["max_strength"] == 40.0 and scalar["final_strength"] == 40.0
    # (0/1000 + 20/2000 + 10/3000 + 40/4000) / 70 = (7/300) / 70
    assert scalar["sample_efficiency"] == pytest.approx(1 / 3000)
    # opt_step 0: 0/0 dropped; (20/10 + 10/20 + 40/30) / 70 = (23/6) / 70
    assert scalar["training_efficiency"] == pytest.approx(23 / 420)
    # drops min(str_{i+1} - str_i, 0) = [0, -10, 0]; sum of str_0..str_2 = 30 -> 1 - 10/30
    assert scalar["stability"] == pytest.approx(2 / 3)
    assert local["strength"].tolist() == [0.0, 20.0, 10.0, 40.0]
    assert local.index.tolist() == [1000, 2000, 3000, 4000]


def test_rows_without_a_return_are_dropped_and_final_return_ma_uses_100_rows():
    with_nan = pd.concat([train_df([math.nan], (500,), (0,)), train_df([10.0, 30.0, 20.0, 50.0])])
    assert session_metrics(with_nan, 10.0)[0] == session_metrics(train_df([10.0, 30.0, 20.0, 50.0]), 10.0)[0]
    n = 150
    df = train_df([0.0] * 50 + [1.0] * 100, range(100, 100 * n + 1, 100), range(1, n + 1))
    scalar, _ = session_metrics(df, 0.0)
    assert scalar["final_return_ma"] == 1.0                     # the last 100 rows only
    assert scalar["strength"] == pytest.approx(100 / 150)       # all rows
    with pytest.raises(ValueError, match="no log row"):
        session_metrics(train_df([math.nan] * 4), 0.0)


def test_trial_metrics_mean_of_sessions_and_consistency():
    s1 = session_metrics(train_df([10.0, 30.0, 20.0, 50.0]), 10.0)  # str [0, 20, 10, 40]
    s2 = session_metrics(train_df([20.0, 30.0, 40.0, 50.0]), 10.0)  # str [10, 20, 30, 40]
    assert s2[0]["stability"] == 1.0 and s2[0]["sample_efficiency"] == pytest.approx(0.04 / 100)
    trial = trial_metrics([s1, s2])
    assert trial["strength"] == pytest.approx((17.5 + 25.0) / 2)
    assert trial["stability"] == pytest.approx((2 / 3 + 1.0) / 2)
    assert trial["sample_efficiency"] == pytest.approx((1 / 3000 + 0.0004) / 2)
    # per frame: mean_j str = [5, 20, 20, 40] (sum 85), std_j (ddof 1) = [5*sqrt2, 0, 10*sqrt2, 0]
    assert trial["consistency"] == pytest.approx(1 - 2 * 15 * math.sqrt(2) / 85)
    assert math.isnan(trial_metrics([s1])["consistency"])  # needs two sessions
    assert analysis.json_safe({"consistency": math.nan, "strength": 1.5}) == {"consistency": None,
                                                                                "strength": 1.5}


def test_stability_with_zero_strength_is_undefined():
    scalar, _ = session_metrics(train_df([5.0, 5.0, 5.0, 5.0]), 5.0)
    assert scalar["strength"] == 0.0 and math.isnan(scalar["stability"])


def test_random_baseline_is_computed_once_and_cached(tmp_path, monkeypatch):
    first = metrics_mod.random_baseline("CartPole-v1", None, str(tmp_path))
    assert 15 < first["mean"] < 35 and first["episodes"] == 100  # a random CartPole policy lasts ~22 steps
    assert json.loads((tmp_path / "random_baseline/CartPole-v1.json").read_text()) == first

    def fail(*args, **kwargs):
        raise AssertionError("recomputed although cached")

    monkeypatch.setattr(metrics_mod, "compute_random_baseline", fail)
    assert metrics_mod.random_baseline("CartPole-v1", None, str(tmp_path)) == first
    assert metrics_mod.compute_random_baseline.__name__ == "fail"


def test_random_baseline_stops_starting_episodes_after_its_step_budget():
    """No episode starts once ``max_steps`` env steps have run (the one under way finishes, at least
    one runs): the capped baseline is the uncapped one over its first episodes."""
    import gymnasium as gym
    import numpy as np

    env = gym.make("CartPole-v1")
    env.action_space.seed(0)
    returns, lengths = [], []
    for i in range(5):  # the same seeded random episodes, by hand
        env.reset(seed=i)
        total, n, done = 0.0, 0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            total, n, done = total + reward, n + 1, terminated or truncated
        returns.append(total)
        lengths.append(n)
    env.close()
    budget = lengths[0] + lengths[1] + 1  # reached during the third episode, which still finishes
    capped = metrics_mod.compute_random_baseline("CartPole-v1", None, episodes=5, max_steps=budget)
    assert capped["episodes"] == 3
    assert capped["mean"] == pytest.approx(np.mean(returns[:3]))
    assert capped["std"] == pytest.approx(np.std(returns[:3]))
    one = metrics_mod.compute_random_baseline("CartPole-v1", None, episodes=5, max_steps=1)
    assert (one["episodes"], one["mean"]) == (1, returns[0])
    full = metrics_mod.compute_random_baseline("CartPole-v1", None, episodes=5, max_steps=10**9)
    assert (full["episodes"], full["mean"]) == (5, pytest.approx(np.mean(returns)))


def test_resume_and_restart_marks_from_run_json():
    run = {"resumes": [{"from_frames": {"t0_s0": 1600, "t0_s1": 0}}, {"from_frames": {"t0_s0": 3200}}],
           "sessions": {"t0_s0": {"restarts": [{"frame_restored": 800}, {"frame_restored": 0}]}}}
    assert graphs_mod.marks(run, "t0_s0") == [(800, "restart"), (1600, "resume"), (3200, "resume")]
    assert graphs_mod.marks(run, "t0_s1") == [] and graphs_mod.marks({}, "t0_s0") == []


def test_one_marker_per_resume_across_sessions():
    # resume 1: the sessions stopped at different frames; resume 2 only moved t0_s1; resume 3 is a
    # fresh start (frame 0 everywhere) and resume 4 repeats resume 2's frames (a kill before any new
    # checkpoint): 2 and 4 share one label
    run = {"resumes": [{"from_frames": {"t0_s0": 1600, "t0_s1": 2400}}, {"from_frames": {"t0_s1": 4000}},
                       {"from_frames": {"t0_s0": 0, "t0_s1": 0}}, {"from_frames": {"t0_s1": 4000}}],
           "sessions": {"t0_s0": {"restarts": [{"frame_restored": 800}]}}}
    marks = analysis.markers(run, ["t0_s0", "t0_s1"])
    assert [(m.frames, m.label) for m in marks] == [((800,), "restart"), ((1600, 2400), "resume 1"),
                                                    ((4000,), "resume 2,4")]
    df = pd.DataFrame({"frame": range(400, 4801, 400), "total_reward_ma": 20.0})
    fig = graphs_mod.trial_figure({0: df, 1: df}, marks, "t0", rand_return=10.0)
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.texts] == ["restart", "resume 1", "resume 2,4"]
    assert all(t.get_rotation() == 0 for t in ax.texts)
    assert len({t.xy[1] for t in ax.texts}) == 3  # stepped heights: neighbours never overlap
    vlines = [line for line in ax.get_lines() if line.get_xdata()[0] == line.get_xdata()[-1]]
    assert sorted(line.get_xdata()[0] for line in vlines) == [800, 1600, 2400, 4000]


def test_trial_graph_draws_the_reward_threshold_and_no_band_for_one_session():
    from orchestrator.report import compare

    df = pd.DataFrame({"frame": range(400, 4001, 400), "total_reward_ma": range(10, 101, 10)})
    (ax,) = graphs_mod.trial_figure({0: df}, [], "t0", rand_return=22.0, threshold=475.0).axes
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["total_reward_ma (1 session)", "random policy",
                                                                    "reward_threshold 475"]
    assert not ax.collections  # no band drawn
    hlines = [line for line in ax.get_lines() if line.get_ydata()[0] == line.get_ydata()[-1]]
    assert sorted(line.get_ydata()[0] for line in hlines) == [22.0, 475.0]
    two = {0: df, 1: df.assign(total_reward_ma=df["total_reward_ma"] + 5)}
    (ax,) = graphs_mod.trial_figure(two, [], "t0", threshold=475.0).axes
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [  # below 4 sessions the IQM is the mean
        "mean = IQM of 2 sessions,\nband: 95% bootstrap CI", "reward_threshold 475"]
    html = compare.trial_traces({0: df}, "t0", 22.0, [], 475.0)
    assert [t["name"] for t in html["data"]] == ["s0"]
    assert [(n["text"], n["y"]) for n in html["layout"]["annotations"]] == [("random policy", 22.0),
                                                                             ("reward_threshold 475", 475.0)]
    assert analysis.reward_threshold("CartPole-v1") == 475.0


def test_constant_lr_panel_is_not_scaled_to_float_noise():
    frames = list(range(400, 4001, 400))
    noise = [0.0, 1e-19, -1e-19, 0.0, 2e-19, 0.0, -1e-19, 0.0, 1e-19, 0.0]
    df = pd.DataFrame({"frame": frames, "total_reward": 20.0, "total_reward_ma": 20.0,
                       "loss": [1.0 / (i + 1) for i in range(10)], "lr": [3e-4 + n for n in noise],
                       "explore_var": 0.0, "entropy": float("nan")})
    fig = graphs_mod.session_figure(df, [], "t0_s0")
    ret, loss, lr, explore_var = fig.axes  # entropy (all NaN) is left out
    assert lr.get_ylim() == pytest.approx((1.5e-4, 4.5e-4))
    assert explore_var.get_ylim() == (-1.0, 1.0)
    low, high = loss.get_ylim()  # a varying panel keeps matplotlib's autoscale around its data
    assert low < 0.1 < 1.0 < high < 1.1
    assert graphs_mod.flat_ylim(pd.Series([2.0, 2.0])) == (1.0, 3.0)
    assert graphs_mod.flat_ylim(pd.Series([1.0, 1.1])) is None


# ---------------------------------------------------------------- graphs of real runs

def assert_png(path: Path) -> bytes:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 1000, f"{path} is not a PNG"
    return data


def test_graphs_after_train_resume_and_lab_analyze(ray_local, tmp_path, capsys):
    data = tmp_path / "data"
    assert run_cli(SPECS, "ppo_cartpole", "train", "--quiet", "--data-dir", str(data),
                   *overrides(TINY + ["env.max_frame=1600"])) == 0
    predir = only_predir(data)
    session_graph = predir / "graph/ppo_cartpole_t0_s0_session_graph.png"
    trial_graph = predir / "graph/ppo_cartpole_t0_trial_graph.png"
    first = assert_png(session_graph)
    assert_png(trial_graph)
    metrics = json.loads((predir / "t0/s0/session_metrics.json").read_text())
    assert metrics["frame"] == 1600 and set(metrics["train"]) == set(metrics_mod.SESSION_METRICS)
    assert set(json.loads((predir / "info/t0_trial_metrics.json").read_text())) >= set(analysis.TRIAL_METRICS)

    assert run_cli(SPECS, "ppo_cartpole", "train@latest", "--quiet", "--data-dir", str(data),
                   *overrides(TINY + ["env.max_frame=3200"])) == 0
    assert assert_png(session_graph) != first, "the resumed run's graph was not redrawn"
    assert_png(trial_graph)
    run = json.loads((predir / "run.json").read_text())
    assert graphs_mod.marks(run, "t0_s0") == [(1600, "resume")]
    resumed = json.loads((predir / "t0/s0/session_metrics.json").read_text())
    assert resumed["frame"] == 3200
    trial_resumed = json.loads((predir / "info/t0_trial_metrics.json").read_text())

    shutil.rmtree(predir / "graph")
    (predir / "t0/s0/session_metrics.json").unlink()
    (predir / "info/t0_trial_metrics.json").unlink()
    capsys.readouterr()
    assert run_cli("analyze", str(predir)) == 0
    out = capsys.readouterr().out
    assert assert_png(session_graph) and assert_png(trial_graph)
    assert json.loads((predir / "t0/s0/session_metrics.json").read_text()) == resumed
    assert json.loads((predir / "info/t0_trial_metrics.json").read_text()) == trial_resumed
    # the same final figures as the end-of-run summary, then the other metrics named for what they are
    lines = out.splitlines()
    assert lines[0] == f"analysis: {predir}"
    assert lines[1:] == [*analysis.summary_lines(str(predir), analysis.analyze_predir(str(predir))),
                         *(line for line in lines if " metrics: " in line)]
    assert f"  t0_s0: frame=3200 total_reward_ma={resumed['total_reward_ma']:.4g} " in out
    assert (f"  t0 metrics: total_reward_mean_last_100_rows={trial_resumed['final_return_ma']:.4g} "
            f"strength={trial_resumed['strength']:.4g} ") in out
    assert "final_return_ma" not in out and f"  graph: {session_graph}" in lines

    assert run_cli("ls", "--data-dir", str(data)) == 0
    out = capsys.readouterr().out
    assert predir.name in out and "spec=ppo_cartpole" in out and "max_frame=3200" in out
    assert "resumable=no (complete" in out
    assert " done " in out and "3200/3200" in out


def test_analyze_rejects_a_non_run(tmp_path, capsys):
    assert run_cli("analyze", str(tmp_path / "nothing")) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "notarun").mkdir()
    assert run_cli("analyze", str(tmp_path / "notarun")) == 2
    assert "Traceback" not in capsys.readouterr().err


# ---------------------------------------------------------------- lab ls on a crafted run

def test_ls_status_frames_best_and_resumability(tmp_path, capsys):
    spec = load_spec(SPECS, "ppo_cartpole", ["meta.max_session=2", "env.max_frame=1600",
                                             "meta.random_seed=1"])
    predir = str(tmp_path / "data" / "ppo_cartpole_2026_01_02_030405")
    predir_mod.save_specs(predir, spec, 0, [1, 2])
    (tmp_path / "data/ppo_cartpole_2026_01_02_030405/run.json").write_text(json.dumps(
        {"sessions": {"t0_s0": {"status": "interrupted", "frame": 800},
                      "t0_s1": {"status": "failed", "frame": 0}}, "resumes": []}))
    store0 = CheckpointStore(predir_mod.session_dir(predir, 0, 0))
    store0.commit(800, {"state.pt": b"x"}, {"total_reward_ma": 12.5})
    assert run_cli("ls", "--data-dir", str(tmp_path / "data")) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("ppo_cartpole_2026_01_02_030405  spec=ppo_cartpole  max_frame=1600  "
                               "best=12.50")
    assert lines[0].endswith("resumable=with --allow-fresh")
    assert lines[1].split() == ["t0_s0", "interrupted", "800/1600", "best", "12.50"]
    assert lines[2].split() == ["t0_s1", "failed", "0/1600", "best", "-"]

    store1 = CheckpointStore(predir_mod.session_dir(predir, 0, 1))
    store1.commit(400, {"state.pt": b"y"}, {"total_reward_ma": 30.0})
    assert run_cli("ls", "--data-dir", str(tmp_path / "data")) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "best=30.00" in lines[0] and lines[0].endswith("resumable=yes")

    run = json.loads((tmp_path / "data/ppo_cartpole_2026_01_02_030405/run.json").read_text())
    run["sessions"]["t0_s1"]["status"] = "done"  # done at 400 of 1600: a PBT generation's end, not the run's
    (tmp_path / "data/ppo_cartpole_2026_01_02_030405/run.json").write_text(json.dumps(run))
    assert run_cli("ls", "--data-dir", str(tmp_path / "data")) == 0
    assert capsys.readouterr().out.splitlines()[2].split() == ["t0_s1", "paused", "400/1600", "best", "30.00"]
    assert run_cli("ls", "--data-dir", str(tmp_path / "empty")) == 0
    assert "no runs in" in capsys.readouterr().out


def dev_run(data: Path, name: str) -> Path:
    """A ``dev`` run's predir ``data/name`` (no checkpoints or run.json): one session's train_df.parquet of four
    episodes and a recorded random baseline of 10."""
    from orchestrator.session.loop import TRAIN_COLUMNS

    spec = load_spec(SPECS, "ppo_cartpole", ["meta.max_session=1", "env.max_frame=4000"])
    predir = data / name
    predir_mod.save_specs(str(predir), spec, 0, [1])
    df = train_df([10.0, 30.0, 20.0, 50.0]).assign(total_reward_ma=[10.0, 20.0, 20.0, 27.5], loss=0.5,
                                                   lr=1e-3, explore_var=float("nan"), entropy=0.6)
    (predir / "t0/s0").mkdir(parents=True)
    df.reindex(columns=list(TRAIN_COLUMNS)).to_parquet(predir / "t0/s0/train_df.parquet")
    (predir / "info").mkdir()
    (predir / "info/random_baseline.json").write_text(json.dumps({"env": "CartPole-v1", "max_t": None,
                                                                  "mean": 10.0}))
    return predir


def test_analyze_a_dev_run_without_checkpoints(tmp_path):
    """A ``dev`` run has no checkpoints or run.json: its train_df.parquet is analyzed."""
    predir = dev_run(tmp_path / "data", "ppo_cartpole_2026_01_02_030405")
    out = analysis.analyze_predir(str(predir), cache_dir=str(tmp_path / "cache"))
    assert out["sessions"]["t0_s0"]["train"]["strength"] == pytest.approx(17.5)  # the run's recorded baseline
    assert out["trials"]["t0"]["consistency"] is None and out["trials"]["t0"]["sessions"] == 1
    assert not (tmp_path / "cache").exists(), "the run's recorded baseline was not reused"
    for name in ("ppo_cartpole_t0_s0_session_graph.png", "ppo_cartpole_t0_trial_graph.png"):
        assert_png(predir / "graph" / name)


def test_html_graphs_of_every_run_share_one_plotly_js_per_data_dir(tmp_path):
    """Two runs analyzed in one data dir: one ``.assets/plotly-{version}.min.js`` (plotly's own file), none in a
    run's graph/, and each HTML page loads it by a relative path that resolves to it."""
    from importlib.metadata import version

    from plotly.offline import get_plotlyjs

    data = tmp_path / "data"
    for name in ("ppo_cartpole_2026_01_02_030405", "ppo_cartpole_2026_01_02_030406"):
        analysis.analyze_predir(str(dev_run(data, name)), cache_dir=str(tmp_path / "cache"))
    js = data / ".assets" / f"plotly-{version('plotly')}.min.js"
    assert [p.relative_to(data) for p in data.rglob("*.js")] == [js.relative_to(data)]
    assert js.read_text() == get_plotlyjs()
    for page in data.glob("*/graph/*.html"):
        src = page.read_text().split('<script charset="utf-8" src="', 1)[1].split('"', 1)[0]
        assert src == f"../../.assets/{js.name}" and (page.parent / src).resolve() == js.resolve()
    assert len(list(data.glob("*/graph/*.html"))) == 2


def test_a_run_with_no_finished_episode_gets_its_logged_graphs_and_says_why(tmp_path, capsys):
    """No episode ended (returns all NaN, losses logged): the session graph of what was logged is drawn, no metrics,
    and the summary, ``lab analyze`` and ``lab ls`` name the frames, the env's episode limit and the sub-envs."""
    from orchestrator.session.loop import TRAIN_COLUMNS

    spec = load_spec(SPECS, "ppo_cartpole", ["meta.max_session=1", "env.max_frame=4000", "env.num_envs=8"])
    predir = tmp_path / "data" / "ppo_cartpole_2026_01_02_030405"
    predir_mod.save_specs(str(predir), spec, 0, [1])
    nan = float("nan")
    df = train_df([nan, nan, nan, nan]).assign(total_reward_ma=nan, loss=[0.9, 0.7, 0.6, 0.5], lr=1e-3,
                                               entropy=[0.69, 0.68, 0.66, 0.65])
    (predir / "t0/s0").mkdir(parents=True)
    df.reindex(columns=list(TRAIN_COLUMNS)).to_parquet(predir / "t0/s0/train_df.parquet")
    (predir / "run.json").write_text(json.dumps({"mode": "dev", "sessions": {}, "created": "2026-01-02T03:04:05"}))
    note = ("no episode finished in 4000 frames (episodes of CartPole-v1 last up to 500 steps; "
            "with 8 sub-envs the first ends after about 4000 frames)")

    out = analysis.analyze_predir(str(predir), cache_dir=str(tmp_path / "cache"))
    assert out["sessions"] == {} and out["trials"] == {} and out["no_episode"] == {"t0_s0": 4000}
    assert_png(predir / "graph" / "ppo_cartpole_t0_s0_session_graph.png")
    assert not (predir / "t0/s0/session_metrics.json").exists()
    assert analysis.summary_lines(str(predir), out)[0] == f"  t0_s0: {note}"

    assert run_cli("analyze", str(predir)) == 0
    printed = capsys.readouterr().out
    assert f"t0_s0: {note}" in printed and "session_graph.png" in printed and "nothing to analyze" not in printed
    assert run_cli("ls", "--data-dir", str(tmp_path / "data")) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "best=-" in lines[0] and lines[1] == f"  {note}"


def test_ls_lists_runs_oldest_first_named_and_timestamped_alike(tmp_path, capsys):
    data = tmp_path / "data"
    created = {"zz-named-early": "2026-01-01T00:00:00+00:00", "ppo_cartpole_2026_01_02_030405": None,
               "aa-named-late": "2026-01-03T00:00:00+00:00"}
    for name, when in created.items():
        dev_run(data, name)
        if when:
            (data / name / "run.json").write_text(json.dumps({"mode": "dev", "sessions": {}, "created": when}))
    assert run_cli("ls", "--data-dir", str(data)) == 0
    headers = [x.split()[0] for x in capsys.readouterr().out.splitlines() if not x.startswith(" ")]
    assert headers == ["zz-named-early", "ppo_cartpole_2026_01_02_030405", "aa-named-late"]
