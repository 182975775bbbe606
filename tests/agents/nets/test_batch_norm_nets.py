"""``agent.net.batch_norm``: the layers where SLM-Lab places them (MLP: after each hidden Linear; conv: after the
activation of every conv layer but the first), running statistics by hand, one-row batches, and an exact resume
of a session whose statistics and Lookahead state travel in the checkpoint."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from agents.nets import ConvNet, MLPNet, NetSpec, RowBatchNorm1d, StackedMLP, make_net, stackable
from tests.agents.algorithms.helpers import assert_resume_exact


def kinds(layers):
    return [type(m).__name__ for m in layers]


def test_mlp_batch_norm_after_each_hidden_linear_before_the_activation():
    """SLM-Lab v5.3's build_fc_model: Linear, BatchNorm1d, activation; it replaces layer_norm."""
    net = make_net(NetSpec(hid_layers=[8, 6], hid_layers_activation="tanh", batch_norm=True, layer_norm=True),
                   gym.spaces.Box(-1, 1, (3,), np.float32), 2)
    assert kinds(net.body) == ["Flatten", "Linear", "RowBatchNorm1d", "Tanh", "Linear", "RowBatchNorm1d", "Tanh"]
    assert [m.num_features for m in net.body if isinstance(m, nn.BatchNorm1d)] == [8, 6]
    assert not stackable(net)
    with pytest.raises(ValueError, match="without layer_norm or batch_norm"):
        StackedMLP([net, net])


def test_conv_batch_norm_after_the_activation_of_every_conv_layer_but_the_first():
    """SLM-Lab's ConvNet (v4 and v5.3): Conv2d, activation, then BatchNorm2d from the second conv layer on; the
    constructor's size probe leaves the statistics at their initial values."""
    net = ConvNet((2, 20, 20), 3, [[4, 4, 2], [6, 3, 1], [5, 3, 1]], [16], batch_norm=True)
    assert kinds(net.conv) == ["Conv2d", "ReLU", "Conv2d", "ReLU", "BatchNorm2d", "Conv2d", "ReLU", "BatchNorm2d",
                               "Flatten"]
    bns = [m for m in net.conv if isinstance(m, nn.BatchNorm2d)]
    assert [m.num_features for m in bns] == [6, 5]
    for bn in bns:
        assert torch.equal(bn.running_mean, torch.zeros_like(bn.running_mean))
        assert torch.equal(bn.running_var, torch.ones_like(bn.running_var)) and int(bn.num_batches_tracked) == 0
    assert net.training and net(torch.rand(4, 2, 20, 20)).shape == (4, 3)


def test_running_statistics_by_hand_and_one_row_batches():
    """Train mode, batch [[1], [3]] (momentum 0.1): running_mean 0.9 * 0 + 0.1 * 2 = 0.2, running_var
    0.9 * 1 + 0.1 * 2 (unbiased variance of 1, 3) = 1.1; the output is (x - 2) / sqrt(1 + eps) = -1, 1.
    One row in train mode uses the running statistics and records nothing: (5 - 0.2) / sqrt(1.1 + eps)."""
    bn = RowBatchNorm1d(1)
    out = bn(torch.tensor([[1.0], [3.0]]))
    torch.testing.assert_close(out, torch.tensor([[-1.0], [1.0]]), atol=1e-4, rtol=0)
    torch.testing.assert_close(bn.running_mean, torch.tensor([0.2]))
    torch.testing.assert_close(bn.running_var, torch.tensor([1.1]))
    one = bn(torch.tensor([[5.0]]))
    torch.testing.assert_close(one, torch.tensor([[4.8 / (1.1 + 1e-5) ** 0.5]]))
    torch.testing.assert_close(bn.running_mean, torch.tensor([0.2]))
    assert int(bn.num_batches_tracked) == 1


def test_batch_norm_statistics_round_trip_through_a_state_dict():
    """The running statistics are buffers: a fresh net that loads the state dict gives the same eval outputs."""
    torch.manual_seed(0)
    net = MLPNet(4, 2, [8], batch_norm=True)
    for _ in range(3):
        net(torch.randn(16, 4))
    bn = net.body[2]
    assert int(bn.num_batches_tracked) == 3 and not torch.equal(bn.running_mean, torch.zeros(8))
    fresh = MLPNet(4, 2, [8], batch_norm=True)
    fresh.load_state_dict(net.state_dict())
    x = torch.randn(5, 4)
    assert torch.equal(fresh.eval()(x), net.eval()(x))


def test_session_with_batch_norm_and_lookahead_resumes_exactly(tmp_path):
    """PPO on CartPole with batch-norm MLPs and a Lookahead(RAdam) optimizer, stopped at frame 504 and resumed:
    the same train_df and the same weights (running statistics included) as the straight run."""
    straight = assert_resume_exact(tmp_path, "ppo_cartpole", [
        "env.max_frame=1000", "meta.log_frequency=250", "agent.net.batch_norm=true",
        'agent.net.optim_spec={"name": "Lookahead", "optimizer": "RAdam", "lr": 0.001, "k": 3}'], 504)
    actor = straight.algorithm.nets["actor"]
    assert any(isinstance(m, nn.BatchNorm1d) for m in actor.body)
    assert int(actor.body[2].num_batches_tracked) > 0
    assert straight.algorithm.optims["net"].step_count == straight.clock.opt_step > 3
