"""Variable schedules (explore_var, entropy_coef, clip_eps) and frame-driven LR factors.

Every schedule is a pure function of the clock's ``frame`` (env frames summed over vector envs),
with absolute start/end frames from the spec, so nothing needs checkpointing and raising
``max_frame`` on resume leaves past values unchanged. Decay shapes follow SLM-Lab
``lib/math_util.py`` (``no_decay``, ``linear_decay``, ``rate_decay``, ``periodic_decay``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

# keys of a schedule spec (explore_var_spec, entropy_coef_spec, clip_eps_spec) that PBT may change mid-run: the
# schedule is a pure function of the frame (field metadata ``perturbable``, orchestrator.spec.pbt)
SCHEDULE_PERTURBABLE = ("start_val", "end_val", "start_step", "end_step")


def no_decay(start_val: float, end_val: float, start_step: int, end_step: int, frame: int) -> float:
    """Constant ``start_val`` at every frame."""
    return start_val


def linear_decay(start_val: float, end_val: float, start_step: int, end_step: int, frame: int) -> float:
    """``start_val`` up to ``start_step``, linear to ``end_val`` at ``end_step``, ``end_val`` after.

    Raises:
        ValueError: if ``end_step < start_step``.
    """
    if end_step < start_step:
        raise ValueError(f"end_step={end_step} is before start_step={start_step}")
    if frame <= start_step:
        return start_val
    if frame >= end_step:
        return end_val
    return start_val + (end_val - start_val) * (frame - start_step) / (end_step - start_step)


def rate_decay(start_val: float, end_val: float, start_step: int, end_step: int, frame: int,
               decay_rate: float = 0.9, frequency: int = 20) -> float:
    """Exponential decay by ``decay_rate`` every ``(end_step - start_step) / frequency`` frames,
    floored at ``end_val`` (SLM-Lab ``rate_decay``)."""
    if frame <= start_step:
        return start_val
    if frame >= end_step:
        return end_val
    step_per_decay = (end_step - start_step) / frequency
    val = start_val * decay_rate ** ((frame - start_step) // step_per_decay)
    return max(val, end_val)


def periodic_decay(start_val: float, end_val: float, start_step: int, end_step: int, frame: int,
                   frequency: int = 60) -> float:
    """Linear decay modulated by a cosine: ``frequency / 2`` full periods (SLM-Lab ``periodic_decay``)."""
    if frame <= start_step:
        return start_val
    if frame >= end_step:
        return end_val
    x = (frame - start_step) / (end_step - start_step)
    unit = 0.5 * (1 + math.cos(x * frequency * math.pi)) * (1 - x)
    return end_val + (start_val - end_val) * unit


DECAYS: dict[str, Callable[..., float]] = {
    "no_decay": no_decay,
    "linear_decay": linear_decay,
    "rate_decay": rate_decay,
    "periodic_decay": periodic_decay,
}


@dataclass(frozen=True)
class VarSchedule:
    """A spec ``*_spec`` block (``explore_var_spec``, ``entropy_coef_spec``, ``clip_eps_spec``).

    Fields: ``name`` (one of ``DECAYS``), ``start_val``, ``end_val``, ``start_step`` and
    ``end_step`` in frames.
    """

    name: str = "no_decay"
    start_val: float = 0.0
    end_val: float = 0.0
    start_step: int = 0
    end_step: int = 0

    @classmethod
    def from_spec(cls, spec: dict[str, Any] | None, default: float = 0.0) -> "VarSchedule":
        """Build from a spec block; ``None`` gives a constant ``default``.

        Raises:
            ValueError: unknown decay name (lists the valid ones) or ``end_step < start_step``.
        """
        if spec is None:
            return cls("no_decay", default, default, 0, 0)
        name = spec.get("name", "no_decay")
        if name not in DECAYS:
            raise ValueError(f"unknown schedule '{name}'; expected one of {sorted(DECAYS)}")
        start_val = float(spec.get("start_val", default))
        end_val = float(spec.get("end_val", start_val))
        start_step, end_step = int(spec.get("start_step", 0)), int(spec.get("end_step", 0))
        if name != "no_decay" and end_step < start_step:
            raise ValueError(f"end_step={end_step} is before start_step={start_step}")
        return cls(name, start_val, end_val, start_step, end_step)

    def __call__(self, frame: int) -> float:
        """Value at ``frame``."""
        return DECAYS[self.name](self.start_val, self.end_val, self.start_step, self.end_step, frame)

    @property
    def final_val(self) -> float:
        """The value after the schedule ends (used for evaluation and enjoy)."""
        return self.start_val if self.name == "no_decay" else self.end_val


# ---- learning-rate factors: pure functions of frame, wrapped in torch's LambdaLR ----

@dataclass(frozen=True)
class LinearToZero:
    """LR factor ``max(0, 1 - frame / frame_total)`` (SLM-Lab ``LinearToZero``; key ``frame``)."""

    frame: int

    def __call__(self, frame: int) -> float:
        """The LR factor at ``frame`` (env frames of the session clock)."""
        return max(0.0, 1.0 - frame / self.frame)


@dataclass(frozen=True)
class LinearToMin:
    """LR factor ``max(min_factor, 1 - frame * (1 - min_factor) / frame_total)``: linear from 1 to ``min_factor``
    at ``frame`` frames, constant after (SLM-Lab's ``LinearToMin``, ``slm_lab/agent/net/net_util.py`` of its
    MuJoCo Playground benchmarks, where it counts updates of ``steps_per_schedule`` frames: the same factor at
    every update's frame; keys ``frame`` and ``min_factor``, default 0.1)."""

    frame: int
    min_factor: float = 0.1

    def __post_init__(self) -> None:
        if not self.frame > 0:
            raise ValueError(f"frame must be > 0, got {self.frame}")
        if not 0.0 <= self.min_factor <= 1.0:
            raise ValueError(f"min_factor must be in [0, 1], got {self.min_factor}")

    def __call__(self, frame: int) -> float:
        """The LR factor at ``frame`` (env frames of the session clock)."""
        return max(self.min_factor, 1.0 - frame * (1.0 - self.min_factor) / self.frame)


@dataclass(frozen=True)
class StepDecay:
    """LR factor ``gamma ** (frame // step_size)`` (torch ``StepLR`` with step_size in frames)."""

    step_size: int
    gamma: float = 0.1

    def __call__(self, frame: int) -> float:
        """The LR factor at ``frame`` (env frames of the session clock)."""
        return self.gamma ** (frame // self.step_size)


@dataclass(frozen=True)
class MultiStepDecay:
    """LR factor ``gamma ** (number of milestones <= frame)`` (torch ``MultiStepLR``, frames)."""

    milestones: tuple[int, ...]
    gamma: float = 0.1

    def __call__(self, frame: int) -> float:
        """The LR factor at ``frame`` (env frames of the session clock)."""
        return self.gamma ** sum(frame >= m for m in self.milestones)


@dataclass(frozen=True)
class CosineDecay:
    """LR factor of torch ``CosineAnnealingLR`` with ``T_max`` in frames (closed form)."""

    T_max: int
    eta_min_factor: float = 0.0

    def __call__(self, frame: int) -> float:
        """The LR factor at ``frame`` (env frames of the session clock)."""
        x = min(frame, self.T_max) / self.T_max
        return self.eta_min_factor + (1 - self.eta_min_factor) * 0.5 * (1 + math.cos(math.pi * x))


LR_SCHEDULERS: dict[str, Callable[..., Callable[[int], float]]] = {
    "LinearToZero": LinearToZero,
    "LinearToMin": LinearToMin,
    "StepLR": StepDecay,
    "MultiStepLR": lambda milestones, gamma=0.1: MultiStepDecay(tuple(milestones), gamma),
    "CosineAnnealingLR": CosineDecay,
}


class FrameLR(torch.optim.lr_scheduler.LambdaLR):
    """torch ``LambdaLR`` whose "epoch" is the clock's frame: ``lr = base_lr * factor(frame)``.

    Call ``step_to(frame)`` before each optimizer step. Its ``state_dict`` holds ``last_epoch``
    (the frame) and ``base_lrs``; the factor is rebuilt from the spec, so it loads with
    ``weights_only=True``.
    """

    def __init__(self, optim: torch.optim.Optimizer, factor: Callable[[int], float]) -> None:
        self.factor = factor
        super().__init__(optim, lr_lambda=factor)

    def step_to(self, frame: int) -> None:
        """Set every param group's lr to ``base_lr * factor(frame)``."""
        if frame == self.last_epoch:
            return
        self.last_epoch = frame
        for group, base_lr in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = base_lr * self.factor(frame)
        self._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        """``last_epoch`` (frame) and ``base_lrs`` only; the factor comes from the spec."""
        return {"last_epoch": self.last_epoch, "base_lrs": list(self.base_lrs)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the frame and base lrs, then re-apply the lr of that frame."""
        self.base_lrs = list(state_dict["base_lrs"])
        frame = int(state_dict["last_epoch"])
        self.last_epoch = frame - 1
        self.step_to(frame)


def make_lr_scheduler(optim: torch.optim.Optimizer, spec: dict[str, Any] | None) -> FrameLR:
    """Build the frame-driven LR scheduler of an ``lr_scheduler_spec`` (``None``: constant lr).

    Args:
        optim: the optimizer whose param groups it drives.
        spec: ``{"name": one of LR_SCHEDULERS, **kwargs}`` with every length in frames, or None.

    Raises:
        ValueError: unknown name (lists the valid ones) or bad arguments.
    """
    return FrameLR(optim, lr_factor(spec))


def lr_factor(spec: dict[str, Any] | None) -> Callable[[int], float]:
    """The factor ``frame -> lr / base_lr`` of an ``lr_scheduler_spec`` (``None``: constant 1).

    Raises:
        ValueError: unknown name (lists the valid ones) or bad arguments.
    """
    if spec is None:
        return _constant
    kwargs = {k: v for k, v in spec.items() if k != "name"}
    name = spec.get("name")
    if name not in LR_SCHEDULERS:
        raise ValueError(f"unknown lr_scheduler '{name}'; expected one of {sorted(LR_SCHEDULERS)}")
    try:
        return LR_SCHEDULERS[name](**kwargs)
    except TypeError as err:
        raise ValueError(f"bad arguments for lr_scheduler '{name}': {err}") from None


def _constant(frame: int) -> float:
    return 1.0
