"""Nets: orthogonal init gains, nets built from observation spaces with extra inputs, the dueling net."""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from agents.nets import HIDDEN_GAIN, POLICY_GAIN, VALUE_GAIN, DuelingMLPNet, MLPNet, NetSpec, make_net
from tests.agents.algorithms.helpers import SLM_SPECS, make_algo


def svals(layer):
    return torch.linalg.svdvals(layer.weight.detach())


def test_orthogonal_gains_are_the_fields():
    """hidden sqrt(2), policy head 0.01, value head 1: every singular value equals the gain (issue 9c;
    before the fix all were 1)."""
    torch.manual_seed(0)
    net = MLPNet(4, [2, 1], [64, 64], "tanh", "orthogonal_", head_gains=[POLICY_GAIN, VALUE_GAIN])
    hidden = [m for m in net.body if isinstance(m, torch.nn.Linear)]
    assert len(hidden) == 2
    for layer in hidden:
        torch.testing.assert_close(svals(layer), torch.full_like(svals(layer), math.sqrt(2)))
    torch.testing.assert_close(svals(net.heads[0][0]), torch.full((2,), 0.01))
    torch.testing.assert_close(svals(net.heads[1][0]), torch.ones(1))
    assert HIDDEN_GAIN == math.sqrt(2) and (POLICY_GAIN, VALUE_GAIN) == (0.01, 1.0)
    assert all(float(m.bias.detach().abs().max()) == 0 for m in net.modules() if isinstance(m, torch.nn.Linear))


@pytest.mark.slm_lab_specs
def test_xavier_uses_slm_labs_activation_gain_on_every_layer():
    """xavier_uniform_ as SLM-Lab v5.3's init_layers: gain calculate_gain(hid_layers_activation) on hidden layers
    and heads alike, so every weight of a (fan_in, fan_out) layer lies within gain * sqrt(6 / (fan_in + fan_out))
    and the largest comes within 2% of it (256x256: 65,536 draws); relu sqrt 2, tanh 5/3 (before: gain 1 each);
    biases 0. SLM-Lab's sac_cartpole spec (xavier_uniform_, relu) gets the relu bound on its actor's head."""
    for activation, gain in (("relu", math.sqrt(2)), ("tanh", 5.0 / 3.0)):
        torch.manual_seed(0)
        net = MLPNet(256, 256, [256], activation, "xavier_uniform_", head_gains=[POLICY_GAIN])
        for layer in (net.body[1], net.heads[0][0]):
            bound = gain * math.sqrt(6.0 / (256 + 256))
            top = float(layer.weight.detach().abs().max())
            assert 0.98 * bound < top <= bound, (activation, top, bound)
            assert float(layer.bias.detach().abs().max()) == 0
    spec_file = str(SLM_SPECS / "benchmark" / "sac" / "sac_cartpole.json")
    head = make_algo("sac_cartpole", [], spec_file=spec_file).nets["net"].heads[0][0]
    bound = math.sqrt(2) * math.sqrt(6.0 / (head.in_features + head.out_features))
    assert 0.9 * bound < float(head.weight.detach().abs().max()) <= bound


def test_ppo_uses_policy_and_value_gains():
    """ppo_cartpole (init_fn orthogonal_, separate nets): actor head 0.01, critic head 1, hidden sqrt(2)."""
    algo = make_algo("ppo_cartpole", [])
    actor, critic = algo.nets["actor"], algo.nets["critic"]
    assert float(svals(actor.heads[0][0]).max()) == pytest.approx(0.01, rel=1e-5)
    assert float(svals(critic.heads[0][0]).max()) == pytest.approx(1.0, rel=1e-5)
    assert float(svals(actor.body[1]).min()) == pytest.approx(math.sqrt(2), rel=1e-5)
    shared = make_algo("ppo_cartpole", ["agent.net.shared=true"]).nets["net"]
    assert [float(svals(h[0]).max()) for h in shared.heads] == pytest.approx([0.01, 1.0], rel=1e-5)


def test_net_from_space_with_extra_input():
    """Q(s, a): a (3, 2) uint8 observation space (O = 6) plus a 2-feature action, cast to float."""
    space = gym.spaces.Box(0, 255, (3, 2), np.uint8)
    net = make_net(NetSpec(hid_layers=[8]), space, 1, extra_in_dim=2)
    assert net.body[1].in_features == 8
    obs = torch.randint(0, 255, (5, 3, 2), dtype=torch.uint8)
    act = torch.ones(5, 2)
    assert net(obs, act).shape == (5, 1)
    expected = net.heads[0](net.body[2](net.body[1](torch.cat([obs.reshape(5, 6).float(), act], -1))))
    torch.testing.assert_close(net(obs, act), expected)
    with pytest.raises(ValueError, match="numeric Box"):
        make_net(NetSpec(), gym.spaces.Discrete(3), 1)


def test_dueling_combines_value_and_advantage():
    """Q = V + A - mean(A), hand-set streams: V = 1, A = (1, 2, 6) -> Q = (-1, 0, 4)."""
    net = DuelingMLPNet(2, 3, [2], "linear")
    with torch.no_grad():
        for p in net.parameters():
            p.zero_()
        net.heads[0][0].bias.fill_(1.0)
        net.heads[1][0].bias.copy_(torch.tensor([1.0, 2.0, 6.0]))
    torch.testing.assert_close(net(torch.zeros(1, 2)), torch.tensor([[-1.0, 0.0, 4.0]]))


def test_layer_norm_after_each_hidden_linear():
    """SLM-Lab's layer_norm: Linear -> LayerNorm -> activation per hidden layer; the LayerNorm standardizes each
    row over its features, (h - mean) / sqrt(var + 1e-5) (its initial affine is the identity)."""
    net = MLPNet(3, 2, [5, 4], "relu", layer_norm=True)
    kinds = [type(m).__name__ for m in net.body]
    assert kinds == ["Flatten", "Linear", "LayerNorm", "ReLU", "Linear", "LayerNorm", "ReLU"]
    x = torch.randn(6, 3, generator=torch.Generator().manual_seed(0))
    h = net.body[1](x)
    expected = (h - h.mean(-1, keepdim=True)) / (h.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt()
    torch.testing.assert_close(net.body[2](h), expected)
    assert net(x).shape == (6, 2)
    assert [type(m).__name__ for m in MLPNet(3, 2, [5]).body] == ["Flatten", "Linear", "ReLU"]


def test_make_optim_fuses_adam_unless_told_otherwise():
    """Adam and AdamW are built fused unless the spec sets fused or foreach; other optimizers get foreach."""
    from agents.nets import make_optim

    params = [torch.nn.Parameter(torch.zeros(2))]
    assert make_optim(params, {"name": "Adam", "lr": 0.1}).defaults["fused"] is True
    assert make_optim(params, {"name": "AdamW", "lr": 0.1}).defaults["fused"] is True
    explicit = make_optim(params, {"name": "Adam", "lr": 0.1, "foreach": True}).defaults
    assert explicit["foreach"] is True and not explicit["fused"]
    assert make_optim(params, {"name": "Adam", "lr": 0.1, "fused": False}).defaults["foreach"] is True
    assert make_optim(params, {"name": "RMSprop", "lr": 0.1}).defaults["foreach"] is True


def test_stacked_mlp_is_its_members_and_their_weights_are_views_of_the_stack():
    """Two MLPNets stacked: the ensemble's forward is each member's, row for row; the members keep their
    state_dict (same keys and values), a write into the stack shows in the member and a member's load_state_dict
    writes the stack; DuelingMLPNet, several heads and layer_norm are refused."""
    from agents.nets import StackedMLP, stackable

    torch.manual_seed(0)
    nets = [MLPNet(5, 2, [16, 8], "tanh", "xavier_uniform_") for _ in range(2)]
    before = [{k: v.clone() for k, v in net.state_dict().items()} for net in nets]
    stack = StackedMLP(nets)
    assert [tuple(p.shape) for p in stack.parameters()] == [(2, 16, 5), (2, 8, 16), (2, 2, 8), (2, 1, 16),
                                                            (2, 1, 8), (2, 1, 2)]
    x, a = torch.randn(7, 4), torch.randn(7, 1)
    out = stack(x, a)
    assert out.shape == (2, 7, 2)
    for k, net in enumerate(nets):
        assert list(net.state_dict()) == list(before[k]) and all(torch.equal(v, before[k][n])
                                                                  for n, v in net.state_dict().items())
        torch.testing.assert_close(out[k], net(x, a), rtol=0, atol=1e-6)
    with torch.no_grad():
        stack.weights[1][1, 0, 0] = 3.0
    assert nets[1].state_dict()["body.3.weight"][0, 0].item() == 3.0 and nets[0].body[3].weight[0, 0] != 3.0
    nets[0].load_state_dict(before[1])  # in place: the stack's row 0 is now the second net as built
    fresh = MLPNet(5, 2, [16, 8], "tanh")
    fresh.load_state_dict(before[1])
    torch.testing.assert_close(stack(x, a)[0], fresh(x, a), rtol=0, atol=1e-6)
    assert torch.equal(stack.biases[0][0, 0], before[1]["body.1.bias"])
    assert stack.member_names[:3] == ["body.1.weight", "body.3.weight", "heads.0.0.weight"]
    assert not stackable(DuelingMLPNet(4, 2, [8])) and not stackable(MLPNet(4, [2, 1], [8]))
    assert not stackable(MLPNet(4, 2, [8], layer_norm=True)) and stackable(MLPNet(4, 2, [8]))
    with pytest.raises(ValueError, match="one architecture"):
        StackedMLP([MLPNet(4, 1, [8]), MLPNet(4, 1, [16])])


@pytest.mark.parametrize("layer_norm", [False, True])
def test_hidden_relu_runs_in_place_with_out_of_place_values_and_gradients(layer_norm):
    """An MLPNet's hidden ReLUs run in place (``hidden_activation``), alone and stacked (``StackedMLP``), and give
    the outputs and gradients of the same layers with torch's out-of-place ReLU, bit for bit."""
    from agents.nets import StackedMLP

    torch.manual_seed(3)
    net = MLPNet(6, 2, [32, 16], "relu", layer_norm=layer_norm)
    relus = [m for m in net.body if isinstance(m, torch.nn.ReLU)]
    assert len(relus) == 2 and all(m.inplace for m in relus)
    assert not MLPNet(6, 2, [8], "selu").body[2].__dict__.get("inplace", False)

    def reference(x):  # the same layers with out-of-place ReLU
        h = x
        for m in net.body[1:]:
            h = torch.relu(h) if isinstance(m, torch.nn.ReLU) else m(h)
        return net.heads[0](h)

    x = torch.randn(9, 6)
    out, ref = net(x), reference(x)
    assert torch.equal(out, ref)
    grads = torch.autograd.grad(out.square().sum(), list(net.parameters()))
    ref_grads = torch.autograd.grad(ref.square().sum(), list(net.parameters()))
    assert all(torch.equal(g, r) for g, r in zip(grads, ref_grads))
    if not layer_norm:  # stacked: against the same batched matmuls with out-of-place ReLU
        stack = StackedMLP([net, MLPNet(6, 2, [32, 16], "relu")])

        def stacked_reference(x):
            h = x.expand(2, *x.shape)
            for w, b, act in stack.layers:
                h = torch.baddbmm(b, h, w.transpose(1, 2))
                h = torch.relu(h) if isinstance(act, torch.nn.ReLU) else h
            return h

        out, ref = stack(x), stacked_reference(x)
        assert torch.equal(out, ref)
        grads = torch.autograd.grad(out.square().sum(), list(stack.parameters()))
        ref_grads = torch.autograd.grad(ref.square().sum(), list(stack.parameters()))
        assert all(torch.equal(g, r) for g, r in zip(grads, ref_grads))


@pytest.mark.parametrize("kind", ["conv", "recurrent"])
def test_conv_and_recurrent_hidden_relus_in_place_give_out_of_place_results(kind):
    """ConvNet's conv and fc ReLUs and RecurrentNet's fc ReLUs run in place, with the outputs and gradients of the
    same net whose ReLUs are torch's out-of-place ones, bit for bit."""
    import copy

    from agents.nets import ConvNet, RecurrentNet

    torch.manual_seed(5)
    if kind == "conv":
        net, x = ConvNet((2, 12, 12), 3, [[4, 3, 2], [6, 3, 1]], [16]), torch.rand(5, 2, 12, 12)
    else:
        net, x = RecurrentNet((4, 3), 2, "GRU", 8, fc_hid_layers=[16, 16]), torch.randn(5, 4, 3)
    relus = [m for m in net.modules() if isinstance(m, torch.nn.ReLU)]
    assert len(relus) == (3 if kind == "conv" else 2) and all(m.inplace for m in relus)
    ref_net = copy.deepcopy(net)
    for module in ref_net.modules():
        for name, child in module.named_children():
            if isinstance(child, torch.nn.ReLU):
                setattr(module, name, torch.nn.ReLU())
    out, ref = net(x), ref_net(x)
    assert torch.equal(out, ref)
    grads = torch.autograd.grad(out.square().sum(), list(net.parameters()))
    ref_grads = torch.autograd.grad(ref.square().sum(), list(ref_net.parameters()))
    assert all(torch.equal(g, r) for g, r in zip(grads, ref_grads))
