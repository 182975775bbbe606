"""A run's committed data as the reports read it: its session keys, a session's committed train_df/eval_df, and the
env's reward threshold."""

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


