"""Seed-batched REINFORCE, DQN family and SAC (agents.batched.reinforce, .dqn, .sac) against K separate lab
algorithms fed the same transitions, value by value, and their per-seed pieces by hand."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from agents.batched import (
    BatchedDoubleDQN,
    BatchedDQN,
    BatchedReinforce,
    BatchedSAC,
    BatchedVanillaDQN,
    batched_algorithm,
)
from agents.memory import PrioritizedReplay
from envs.clock import Clock
from orchestrator.spec.load import build, load_spec
from tests.agents.algorithms.helpers import CARTPOLE_ACT, CARTPOLE_OBS, SPECS, make_algo
from tests.agents.batched.helpers import (
    SEEDS,
    agent_spec,
    assert_nets_close,
    drive_pair,
    more_steps,
    update_dqn_pair,
)

N = 2
REINFORCE = ["agent.memory.name=OnPolicyBatchReplay", "agent.algorithm.training_frequency=8",
             "agent.net.clip_grad_val=0.1"]
DQN_SMALL = ["agent.algorithm.training_start_step=32", "agent.memory.batch_size=16", "agent.memory.max_size=64",
             "agent.algorithm.training_iter=3", "agent.algorithm.training_batch_iter=2",
             "agent.net.update_frequency=8", "agent.net.clip_grad_val=0.5",
             "agent.algorithm.explore_var_spec.end_step=200", "agent.algorithm.explore_var_spec.end_val=0.3"]


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def _pair(name: str, overrides: list[str]):
    """A group of SEEDS and the separate lab algorithms of the same seeds, equal at the start."""
    spec = agent_spec(name, overrides)
    group = batched_algorithm(spec.algorithm.name)(spec, CARTPOLE_OBS, CARTPOLE_ACT, N, SEEDS)
    separate = [make_algo(name, overrides, N, s) for s in SEEDS]
    for member, algo in zip(group.members, separate):
        assert member.weights_sha256() == algo.weights_sha256()
    return group, separate


def test_batched_reinforce_update_equals_separate_updates():
    group, separate = _pair("reinforce_cartpole", REINFORCE)
    assert isinstance(group, BatchedReinforce)
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((len(SEEDS) * N, 4)).astype(np.float32)
    for _ in range(2):  # two updates: the second from Adam state the first left
        obs, clock, clocks = drive_pair(group, separate, N, 8, rng, obs)
        assert group.train_ready(clock) and all(a.train_ready(c) for a, c in zip(separate, clocks))
        clock.frame = clocks[0].frame = clocks[1].frame = clocks[2].frame = 5000  # a later entropy coefficient
        stats = group.update(clock)
        for k, (algo, c) in enumerate(zip(separate, clocks)):
            ref = algo.update(c)
            assert stats[k].loss == pytest.approx(ref.loss, rel=1e-5, abs=1e-7)
            assert stats[k].entropy == pytest.approx(ref.entropy, rel=1e-5)
            assert stats[k].grad_norm == pytest.approx(ref.grad_norm, rel=1e-5)
            assert stats[k].metrics["policy_loss"] == pytest.approx(ref.metrics["policy_loss"], rel=1e-5, abs=1e-7)
            assert ref.grad_norm > 0.1  # clipped: each seed to its own norm
        assert_nets_close(group, separate)
    assert len({m.weights_sha256()["net"] for m in group.members}) == len(SEEDS)


@pytest.mark.parametrize("name,cls,extra", [
    ("dqn_cartpole", BatchedDQN, []),
    ("dqn_cartpole", BatchedDQN, ["agent.net.update_type=polyak", "agent.net.polyak_coef=0.9"]),
    ("ddqn_cartpole", BatchedDoubleDQN, []),
    ("vanilla_dqn_cartpole", BatchedVanillaDQN, []),
    ("ddqn_per_cartpole", BatchedDoubleDQN, []),
    ("dqn_cartpole", BatchedDQN, ["agent.algorithm.action_policy=boltzmann"]),
])
def test_batched_dqn_update_equals_separate_updates(name, cls, extra):
    group, separate = _pair(name, [*DQN_SMALL, *extra])
    assert isinstance(group, cls)
    rng = np.random.default_rng(1)
    obs = rng.standard_normal((len(SEEDS) * N, 4)).astype(np.float32)
    obs, clock, clocks = drive_pair(group, separate, N, 10, rng, obs)  # 20 transitions per seed: short
    assert not group.train_ready(clock) and not any(a.train_ready(c) for a, c in zip(separate, clocks))
    for _ in range(2):  # two rounds (6 gradient steps each), acting in between
        obs = more_steps(group, separate, N, 8, rng, obs, clock, clocks)
        refs = update_dqn_pair(group, separate, clock, clocks)
        for k, (algo, ref) in enumerate(zip(separate, refs)):
            assert ref.grad_norm > 0.5  # clip_grad_val 0.5: each seed clipped to its own norm
            if isinstance(algo.memory, PrioritizedReplay):
                np.testing.assert_allclose(group.members[k].memory.sum_tree.tree, algo.memory.sum_tree.tree,
                                           rtol=1e-4)
        if group.use_target_net:  # the target updates were due: each seed's own, as its separate one's
            assert group.last_target_frame == separate[0].last_target_frame == clock.frame
        assert_nets_close(group, separate)
    assert len({m.weights_sha256()["net"] for m in group.members}) == len(SEEDS)


def _filled_dqn(name: str = "dqn_cartpole", overrides: list[str] = ()):
    spec = agent_spec(name, [*DQN_SMALL, *overrides])
    group = BatchedDQN(spec, CARTPOLE_OBS, CARTPOLE_ACT, N, SEEDS)
    rng = np.random.default_rng(2)
    k = len(SEEDS)
    for t in range(20):
        obs = rng.standard_normal((k * N, 4)).astype(np.float32)
        group.memory.add(obs, rng.integers(0, 2, k * N), rng.random(k * N).astype(np.float32), obs + 1,
                         np.zeros(k * N, bool), np.zeros(k * N, bool))
    return group, spec


def test_per_seed_replays_hold_each_seeds_columns_and_sample_with_its_own_rng():
    group, _ = _filled_dqn()
    clock = Clock(10 ** 9, N)
    clock.frame = 40
    members = group.members
    for k, m in enumerate(members):  # seed k's replay: its N columns of each step, 40 transitions
        assert len(m.memory) == 40 and group.memory.memories[k] is m.memory
    assert not np.array_equal(members[0].memory.data["obs"][:40], members[1].memory.data["obs"][:40])
    saved = [np.random.default_rng() for _ in members]
    for g, m in zip(saved, members):
        g.bit_generator.state = m.rng.bit_generator.state
    batches = [batch for batch, _ in group.batches(clock, 3)]
    assert len(batches) == 3 and batches[0]["obs"].shape == (len(SEEDS), 16, 4)
    for k, (g, m) in enumerate(zip(saved, members)):
        alone = m.memory.sample_many(g, 3)  # what seed k alone draws from its replay with its generator
        for i, batch in enumerate(batches):
            np.testing.assert_array_equal(batch["obs"][k].numpy(), alone["obs"][i])
            np.testing.assert_array_equal(batch["act"][k].numpy(), alone["act"][i])
        assert m.rng.bit_generator.state == g.bit_generator.state  # each stream advanced by its own draws only
    # independent: seed 1's draws do not depend on seed 0's stream
    members[0].rng = np.random.default_rng(999)
    g1 = np.random.default_rng()
    g1.bit_generator.state = members[1].rng.bit_generator.state
    batch, _ = next(iter(group.batches(clock, 1)))
    np.testing.assert_array_equal(batch["obs"][1].numpy(), members[1].memory.sample_many(g1, 1)["obs"][0])


def test_per_seed_epsilon_draws_from_each_seeds_own_rng():
    group, spec = _filled_dqn(overrides=["agent.algorithm.explore_var_spec.start_val=0.5",
                                         "agent.algorithm.explore_var_spec.end_val=0.5"])
    clock = Clock(10 ** 9, N)
    obs = np.random.default_rng(3).standard_normal((len(SEEDS) * N, 4)).astype(np.float32)
    with torch.no_grad():
        q = [m.nets["net"](torch.as_tensor(obs[k * N:(k + 1) * N])) for k, m in enumerate(group.members)]
    expected = []
    for k, seed in enumerate(SEEDS):  # epsilon-greedy by hand: 2N draws from the seed's own generator
        g = np.random.default_rng(seed)
        explore, random_act = g.random(N) < 0.5, g.integers(0, 2, size=N)
        expected.append(np.where(explore, random_act, q[k].argmax(-1).numpy()))
    np.testing.assert_array_equal(group.act(obs, clock), np.concatenate(expected))
    for m, seed in zip(group.members, SEEDS):
        g = np.random.default_rng(seed)
        g.random(N), g.integers(0, 2, size=N)
        assert m.rng.bit_generator.state == g.bit_generator.state


def test_per_seed_polyak_target_update_by_hand():
    group, _ = _filled_dqn(overrides=["agent.net.update_type=polyak", "agent.net.polyak_coef=0.5"])
    with torch.no_grad():
        group.nets["net"].weights[0][1].add_(1.0)  # seed 1's online net moves; its target follows, alone
    before = [{k: v.clone() for k, v in m.nets["target_net"].state_dict().items()} for m in group.members]
    online = [{k: v.clone() for k, v in m.nets["net"].state_dict().items()} for m in group.members]
    clock = Clock(10 ** 9, N)
    clock.frame = 16  # two multiples of update_frequency 8 crossed: coefficient 1 - 0.5 ** 2
    assert group.update_target(clock) == 2
    for k, m in enumerate(group.members):
        for key, value in m.nets["target_net"].state_dict().items():
            torch.testing.assert_close(value, before[k][key] + 0.75 * (online[k][key] - before[k][key]))
    w = "body.1.weight"
    assert not torch.allclose(group.members[1].nets["target_net"].state_dict()[w], before[1][w])
    torch.testing.assert_close(group.members[0].nets["target_net"].state_dict()[w], before[0][w])  # equal nets


def test_dqn_seed_states_are_separate_sessions_states_and_restore_the_group():
    group, spec = _filled_dqn()
    clock = Clock(10 ** 9, N)
    clock.frame = 40
    group.update(clock)
    states = [group.seed_state_dict(k, with_memory=True) for k in range(len(SEEDS))]
    assert states[1]["extra"] == {"last_train_frame": 40, "last_target_frame": 40}
    alone = make_algo("dqn_cartpole", DQN_SMALL, N, SEEDS[1])
    alone.load_state_dict(states[1])
    assert alone.weights_sha256() == group.members[1].weights_sha256()
    assert len(alone.memory) == 40 and alone.rng.bit_generator.state == group.members[1].rng.bit_generator.state
    restored = BatchedDQN(spec, CARTPOLE_OBS, CARTPOLE_ACT, N, SEEDS)
    assert restored.load_seed_state_dicts(states) == [True] * len(SEEDS)
    clock2 = Clock(10 ** 9, N)
    clock2.frame = clock.frame = 48
    group.update(clock)
    restored.update(clock2)
    assert [m.weights_sha256() for m in group.members] == [m.weights_sha256() for m in restored.members]
    assert restored.last_train_frame == 48
    bad = [dict(s) for s in states]
    bad[2]["extra"] = {"last_train_frame": 8, "last_target_frame": 40}
    with pytest.raises(ValueError, match="counters differ"):
        restored.load_seed_state_dicts(bad)


PENDULUM = str(Path(SPECS).with_name("pendulum.json"))
PENDULUM_OBS = gym.spaces.Box(-8.0, 8.0, (3,), np.float32)
PENDULUM_ACT = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
SAC_SMALL = ["agent.algorithm.training_start_step=16", "agent.memory.batch_size=32", "agent.memory.max_size=200",
             "agent.algorithm.training_iter=3", "agent.net.hid_layers=[32,32]"]


@pytest.mark.parametrize("extra", [[], ["agent.memory.name=PrioritizedReplay", "agent.algorithm.policy_delay=2"],
                                   ["agent.net.update_type=replace", "agent.net.update_frequency=4"]])
def test_batched_sac_update_equals_separate_updates(extra):
    overrides = [*SAC_SMALL, *extra]
    run = build(load_spec(PENDULUM, "sac_pendulum", overrides))
    group = batched_algorithm("SoftActorCritic")(run.agent, PENDULUM_OBS, PENDULUM_ACT, N, SEEDS)
    assert isinstance(group, BatchedSAC)
    separate = [make_algo("sac_pendulum", overrides, N, s, PENDULUM, PENDULUM_OBS, PENDULUM_ACT) for s in SEEDS]
    for member, algo in zip(group.members, separate):
        assert member.weights_sha256() == algo.weights_sha256()
    rng = np.random.default_rng(4)
    obs = rng.standard_normal((len(SEEDS) * N, 3)).astype(np.float32)
    obs, clock, clocks = drive_pair(group, separate, N, 8, rng, obs)  # random actions: each seed's own rng
    for c in (clock, *clocks):
        c.frame = 40  # past training_start_step, after the replays filled
    for _ in range(2):
        assert group.train_ready(clock) and all(a.train_ready(c) for a, c in zip(separate, clocks))
        stats = group.update(clock)
        for k, (algo, c) in enumerate(zip(separate, clocks)):
            ref = algo.update(c).resolved()
            assert clock.opt_step == c.opt_step
            assert stats[k].loss == pytest.approx(ref.loss, rel=1e-4, abs=1e-6)
            assert stats[k].grad_norm == pytest.approx(ref.grad_norm, rel=1e-4)
            for metric in algo.metric_names:
                assert stats[k].metrics[metric] == pytest.approx(ref.metrics[metric], rel=1e-4, abs=1e-6), metric
            assert group.members[k].rng.bit_generator.state == algo.rng.bit_generator.state
            assert torch.equal(group.members[k].gen.get_state(), algo.gen.get_state())  # the same noise draws
        assert_nets_close(group, separate)
        for c in (clock, *clocks):
            c.frame += 4
    alphas = [m.nets["log_alpha"].value.item() for m in group.members]
    assert len(set(alphas)) == len(SEEDS) and all(a != 0.0 for a in alphas)  # per-seed temperatures, trained
    # a seed's state is a separate session's, its critics' optimizer state included
    state = group.seed_state_dict(1, with_memory=True)
    alone = make_algo("sac_pendulum", overrides, N, SEEDS[1], PENDULUM, PENDULUM_OBS, PENDULUM_ACT)
    alone.load_state_dict(state)
    assert alone.weights_sha256() == group.members[1].weights_sha256()
    ref = separate[1].optims["critics"].state_dict()["state"]
    for i, st in alone.optims["critics"].state_dict()["state"].items():
        torch.testing.assert_close(st["exp_avg"], ref[i]["exp_avg"], rtol=1e-3, atol=1e-6)
