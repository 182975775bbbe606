"""``TorchArcNet``: a body built by torcharc 2 from ``agent.net.arc`` (SLM-Lab v5's TorchArcNet), then linear
heads; ``build_arc`` and the spec-time check ``arc_problems``."""

from __future__ import annotations

import copy
from typing import Any, Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.nn.parameter import is_lazy

import agents.batch_renorm  # noqa: F401  (registers BatchRenorm1d / LazyBatchRenorm1d in torch.nn for arcs)
from agents.nets.layers import HIDDEN_GAIN, check_names, init_linear, make_heads
from agents.nets.spec import NetSpec

TORCHARC_VERSION = "2.1.2"
INSTALL_HINT = f"pip install --no-deps --ignore-requires-python torcharc=={TORCHARC_VERSION}"
_INIT_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def build_arc(arc: Any) -> nn.Module:
    """The torcharc module (a ``torch.fx.GraphModule``) of a torcharc 2 spec dict; lazy layers stay lazy.

    Raises:
        ValueError: ``arc`` not a dict, torcharc not installed (with the install command), or a spec torcharc
            rejects (unknown ``torch.nn`` class, bad kwargs, a graph naming a missing node, a dict output).
    """
    if not isinstance(arc, dict):
        raise ValueError(f"expected a torcharc spec {{modules: ..., graph: ...}}, got {arc!r}")
    try:
        import torcharc
    except ImportError:
        raise ValueError(f"TorchArcNet needs the torcharc package ({INSTALL_HINT})") from None
    try:
        body = torcharc.build(copy.deepcopy(arc))  # its validators rewrite the dict ({ReLU: null} -> {ReLU: {}})
    except Exception as err:  # pydantic's ValidationError, torch's TypeError, a KeyError of the graph, ...
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip() and "errors.pydantic.dev" not in ln]
        text = "; ".join(lines)
        raise ValueError(f"torcharc cannot build it: {type(err).__name__}: "
                         f"{text if len(text) <= 400 else text[:397] + '...'}") from None
    out = [n for n in body.graph.nodes if n.op == "output"][0].args[0]
    if isinstance(out, dict):
        raise ValueError(f"graph.output: expected one node name or a list (the first is used), got {out}")
    return body


class TorchArcNet(nn.Module):
    """A torcharc body, flattened, then one or more linear heads (SLM-Lab v5 ``TorchArcNet``).

    Args:
        arc: torcharc 2 spec of the body, e.g. ``{modules: {body: {Sequential: [{LazyLinear: {out_features:
            64}}, {Tanh: null}]}}, graph: {input: x, modules: {body: [x]}, output: body}}``. Its graph takes one
            input; a list/tuple output uses its first element, as SLM-Lab does.
        in_shape: one observation's shape O; the body sees (B, *O) as is (no channel permutation), or with
            extra inputs the flat (B, prod(O) + E).
        out_dims / head_gains / out_layer_activation / init_fn: as ``MLPNet``. With ``init_fn`` every Linear and
            Conv layer of the body is re-initialized (orthogonal: gain ``HIDDEN_GAIN``; xavier: the gain of
            ``hid_layers_activation``), biases 0.
        extra_in_dim: E, features of extra inputs (e.g. the action of Q(s, a)), concatenated to the flattened
            observation before the body (SLM-Lab's SAC critic input ``cat(state, action)``).
        obs_scale: multiplier of the input (1/255 for pixels) or None.
        hid_layers_activation: ``ACTIVATIONS`` key whose gain xavier init uses (SLM-Lab's TorchArcNet reads the
            spec's ``hid_layers_activation`` for it, default relu); the arc itself names its own activations.

    Lazy layers (``LazyLinear``, ``LazyConv2d``, ...) are materialized in the constructor by one forward of a
    zero batch (B = 1) in eval mode, so parameters exist before optimizers are built and checkpoints loaded.

    Forward: ``x`` (B, *O) any dtype (cast to float32, times ``obs_scale``) and extras (B, E) ->
    (B, out_dim) with one head, else a list of (B, out_dim_k).

    Raises:
        ValueError: as ``build_arc``; the dummy forward fails (shapes that do not fit the observation), the
            body leaves lazy parameters unmaterialized or returns no tensor, or unknown init/activation names.
    """

    def __init__(self, arc: dict, in_shape: Sequence[int], out_dims: int | Sequence[int],
                 init_fn: str | None = None, out_layer_activation: str | None = None,
                 head_gains: Sequence[float] | None = None, extra_in_dim: int = 0,
                 obs_scale: float | None = None, hid_layers_activation: str = "relu") -> None:
        super().__init__()
        check_names(hid_layers_activation, out_layer_activation, init_fn)
        self.in_shape, self.extra_in_dim, self.obs_scale = tuple(in_shape), extra_in_dim, obs_scale
        self.body = build_arc(arc)
        dummy = torch.zeros(1, *self.in_shape)
        extra = (torch.zeros(1, extra_in_dim),) if extra_in_dim else ()
        self.body.eval()  # batch statistics of one row would fail (BatchNorm) and must not be recorded
        with torch.no_grad():
            try:
                feat_dim = int(self.features(dummy, extra).shape[-1])
            except (RuntimeError, ValueError, TypeError, IndexError) as err:
                raise ValueError(f"arc does not fit observations of shape {self.in_shape}"
                                 f"{f' plus {extra_in_dim} extra inputs' if extra_in_dim else ''}: {err}") from None
        self.body.train()
        lazy = [name for name, p in [*self.body.named_parameters(), *self.body.named_buffers()] if is_lazy(p)]
        if lazy:
            raise ValueError(f"arc: lazy layers not reached from graph.input, left unmaterialized: {lazy}")
        self.single_head, self.heads = make_heads(feat_dim, out_dims, out_layer_activation, init_fn, head_gains,
                                                   hid_layers_activation)
        for layer in self.body.modules():
            if isinstance(layer, _INIT_LAYERS):
                init_linear(layer, init_fn, HIDDEN_GAIN, hid_layers_activation)

    @classmethod
    def from_spec(cls, net_spec: NetSpec, obs_space: gym.Space, out_dims: int | Sequence[int],
                  head_gains: Sequence[float] | None = None, extra_in_dim: int = 0) -> TorchArcNet:
        """The net of ``net_spec.arc`` for a numeric Box ``obs_space``.

        ``normalize`` (SLM-Lab's TorchArcNet key): true scales inputs by 1/255, false never, None (the lab's
        default) only when the space is uint8 (pixels).

        Raises:
            ValueError: no ``arc``, a space that is not a numeric Box, or as the constructor.
        """
        if net_spec.arc is None:
            raise ValueError("agent.net.arc: net.type TorchArcNet needs a torcharc spec {modules, graph} (or, for "
                             "the actor and critic of an actor-critic algorithm, actor_arc and critic_arc)")
        if not (isinstance(obs_space, gym.spaces.Box) and np.issubdtype(obs_space.dtype, np.number)):
            raise ValueError(f"TorchArcNet needs a numeric Box observation space, got {obs_space}")
        scale = net_spec.normalize if net_spec.normalize is not None else obs_space.dtype == np.uint8
        return cls(net_spec.arc, obs_space.shape, out_dims, net_spec.init_fn, net_spec.out_layer_activation,
                   head_gains, extra_in_dim, 1.0 / 255.0 if scale else None, net_spec.hid_layers_activation)

    def features(self, x: torch.Tensor, extra: Sequence[torch.Tensor]) -> torch.Tensor:
        """Flattened body output (B, F) of observations (B, *O) and extra inputs, each (B, E_k)."""
        x = x.float()
        if self.obs_scale is not None:
            x = x * self.obs_scale
        if extra:
            x = torch.cat([x.reshape(len(x), -1), *(e.reshape(len(e), -1).float() for e in extra)], dim=-1)
        h = self.body(x)
        if isinstance(h, (list, tuple)):
            h = h[0]
        if not isinstance(h, torch.Tensor):
            raise ValueError(f"arc graph.output gave {type(h).__name__}, expected a tensor")
        return h.reshape(len(h), -1)

    def forward(self, x: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor | list[torch.Tensor]:
        """(B, *O) and extras (B, E) -> (B, out_dim), or a list of (B, out_dim_k) with several heads."""
        h = self.features(x, extra)
        outs = [head(h) for head in self.heads]
        return outs[0] if self.single_head else outs


def arc_problems(arc: Any) -> list[str]:
    """Spec-time problems of ``agent.net.arc`` (torcharc validation and module construction; lazy shapes are
    checked only when the net meets its observation space), each prefixed by the key path."""
    try:
        build_arc(arc)
    except ValueError as err:
        return [f"agent.net.arc: {err}"]
    return []
