"""Each algorithm learns CartPole-v1 in a short, seeded run (CI-sized: a few seconds each on 2 cores).

A uniformly random policy scores about 22 per episode. The budgets and thresholds were measured on
seeds 1-6: every seed ended well above its threshold (see the comments), so a fixed seed is safe
and a regression that breaks learning (sign error, wrong target, broken GAE) drops far below it.
"""

import math
from pathlib import Path

import pytest
import torch

from orchestrator.session.loop import Session
from orchestrator.spec.load import load_spec

REPO = Path(__file__).resolve().parents[3]
SPECS = str(REPO / "specs" / "benchmark" / "cartpole.json")
RANDOM_POLICY = 22.0

# DQN-family budget: explore over 4k frames and train/sync from 500 transitions, so 8k frames suffice.
DQN_SHORT = ["env.max_frame=8000", "meta.log_frequency=1000", "agent.algorithm.training_start_step=500",
             "agent.algorithm.explore_var_spec.end_step=4000", "agent.net.update_frequency=500"]

CASES = [
    # (spec name, overrides, threshold)   final total_reward_ma measured on seeds 1-6 (CPU seconds)
    ("reinforce_cartpole", ["env.max_frame=30000", "meta.log_frequency=2000"], 100),  # 132-180 (2 s)
    ("ppo_cartpole", ["env.max_frame=15000", "meta.log_frequency=2048"], 100),         # 128-169 (3 s)
    ("dqn_cartpole", DQN_SHORT, 100),                                                  # 186-254 (7 s)
    ("ddqn_cartpole", DQN_SHORT, 100),                                                 # 196-267 (7 s)
]


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name, overrides, threshold", CASES, ids=[c[0] for c in CASES])
def test_learns_cartpole(name, overrides, threshold):
    session = Session(load_spec(SPECS, name, overrides), seed=1)
    try:
        session.run_rl()
    finally:
        session.close()
    df = session.train_df
    first, final = df.total_reward_ma.iloc[0], df.total_reward_ma.iloc[-1]
    assert not math.isnan(final) and session.clock.opt_step > 0
    curve = df[["frame", "total_reward_ma"]]
    assert final > threshold, f"{name}: total_reward_ma {final:.1f} <= {threshold}\n{curve}"
    assert final > 3 * RANDOM_POLICY and final > 2 * first, (first, final)
