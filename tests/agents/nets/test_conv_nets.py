"""ConvNet: the Nature CNN on Atari frame stacks, uint8 scaling inside the net, image layouts, SLM-Lab conv
layer specs, the dueling variant, and DQN / DoubleDQN / PPO (shared and separate) built on it."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from agents.algorithms.base import take_rows
from agents.nets import NETS, ConvNet, DuelingConvNet, NetSpec, conv_layer_args, make_net
from tests.agents.algorithms.helpers import make_algo

ATARI_OBS = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
SMALL = ["agent.net.conv_hid_layers=[[4,8,4],[8,4,2]]", "agent.net.fc_hid_layers=[16]"]  # a tiny conv body


def test_nature_cnn_default_shapes_and_registry():
    """[[32,8,4],[64,4,2],[64,3,1]] on 84x84: 20x20 -> 9x9 -> 7x7, 64 * 7 * 7 = 3136 features, then 512."""
    net = make_net(NetSpec(type="ConvNet"), ATARI_OBS, 6)
    convs = [m for m in net.conv if isinstance(m, torch.nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size, c.stride) for c in convs] == [(32, (8, 8), (4, 4)), (64, (4, 4), (2, 2)),
                                                                            (64, (3, 3), (1, 1))]
    assert net.fc[0].in_features == 3136 and net.fc[0].out_features == 512
    out = net(torch.randint(0, 256, (2, 4, 84, 84), dtype=torch.uint8))
    assert out.shape == (2, 6) and out.dtype == torch.float32
    assert {"ConvNet", "DuelingConvNet"} <= set(NETS)


def test_uint8_frames_are_scaled_inside_the_net():
    """A uint8 space scales by 1/255 whatever tensor dtype arrives (algorithms may cast to float first);
    ``normalize: false`` does not; a float space is not scaled unless ``normalize: true``."""
    torch.manual_seed(0)
    spec = NetSpec(type="ConvNet", conv_hid_layers=[[4, 8, 4]], fc_hid_layers=[8])
    x = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    net = make_net(spec, ATARI_OBS, 2)
    assert net.obs_scale == pytest.approx(1 / 255)
    torch.testing.assert_close(net(x), net(x.float()))
    raw = make_net(NetSpec(type="ConvNet", conv_hid_layers=[[4, 8, 4]], fc_hid_layers=[8], normalize=False),
                   ATARI_OBS, 2)
    raw.load_state_dict(net.state_dict())
    torch.testing.assert_close(raw(x.float() / 255), net(x))
    float_space = gym.spaces.Box(0, 1, (4, 84, 84), np.float32)
    assert make_net(spec, float_space, 2).obs_scale is None
    assert make_net(NetSpec(type="ConvNet", normalize=True), float_space, 2).obs_scale == pytest.approx(1 / 255)


@pytest.mark.parametrize("shape, layout", [((84, 84), "hw"), ((96, 96, 3), "hwc"), ((3, 32, 32), "chw")])
def test_image_layouts(shape, layout):
    net = ConvNet(shape, 2, [[4, 3, 2]], [8])
    assert net.layout == layout
    assert net(torch.zeros(5, *shape, dtype=torch.uint8)).shape == (5, 2)


def test_conv_layer_specs_and_errors():
    assert conv_layer_args([32, 8, 4]) == (32, 8, 4, 0, 1)
    assert conv_layer_args([32, 8, 4, 1]) == (32, 8, 4, 1, 1)
    assert conv_layer_args([32, 3, 1, 1, 2]) == (32, 3, 1, 1, 2)
    for bad in ([32, 8], [32, 0, 1], [32, 3, 1, -1], [32, 3.0, 1]):
        with pytest.raises(ValueError, match="conv layer"):
            conv_layer_args(bad)
    with pytest.raises(ValueError, match="too small"):
        ConvNet((4, 10, 10), 2, [[8, 8, 4], [8, 8, 4]], [])
    with pytest.raises(ValueError, match="observations, got shape"):
        ConvNet((8,), 2, [[4, 3, 1]], [])


def test_extra_inputs_and_orthogonal_init():
    torch.manual_seed(0)
    net = ConvNet((4, 20, 20), [3, 1], [[4, 4, 2]], [8], init_fn="orthogonal_", head_gains=[0.01, 1.0],
                  extra_in_dim=2)
    assert net.fc[0].in_features == 4 * 9 * 9 + 2
    out = net(torch.zeros(2, 4, 20, 20), torch.ones(2, 2))
    assert [o.shape for o in out] == [(2, 3), (2, 1)]
    assert float(torch.linalg.svdvals(net.heads[0][0].weight.detach()).max()) == pytest.approx(0.01, rel=1e-5)
    assert float(net.conv[0].bias.detach().abs().max()) == 0


def test_dueling_conv_combines_value_and_advantage():
    net = DuelingConvNet((1, 8, 8), 3, [[2, 3, 1]], [4])
    with torch.no_grad():
        for head in net.heads:
            head[0].weight.zero_()
        net.heads[0][0].bias.fill_(1.0)
        net.heads[1][0].bias.copy_(torch.tensor([1.0, 2.0, 6.0]))
    torch.testing.assert_close(net(torch.zeros(1, 1, 8, 8)), torch.tensor([[-1.0, 0.0, 4.0]]))


@pytest.mark.parametrize("cls", [ConvNet, DuelingConvNet])
def test_bfloat16_precision_is_mixed_precision(cls):
    """``precision: bfloat16``: the same weights give float32 outputs within bf16 rounding of the float32 net's
    (|diff| < 2% of the output scale), and float32 gradients on the float32 weights; the state dict is the same."""
    torch.manual_seed(0)
    kw = {"conv_hid_layers": [[8, 8, 4], [16, 4, 2]], "fc_hid_layers": [32], "obs_scale": 1 / 255}
    full, mixed = cls((4, 84, 84), 6, **kw), cls((4, 84, 84), 6, **kw, precision="bfloat16")
    mixed.load_state_dict(full.state_dict())
    x = torch.randint(0, 256, (8, 4, 84, 84), dtype=torch.uint8)
    out_full, out_mixed = full(x), mixed(x)
    assert out_mixed.dtype == torch.float32 and out_mixed.shape == out_full.shape == (8, 6)
    assert 0 < (out_full - out_mixed).abs().max() < 0.02 * out_full.abs().max()
    out_mixed.sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in mixed.parameters())
    assert {k: v.dtype for k, v in mixed.state_dict().items()} == {k: v.dtype for k, v in full.state_dict().items()}
    with pytest.raises(ValueError, match="precision"):
        cls((4, 84, 84), 6, **kw, precision="float16")


@pytest.mark.parametrize("name, overrides, nets", [
    ("dqn_cartpole", ["agent.net.type=ConvNet"], ["net", "target_net"]),
    ("ddqn_cartpole", ["agent.net.type=DuelingConvNet"], ["net", "target_net"]),
    ("ppo_cartpole", ["agent.net.type=ConvNet", "agent.net.shared=true"], ["net"]),
    ("ppo_cartpole", ["agent.net.type=ConvNet"], ["actor", "critic"]),
])
def test_algorithms_act_and_update_on_pixels(name, overrides, nets):
    """Each algorithm builds conv nets from a uint8 (4, 84, 84) space, acts on uint8 frames, and takes
    gradient steps; DQN's replay stores the frames as uint8."""
    from envs.clock import Clock

    extra = ["agent.algorithm.training_start_step=8", "agent.memory.batch_size=4"] if "dqn" in name else \
        ["agent.algorithm.time_horizon=4", "agent.algorithm.minibatch_size=4", "agent.algorithm.training_epoch=1"]
    algo = make_algo(name, [*SMALL, *overrides, *extra], num_envs=2, obs_space=ATARI_OBS,
                     action_space=gym.spaces.Discrete(6))
    assert sorted(algo.nets) == sorted(nets) and all(isinstance(algo.nets[n], ConvNet) for n in nets)
    clock, rng = Clock(100, 2), np.random.default_rng(0)
    obs = rng.integers(0, 256, (2, 4, 84, 84), dtype=np.uint8)
    for _ in range(8):
        act = algo.act(obs, clock)
        assert act.shape == (2,) and ((0 <= act) & (act < 6)).all()
        next_obs = rng.integers(0, 256, obs.shape, dtype=np.uint8)
        algo.memory.add(obs, act, np.ones(2, np.float32), next_obs, np.zeros(2, bool), np.zeros(2, bool))
        clock.tick(np.zeros(2, bool))
        if algo.train_ready(clock):
            algo.update(clock)
        obs = next_obs
    assert clock.opt_step > 0
    if "dqn" in name:
        batch = algo.memory.sample(algo.rng)  # each frame once, in uint8 (FrameStackReplay)
        assert type(algo.memory).__name__ == "FrameStackReplay" and algo.memory.data["frame"].dtype == np.uint8
        assert batch["obs"].dtype == batch["next_obs"].dtype == np.uint8


@pytest.mark.parametrize("net_type, dtype", [("ConvNet", torch.uint8), ("MLPNet", torch.float32)])
def test_uint8_frames_reach_conv_nets_as_uint8_with_the_same_values(net_type, dtype):
    """Conv nets on a uint8 space take uint8 tensors (``obs_dtype``: a quarter of the bytes per gather and copy);
    the PPO rollout's values and log-probs are bit-equal to those of the same frames passed as float32. An
    MLP on the same space keeps float32 tensors."""
    algo = make_algo("ppo_cartpole", [*SMALL, f"agent.net.type={net_type}", "agent.net.hid_layers=[8]",
                                      "agent.algorithm.time_horizon=3"], num_envs=2, obs_space=ATARI_OBS,
                     action_space=gym.spaces.Discrete(6))
    assert algo.obs_dtype == dtype
    rng = np.random.default_rng(0)
    obs = rng.integers(0, 256, (2, 4, 84, 84), dtype=np.uint8)
    for _ in range(3):
        next_obs = rng.integers(0, 256, obs.shape, dtype=np.uint8)
        algo.memory.add(obs, rng.integers(0, 6, 2), np.ones(2, np.float32), next_obs, np.zeros(2, bool),
                        np.zeros(2, bool))
        obs = next_obs
    batch = algo.memory.pop()
    assert algo.obs_tensor(batch["obs"]).dtype == dtype
    as_uint8 = algo.prepare(batch)
    # conv nets: the rollout's frames in channels-last memory once (``rollout_obs``), as the convs take them
    assert algo.obs_channels_last == (net_type == "ConvNet")
    assert as_uint8["obs"].is_contiguous(memory_format=torch.channels_last) == (net_type == "ConvNet")
    assert torch.equal(as_uint8["obs"], torch.as_tensor(batch["obs"]).reshape(6, 4, 84, 84).to(dtype))
    algo.obs_dtype = torch.float32
    as_float = algo.prepare(batch)
    for k in ("old_logp", "old_value", "adv", "v_target"):
        assert torch.equal(as_uint8[k], as_float[k]), k


def test_take_rows_copies_rows_and_keeps_a_channels_last_rollout_channels_last():
    """``take_rows(x, idx)`` equals ``x[idx]`` (repeated and unordered rows too); rows of a channels-last (N, C, H, W)
    tensor come out channels-last (the layout the convs compute in), of a contiguous one contiguous."""
    x = torch.arange(5 * 4 * 3 * 2, dtype=torch.uint8).reshape(5, 4, 3, 2)
    idx = torch.tensor([4, 0, 0, 2])
    channels_last = x.contiguous(memory_format=torch.channels_last)
    for src in (x, channels_last):
        assert torch.equal(take_rows(src, idx), x[idx])
    rows = take_rows(channels_last, idx)
    assert rows.is_contiguous(memory_format=torch.channels_last) and not rows.is_contiguous()
    assert take_rows(x, idx).is_contiguous()
    v = torch.randn(5, 3)
    assert torch.equal(take_rows(v, idx), v[idx]) and torch.equal(take_rows(v[:, 0], idx), v[idx, 0])
