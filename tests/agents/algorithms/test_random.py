"""Random: uniform actions from its own generator, no training, exact resume, the SLM-Lab spec."""

import gymnasium as gym
import numpy as np

from envs.clock import Clock
from tests.agents.algorithms.helpers import assert_resume_exact, make_algo, run_slm_dev


def test_discrete_actions_are_uniform_and_seeded():
    algo = make_algo("random_cartpole", [], num_envs=4, seed=3)
    act = np.concatenate([algo.act(np.zeros((4, 4), np.float32), Clock(10)) for _ in range(2500)])
    assert act.dtype == np.int64 and set(act.tolist()) == {0, 1}
    assert abs(act.mean() - 0.5) < 0.02  # 10000 draws: std of the mean 0.005
    again = make_algo("random_cartpole", [], num_envs=4, seed=3)
    np.testing.assert_array_equal(again.act(np.zeros((4, 4), np.float32), Clock(10)), act[:4])
    assert not algo.train_ready(Clock(10)) and algo.nets == {} and np.isnan(algo.current_lr())


def test_box_actions_are_within_bounds():
    space = gym.spaces.Box(np.array([-2, 0], np.float32), np.array([2, 1], np.float32), dtype=np.float32)
    algo = make_algo("random_cartpole", [], num_envs=8, action_space=space)
    act = np.concatenate([algo.act(np.zeros((8, 4), np.float32), Clock(10)) for _ in range(500)])
    assert act.shape == (4000, 2) and act.dtype == np.float32
    assert (act.min(0) >= [-2, 0]).all() and (act.max(0) <= [2, 1]).all()
    np.testing.assert_allclose(act.mean(0), [0.0, 0.5], atol=0.05)


def test_resume_is_exact(tmp_path):
    straight = assert_resume_exact(tmp_path, "random_cartpole", ["env.max_frame=2000", "meta.log_frequency=400"], 868)
    df = straight.train_df
    assert (df.opt_step == 0).all() and df.loss.isna().all() and 15 < df.total_reward_ma.iloc[-1] < 30


def test_slm_lab_spec_runs_unmodified(tmp_path):
    df = run_slm_dev(tmp_path, "experimental/misc/random.json", "random_cartpole", max_frame=400)
    assert (df.opt_step == 0).all()
