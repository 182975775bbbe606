"""The MLP family: ``MLPNet``, ``DuelingMLPNet`` and ``StackedMLP`` (K MLPs run as one batched ensemble)."""

from __future__ import annotations

from typing import Sequence

import gymnasium as gym
import torch
from torch import nn

from agents.nets.layers import (
    ACTIVATIONS,
    HIDDEN_GAIN,
    INIT_FNS,
    VALUE_GAIN,
    RowBatchNorm1d,
    dueling_q,
    hidden_activation,
    init_linear,
    obs_in_dim,
)
from agents.nets.spec import NetSpec


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
        layer_norm: a ``LayerNorm`` after each hidden Linear, before its activation (SLM-Lab v5.3's
            ``layer_norm``, as in BRO, Nauman et al. 2024).
        batch_norm: a ``RowBatchNorm1d`` there instead (SLM-Lab v5.3's ``batch_norm``, which wins over
            ``layer_norm`` as in its ``build_fc_model``).

    Forward: ``x`` (B, *O) float (any dtype, cast to float32) and optional extras (B, E) ->
    (B, out_dim) if one head else ``list`` of (B, out_dim_k).

    Raises:
        ValueError: unknown activation or init name (lists the valid ones), or a ``head_gains``
            length that differs from the number of heads.
    """

    def __init__(self, in_dim: int, out_dims: int | Sequence[int], hid_layers: Sequence[int],
                 hid_layers_activation: str = "relu", init_fn: str | None = None,
                 out_layer_activation: str | None = None, head_gains: Sequence[float] | None = None,
                 layer_norm: bool = False, batch_norm: bool = False) -> None:
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
            norm = [RowBatchNorm1d(d_out)] if batch_norm else [nn.LayerNorm(d_out)] if layer_norm else []
            layers += [nn.Linear(d_in, d_out), *norm, hidden_activation(hid_layers_activation)]
        self.body = nn.Sequential(nn.Flatten(), *layers)
        out_act = ACTIVATIONS[out_layer_activation] if out_layer_activation else nn.Identity
        self.heads = nn.ModuleList(nn.Sequential(nn.Linear(dims[-1], d), out_act()) for d in head_dims)
        for layer in self.body:
            if isinstance(layer, nn.Linear):
                init_linear(layer, init_fn, HIDDEN_GAIN, hid_layers_activation)
        for head, gain in zip(self.heads, gains):
            init_linear(head[0], init_fn, gain, hid_layers_activation)

    @classmethod
    def from_spec(cls, net_spec: NetSpec, obs_space: gym.Space, out_dims: int | Sequence[int],
                  head_gains: Sequence[float] | None = None, extra_in_dim: int = 0) -> MLPNet:
        """The net of ``net_spec`` for a flattened ``obs_space`` (O = prod of its shape) plus E extra inputs.

        Raises:
            ValueError: as the constructor, or an unsupported space. ``net_spec.normalize`` is ignored,
                as SLM-Lab's MLPNet ignores it (its conv nets divide pixels by 255).
        """
        return cls(obs_in_dim(obs_space) + extra_in_dim, out_dims, net_spec.hid_layers,
                   net_spec.hid_layers_activation, net_spec.init_fn, net_spec.out_layer_activation, head_gains,
                   net_spec.layer_norm, net_spec.batch_norm)

    def features(self, x: torch.Tensor, extra: Sequence[torch.Tensor]) -> torch.Tensor:
        """Body output (B, hid_layers[-1]) of observations (B, *O) and extra inputs, each (B, E_k)."""
        # Each layer's own forward(), called directly: the same ops as calling the containers, without
        # torch's per-module call dispatch (these nets take no hooks), a large share of a small MLP's time.
        # One iterator over the Sequential's layers: ``self.body[1:]`` would build a new Sequential per call.
        layers = iter(self.body)
        h = next(layers).forward(x if x.is_floating_point() else x.float())
        if extra:
            h = torch.cat([h, *(e.reshape(len(e), -1).float() for e in extra)], dim=-1)
        for layer in layers:
            h = layer.forward(h)
        return h

    def forward(self, x: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor | list[torch.Tensor]:
        """Outputs (B, out_dim) from inputs x (B, *O) (flattened, cast to float) and extra inputs (B, *E)
        concatenated after the first layer; one tensor per head, a list for a multi-head net."""
        h = self.features(x, extra)
        outs = []
        for head in self.heads:
            out = h
            for layer in head:
                out = layer.forward(out)
            outs.append(out)
        return outs[0] if self.single_head else outs


class StackedMLP(nn.Module):
    """K single-head ``MLPNet``s of one architecture evaluated as one ensemble (e.g. SAC's twin critics): each
    layer's K weight matrices are stacked, (K, out, in), and applied with one batched matmul
    (``torch.baddbmm``), so a forward, its backward, an optimizer step or a polyak update costs the kernel
    launches and autograd nodes of one net instead of K (the arithmetic is the same K nets', row for row).

    Built from the member nets (``__init__``), which keep their modules: each member's weights and biases become
    views of its slice of the stack, so the members' ``state_dict``, ``load_state_dict`` (in place), forward,
    ``weights_sha256`` and transfer stay those of K separate nets, and always show the ensemble's current
    values. Train the ensemble's own parameters (``parameters()``: weights (K, out, in), biases (K, 1, out));
    the members' view parameters take no gradients (``requires_grad`` false).

    Args:
        nets: K >= 1 nets with ``stackable`` true and equal layer shapes and activations.

    Forward: observations (B, *O) (cast to float32, flattened) and optional extras (B, E) -> (K, B, out_dim),
    row k what member k's forward gives.

    Raises:
        ValueError: a net that is not ``stackable``, or nets of different shapes or activations.
    """

    def __init__(self, nets: Sequence[MLPNet]) -> None:
        super().__init__()
        if not nets or not all(stackable(net) for net in nets):
            raise ValueError("StackedMLP needs single-head MLPNets without layer_norm or batch_norm")
        plans = [self._plan(net) for net in nets]
        shapes = [[(lin.weight.shape, type(act)) for lin, act in plan] for plan in plans]
        if any(s != shapes[0] for s in shapes):
            raise ValueError(f"StackedMLP needs nets of one architecture, got layers {shapes}")
        self.acts = [act for _, act in plans[0]]  # elementwise activation modules, shared by the members
        names = {id(p): n for n, p in nets[0].named_parameters()}
        # the member parameter each of parameters() stacks, by name (e.g. "body.1.weight"), weights then biases
        self.member_names = [names[id(lin.weight)] for lin, _ in plans[0]] + \
            [names[id(lin.bias)] for lin, _ in plans[0]]
        self.weights = nn.ParameterList(torch.stack([plan[i][0].weight.detach() for plan in plans])
                                        for i in range(len(plans[0])))
        self.biases = nn.ParameterList(torch.stack([plan[i][0].bias.detach() for plan in plans]).unsqueeze(1)
                                       for i in range(len(plans[0])))
        for k, plan in enumerate(plans):  # members alias their slice (views share the stack's storage)
            for i, (lin, _) in enumerate(plan):
                lin.weight = nn.Parameter(self.weights[i].detach()[k], requires_grad=False)
                lin.bias = nn.Parameter(self.biases[i].detach()[k, 0], requires_grad=False)
        # (weight, bias, activation) per layer as a plain tuple: indexing ParameterLists costs ~0.1 ms per SAC
        # update in Python; the Parameter objects stay the same (``to``, ``load_state_dict`` change them in place)
        self.layers = tuple(zip(self.weights, self.biases, self.acts))

    @staticmethod
    def _plan(net: MLPNet) -> list[tuple[nn.Linear, nn.Module]]:
        """(Linear, the activation after it) per layer of ``net``, the head last (Identity if none)."""
        layers = [m for m in net.body if not isinstance(m, nn.Flatten)] + list(net.heads[0])
        plan = []
        for i, m in enumerate(layers):
            if isinstance(m, nn.Linear):
                nxt = layers[i + 1] if i + 1 < len(layers) and not isinstance(layers[i + 1], nn.Linear) else None
                plan.append((m, nxt if nxt is not None else nn.Identity()))
        return plan

    def forward(self, x: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor:
        """All K members on one batch: observations (B, *O) and extras, each (B, E_k) -> (K, B, out_dim)."""
        h = (x if x.is_floating_point() else x.float()).flatten(1)
        if extra:
            h = torch.cat([h, *(e.reshape(len(e), -1).float() for e in extra)], dim=-1)
        h = h.expand(len(self.layers[0][0]), *h.shape)
        for w, b, act in self.layers:
            h = act.forward(torch.baddbmm(b, h, w.transpose(1, 2)))
        return h


def stackable(net: nn.Module) -> bool:
    """True for a net ``StackedMLP`` takes: exactly an ``MLPNet`` (not a subclass) with one head and no
    ``LayerNorm`` or batch norm."""
    return type(net) is MLPNet and net.single_head and not any(isinstance(m, (nn.LayerNorm, nn.BatchNorm1d))
                                                               for m in net.body)


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
                 out_layer_activation: str | None = None, head_gains: Sequence[float] | None = None,
                 layer_norm: bool = False, batch_norm: bool = False) -> None:
        if not isinstance(out_dims, int):
            raise ValueError(f"DuelingMLPNet has one Q head (int out_dims), got {out_dims}")
        gains = None if head_gains is None else [head_gains[0], head_gains[0]]
        super().__init__(in_dim, [1, out_dims], hid_layers, hid_layers_activation, init_fn, out_layer_activation,
                         gains, layer_norm, batch_norm)
        self.single_head = True

    def forward(self, x: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor:
        """Q-values (B, A) from inputs x (B, *O) through ``dueling_q``."""
        return dueling_q(self.heads, self.features(x, extra))
