"""SoftActorCritic (Haarnoja et al. 2018): tanh log-prob correction, soft targets and temperature losses by
hand (continuous and discrete), exact resume with log_alpha and its optimizer, the refill gate, SLM-Lab's
SAC specs."""

import io
import math
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.distributions import Normal

from agents import policy
from agents.algorithms import sac
from envs.clock import Clock
from tests.agents.algorithms.helpers import assert_resume_exact, drive, make_algo, run_slm_dev, stop_then_resume
from tests.orchestrator.session.test_resume_exact import load_spec

PENDULUM = str(Path(__file__).resolve().parents[3] / "specs" / "benchmark" / "pendulum.json")
PEND_OBS = gym.spaces.Box(-8.0, 8.0, (3,), np.float32)
PEND_ACT = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
SMALL = ["agent.net.hid_layers=[16]", "agent.memory.batch_size=16", "agent.algorithm.training_iter=1",
         "agent.algorithm.training_frequency=4", "agent.algorithm.training_start_step=200"]
CARTPOLE = ["env.name=CartPole-v1", "agent.algorithm.action_pdtype=Categorical"]


def sac_algo(overrides, discrete=False):
    spaces = {} if discrete else {"obs_space": PEND_OBS, "action_space": PEND_ACT}
    return make_algo("sac_pendulum", [*SMALL, *overrides], spec_file=PENDULUM, **spaces)


def zero_critics(algo, q1_bias, q2_bias):
    with torch.no_grad():
        for k, bias in (("q1_net", q1_bias), ("q2_net", q2_bias)):
            for name in (k, f"target_{k}"):
                for p in algo.nets[name].parameters():
                    p.zero_()
                algo.nets[name].heads[0][0].bias.copy_(torch.tensor(bias))


def test_tanh_log_prob_correction_hand_computed():
    """mean 1, std 0.5, the mode: u = 1, a = tanh 1 = 0.76159; log N(1; 1, 0.5) = ln 2 - 0.5 ln(2 pi) =
    -0.22579; log(1 - tanh(1)^2) = -0.86756; log pi(a) = -0.22579 + 0.86756 = 0.64177."""
    pdparam = torch.tensor([[1.0, math.log(0.5)]])
    act, logp = policy.tanh_gaussian_sample(pdparam, torch.Generator(), deterministic=True)
    assert act.item() == pytest.approx(math.tanh(1.0))
    expected = math.log(2) - 0.5 * math.log(2 * math.pi) - math.log(1 - math.tanh(1.0) ** 2)
    assert logp.item() == pytest.approx(expected, rel=1e-6) and expected == pytest.approx(0.64177, abs=1e-5)
    # sampled: the change of variables, checked against torch's Normal at u = atanh(a), summed over A = 2
    pdparam = torch.tensor([[0.3, -0.2, -0.5, 0.1]]).repeat(64, 1)
    act, logp = policy.tanh_gaussian_sample(pdparam, torch.Generator().manual_seed(0))
    u = torch.atanh(act.double())
    ref = Normal(pdparam[:, :2].double(), pdparam[:, 2:].double().exp()).log_prob(u) - torch.log1p(-act.double() ** 2)
    torch.testing.assert_close(logp.double(), ref.sum(-1), rtol=1e-4, atol=1e-4)


def test_log_std_clamped_to_slm_labs_range():
    """SLM-Lab v5.3's policy_util clamps every Gaussian log-std to [-5, 2]: a head asking for log-std -9 samples
    with std exp(-5) and its mode's log pi is -(-5) - 0.5 ln(2 pi) per dim (u = 0: no tanh correction); +7 gives
    std exp(2); the clamp passes no gradient beyond its bounds."""
    assert (policy.LOG_STD_MIN, policy.LOG_STD_MAX) == (-5.0, 2.0)
    pdparam = torch.tensor([[0.0, -9.0]], requires_grad=True)
    _, logp = policy.tanh_gaussian_sample(pdparam, torch.Generator(), deterministic=True)
    assert logp.item() == pytest.approx(5.0 - 0.5 * math.log(2 * math.pi), rel=1e-6)
    logp.sum().backward()
    assert pdparam.grad[0, 1].item() == 0.0
    gen = torch.Generator().manual_seed(3)
    eps = torch.randn((1000, 1), generator=torch.Generator().manual_seed(3))
    act, _ = policy.tanh_gaussian_sample(torch.tensor([[0.0, 7.0]]).repeat(1000, 1), gen)
    torch.testing.assert_close(act, torch.tanh(math.exp(2.0) * eps))


def test_continuous_soft_target_and_losses_hand_computed(monkeypatch):
    """Target critics 1 and 2 (min 1), alpha 0.5, a' sampled with log pi = 0.5: V' = 1 - 0.25 = 0.75, y = 1 + 0.9 *
    0.75 = 1.675 (0 bootstrap when terminated: y = 1). Temperature loss with log pi = 0.2, -0.4 and H_target = -1:
    -0.5 * mean(-0.8, -1.4) = 0.55, also its gradient in log_alpha."""
    algo = sac_algo(["agent.algorithm.gamma=0.9"])
    assert algo.target_entropy == -1.0 and set(algo.optims) == {"net", "critics", "log_alpha"}
    zero_critics(algo, [1.0], [2.0])
    with torch.no_grad():
        algo.nets["log_alpha"].value.fill_(math.log(0.5))
    fixed = {"logp": torch.tensor([0.5, 0.5])}
    monkeypatch.setattr(sac.policy, "tanh_gaussian_sample", lambda pdparam, gen, det=False: (
        torch.zeros(len(pdparam), 1), fixed["logp"]))
    batch = {"next_obs": torch.zeros(2, 3), "reward": torch.ones(2), "terminated": torch.tensor([0.0, 1.0])}
    torch.testing.assert_close(algo.soft_target(batch, algo.alpha), torch.tensor([1.675, 1.0]))
    fixed["logp"] = torch.tensor([0.2, -0.4], requires_grad=True)
    policy_loss, alpha_loss = algo.actor_losses(torch.zeros(2, 3), algo.alpha, None)
    assert alpha_loss.item() == pytest.approx(0.55, rel=1e-6)
    assert policy_loss.item() == pytest.approx(0.5 * -0.1 - 1.0, rel=1e-6)  # alpha * mean(logp) - min Q
    alpha_loss.backward()
    assert algo.nets["log_alpha"].value.grad.item() == pytest.approx(0.55, rel=1e-6)


def test_discrete_soft_target_and_temperature_loss_hand_computed():
    """CartPole, uniform policy (zero actor: pi = 1/2), target critics (1, 3) and (3, 1): mean Q = 2 for both
    actions, alpha 1: V' = sum_a 0.5 (2 + ln 2) = 2.69315, y = 1 + 0.5 V' = 2.34657. H = ln 2,
    H_target = 0.6 ln 2: temperature loss -(1 * (0.6 ln 2 - ln 2)) = 0.4 ln 2."""
    algo = make_algo("sac_pendulum", [*SMALL, *CARTPOLE, "agent.algorithm.gamma=0.5"], spec_file=PENDULUM)
    assert algo.discrete and algo.target_entropy == pytest.approx(0.6 * math.log(2))
    zero_critics(algo, [1.0, 3.0], [3.0, 1.0])
    with torch.no_grad():
        for p in algo.nets["net"].parameters():
            p.zero_()
    batch = {"next_obs": torch.zeros(1, 4), "reward": torch.ones(1), "terminated": torch.zeros(1)}
    assert algo.soft_target(batch, algo.alpha).item() == pytest.approx(1 + 0.5 * (2 + math.log(2)), rel=1e-6)
    q_all = (torch.tensor([[1.0, 3.0]]), torch.tensor([[3.0, 1.0]]))
    policy_loss, alpha_loss = algo.actor_losses(torch.zeros(1, 4), algo.alpha, q_all)
    assert policy_loss.item() == pytest.approx(-math.log(2) - 2.0, rel=1e-6)  # sum_a 0.5 (ln 0.5 - 2)
    assert alpha_loss.item() == pytest.approx(0.4 * math.log(2), rel=1e-6)


def test_env_gets_rescaled_actions_and_random_warmup():
    """Box actions in [-1, 1] map to Pendulum's [-2, 2]; uniform random actions before training_start_step."""
    algo = sac_algo([])
    np.testing.assert_allclose(algo.env_action(np.array([[-1.0], [0.0], [0.5], [1.0]])), [[-2], [0], [1], [2]])
    from envs.clock import Clock
    clock = Clock(1000, 4)
    warm = algo.act(np.zeros((4, 3), np.float32), clock)
    assert warm.shape == (4, 1) and (np.abs(warm) <= 1).all()


def test_policy_actions_are_tanh_gaussian_samples_bit_for_bit():
    """After the warm-up, ``act`` draws what ``tanh_gaussian_sample`` would from the same generator state (its
    action, bit for bit, and the same draws consumed), sampled and deterministic, without computing a log-prob."""
    algo = sac_algo([])
    clock = Clock(1000, 4)
    clock.frame = 500  # past training_start_step 200
    obs = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    for deterministic in (False, True):
        state = algo.gen.get_state()
        act = algo.act(obs, clock, deterministic=deterministic)
        after = algo.gen.get_state()
        algo.gen.set_state(state)
        with torch.no_grad():
            ref, _ = policy.tanh_gaussian_sample(algo.nets["net"](torch.as_tensor(obs)), algo.gen, deterministic)
        assert torch.equal(after, algo.gen.get_state())
        np.testing.assert_array_equal(act, ref.numpy())
        assert act.shape == (4, 1)
    assert not np.array_equal(algo.act(obs, clock), algo.act(obs, clock))  # sampled: fresh draws at each call


RESUME = ["env.max_frame=800", "meta.log_frequency=200"]


@pytest.mark.parametrize("extra, stop_frame", [
    (["agent.memory.checkpoint=true"], 536),
    (["agent.memory.checkpoint=true", "agent.memory.name=PrioritizedReplay", "agent.net.update_type=replace",
      "agent.net.update_frequency=40"], 452),
    (["agent.memory.checkpoint=true", *CARTPOLE], 336),
])
def test_resume_is_exact(tmp_path, extra, stop_frame):
    straight = assert_resume_exact(tmp_path, "sac_pendulum", [*SMALL, *RESUME, *extra], stop_frame, spec_file=PENDULUM)
    df = straight.train_df
    assert straight.clock.opt_step > 0 and df.alpha.iloc[-1] != 1.0 and not df.q_loss.isna().all()


def test_refill_gate_after_resume_without_the_replay(tmp_path):
    spec = load_spec(PENDULUM, "sac_pendulum", [*SMALL, "env.max_frame=800", "meta.log_frequency=40"])
    predir = str(tmp_path / "sac_pendulum_2026_01_01_000000")
    opt_step_at_stop, df = stop_then_resume(spec, predir, 400)
    assert opt_step_at_stop > 0
    after = df[df.frame > 400]
    refill = after[after.refill]
    assert len(refill) > 0 and refill.frame.max() <= 400 + 200
    assert (refill.opt_step == opt_step_at_stop).all() and after.opt_step.iloc[-1] > opt_step_at_stop


@pytest.mark.parametrize("rel_file, name", [
    ("benchmark/sac/sac_pendulum.json", "sac_pendulum"),
    ("benchmark/sac/sac_cartpole.json", "sac_cartpole"),
    ("benchmark/sac/sac_acrobot.json", "sac_acrobot"),
])
def test_slm_lab_spec_runs_unmodified(tmp_path, rel_file, name):
    run_slm_dev(tmp_path, rel_file, name)


def test_slm_lab_temperature_keys_alpha_lr_and_log_alpha_bounds():
    """SLM-Lab v5.3's ``alpha_lr`` sets the temperature optimizer's lr; ``log_alpha_max`` clamps log_alpha."""
    from orchestrator.session.loop import Session
    from orchestrator.spec.load import load_spec

    spec = load_spec(PENDULUM, "sac_pendulum", ["env.max_frame=300", "agent.algorithm.training_start_step=100",
                                                "agent.memory.batch_size=16", "agent.algorithm.alpha_lr=3e-5",
                                                "agent.algorithm.log_alpha_max=-1.0"])
    session = Session(spec, 1)
    assert session.algorithm.optims["log_alpha"].param_groups[0]["lr"] == 3e-5
    session.run_rl()
    # from 0, at lr 3e-5 it would stay near 0: the clamp at the first step put it at -1
    assert session.clock.opt_step > 0 and -1.1 < float(session.algorithm.nets["log_alpha"].value.detach()) <= -1.0


def test_gumbel_softmax_pdtype_is_the_categorical_discrete_sac():
    """SLM-Lab's discrete SAC specs write action_pdtype GumbelSoftmax: the same algorithm, same actions."""
    obs = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    acts = []
    for pdtype in ("Categorical", "GumbelSoftmax"):
        algo = make_algo("sac_pendulum", [*SMALL, "env.name=CartPole-v1", f"agent.algorithm.action_pdtype={pdtype}",
                                          "agent.algorithm.training_start_step=1"], spec_file=PENDULUM)
        clock = Clock(100, 5)
        clock.frame = 10
        acts.append(algo.act(obs, clock))
    assert acts[0].dtype == np.int64 and acts[0].shape == (5,)
    np.testing.assert_array_equal(acts[0], acts[1])


def test_actor_loss_leaves_no_gradient_on_the_critics():
    """The actor's loss reaches the policy through the critics' inputs only: after its backward the actor has
    gradients, the critics none, and the critics' weights take gradients again afterwards."""
    algo = sac_algo([])
    obs = torch.randn(8, 3)
    policy_loss, _ = algo.actor_losses(obs, algo.alpha, None)
    policy_loss.backward()
    assert all(p.grad is not None for p in algo.nets["net"].parameters())
    assert algo.critics is not None and len(algo.critic_params()) == 4  # the stack's (2, out, in) weights and biases
    assert all(p.grad is None and p.requires_grad for p in algo.critic_params())


def separate_critics_algo(monkeypatch, overrides):
    """``sac_algo`` with the critics built as two nets with two optimizers (``stack_critics`` off)."""
    with monkeypatch.context() as m:
        m.setattr(sac.SoftActorCritic, "stack_critics", False)
        algo = sac_algo(overrides)
    assert algo.critics is None and {"q1_net", "q2_net"} <= set(algo.optims)
    return algo


@pytest.mark.parametrize("extra", [[], ["agent.memory.name=PrioritizedReplay"]])
def test_stacked_critics_train_as_two_separate_critics(monkeypatch, extra):
    """Same seed, same replay: the stacked critics (one StackedMLP, one optimizer) and two separate critics
    give the same critics, targets, actor, temperature and metrics after 11 updates (to float rounding: batched
    vs plain matmuls); a critic clip_grad_val keeps them separate (each critic clipped to its own norm)."""
    stacked, separate = sac_algo(extra), separate_critics_algo(monkeypatch, extra)
    assert stacked.critics is not None and set(stacked.optims) == {"net", "critics", "log_alpha"}
    for name in stacked.nets:
        assert all(torch.equal(a, b) for a, b in zip(stacked.nets[name].state_dict().values(),
                                                      separate.nets[name].state_dict().values())), name
    clocks = [Clock(10_000, 1), Clock(10_000, 1)]
    updates = [drive(algo, clock, 240, seed=3) for algo, clock in zip((stacked, separate), clocks)]
    assert updates[0] == updates[1] == 11 and clocks[0].opt_step == clocks[1].opt_step == 11
    for name in stacked.nets:
        for (key, a), b in zip(stacked.nets[name].state_dict().items(), separate.nets[name].state_dict().values()):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=f"{name}.{key}")
    assert not torch.equal(stacked.nets["q1_net"].body[1].weight, stacked.nets["target_q1_net"].body[1].weight)
    for clock in clocks:
        clock.frame += 4  # one more training round
    stats = [algo.update(clock).resolved() for algo, clock in zip((stacked, separate), clocks)]
    assert stats[0].metrics.keys() == stats[1].metrics.keys() and not math.isnan(stats[0].metrics["q_loss"])
    for k, v in stats[0].metrics.items():
        assert v == pytest.approx(stats[1].metrics[k], rel=1e-3, abs=1e-5), k
    assert sac_algo(["agent.net.clip_grad_val=1.0"]).critics is None


def test_checkpoint_with_per_critic_optimizers_loads_into_the_stack(monkeypatch):
    """A state written with the two critic optimizers q1_net / q2_net (before the stacked critics) resumes into
    the stacked critics: same weights, the stack's Adam moments are the two critics' stacked, and the next
    update matches the separate critics' one."""
    separate, stacked = separate_critics_algo(monkeypatch, []), sac_algo([])
    clock = Clock(10_000, 1)
    drive(separate, clock, 220, seed=4)
    buf = io.BytesIO()
    torch.save(separate.state_dict(with_memory=True), buf)  # as a checkpoint holds it (no tensor shared)
    buf.seek(0)
    assert stacked.load_state_dict(torch.load(buf, weights_only=False))
    assert stacked.weights_sha256() == separate.weights_sha256()
    adam = stacked.optims["critics"].state
    w = stacked.critics.weights[1]  # both critics' head weights (2, 1, 16) (SMALL: one hidden layer of 16)
    q1_adam, q2_adam = separate.optims["q1_net"].state, separate.optims["q2_net"].state
    torch.testing.assert_close(adam[w]["exp_avg"][0], q1_adam[separate.nets["q1_net"].heads[0][0].weight]["exp_avg"],
                               rtol=0, atol=0)
    torch.testing.assert_close(adam[w]["exp_avg_sq"][1],
                               q2_adam[separate.nets["q2_net"].heads[0][0].weight]["exp_avg_sq"], rtol=0, atol=0)
    assert int(adam[w]["step"]) == int(q1_adam[separate.nets["q1_net"].heads[0][0].weight]["step"]) > 0
    clock2 = Clock(10_000, 1)
    clock2.load_state_dict(clock.state_dict())
    drive(separate, clock, 8, seed=5)
    drive(stacked, clock2, 8, seed=5)
    for name in stacked.nets:
        for a, b in zip(stacked.nets[name].state_dict().values(), separate.nets[name].state_dict().values()):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_stacked_critics_are_global_nets_under_meta_distributed():
    """meta.distributed shares the nets every optimizer steps: the critics (views of the stepped stack) are among
    them, their targets (views of the target stack, stepped by none) are not."""
    from orchestrator.global_params import global_net_names

    assert global_net_names(sac_algo([])) == ["net", "q1_net", "q2_net", "log_alpha"]


def test_init_from_transfer_reaches_the_stacked_critics(monkeypatch):
    """``agent.net.init_from`` loads each net's state_dict in place
    (``orchestrator.session.transfer.init_nets``): into the
    stacked critics' member nets, it sets the stack, so the twin Q-values are the source critics' (a source with
    separate critics, as an older checkpoint, included); the layer check passes."""
    from orchestrator.session.transfer import mismatches, net_states

    source, target = separate_critics_algo(monkeypatch, []), sac_algo([])
    with torch.no_grad():
        for p in source.nets["q2_net"].parameters():
            p.mul_(-2.0)  # make the source's critics differ from the fresh target's
    buf = io.BytesIO()
    torch.save({"algorithm": source.state_dict()}, buf)
    nets = net_states({"state.pt": buf.getvalue()})
    assert mismatches(target, nets, "here") == []
    with torch.no_grad():
        for name, net in target.transfer_nets().items():
            net.load_state_dict(nets[name])
    obs, act = torch.randn(5, 3), torch.rand(5, 1) * 2 - 1
    expected = torch.stack([source.nets[k](obs, act).squeeze(-1) for k in ("q1_net", "q2_net")])
    torch.testing.assert_close(target.twin_q(obs, act), expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(target.twin_q(obs, act, target=True), torch.stack(
        [source.nets[f"target_{k}"](obs, act).squeeze(-1) for k in ("q1_net", "q2_net")]), rtol=0, atol=1e-6)


@pytest.mark.parametrize("iter_override, steps_per_round", [([], 4), (["agent.algorithm.training_iter=2"], 2)])
def test_one_round_per_vector_step_of_training_iter_steps(iter_override, steps_per_round):
    """SLM-Lab v5.3's SAC cadence at training_frequency 1 with N = 4 sub-envs: one round per vector step
    (not one per frame), of ``training_iter`` gradient steps, ``num_envs`` when unset (SLM-Lab's default):
    110 vector steps, training from the 50th (the replay then holds 200 transitions): 61 rounds, 244 or 122
    critic steps."""
    overrides = [*SMALL, "agent.algorithm.training_frequency=1", "agent.algorithm.training_iter=null", *iter_override]
    algo = make_algo("sac_pendulum", overrides, num_envs=4, spec_file=PENDULUM, obs_space=PEND_OBS,
                     action_space=PEND_ACT)
    clock = Clock(10_000, 4)
    assert drive(algo, clock, 110) == 61
    assert clock.opt_step == 61 * steps_per_round
