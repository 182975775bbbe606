"""Per-seed memories of a seed group: parts of its on-policy rollout, and its members' own replays.

A group of K seeds with N sub-envs each stores its rollout in one ``OnPolicyBatchReplay`` of K x N columns, seed k
in columns ``k*N .. (k+1)*N - 1``. ``seed_memory`` cuts seed k's part of its ``state_dict`` out, in the format of
that seed's own ``OnPolicyBatchReplay`` of N columns (so a seed's checkpoint holds what a separate session's
would); ``join_seed_memories`` puts K such parts back into the group's format. Off-policy seeds keep their own
replays instead (``SeedReplays``).
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


class SeedReplays:
    """The K members' own replays seen as the group's memory: ``add`` hands seed k its N columns
    (``k*n .. (k+1)*n - 1`` of the group's K x N), so each seed's replay holds what its separate session's would,
    and samples with that seed's own RNG (``agents.batched.dqn``). ``len`` is every seed's (they add alike).

    Args:
        memories: the K replays, seed order.
        n: N, sub-envs per seed.
    """

    has_replay = True

    def __init__(self, memories: Sequence[Any], n: int) -> None:
        self.memories, self.n = list(memories), n

    def add(self, obs_NO: np.ndarray, act_NA: np.ndarray, reward_N: np.ndarray, next_obs_NO: np.ndarray,
            terminated_N: np.ndarray, truncated_N: np.ndarray) -> None:
        """Store the group's K x N transitions, seed k's N columns in seed k's replay."""
        n = self.n
        for k, memory in enumerate(self.memories):
            cols = slice(k * n, (k + 1) * n)
            memory.add(obs_NO[cols], act_NA[cols], reward_N[cols], next_obs_NO[cols], terminated_N[cols],
                       truncated_N[cols])

    def __len__(self) -> int:
        return len(self.memories[0])

    def cut_episodes(self) -> None:
        """Each replay's ``cut_episodes``."""
        for memory in self.memories:
            memory.cut_episodes()

    def state_dict(self) -> dict[str, Any]:
        """The replays' states, in seed order (each in its own replay's format)."""
        return {"seeds": [memory.state_dict() for memory in self.memories]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict``'s output.

        Raises:
            ValueError: another number of seeds, or what a replay's ``load_state_dict`` raises.
        """
        if len(state["seeds"]) != len(self.memories):
            raise ValueError(f"{len(state['seeds'])} replay states for {len(self.memories)} seeds")
        for memory, part in zip(self.memories, state["seeds"]):
            memory.load_state_dict(part)
