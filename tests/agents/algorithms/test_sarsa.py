"""SARSA: the on-policy target against hand-computed values, the held-back last step, exact resume,
the SLM-Lab specs."""

import numpy as np
import pytest
import torch

from envs.clock import Clock
from tests.agents.algorithms.helpers import assert_resume_exact, make_algo, run_slm_dev

HAND = ["agent.algorithm.gamma=0.5", "agent.algorithm.training_frequency=3", "agent.net.hid_layers=[2]",
        "agent.net.hid_layers_activation=linear", 'agent.net.optim_spec={"name": "SGD", "lr": 0.1}',
        "agent.net.clip_grad_val=null"]


def set_q(algo, q_a0, q_a1):
    """Make Q(s, .) = (q_a0, q_a1) for every state: zero weights, head biases."""
    with torch.no_grad():
        for p in algo.nets["net"].parameters():
            p.zero_()
        algo.nets["net"].heads[0][0].bias.copy_(torch.tensor([q_a0, q_a1]))


def add(algo, acts, rewards, terminated=(0, 0, 0), truncated=(0, 0, 0)):
    obs = np.zeros((1, 4), np.float32)
    for a, r, te, tr in zip(acts, rewards, terminated, truncated):
        algo.memory.add(obs, np.array([a]), np.array([r], np.float32), obs, np.array([bool(te)]), np.array([bool(tr)]))


def targets(algo, data):
    """``q_target`` of a ``rollout()`` (L, 1) as a flat batch."""
    dtypes = {"act": torch.int64, "next_act": torch.int64, "has_next": torch.bool}
    return algo.q_target({k: torch.as_tensor(v).reshape(len(v), *v.shape[2:]).to(dtypes.get(k, torch.float32))
                          for k, v in data.items()})


def test_target_uses_the_next_action_taken():
    """Q = (1, 3). Steps a = 0, 1, 0 with r = 1, 2, 3, gamma 0.5. The last step is held back; the first two
    train: y0 = 1 + 0.5 * Q(s', a1 = 1) = 2.5, y1 = 2 + 0.5 * Q(s', a2 = 0) = 2.5 (Q-learning would use
    max = 3 for both). Q(s, a) = 1, 3: td_error = (1.5 + 0.5) / 2 = 1, MSE = (2.25 + 0.25) / 2 = 1.25."""
    algo = make_algo("sarsa_cartpole", HAND)
    set_q(algo, 1.0, 3.0)
    add(algo, [0, 1, 0], [1, 2, 3])
    clock = Clock(100)
    clock.frame = 3
    stats = algo.update(clock)
    assert stats.metrics == {"q_mean": pytest.approx(2.0), "td_error": pytest.approx(1.0)}
    assert stats.loss == pytest.approx(1.25)
    assert algo.pending["act"].tolist() == [[0]] and algo.pending["reward"].tolist() == [[3.0]]
    # Bias step: dL/db0 = 2 (1 - 2.5) / 2 = -1.5 (a = 0 once), dL/db1 = 2 (3 - 2.5) / 2 = 0.5 -> b = (1.15, 2.95)
    torch.testing.assert_close(algo.nets["net"].heads[0][0].bias.detach(), torch.tensor([1.15, 2.95]))


def test_held_back_step_trains_first_next_time_and_truncation_bootstraps_greedy():
    """Second rollout: pending (a = 0, r = 3) then a = 1, 1, 0 with the middle step terminated and the last
    truncated... which is held back. Q = (1, 3) again: y = 3 + 0.5 * Q(a = 1) = 4.5, then 2 + 0.5 * Q(a = 1) =
    3.5, then a terminal 5. The truncated step, trained a rollout later, bootstraps max Q = 3: 1 + 1.5."""
    algo = make_algo("sarsa_cartpole", HAND)
    add(algo, [0, 1, 0], [1, 2, 3])
    clock = Clock(100)
    clock.frame = 3
    algo.update(clock)
    set_q(algo, 1.0, 3.0)
    add(algo, [1, 1, 0], [2, 5, 1], terminated=(0, 1, 0), truncated=(0, 0, 1))
    data = algo.rollout()
    torch.testing.assert_close(targets(algo, data), torch.tensor([4.5, 3.5, 5.0]))
    add(algo, [1, 0, 0], [0, 0, 0])
    data = algo.rollout()
    assert data["truncated"][0].tolist() == [True] and not data["has_next"][0, 0]
    assert targets(algo, data)[0].item() == pytest.approx(1 + 0.5 * 3)


@pytest.mark.parametrize("overrides, stop_frame", [
    (["env.max_frame=1600", "meta.log_frequency=400"], 732),
    (["env.max_frame=1200", "meta.log_frequency=300", "agent.memory.name=OnPolicyReplay",
      "agent.algorithm.training_frequency=2"], 516),
])
def test_resume_is_exact(tmp_path, overrides, stop_frame):
    straight = assert_resume_exact(tmp_path, "sarsa_cartpole", overrides, stop_frame)
    assert straight.clock.opt_step > 0 and not straight.train_df.td_error.isna().all()


@pytest.mark.parametrize("name", ["sarsa_epsilon_greedy_cartpole", "sarsa_boltzmann_cartpole"])
def test_slm_lab_spec_runs_unmodified(tmp_path, name):
    df = run_slm_dev(tmp_path, "benchmark/sarsa/sarsa_cartpole.json", name, max_frame=400)
    assert df.opt_step.iloc[-1] > 0
