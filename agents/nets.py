"""Neural networks. ``NETS`` maps the spec's ``agent.net.type`` to a class.

Every net is built from the observation space (``make_net``: its shape and dtype) plus optional extra
inputs of E features (e.g. the action of a Q(s, a) critic), and maps a batch ``(B, *O)`` (and extras
``(B, E)``) to one output tensor ``(B, out_dim)`` or, with several heads, a list of them (e.g. actor
logits and critic value of a shared actor-critic). A ``ConvNet`` or recurrent net slots in with the same
constructor signature and output contract.

Orthogonal init (``init_fn: orthogonal_``) uses the field's gains (Saxe et al. 2014 for the scheme;
gains of OpenAI baselines / SB3 / CleanRL PPO, Huang et al. 2022 "The 37 implementation details of
PPO"): ``HIDDEN_GAIN = sqrt(2)`` on hidden layers, then per head the gain the algorithm asks for:
``POLICY_GAIN = 0.01`` for a policy head (near-uniform initial policy), ``VALUE_GAIN = 1`` for value
and Q heads. Biases start at 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

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


@dataclass(frozen=True)
class NetSpec:
    """The spec ``agent.net`` section (SLM-Lab key names); validated by ``orchestrator.spec``.

    Fields:
        type: key of ``NETS``.
        hid_layers: hidden widths.
        hid_layers_activation / out_layer_activation: keys of ``ACTIVATIONS``.
        init_fn: key of ``INIT_FNS`` or None (torch default init).
        clip_grad_val: max global grad norm per optimizer step, None for no clipping.
        loss_spec: ``{"name": one of LOSSES}`` for value/Q regression.
        optim_spec: ``{"name": one of OPTIMIZERS, "lr": float, **kwargs}``.
        actor_optim_spec / critic_optim_spec: separate optimizers of an unshared actor-critic
            (default: ``optim_spec`` for both).
        lr_scheduler_spec: ``{"name": one of agents.schedules.LR_SCHEDULERS, ...}`` in frames.
        update_type: target-net update, ``"replace"`` or ``"polyak"``.
        update_frequency: frames between target-net updates.
        polyak_coef: weight of the old target in a polyak update (SLM-Lab semantics).
        shared: one body with actor and critic heads (actor-critic algorithms).
        log_std_init: for Box actions, a state-independent log-std parameter (A,) initialized to this
            value (nats), instead of a log-std head; None: the policy head outputs mean and log-std.
        normalize: SLM-Lab's "divide image input by 255", which its conv nets apply and its MLPNet
            ignores; MLP nets here ignore it too (accepted so SLM-Lab MLP specs run unmodified).
        gpu: use CUDA when visible: true, false or ``"auto"``.
        init_from: initialize the nets (only: not optimizers, not the clock) of a fresh session from
            another run's checkpoint: a session spec file ``{spec_name}_t{T}_s{S}_spec.json`` (its best
            checkpoint), a session directory, or a checkpoint directory ``ckpt/{frame:012d}``; path or
            URI. Loaded by ``orchestrator.transfer`` (agents never read files); None: fresh init.
    """

    type: str = "MLPNet"
    hid_layers: list = field(default_factory=lambda: [64])
    hid_layers_activation: str = "relu"
    out_layer_activation: str | None = None
    init_fn: str | None = None
    clip_grad_val: float | None = None
    loss_spec: dict = field(default_factory=lambda: {"name": "MSELoss"})
    optim_spec: dict = field(default_factory=lambda: {"name": "Adam", "lr": 1e-3})
    actor_optim_spec: dict | None = None
    critic_optim_spec: dict | None = None
    lr_scheduler_spec: dict | None = None
    update_type: str = field(default="replace", metadata={"choices": ("replace", "polyak")})
    update_frequency: int = field(default=1, metadata={"gt": 0})
    polyak_coef: float = field(default=0.0, metadata={"ge": 0, "le": 1})
    shared: bool = False
    log_std_init: float | None = None
    normalize: bool | None = False
    gpu: bool | str = field(default=False, metadata={"choices": (True, False, "auto")})
    init_from: str | None = None


OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "Adam": torch.optim.Adam,
    "AdamW": torch.optim.AdamW,
    "RMSprop": torch.optim.RMSprop,
    "SGD": torch.optim.SGD,
}

LOSSES: dict[str, type[nn.Module]] = {
    "MSELoss": nn.MSELoss,
    "SmoothL1Loss": nn.SmoothL1Loss,
    "HuberLoss": nn.HuberLoss,
}


def make_optim(params: Any, optim_spec: dict[str, Any]) -> torch.optim.Optimizer:
    """Build ``OPTIMIZERS[optim_spec["name"]](params, **rest)``.

    Raises:
        ValueError: unknown optimizer name (lists the valid ones) or bad keyword arguments.
    """
    name = optim_spec.get("name")
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer '{name}'; expected one of {sorted(OPTIMIZERS)}")
    kwargs = {k: v for k, v in optim_spec.items() if k != "name"}
    if not kwargs.get("fused"):
        # The multi-tensor step: the same arithmetic as the per-tensor loop (bit-identical
        # results on CPU), with far less Python overhead per step on small nets.
        kwargs.setdefault("foreach", True)
    try:
        return OPTIMIZERS[name](params, **kwargs)
    except TypeError as err:
        raise ValueError(f"bad arguments for optimizer '{name}': {err}") from None


def make_loss(loss_spec: dict[str, Any]) -> nn.Module:
    """Build ``LOSSES[loss_spec["name"]](**rest)``.

    Raises:
        ValueError: unknown loss name (lists the valid ones).
    """
    name = loss_spec.get("name")
    if name not in LOSSES:
        raise ValueError(f"unknown loss '{name}'; expected one of {sorted(LOSSES)}")
    return LOSSES[name](**{k: v for k, v in loss_spec.items() if k != "name"})


def _init_linear(layer: nn.Linear, init_fn: str | None, gain: float) -> None:
    """Init one layer's weight with ``INIT_FNS[init_fn]`` (``gain`` for orthogonal_) and zero its bias."""
    if init_fn is None:
        return
    if init_fn == "orthogonal_":
        nn.init.orthogonal_(layer.weight, gain)
    else:
        INIT_FNS[init_fn](layer.weight)
    nn.init.zeros_(layer.bias)


class MLPNet(nn.Module):
    """Multi-layer perceptron with one or more linear output heads.

    Args:
        in_dim: input features: the flattened observation size O plus extra inputs E.
        out_dims: size of each head; an int gives a single head.
        hid_layers: hidden layer widths, e.g. ``[64, 64]``.
        hid_layers_activation: key of ``ACTIVATIONS``.
        init_fn: key of ``INIT_FNS`` for hidden/out weights, or None for torch's default init.
            ``orthogonal_`` uses gain ``HIDDEN_GAIN`` (sqrt 2) on hidden layers and ``head_gains`` on heads.
        out_layer_activation: activation applied on every head, or None.
        head_gains: orthogonal gain per head (default ``VALUE_GAIN`` = 1 each); ignored by other inits.

    Forward: ``x`` (B, *O) float (any dtype, cast to float32) and optional extras (B, E) ->
    (B, out_dim) if one head else ``list`` of (B, out_dim_k).

    Raises:
        ValueError: unknown activation or init name (lists the valid ones), or a ``head_gains``
            length that differs from the number of heads.
    """

    def __init__(self, in_dim: int, out_dims: int | Sequence[int], hid_layers: Sequence[int],
                 hid_layers_activation: str = "relu", init_fn: str | None = None,
                 out_layer_activation: str | None = None, head_gains: Sequence[float] | None = None) -> None:
        super().__init__()
        for name in (hid_layers_activation, out_layer_activation):
            if name is not None and name not in ACTIVATIONS:
                raise ValueError(f"unknown activation '{name}'; expected one of {sorted(ACTIVATIONS)}")
        if init_fn is not None and init_fn not in INIT_FNS:
            raise ValueError(f"unknown init_fn '{init_fn}'; expected one of {sorted(INIT_FNS)}")
        self.single_head = isinstance(out_dims, int)
        head_dims = [out_dims] if self.single_head else list(out_dims)
        gains = [VALUE_GAIN] * len(head_dims) if head_gains is None else list(head_gains)
        if len(gains) != len(head_dims):
            raise ValueError(f"head_gains {gains} do not match the {len(head_dims)} heads {head_dims}")
        dims = [in_dim, *hid_layers]
        layers: list[nn.Module] = []
        for d_in, d_out in zip(dims[:-1], dims[1:]):
            layers += [nn.Linear(d_in, d_out), ACTIVATIONS[hid_layers_activation]()]
        self.body = nn.Sequential(nn.Flatten(), *layers)
        out_act = ACTIVATIONS[out_layer_activation] if out_layer_activation else nn.Identity
        self.heads = nn.ModuleList(nn.Sequential(nn.Linear(dims[-1], d), out_act()) for d in head_dims)
        for layer in self.body:
            if isinstance(layer, nn.Linear):
                _init_linear(layer, init_fn, HIDDEN_GAIN)
        for head, gain in zip(self.heads, gains):
            _init_linear(head[0], init_fn, gain)

    def features(self, x: torch.Tensor, extra: Sequence[torch.Tensor]) -> torch.Tensor:
        """Body output (B, hid_layers[-1]) of observations (B, *O) and extra inputs, each (B, E_k)."""
        # Each layer's own forward(), called directly: the same ops as calling the containers, without
        # torch's per-module call dispatch (these nets take no hooks), a large share of a small MLP's time.
        h = self.body[0].forward(x if x.is_floating_point() else x.float())
        if extra:
            h = torch.cat([h, *(e.reshape(len(e), -1).float() for e in extra)], dim=-1)
        for layer in self.body[1:]:
            h = layer.forward(h)
        return h

    def forward(self, x: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor | list[torch.Tensor]:
        h = self.features(x, extra)
        outs = []
        for head in self.heads:
            out = h
            for layer in head:
                out = layer.forward(out)
            outs.append(out)
        return outs[0] if self.single_head else outs


class DuelingMLPNet(MLPNet):
    """Dueling Q-network (Wang et al. 2016, arXiv:1511.06581): an MLP body, a state-value stream V (B, 1)
    and an advantage stream A (B, A), combined as ``Q = V + A - mean_a A`` (B, A).

    Same arguments as ``MLPNet`` with one head (``out_dims`` = number of actions). Both streams are
    ``VALUE_GAIN`` heads.

    Raises:
        ValueError: as ``MLPNet``, or ``out_dims`` that is not one int.
    """

    def __init__(self, in_dim: int, out_dims: int | Sequence[int], hid_layers: Sequence[int],
                 hid_layers_activation: str = "relu", init_fn: str | None = None,
                 out_layer_activation: str | None = None, head_gains: Sequence[float] | None = None) -> None:
        if not isinstance(out_dims, int):
            raise ValueError(f"DuelingMLPNet has one Q head (int out_dims), got {out_dims}")
        gains = None if head_gains is None else [head_gains[0], head_gains[0]]
        super().__init__(in_dim, [1, out_dims], hid_layers, hid_layers_activation, init_fn, out_layer_activation,
                         gains)
        self.single_head = True

    def forward(self, x: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor:
        h = self.features(x, extra)
        value, adv = (head[1].forward(head[0].forward(h)) for head in self.heads)
        return value + adv - adv.mean(dim=-1, keepdim=True)


NETS: dict[str, type[nn.Module]] = {"MLPNet": MLPNet, "DuelingMLPNet": DuelingMLPNet}


def obs_in_dim(obs_space: gym.Space) -> int:
    """Flattened observation size O of a ``Box`` space of any numeric dtype (integer observations, e.g.
    uint8 pixels, are cast to float32 in ``forward``).

    Raises:
        ValueError: other spaces (Discrete, Dict, Tuple, ...), which need an encoder of their own.
    """
    if isinstance(obs_space, gym.spaces.Box) and np.issubdtype(obs_space.dtype, np.number):
        return int(np.prod(obs_space.shape))
    raise ValueError(f"unsupported observation space {obs_space}; expected a numeric Box")


def make_net(net_spec: NetSpec, obs_space: gym.Space, out_dims: int | Sequence[int],
             head_gains: Sequence[float] | None = None, extra_in_dim: int = 0) -> nn.Module:
    """Build a net of ``NETS[net_spec.type]`` for observations of ``obs_space``.

    Args:
        net_spec: the ``agent.net`` section (type, layers, activations, init).
        obs_space: single-env observation space (numeric ``Box``); its shape gives O.
        out_dims: head size(s).
        head_gains: orthogonal-init gain per head (``POLICY_GAIN``, ``VALUE_GAIN``); default 1 each.
        extra_in_dim: E, features of the extra inputs passed to ``forward`` after the observation
            (e.g. a one-hot or continuous action for Q(s, a)).

    Raises:
        ValueError: unknown ``net_spec.type`` (lists the valid ones) or an unsupported space.
    """
    if net_spec.type not in NETS:
        raise ValueError(f"unknown net type '{net_spec.type}'; expected one of {sorted(NETS)}")
    return NETS[net_spec.type](obs_in_dim(obs_space) + extra_in_dim, out_dims, net_spec.hid_layers,
                               net_spec.hid_layers_activation, net_spec.init_fn, net_spec.out_layer_activation,
                               head_gains)


def polyak_update(src: nn.Module, dst: nn.Module, coef: float) -> None:
    """In place: ``dst = coef * src + (1 - coef) * dst`` over parameters (coef 1 = hard replace)."""
    with torch.no_grad():
        for p_src, p_dst in zip(src.parameters(), dst.parameters()):
            p_dst.lerp_(p_src, coef)
