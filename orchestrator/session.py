"""The RL loop of one session (one seed): env <-> agent <-> clock, with log and eval checkpoints.

No Ray here: a session runs in-process (tests, ``dev``) exactly as inside a session actor, which
drives it in frame chunks with ``run_rl(until_frame=...)``.

Log rows (``train_df``) are taken every ``meta.log_frequency`` frames and at ``max_frame``;
columns are ``TRAIN_COLUMNS`` (DESIGN.md section 1). ``total_reward`` is the mean undiscounted
return of the episodes that ended since the previous row (the last known return if none ended);
``total_reward_ma`` is the mean return of the last ``meta.ma_window`` episodes. With
``meta.rigorous_eval = k > 0``, every ``meta.eval_frequency`` frames k deterministic evaluation
episodes run on a separate env and give one ``eval_df`` row.
"""

from __future__ import annotations

import math
import random
from collections import deque
from typing import Any, Callable

import numpy as np
import pandas as pd
import torch

from agents.algorithms import ALGORITHMS, Algorithm, LossStats
from envs.clock import Clock
from envs.make import EnvSpec, episode_returns, final_obs, make_env
from orchestrator.spec import RunSpec, build

TRAIN_COLUMNS = ("frame", "epi", "t", "opt_step", "wall_t", "fps", "total_reward", "total_reward_ma", "loss",
                 "lr", "explore_var", "entropy_coef", "entropy", "grad_norm", "refill")
EVAL_COLUMNS = ("frame", "epi", "opt_step", "wall_t", "total_reward", "total_reward_std", "total_reward_ma")
EVAL_SEED_OFFSET = 1_000_003  # keeps eval-env seeds apart from training-env seeds

LogCallback = Callable[["Session", dict[str, Any]], None]


def seed_globals(seed: int) -> None:
    """Seed python ``random``, numpy's and torch's global RNGs (for library code that uses them)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Session:
    """One agent trained on one env with one seed.

    Args:
        spec: a checked flat spec (``orchestrator.spec.check`` / ``load_spec`` output).
        seed: the session seed (see ``orchestrator.spec.session_seed``).
        trial: trial index t; session: session index s (used in names only).

    Raises:
        ValueError: an env/agent combination the algorithm does not support.
    """

    def __init__(self, spec: dict[str, Any], seed: int, trial: int = 0, session: int = 0) -> None:
        self.spec: RunSpec = build(spec)
        self.seed, self.trial, self.session = int(seed), trial, session
        seed_globals(self.seed)
        env_spec, meta = self.spec.env, self.spec.meta
        self.env = make_env(env_spec, self.seed)
        self.clock = Clock(env_spec.max_frame, env_spec.num_envs)
        algo_cls = ALGORITHMS[self.spec.agent.algorithm.name]
        self.algorithm: Algorithm = algo_cls(self.spec.agent, self.env.single_observation_space,
                                             self.env.single_action_space, env_spec.num_envs, self.seed)
        self.obs: np.ndarray = self.env.reset(seed=self.seed)[0]
        self.returns: deque[float] = deque(maxlen=meta.ma_window)
        self.recent_returns: list[float] = []
        self.loss_stats = LossStats()
        self.train_rows: list[dict[str, Any]] = []
        self.eval_rows: list[dict[str, Any]] = []
        self.refilling = False
        self._eval_env: Any = None
        self._last_log = (0, 0.0)  # (frame, wall_t) of the previous log row

    # ---------------------------------------------------------------- the loop
    def run_rl(self, until_frame: int | None = None, on_log: LogCallback | None = None) -> None:
        """Train until ``clock.max_frame`` (or ``until_frame``, whichever is first).

        One vector step per iteration: act, env.step, store, tick the clock, maybe update, maybe log.
        """
        clock, algo, env, meta = self.clock, self.algorithm, self.env, self.spec.meta
        stop = clock.max_frame if until_frame is None else min(until_frame, clock.max_frame)
        obs = self.obs
        clock.start_timer()
        while clock.frame < stop:
            act = algo.act(obs, clock)
            next_obs, reward, terminated, truncated, info = env.step(act)
            done = terminated | truncated
            algo.memory.add(obs, act, reward, final_obs(next_obs, done, info), terminated, truncated)
            prev_frame = clock.frame
            clock.tick(done)
            if done.any():
                self.record_returns(episode_returns(info))
            if algo.train_ready(clock):
                self.loss_stats = algo.update(clock)
            if clock.crossed(prev_frame, meta.log_frequency) or clock.done():
                self.log(on_log)
            if meta.rigorous_eval and clock.crossed(prev_frame, meta.eval_frequency):
                self.run_eval()
            obs = next_obs
        self.obs = obs

    def record_returns(self, returns: np.ndarray) -> None:
        """Add finished episodes' returns to the moving-average window."""
        values = returns.tolist()
        self.returns.extend(values)
        self.recent_returns.extend(values)

    # ---------------------------------------------------------------- log rows
    def log(self, on_log: LogCallback | None = None) -> dict[str, Any]:
        """Append a train_df row for the current frame (once per frame) and call ``on_log``."""
        if self.train_rows and self.train_rows[-1]["frame"] == self.clock.frame:
            return self.train_rows[-1]
        row = self.make_row()
        self.train_rows.append(row)
        self._last_log = (row["frame"], row["wall_t"])
        if on_log is not None:
            on_log(self, row)
        return row

    def make_row(self) -> dict[str, Any]:
        """The train_df row of the current state (see module docstring for column meanings)."""
        clock, algo, stats = self.clock, self.algorithm, self.loss_stats
        wall_t = clock.wall_t
        d_frame, d_t = clock.frame - self._last_log[0], wall_t - self._last_log[1]
        if self.recent_returns:
            total_reward = float(np.mean(self.recent_returns))
            self.recent_returns = []
        else:
            total_reward = self.returns[-1] if self.returns else math.nan
        return {
            "frame": clock.frame, "epi": clock.epi, "t": clock.t, "opt_step": clock.opt_step,
            "wall_t": wall_t, "fps": d_frame / d_t if d_t > 0 else math.nan,
            "total_reward": total_reward,
            "total_reward_ma": float(np.mean(self.returns)) if self.returns else math.nan,
            "loss": stats.loss, "lr": algo.current_lr(), "explore_var": algo.explore_var(clock.frame),
            "entropy_coef": algo.entropy_coef(clock.frame), "entropy": stats.entropy,
            "grad_norm": stats.grad_norm, "refill": self.refilling,
        }

    @property
    def train_df(self) -> pd.DataFrame:
        """One row per log checkpoint, columns ``TRAIN_COLUMNS``."""
        return pd.DataFrame(self.train_rows, columns=list(TRAIN_COLUMNS))

    @property
    def eval_df(self) -> pd.DataFrame:
        """One row per eval checkpoint, columns ``EVAL_COLUMNS``."""
        return pd.DataFrame(self.eval_rows, columns=list(EVAL_COLUMNS))

    # ---------------------------------------------------------------- evaluation
    def eval_env(self) -> Any:
        """The evaluation env (``rigorous_eval`` sub-envs, no reward scaling), built once."""
        if self._eval_env is None:
            es = self.spec.env
            self._eval_env = make_env(EnvSpec(es.name, es.max_frame, self.spec.meta.rigorous_eval, es.max_t,
                                              es.normalize_state, None, "sync"), None)
        if self.spec.env.normalize_state:  # evaluate with the training statistics, frozen
            self._eval_env.obs_rms = self.env.obs_rms
            self._eval_env.update_running_mean = False
        return self._eval_env

    def run_eval(self) -> dict[str, Any]:
        """Run one deterministic episode per eval sub-env; append and return an eval_df row.

        The eval env is reset with a seed derived from (session seed, frame), so evaluation
        neither uses nor disturbs the training RNG streams.
        """
        env = self.eval_env()
        obs, _ = env.reset(seed=self.seed + EVAL_SEED_OFFSET + self.clock.frame)
        n = env.num_envs
        finished = np.zeros(n, bool)
        returns = np.zeros(n)
        while not finished.all():
            obs, _, terminated, truncated, info = env.step(self.algorithm.act(obs, self.clock, deterministic=True))
            done = (terminated | truncated) & ~finished
            if done.any():
                returns[done] = np.asarray(info["episode"]["r"])[done]
                finished |= done
        prev = [r["total_reward"] for r in self.eval_rows[-(self.spec.meta.ma_window - 1):]]
        row = {"frame": self.clock.frame, "epi": self.clock.epi, "opt_step": self.clock.opt_step,
               "wall_t": self.clock.wall_t, "total_reward": float(returns.mean()),
               "total_reward_std": float(returns.std()), "total_reward_ma": float(np.mean(prev + [returns.mean()]))}
        self.eval_rows.append(row)
        return row

    def close(self) -> None:
        """Close the envs."""
        self.env.close()
        if self._eval_env is not None:
            self._eval_env.close()
