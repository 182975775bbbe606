"""SLM-Lab's session and trial metrics (strength, efficiency, stability, consistency) and the random-policy baseline
they are measured against."""

from __future__ import annotations

import math
import os
import re
from typing import Any

import numpy as np
import pandas as pd

from orchestrator.store import storage

SESSION_METRICS = ("final_return_ma", "strength", "max_strength", "final_strength", "sample_efficiency",
                   "training_efficiency", "stability")


TRIAL_METRICS = (*SESSION_METRICS, "consistency")


FINAL_MA_ROWS = 100  # rows averaged into final_return_ma (SLM-Lab's PLOT_MA_WINDOW)


BASELINE_EPISODES = 100


# env steps after which the baseline stops starting episodes (the one under way finishes): 100 random
# episodes of VideoPinball take tens of minutes, which a 500-frame dev run would wait for
BASELINE_MAX_STEPS = 20_000


BASELINE_VERSION = 1  # bump when the baseline's definition changes (invalidates caches)


def calc_strength(returns: pd.Series, rand_return: float) -> tuple[float, pd.Series]:
    """Mean local strength and the local strengths ``R_i - R_rand`` (same index as ``returns``)."""
    local = returns.astype(float) - rand_return
    return float(local.mean()), local


def calc_efficiency(local_strs: pd.Series, ts: pd.Series) -> tuple[float, pd.Series]:
    """``sum(str_i / t_i) / sum(str_i)``; terms with ``t_i = 0`` (inf or NaN) are dropped from the numerator.

    Args:
        local_strs: local strengths (N,).
        ts: frames or opt steps of each row (N,).
    """
    local_effs = (local_strs / ts.astype(float).to_numpy()).replace([np.inf, -np.inf], np.nan).dropna()
    with np.errstate(divide="ignore", invalid="ignore"):
        eff = np.float64(local_effs.sum()) / np.float64(local_strs.sum())
    return float(eff), local_effs


def calc_stability(local_strs: pd.Series) -> tuple[float, pd.Series]:
    """``1 - |sum_i min(str_{i+1} - str_i, 0) / sum_{i<N} str_i|`` and its per-row terms (N-1,)."""
    drops = local_strs.diff().shift(-1).iloc[:-1].clip(upper=0.0)
    denoms = local_strs.iloc[:-1]
    with np.errstate(divide="ignore", invalid="ignore"):
        local_stas = 1 - (drops / denoms).abs()
        sta = 1 - abs(np.float64(drops.sum()) / np.float64(denoms.sum()))
    return float(sta), local_stas


def calc_consistency(local_strs_list: list[pd.Series]) -> tuple[float, pd.Series]:
    """``1 - 2 sum_i std_j(str_ij) / sum_i mean_j(str_ij)`` over sessions j (series aligned by index).

    Returns NaN with fewer than two sessions (a standard deviation needs two).
    """
    stacked = pd.concat(local_strs_list, axis=1)
    mean, std = stacked.mean(axis=1), stacked.std(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        local_cons = 1 - 2 * std / mean
        con = 1 - 2 * np.float64(std.sum()) / np.float64(mean.sum()) if len(local_strs_list) > 1 else math.nan
    return float(con), local_cons


def session_metrics(df: pd.DataFrame, rand_return: float) -> tuple[dict[str, float], pd.DataFrame]:
    """Scalar metrics of one session and its local series, from a train_df/eval_df.

    Args:
        df: rows with ``frame``, ``opt_step``, ``total_reward`` (rows without a return are dropped).
        rand_return: mean return of the random policy on the env.

    Returns:
        ({metric: value} for ``SESSION_METRICS``, DataFrame indexed by frame with ``strength``).

    Raises:
        ValueError: no row has a return.
    """
    df = df.dropna(subset=["total_reward"]).reset_index(drop=True)
    if df.empty:
        raise ValueError("no log row has a total_reward (no episode finished)")
    returns = df["total_reward"].astype(float)
    strength, local_strs = calc_strength(returns, rand_return)
    sample_eff, _ = calc_efficiency(local_strs, df["frame"])
    train_eff, _ = calc_efficiency(local_strs, df["opt_step"])
    stability, _ = calc_stability(local_strs)
    scalar = {"final_return_ma": float(returns.iloc[-FINAL_MA_ROWS:].mean()), "strength": strength,
              "max_strength": float(local_strs.max()), "final_strength": float(local_strs.iloc[-1]),
              "sample_efficiency": sample_eff, "training_efficiency": train_eff, "stability": stability}
    local = pd.DataFrame({"strength": local_strs.to_numpy()}, index=df["frame"].to_numpy())
    return scalar, local


def trial_metrics(sessions: list[tuple[dict[str, float], pd.DataFrame]]) -> dict[str, float]:
    """Mean of the session scalars plus ``consistency`` (sessions' local strengths aligned by frame)."""
    scalars = pd.DataFrame([s for s, _ in sessions])
    out = {k: float(scalars[k].mean()) for k in SESSION_METRICS}
    out["consistency"] = calc_consistency([local["strength"] for _, local in sessions])[0]
    return out


def json_safe(metrics: dict[str, Any]) -> dict[str, Any]:
    """Replace non-finite floats with None (strict JSON)."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}


def compute_random_baseline(env_name: str, max_t: int | None, episodes: int = BASELINE_EPISODES,
                            seed: int = 0, max_steps: int = BASELINE_MAX_STEPS) -> dict[str, Any]:
    """Mean/std of the return of a uniformly random policy over ``episodes`` seeded episodes, or fewer
    where they pass ``max_steps`` env steps: no episode starts after that (at least one runs; the
    ``episodes`` field of the result counts those that ran). SLM-Lab reads the same baseline (100
    episodes) from its precomputed ``spec/_random_baseline.json``."""
    import gymnasium as gym

    from envs.envpool_vec import PLAYGROUND_PREFIX
    from envs.make import resolve_env_id

    if env_name.startswith(PLAYGROUND_PREFIX):  # only EnvPool has these envs
        returns = _envpool_random_returns(env_name, max_t, episodes, seed, max_steps)
        return {"env": env_name, "max_t": max_t, "episodes": len(returns), "seed": seed,
                "version": BASELINE_VERSION, "mean": float(np.mean(returns)), "std": float(np.std(returns))}
    env = gym.make(resolve_env_id(env_name), **({} if max_t is None else {"max_episode_steps": max_t}))
    env.action_space.seed(seed)
    returns, steps = [], 0
    try:
        for i in range(episodes):
            if returns and steps >= max_steps:
                break
            env.reset(seed=seed + i)
            total, done = 0.0, False
            while not done:
                _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
                total += float(reward)
                steps += 1
                done = terminated or truncated
            returns.append(total)
    finally:
        env.close()
    return {"env": env_name, "max_t": max_t, "episodes": len(returns), "seed": seed, "version": BASELINE_VERSION,
            "mean": float(np.mean(returns)), "std": float(np.std(returns))}


def _envpool_random_returns(env_name: str, max_t: int | None, episodes: int, seed: int,
                            max_steps: int) -> list[float]:
    """Returns of a uniformly random policy on one EnvPool sub-env of ``env_name`` (an id only EnvPool has, such as
    ``playground/X``): ``episodes`` episodes, none started after ``max_steps`` steps (at least one runs)."""
    import warnings

    from envs.make import EnvSpec, episode_returns, make_env

    with warnings.catch_warnings():  # the id mapping was announced when the run's spec was checked
        warnings.simplefilter("ignore")
        env = make_env(EnvSpec(env_name, max_frame=1, max_t=max_t, vectorization="envpool"), seed)
    returns: list[float] = []
    steps = 0
    try:
        env.reset(seed=[seed])
        while len(returns) < episodes and not (returns and steps >= max_steps):
            _, _, _, _, info = env.step(env.action_space.sample())
            steps += 1
            returns.extend(episode_returns(info).tolist())
    finally:
        env.close()
    return returns


def default_cache_dir() -> str:
    """``$XDG_CACHE_HOME/rl-trial-lab``, else ``~/.cache/rl-trial-lab``."""
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "rl-trial-lab")


def random_baseline(env_name: str, max_t: int | None, cache_dir: str) -> dict[str, Any]:
    """Random-policy baseline of an env: read from ``{cache_dir}/random_baseline/``, else computed
    and cached there."""
    key = re.sub(r"[^A-Za-z0-9_.-]", "_", env_name) + ("" if max_t is None else f"_max_t{max_t}")
    uri = storage.join(cache_dir, "random_baseline", f"{key}.json")
    if storage.exists(uri):
        cached = storage.read_json(uri)
        if cached.get("version") == BASELINE_VERSION:
            return cached
    baseline = compute_random_baseline(env_name, max_t)
    storage.write_json(uri, baseline)
    return baseline


def run_baseline(predir: str, env: dict[str, Any], cache_dir: str) -> dict[str, Any]:
    """The baseline a run recorded (``info/random_baseline.json``, same env), else the cached one,
    which is then recorded in the run."""
    uri = storage.join(predir, "info", "random_baseline.json")
    if storage.exists(uri):
        recorded = storage.read_json(uri)
        if (recorded.get("env"), recorded.get("max_t")) == (env["name"], env.get("max_t")):
            return recorded
    baseline = random_baseline(env["name"], env.get("max_t"), cache_dir)
    storage.write_json(uri, baseline)
    return baseline


