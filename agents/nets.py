"""Neural networks. ``NETS`` maps the spec's ``agent.net.type`` to a class.

Every net maps a batch of observations ``(B, *O)`` to one output tensor ``(B, out_dim)`` or, with
several heads, a list of them (e.g. actor logits and critic value of a shared actor-critic). A
``ConvNet`` or recurrent net slots in with the same constructor signature and output contract.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch import nn

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


class MLPNet(nn.Module):
    """Multi-layer perceptron with one or more linear output heads.

    Args:
        in_dim: flattened observation size O.
        out_dims: size of each head; an int gives a single head.
        hid_layers: hidden layer widths, e.g. ``[64, 64]``.
        hid_layers_activation: key of ``ACTIVATIONS``.
        init_fn: key of ``INIT_FNS`` for hidden/out weights, or None for torch's default init.
        out_layer_activation: activation applied on every head, or None.

    Forward: ``x`` (B, *O) float -> (B, out_dim) if one head else ``list`` of (B, out_dim_k).

    Raises:
        ValueError: unknown activation or init name (lists the valid ones).
    """

    def __init__(self, in_dim: int, out_dims: int | Sequence[int], hid_layers: Sequence[int],
                 hid_layers_activation: str = "relu", init_fn: str | None = None,
                 out_layer_activation: str | None = None) -> None:
        super().__init__()
        for name in (hid_layers_activation, out_layer_activation):
            if name is not None and name not in ACTIVATIONS:
                raise ValueError(f"unknown activation '{name}'; expected one of {sorted(ACTIVATIONS)}")
        if init_fn is not None and init_fn not in INIT_FNS:
            raise ValueError(f"unknown init_fn '{init_fn}'; expected one of {sorted(INIT_FNS)}")
        self.single_head = isinstance(out_dims, int)
        dims = [in_dim, *hid_layers]
        layers: list[nn.Module] = []
        for d_in, d_out in zip(dims[:-1], dims[1:]):
            layers += [nn.Linear(d_in, d_out), ACTIVATIONS[hid_layers_activation]()]
        self.body = nn.Sequential(nn.Flatten(), *layers)
        out_act = ACTIVATIONS[out_layer_activation] if out_layer_activation else nn.Identity
        self.heads = nn.ModuleList(
            nn.Sequential(nn.Linear(dims[-1], d), out_act())
            for d in ([out_dims] if self.single_head else out_dims))
        if init_fn is not None:
            for module in self.modules():
                if isinstance(module, nn.Linear):
                    INIT_FNS[init_fn](module.weight)
                    nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor | list[torch.Tensor]:
        # Each layer's own forward(), called directly: the same ops as calling the containers, without
        # torch's per-module call dispatch (these nets take no hooks), a large share of a small MLP's time.
        h = x
        for layer in self.body:
            h = layer.forward(h)
        outs = []
        for head in self.heads:
            out = h
            for layer in head:
                out = layer.forward(out)
            outs.append(out)
        return outs[0] if self.single_head else outs


NETS: dict[str, type[nn.Module]] = {"MLPNet": MLPNet}


def make_net(net_type: str, in_dim: int, out_dims: int | Sequence[int], hid_layers: Sequence[int],
             hid_layers_activation: str, init_fn: str | None,
             out_layer_activation: str | None) -> nn.Module:
    """Build a net of ``NETS[net_type]``.

    Raises:
        ValueError: unknown ``net_type`` (lists the valid ones).
    """
    if net_type not in NETS:
        raise ValueError(f"unknown net type '{net_type}'; expected one of {sorted(NETS)}")
    return NETS[net_type](in_dim, out_dims, hid_layers, hid_layers_activation, init_fn, out_layer_activation)


def polyak_update(src: nn.Module, dst: nn.Module, coef: float) -> None:
    """In place: ``dst = coef * src + (1 - coef) * dst`` over parameters (coef 1 = hard replace)."""
    with torch.no_grad():
        for p_src, p_dst in zip(src.parameters(), dst.parameters()):
            p_dst.lerp_(p_src, coef)
