"""Return and advantage estimators over time-major arrays (T, ...) of rewards and flags, and the running
normalizers of value targets and advantages that actor-critic algorithms apply to them."""

from __future__ import annotations

import math

import torch


def calc_returns(reward_T: torch.Tensor, done_T: torch.Tensor, gamma: float) -> torch.Tensor:
    """Discounted Monte-Carlo returns ``G_t = r_t + gamma * G_{t+1} * (1 - done_t)``.

    Args:
        reward_T: rewards (T, ...) with time first (any trailing env dims).
        done_T: 1.0 where an episode ended at t (terminated or truncated), same shape.
        gamma: discount in [0, 1].

    Returns:
        (T, ...) returns; a trajectory cut without ``done`` bootstraps 0 (Williams 1992, REINFORCE).
    """
    ret = torch.empty_like(reward_T)
    future = torch.zeros_like(reward_T[0])
    not_done = 1.0 - done_T
    for t in range(reward_T.shape[0] - 1, -1, -1):
        future = reward_T[t] + gamma * future * not_done[t]
        ret[t] = future
    return ret


def calc_gaes(reward_T: torch.Tensor, value_T: torch.Tensor, next_value_T: torch.Tensor,
              terminated_T: torch.Tensor, done_T: torch.Tensor, gamma: float, lam: float) -> torch.Tensor:
    """Generalized advantage estimation (Schulman et al. 2016, arXiv:1506.02438).

    ``delta_t = r_t + gamma * V(s'_t) * (1 - terminated_t) - V(s_t)`` and
    ``A_t = delta_t + gamma * lam * (1 - done_t) * A_{t+1}``. ``next_value_T`` is V of the true
    next observation, so a truncated (time-limit) step still bootstraps while the trace is cut.

    Args:
        reward_T, value_T, next_value_T: (T, ...) float.
        terminated_T: 1.0 where s'_t is terminal (no bootstrap).
        done_T: 1.0 where the episode ended at t (terminated or truncated).
        gamma: discount; lam: GAE lambda, both in [0, 1].

    Returns:
        (T, ...) advantages.
    """
    delta = reward_T + gamma * next_value_T * (1.0 - terminated_T) - value_T
    decay = gamma * lam * (1.0 - done_T)
    adv = torch.empty_like(reward_T)
    last = torch.zeros_like(reward_T[0])
    for t in range(reward_T.shape[0] - 1, -1, -1):
        last = delta[t] + decay[t] * last
        adv[t] = last
    return adv


def calc_nstep_returns(reward_T: torch.Tensor, next_value_T: torch.Tensor, terminated_T: torch.Tensor,
                       done_T: torch.Tensor, gamma: float) -> torch.Tensor:
    """n-step bootstrapped returns over a rollout (Mnih et al. 2016, arXiv:1602.01783, A3C algorithm S3).

    ``R_t = r_t + gamma * (1 - terminated_t) * B_t`` with ``B_t = V(s'_t)`` where the episode ended at t
    (a truncation bootstraps from the true next observation) or t is the rollout's last step, and
    ``B_t = R_{t+1}`` otherwise. Each step thus looks ahead up to the rollout end (T - t steps): with a
    rollout of ``num_step_returns`` steps this is A3C's n-step return; it equals GAE with lam = 1 plus V.

    Args:
        reward_T, next_value_T: (T, ...) float; ``next_value_T`` is V of each step's true next observation.
        terminated_T: 1.0 where s'_t is terminal (no bootstrap).
        done_T: 1.0 where the episode ended at t (terminated or truncated).
        gamma: discount in [0, 1].

    Returns:
        (T, ...) returns.
    """
    ret = torch.empty_like(reward_T)
    future = next_value_T[-1]
    for t in range(reward_T.shape[0] - 1, -1, -1):
        boot = done_T[t] * next_value_T[t] + (1.0 - done_T[t]) * future
        future = reward_T[t] + gamma * (1.0 - terminated_T[t]) * boot
        ret[t] = future
    return ret


ADV_NORMS = ("standardize", "none")
"""Values of ``normalize_advantages`` every policy-gradient algorithm takes (PPO adds ``percentile``)."""


def standardize(x: torch.Tensor, epsilon: float = 1e-8) -> torch.Tensor:
    """``(x - mean(x)) / (std(x) + epsilon)`` over the last dim, a batch (..., B), unbiased std; x unchanged when
    B <= 1. Leading dims (e.g. the seed dim K of ``agents.batched``) are standardized row by row, each row
    with the same values as a separate (B,) call.

    SLM-Lab v5.3's ``math_util.standardize``, which ``Reinforce.calc_policy_loss`` (and so A2C, which
    inherits it) applies to the advantages of every policy loss."""
    if x.shape[-1] <= 1:
        return x
    return (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + epsilon)


def symlog(x: torch.Tensor) -> torch.Tensor:
    """``sign(x) * log(1 + |x|)`` elementwise (Hafner et al. 2023, DreamerV3, arXiv:2301.04104)."""
    return torch.sign(x) * torch.log1p(x.abs())


class ReturnNormalizer:
    """Running scale of value targets (SLM-Lab v5.3's ``normalize_v_targets``; like SB3's RunningMeanStd).

    ``update`` merges a batch of targets into a running mean and variance (Chan et al.'s parallel
    update, population variance); ``normalize`` divides by ``max(sqrt(var + epsilon), 1)`` (never
    mean-centred, never scaled up) and clips to ``[-clip, clip]``. Statistics start at mean 0, var 1.
    The state is four Python floats (``state_dict``), saved in checkpoints so a resume is exact.

    Args:
        epsilon: added to the variance before the square root.
        clip: bound of the normalized values.
    """

    def __init__(self, epsilon: float = 1e-8, clip: float = 10.0) -> None:
        self.epsilon, self.clip = epsilon, clip
        self.mean, self.var, self.m2, self.count = 0.0, 1.0, 0.0, 0

    def update(self, values: torch.Tensor) -> None:
        """Merge the values (any shape, flattened) into the running statistics."""
        batch = values.detach().flatten()
        n = batch.numel()
        if n == 0:
            return
        batch_mean = float(batch.mean())
        batch_var = float(batch.var(correction=0)) if n > 1 else 0.0
        delta, total = batch_mean - self.mean, self.count + n
        self.mean += delta * n / total
        self.m2 += batch_var * n + delta ** 2 * self.count * n / total
        self.count = total
        if self.count > 1:
            self.var = self.m2 / self.count

    def normalize(self, values: torch.Tensor) -> torch.Tensor:
        """``values / max(std, 1)`` clipped to ``[-clip, clip]``, same shape."""
        std = max(math.sqrt(self.var + self.epsilon), 1.0)
        return (values / std).clamp(-self.clip, self.clip)

    def state_dict(self) -> dict[str, float]:
        """The running statistics as plain numbers."""
        return {"mean": self.mean, "var": self.var, "m2": self.m2, "count": self.count}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Restore ``state_dict``."""
        self.mean, self.var, self.m2 = float(state["mean"]), float(state["var"]), float(state["m2"])
        self.count = int(state["count"])


class PercentileNormalizer:
    """Advantage scaling by EMA-tracked 5th and 95th percentiles (DreamerV3, arXiv:2301.04104; SLM-Lab
    v5.3's PPO ``normalize_advantages: percentile``).

    ``update`` sets each EMA ``p <- decay * p + (1 - decay) * quantile(values)``, both starting at 0;
    ``normalize`` divides by ``max(1, p95 - p5)`` (no centring).

    Args:
        decay: EMA decay per update.
    """

    def __init__(self, decay: float = 0.99) -> None:
        self.decay, self.p5, self.p95 = decay, 0.0, 0.0

    def update(self, values: torch.Tensor) -> None:
        """Fold the 5th and 95th percentiles of ``values`` (B,) into the EMAs."""
        qs = torch.quantile(values.detach().float(), torch.tensor([0.05, 0.95], device=values.device))
        self.p5 = self.decay * self.p5 + (1 - self.decay) * float(qs[0])
        self.p95 = self.decay * self.p95 + (1 - self.decay) * float(qs[1])

    def normalize(self, values: torch.Tensor) -> torch.Tensor:
        """``values / max(1, p95 - p5)``, same shape."""
        return values / max(1.0, self.p95 - self.p5)

    def state_dict(self) -> dict[str, float]:
        """The two EMAs as plain numbers."""
        return {"p5": self.p5, "p95": self.p95}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Restore ``state_dict``."""
        self.p5, self.p95 = float(state["p5"]), float(state["p95"])
