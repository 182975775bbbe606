"""Optimizer and loss factories (``make_optim``, ``make_loss``) and the target-net updates (``target_updates_due``,
``polyak_update``)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from agents import torch_optim
from agents.lookahead import Lookahead, check_args

OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "Adam": torch.optim.Adam,
    "AdamW": torch.optim.AdamW,
    "RMSprop": torch.optim.RMSprop,
    "SGD": torch.optim.SGD,
    "RAdam": torch.optim.RAdam,  # Liu et al. 2020, arXiv:1908.03265 (SLM-Lab v4 shipped its own copy)
    "Lookahead": Lookahead,  # a wrapper: {"name": "Lookahead", "optimizer": inner name, "alpha", "k", **inner kwargs}
    # SLM-Lab's optimizers of meta.distributed training (slm_lab/lib/optimizer.py): Adam / RMSprop (momentum 0, not
    # centered, torch's defaults) whose state SLM-Lab keeps in shared memory; here the trial's global actor
    # (orchestrator/global_params.py) holds every optimizer of such a trial, so they are plain Adam / RMSprop.
    # orchestrator.spec accepts them only with meta.distributed set.
    "GlobalAdam": torch.optim.Adam,
    "GlobalRMSprop": torch.optim.RMSprop,
}
GLOBAL_OPTIMIZERS = ("GlobalAdam", "GlobalRMSprop")  # the names above valid only with meta.distributed

LOSSES: dict[str, type[nn.Module]] = {
    "MSELoss": nn.MSELoss,
    "SmoothL1Loss": nn.SmoothL1Loss,
    "HuberLoss": nn.HuberLoss,
}

# Optimizers built with ``fused=True`` unless the spec sets ``fused`` or ``foreach``: one kernel per
# parameter tensor for the whole Adam update (CPU and CUDA), about 3x faster per step than the
# multi-tensor (foreach) path on CPU for 64-64 and 256-256 MLPs (measured 120 vs 400 us and 170 vs
# 520 us, one thread). Its float rounding differs from foreach's (last bits), deterministically.
FUSED_DEFAULT: tuple[type[torch.optim.Optimizer], ...] = (torch.optim.Adam, torch.optim.AdamW)


def make_optim(params: Any, optim_spec: dict[str, Any]) -> torch.optim.Optimizer:
    """Build ``OPTIMIZERS[optim_spec["name"]](params, **rest)``: ``fused=True`` for ``FUSED_DEFAULT`` optimizers
    unless ``fused``, ``foreach``, ``differentiable`` or ``capturable`` is given, else ``foreach=True`` by default.
    ``Lookahead`` (SLM-Lab v4's spec shape) wraps the optimizer named by its ``optimizer`` key (default ``RAdam``,
    built by this function from the remaining keys) with its ``alpha`` (default 0.5) and ``k`` (default 5).

    Raises:
        ValueError: unknown optimizer name (lists the valid ones) or bad keyword arguments.
    """
    name = optim_spec.get("name")
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer '{name}'; expected one of {sorted(OPTIMIZERS)}")
    kwargs = {k: v for k, v in optim_spec.items() if k != "name"}
    if name == "Lookahead":
        alpha, k, inner = kwargs.pop("alpha", 0.5), kwargs.pop("k", 5), kwargs.pop("optimizer", "RAdam")
        k = int(k) if isinstance(k, float) and k.is_integer() else k  # 5.0 from a YAML or JSON number
        check_args(alpha, k)
        if inner == "Lookahead" or inner not in OPTIMIZERS:
            raise ValueError(f"Lookahead optimizer: unknown inner optimizer {inner!r}; expected one of "
                             f"{sorted(set(OPTIMIZERS) - {'Lookahead'})}")
        return Lookahead(make_optim(params, {"name": inner, **kwargs}), alpha, k)
    torch_optim.defer_dynamo()  # the constructor's add_param_group would import torch._dynamo
    if OPTIMIZERS[name] in FUSED_DEFAULT and not {"fused", "foreach", "differentiable", "capturable"} & set(kwargs):
        kwargs["fused"] = True
    elif not kwargs.get("fused"):
        # The multi-tensor step: the same arithmetic as the per-tensor loop (bit-identical
        # results on CPU), with less Python overhead per step on small nets.
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


def target_updates_due(frame: int, last_frame: int, update_frequency: float) -> int:
    """Target-net updates due at ``frame``: the multiples of ``update_frequency`` frames crossed since ``last_frame``.

    A fractional ``update_frequency`` below 1 counts as 1 (one update per frame): SLM-Lab v4 updates the target
    whenever ``frame % update_frequency < num_envs`` (``util.frame_mod``), which then holds at every step; with one
    sub-env that is once per frame. A fraction above 1 (e.g. 2.5: 2 updates in 5 frames) keeps its rate.
    """
    uf = max(float(update_frequency), 1.0)
    return int(frame // uf - last_frame // uf)


def polyak_update(src: nn.Module, dst: nn.Module, coef: float) -> None:
    """In place: ``dst = coef * src + (1 - coef) * dst`` over parameters (coef 1 = hard replace)."""
    with torch.no_grad():
        for p_src, p_dst in zip(src.parameters(), dst.parameters()):
            p_dst.lerp_(p_src, coef)
