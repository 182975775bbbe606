"""CrossQ (Bhatt et al. 2024): batch renormalization by hand, statistics shared by the (s, a) and (s', a')
halves of one critic forward, no target critics, exact resume (BRN buffers, temperature and its optimizer)."""

import math
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from agents.algorithms.crossq import BRN_EPS
from agents.algorithms.dqn import sample_batch
from agents.batch_renorm import BatchRenorm1d, LazyBatchRenorm1d
from envs.clock import Clock
from tests.agents.algorithms.helpers import SLM_SPECS, assert_resume_exact, make_algo

PENDULUM = str(Path(__file__).resolve().parents[3] / "specs" / "benchmark" / "pendulum.json")
SMALL = ["agent.net.hid_layers=[16]", "agent.memory.batch_size=16", "agent.algorithm.training_iter=1",
         "agent.algorithm.training_frequency=4", "agent.algorithm.training_start_step=200"]


def test_batch_renorm_hand_computed():
    """SLM-Lab v5.3's batch renorm, eps 1e-3, warmup 2 steps. x = 1, 5: batch mean 3, var 4, std = sqrt(4 + eps).
    Step 0 (limits r_max 1, d_max 0: plain BN): (x - 3) / std; running mean 0.03, var 0.99 + 0.04 = 1.03.
    Step 1 (t = 1/2: r_max 2, d_max 2.5): r = std / sqrt(1.03 + eps) = 1.970, d = 2.97 / sqrt(1.03 + eps) = 2.925
    clipped to 2.5; x_hat = (x - 3) / std * r + d. Running mean 0.0597, var 1.0597. Eval:
    (x - running_mean) / sqrt(running_var + eps), statistics left alone. LazyBatchRenorm1d infers F."""
    brn = BatchRenorm1d(1, eps=BRN_EPS, momentum=0.01, warmup_steps=2)
    x = torch.tensor([[1.0], [5.0]])
    std = math.sqrt(4 + BRN_EPS)
    torch.testing.assert_close(brn(x).squeeze(), torch.tensor([-2 / std, 2 / std]))
    assert brn.running_mean.item() == pytest.approx(0.03) and brn.running_var.item() == pytest.approx(1.03)
    r = std / math.sqrt(1.03 + BRN_EPS)
    assert 1 < r < 2 and 2.97 / math.sqrt(1.03 + BRN_EPS) > 2.5  # r inside its limit, d clipped
    torch.testing.assert_close(brn(x).squeeze(), torch.tensor([-2 / std * r + 2.5, 2 / std * r + 2.5]))
    assert int(brn.step) == 2
    assert brn.running_mean.item() == pytest.approx(0.0597) and brn.running_var.item() == pytest.approx(1.0597)
    brn.eval()
    rs = math.sqrt(1.0597 + BRN_EPS)
    torch.testing.assert_close(brn(x).squeeze(), torch.tensor([(1 - 0.0597) / rs, (5 - 0.0597) / rs]))
    assert int(brn.step) == 2
    lazy = LazyBatchRenorm1d(eps=BRN_EPS, warmup_steps=2)
    lazy(torch.randn(4, 3))
    assert isinstance(lazy, BatchRenorm1d) and lazy.weight.shape == (3,) and int(lazy.step) == 1


def test_batch_renorm_gradients_follow_the_formula():
    """Gradients reach x through the batch mean and std (as in batch norm; r and d are constants), and weight and
    bias get those of ``weight * x_hat + bias``: against autograd of the formula written out, at a step where both
    corrections are active (r_max 3, d_max 5 after warmup 1; running statistics set so r and d are not 1, 0)."""
    torch.manual_seed(0)
    brn = BatchRenorm1d(3, eps=BRN_EPS, momentum=0.01, warmup_steps=1)
    with torch.no_grad():
        brn.step.fill_(1)
        brn.running_mean.copy_(torch.tensor([0.5, -0.3, 0.1]))
        brn.running_var.copy_(torch.tensor([2.0, 0.5, 1.5]))
        brn.weight.copy_(torch.tensor([1.5, 0.7, -0.4]))
        brn.bias.copy_(torch.tensor([0.1, 0.2, -0.3]))
    x = torch.randn(6, 3, requires_grad=True)
    weight, bias = brn.weight.detach().clone().requires_grad_(), brn.bias.detach().clone().requires_grad_()
    mean, var = x.mean(0), x.var(0, unbiased=False)
    std, running_std = (var + BRN_EPS).sqrt(), (brn.running_var + BRN_EPS).sqrt()
    r = (std / running_std).clamp(1 / 3, 3).detach()
    d = ((mean - brn.running_mean) / running_std).clamp(-5, 5).detach()
    g = torch.randn(6, 3)
    expected = weight * ((x - mean) / std * r + d) + bias
    (expected * g).sum().backward()
    x_grad, x.grad = x.grad, None
    out = brn(x)
    (out * g).sum().backward()
    torch.testing.assert_close(out, expected.detach())
    torch.testing.assert_close(x.grad, x_grad)
    torch.testing.assert_close(brn.weight.grad, weight.grad)
    torch.testing.assert_close(brn.bias.grad, bias.grad)
    x1 = torch.tensor([[1.0, 2.0, 3.0]])  # a batch of one: x - mu_B = 0, so weight * d + bias
    d1 = ((x1[0] - brn.running_mean) / (brn.running_var + BRN_EPS).sqrt()).clamp(-5, 5)
    torch.testing.assert_close(brn(x1), (brn.weight * d1 + brn.bias).detach().unsqueeze(0))


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
    (["agent.memory.obs_dtype=float16"], 436),  # SLM-Lab's float16 replay observations, stored in the checkpoint
])
def test_resume_is_exact(tmp_path, extra, stop_frame):
    overrides = [*SMALL, "env.max_frame=800", "meta.log_frequency=200", "agent.memory.checkpoint=true", *extra]
    # (a later env.max_frame in extra wins)
    straight = assert_resume_exact(tmp_path, "crossq_pendulum", overrides, stop_frame, spec_file=PENDULUM)
    assert straight.clock.opt_step > 0 and straight.train_df.alpha.iloc[-1] != 1.0
    assert int(straight.algorithm.nets["q1_net"].body[1].step) == straight.clock.opt_step
    obs_dtype = np.float16 if "agent.memory.obs_dtype=float16" in extra else np.float32
    assert straight.algorithm.memory.data["obs"].dtype == obs_dtype


def test_policy_delay_steps_the_actor_once_per_three_critic_steps(tmp_path):
    """SLM-Lab's CrossQ specs' ``policy_delay: 3``: Adam's step count of the actor and of log_alpha is
    opt_step // 3 (critic steps 3, 6, ...), the critics' is opt_step."""
    from orchestrator.session.loop import Session
    from orchestrator.spec.load import load_spec

    spec = load_spec(PENDULUM, "crossq_pendulum", [*SMALL, "env.max_frame=600", "agent.algorithm.policy_delay=3"])
    session = Session(spec, 3)
    session.run_rl()
    algo, n = session.algorithm, session.clock.opt_step
    assert n >= 6
    steps = {name: int(next(iter(opt.state.values()))["step"]) for name, opt in algo.optims.items()}
    assert steps == {k: n if k.startswith("q") else n // 3 for k in steps}


@pytest.mark.slm_lab_specs
def test_critic_net_spec_builds_the_critics():
    """SLM-Lab's agent.critic_net: SAC's critics (and their optimizer, loss, clip) come from it; CrossQ builds
    SLM-Lab's crossq_cartpole critics from its TorchArc arc with LazyBatchRenorm1d layers (materialized)."""
    critic = ('agent.critic_net={"type": "MLPNet", "hid_layers": [7], "clip_grad_val": 0.5, '
              '"optim_spec": {"name": "Adam", "lr": 0.002}, "loss_spec": {"name": "SmoothL1Loss"}}')
    sac = make_algo("sac_pendulum", [*SMALL, critic], spec_file=PENDULUM, obs_space=gym.spaces.Box(
        -8.0, 8.0, (3,), np.float32), action_space=gym.spaces.Box(-2.0, 2.0, (1,), np.float32))
    assert sac.nets["q1_net"].body[1].out_features == 7 and sac.nets["net"].body[1].out_features == 16
    assert sac.optims["q1_net"].param_groups[0]["lr"] == 0.002 and sac.clip_grad_vals["q2_net"] == 0.5
    assert sac.optims["net"].param_groups[0]["lr"] != 0.002 and sac.clip_grad_vals["net"] is None
    assert isinstance(sac.loss_fn, torch.nn.SmoothL1Loss)
    slm = SLM_SPECS / "benchmark" / "crossq" / "crossq_classic.yaml"
    crossq = make_algo("crossq_cartpole", [], spec_file=str(slm))
    assert "target_q1_net" not in crossq.nets
    brns = [m for m in crossq.nets["q1_net"].modules() if isinstance(m, BatchRenorm1d)]
    assert len(brns) == 2 and brns[0].weight.shape == (256,) and brns[0].warmup_steps == 5000
    assert crossq.optims["q1_net"].param_groups[0]["lr"] == 3e-4


@pytest.mark.slm_lab_specs
def test_net_batch_norm_builds_batch_norm_critics_as_slm_lab(tmp_path):
    """SLM-Lab's roadmap ``crossq_cartpole`` (``net.batch_norm: true``, no critic_net): the critics are MLPNets of
    agent.net with a BatchNorm1d after each hidden Linear (SLM-Lab v5.3's CrossQ builds them from net_spec), no
    targets; one critic_preds call records the 2B rows' statistics in train mode, actor_losses switch to eval."""
    from agents.nets import MLPNet, RowBatchNorm1d
    algo = make_algo("crossq_cartpole", ["agent.memory.batch_size=8"], num_envs=4,
                     spec_file=str(SLM_SPECS / "experimental" / "roadmap" / "sac_crossq_cartpole.yaml"))
    assert set(algo.nets) == {"net", "q1_net", "q2_net", "log_alpha"}
    critic = algo.nets["q1_net"]
    assert type(critic) is MLPNet and [type(m) for m in critic.body][1:4] == [
        torch.nn.Linear, RowBatchNorm1d, torch.nn.ReLU]
    rng = np.random.default_rng(0)
    for _ in range(4):
        obs = rng.standard_normal((4, 4)).astype(np.float32)
        algo.memory.add(obs, rng.integers(0, 2, 4), np.ones(4, np.float32), obs, np.zeros(4, bool), np.zeros(4, bool))
    batch = sample_batch(algo, Clock(100, 4))
    _, q_all, _ = algo.critic_preds(batch, algo.alpha)
    assert int(critic.body[2].num_batches_tracked) == 1 and critic.training
    algo.actor_losses(batch["obs"], algo.alpha, q_all)
    assert not critic.training
