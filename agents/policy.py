"""Action policies: turn a net's output ("pdparam") into actions, log-probs and entropies.

Discrete action spaces use a categorical distribution over logits (B, A). Continuous (Box) spaces
use a diagonal Gaussian whose pdparam is (B, 2A): mean then log-std, log-std clamped to
[-20, 2]. Sampling draws from an explicit ``torch.Generator`` so sessions sharing a process do not
share randomness and a resumed run replays exactly.

Value-based policies (``epsilon_greedy``, ``boltzmann``) follow SLM-Lab ``policy_util``.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
from torch.distributions import Normal

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0  # SLM-Lab v5.3's clamp of every Gaussian policy's log-std (policy_util)


def pdparam_dim(action_space: gym.Space) -> int:
    """Width of the policy head: A logits (Discrete) or 2A (Box: mean and log-std).

    Raises:
        ValueError: for action spaces other than Discrete and 1-D Box.
    """
    if isinstance(action_space, gym.spaces.Discrete):
        return int(action_space.n)
    if isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
        return 2 * action_space.shape[0]
    raise ValueError(f"unsupported action space {action_space}; expected Discrete or 1-D Box")


def _gaussian(pdparam: torch.Tensor) -> Normal:
    mean, log_std = pdparam.chunk(2, dim=-1)
    return Normal(mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX).exp(), validate_args=False)


def sample(pdparam: torch.Tensor, discrete: bool, gen: torch.Generator,
           deterministic: bool = False) -> torch.Tensor:
    """Sample actions.

    Args:
        pdparam: (B, A) logits or (B, 2A) Gaussian parameters.
        discrete: action space kind.
        gen: generator to draw from.
        deterministic: take the mode (argmax / mean) instead of sampling.

    Returns:
        (B,) int64 for discrete, (B, A) float for continuous.
    """
    if discrete:
        if deterministic:
            return pdparam.argmax(dim=-1)
        probs = torch.softmax(pdparam, dim=-1)
        return torch.multinomial(probs, 1, generator=gen).squeeze(-1)
    mean, log_std = pdparam.chunk(2, dim=-1)
    if deterministic:
        return mean
    noise = torch.randn(mean.shape, generator=gen, device=mean.device, dtype=mean.dtype)
    return mean + log_std.clamp(LOG_STD_MIN, LOG_STD_MAX).exp() * noise


def log_prob_entropy(pdparam: torch.Tensor, act: torch.Tensor,
                     discrete: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of ``act`` and entropy of the distribution, both (B,)."""
    if discrete:  # Categorical(logits=pdparam).log_prob(act) / .entropy(), op for op, without its overhead
        logits = pdparam - pdparam.logsumexp(dim=-1, keepdim=True)
        logp = logits.gather(-1, act.long().unsqueeze(-1)).squeeze(-1)
        p_log_p = logits.clamp(min=torch.finfo(logits.dtype).min) * torch.softmax(logits, dim=-1)
        return logp, -p_log_p.sum(-1)
    dist = _gaussian(pdparam)
    return dist.log_prob(act).sum(-1), dist.entropy().sum(-1)


def tanh_gaussian_sample(pdparam: torch.Tensor, gen: torch.Generator | None,
                         deterministic: bool = False,
                         eps: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Reparameterized tanh-squashed Gaussian sample and its log-probability (SAC, Haarnoja et al. 2018,
    arXiv:1801.01290, appendix C).

    ``u = mean + std * eps`` (eps ~ N(0, 1) from ``gen``; ``u = mean`` when ``deterministic``), ``a = tanh(u)``
    and ``log pi(a) = sum_A [log N(u; mean, std) - log(1 - tanh(u)^2)]``, the correction computed stably as
    ``2 * (log 2 - u - softplus(-2u))``. Gradients flow to ``pdparam`` through ``u``.

    Args:
        pdparam: (..., 2A) mean then log-std (clamped to [LOG_STD_MIN, LOG_STD_MAX]).
        gen: generator for eps.
        deterministic: use the mean.
        eps: the standard normal draws (..., A) to use instead of drawing them from ``gen`` (seed-batched SAC
            draws each seed's rows from that seed's generator).

    Returns:
        a (..., A) in (-1, 1) and log pi(a) (...) in nats.
    """
    mean, log_std = pdparam.chunk(2, dim=-1)
    log_std = log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)
    if eps is None:
        eps = torch.zeros_like(mean) if deterministic else \
            torch.randn(mean.shape, generator=gen, device=mean.device, dtype=mean.dtype)
    u = mean + log_std.exp() * eps
    gauss_logp = -0.5 * eps.pow(2) - log_std - 0.5 * math.log(2 * math.pi)
    correction = 2.0 * (math.log(2.0) - u - torch.nn.functional.softplus(-2.0 * u))
    return torch.tanh(u), (gauss_logp - correction).sum(-1)


def epsilon_greedy(q_BA: torch.Tensor, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """Greedy action of Q-values (B, A), replaced by a uniform random one with prob ``epsilon``.

    Returns (B,) int64. Draws exactly 2B numbers from ``rng`` whatever epsilon is, so the RNG
    stream does not depend on the schedule.
    """
    act = q_BA.argmax(dim=-1).cpu().numpy()
    b, a = q_BA.shape
    explore = rng.random(b) < epsilon
    random_act = rng.integers(0, a, size=b)
    return np.where(explore, random_act, act)


def boltzmann(q_BA: torch.Tensor, tau: float, gen: torch.Generator) -> np.ndarray:
    """Sample from ``softmax(Q / tau)`` (B, A) -> (B,) int64; ``tau`` is the temperature."""
    probs = torch.softmax(q_BA / max(tau, 1e-8), dim=-1)
    return torch.multinomial(probs, 1, generator=gen).squeeze(-1).cpu().numpy()


def q_act(q_BA: torch.Tensor, action_policy: str, explore_var: float, rng: np.random.Generator,
          gen: torch.Generator, deterministic: bool = False) -> np.ndarray:
    """Actions (B,) int64 of a value-based agent (DQN family, SARSA) from Q-values (B, A).

    ``deterministic``: greedy argmax. Else ``action_policy`` ``"boltzmann"`` samples ``softmax(Q / tau)``
    with ``tau = explore_var`` from ``gen``; ``"epsilon_greedy"`` is greedy but uniform with probability
    ``explore_var``, drawing from ``rng``.

    Raises:
        ValueError: another ``action_policy``.
    """
    if deterministic:
        return q_BA.argmax(dim=-1).cpu().numpy()
    if action_policy == "boltzmann":
        return boltzmann(q_BA, explore_var, gen)
    if action_policy == "epsilon_greedy":
        return epsilon_greedy(q_BA, explore_var, rng)
    raise ValueError(f"unknown value-based action_policy '{action_policy}'; expected epsilon_greedy or boltzmann")
