"""The building blocks every net family shares: activations, initialisation and its gains, row batch norm,
linear heads, the dueling combination, the flattened observation size.

Orthogonal init (``init_fn: orthogonal_``) uses the field's gains (Saxe et al. 2014 for the scheme; gains of
OpenAI baselines / SB3 / CleanRL PPO, Huang et al. 2022): ``HIDDEN_GAIN = sqrt(2)`` on hidden layers, then per
head the gain the algorithm asks for (``POLICY_GAIN``, ``VALUE_GAIN``); xavier init the gain of
``hid_layers_activation`` (SLM-Lab v5.3); see the ``agents.nets`` package docstring."""

from __future__ import annotations

import math
from typing import Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import nn

HIDDEN_GAIN = math.sqrt(2.0)
POLICY_GAIN = 0.01
VALUE_GAIN = 1.0

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "selu": nn.SELU,
    "elu": nn.ELU,
    "leakyrelu": nn.LeakyReLU,
    "sigmoid": nn.Sigmoid,
    "gelu": nn.GELU,
    "linear": nn.Identity,
}

INIT_FNS = {
    "orthogonal_": nn.init.orthogonal_,
    "xavier_uniform_": nn.init.xavier_uniform_,
    "xavier_normal_": nn.init.xavier_normal_,
    "kaiming_uniform_": nn.init.kaiming_uniform_,
    "kaiming_normal_": nn.init.kaiming_normal_,
}


def init_linear(layer: nn.Module, init_fn: str | None, gain: float, activation: str) -> None:
    """Init one Linear/Conv layer's weight with ``INIT_FNS[init_fn]`` and zero its bias (None: torch's default init).

    ``orthogonal_`` takes ``gain`` (the field's per-layer gains, module docstring); ``xavier_*`` take
    ``torch.nn.init.calculate_gain(activation)`` (the net's ``hid_layers_activation``; sqrt 2 for relu, 5/3 for
    tanh, 1 where torch has no gain: elu, gelu) on every layer, heads included, as SLM-Lab v5.3's
    ``net_util.init_layers``; ``kaiming_*`` torch's default gain sqrt 2 (SLM-Lab's, which allows only relu).
    """
    if init_fn is None:
        return
    if init_fn == "orthogonal_":
        nn.init.orthogonal_(layer.weight, gain)
    elif init_fn.startswith("xavier"):
        INIT_FNS[init_fn](layer.weight, gain=activation_gain(activation))
    else:  # kaiming: torch's default gain sqrt 2, what SLM-Lab's nonlinearity=relu / leaky_relu (slope 0) gives
        INIT_FNS[init_fn](layer.weight)
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)


def activation_gain(activation: str) -> float:
    """``torch.nn.init.calculate_gain`` of an ``ACTIVATIONS`` key (``leakyrelu`` as torch's ``leaky_relu``, slope
    0.01 as ``nn.LeakyReLU``'s default); 1 for the activations torch has no gain for (elu, gelu). Raises nothing."""
    try:
        return nn.init.calculate_gain({"leakyrelu": "leaky_relu"}.get(activation, activation))
    except ValueError:
        return 1.0


class RowBatchNorm1d(nn.BatchNorm1d):
    """``nn.BatchNorm1d`` (Ioffe and Szegedy 2015) whose train-mode forward of a single row (B = 1: acting on one
    env, a one-env evaluation) normalizes by the running statistics and leaves them unchanged, where torch's raises
    (one value per feature has no batch variance; SLM-Lab's MLPNet stops there). Every other batch, and eval mode,
    as ``nn.BatchNorm1d``; the same parameters and buffers (state dicts load either way).

    Forward: (B, F) -> (B, F).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Batch norm of (B, F); see the class docstring for B = 1 in train mode."""
        if self.training and x.shape[0] == 1:
            return nn.functional.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                                            training=False, eps=self.eps)
        return super().forward(x)


def hidden_activation(name: str) -> nn.Module:
    """The activation module of ``ACTIVATIONS[name]`` for a hidden layer, that is one applied to the fresh output of
    a ``Linear``, ``Conv2d`` or ``LayerNorm`` (whose backward does not read their output): ReLU in place
    (``inplace=True``), which spares a new activation tensor per layer and forward (with SAC's 256-256 critics at
    batch 256, one 512 KB buffer written per layer: about 4% of a gradient step on this CPU)
    and gives the same values and gradients bit for bit; the other activations as built by default.

    Raises:
        KeyError: a name not in ``ACTIVATIONS`` (callers check it first).
    """
    return nn.ReLU(inplace=True) if name == "relu" else ACTIVATIONS[name]()


def check_names(hid_layers_activation: str, out_layer_activation: str | None, init_fn: str | None) -> None:
    """Raise ValueError naming an unknown activation or init function (with the valid ones)."""
    for name in (hid_layers_activation, out_layer_activation):
        if name is not None and name not in ACTIVATIONS:
            raise ValueError(f"unknown activation '{name}'; expected one of {sorted(ACTIVATIONS)}")
    if init_fn is not None and init_fn not in INIT_FNS:
        raise ValueError(f"unknown init_fn '{init_fn}'; expected one of {sorted(INIT_FNS)}")


def make_heads(in_dim: int, out_dims: int | Sequence[int], out_layer_activation: str | None, init_fn: str | None,
                head_gains: Sequence[float] | None, hid_layers_activation: str) -> tuple[bool, nn.ModuleList]:
    """(single_head, heads): one ``Sequential(Linear(in_dim, d), out activation)`` per head, initialized
    (``init_linear``: head gains for orthogonal, the gain of the net's ``hid_layers_activation`` for xavier).

    Raises:
        ValueError: ``head_gains`` whose length differs from the number of heads.
    """
    single = isinstance(out_dims, int)
    head_dims = [out_dims] if single else list(out_dims)
    gains = [VALUE_GAIN] * len(head_dims) if head_gains is None else list(head_gains)
    if len(gains) != len(head_dims):
        raise ValueError(f"head_gains {gains} do not match the {len(head_dims)} heads {head_dims}")
    out_act = ACTIVATIONS[out_layer_activation] if out_layer_activation else nn.Identity
    heads = nn.ModuleList(nn.Sequential(nn.Linear(in_dim, d), out_act()) for d in head_dims)
    for head, gain in zip(heads, gains):
        init_linear(head[0], init_fn, gain, hid_layers_activation)
    return single, heads


def dueling_q(heads: nn.ModuleList, h: torch.Tensor) -> torch.Tensor:
    """``Q = V + A - mean_a A`` (B, A) from features h (B, F) and the two heads [V (F -> 1), A (F -> A)]."""
    value, adv = (head[1].forward(head[0].forward(h)) for head in heads)
    return value + adv - adv.mean(dim=-1, keepdim=True)


def obs_in_dim(obs_space: gym.Space) -> int:
    """Flattened observation size O of a ``Box`` space of any numeric dtype (integer observations, e.g.
    uint8 pixels, are cast to float32 in ``forward``).

    Raises:
        ValueError: other spaces (Discrete, Dict, Tuple, ...), which need an encoder of their own.
    """
    if isinstance(obs_space, gym.spaces.Box) and np.issubdtype(obs_space.dtype, np.number):
        return int(np.prod(obs_space.shape))
    raise ValueError(f"unsupported observation space {obs_space}; expected a numeric Box")
