"""Batch renormalization (Ioffe 2017, arXiv:1702.03275) as SLM-Lab v5.3 uses it in CrossQ's critics.

``BatchRenorm1d`` (F features; input (B, F) or (B, F, ...)): in train mode it normalizes with the batch
statistics and applies the detached corrections

    x_hat = (x - mu_B) / sigma_B * r + d,   r = clip(sigma_B / sigma, 1 / r_max, r_max),
                                            d = clip((mu_B - mu) / sigma, -d_max, d_max)

where ``sigma = sqrt(running_var + eps)``, ``sigma_B = sqrt(var_B + eps)`` (population variance) and the limits
ramp linearly with the training step t: ``r_max = 1 + min(t / warmup_steps, 1) * (r_max_limit - 1)``,
``d_max = min(t / warmup_steps, 1) * d_max_limit`` (plain batch norm at t = 0). Then ``running_mean`` and
``running_var`` move toward the batch's by ``momentum`` (lerp) and t counts up. Eval mode:
``(x - running_mean) / sqrt(running_var + eps)``. Output ``weight * x_hat + bias``. Statistics and t are
buffers (checkpointed, hashed). ``LazyBatchRenorm1d`` infers F from its first input.

Both are registered in ``torch.nn`` (as ``torcharc.register_nn`` does, without importing torcharc) so torcharc 2 arcs
can name them, as SLM-Lab's CrossQ specs do (``LazyBatchRenorm1d: {momentum, eps, warmup_steps}``).
Reference: SLM-Lab ``slm_lab/agent/net/batch_renorm.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.lazy import LazyModuleMixin
from torch.nn.parameter import UninitializedBuffer, UninitializedParameter


class BatchRenorm1d(nn.Module):
    """Batch renormalization over features (dim 1); see module docstring.

    Args:
        num_features: F.
        eps: added to variances.
        momentum: running-statistics rate (``running <- running + momentum * (batch - running)``).
        r_max: limit of the scale correction r once warmed up.
        d_max: limit of the shift correction d once warmed up.
        warmup_steps: training forwards over which the limits ramp from plain batch norm to full.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.01, r_max: float = 3.0,
                 d_max: float = 5.0, warmup_steps: int = 10000) -> None:
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.r_max_limit, self.d_max_limit, self.warmup_steps = r_max, d_max, warmup_steps
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))
        self.register_buffer("step", torch.tensor(0, dtype=torch.long))

    def _bcast(self, v: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """(F,) -> broadcastable against x (B, F, ...)."""
        return v if x.dim() == 2 else v.view(1, -1, *([1] * (x.dim() - 2)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, F, ...) -> same shape; batch statistics and a running update in train mode only."""
        if not self.training:  # (x - running_mean) / sqrt(running_var + eps) * weight + bias, statistics untouched
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, training=False,
                                eps=self.eps)
        dims = [0, *range(2, x.dim())]
        t = min(int(self.step) / max(self.warmup_steps, 1), 1.0)
        r_max, d_max = 1.0 + t * (self.r_max_limit - 1.0), t * self.d_max_limit
        with torch.no_grad():  # the batch statistics for r, d and the running update (torch.var is ~12x slower)
            mean = x.mean(dims)
            var = (x - self._bcast(mean, x)).square().mean(dims)
            running_std = (self.running_var + self.eps).sqrt()
            r = ((var + self.eps).sqrt() / running_std).clamp(1.0 / r_max, r_max)
            d = ((mean - self.running_mean) / running_std).clamp(-d_max, d_max)
            self.running_mean.lerp_(mean, self.momentum)
            self.running_var.lerp_(var, self.momentum)
            self.step += 1
        if x.numel() == x.shape[1]:  # one value per feature: x - mu_B is 0 (torch's batch norm refuses it)
            return self._bcast(self.weight * d + self.bias, x).expand_as(x)
        # weight * ((x - mu_B) / sigma_B * r + d) + bias as one batch norm (gradients through mu_B and sigma_B, as
        # in the formula; r and d are constants) with scale weight * r and shift weight * d + bias
        return F.batch_norm(x, None, None, self.weight * r, self.weight * d + self.bias, training=True, eps=self.eps)

    def extra_repr(self) -> str:
        """The constructor arguments, shown in the module's ``repr``."""
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, r_max={self.r_max_limit}, "
                f"d_max={self.d_max_limit}, warmup_steps={self.warmup_steps}")


class LazyBatchRenorm1d(LazyModuleMixin, BatchRenorm1d):
    """``BatchRenorm1d`` whose F comes from the first input's dim 1 (torch's lazy-module protocol)."""

    cls_to_become = BatchRenorm1d
    weight: UninitializedParameter
    bias: UninitializedParameter

    def __init__(self, eps: float = 1e-5, momentum: float = 0.01, r_max: float = 3.0, d_max: float = 5.0,
                 warmup_steps: int = 10000) -> None:
        super().__init__(0, eps, momentum, r_max, d_max, warmup_steps)
        self.weight, self.bias = UninitializedParameter(), UninitializedParameter()
        self.running_mean, self.running_var = UninitializedBuffer(), UninitializedBuffer()

    def initialize_parameters(self, x: torch.Tensor) -> None:
        """Materialize weight, bias and running statistics with F = ``x.shape[1]``."""
        if self.has_uninitialized_params():
            self.num_features = int(x.shape[1])
            with torch.no_grad():
                self.weight.materialize((self.num_features,))
                self.bias.materialize((self.num_features,))
                self.running_mean.materialize((self.num_features,))
                self.running_var.materialize((self.num_features,))
                self.weight.fill_(1.0)
                self.bias.zero_()
                self.running_mean.zero_()
                self.running_var.fill_(1.0)


def _register() -> None:
    """Make both classes resolvable by name from ``torch.nn`` (torcharc builds arcs from there).

    What ``torcharc.register_nn`` does (a ``setattr`` on ``torch.nn``), without importing torcharc and
    pydantic (~20 MB, ~0.5 s) into every process that imports the nets: torcharc is imported only when a
    ``TorchArcNet`` is built (``agents.nets.build_arc``)."""
    for cls in (BatchRenorm1d, LazyBatchRenorm1d):
        setattr(nn, cls.__name__, cls)


_register()
