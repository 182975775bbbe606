"""Nets with a leading seed dimension: K seeds' copies of one net as stacked parameters, one batched op per layer.

``seed_linear`` is the layer: weights (K, out, in), biases (K, 1, out), inputs (K, B, in) -> (K, B, out) by
``torch.baddbmm``, row k what ``torch.nn.functional.linear`` of seed k's weights gives on seed k's rows (to float
rounding: the batched kernel may sum in another order). ``SeedMLP`` is a ``StackedMLP`` (``agents.nets.mlp``: K
single-head ``MLPNet``s stacked, the members' parameters turned into views of their slice) whose forward takes one
batch per seed instead of one batch for all. ``SeedNet`` does the same for a ``ConvNet`` (one head or several) and
for an ``MLPNet`` with several heads (a shared actor-critic): its linear layers by ``seed_linear``, its convolutions
one ``conv2d`` per seed and layer on that seed's channels-last slice (on a CPU the K per-seed convolutions of the
Nature CNN take the time one convolution of all K x B frames takes; a grouped convolution, ``groups=K`` over
(B, K*C, H, W), took 1.2-1.9x that, forward and backward, one thread). ``seed_net`` picks the one for K members.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from agents.nets import ConvNet, MLPNet, StackedMLP, stackable


def seed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """K linear layers at once: ``x`` (K, B, in), ``weight`` (K, out, in), ``bias`` (K, 1, out) -> (K, B, out),
    ``out[k] = x[k] @ weight[k].T + bias[k]`` (one ``torch.baddbmm``)."""
    return torch.baddbmm(bias, x, weight.transpose(1, 2))


class SeedMLP(StackedMLP):
    """The MLPs of K seeds (one ``MLPNet`` each, of one architecture) as one net with a leading seed dim.

    Built from the K member nets, which keep their modules: each member's weights and biases become views of its
    slice of the stacked parameters (``StackedMLP``), so a member's ``state_dict``, forward and
    ``Algorithm.weights_sha256`` stay those of its own session's net and always show the current values. Train
    the stack's own ``parameters()`` (weights (K, out, in) then biases (K, 1, out); ``member_names`` names the
    member parameter each one stacks); the members' views take no gradients.

    Args:
        nets: K >= 1 single-head ``MLPNet``s without layer or batch norm (``agents.nets.stackable``), equal in
            layer shapes and activations; member k is seed k.

    Forward: observations (K, B, *O) (cast to float32, flattened per row) -> (K, B, out_dim), row k what member
    k's forward gives on ``x[k]`` (to float rounding).

    Raises:
        ValueError: nets that cannot be stacked (see ``StackedMLP``).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        """Per-seed batches (K, B, *O) -> (K, B, out_dim); see the class docstring."""
        h = (x if x.is_floating_point() else x.float()).flatten(2)
        for w, b, act in self.layers:
            h = act.forward(seed_linear(h, w, b))
        return h

    def stack_of(self) -> dict[str, tuple[nn.Parameter, bool]]:
        """Member parameter name (e.g. ``body.1.weight``) -> (the stacked parameter holding it, whether it is a
        bias, whose member slice is ``stack[k, 0]`` rather than ``stack[k]``)."""
        params = list(self.parameters())
        n = len(self.weights)
        return {name: (params[i], i >= n) for i, name in enumerate(self.member_names)}


def seed_net_problem(net: nn.Module) -> str | None:
    """Why ``SeedNet`` cannot stack nets like ``net``, None when it can: it takes exactly a ``ConvNet`` or an
    ``MLPNet`` (not a dueling, recurrent or arc net) whose layers are Linear / Conv2d and elementwise
    activations (no layer or batch norm)."""
    if type(net) not in (ConvNet, MLPNet):
        return f"a {type(net).__name__} has no seed-stacked form (ConvNet and MLPNet do)"
    norms = [type(m).__name__ for m in net.modules() if isinstance(m, (nn.LayerNorm, nn.BatchNorm1d, nn.BatchNorm2d))]
    if norms:
        return f"a net with {norms[0]} layers has no seed-stacked form"
    return None


def _pairs(modules: Sequence[nn.Module]) -> list[tuple[nn.Module, nn.Module]]:
    """(Linear or Conv2d, the activation module after it, or Identity) per weight layer of ``modules``."""
    mods = [m for m in modules if not isinstance(m, nn.Flatten)]
    out = []
    for i, m in enumerate(mods):
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nxt = mods[i + 1] if i + 1 < len(mods) and not isinstance(mods[i + 1], (nn.Linear, nn.Conv2d)) else None
            out.append((m, nxt if nxt is not None else nn.Identity()))
    return out


def seed_channels_last(x: torch.Tensor) -> torch.Tensor:
    """Images (K, B, C, H, W) with each seed's slice ``x[k]`` in channels-last memory (strides of a (K, B, H, W, C)
    contiguous tensor); no copy when ``x`` is already so laid out."""
    return x.permute(0, 1, 3, 4, 2).contiguous().permute(0, 1, 4, 2, 3)


class SeedNet(nn.Module):
    """The nets of K seeds (one ``ConvNet``, or one ``MLPNet`` with one head or several, each) as one net with a
    leading seed dim; each member built as its own session builds it.

    Every member parameter is stacked along a new leading dim, (K, *shape) (conv weights with each seed's slice in
    channels-last memory, as the member's ``ConvNet`` keeps them), and the member's parameter becomes a view of its
    slice (no gradient), so a member's ``state_dict``, forward and ``Algorithm.weights_sha256`` stay those of its
    own session's net and always show the current values. Train the stack's ``parameters()`` (in the order of a
    member's ``named_parameters``, ``member_names``).

    Forward, as the members' (``ConvNet.features`` / ``MLPNet.features``, then the heads), per seed: a conv net's
    images (K, B, *in_shape) in any dtype are laid out (C, H, W) channels-last per seed, cast to float32 (or the
    net's bfloat16 ``precision``, under ``torch.autocast`` as the member) and scaled by the member's ``obs_scale``,
    one seed at a time (the float copy of one seed's batch at a time); each seed's convolutions are
    ``F.conv2d`` with its slice of the stacked weights; the flattened features (K, B, F) then go through the fc
    layers and heads by ``seed_linear``. An MLP's observations are flattened per row (K, B, O). Extra inputs
    (K, B, E) are concatenated where the member concatenates them. Output: (K, B, out_dim), or a list of
    (K, B, out_dim_h) with several heads; row k what member k's forward gives on ``x[k]`` (to float rounding).

    Args:
        nets: K >= 1 nets with ``seed_net_problem`` None, equal in type, parameter shapes and activations.

    Raises:
        ValueError: nets that cannot be stacked (names why).
    """

    def __init__(self, nets: Sequence[nn.Module]) -> None:
        super().__init__()
        if not nets:
            raise ValueError("SeedNet needs at least one net")
        first = nets[0]
        problem = seed_net_problem(first)
        if problem is not None:
            raise ValueError(problem)
        if any(type(n) is not type(first) for n in nets) or len({tuple((k, v.shape) for k, v in n.state_dict().items())
                                                                  for n in nets}) != 1:
            raise ValueError("SeedNet needs nets of one type and one architecture")
        self.conv_net = isinstance(first, ConvNet)
        self.single_head = first.single_head
        self.k = len(nets)
        self.member_names = [name for name, _ in first.named_parameters()]
        stacks = {}
        for name in self.member_names:
            values = [n.get_parameter(name).detach() for n in nets]
            if values[0].dim() == 4:  # conv weight: each seed's (out, in, kh, kw) slice channels-last
                stack = torch.stack([v.permute(0, 2, 3, 1) for v in values]).permute(0, 1, 4, 2, 3)
            else:
                stack = torch.stack(values)
            stacks[name] = nn.Parameter(stack)
        self.stacks = nn.ParameterList(stacks.values())
        for k, net in enumerate(nets):  # members alias their slice (views share the stack's storage)
            for name, stack in stacks.items():
                owner, _, attr = name.rpartition(".")
                setattr(net.get_submodule(owner), attr, nn.Parameter(stack.detach()[k], requires_grad=False))

        def plan(modules: Sequence[nn.Module]) -> tuple:
            names = {id(p): n for n, p in first.named_parameters()}
            return tuple((stacks[names[id(m.weight)]], stacks[names[id(m.bias)]], act,
                          (m.stride, m.padding, m.dilation) if isinstance(m, nn.Conv2d) else None)
                         for m, act in _pairs(modules))

        self.layout, self.obs_scale = getattr(first, "layout", None), getattr(first, "obs_scale", None)
        self.autocast_dtype: torch.dtype | None = getattr(first, "autocast_dtype", None)
        if self.conv_net:
            self.convs, self.body = plan(list(first.conv)), plan(list(first.fc))
        else:
            self.convs, self.body = (), plan(list(first.body))
        self.heads = tuple(plan(list(head))[0] for head in first.heads)

    def stack_of(self) -> dict[str, tuple[nn.Parameter, bool]]:
        """Member parameter name (e.g. ``conv.0.weight``) -> (the stacked parameter holding it, False: the
        member's slice of each is ``stack[k]``)."""
        return {name: (p, False) for name, p in zip(self.member_names, self.stacks)}

    def conv_features(self, x: torch.Tensor) -> torch.Tensor:
        """Flattened conv output (K, B, F) of images (K, B, *in_shape), see the class docstring."""
        if self.layout == "hw":
            x = x.unsqueeze(2)
        elif self.layout == "hwc":
            x = x.permute(0, 1, 4, 2, 3)
        x = seed_channels_last(x)
        dtype = self.autocast_dtype or torch.float32
        weights = [(w.unbind(0), b.unbind(0), act, conv) for w, b, act, conv in self.convs]
        out = []
        for k, xk in enumerate(x.unbind(0)):
            if xk.dtype != dtype:  # as ConvNet.features: cast once, scaled in place (layout kept)
                xk = xk.to(dtype)
                if self.obs_scale is not None:
                    xk.mul_(self.obs_scale)
            elif self.obs_scale is not None:
                xk = xk * self.obs_scale
            h = xk
            for ws, bs, act, (stride, padding, dilation) in weights:
                h = act.forward(F.conv2d(h, ws[k], bs[k], stride, padding, dilation))
            out.append(h.flatten(1))
        return torch.stack(out)

    def forward(self, x: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor | list[torch.Tensor]:
        """Per-seed batches (K, B, *O) and extras (K, B, E) -> (K, B, out_dim), or a list of (K, B, out_dim_h)
        with several heads; see the class docstring."""
        k, b = x.shape[:2]
        with torch.autocast(x.device.type, dtype=self.autocast_dtype or torch.bfloat16,
                            enabled=self.conv_net and self.autocast_dtype is not None):
            h = self.conv_features(x) if self.conv_net else (x if x.is_floating_point() else x.float()).flatten(2)
            if extra:
                h = torch.cat([h, *(e.reshape(k, b, -1).float() for e in extra)], dim=-1)
            for w, bias, act, _ in self.body:
                h = act.forward(seed_linear(h, w, bias.unsqueeze(1)))
            h = h.float()
        outs = [act.forward(seed_linear(h, w, bias.unsqueeze(1))) for w, bias, act, _ in self.heads]
        return outs[0] if self.single_head else outs


def seed_net(nets: Sequence[nn.Module]) -> SeedMLP | SeedNet:
    """The seed-stacked form of K member nets: a ``SeedMLP`` for single-head plain MLPs (``stackable``), else a
    ``SeedNet``.

    Raises:
        ValueError: nets that neither takes (names why).
    """
    return SeedMLP(nets) if all(stackable(n) for n in nets) else SeedNet(nets)
