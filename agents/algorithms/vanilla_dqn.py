"""VanillaDQN: Q-learning with a replay buffer and no target net (Mnih et al. 2013, arXiv:1312.5602,
"Playing Atari with Deep Reinforcement Learning", before the 2015 target network).

Everything is ``DQN`` (cadence, replay, exploration, metrics ``q_mean`` and ``td_error``) except the
bootstrap target ``r + gamma * (1 - terminated) * max_a Q(s', a)``, which the online net evaluates (no
grad); ``net.update_type`` / ``update_frequency`` / ``polyak_coef`` have no effect. Nets: ``net`` only.
"""

from __future__ import annotations

from agents.algorithms.dqn import DQN


class VanillaDQN(DQN):
    """DQN without a target net; see module docstring."""

    use_target_net = False
