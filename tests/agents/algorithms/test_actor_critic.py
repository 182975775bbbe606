"""ActorCritic (A2C): loss and gradient against a hand-computed rollout, exact resume, SLM-Lab specs."""

import math

import numpy as np
import pytest
import torch

from envs.clock import Clock
from tests.agents.algorithms.helpers import assert_resume_exact, make_algo, run_slm_dev

NSTEP = ["agent.algorithm.num_step_returns=2", "agent.algorithm.gamma=0.5", "agent.net.shared=false",
         "agent.net.hid_layers=[3]", "agent.net.actor_optim_spec=null", "agent.net.critic_optim_spec=null",
         'agent.net.optim_spec={"name": "SGD", "lr": 0.1}', "agent.net.clip_grad_val=null",
         'agent.algorithm.entropy_coef_spec={"name": "no_decay", "start_val": 0.01}',
         "agent.algorithm.normalize_advantages=none"]


def _two_step_rollout(overrides):
    """The NSTEP algorithm with zero weights and critic bias 1, and a 2-step rollout (r = 1, 1) stored."""
    algo = make_algo("a2c_nstep_cartpole", overrides)
    with torch.no_grad():
        for net in algo.nets.values():
            for p in net.parameters():
                p.zero_()
        algo.nets["critic"].heads[0][0].bias.fill_(1.0)
    obs, no = np.zeros((1, 4), np.float32), np.zeros(1, bool)
    for act in (0, 1):
        algo.memory.add(obs, np.array([act]), np.ones(1, np.float32), obs, no, no)
    return algo


def test_nstep_loss_and_critic_step_hand_computed():
    """Advantages not standardized. Zero weights, critic bias 1: uniform policy over 2 actions (logp = -ln 2,
    H = ln 2) and V = 1.
    Rollout T = 2, N = 1, r = 1, 1, no done, gamma 0.5: R1 = 1 + 0.5 * 1 = 1.5, R0 = 1 + 0.5 * 1.5 = 1.75,
    adv = 0.75, 0.5. policy_loss = ln 2 * 0.625 = 0.43322, val_loss = (0.75^2 + 0.5^2) / 2 = 0.40625,
    loss = 0.43322 + 0.5 * 0.40625 - 0.01 * ln 2 = 0.62941. dL/db = 0.5 * mean(2 (V - R)) = -0.625, so
    SGD lr 0.1 moves the critic bias to 1.0625."""
    algo = _two_step_rollout(NSTEP)
    clock = Clock(100, 1)
    clock.frame = 2
    assert algo.train_ready(clock)
    stats = algo.update(clock)
    ln2 = math.log(2)
    assert stats.metrics["policy_loss"] == pytest.approx(ln2 * 0.625, rel=1e-6)
    assert stats.metrics["val_loss"] == pytest.approx(0.40625, rel=1e-6)
    assert stats.entropy == pytest.approx(ln2, rel=1e-6)
    assert stats.loss == pytest.approx(ln2 * 0.625 + 0.5 * 0.40625 - 0.01 * ln2, rel=1e-6)
    assert algo.nets["critic"].heads[0][0].bias.item() == pytest.approx(1.0625, rel=1e-6)
    assert clock.opt_step == 1


def test_gae_advantages_hand_computed():
    """lam 0.5, gamma 0.5, V = 1 everywhere, r = 1, 1: delta = 1 + 0.5 - 1 = 0.5 each; A1 = 0.5,
    A0 = 0.5 + 0.25 * 0.5 = 0.625; v_target = A + 1."""
    algo = make_algo("a2c_gae_cartpole", ["agent.algorithm.lam=0.5", "agent.algorithm.gamma=0.5",
                                          "agent.algorithm.training_frequency=2"])
    with torch.no_grad():
        for p in algo.nets["critic"].parameters():
            p.zero_()
        algo.nets["critic"].heads[0][0].bias.fill_(1.0)
    obs, no = np.zeros((1, 4), np.float32), np.zeros(1, bool)
    for act in (0, 1):
        algo.memory.add(obs, np.array([act]), np.ones(1, np.float32), obs, no, no)
    data = algo.prepare(algo.memory.pop())
    torch.testing.assert_close(data["adv"], torch.tensor([0.625, 0.5]))
    torch.testing.assert_close(data["v_target"], torch.tensor([1.625, 1.5]))


def test_two_optimizers_one_opt_step_and_their_lrs():
    """a2c_gae_cartpole: separate actor (lr 0.001) and critic (lr 0.003) optimizers, one opt_step per update."""
    algo = make_algo("a2c_gae_cartpole", [])
    assert {k: o.param_groups[0]["lr"] for k, o in algo.optims.items()} == {"actor": 0.001, "critic": 0.003}
    assert algo.memory.horizon == 32


@pytest.mark.parametrize("name, overrides, stop_frame", [
    ("a2c_gae_cartpole", ["env.max_frame=1600", "meta.log_frequency=400"], 732),
    ("a2c_nstep_cartpole", ["env.max_frame=1600", "meta.log_frequency=400"], 596),
    ("a2c_nstep_cartpole", ["env.max_frame=1600", "meta.log_frequency=400", "agent.net.shared=true"], 596),
    ("a2c_gae_cartpole", ["env.max_frame=1200", "meta.log_frequency=300", "agent.memory.name=OnPolicyReplay",
                          "agent.algorithm.training_frequency=2"], 516),
])
def test_resume_is_exact(tmp_path, name, overrides, stop_frame):
    straight = assert_resume_exact(tmp_path, name, overrides, stop_frame)
    assert straight.clock.opt_step > 0 and not straight.train_df.val_loss.isna().all()


@pytest.mark.parametrize("rel_file, name", [
    ("benchmark/a2c/a2c_gae_cartpole.json", "a2c_gae_cartpole"),
    ("experimental/a2c/a2c_cartpole.json", "a2c_shared_cartpole"),
    ("experimental/a2c/a2c_cartpole.json", "a2c_separate_cartpole"),
])
def test_slm_lab_spec_runs_unmodified(tmp_path, rel_file, name):
    df = run_slm_dev(tmp_path, rel_file, name)
    assert df.opt_step.iloc[-1] > 0 and not math.isnan(df.policy_loss.iloc[-1])


@pytest.mark.parametrize("optims", [
    ['agent.net.actor_optim_spec={"name": "SGD", "lr": 1.0}', 'agent.net.critic_optim_spec={"name": "SGD", "lr": 1.0}'],
    ["agent.net.actor_optim_spec=null", "agent.net.critic_optim_spec=null",
     'agent.net.optim_spec={"name": "SGD", "lr": 1.0}'],
])
def test_grad_clipping_is_per_net_as_slm_lab(optims):
    """Separate actor and critic, clip_grad_val 0.5 (a2c_gae_cartpole), SGD lr 1, stepped together on
    loss = 3 b_a[0] + 4 b_a[1] + 12 b_c (actor / critic head biases): the actor's gradient (3, 4) has norm 5
    and is clipped on its own to (0.3, 0.4), the critic's 12 to 0.5, as SLM-Lab's two ``train_step`` calls
    clip them (over the joint norm 13 the actor's step would be (0.115, 0.154)). Both with two optimizers
    and with one optimizer over both nets. The returned grad_norm is the joint norm before clipping, 13."""
    algo = make_algo("a2c_gae_cartpole", optims)
    assert algo.net_spec.clip_grad_val == 0.5
    b_a, b_c = algo.nets["actor"].heads[0][0].bias, algo.nets["critic"].heads[0][0].bias
    a0, c0 = b_a.detach().clone(), b_c.detach().clone()
    loss = 3 * b_a[0] + 4 * b_a[1] + 12 * b_c[0]
    clock = Clock(100, 1)
    grad_norm = algo.optim_step(loss, tuple(algo.optims), clock)
    assert grad_norm == pytest.approx(13.0, rel=1e-6)
    torch.testing.assert_close(a0 - b_a.detach(), torch.tensor([0.3, 0.4]), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(c0 - b_c.detach(), torch.tensor([0.5]), rtol=1e-5, atol=1e-6)
    assert clock.opt_step == 1


def test_advantages_standardized_by_default_as_slm_lab():
    """SLM-Lab v5.3's A2C policy loss standardizes the advantages (Reinforce.calc_policy_loss): the rollout of
    the test above has adv = 0.75, 0.5 -> mean 0.625, unbiased std 0.17678 -> (0.7071, -0.7071); with the
    uniform policy (logp = -ln 2 for both) policy_loss = ln 2 * mean(0.7071, -0.7071) = 0 (0.43322 without).
    The value loss is unchanged: 0.40625."""
    algo = _two_step_rollout([o for o in NSTEP if "normalize_advantages" not in o])
    assert algo.algo_spec.normalize_advantages == "standardize"
    clock = Clock(100, 1)
    clock.frame = 2
    stats = algo.update(clock)
    assert stats.metrics["policy_loss"] == pytest.approx(0.0, abs=1e-6)
    assert stats.metrics["val_loss"] == pytest.approx(0.40625, rel=1e-6)
    adv = algo.normalize_adv(torch.tensor([0.75, 0.5]))
    torch.testing.assert_close(adv, torch.tensor([0.70711, -0.70711]), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["a2c_gae_cartpole", "ppo_cartpole"])
def test_shared_next_obs_give_the_values_of_a_full_next_obs_forward(name):
    """A 6-step rollout of 3 sub-envs with episode ends at steps 1 and 4 (next obs = final obs there): the
    advantages and value targets from V of the next step's obs (``next_shared``) equal those of a forward over
    every step's next obs, and only the done steps and the last one got their own next obs."""
    algo = make_algo(name, ["agent.net.hid_layers=[8]"], num_envs=3)
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((3, 4)).astype(np.float32)
    for t in range(6):
        next_obs = rng.standard_normal((3, 4)).astype(np.float32)
        terminated = np.array([t == 1, False, t == 4])
        stored = next_obs.copy() if terminated.any() else next_obs
        stored[terminated] = rng.standard_normal((int(terminated.sum()), 4)).astype(np.float32)
        algo.memory.add(obs, rng.integers(0, 2, 3), rng.random(3).astype(np.float32), stored, terminated,
                        np.zeros(3, bool))
        obs = next_obs
    algo.memory.horizon = 6
    batch = algo.memory.pop()
    assert batch["next_shared"].tolist() == [True, False, True, True, False, False]
    shared = algo.prepare(batch)
    full = algo.prepare({k: v for k, v in batch.items() if k != "next_shared"})
    for k in ("adv", "v_target", "old_value", "old_logp"):
        torch.testing.assert_close(shared[k], full[k], rtol=1e-6, atol=1e-6, msg=k)
