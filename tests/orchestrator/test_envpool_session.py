"""Sessions on ``env.vectorization: envpool``: ``dev`` on CartPole, a MuJoCo env and Atari Pong gives the gymnasium
path's train_df columns and clock; a 2-session ``train`` killed by SIGKILL resumes with ``train@latest`` to a
continuous train_df, its checkpoints recording ``exact: false`` with EnvPool's reason (the env is reset on resume and
the PPO rollout's last stored step truncated); a Playground train in which no episode ends draws what it logged and
says why."""

import dataclasses
import os

import numpy as np
import pandas as pd
import pytest
from lab_helpers import REPO, assert_continuous, kill_driver_when, only_predir, overrides, run_cli, start_driver

from envs.envpool_vec import STATE_NOT_SAVED
from orchestrator.session.loop import Session
from orchestrator.spec.load import load_spec
from orchestrator.store import storage

BENCH = REPO / "specs" / "benchmark"


@pytest.mark.parametrize("spec_file, name, items", [
    ("cartpole.json", "ppo_cartpole", ["env.max_frame=1024", "meta.log_frequency=256"]),
    ("mujoco.json", "ppo_halfcheetah", ["env.max_frame=256", "env.num_envs=2", "agent.algorithm.time_horizon=64",
                                        "meta.log_frequency=64"]),
    ("atari.json", "ppo_atari", ["env.max_frame=256", "env.num_envs=4", "agent.algorithm.time_horizon=32",
                                 "meta.log_frequency=64", "meta.resources.num_cpus=2"]),
])
def test_envpool_dev_session(tmp_path, spec_file, name, items):
    items = items + ["env.vectorization=envpool"]
    assert run_cli(str(BENCH / spec_file), name, "dev", "--data-dir", str(tmp_path / "data"), *overrides(items)) == 0
    predir = only_predir(tmp_path / "data")
    df = pd.read_parquet(predir / "t0/s0/train_df.parquet")
    spec = load_spec(str(BENCH / spec_file), name, items)
    log, max_frame = spec["meta"]["log_frequency"], spec["env"]["max_frame"]
    assert_continuous(df, log, max_frame)
    gym_spec = load_spec(str(BENCH / spec_file), name, items[:-1] + ["env.vectorization=sync"])
    gym_session = Session(gym_spec, 0)
    assert list(df.columns) == list(gym_session.train_columns)  # the same train_df as the gymnasium path
    gym_session.close()
    assert (df["opt_step"].iloc[-1] > 0) and np.isfinite(df["loss"].iloc[-1])
    if name == "ppo_cartpole":  # whole CartPole episodes: true returns, each at least 8 steps long
        assert df["epi"].iloc[-1] > 0 and (df["total_reward"].dropna() >= 8).all()


ITEMS = ["meta.max_session=2", "meta.log_frequency=256", "meta.checkpoint_frequency=256", "meta.random_seed=5",
         "env.max_frame=3072", "env.vectorization=envpool"]


def test_envpool_train_sigkill_driver_then_resume_latest(ray_local, tmp_path):
    specs = str(REPO / "specs" / "benchmark" / "cartpole.json")
    driver = start_driver([specs, "ppo_cartpole", "train", *overrides(ITEMS)], tmp_path)
    kill_driver_when(driver, lambda: {m.parents[2].name for m in tmp_path.glob("data/*/t0/s*/ckpt/0*/MANIFEST.json")}
                     == {"s0", "s1"}, 180, "a committed checkpoint in both sessions")
    predir = only_predir(tmp_path / "data")
    killed_at = {s: max(int(p.name) for p in (predir / f"t0/s{s}/ckpt").glob("0*")) for s in (0, 1)}
    assert min(killed_at.values()) < 3072, "the driver was killed after the run finished"
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert run_cli(specs, "ppo_cartpole", "train@latest", *overrides(ITEMS)) == 0
    finally:
        os.chdir(cwd)
    run = storage.read_json(str(predir / "run.json"))
    (resume,) = run["resumes"]
    assert resume["from_frames"] == {f"t0_s{s}": killed_at[s] for s in (0, 1) if killed_at[s] < 3072}
    for s in (0, 1):
        assert run["sessions"][f"t0_s{s}"]["status"] == "done"
        df = pd.read_parquet(predir / f"t0/s{s}/train_df.parquet")
        assert_continuous(df, 256, 3072)
        assert df["total_reward"].notna().all()
        for ckpt in (predir / f"t0/s{s}/ckpt").glob("0*"):
            meta = storage.read_json(str(ckpt / "MANIFEST.json"))["meta"]
            assert meta["exact"] is False and STATE_NOT_SAVED in meta["exact_reason"], ckpt.name
            assert not (ckpt / "env_state.json").exists() and not (ckpt / "env.pkl").exists()


ENV_BYTES = """
import dataclasses, json, warnings
from orchestrator.spec import preflight
from orchestrator.spec.load import load_spec
warnings.simplefilter("ignore")
spec = load_spec({specs!r}, "ppo_cartpole", ["env.name=playground/CartpoleBalance", "env.num_envs=2048",
                                              "env.max_frame=100000"])
print(json.dumps(preflight.check_env(spec["env"]).env_bytes))
"""


def test_preflight_counts_envpool_sub_envs_c_memory():
    """EnvPool allocates its sub-envs in C++ (about 13 MB each for playground/CartpoleBalance), which tracemalloc
    does not see; preflight measures them (the resident memory they add, in a fresh process as the spec check runs
    it: this test process reuses pages freed by earlier tests), so SLM-Lab's 2048 sub-envs are refused where they
    cannot fit."""
    import subprocess
    import sys
    import warnings

    from orchestrator.errors import SpecError
    from orchestrator.spec import preflight

    out = subprocess.run([sys.executable, "-c", ENV_BYTES.format(specs=str(BENCH / "cartpole.json"))], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    env_bytes = int(out.stdout.strip().splitlines()[-1])
    assert env_bytes > 5_000_000
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec = load_spec(str(BENCH / "cartpole.json"), "ppo_cartpole",
                         ["env.name=playground/CartpoleBalance", "env.num_envs=2048", "env.max_frame=100000"])
        shape = dataclasses.replace(preflight.check_env(spec["env"]), env_bytes=env_bytes)
    with pytest.raises(SpecError, match=r"env.num_envs: 2048 sub-envs x \d+ bytes needs"):
        preflight.check_memory(spec, shape, available=8 * 2**30)
    preflight.check_memory({**spec, "env": {**spec["env"], "num_envs": 64}}, shape, available=8 * 2**30)


def test_a_playground_train_with_no_finished_episode_draws_what_it_logged_and_says_why(ray_local, tmp_path, capsys):
    """``train --name`` on playground/CartpoleBalance (1000-step episodes) with 8 sub-envs for 2048 frames: no episode
    ends, yet the session graph of what was logged is drawn, and the summary, ``lab analyze`` and ``lab ls`` say why
    (frames, the env's step limit, the sub-envs)."""
    data = tmp_path / "data"
    items = ["env.name=playground/CartpoleBalance", "env.vectorization=envpool", "env.num_envs=8",
             "env.max_frame=2048", "meta.log_frequency=512", "meta.checkpoint_frequency=1024", "meta.max_session=1"]
    note = ("no episode finished in 2048 frames (episodes of playground/CartpoleBalance last up to 1000 steps; "
            "with 8 sub-envs the first ends after about 8000 frames)")
    assert run_cli(str(BENCH / "cartpole.json"), "ppo_cartpole", "train", "--name", "ep-pg", "--data-dir", str(data),
                   *overrides(items)) == 0
    predir = data / "ep-pg"
    df = pd.read_parquet(predir / "t0/s0/train_df.parquet")
    assert df["frame"].tolist() == [512, 1024, 1536, 2048] and df["total_reward"].isna().all()
    assert df["loss"].notna().all() and df["entropy"].notna().all()
    assert note in capsys.readouterr().out
    graph = predir / "graph" / "ppo_cartpole_t0_s0_session_graph.png"
    assert graph.stat().st_size > 1000
    graph.unlink()
    assert run_cli("analyze", str(predir)) == 0
    out = capsys.readouterr().out
    assert f"t0_s0: {note}" in out and "nothing to analyze" not in out and graph.stat().st_size > 1000
    assert run_cli("ls", "--data-dir", str(data)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "best=-" in lines[0] and f"  {note}" in lines
