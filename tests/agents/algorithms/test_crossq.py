"""CrossQ (Bhatt et al. 2024): batch renormalization by hand, statistics shared by the (s, a) and (s', a')
halves of one critic forward, no target critics, exact resume (BRN buffers, temperature and its optimizer)."""

import math
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from agents.algorithms.crossq import BRN_EPS, BatchRenorm1d
from agents.algorithms.dqn import sample_batch
from envs.clock import Clock
from tests.agents.algorithms.helpers import assert_resume_exact, make_algo

PENDULUM = str(Path(__file__).resolve().parents[3] / "specs" / "benchmark" / "pendulum.json")
SMALL = ["agent.net.hid_layers=[16]", "agent.memory.batch_size=16", "agent.algorithm.training_iter=1",
         "agent.algorithm.training_frequency=4", "agent.algorithm.training_start_step=200"]


def test_batch_renorm_hand_computed():
    """x = 1, 3: batch mean 2, std sqrt(1 + eps). Warm-up forward: plain BN, (x - 2) / std = -/+ 0.9995; running
    mean 0.01 * 2 = 0.02, running std 0.99 + 0.01 * std. Next forward (renorm): r = std / running_std, d = (2 -
    0.02) / running_std, x_hat = (x - 2) / std * r + d. Eval: (x - running_mean) / running_std."""
    brn = BatchRenorm1d(1, warmup=1)
    x = torch.tensor([[1.0], [3.0]])
    std = math.sqrt(1 + BRN_EPS)
    torch.testing.assert_close(brn(x).squeeze(), torch.tensor([-1 / std, 1 / std]))
    rm, rs = 0.02, 0.99 + 0.01 * std
    assert brn.running_mean.item() == pytest.approx(rm) and brn.running_std.item() == pytest.approx(rs)
    r, d = std / rs, (2 - rm) / rs
    torch.testing.assert_close(brn(x).squeeze(), torch.tensor([-r / std + d, r / std + d]))
    assert int(brn.steps) == 2
    brn.eval()
    rm2, rs2 = brn.running_mean.item(), brn.running_std.item()
    torch.testing.assert_close(brn(x).squeeze(), torch.tensor([(1 - rm2) / rs2, (3 - rm2) / rs2]))
    assert int(brn.steps) == 2  # eval leaves the statistics alone


def test_one_critic_forward_over_both_halves_and_no_targets():
    """The first BRN layer's running mean after one critic_preds call is 0.01 x the mean, over all 2B rows of
    (s, a) and (s', a'), of the first linear layer's output."""
    algo = make_algo("crossq_pendulum", SMALL, spec_file=PENDULUM,
                     obs_space=gym.spaces.Box(-8.0, 8.0, (3,), np.float32),
                     action_space=gym.spaces.Box(-2.0, 2.0, (1,), np.float32))
    assert set(algo.nets) == {"net", "q1_net", "q2_net", "log_alpha"}
    rng = np.random.default_rng(0)
    for _ in range(16):
        obs = rng.standard_normal((1, 3)).astype(np.float32)
        algo.memory.add(obs, rng.uniform(-1, 1, (1, 1)).astype(np.float32), np.ones(1, np.float32), obs * 2,
                        np.zeros(1, bool), np.zeros(1, bool))
    batch = sample_batch(algo, Clock(100, 1))
    gen_state = algo.gen.get_state()
    next_act, _ = algo.next_action(batch["next_obs"])
    algo.gen.set_state(gen_state)  # critic_preds draws the same a'
    critic = algo.nets["q1_net"]
    rows = torch.cat([torch.cat([batch["obs"], batch["act"]], -1), torch.cat([batch["next_obs"], next_act], -1)])
    expected = 0.01 * critic.body[0](rows).mean(0)
    algo.critic_preds(batch, algo.alpha)
    torch.testing.assert_close(critic.body[1].running_mean, expected.detach())


@pytest.mark.parametrize("extra, stop_frame", [
    ([], 536),
    (["env.name=CartPole-v1", "agent.algorithm.action_pdtype=Categorical", "env.max_frame=520"], 336),
    (["agent.algorithm.policy_delay=3"], 452),
])
def test_resume_is_exact(tmp_path, extra, stop_frame):
    overrides = [*SMALL, "env.max_frame=800", "meta.log_frequency=200", "agent.memory.checkpoint=true", *extra]
    # (a later env.max_frame in extra wins)
    straight = assert_resume_exact(tmp_path, "crossq_pendulum", overrides, stop_frame, spec_file=PENDULUM)
    assert straight.clock.opt_step > 0 and straight.train_df.alpha.iloc[-1] != 1.0
    assert int(straight.algorithm.nets["q1_net"].body[1].steps) == straight.clock.opt_step


def test_policy_delay_steps_the_actor_once_per_three_critic_steps(tmp_path):
    """SLM-Lab's CrossQ specs' ``policy_delay: 3``: Adam's step count of the actor and of log_alpha is
    opt_step // 3 (critic steps 3, 6, ...), the critics' is opt_step."""
    from orchestrator.session import Session
    from orchestrator.spec import load_spec

    spec = load_spec(PENDULUM, "crossq_pendulum", [*SMALL, "env.max_frame=600", "agent.algorithm.policy_delay=3"])
    session = Session(spec, 3)
    session.run_rl()
    algo, n = session.algorithm, session.clock.opt_step
    assert n >= 6
    steps = {name: int(next(iter(opt.state.values()))["step"]) for name, opt in algo.optims.items()}
    assert steps == {k: n if k.startswith("q") else n // 3 for k in steps}
