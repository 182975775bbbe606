"""A run's committed data as the reports read it: its session keys, a session's committed train_df/eval_df, the
env's reward threshold and episode step limit, and the note for a run in which no episode has ended yet."""

from __future__ import annotations

import io
import re

import pandas as pd

from orchestrator.store import storage
from orchestrator.store.checkpoint import CheckpointError, CheckpointStore


def session_keys(predir: str) -> list[tuple[int, int]]:
    """(trial, session) of every ``t{T}/s{S}`` directory of a run, sorted."""
    keys = []
    for t_name in storage.listdir(predir):
        if re.fullmatch(r"t\d+", t_name):
            for s_name in storage.listdir(storage.join(predir, t_name)):
                if re.fullmatch(r"s\d+", s_name):
                    keys.append((int(t_name[1:]), int(s_name[1:])))
    return sorted(keys)


def committed_df(session_dir: str, name: str) -> pd.DataFrame | None:
    """``name`` (``train_df.parquet``/``eval_df.parquet``) of the newest checkpoint that verifies, else
    the session directory's copy, else None. Read-only: nothing is moved."""
    store = CheckpointStore(session_dir)
    for frame in store.ranked("latest"):
        try:
            return pd.read_parquet(io.BytesIO(store.read_file(frame, name)))
        except CheckpointError:
            continue
    uri = storage.join(session_dir, name)
    return storage.read_parquet(uri) if storage.exists(uri) else None


def reward_threshold(env_name: str) -> float | None:
    """The env's ``reward_threshold`` in gymnasium's registry (the return at which it counts as
    solved), or None when the registry has none (or does not know the env)."""
    import gymnasium as gym

    from envs.make import resolve_env_id

    try:
        threshold = gym.spec(resolve_env_id(env_name)).reward_threshold
    except Exception:  # noqa: BLE001 - an env outside the registry simply has no threshold
        return None
    return None if threshold is None else float(threshold)




def max_episode_steps(env: dict) -> int | None:
    """Steps after which an episode of the spec's env section ``env`` is cut: ``env.max_t`` when set, else the
    env's own limit (EnvPool's task config for ``env.vectorization: envpool`` and ``playground/`` ids, else
    gymnasium's registry); None where unknown."""
    import warnings

    if env.get("max_t"):
        return int(env["max_t"])
    name = str(env.get("name", ""))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if env.get("vectorization") == "envpool" or name.startswith("playground/"):
                import envpool

                from envs.envpool_vec import resolve_envpool_id
                steps = envpool.make_spec(resolve_envpool_id(name)).config.max_episode_steps
            else:
                import gymnasium as gym

                from envs.make import resolve_env_id
                steps = gym.spec(resolve_env_id(name)).max_episode_steps
    except Exception:  # noqa: BLE001 - an env the registries do not know has no known limit
        return None
    return int(steps) if steps else None


def no_episode_note(env: dict, frame: int) -> str:
    """Why a run has no return yet, for ``frame`` frames (summed over sub-envs) of the spec's env section ``env``:
    ``no episode finished in N frames (episodes of ENV last up to M steps; with K sub-envs the first ends after
    about M*K frames)``; the parenthesis only where the env's step limit is known."""
    note = f"no episode finished in {frame} frames"
    steps = max_episode_steps(env)
    if steps is None:
        return note
    k = int(env.get("num_envs") or 1)
    subs = f"; with {k} sub-envs the first ends after about {steps * k} frames" if k > 1 else ""
    return f"{note} (episodes of {env.get('name')} last up to {steps} steps{subs})"
