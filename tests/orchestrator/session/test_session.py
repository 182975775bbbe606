"""The in-process session loop: train_df columns and cadence, seeding, eval_df."""

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from orchestrator.session.loop import EVAL_COLUMNS, TRAIN_COLUMNS, Session
from orchestrator.spec.load import load_spec
from orchestrator.store.predir import session_seed

REPO = Path(__file__).resolve().parents[3]
SPECS = str(REPO / "specs" / "benchmark" / "cartpole.json")
DESIGN_COLUMNS = ["frame", "epi", "t", "opt_step", "wall_t", "fps", "total_reward", "total_reward_ma", "loss",
                  "lr", "explore_var", "entropy_coef", "entropy", "grad_norm"]
TIMING = ["wall_t", "fps"]
SHORT = {  # CI-sized runs of each benchmark spec
    "reinforce_cartpole": ["env.max_frame=1200", "meta.log_frequency=200"],
    "ppo_cartpole": ["env.max_frame=1024", "meta.log_frequency=256", "agent.algorithm.training_epoch=2"],
    "dqn_cartpole": ["env.max_frame=1000", "meta.log_frequency=200",
                     "agent.algorithm.training_start_step=200"],
    "ddqn_cartpole": ["env.max_frame=1000", "meta.log_frequency=200",
                      "agent.algorithm.training_start_step=200"],
}


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def run(name, overrides, seed=1):
    session = Session(load_spec(SPECS, name, overrides), seed)
    try:
        session.run_rl()
    finally:
        session.close()
    return session


def test_train_df_has_design_columns():
    df = run("dqn_cartpole", ["env.max_frame=1000", "meta.log_frequency=200",
                              "agent.algorithm.training_start_step=300"]).train_df
    assert list(df.columns) == [*TRAIN_COLUMNS, "q_mean", "td_error"]  # common columns, then DQN's own
    assert set(DESIGN_COLUMNS) <= set(df.columns) and "refill" in df.columns
    assert df.frame.tolist() == [200, 400, 600, 800, 1000]
    assert df.epi.is_monotonic_increasing and df.wall_t.is_monotonic_increasing
    assert (df.fps > 0).all()
    assert (df.lr == 0.0005).all()
    # explore_var is the linear epsilon schedule at the row's frame: 1 - 0.98 * frame / 10000
    np.testing.assert_allclose(df.explore_var, 1 - 0.98 * df.frame / 10000)
    assert math.isnan(df.loss.iloc[0]) and df.opt_step.iloc[0] == 0  # training starts at 300 transitions
    assert df.opt_step.iloc[-1] > 0 and not math.isnan(df.loss.iloc[-1]) and df.grad_norm.iloc[-1] > 0
    assert not df.refill.any()


def test_total_reward_ma_is_mean_of_last_window_episodes():
    session = run("reinforce_cartpole", ["env.max_frame=800", "meta.log_frequency=400", "meta.ma_window=5"])
    assert session.train_df.total_reward_ma.iloc[-1] == pytest.approx(np.mean(list(session.returns)))
    assert len(session.returns) == 5
    assert session.train_df.epi.iloc[-1] == session.clock.epi >= 5


@pytest.mark.parametrize("name, num_envs, log_frequency, max_frame", [
    ("dqn_cartpole", 1, 250, 1000),
    ("reinforce_cartpole", 4, 200, 1000),
    ("ppo_cartpole", 8, 256, 1024),
])
def test_rows_at_multiples_of_log_frequency(name, num_envs, log_frequency, max_frame):
    df = run(name, [f"env.num_envs={num_envs}", f"meta.log_frequency={log_frequency}",
                    f"env.max_frame={max_frame}", "agent.algorithm.training_epoch=1"
                    if name == "ppo_cartpole" else "agent.algorithm.gamma=0.99"]).train_df
    assert df.frame.tolist() == list(range(log_frequency, max_frame + 1, log_frequency))


def test_rows_with_num_envs_not_dividing_log_frequency():
    """3 envs, log every 100 frames: one row at the first frame at or past each boundary, and one at
    the end (frame 1002 >= max_frame 1000)."""
    overrides = ["env.num_envs=3", "meta.log_frequency=100", "env.max_frame=1000"]
    df = run("reinforce_cartpole", overrides).train_df
    assert df.frame.tolist() == [102, 201, 300, 402, 501, 600, 702, 801, 900, 1002]


def test_last_row_at_max_frame_off_cadence():
    df = run("dqn_cartpole", ["env.max_frame=700", "meta.log_frequency=300",
                              "agent.algorithm.training_start_step=100"]).train_df
    assert df.frame.tolist() == [300, 600, 700]


@pytest.mark.parametrize("name", list(SHORT))
def test_same_seed_same_train_df_different_seed_differs(name):
    a = run(name, SHORT[name], seed=11).train_df.drop(columns=TIMING)
    b = run(name, SHORT[name], seed=11).train_df.drop(columns=TIMING)
    c = run(name, SHORT[name], seed=12).train_df.drop(columns=TIMING)
    pd.testing.assert_frame_equal(a, b)
    assert not a.equals(c)
    assert a.opt_step.iloc[-1] > 0


def test_sessions_in_one_process_do_not_share_rng():
    """Interleaving two sessions step by step gives the same train_df as running each alone."""
    spec = load_spec(SPECS, "ppo_cartpole", SHORT["ppo_cartpole"])
    alone = run("ppo_cartpole", SHORT["ppo_cartpole"], seed=5).train_df.drop(columns=TIMING)
    s1, s2 = Session(spec, 5), Session(spec, 6)
    for frame in range(256, 1025, 256):
        s1.run_rl(until_frame=frame)
        s2.run_rl(until_frame=frame)
    pd.testing.assert_frame_equal(s1.train_df.drop(columns=TIMING), alone)
    s1.close()
    s2.close()


def test_run_rl_until_frame_chunks_equal_one_run():
    straight = run("dqn_cartpole", SHORT["dqn_cartpole"], seed=2)
    chunked = Session(load_spec(SPECS, "dqn_cartpole", SHORT["dqn_cartpole"]), 2)
    for until in (130, 500, 10**6):
        chunked.run_rl(until_frame=until)
    assert chunked.clock.frame == 1000
    pd.testing.assert_frame_equal(chunked.train_df.drop(columns=TIMING),
                                  straight.train_df.drop(columns=TIMING))
    chunked.close()


def test_eval_df_rows_when_rigorous_eval():
    session = run("ppo_cartpole", ["env.max_frame=1024", "meta.log_frequency=256", "meta.eval_frequency=512",
                                   "meta.rigorous_eval=3", "agent.algorithm.training_epoch=1"])
    df = session.eval_df
    assert list(df.columns) == list(EVAL_COLUMNS)
    assert df.frame.tolist() == [512, 1024]
    # a CartPole episode lasts at least 8 steps
    assert (df.total_reward >= 8).all() and (df.total_reward_std >= 0).all()
    assert df.total_reward_ma.iloc[-1] == pytest.approx(df.total_reward.mean())
    assert df.epi.tolist() == session.train_df.set_index("frame").loc[[512, 1024], "epi"].tolist()


def test_no_eval_df_rows_by_default():
    assert run("dqn_cartpole", SHORT["dqn_cartpole"]).eval_df.empty


def test_eval_does_not_change_training():
    """Evaluation uses its own env and seeds: train_df is the same with and without it."""
    base = ["env.max_frame=1024", "meta.log_frequency=256", "agent.algorithm.training_epoch=1"]
    plain = run("ppo_cartpole", base, seed=4).train_df.drop(columns=TIMING)
    evald = run("ppo_cartpole", base + ["meta.rigorous_eval=2", "meta.eval_frequency=256"], seed=4)
    assert len(evald.eval_df) == 4
    pd.testing.assert_frame_equal(evald.train_df.drop(columns=TIMING), plain)


def test_normalize_state_with_eval_runs():
    session = run("ppo_cartpole", ["env.max_frame=512", "meta.log_frequency=256", "meta.eval_frequency=512",
                                   "meta.rigorous_eval=2", "env.normalize_state=true", "env.reward_scale=0.1",
                                   "agent.algorithm.training_epoch=1"])
    assert session.train_df.frame.tolist() == [256, 512] and len(session.eval_df) == 1
    assert session.train_df.total_reward.iloc[-1] >= 8  # episode returns are unscaled


def test_eval_ma_window_1_is_each_rows_own_return():
    """meta.ma_window=1: total_reward_ma of an eval row is its total_reward (not the mean of all rows);
    with 2, the mean of the row and the one before."""
    base = ["env.max_frame=768", "meta.log_frequency=256", "meta.eval_frequency=256", "meta.rigorous_eval=2",
            "agent.algorithm.training_epoch=1"]
    one = run("ppo_cartpole", base + ["meta.ma_window=1"], seed=3).eval_df
    assert len(one) == 3 and one.total_reward.nunique() > 1  # rows differ, so a mean of all would show
    np.testing.assert_allclose(one.total_reward_ma, one.total_reward)
    two = run("ppo_cartpole", base + ["meta.ma_window=2"], seed=3).eval_df
    np.testing.assert_allclose(two.total_reward, one.total_reward)
    np.testing.assert_allclose(two.total_reward_ma, two.total_reward.rolling(2, min_periods=1).mean())


def test_sessions_of_a_trial_share_no_env_seed():
    """8 sub-envs: sessions 0 and 1 of trial 0 start from 8 + 8 different observations (with sub-env
    seeds ``seed + i`` they shared 7)."""
    spec = load_spec(SPECS, "ppo_cartpole", SHORT["ppo_cartpole"])
    s0, s1 = Session(spec, session_seed(1, 0, 0)), Session(spec, session_seed(1, 0, 1))
    assert s0.obs.shape == (8, 4)
    rows = np.concatenate([s0.obs, s1.obs])
    assert len(np.unique(rows, axis=0)) == 16
    s0.close()
    s1.close()


@pytest.mark.parametrize("autoreset", ["same_step", "next_step"])
def test_next_step_autoreset_stores_the_reset_step_as_slm_lab_does(autoreset):
    """``env.autoreset: next_step`` (SLM-Lab's gym.make_vec stepping): the step after an episode's end is a
    transition (final obs, ignored action, reward 0, the next episode's first obs, not done) that costs a frame;
    CartPole pays 1 per step, so reward-0 rows are exactly those. ``same_step`` stores none. The reset step
    belongs to no episode: returns stay <= max_t."""
    overrides = ["env.max_frame=240", "meta.log_frequency=240", "agent.algorithm.training_start_step=1000",
                 "env.num_envs=2", "env.max_t=9", f"env.autoreset={autoreset}"]
    session = run("dqn_cartpole", overrides, seed=5)
    memory = session.algorithm.memory
    assert len(memory) == 240  # every vector step is stored, the reset steps too
    data = {k: v[:240].reshape(120, 2, *v.shape[1:]) for k, v in memory.data.items()}  # (step, sub-env, ...)
    resets = data["reward"] == 0
    assert max(session.returns) <= 9
    if autoreset == "same_step":
        assert not resets.any() and session.clock.epi >= 2 * (120 // 9)
        return
    for i in range(2):
        rows = np.flatnonzero(resets[:, i])
        ends = np.flatnonzero(data["terminated"][:, i]) if data["terminated"][:, i].any() else np.empty(0, int)
        assert len(rows) >= 120 // 10 - 1
        for r in rows:
            assert r > 0 and not data["terminated"][r, i]
            np.testing.assert_array_equal(data["obs"][r, i], data["next_obs"][r - 1, i])  # from the final obs
            nxt = data["obs"][r + 1, i] if r + 1 < 120 else session.obs[i]
            np.testing.assert_array_equal(nxt, data["next_obs"][r, i])  # to the next episode's first obs
            assert np.abs(data["next_obs"][r, i]).max() <= 0.05  # CartPole's reset range
        # every terminated row is followed by a reset row, and reset rows come only after an episode's end
        assert set((ends + 1)[ends + 1 < 120].tolist()) <= set(rows.tolist())
        gaps = np.diff(np.concatenate([[-1], rows]))
        assert (gaps <= 10).all() and (gaps >= 2).all()  # 1 to 9 real steps between two reset steps (max_t=9)
    assert session.clock.epi in (resets.sum(), resets.sum() + 1, resets.sum() + 2)  # the last step may end one


@pytest.mark.parametrize("trial, session, max_session, count, offset, want", [
    (0, 0, 4, 1, 0, 0),  # one visible GPU (or a Ray share of one): every session on it
    (0, 3, 4, 8, 0, 3),  # 4 sessions over 8 GPUs: one each
    (1, 2, 4, 8, 0, 6),  # trial 1 continues where trial 0 ended
    (1, 3, 4, 4, 0, 3),  # wraps: (4 + 3) % 4
    (0, 1, 2, 4, 3, 0),  # CUDA_OFFSET shifts: (1 + 3) % 4
])
def test_session_cuda_index_is_slm_labs_assignment(trial, session, max_session, count, offset, want):
    from orchestrator.session.loop import session_cuda_index

    assert session_cuda_index(trial, session, max_session, count, offset) == want


def test_select_session_gpu_sets_the_device_only_where_cuda_is_asked_and_visible(monkeypatch):
    """With CUDA faked visible (4 devices): gpu true or auto makes ``(t * max_session + s + CUDA_OFFSET) % 4``
    current; gpu false touches nothing; without CUDA nothing is touched; a bad CUDA_OFFSET is a UsageError."""
    from orchestrator.errors import UsageError
    from orchestrator.session import loop as session_mod

    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv("CUDA_OFFSET", raising=False)
    assert session_mod.select_session_gpu(True, 1, 2, 3) == 1 and calls == [1]  # (3 + 2) % 4
    assert session_mod.select_session_gpu("auto", 0, 3, 3) == 3 and calls == [1, 3]
    assert session_mod.select_session_gpu(False, 0, 3, 3) is None and calls == [1, 3]
    monkeypatch.setenv("CUDA_OFFSET", "2")
    assert session_mod.select_session_gpu(True, 0, 3, 3) == 1 and calls == [1, 3, 1]  # (3 + 2) % 4
    monkeypatch.setenv("CUDA_OFFSET", "-1")
    with pytest.raises(UsageError, match="CUDA_OFFSET"):
        session_mod.select_session_gpu(True, 0, 0, 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert session_mod.select_session_gpu(True, 0, 3, 3) is None and calls == [1, 3, 1]
