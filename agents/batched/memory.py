"""Per-seed parts of a seed group's on-policy rollout.

A group of K seeds with N sub-envs each stores its rollout in one ``OnPolicyBatchReplay`` of K x N columns, seed k
in columns ``k*N .. (k+1)*N - 1``. ``seed_memory`` cuts seed k's part of its ``state_dict`` out, in the format of
that seed's own ``OnPolicyBatchReplay`` of N columns (so a seed's checkpoint holds what a separate session's
would); ``join_seed_memories`` puts K such parts back into the group's format.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from agents.memory.spec import ROLLOUT_FIELDS


def seed_memory(state: dict[str, Any], k: int, n: int) -> dict[str, Any]:
    """Seed k's part (columns ``k*n:(k+1)*n``) of a group rollout's ``OnPolicyBatchReplay.state_dict``: the same
    format for N columns (``next_rows`` keeps the group's rows: a seed's stored next obs equals the next step's
    obs where none of its sub-envs ended, which ``OnPolicyBatchReplay.pop`` reads the same either way)."""
    data = state["data"]
    if not data:
        return {"data": {}}
    cols = slice(k * n, (k + 1) * n)
    out = {key: np.ascontiguousarray(data[key][:, cols]) for key in (*ROLLOUT_FIELDS, "next_obs")}
    out["next_rows"] = np.asarray(data["next_rows"], np.int64).copy()
    return {"data": out}


def join_seed_memories(states: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The group rollout's ``state_dict`` of K seeds' ``OnPolicyBatchReplay`` states (``seed_memory`` outputs or
    separate sessions' rollouts of one length): columns concatenated in seed order; the next obs stored at the
    union of the seeds' ``next_rows`` (a seed without one at such a row takes its next step's obs, the value its
    ``pop`` would use).

    Raises:
        ValueError: seeds whose rollouts hold different numbers of steps.
    """
    datas = [s["data"] for s in states]
    lengths = {len(d.get("obs", [])) for d in datas}
    if len(lengths) != 1:
        raise ValueError(f"batched seeds' rollouts hold different numbers of steps: {sorted(lengths)}")
    if lengths == {0}:
        return {"data": {}}
    rows_of = [np.asarray(d.get("next_rows", np.arange(len(d["obs"]))), np.int64).tolist() for d in datas]
    union = sorted(set().union(*rows_of))
    next_obs = []
    for d, rows in zip(datas, rows_of):
        at = {t: j for j, t in enumerate(rows)}
        next_obs.append(np.stack([d["next_obs"][at[t]] if t in at else d["obs"][t + 1] for t in union]))
    out = {key: np.concatenate([d[key] for d in datas], axis=1) for key in ROLLOUT_FIELDS}
    out["next_obs"] = np.concatenate(next_obs, axis=1)
    out["next_rows"] = np.asarray(union, np.int64)
    return {"data": out}
