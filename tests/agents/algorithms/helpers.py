"""Helpers for algorithm unit tests: build an algorithm from a benchmark spec and drive it by hand."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pandas as pd
import pytest

from agents.algorithms import ALGORITHMS, Algorithm
from envs.clock import Clock
from orchestrator.session.loop import Session
from orchestrator.spec.load import build, load_spec
from tests.slm_lab_fetch import specs_root

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


# SLM-Lab v5.3.0's own spec files, unmodified: $SLM_LAB_SPECS, else the checked download into the cache
# (tests/slm_lab_fetch.py); a test reading them is marked ``slm_lab_specs`` so that tests/conftest.py gets them
SLM_SPECS = specs_root() / "v5.3.0"


def assert_resume_exact(tmp_path: Path, name: str, overrides: list[str], stop_frame: int, seed: int = 7,
                        spec_file: str = SPECS) -> Session:
    """Run spec ``name`` straight and stopped at ``stop_frame`` + restored: equal train_df (all columns
    but wall_t, fps), weights_sha256 and clock. Returns the straight session."""
    from tests.orchestrator.session.test_resume_exact import COMPARED, interrupted_then_resumed, uninterrupted

    spec = load_spec(spec_file, name, overrides)
    straight = uninterrupted(spec, seed)
    resumed = interrupted_then_resumed(spec, seed, stop_frame, str(tmp_path / f"{name}_2026_01_01_000000"))
    pd.testing.assert_frame_equal(COMPARED(straight.train_df), COMPARED(resumed.train_df))
    assert straight.weights_sha256() == resumed.weights_sha256()
    for key in ("frame", "epi", "t", "opt_step"):
        assert getattr(straight.clock, key) == getattr(resumed.clock, key), key
    return straight


def run_slm_dev(tmp_path: Path, rel_file: str, name: str, max_frame: int = 300) -> pd.DataFrame:
    """``lab {SLM-Lab spec} {name} dev`` with only ``env.max_frame`` overridden; returns its train_df."""
    from orchestrator import cli

    spec_file = str(SLM_SPECS / rel_file)
    if not Path(spec_file).exists():
        pytest.fail(f"SLM-Lab spec file not found: {spec_file} (is the test marked slm_lab_specs?)")
    data_dir = tmp_path / "data"
    code = cli.main([spec_file, name, "dev", "-s", f"env.max_frame={max_frame}", "--data-dir", str(data_dir),
                     "--quiet"])
    assert code == 0
    (df_file,) = data_dir.glob("*/t0/s0/train_df.parquet")
    df = pd.read_parquet(df_file)
    assert df.frame.iloc[-1] == max_frame
    return df


def stop_then_resume(spec: dict, predir: str, stop_frame: int, seed: int = 5) -> tuple[int, pd.DataFrame]:
    """Run a SessionRunner until ``stop_frame``, stop it as SIGTERM does (final checkpoint), then run a
    resumed SessionRunner to the end. Returns (opt_step at the stop, the resumed session's train_df)."""
    from orchestrator.session.runner import SessionRunner

    first = SessionRunner(spec, predir, 0, 0, seed, resume=False)
    for event in first.events():
        if event.kind == "started":
            first.session.run_rl(until_frame=stop_frame)
            first.session.stop_requested = True
    second = SessionRunner(spec, predir, 0, 0, seed, resume=True)
    list(second.events())
    return first.session.clock.opt_step, second.session.train_df
