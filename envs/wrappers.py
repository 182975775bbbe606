"""The two wrappers no maintained package provides in the form SLM-Lab's Atari setup and recurrent nets need.

* ``LifeLossTermination`` (vector level): ``terminated`` on a lost life without resetting the game
  (DeepMind's "episodic life", Mnih et al. 2015; SB3 ``EpisodicLifeEnv``; ale-py ``AtariVectorEnv``'s
  ``life_loss_info``). gymnasium's ``AtariPreprocessing(terminal_on_life_loss=True)`` is not used: its
  done makes the vector env *reset* the game, so every game would be played with one life only.
* ``ObsWindow`` (vector level): each sub-env's last L observations (N, L, *O), zero-padded at episode
  starts, for ``agents.nets.RecurrentNet`` (SLM-Lab v4's sequence memories); gymnasium's
  ``FrameStackObservation`` is per sub-env, so it would sit inside ``NormalizeObservation`` and stack
  unnormalized observations.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import VectorEnv, VectorWrapper
from gymnasium.vector.utils import batch_space


class LifeLossTermination(VectorWrapper):
    """Vector wrapper: ``terminated[i]`` becomes true on the step sub-env i loses a life, without a reset.

    Reads ``info["lives"]`` (N,) int, which ALE envs report on every reset and step. On a life-loss step
    the returned observation is the game's true next observation, so it is also written to
    ``info["final_obs"][i]`` (mask ``info["_final_obs"]``): the session's ``final_obs`` contract (the true
    next observation of a done row) holds. Place it after ``RecordEpisodeStatistics``, whose
    ``info["episode"]`` then reports whole games only (true game scores).

    Raises:
        KeyError: the env reports no ``lives`` in its info (not an ALE env).
    """

    def __init__(self, env: VectorEnv) -> None:
        super().__init__(env)
        self.lives = np.zeros(env.num_envs, np.int64)

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        """Reset every sub-env and read their lives (N,) from the reset info."""
        obs, info = self.env.reset(seed=seed, options=options)
        self.lives = np.asarray(info["lives"], np.int64).copy()
        return obs, info

    def step(self, actions: Any) -> tuple[np.ndarray, Any, Any, Any, dict]:
        """Step; ``terminated`` (N,) bool is also true where a life was lost, with ``final_obs`` filled there."""
        obs, reward, terminated, truncated, info = self.env.step(actions)
        lives = np.asarray(info["lives"], np.int64)
        lost = (lives < self.lives) & ~(terminated | truncated)
        self.lives = lives.copy()  # done rows already hold the new game's lives (SAME_STEP reset info)
        if lost.any():
            final = np.array(info.get("final_obs", np.full(self.num_envs, None, dtype=object)), dtype=object)
            mask = np.array(info.get("_final_obs", np.zeros(self.num_envs, bool)))
            for i in np.flatnonzero(lost):
                final[i] = obs[i]
            info = {**info, "final_obs": final, "_final_obs": mask | lost}
            terminated = terminated | lost
        return obs, reward, terminated, truncated, info


class ObsWindow(VectorWrapper):
    """Vector wrapper: observations become windows (N, L, *O) of each sub-env's last L observations, oldest
    first, zero-padded at the start of every episode (SAME_STEP autoreset: on a done row the returned window
    is zeros and the next episode's first observation; ``info["final_obs"][i]`` becomes the window ending in
    the true final observation). A done from ``LifeLossTermination`` also starts a new window.

    The windows (N, L, *O) in the sub-envs' dtype are plain numpy state, so the env state saves them (a
    checkpoint resumes mid-episode windows exactly, ``envs.state``). Place it outermost: it forwards
    ``obs_rms`` / ``update_running_mean`` to a ``NormalizeObservation`` inside, so windows hold normalized
    observations.

    Raises:
        ValueError: ``seq_len`` < 1 or a non-Box observation space.
    """

    def __init__(self, env: VectorEnv, seq_len: int) -> None:
        super().__init__(env)
        space = env.single_observation_space
        if seq_len < 1 or not isinstance(space, gym.spaces.Box):
            raise ValueError(f"ObsWindow needs seq_len >= 1 and a Box observation space, got {seq_len}, {space}")
        self.seq_len = int(seq_len)
        low = np.broadcast_to(np.minimum(space.low, 0), (self.seq_len, *space.shape))
        high = np.broadcast_to(np.maximum(space.high, 0), (self.seq_len, *space.shape))
        self.single_observation_space = gym.spaces.Box(low, high, (self.seq_len, *space.shape), space.dtype)
        self.observation_space = batch_space(self.single_observation_space, env.num_envs)
        self.window = np.zeros((env.num_envs, self.seq_len, *space.shape), space.dtype)

    @property
    def obs_rms(self) -> Any:
        """The inner ``NormalizeObservation``'s statistics (AttributeError without one)."""
        return self.env.obs_rms

    @obs_rms.setter
    def obs_rms(self, value: Any) -> None:
        self.env.obs_rms = value

    @property
    def update_running_mean(self) -> bool:
        """Whether the inner ``NormalizeObservation`` updates its statistics."""
        return self.env.update_running_mean

    @update_running_mean.setter
    def update_running_mean(self, value: bool) -> None:
        self.env.update_running_mean = value

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        """Reset every sub-env: windows (N, L, *O) all zeros but the last step, the first observation."""
        obs, info = self.env.reset(seed=seed, options=options)
        self.window = np.zeros_like(self.window)
        self.window[:, -1] = obs
        return self.window.copy(), info

    def step(self, actions: Any) -> tuple[np.ndarray, Any, Any, Any, dict]:
        """Step; windows shift by one (N, L, *O), restarting from zeros on done rows (final windows in info)."""
        obs, reward, terminated, truncated, info = self.env.step(actions)
        done = np.asarray(terminated) | np.asarray(truncated)
        shifted = self.window[:, 1:]
        if "final_obs" in info:
            final = np.array(info["final_obs"], dtype=object)  # a copy: None where not done
            for i in np.flatnonzero(info["_final_obs"]):
                final[i] = np.concatenate([shifted[i], np.asarray(final[i], self.window.dtype)[None]])
            info = {**info, "final_obs": final}
        self.window = np.concatenate([shifted, np.asarray(obs, self.window.dtype)[:, None]], axis=1)
        self.window[done, :-1] = 0
        return self.window.copy(), reward, terminated, truncated, info
