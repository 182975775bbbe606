"""Optimizer pieces of seed-stacked parameters (leading dim K, one slice per seed) that keep per-seed semantics.

* ``seed_grad_norms`` / ``clip_grads_per_seed``: the L2 gradient norm of each seed's slices only, and clipping of
  each seed to its own norm, as ``nn.utils.clip_grad_norm_`` of that seed's separate net (``Algorithm.clip_grads``).
* Elementwise optimizers (Adam, AdamW, RMSprop, SGD: every state tensor has the parameter's shape and every update
  is elementwise) stepped over the stacks are K separate optimizers, one per slice, since all K take the same
  number of steps at the same learning rate (``tests/agents/batched/test_batched.py`` checks Adam value by value).
  ``seed_optim_state`` / ``load_seed_optim_state`` move one seed's slice of such an optimizer's state to and from
  the ``state_dict`` of that seed's own optimizer, so a seed's checkpoint is a separate session's.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

# (stacked parameter, kind) holding one member parameter; seed k's slice by kind: False stack[k] (weights),
# True stack[k, 0] (biases), an int W >= 2 the rows stack[W*k : W*k + W] (a member parameter that is itself a stack
# of W, e.g. SAC's twin critics (2, out, in))
Slot = tuple[nn.Parameter, "bool | int"]

ELEMENTWISE_OPTIMIZERS = ("Adam", "AdamW", "RMSprop", "SGD")


def seed_grad_norms(grads: Sequence[torch.Tensor], k: int | None = None) -> torch.Tensor:
    """Per-seed L2 norm (K,) over gradients of stacked parameters, each (K*W, ...) with seed k's W leading rows
    contiguous (W = 1: one slice per seed; default K: the leading dim of the first): seed k's norm is over its
    rows only. Raises IndexError on an empty list."""
    k = grads[0].shape[0] if k is None else k
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.reshape(k, -1), dim=1) for g in grads]),
                                    dim=0)


def clip_grads_per_seed(params: Sequence[torch.Tensor], max_norm: float | None,
                        k: int | None = None) -> torch.Tensor | None:
    """Clip, in place, each seed's gradients (seed k's rows of the ``.grad`` of stacked parameters (K*W, ...), see
    ``seed_grad_norms``) to its own L2 norm at ``max_norm`` (None: no clipping), with ``nn.utils.clip_grad_norm_``'s
    coefficient ``min(1, max_norm / (norm + 1e-6))``; returns the per-seed norms (K,) before clipping, None when
    no parameter has a gradient."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return None
    norms = seed_grad_norms(grads, k)
    if max_norm is not None:
        coef = (max_norm / (norms + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(coef.repeat_interleave(g.shape[0] // len(coef)).view(-1, *[1] * (g.dim() - 1)))
    return norms


def _slice(value: torch.Tensor, stack: torch.Tensor, kind: bool | int, k: int) -> torch.Tensor:
    """Seed k's slice (``Slot`` kind) of a state tensor shaped like ``stack``; another shape (e.g. Adam's ``step``)
    is shared."""
    if value.shape != stack.shape:
        return value
    if isinstance(kind, bool):
        return value[k, 0] if kind else value[k]
    return value[kind * k:kind * (k + 1)]


def _member_shape(stack: torch.Tensor, kind: bool | int) -> tuple[int, ...]:
    """The shape of one seed's slice (``Slot`` kind) of ``stack``."""
    if isinstance(kind, bool):
        return tuple(stack.shape[2:] if kind else stack.shape[1:])
    return (kind, *stack.shape[1:])


def seed_optim_state(optim: torch.optim.Optimizer, member_optim: torch.optim.Optimizer,
                     slots: Sequence[Slot], k: int) -> dict[str, Any]:
    """Seed k's optimizer state as the ``state_dict`` of its own optimizer ``member_optim`` (built over the member
    parameters, never stepped): per member parameter i (in ``member_optim``'s param-group order), the k-th slice
    of every state tensor of the stack ``slots[i]`` holds, copied; the param groups' hyperparameters (lr included)
    are those of ``optim``, the optimizer over the stacks, whose groups match ``member_optim``'s one for one."""
    state = member_optim.state_dict()
    out_state: dict[int, dict[str, Any]] = {}
    for i, (stack, kind) in enumerate(slots):
        if stack in optim.state:
            out_state[i] = {key: _slice(v, stack, kind, k).clone() if isinstance(v, torch.Tensor) else v
                            for key, v in optim.state[stack].items()}
    groups = [{**{key: v for key, v in group.items() if key != "params"}, "params": mine["params"]}
              for group, mine in zip(optim.param_groups, state["param_groups"])]
    return {"state": out_state, "param_groups": groups}


def load_seed_optim_state(optim: torch.optim.Optimizer, slots: Sequence[Slot], k: int,
                          state: dict[str, Any]) -> None:
    """Write seed k's optimizer state (a ``seed_optim_state`` output, or a separate session's optimizer
    ``state_dict`` of the same parameters) into its slices of ``optim``'s state over the stacks; a stack without
    state gets zeros first. Tensors shared by the seeds (Adam's ``step``) take the seed's value.

    Raises:
        ValueError: a shared value (e.g. ``step``) that differs from what another seed already set, or a state
            tensor whose shape is neither the member parameter's nor a shared one's.
    """
    for i, (stack, kind) in enumerate(slots):
        saved = state["state"].get(i, state["state"].get(str(i)))
        if saved is None:
            continue
        mine = optim.state[stack]
        member_shape = _member_shape(stack, kind)
        for key, v in saved.items():
            if not isinstance(v, torch.Tensor):
                mine[key] = v
            elif tuple(v.shape) == member_shape and v.dim() > 0:
                if key not in mine:
                    mine[key] = torch.zeros_like(stack)
                _slice(mine[key], stack, kind, k).copy_(v)
            elif v.dim() == 0 or v.shape != stack.shape:
                if key in mine and k > 0 and not torch.equal(mine[key].cpu(), v.cpu()):
                    raise ValueError(f"optimizer state '{key}' of seed {k} ({v.tolist()}) differs from the other "
                                     f"seeds' ({mine[key].tolist()}): batched seeds must have stepped alike")
                on_param = key != "step" or optim.defaults.get("fused") or optim.defaults.get("capturable")
                mine[key] = v.detach().clone().to(stack.device if on_param else v.device)
            else:
                raise ValueError(f"optimizer state '{key}' of shape {tuple(v.shape)} fits neither parameter "
                                 f"{tuple(member_shape)} nor a shared scalar")
