"""Helpers for the seed-batched tests: agent specs, and one stream of transitions fed to a group and to its
separate algorithms."""

from __future__ import annotations

import numpy as np
import pytest
import torch

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


def more_steps(group, separate, n: int, steps: int, rng: np.random.Generator, obs: np.ndarray, clock, clocks,
               draw=normal_obs) -> np.ndarray:
    """``drive_pair`` for ``steps`` more vector steps, adding their frames to the running ``clock`` (the group's)
    and ``clocks`` (the separate ones'); returns the last observations."""
    obs, clock2, clocks2 = drive_pair(group, separate, n, steps, rng, obs, draw)
    for c, c2 in zip([clock, *clocks], [clock2, *clocks2]):
        c.frame += c2.frame
    return obs


def update_dqn_pair(group, separate, clock, clocks) -> list:
    """One update of a batched DQN group and of each of its separate lab DQNs; asserts per seed what the update
    must keep equal (optimizer step count; loss, grad norm, q_mean and td_error within 1e-4; the sampling RNG state;
    the replay's length and head). Returns the separate algorithms' ``LossStats``."""
    assert group.train_ready(clock) and all(a.train_ready(c) for a, c in zip(separate, clocks))
    stats = group.update(clock)
    refs = []
    for k, (algo, c) in enumerate(zip(separate, clocks)):
        ref = algo.update(c)
        refs.append(ref)
        assert clock.opt_step == c.opt_step
        assert stats[k].loss == pytest.approx(ref.loss, rel=1e-4, abs=1e-7)
        assert stats[k].grad_norm == pytest.approx(ref.grad_norm, rel=1e-4)
        for metric in ("q_mean", "td_error"):
            assert stats[k].metrics[metric] == pytest.approx(ref.metrics[metric], rel=1e-4, abs=1e-6), metric
        member = group.members[k]  # its replay and sampling stream are its separate session's
        assert member.rng.bit_generator.state == algo.rng.bit_generator.state
        assert len(member.memory) == len(algo.memory) and member.memory.head == algo.memory.head
    return refs


def assert_nets_close(group, separate, atol: float = 1e-5) -> None:
    """Every net of each group member equals its separate algorithm's, parameter by parameter, within ``atol``."""
    for member, algo in zip(group.members, separate):
        mine, theirs = member.state_dict()["nets"], algo.state_dict()["nets"]
        assert set(mine) == set(theirs)
        for net in theirs:
            for key in theirs[net]:
                torch.testing.assert_close(mine[net][key], theirs[net][key], rtol=0, atol=atol)
