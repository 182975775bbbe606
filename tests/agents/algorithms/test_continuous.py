"""Continuous actions for REINFORCE, A2C and PPO (issue 10): a state-independent log-std parameter
(``net.log_std_init``, declared with ``add_tensor``), Box actions clipped only when sent to the env, exact
resume on Pendulum-v1 and SLM-Lab's Pendulum specs that this lab can read."""

import math
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from envs.clock import Clock
from orchestrator.session.loop import Session
from orchestrator.spec.load import load_spec
from tests.agents.algorithms.helpers import assert_resume_exact, make_algo, run_slm_dev

PENDULUM = str(Path(__file__).resolve().parents[3] / "specs" / "benchmark" / "pendulum.json")
PEND_OBS = gym.spaces.Box(-8.0, 8.0, (3,), np.float32)
PEND_ACT = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
SMALL = ["agent.net.hid_layers=[16]"]


def pendulum_algo(name, overrides):
    return make_algo(name, overrides, spec_file=PENDULUM, obs_space=PEND_OBS, action_space=PEND_ACT)


def test_log_std_is_a_declared_tensor_in_the_actor_optimizer():
    algo = pendulum_algo("a2c_gae_pendulum", [*SMALL, "agent.net.log_std_init=-0.5"])
    assert set(algo.nets) == {"actor", "critic", "log_std"} and algo.nets["actor"](torch.zeros(2, 3)).shape == (2, 1)
    assert algo.nets["log_std"].value.tolist() == [-0.5] and "log_std" in algo.weights_sha256()
    assert any(p is algo.nets["log_std"].value for g in algo.optims["net"].param_groups for p in g["params"])
    assert set(algo.transfer_nets()) == {"actor", "critic", "log_std"}
    head = pendulum_algo("a2c_gae_pendulum", [*SMALL, "agent.net.log_std_init=null"])  # SLM-Lab's default head
    assert "log_std" not in head.nets and head.nets["actor"](torch.zeros(2, 3)).shape == (2, 2)


def test_reinforce_log_std_gradient_step_hand_computed():
    """Zero policy weights: mean 0, log_std 0 (std 1). One terminated step, a = 2, r = 1, no centering, no
    entropy bonus: loss = -logp(2) * 1 = 0.5 * 4 + 0.5 ln(2 pi) = 2.91894; d loss / d log_std =
    -(a^2 / std^2 - 1) = -3, so SGD lr 0.1 moves log_std to 0.3."""
    no_bonus = 'agent.algorithm.entropy_coef_spec={"name": "no_decay", "start_val": 0}'
    algo = pendulum_algo("reinforce_pendulum", [*SMALL, "agent.algorithm.center_return=false", no_bonus,
                                                'agent.net.optim_spec={"name": "SGD", "lr": 0.1}'])
    with torch.no_grad():
        for p in algo.nets["net"].parameters():
            p.zero_()
    obs = np.zeros((1, 3), np.float32)
    algo.memory.add(obs, np.array([[2.0]], np.float32), np.ones(1, np.float32), obs, np.ones(1, bool),
                    np.zeros(1, bool))
    clock = Clock(100, 1)
    clock.tick(np.ones(1, bool))
    assert algo.train_ready(clock)
    stats = algo.update(clock)
    assert stats.metrics["policy_loss"] == pytest.approx(2.0 + 0.5 * math.log(2 * math.pi), rel=1e-6)
    assert algo.nets["log_std"].value.item() == pytest.approx(0.3, rel=1e-6)


@pytest.mark.parametrize("overrides, loss", [
    ([], 2 ** -0.5),  # SLM-Lab v5.3: G = (1, 0) standardized to (0.7071, -0.7071): 0.5 * 0.7071 * 2
    (["agent.algorithm.normalize_advantages=none"], 0.5 * (2.0 + 0.5 * math.log(2 * math.pi))),
    (["agent.algorithm.center_return=true"], 2 ** -0.5),  # centring before standardizing changes nothing
])
def test_reinforce_standardizes_returns_hand_computed(overrides, loss):
    """Zero policy weights: N(0, 1); one episode a = (2, 0), r = (1, 0), so G = (1, 0) and
    logp = (-2 - c, -c), c = 0.5 ln(2 pi). Standardized: -mean(logp * (0.7071, -0.7071)) = 0.7071;
    raw: 0.5 * (2 + c). ``policy_loss_coef`` 0.5 halves the gradient, not the logged policy_loss."""
    no_bonus = 'agent.algorithm.entropy_coef_spec={"name": "no_decay", "start_val": 0}'
    algo = pendulum_algo("reinforce_pendulum", [*SMALL, no_bonus, "agent.algorithm.center_return=false",
                                                "agent.algorithm.policy_loss_coef=0.5",
                                                'agent.net.optim_spec={"name": "SGD", "lr": 0.1}', *overrides])
    assert algo.algo_spec.policy_loss_coef == 0.5
    with torch.no_grad():
        for p in algo.nets["net"].parameters():
            p.zero_()
    before = [p.detach().clone() for p in algo.nets["net"].parameters()]
    obs = np.zeros((1, 3), np.float32)
    for a, r, term in ((2.0, 1.0, False), (0.0, 0.0, True)):
        algo.memory.add(obs, np.array([[a]], np.float32), np.array([r], np.float32), obs, np.array([term]),
                        np.zeros(1, bool))
    clock = Clock(100, 1)
    clock.tick(np.ones(1, bool))
    assert algo.train_ready(clock)
    stats = algo.update(clock)
    assert stats.metrics["policy_loss"] == pytest.approx(loss, rel=1e-5)
    # the mean head's bias gradient is -0.5 * 0.5 * sum(G' * a) / 2 (d logp / d mean = a - mean = a)
    g = 2 ** -0.5 * 2 if "normalize_advantages=none" not in " ".join(overrides) else 2.0
    bias = [p for p in algo.nets["net"].parameters()][-1]
    assert (bias - before[-1]).flatten()[0].item() == pytest.approx(0.1 * 0.5 * g / 2, rel=1e-5)


def test_env_gets_clipped_actions_memory_stores_the_samples():
    """std = e^1.5 = 4.5 on Pendulum's [-2, 2]: the env sees clipped torques, REINFORCE's memory keeps the
    raw samples (their log-probs are what it trains on)."""
    spec = load_spec(PENDULUM, "reinforce_pendulum", [*SMALL, "agent.net.log_std_init=1.5", "env.max_frame=100",
                                                      "meta.log_frequency=50"])
    session = Session(spec, 3)
    sent, step = [], session.env.step
    session.env.step = lambda act: (sent.append(np.array(act)), step(act))[1]
    session.run_rl()
    stored = np.stack([s[1] for s in session.algorithm.memory.current[0]])  # no episode finished: all kept
    assert len(stored) == 100 and np.abs(stored).max() > 2.0
    np.testing.assert_array_equal(np.concatenate(sent), np.clip(stored, -2.0, 2.0))


@pytest.mark.parametrize("name, overrides, stop_frame", [
    ("reinforce_pendulum", ["env.max_frame=1000", "meta.log_frequency=250"], 537),
    ("a2c_gae_pendulum", ["env.max_frame=800", "meta.log_frequency=200", "agent.algorithm.training_frequency=32"],
     372),
    ("a2c_gae_pendulum", ["env.max_frame=800", "meta.log_frequency=200", "agent.algorithm.training_frequency=32",
                          "agent.net.shared=true"], 292),
    ("ppo_pendulum", ["env.max_frame=768", "meta.log_frequency=256", "agent.algorithm.time_horizon=64",
                      "agent.algorithm.training_epoch=2"], 404),
])
def test_resume_is_exact(tmp_path, name, overrides, stop_frame):
    straight = assert_resume_exact(tmp_path, name, [*SMALL, *overrides], stop_frame, spec_file=PENDULUM)
    assert straight.clock.opt_step > 0 and straight.algorithm.nets["log_std"].value.item() != 0.0


@pytest.mark.parametrize("rel_file, name", [
    ("experimental/reinforce/reinforce_pendulum.json", "reinforce_pendulum"),
    ("experimental/a2c/a2c_pendulum.json", "a2c_shared_pendulum"),
    ("experimental/a2c/a2c_pendulum.json", "a2c_separate_pendulum"),
])
def test_slm_lab_spec_runs_unmodified(tmp_path, rel_file, name):
    df = run_slm_dev(tmp_path, rel_file, name)
    assert df.opt_step.iloc[-1] > 0
