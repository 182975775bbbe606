"""Return and advantage estimators over time-major arrays (T, ...) of rewards and flags."""

from __future__ import annotations

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
