"""Nets with a leading seed dimension: K seeds' copies of one MLP as stacked weights, one batched matmul per layer.

``seed_linear`` is the layer: weights (K, out, in), biases (K, 1, out), inputs (K, B, in) -> (K, B, out) by
``torch.baddbmm``, row k what ``torch.nn.functional.linear`` of seed k's weights gives on seed k's rows (to float
rounding: the batched kernel may sum in another order). ``SeedMLP`` is a ``StackedMLP`` (``agents.nets.mlp``: K
single-head ``MLPNet``s stacked, the members' parameters turned into views of their slice) whose forward takes one
batch per seed instead of one batch for all.
"""

from __future__ import annotations

import torch
from torch import nn

from agents.nets import StackedMLP


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
