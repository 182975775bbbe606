"""Helpers for the seed-batched tests: agent specs, and one stream of transitions fed to a group and to its
separate algorithms."""

from __future__ import annotations

import numpy as np

from envs.clock import Clock
from orchestrator.spec.load import build, load_spec
from tests.agents.algorithms.helpers import SPECS

SEEDS = [11, 12, 13]


def agent_spec(name: str, overrides: list[str] | None = None):
    """The checked ``agent`` section of benchmark spec ``name`` with ``key=value`` overrides."""
    return build(load_spec(SPECS, name, overrides or [])).agent


def normal_obs(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Standard-normal float32 observations of ``shape``."""
    return rng.standard_normal(shape).astype(np.float32)


def drive_pair(group, separate, n: int, steps: int, rng: np.random.Generator, obs: np.ndarray, draw=normal_obs):
    """Feed the same random transitions to a group and to its separate algorithms (seed k: columns k*n..), the next
    observations ``draw(rng, obs.shape)``; the group's actions must equal the separate ones. Returns the last obs,
    the group's clock and the separate ones."""
    k = len(separate)
    clock, clocks = Clock(10 ** 9, n), [Clock(10 ** 9, n) for _ in separate]
    for _ in range(steps):
        act = group.act(obs, clock)
        acts = [algo.act(obs[i * n:(i + 1) * n], c) for i, (algo, c) in enumerate(zip(separate, clocks))]
        np.testing.assert_array_equal(act, np.concatenate(acts))
        nxt = draw(rng, obs.shape)
        term, trunc = rng.random(k * n) < 0.05, np.zeros(k * n, bool)
        rew = rng.random(k * n).astype(np.float32)
        group.memory.add(obs, act, rew, nxt, term, trunc)
        clock.tick(term[:n])
        for i, (algo, c) in enumerate(zip(separate, clocks)):
            cols = slice(i * n, (i + 1) * n)
            algo.memory.add(obs[cols], act[cols], rew[cols], nxt[cols], term[cols], trunc[cols])
            c.tick(term[cols])
        obs = nxt
    return obs, clock, clocks
