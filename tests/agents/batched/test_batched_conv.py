"""Seed-batched conv and shared nets (agents.batched.nets.SeedNet) against K separate nets, and seed-batched PPO
and A2C with a shared ConvNet and DQN / DoubleDQN with a ConvNet and frame-stack replays against K separate lab
algorithms fed the same frames, value by value."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from agents.batched import (
    BatchedActorCritic,
    BatchedDoubleDQN,
    BatchedDQN,
    BatchedPPO,
    batch_problem,
    batched_algorithm,
)
from agents.batched.nets import SeedMLP, SeedNet, seed_net
from agents.batched.optim import clip_grads_per_seed
from agents.nets import ConvNet, DuelingConvNet, MLPNet
from orchestrator.spec.load import build, load_spec
from tests.agents.algorithms.helpers import REPO, SPECS, make_algo
from tests.agents.batched.helpers import (
    SEEDS,
    agent_spec,
    assert_nets_close,
    drive_pair,
    more_steps,
    update_dqn_pair,
)

ATARI = str(REPO / "specs" / "benchmark" / "atari.json")
FRAMES = gym.spaces.Box(0, 255, (4, 36, 36), np.uint8)
ACTIONS = gym.spaces.Discrete(6)
TINY = ["agent.net.conv_hid_layers=[[8,8,4],[8,3,1]]", "agent.net.fc_hid_layers=[32]"]
PPO_TINY = [*TINY, "agent.algorithm.time_horizon=8", "agent.algorithm.minibatch_size=12",
            "agent.algorithm.training_epoch=2"]


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def _convs(shape, seeds=SEEDS, **kw):
    nets = []
    for seed in seeds:
        torch.manual_seed(seed)
        nets.append(ConvNet(shape, [6, 1], [[8, 4, 2], [8, 3, 1, 1]], [16, 8], init_fn="orthogonal_",
                            head_gains=[0.01, 1.0], obs_scale=1 / 255, **kw))
    return nets


@pytest.mark.parametrize("shape", [(4, 36, 36), (36, 36), (36, 36, 3)])
def test_seed_conv_net_forward_equals_k_separate_conv_nets(shape):
    nets = _convs(shape)
    before = [{k: v.clone() for k, v in net.state_dict().items()} for net in nets]
    x = torch.randint(0, 256, (len(SEEDS), 5, *shape), dtype=torch.uint8)
    expected = [net(x[k]) for k, net in enumerate(nets)]
    stack = seed_net(nets)
    assert isinstance(stack, SeedNet)
    out = stack(x)
    assert isinstance(out, list) and [o.shape for o in out] == [(3, 5, 6), (3, 5, 1)]
    for k in range(len(SEEDS)):
        for head in range(2):
            torch.testing.assert_close(out[head][k], expected[k][head], rtol=0, atol=1e-5)
        for name, value in nets[k].state_dict().items():  # the members show their slice of the stack
            assert torch.equal(value, before[k][name]), name
    torch.testing.assert_close(stack(x.float())[0], out[0], rtol=0, atol=1e-6)  # a float input is scaled alike
    with torch.no_grad():
        stack.stacks[0][1].add_(1.0)  # seed 1's first conv changes in its member, only there
    assert torch.equal(nets[1].state_dict()["conv.0.weight"], before[1]["conv.0.weight"] + 1.0)
    assert torch.equal(nets[0].state_dict()["conv.0.weight"], before[0]["conv.0.weight"])
    torch.testing.assert_close(nets[1](x[1])[0], stack(x)[0][1], rtol=0, atol=1e-5)  # the member reads its slice


def test_seed_conv_net_bfloat16_and_extras_follow_the_members():
    nets = _convs((4, 36, 36), precision="bfloat16")
    x = torch.randint(0, 256, (3, 4, 4, 36, 36), dtype=torch.uint8)
    expected = [net(x[k]) for k, net in enumerate(nets)]
    out = SeedNet(nets)(x)
    for k in range(3):
        assert out[0].dtype == torch.float32
        torch.testing.assert_close(out[0][k], expected[k][0], rtol=0.02, atol=0.02)
    torch.manual_seed(0)
    mlps = [MLPNet(4 + 2, [3, 1], [16, 16], "tanh", "orthogonal_", head_gains=[0.01, 1.0]) for _ in SEEDS]
    obs, extra = torch.randn(3, 7, 4), torch.randn(3, 7, 2)
    expected = [net(obs[k], extra[k]) for k, net in enumerate(mlps)]
    stack = seed_net(mlps)  # a shared (two-head) MLP
    assert isinstance(stack, SeedNet)
    out = stack(obs, extra)
    for k in range(3):
        for head in range(2):
            torch.testing.assert_close(out[head][k], expected[k][head], rtol=0, atol=1e-6)
    assert isinstance(seed_net([MLPNet(4, 2, [8]) for _ in SEEDS]), SeedMLP)  # single-head MLPs: SeedMLP


def test_seed_net_gradients_and_clipping_per_seed_over_all_its_parameters():
    nets = _convs((4, 36, 36))
    copies = _convs((4, 36, 36))  # the same inits, kept separate
    x = torch.randint(0, 256, (3, 6, 4, 36, 36), dtype=torch.uint8)
    target = torch.randn(3, 6)
    stack = SeedNet(nets)
    pd, value = stack(x)
    scale = torch.tensor([0.01, 1.0, 30.0])  # seed 0 under the clip norm, seeds 1, 2 over it
    loss = (scale * ((pd.logsumexp(-1) + (value.squeeze(-1) - target) ** 2).mean(-1))).sum()
    loss.backward()
    params = list(stack.parameters())
    norms = clip_grads_per_seed(params, 0.5)
    for k, net in enumerate(copies):
        p_k, v_k = net(x[k])
        (scale[k] * (p_k.logsumexp(-1) + (v_k.squeeze(-1) - target[k]) ** 2).mean()).backward()
        norm = nn.utils.clip_grad_norm_(net.parameters(), 0.5)  # the lab's clip of one shared net
        torch.testing.assert_close(norms[k], norm, rtol=1e-5, atol=0)
        for name, p in net.named_parameters():
            grad = stack.stack_of()[name][0].grad[k]
            torch.testing.assert_close(grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)
    assert norms[0] < 0.5 < norms[1]


def atari_agent(overrides: list[str]):
    """The checked ``agent`` section of ``ppo_atari`` with ``key=value`` overrides."""
    return build(load_spec(ATARI, "ppo_atari", overrides)).agent


def _frames(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.integers(0, 256, shape, dtype=np.uint8)


@pytest.mark.parametrize("spec_file,name,cls,overrides", [
    (ATARI, "ppo_atari", BatchedPPO, PPO_TINY),
    (SPECS, "a2c_gae_cartpole", BatchedActorCritic, [*TINY, "agent.net.type=ConvNet", "agent.net.shared=true",
                                                     "agent.net.clip_grad_val=0.05"]),
    (ATARI, "ppo_atari", BatchedPPO, [*PPO_TINY, "agent.net.type=MLPNet", "agent.net.hid_layers=[16]"]),
])
def test_batched_shared_net_updates_equal_separate_updates(spec_file, name, cls, overrides):
    """Two updates of a group of 3 seeds against 3 separate lab algorithms on the same frames: losses, grad norms
    (clipped per seed over the whole shared net), metrics, weights, learning rates."""
    n = 2
    spec = build(load_spec(spec_file, name, overrides)).agent
    group = batched_algorithm(spec.algorithm.name)(spec, FRAMES, ACTIONS, n, SEEDS)
    assert isinstance(group, cls) and spec.net.shared and list(group.nets) == ["net"]
    separate = [make_algo(name, overrides, n, s, spec_file, FRAMES, ACTIONS) for s in SEEDS]
    for member, algo in zip(group.members, separate):
        assert member.weights_sha256() == algo.weights_sha256()
    rng = np.random.default_rng(0)
    obs = _frames(rng, (len(SEEDS) * n, 4, 36, 36))
    for _ in range(2):
        obs, clock, clocks = drive_pair(group, separate, n, group.horizon(), rng, obs, _frames)
        assert group.train_ready(clock) and all(a.train_ready(c) for a, c in zip(separate, clocks))
        stats = group.update(clock)
        for k, (algo, c) in enumerate(zip(separate, clocks)):
            ref = algo.update(c)
            assert clock.opt_step == c.opt_step
            assert stats[k].loss == pytest.approx(ref.loss, rel=1e-4, abs=1e-6)
            assert stats[k].grad_norm == pytest.approx(ref.grad_norm, rel=1e-4)
            assert stats[k].entropy == pytest.approx(ref.entropy, rel=1e-5)
            for metric in algo.metric_names:
                assert stats[k].metrics[metric] == pytest.approx(ref.metrics[metric], rel=1e-3, abs=1e-5), metric
            mine, theirs = group.members[k].state_dict()["nets"], algo.state_dict()["nets"]
            for key in theirs["net"]:
                torch.testing.assert_close(mine["net"][key], theirs["net"][key], rtol=0, atol=1e-5)
            assert group.members[k].current_lr() == algo.current_lr()
    assert max(s.grad_norm for s in stats) > 0.5  # spec's clip_grad_val 0.5 (A2C: 0.05): some seeds clipped
    assert len({m.weights_sha256()["net"] for m in group.members}) == len(SEEDS)


def test_batched_conv_reinforce_update_equals_separate_updates():
    """REINFORCE with a ConvNet on uint8 frames (``OnPolicyBatchReplay``, 8-step rollouts): two updates of a group of
    3 seeds against 3 separate lab algorithms on the same frames (losses, entropies, clipped grad norms, weights)."""
    from agents.batched import BatchedReinforce

    n, overrides = 2, [*TINY, "agent.net.type=ConvNet", "agent.memory.name=OnPolicyBatchReplay",
                       "agent.algorithm.training_frequency=8", "agent.net.clip_grad_val=0.1"]
    spec = agent_spec("reinforce_cartpole", overrides)
    group = batched_algorithm(spec.algorithm.name)(spec, FRAMES, ACTIONS, n, SEEDS)
    assert isinstance(group, BatchedReinforce) and isinstance(group.nets["net"], SeedNet)
    separate = [make_algo("reinforce_cartpole", overrides, n, s, SPECS, FRAMES, ACTIONS) for s in SEEDS]
    rng = np.random.default_rng(4)
    obs = _frames(rng, (len(SEEDS) * n, 4, 36, 36))
    for _ in range(2):
        obs, clock, clocks = drive_pair(group, separate, n, 8, rng, obs, _frames)
        assert group.train_ready(clock) and all(a.train_ready(c) for a, c in zip(separate, clocks))
        stats = group.update(clock)
        for k, (algo, c) in enumerate(zip(separate, clocks)):
            ref = algo.update(c)
            assert stats[k].loss == pytest.approx(ref.loss, rel=1e-4, abs=1e-6)
            assert stats[k].entropy == pytest.approx(ref.entropy, rel=1e-5)
            assert stats[k].grad_norm == pytest.approx(ref.grad_norm, rel=1e-4)
            assert ref.grad_norm > 0.1  # clip_grad_val 0.1: each seed clipped to its own norm
        assert_nets_close(group, separate)
    assert len({m.weights_sha256()["net"] for m in group.members}) == len(SEEDS)


class FrameStream:
    """Atari-like frame stacks (K*N, 4, 36, 36) uint8: each call shifts every stack by one new random frame, so the
    frame-stack replays store each frame once and rebuild stacks from earlier rows (``FrameStackReplay``)."""

    def __init__(self, rows: int, seed: int = 2) -> None:
        self.rng = np.random.default_rng(seed)
        self.obs = _frames(self.rng, (rows, 4, 36, 36))

    def __call__(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        self.obs = np.concatenate([self.obs[:, 1:], _frames(self.rng, (shape[0], 1, 36, 36))], axis=1)
        return self.obs


DQN_TINY = [*TINY, "agent.net.gpu=false", "agent.algorithm.training_start_step=32", "agent.memory.batch_size=8",
            "agent.memory.max_size=64", "agent.algorithm.training_iter=3", "agent.algorithm.training_batch_iter=2",
            "agent.net.update_frequency=8", "agent.net.clip_grad_val=0.5",
            "agent.algorithm.explore_var_spec.start_step=0", "agent.algorithm.explore_var_spec.end_step=200",
            "agent.algorithm.explore_var_spec.end_val=0.3"]


@pytest.mark.parametrize("name,cls", [("dqn_atari", BatchedDQN), ("ddqn_atari", BatchedDoubleDQN)])
def test_batched_conv_dqn_updates_equal_separate_updates(name, cls):
    """A group of 3 seeds of Atari DQN / DoubleDQN (a ConvNet on uint8 frame stacks, each seed its own
    ``FrameStackReplay``) against 3 separate lab algorithms on the same frames: actions, two rounds of updates
    (6 gradient steps each, the target replaced on its cadence): losses, grad norms (clipped per seed), metrics,
    replays and sampling streams, weights."""
    from agents.memory.frames import FrameStackReplay

    n = 2
    spec = build(load_spec(ATARI, name, DQN_TINY)).agent
    group = batched_algorithm(spec.algorithm.name)(spec, FRAMES, ACTIONS, n, SEEDS)
    assert isinstance(group, cls) and isinstance(group.nets["net"], SeedNet)
    separate = [make_algo(name, DQN_TINY, n, s, ATARI, FRAMES, ACTIONS) for s in SEEDS]
    for member, algo in zip(group.members, separate):
        assert member.weights_sha256() == algo.weights_sha256()
        assert isinstance(member.memory, FrameStackReplay)
    stream, rng = FrameStream(len(SEEDS) * n), np.random.default_rng(3)
    obs, clock, clocks = drive_pair(group, separate, n, 10, rng, stream.obs, stream)
    assert not group.train_ready(clock)
    for _ in range(2):
        obs = more_steps(group, separate, n, 8, rng, obs, clock, clocks, stream)
        refs = update_dqn_pair(group, separate, clock, clocks)
        for member, algo in zip(group.members, separate):
            np.testing.assert_array_equal(member.memory.is_head, algo.memory.is_head)
            assert member.memory.is_head.sum() < len(member.memory) / 2  # most rows keep one frame, as alone
        assert_nets_close(group, separate)
        assert group.last_target_frame == separate[0].last_target_frame == clock.frame
    assert max(r.grad_norm for r in refs) > 0.5  # clip_grad_val 0.5: some seeds clipped to their own norm
    assert len({m.weights_sha256()["net"] for m in group.members}) == len(SEEDS)


def test_conv_and_shared_nets_refused_where_they_do_not_run_batched():
    atari = atari_agent
    assert batch_problem(atari([])) is None
    assert "'DuelingConvNet' does not run batched" in batch_problem(atari(["agent.net.type=DuelingConvNet"]))
    assert "'RecurrentNet' does not run batched" in batch_problem(agent_spec("ppo_cartpole", [
        "agent.net.type=RecurrentNet", "agent.net.rnn_hidden_size=8", "agent.net.seq_len=4"]))
    assert "batch_norm do not run batched" in batch_problem(atari(["agent.net.batch_norm=true"]))
    assert "batch_norm do not run batched" in batch_problem(agent_spec("ppo_cartpole", ["agent.net.layer_norm=true"]))
    assert batch_problem(agent_spec("dqn_cartpole", ["agent.net.type=ConvNet"])) is None
    problem = batch_problem(build(load_spec(str(REPO / "specs" / "benchmark" / "pendulum.json"), "sac_pendulum",
                                            ["agent.net.type=ConvNet"])).agent)
    assert ("'ConvNet' runs batched only for ['ActorCritic', 'PPO', 'REINFORCE', 'DQN', 'DoubleDQN', 'VanillaDQN'], "
            "not agent.algorithm.name 'SoftActorCritic'") in problem
    problem = batch_problem(agent_spec("reinforce_cartpole", ["agent.memory.name=OnPolicyBatchReplay",
                                                              "agent.net.shared=true"]))
    assert "with shared: true runs batched only for" in problem
    with pytest.raises(ValueError, match="has no seed-stacked form"):
        SeedNet([DuelingConvNet((4, 36, 36), 6, [[8, 8, 4]], [16]) for _ in SEEDS])
    with pytest.raises(ValueError, match="BatchNorm2d layers"):
        SeedNet([ConvNet((4, 36, 36), 6, [[8, 8, 4], [8, 3, 1]], [16], batch_norm=True) for _ in SEEDS])
    with pytest.raises(ValueError, match="one architecture"):
        SeedNet([ConvNet((4, 36, 36), 6, [[8, 8, 4]], [16]), ConvNet((4, 36, 36), 6, [[8, 8, 4]], [8])])


def test_seed_rows_of_channels_last_frames_keep_the_layout():
    from agents.batched.algorithm import seed_rows
    from agents.batched.nets import seed_channels_last

    x = seed_channels_last(torch.randint(0, 256, (3, 10, 4, 6, 6), dtype=torch.uint8))
    assert not x.is_contiguous() and x[1].is_contiguous(memory_format=torch.channels_last)
    idx = torch.tensor([[9, 0, 3], [2, 2, 5], [7, 1, 1]])
    out = seed_rows(x, idx)
    for k in range(3):
        assert torch.equal(out[k], x[k][idx[k]])
        assert out[k].is_contiguous(memory_format=torch.channels_last)
    assert seed_channels_last(out).data_ptr() == out.data_ptr()  # already laid out: no copy in SeedNet
