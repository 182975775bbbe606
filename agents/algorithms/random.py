"""Random: uniform random actions and no learning, the baseline every algorithm must beat (SLM-Lab's
``Random`` agent; no paper).

Acting draws from the algorithm's own ``np.random.Generator`` (so a seed replays the same actions and
a resumed session continues the stream): ``Discrete(n)`` -> integers in [0, n); a ``Box`` -> uniform
in [low, high] where both bounds are finite, standard normal elsewhere. It has no nets and no
optimizers, never trains (``opt_step`` stays 0, ``loss`` and ``lr`` are NaN) and keeps no
transitions: any of the spec's memory names is accepted (SLM-Lab specs give ``OnPolicyReplay``) and
each transition is dropped as it arrives.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from agents.algorithms.base import Algorithm, LossStats
from agents.memory import MEMORIES
from envs.clock import Clock


class DropMemory:
    """A memory that stores nothing: ``add`` drops the transition, ``len`` is 0, the state is empty."""

    def add(self, *transition: np.ndarray) -> None:
        """Drop one vector step (obs_NO, act_NA, reward_N, next_obs_NO, terminated_N, truncated_N)."""

    def __len__(self) -> int:
        return 0

    def state_dict(self) -> dict[str, Any]:
        """Nothing to save."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore."""


class Random(Algorithm):
    """Uniform random policy; see module docstring.

    Raises:
        ValueError: an action space other than ``Discrete`` or ``Box``.
    """

    memory_names = tuple(MEMORIES)
    optim_keys = ()
    schedule_keys = ()
    reads_loss = False

    def init_nets(self) -> None:
        """No nets; checks the action space."""
        if not isinstance(self.action_space, (gym.spaces.Discrete, gym.spaces.Box)):
            raise ValueError(f"Random needs a Discrete or Box action space, got {self.action_space}")

    def init_memory(self) -> DropMemory:
        """A ``DropMemory``: Random learns nothing from transitions."""
        return DropMemory()

    def act(self, obs_NO: np.ndarray, clock: Clock, deterministic: bool = False) -> np.ndarray:
        """(N,) int64 uniform actions for ``Discrete``, (N, *A) float32 for ``Box`` (``deterministic`` is
        ignored: the policy is random by definition)."""
        n, space = len(obs_NO), self.action_space
        if isinstance(space, gym.spaces.Discrete):
            return space.start + self.rng.integers(0, space.n, size=n)
        low, high = np.broadcast_to(space.low, space.shape), np.broadcast_to(space.high, space.shape)
        bounded = np.isfinite(low) & np.isfinite(high)
        uniform = self.rng.uniform(np.where(bounded, low, 0.0), np.where(bounded, high, 1.0), (n, *space.shape))
        normal = self.rng.standard_normal((n, *space.shape))
        return np.where(bounded, uniform, normal).astype(np.float32)

    def train_ready(self, clock: Clock) -> bool:
        """Never: Random does not train."""
        return False

    def update(self, clock: Clock) -> LossStats:
        """Not called (``train_ready`` is false); returns NaN stats."""
        return LossStats()
