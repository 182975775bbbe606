"""Seed-batched building blocks (agents.batched) against K separate copies, value by value."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from agents.batched import BatchedActorCritic, BatchedPPO, SeedMLP, batch_problem, batched_algorithm, seed_linear
from agents.batched.algorithm import SeedMeanLoss, seed_rows
from agents.batched.memory import join_seed_memories, seed_memory
from agents.batched.optim import clip_grads_per_seed, load_seed_optim_state, seed_optim_state
from agents.memory import OnPolicyBatchReplay
from agents.nets import MLPNet, make_optim
from agents.returns import standardize
from envs.clock import Clock
from orchestrator.spec.load import build, load_spec
from tests.agents.algorithms.helpers import CARTPOLE_ACT, CARTPOLE_OBS, SPECS, make_algo
from tests.agents.batched.helpers import SEEDS, agent_spec, drive_pair


def test_seed_linear_equals_k_separate_linears():
    torch.manual_seed(0)
    lins = [nn.Linear(5, 3) for _ in range(4)]
    x = torch.randn(4, 7, 5)
    w = torch.stack([lin.weight.detach() for lin in lins])
    b = torch.stack([lin.bias.detach() for lin in lins]).unsqueeze(1)
    out = seed_linear(x, w, b)
    assert out.shape == (4, 7, 3)
    for k, lin in enumerate(lins):
        torch.testing.assert_close(out[k], lin(x[k]), rtol=0, atol=1e-6)


def test_seed_mlp_forward_and_members_are_the_separate_nets():
    nets = []
    for seed in SEEDS:
        torch.manual_seed(seed)
        nets.append(MLPNet(4, 2, [64, 64], "tanh", "orthogonal_", head_gains=[0.01]))
    before = [{k: v.clone() for k, v in net.state_dict().items()} for net in nets]
    x = torch.randn(len(SEEDS), 9, 4)
    expected = [net(x[k]) for k, net in enumerate(nets)]
    stack = SeedMLP(nets)
    out = stack(x)
    for k in range(len(SEEDS)):
        torch.testing.assert_close(out[k], expected[k], rtol=0, atol=1e-6)
        for name, value in nets[k].state_dict().items():  # the members now show their slice of the stack
            assert torch.equal(value, before[k][name]), name
    with torch.no_grad():
        stack.weights[0][1].add_(1.0)  # seed 1's first layer changes in its member, only there
    assert torch.equal(nets[1].state_dict()["body.1.weight"], before[1]["body.1.weight"] + 1.0)
    assert torch.equal(nets[0].state_dict()["body.1.weight"], before[0]["body.1.weight"])


def test_clip_grads_per_seed_by_hand():
    w = nn.Parameter(torch.zeros(3, 1, 2))
    b = nn.Parameter(torch.zeros(3, 1, 1))
    # seed norms over (w, b): seed 0 sqrt(9 + 16 + 0) = 5, seed 1 0.3, seed 2 sqrt(25 + 144 + 0) = 13
    w.grad = torch.tensor([[[3.0, 4.0]], [[0.3, 0.0]], [[5.0, 12.0]]])
    b.grad = torch.zeros(3, 1, 1)
    norms = clip_grads_per_seed([w, b], max_norm=1.0)
    torch.testing.assert_close(norms, torch.tensor([5.0, 0.3, 13.0]))
    torch.testing.assert_close(w.grad[0, 0], torch.tensor([3.0, 4.0]) / (5 + 1e-6))
    torch.testing.assert_close(w.grad[1, 0], torch.tensor([0.3, 0.0]))  # under the norm: unchanged
    torch.testing.assert_close(w.grad[2, 0], torch.tensor([5.0, 12.0]) / (13 + 1e-6))
    # against nn.utils.clip_grad_norm_ of each seed's separate tensors
    torch.manual_seed(1)
    stacks = [nn.Parameter(torch.zeros(4, 3, 5)), nn.Parameter(torch.zeros(4, 1, 3))]
    for p in stacks:
        p.grad = torch.randn_like(p) * torch.tensor([0.01, 1.0, 3.0, 0.2]).view(4, 1, 1)
    separate = [[nn.Parameter(torch.zeros(p.shape[1:])) for p in stacks] for _ in range(4)]
    for k, params in enumerate(separate):
        for p, s in zip(params, stacks):
            p.grad = s.grad[k].clone()
    norms = clip_grads_per_seed(stacks, max_norm=0.5)
    for k, params in enumerate(separate):
        norm = nn.utils.clip_grad_norm_(params, 0.5)
        torch.testing.assert_close(norms[k], norm)
        for p, s in zip(params, stacks):
            torch.testing.assert_close(s.grad[k], p.grad, rtol=0, atol=1e-7)
    assert clip_grads_per_seed([nn.Parameter(torch.zeros(2, 2))], 1.0) is None  # no gradient: nothing to clip


def test_per_seed_advantage_normalization_by_hand():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0], [2.0, 2.0, 2.0, 6.0]])
    out = standardize(x)
    std0, std1 = math.sqrt(5 / 3), math.sqrt(12 / 3)  # unbiased: sum of squares / (B - 1)
    torch.testing.assert_close(out[0], (x[0] - 2.5) / (std0 + 1e-8))
    torch.testing.assert_close(out[1], (x[1] - 3.0) / (std1 + 1e-8))
    for k in range(2):  # each row exactly what a separate (B,) call gives
        assert torch.equal(out[k], standardize(x[k]))
    assert torch.equal(standardize(torch.ones(3, 1)), torch.ones(3, 1))  # B = 1: unchanged


def test_seed_mean_loss_is_the_loss_per_row():
    pred, target = torch.randn(3, 10), torch.randn(3, 10)
    for loss in (nn.MSELoss(), nn.SmoothL1Loss(beta=0.5), nn.HuberLoss(delta=2.0)):
        out = SeedMeanLoss(loss)(pred, target)
        assert out.shape == (3,)
        for k in range(3):
            torch.testing.assert_close(out[k], loss(pred[k], target[k]))


ADAM = {"name": "Adam", "lr": 0.01, "eps": 1e-5}


def _stepped_adams(k: int = 4):
    """Stacked parameters stepped by one Adam, and K separate parameter sets stepped by K Adams, same grads."""
    torch.manual_seed(2)
    stacks = [nn.Parameter(torch.randn(k, 8, 3)), nn.Parameter(torch.randn(k, 1, 8))]
    separate = [[nn.Parameter(s.detach()[i].clone()) for s in stacks] for i in range(k)]
    group = make_optim(stacks, ADAM)
    singles = [make_optim(params, ADAM) for params in separate]
    for _ in range(5):
        grads = [torch.randn_like(s) for s in stacks]
        for s, g in zip(stacks, grads):
            s.grad = g.clone()
        group.step()
        for i, (params, optim) in enumerate(zip(separate, singles)):
            for p, g in zip(params, grads):
                p.grad = g[i].clone()
            optim.step()
    return stacks, group, separate, singles


def test_adam_over_stacks_equals_k_separate_adams():
    stacks, _, separate, _ = _stepped_adams()
    for i, params in enumerate(separate):  # elementwise: bit for bit
        for p, s in zip(params, stacks):
            assert torch.equal(s.detach()[i], p.detach())


def test_seed_optim_state_is_the_separate_optimizers_state():
    stacks, group, _, singles = _stepped_adams()
    # seed 2's slice of the state, as its own optimizer's state_dict, and back into a fresh group optimizer
    slots = [(stacks[0], False), (stacks[1], False)]
    state = seed_optim_state(group, singles[2], slots, 2)
    ref = singles[2].state_dict()
    for i in range(2):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(state["state"][i][key], ref["state"][i][key]), key
    fresh = make_optim(stacks, ADAM)
    for i in range(len(singles)):
        load_seed_optim_state(fresh, slots, i, seed_optim_state(group, singles[i], slots, i))
    for s in stacks:
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(fresh.state[s][key], group.state[s][key]), key


@pytest.mark.parametrize("name,cls", [("ppo_cartpole", BatchedPPO), ("a2c_gae_cartpole", BatchedActorCritic)])
def test_batched_update_equals_separate_updates(name, cls):
    n = 4
    spec = agent_spec(name, ["agent.algorithm.training_epoch=3"] if name == "ppo_cartpole" else [])
    group = batched_algorithm(spec.algorithm.name)(spec, CARTPOLE_OBS, CARTPOLE_ACT, n, SEEDS)
    assert isinstance(group, cls)
    separate = [make_algo(name, ["agent.algorithm.training_epoch=3"] if name == "ppo_cartpole" else [], n, s)
                for s in SEEDS]
    for member, algo in zip(group.members, separate):  # seed k starts as the separate session of seed k
        assert member.weights_sha256() == algo.weights_sha256()
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((len(SEEDS) * n, 4)).astype(np.float32)
    horizon = group.horizon()
    obs, clock, clocks = drive_pair(group, separate, n, horizon, rng, obs)
    assert group.train_ready(clock) and all(a.train_ready(c) for a, c in zip(separate, clocks))
    stats = group.update(clock)
    for k, (algo, c) in enumerate(zip(separate, clocks)):
        ref = algo.update(c)
        assert clock.opt_step == c.opt_step
        assert stats[k].loss == pytest.approx(ref.loss, rel=1e-5)
        assert stats[k].grad_norm == pytest.approx(ref.grad_norm, rel=1e-5)
        assert stats[k].entropy == pytest.approx(ref.entropy, rel=1e-5)
        for metric in algo.metric_names:
            assert stats[k].metrics[metric] == pytest.approx(ref.metrics[metric], rel=1e-4, abs=1e-6), metric
        mine, theirs = group.members[k].state_dict()["nets"], algo.state_dict()["nets"]
        for net in theirs:
            for key in theirs[net]:
                torch.testing.assert_close(mine[net][key], theirs[net][key], rtol=0, atol=1e-5)
        assert group.members[k].current_lr() == algo.current_lr()
    # the seeds differ from each other (independent inits and streams)
    assert len({m.weights_sha256()["actor"] for m in group.members}) == len(SEEDS)


def test_seed_states_restore_the_group_exactly_and_load_into_separate_algorithms():
    n = 4
    overrides = ["agent.algorithm.training_epoch=2", "agent.algorithm.time_horizon=8"]
    spec = agent_spec("ppo_cartpole", overrides)
    group = BatchedPPO(spec, CARTPOLE_OBS, CARTPOLE_ACT, n, SEEDS)
    rng = np.random.default_rng(3)
    obs = rng.standard_normal((len(SEEDS) * n, 4)).astype(np.float32)
    clock = Clock(10 ** 9, n)

    def drive(algo, steps, obs, rng, clock):
        for _ in range(steps):
            act = algo.act(obs, clock)
            nxt = rng.standard_normal(obs.shape).astype(np.float32)
            term = rng.random(len(obs)) < 0.1
            algo.memory.add(obs, act, rng.random(len(obs)).astype(np.float32), nxt, term, np.zeros(len(obs), bool))
            clock.tick(term[:n])
            if algo.train_ready(clock):
                algo.update(clock)
            obs = nxt
        return obs

    obs = drive(group, 11, obs, rng, clock)  # one update, then 3 steps of a partial rollout
    states = [group.seed_state_dict(k, with_memory=True) for k in range(len(SEEDS))]
    saved = (obs.copy(), clock.state_dict(), rng.bit_generator.state)
    drive(group, 13, obs, rng, clock)  # two more updates, uninterrupted
    restored = BatchedPPO(spec, CARTPOLE_OBS, CARTPOLE_ACT, n, SEEDS)
    assert restored.load_seed_state_dicts(states) == [True] * len(SEEDS)
    clock2 = Clock(10 ** 9, n)
    clock2.load_state_dict(saved[1])
    rng2 = np.random.default_rng()
    rng2.bit_generator.state = saved[2]
    drive(restored, 13, saved[0], rng2, clock2)
    for a, b in zip(group.members, restored.members):
        assert a.weights_sha256() == b.weights_sha256()
    for name in group.optims:
        for s1, s2 in zip(group.optims[name].param_groups, restored.optims[name].param_groups):
            for p1, p2 in zip(s1["params"], s2["params"]):
                for key in ("exp_avg", "exp_avg_sq", "step"):
                    assert torch.equal(group.optims[name].state[p1][key], restored.optims[name].state[p2][key])
    # a seed's state is a separate session's algorithm state of the same spec
    alone = make_algo("ppo_cartpole", overrides, n, SEEDS[1])
    alone.load_state_dict(states[1])
    assert len(alone.memory) == 3
    assert alone.weights_sha256() != restored.members[1].weights_sha256()  # the group trained on since


def test_seed_memory_round_trip():
    k, n = 3, 2
    mem = OnPolicyBatchReplay(10)
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((k * n, 4))
    for t in range(4):
        nxt = rng.standard_normal((k * n, 4))
        done = np.zeros(k * n, bool)
        done[3] = t == 1  # seed 1 ends an episode at step 1: that step stores its own next obs
        mem.add(obs, np.zeros(k * n, np.int64), np.ones(k * n), nxt, done, np.zeros(k * n, bool))
        obs = nxt if t != 1 else rng.standard_normal((k * n, 4))
    state = mem.state_dict()
    parts = [seed_memory(state, i, n) for i in range(k)]
    single = OnPolicyBatchReplay(10)
    single.load_state_dict(parts[1])
    full = OnPolicyBatchReplay(10)
    full.load_state_dict(state)
    popped_single, popped_full = single.pop(), full.pop()
    for key in ("obs", "next_obs", "reward", "terminated"):
        np.testing.assert_array_equal(popped_single[key], popped_full[key][:, n:2 * n])
    joined = join_seed_memories(parts)
    for key, value in state["data"].items():
        np.testing.assert_array_equal(joined["data"][key], value)
    with pytest.raises(ValueError, match="different numbers of steps"):
        join_seed_memories([parts[0], {"data": {}}])


def test_seed_rows_gathers_each_seeds_rows():
    x = torch.arange(2 * 5 * 3).reshape(2, 5, 3)
    idx = torch.tensor([[4, 0], [1, 1]])
    out = seed_rows(x, idx)
    assert torch.equal(out[0], x[0][[4, 0]]) and torch.equal(out[1], x[1][[1, 1]])


def test_unsupported_specs_are_refused_by_name():
    assert "'SARSA' does not run with seeds batched" in batch_problem(agent_spec("sarsa_cartpole"))
    pendulum = str(Path(SPECS).with_name("pendulum.json"))
    crossq = build(load_spec(pendulum, "crossq_pendulum")).agent
    assert "'CrossQ' does not run with seeds batched" in batch_problem(crossq)
    assert batch_problem(build(load_spec(pendulum, "sac_pendulum")).agent) is None
    clipped = build(load_spec(pendulum, "sac_pendulum", ["agent.net.clip_grad_val=1.0"])).agent
    assert "clip_grad_val" in batch_problem(clipped) and "SoftActorCritic" in batch_problem(clipped)
    with pytest.raises(ValueError, match="batched SoftActorCritic needs a Box action space"):
        batched_algorithm("SoftActorCritic")(build(load_spec(pendulum, "sac_pendulum")).agent, CARTPOLE_OBS,
                                             CARTPOLE_ACT, 2, SEEDS)
    assert "'OnPolicyReplay' does not run batched" in batch_problem(agent_spec("reinforce_cartpole"))
    assert "'DuelingMLPNet' does not run batched" in batch_problem(agent_spec("dueling_dqn_cartpole"))
    with pytest.raises(ValueError, match="'SARSA' does not run with seeds batched"):
        batched_algorithm("SARSA")
    for name in ("dqn_cartpole", "ddqn_cartpole", "ddqn_per_cartpole", "vanilla_dqn_cartpole"):
        assert batch_problem(agent_spec(name)) is None, name
    assert batch_problem(agent_spec("reinforce_cartpole", ["agent.memory.name=OnPolicyBatchReplay"])) is None
    problem = batch_problem(agent_spec("ppo_cartpole", ["agent.algorithm.normalize_v_targets=true"]))
    assert "normalize_v_targets" in problem
    with pytest.raises(ValueError, match="normalize_v_targets"):
        BatchedPPO(agent_spec("ppo_cartpole", ["agent.algorithm.normalize_v_targets=true"]), CARTPOLE_OBS,
                   CARTPOLE_ACT, 2, SEEDS)
    assert batch_problem(agent_spec("ppo_cartpole")) is None
