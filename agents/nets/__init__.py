"""Neural networks. ``NETS`` maps the spec's ``agent.net.type`` to a class.

Every net is built from the observation space (``make_net``: its shape and dtype) plus optional extra
inputs of E features (e.g. the action of a Q(s, a) critic), and maps a batch ``(B, *O)`` (and extras
``(B, E)``) to one output tensor ``(B, out_dim)`` or, with several heads, a list of them (e.g. actor
logits and critic value of a shared actor-critic). Each class builds itself from the spec with
``from_spec(net_spec, obs_space, out_dims, head_gains, extra_in_dim)``: ``MLPNet`` / ``DuelingMLPNet`` flatten
the observation, ``ConvNet`` / ``DuelingConvNet`` take image observations (C, H, W) (Mnih et al. 2015's
"Nature CNN" by default; uint8 frames are scaled by 1/255 inside the net, so replay and rollouts keep uint8);
``TorchArcNet`` builds its body from a torcharc 2 spec (``agent.net.arc``, SLM-Lab v5's TorchArcNet: the
``torcharc`` package builds the ``torch.fx`` graph; lazy layers are materialized by one dummy forward with the
observation shape; heads as ``MLPNet``; references: SLM-Lab ``slm_lab/agent/net/torcharc_net.py``, torcharc 2);
``RecurrentNet`` takes windows (L, *O) of the last L observations (SLM-Lab's RecurrentNet; the env builds the
windows, see ``seq_len_of``).

Orthogonal init (``init_fn: orthogonal_``) uses the field's gains (Saxe et al. 2014 for the scheme;
gains of OpenAI baselines / SB3 / CleanRL PPO, Huang et al. 2022 "The 37 implementation details of
PPO"): ``HIDDEN_GAIN = sqrt(2)`` on hidden layers, then per head the gain the algorithm asks for:
``POLICY_GAIN = 0.01`` for a policy head (near-uniform initial policy), ``VALUE_GAIN = 1`` for value
and Q heads. Biases start at 0. Xavier init (``xavier_uniform_`` / ``xavier_normal_``) uses SLM-Lab v5.3's gain, that
of ``hid_layers_activation`` (``torch.nn.init.calculate_gain``: sqrt 2 for relu), on every layer, heads included.

One module per family: ``spec`` (``NetSpec``), ``layers`` (activations, initialisation, heads), ``mlp``
(``MLPNet``, ``DuelingMLPNet``, ``StackedMLP``), ``conv`` (``ConvNet``, ``DuelingConvNet``), ``recurrent``
(``RecurrentNet``), ``arc`` (``TorchArcNet``) and ``optim`` (optimizers, losses, target-net updates); ``NETS``
and ``make_net`` here.
"""

from __future__ import annotations

from typing import Sequence

import gymnasium as gym
from torch import nn

from agents.nets.arc import INSTALL_HINT, TORCHARC_VERSION, TorchArcNet, arc_problems, build_arc
from agents.nets.conv import PRECISION_NETS, PRECISIONS, ConvNet, DuelingConvNet, conv_layer_args, image_layout
from agents.nets.layers import (
    ACTIVATIONS,
    HIDDEN_GAIN,
    INIT_FNS,
    POLICY_GAIN,
    VALUE_GAIN,
    RowBatchNorm1d,
    activation_gain,
    dueling_q,
    hidden_activation,
    obs_in_dim,
)
from agents.nets.mlp import DuelingMLPNet, MLPNet, StackedMLP, stackable
from agents.nets.optim import (
    FUSED_DEFAULT,
    GLOBAL_OPTIMIZERS,
    LOSSES,
    OPTIMIZERS,
    make_loss,
    make_optim,
    polyak_update,
    target_updates_due,
)
from agents.nets.recurrent import RNN_CELLS, RecurrentNet
from agents.nets.spec import NATURE_CNN, NetSpec, role_spec, seq_len_of

__all__ = ["ACTIVATIONS", "ConvNet", "DuelingConvNet", "DuelingMLPNet", "FUSED_DEFAULT", "GLOBAL_OPTIMIZERS",
           "HIDDEN_GAIN", "INIT_FNS", "INSTALL_HINT", "LOSSES", "MLPNet", "NATURE_CNN", "NETS", "NetSpec", "OPTIMIZERS",
           "POLICY_GAIN", "PRECISIONS", "PRECISION_NETS", "RNN_CELLS", "RecurrentNet", "RowBatchNorm1d", "StackedMLP",
           "TORCHARC_VERSION", "TorchArcNet", "VALUE_GAIN", "activation_gain", "arc_problems", "build_arc",
           "conv_layer_args", "dueling_q", "hidden_activation", "image_layout", "make_loss", "make_net", "make_optim",
           "obs_in_dim", "polyak_update", "role_spec", "seq_len_of", "stackable", "target_updates_due"]

NETS: dict[str, type[nn.Module]] = {"MLPNet": MLPNet, "DuelingMLPNet": DuelingMLPNet, "ConvNet": ConvNet,
                                    "DuelingConvNet": DuelingConvNet, "TorchArcNet": TorchArcNet,
                                    "RecurrentNet": RecurrentNet}


def make_net(net_spec: NetSpec, obs_space: gym.Space, out_dims: int | Sequence[int],
             head_gains: Sequence[float] | None = None, extra_in_dim: int = 0) -> nn.Module:
    """Build a net of ``NETS[net_spec.type]`` for observations of ``obs_space``.

    Args:
        net_spec: the ``agent.net`` section (type, layers, activations, init).
        obs_space: single-env observation space (numeric ``Box``); its shape gives O, its dtype the input
            scaling of conv nets (uint8: 1/255).
        out_dims: head size(s).
        head_gains: orthogonal-init gain per head (``POLICY_GAIN``, ``VALUE_GAIN``); default 1 each.
        extra_in_dim: E, features of the extra inputs passed to ``forward`` after the observation
            (e.g. a one-hot or continuous action for Q(s, a)).

    Raises:
        ValueError: unknown ``net_spec.type`` (lists the valid ones), an unsupported space, or a bad layer spec.
    """
    if net_spec.type not in NETS:
        raise ValueError(f"unknown net type '{net_spec.type}'; expected one of {sorted(NETS)}")
    return NETS[net_spec.type].from_spec(net_spec, obs_space, out_dims, head_gains, extra_in_dim)
