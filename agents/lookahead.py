"""Lookahead (Zhang, Lucas, Hinton and Ba 2019, "Lookahead Optimizer: k steps forward, 1 step back",
arXiv:1907.08610), as SLM-Lab v4's ``Lookahead`` (``slm_lab/lib/optimizer.py``) applies it.

An inner optimizer updates the parameters (the fast weights theta) at every step; every ``k`` steps the slow weights
phi move toward them and the fast weights restart from there:

    phi <- phi + alpha * (theta - phi);   theta <- phi

phi starts as a copy of the parameters at the first step (SLM-Lab v4 copies them when the optimizer is built; the
first step also sees weights loaded after that, e.g. by ``agent.net.init_from``). As in SLM-Lab v4, a parameter
without a
gradient at a synchronizing step is left out of it. The spec shape is SLM-Lab v4's: ``{"name": "Lookahead",
"optimizer": "RAdam", "alpha": 0.5, "k": 5, **inner keyword arguments}`` (``agents.nets.make_optim`` builds it).
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from typing import Any

import torch

from agents import torch_optim


class Lookahead(torch.optim.Optimizer):
    """Lookahead around an inner optimizer (module docstring).

    Its ``param_groups`` and ``state`` are the inner optimizer's (an lr scheduler on this optimizer drives the inner
    one, also after ``load_state_dict``); ``state_dict`` holds the inner optimizer's state dict, the slow weights
    (one tensor per parameter,
    param-group order) and the step count, so a checkpoint resumes the synchronization schedule exactly.

    Args:
        inner: the optimizer of the fast weights (e.g. ``torch.optim.RAdam``), built over the parameters.
        alpha: slow-weight step size in [0, 1] (SLM-Lab v4's default 0.5).
        k: inner steps per synchronization, >= 1 (default 5).

    Raises:
        ValueError: ``alpha`` outside [0, 1] or ``k`` < 1 (``check_args``).
    """

    def __init__(self, inner: torch.optim.Optimizer, alpha: float = 0.5, k: int = 5) -> None:
        # torch.optim.Optimizer.__init__ is not called: it would build param groups of its own (and patch the
        # class's step); this optimizer is a view of the inner one's, with the attributes torch's lr schedulers read
        check_args(alpha, k)
        self.inner, self.alpha, self.k = inner, float(alpha), int(k)
        self.defaults = {**inner.defaults, "alpha": self.alpha, "k": self.k}
        for hooks in ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks", "_optimizer_state_dict_pre_hooks",
                      "_optimizer_state_dict_post_hooks", "_optimizer_load_state_dict_pre_hooks",
                      "_optimizer_load_state_dict_post_hooks"):
            setattr(self, hooks, OrderedDict())
        self.slow: list[torch.Tensor] | None = None  # phi, set at the first step
        self.step_count = 0

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """The inner optimizer's param groups (read at each access: its ``load_state_dict`` replaces the list)."""
        return self.inner.param_groups

    @property
    def state(self) -> defaultdict[torch.Tensor, Any]:  # type: ignore[override]
        """The inner optimizer's per-parameter state."""
        return self.inner.state

    def __getstate__(self) -> dict[str, Any]:
        """All attributes (``torch.optim.Optimizer``'s keeps only its own three, not the inner optimizer)."""
        return self.__dict__.copy()

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restore ``__getstate__``'s attributes."""
        self.__dict__.update(state)

    def params(self) -> list[torch.Tensor]:
        """The parameters in param-group order."""
        return [p for group in self.param_groups for p in group["params"]]

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """One inner step, then every ``k``-th step the slow update and the reset of the fast weights.

        Returns:
            The closure's loss (None without one).
        """
        loss = closure() if closure is not None else None
        if self.slow is None:
            self.slow = [p.detach().clone() for p in self.params()]
        torch_optim.step(self.inner)
        self.step_count += 1
        if self.step_count % self.k == 0:
            for p, slow in zip(self.params(), self.slow):
                if p.grad is None:
                    continue
                slow.add_(p - slow, alpha=self.alpha)
                p.copy_(slow)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The inner optimizer's ``zero_grad``."""
        self.inner.zero_grad(set_to_none)

    def state_dict(self) -> dict[str, Any]:
        """``{"inner": inner state dict, "slow": [tensor per parameter] (None before the first step),
        "step_count": int}``."""
        slow = None if self.slow is None else [s.clone() for s in self.slow]
        return {"inner": self.inner.state_dict(), "slow": slow, "step_count": self.step_count}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore ``state_dict``'s inner state, slow weights (copied onto the parameters' devices) and step count.

        Raises:
            ValueError: slow weights whose number or shapes differ from the parameters'.
        """
        slow, params = state_dict["slow"], self.params()
        if slow is not None and (len(slow) != len(params) or any(s.shape != p.shape for s, p in zip(slow, params))):
            raise ValueError(f"Lookahead state has {len(slow)} slow weights that do not match the "
                             f"{len(params)} parameters")
        self.inner.load_state_dict(state_dict["inner"])
        self.slow = None if slow is None else [
            s.detach().to(p.device, p.dtype, copy=True) for s, p in zip(slow, params)]
        self.step_count = int(state_dict["step_count"])


def check_args(alpha: Any, k: Any) -> None:
    """Raise ValueError unless ``alpha`` is a number in [0, 1] and ``k`` an int >= 1 (SLM-Lab v4's checks)."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"Lookahead alpha must be a number in [0, 1], got {alpha!r}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"Lookahead k must be an int >= 1, got {k!r}")
