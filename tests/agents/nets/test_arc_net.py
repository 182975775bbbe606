"""TorchArcNet: torcharc bodies (MLP and conv arcs) with lazy layers materialized from the observation space,
heads and orthogonal gains as MLPNet, uint8 scaling, Q(s, a) inputs, spec-time errors, SLM-Lab's
``benchmark_arc`` entries in dev, and an exact resume."""

import copy
import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from agents.nets import NETS, POLICY_GAIN, VALUE_GAIN, MLPNet, NetSpec, TorchArcNet, make_net
from orchestrator.errors import SpecError
from orchestrator.spec.load import load_spec
from tests.agents.algorithms.helpers import SLM_SPECS, assert_resume_exact, make_algo, run_slm_dev


def arc_of(*layers):
    """A one-node torcharc 2 spec: ``body = Sequential(*layers)`` on input x (SLM-Lab's benchmark_arc form)."""
    return {"modules": {"body": {"Sequential": list(layers)}},
            "graph": {"input": "x", "modules": {"body": ["x"]}, "output": "body"}}


MLP_ARC = arc_of({"LazyLinear": {"out_features": 16}}, {"Tanh": None}, {"LazyLinear": {"out_features": 8}},
                 {"Tanh": None})
CONV_ARC = arc_of({"LazyConv2d": {"out_channels": 4, "kernel_size": 4, "stride": 2}}, {"ReLU": None},
                  {"Flatten": None}, {"LazyLinear": {"out_features": 8}}, {"ReLU": None})
BOX4 = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
PIXELS = gym.spaces.Box(0, 255, (2, 12, 12), np.uint8)


def svals(layer):
    return torch.linalg.svdvals(layer.weight.detach())


def test_mlp_arc_shapes_lazy_layers_and_gains():
    """4 -> 16 -> 8 -> heads [2, 1]: lazy layers become Linear(4, 16), Linear(16, 8) in the constructor; with
    orthogonal_ the body has singular values sqrt(2), the policy head 0.01, the value head 1, biases 0."""
    torch.manual_seed(0)
    net = make_net(NetSpec(type="TorchArcNet", arc=MLP_ARC, init_fn="orthogonal_"), BOX4, [2, 1],
                   [POLICY_GAIN, VALUE_GAIN])
    assert NETS["TorchArcNet"] is TorchArcNet
    linears = [m for m in net.body.modules() if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(4, 16), (16, 8)]
    assert not any(isinstance(p, torch.nn.parameter.UninitializedParameter) for p in net.parameters())
    for layer in linears:
        torch.testing.assert_close(svals(layer), torch.full((4 if layer.in_features == 4 else 8,), math.sqrt(2)))
    torch.testing.assert_close(svals(net.heads[0][0]), torch.full((2,), 0.01))
    torch.testing.assert_close(svals(net.heads[1][0]), torch.ones(1))
    assert all(float(m.bias.detach().abs().max()) == 0 for m in net.modules() if isinstance(m, torch.nn.Linear))
    logits, value = net(torch.randn(5, 4))
    assert logits.shape == (5, 2) and value.shape == (5, 1)


def test_mlp_arc_computes_what_the_equal_mlpnet_computes():
    """The arc [LazyLinear 16, Tanh, LazyLinear 8, Tanh] with MLPNet(4, 3, [16, 8], tanh)'s weights copied in
    gives the same Q-values, value by value."""
    torch.manual_seed(1)
    mlp = MLPNet(4, 3, [16, 8], "tanh")
    arc = make_net(NetSpec(type="TorchArcNet", arc=MLP_ARC), BOX4, 3)
    arc.load_state_dict(dict(zip(arc.state_dict(), mlp.state_dict().values())))
    x = torch.randn(6, 4)
    torch.testing.assert_close(arc(x), mlp(x), rtol=0, atol=0)


def test_conv_arc_on_uint8_frames():
    """(2, 12, 12) uint8: LazyConv2d(4, k4, s2) -> (4, 5, 5) = 100 features -> 8 -> 3; frames are scaled by 1/255
    inside the net (uint8 space); ``normalize: false`` leaves them raw."""
    torch.manual_seed(0)
    net = make_net(NetSpec(type="TorchArcNet", arc=CONV_ARC), PIXELS, 3)
    conv = next(m for m in net.body.modules() if isinstance(m, torch.nn.Conv2d))
    fc = next(m for m in net.body.modules() if isinstance(m, torch.nn.Linear))
    assert (conv.in_channels, conv.out_channels, fc.in_features) == (2, 4, 100)
    assert net.obs_scale == pytest.approx(1 / 255)
    x = torch.randint(0, 256, (3, 2, 12, 12), dtype=torch.uint8)
    out = net(x)
    assert out.shape == (3, 3) and out.dtype == torch.float32
    raw = make_net(NetSpec(type="TorchArcNet", arc=CONV_ARC, normalize=False), PIXELS, 3)
    raw.load_state_dict(net.state_dict())
    torch.testing.assert_close(raw(x.float() / 255), out)


def test_q_of_state_and_action_concatenates_before_the_body():
    """SAC's Q(s, a): the body's first layer takes O + E = 4 + 2 inputs; the output is the body on cat(s, a)."""
    net = make_net(NetSpec(type="TorchArcNet", arc=MLP_ARC), BOX4, 1, extra_in_dim=2)
    first = next(m for m in net.body.modules() if isinstance(m, torch.nn.Linear))
    assert first.in_features == 6
    s, a = torch.randn(5, 4), torch.randn(5, 2)
    torch.testing.assert_close(net(s, a), net.heads[0](net.body(torch.cat([s, a], -1))))


def test_the_spec_dict_is_left_as_written():
    """torcharc's validators rewrite the dict they get ({Tanh: null} -> {Tanh: {}}): the net passes a copy, so the
    spec (its hash, the saved spec a resume compares) is unchanged."""
    arc = copy.deepcopy(MLP_ARC)
    make_net(NetSpec(type="TorchArcNet", arc=arc), BOX4, 2)
    assert arc == MLP_ARC and arc["modules"]["body"]["Sequential"][1] == {"Tanh": None}


def test_bad_arcs_are_refused_with_the_key():
    with pytest.raises(ValueError, match="does not fit observations of shape"):
        make_net(NetSpec(type="TorchArcNet", arc=arc_of({"LazyConv2d": {"out_channels": 2, "kernel_size": 30}})),
                 PIXELS, 2)
    with pytest.raises(ValueError, match="agent.net.arc: net.type TorchArcNet needs"):
        make_net(NetSpec(type="TorchArcNet"), BOX4, 2)
    with pytest.raises(ValueError, match="torcharc cannot build it"):
        make_net(NetSpec(type="TorchArcNet", arc=arc_of({"NoSuchLayer": None})), BOX4, 2)


@pytest.mark.parametrize("arc, message", [
    (None, "agent.net.arc: net.type TorchArcNet needs a torcharc spec"),
    (arc_of({"LazyLinear": {"out_features": 8, "no_such_kwarg": 1}}), "agent.net.arc: torcharc cannot build it"),
    ({"modules": {"body": {"Tanh": None}}, "graph": {"input": "x", "modules": {"body": ["y"]}, "output": "body"}},
     "agent.net.arc: torcharc cannot build it"),
    ([1, 2], "agent.net.arc: expected dict"),
])
@pytest.mark.slm_lab_specs
def test_spec_validation_names_agent_net_arc(arc, message):
    overrides = ["agent.net.type=TorchArcNet"] + ([] if arc is None else [f"agent.net.arc={arc!r}"])
    with pytest.raises(SpecError) as err:
        load_spec(str(SLM_SPECS / "benchmark" / "ppo" / "ppo_cartpole.json"), "ppo_cartpole",
                  [o.replace("'", '"').replace("None", "null") for o in overrides])
    assert any(message in p for p in err.value.problems), err.value.problems


@pytest.mark.slm_lab_specs
def test_separate_actor_critic_and_target_nets_are_materialized_before_optimizers():
    """ppo_cartpole_arc (shared: false): actor and critic are separate arc nets, their optimizers hold every
    parameter; DQN's target copy has the online net's weights."""
    ppo = make_algo("ppo_cartpole_arc", [], spec_file=str(SLM_SPECS / "benchmark_arc/ppo/ppo_classic_arc.yaml"))
    assert sorted(ppo.nets) == ["actor", "critic"]
    for name in ("actor", "critic"):
        net, optim = ppo.nets[name], ppo.optims[name]
        assert isinstance(net, TorchArcNet)
        held = {id(p) for group in optim.param_groups for p in group["params"]}
        assert held == {id(p) for p in net.parameters()}
    dqn = make_algo("dqn_boltzmann_cartpole_arc", [],
                    spec_file=str(SLM_SPECS / "benchmark_arc/dqn/dqn_classic_arc.yaml"))
    online, target = dqn.nets["net"].state_dict(), dqn.nets["target_net"].state_dict()
    assert list(online) == list(target) and all(torch.equal(online[k], target[k]) for k in online)


@pytest.mark.parametrize("rel_file, name", [
    ("benchmark_arc/reinforce/reinforce_arc.yaml", "reinforce_cartpole_arc"),
    ("benchmark_arc/ppo/ppo_classic_arc.yaml", "ppo_cartpole_arc"),
    ("benchmark_arc/sarsa/sarsa_arc.yaml", "sarsa_boltzmann_cartpole_arc"),
    ("benchmark_arc/sac/sac_classic_arc.yaml", "sac_pendulum_arc"),
])
@pytest.mark.slm_lab_specs
def test_slm_lab_arc_entries_run_unmodified(tmp_path, rel_file, name):
    run_slm_dev(tmp_path, rel_file, name)


@pytest.mark.slm_lab_specs
def test_arc_resume_is_exact(tmp_path):
    """ppo_cartpole_arc stopped at frame 300 and resumed: same train_df, weights_sha256 and clock."""
    overrides = ["env.max_frame=600", "agent.algorithm.time_horizon=32", "agent.algorithm.minibatch_size=32",
                 "agent.algorithm.training_epoch=2", "meta.log_frequency=100", "meta.eval_frequency=10000"]
    straight = assert_resume_exact(tmp_path, "ppo_cartpole_arc", overrides, 300,
                                   spec_file=str(SLM_SPECS / "benchmark_arc/ppo/ppo_classic_arc.yaml"))
    assert straight.clock.opt_step > 0
