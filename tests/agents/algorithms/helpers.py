"""Helpers for algorithm unit tests: build an algorithm from a benchmark spec and drive it by hand."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np

from agents.algorithms import ALGORITHMS, Algorithm
from envs.clock import Clock
from orchestrator.spec import build, load_spec

REPO = Path(__file__).resolve().parents[3]
SPECS = str(REPO / "specs" / "benchmark" / "cartpole.json")
CARTPOLE_OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
CARTPOLE_ACT = gym.spaces.Discrete(2)


def make_algo(name: str, overrides: list[str], num_envs: int = 1, seed: int = 0, spec_file: str = SPECS,
              obs_space: gym.Space = CARTPOLE_OBS, action_space: gym.Space = CARTPOLE_ACT) -> Algorithm:
    """The algorithm of spec ``name`` (with ``key=value`` overrides) for the given spaces."""
    run = build(load_spec(spec_file, name, overrides))
    return ALGORITHMS[run.agent.algorithm.name](run.agent, obs_space, action_space, num_envs, seed)


def drive(algo: Algorithm, clock: Clock, vector_steps: int, seed: int = 0, done_prob: float = 0.05) -> int:
    """Run ``vector_steps`` steps on random observations and rewards; returns the number of updates."""
    rng = np.random.default_rng(seed)
    n, updates = clock.num_envs, 0
    obs = rng.standard_normal((n, *algo.obs_space.shape)).astype(np.float32)
    for _ in range(vector_steps):
        act = algo.act(obs, clock)
        next_obs = rng.standard_normal(obs.shape).astype(np.float32)
        terminated = rng.random(n) < done_prob
        truncated = np.zeros(n, bool)
        algo.memory.add(obs, act, rng.random(n).astype(np.float32), next_obs, terminated, truncated)
        clock.tick(terminated | truncated)
        if algo.train_ready(clock):
            algo.update(clock)
            updates += 1
        obs = next_obs
    return updates
