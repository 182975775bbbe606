"""On-policy memories: ``OnPolicyBatchReplay`` (a rollout of a fixed horizon), ``OnPolicyReplay`` (whole
episodes) and ``OnPolicyCrossEntropy`` (its best episodes only)."""

from __future__ import annotations

from typing import Any

import numpy as np

from agents.memory.spec import FIELDS, ROLLOUT_FIELDS, Batch, MemorySpec


class OnPolicyBatchReplay:
    """On-policy rollout of a fixed horizon: T vector steps of N sub-envs (SLM-Lab ``OnPolicyBatchReplay``).

    Args:
        horizon: T, vector steps per rollout (``training_frequency`` / ``time_horizon``).

    ``ready()`` is true once T steps are stored; ``pop()`` returns arrays shaped (T, N, ...) and
    empties the memory. ``cut_episodes()`` marks the last stored step of each sub-env truncated.

    Each observation is held once: a step's ``next_obs`` is not kept when the next ``add`` passes it again as
    its ``obs`` (the session loop does, ``obs = next_obs``, on every step on which no sub-env ended; a done
    step's next obs holds final observations, which the next obs does not), so a rollout holds
    T + (done steps) + 1 observation rows instead of 2T (an Atari PPO rollout of 128 x 8 stacked 84x84
    frames: ~29 MB instead of ~58 MB, in memory and in checkpoints). ``pop()`` rebuilds the full
    ``next_obs`` and says which steps shared it.

    Raises:
        ValueError: if ``horizon`` is not positive.
    """

    has_replay = False  # always in the checkpoint (small)

    def __init__(self, horizon: int) -> None:
        if horizon <= 0:
            raise ValueError(f"horizon must be > 0 steps, got {horizon}")
        self.horizon = int(horizon)
        self.rows: list[tuple[np.ndarray, ...]] = []  # ROLLOUT_FIELDS per step
        self.next_obs: list[np.ndarray | None] = []  # per step: its next obs, None where the next row's obs is it

    def add(self, obs_NO: np.ndarray, act_NA: np.ndarray, reward_N: np.ndarray, next_obs_NO: np.ndarray,
            terminated_N: np.ndarray, truncated_N: np.ndarray) -> None:
        """Append one vector step; the previous step's next obs is dropped when ``obs_NO`` equals it (the same
        array, or equal values: a resumed session's restored obs, so a resume shares exactly as the run did)."""
        prev = self.next_obs[-1] if self.next_obs else None
        if prev is not None and (prev is obs_NO or np.array_equal(prev, obs_NO)):
            self.next_obs[-1] = None
        self.rows.append((obs_NO, act_NA, reward_N, terminated_N, truncated_N))
        self.next_obs.append(next_obs_NO)

    def ready(self) -> bool:
        """True when a full rollout of ``horizon`` steps is stored."""
        return len(self.rows) >= self.horizon

    def _stack(self) -> Batch:
        """The stored steps as arrays: obs (T, N, *O), act (T, N, *A), reward/terminated/truncated (T, N)."""
        return {k: np.stack(col) for k, col in zip(ROLLOUT_FIELDS, zip(*self.rows))}

    def pop(self) -> Batch:
        """Stack and clear: ``_stack``'s arrays, next_obs (T, N, *O), and ``next_shared`` (T,) bool, true where
        step t's next obs is step t + 1's obs (``next_obs[t] == obs[t + 1]``: its values need no own forward)."""
        batch = self._stack()
        shared = np.array([n is None for n in self.next_obs])
        batch["next_obs"] = np.stack([n if n is not None else self.rows[t + 1][0] for t, n in enumerate(self.next_obs)])
        batch["next_shared"] = shared
        self.rows, self.next_obs = [], []
        return batch

    def __len__(self) -> int:
        return len(self.rows)

    def state_dict(self) -> dict[str, Any]:
        """The partial rollout as stacked arrays (empty dict when no rows); ``next_obs`` (k, N, *O) holds only
        the k next observations not shared with the next step, at steps ``next_rows`` (k,)."""
        if not self.rows:
            return {"data": {}}
        own = [t for t, n in enumerate(self.next_obs) if n is not None]
        return {"data": {**self._stack(), "next_obs": np.stack([self.next_obs[t] for t in own]),
                         "next_rows": np.asarray(own, np.int64)}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a partial rollout (also one saved with every step's next obs, without ``next_rows``)."""
        data = state["data"]
        n_rows = len(data.get("obs", []))
        self.rows = [tuple(np.asarray(data[k][i]) for k in ROLLOUT_FIELDS) for i in range(n_rows)]
        next_rows = np.asarray(data.get("next_rows", np.arange(n_rows)), np.int64).tolist()
        self.next_obs = [None] * n_rows
        for j, t in enumerate(next_rows):
            self.next_obs[t] = np.asarray(data["next_obs"][j])

    def cut_episodes(self) -> None:
        """End every sub-env's episode at the last stored step: its ``truncated`` (N,) becomes true
        where ``terminated`` is false.

        The rollout keeps its T steps (a fixed-horizon batch), and the episodes the env was reset
        under end as time-limit cuts: GAE (PPO) still bootstraps from V of the stored next obs and
        stops its trace there; Monte-Carlo returns (REINFORCE) stop there. No-op when empty.
        """
        if not self.rows:
            return
        *head, terminated_N, truncated_N = self.rows[-1]
        cut_N = np.logical_or(truncated_N, np.logical_not(terminated_N))
        self.rows[-1] = (*head, terminated_N, cut_N.astype(np.asarray(truncated_N).dtype))


class OnPolicyReplay:
    """Episodic on-policy memory (SLM-Lab ``OnPolicyReplay``): whole episodes per sub-env.

    Args:
        num_episodes: completed episodes (summed over sub-envs) that make the memory ``ready``.

    ``pop()`` returns the completed episodes concatenated along one time axis (T_total,), each
    ending in a done step, and keeps any unfinished episodes. ``cut_episodes()`` drops the
    unfinished ones.

    Raises:
        ValueError: if ``num_episodes`` is not positive.
    """

    has_replay = False  # always in the checkpoint (small)

    def __init__(self, num_episodes: int, num_envs: int) -> None:
        if num_episodes <= 0:
            raise ValueError(f"training_frequency must be > 0 episodes, got {num_episodes}")
        self.num_episodes, self.num_envs = int(num_episodes), int(num_envs)
        self.current: list[list[tuple[np.ndarray, ...]]] = [[] for _ in range(num_envs)]
        self.done_episodes: list[list[tuple[np.ndarray, ...]]] = []

    def add(self, obs_NO: np.ndarray, act_NA: np.ndarray, reward_N: np.ndarray, next_obs_NO: np.ndarray,
            terminated_N: np.ndarray, truncated_N: np.ndarray) -> None:
        """Append one step per sub-env; a terminated or truncated step closes that env's episode."""
        for i in range(self.num_envs):
            self.current[i].append((obs_NO[i], act_NA[i], reward_N[i], next_obs_NO[i],
                                    terminated_N[i], truncated_N[i]))
            if terminated_N[i] or truncated_N[i]:
                self.done_episodes.append(self.current[i])
                self.current[i] = []

    def ready(self) -> bool:
        """True once ``num_episodes`` episodes are complete."""
        return len(self.done_episodes) >= self.num_episodes

    def pop(self) -> Batch:
        """Completed episodes, concatenated: obs (T, *O), act (T, *A), reward/terminated/truncated (T,)."""
        steps = [step for episode in self.done_episodes for step in episode]
        self.done_episodes = []
        return {k: np.stack(col) for k, col in zip(FIELDS, zip(*steps))}

    def __len__(self) -> int:
        return sum(map(len, self.done_episodes)) + sum(map(len, self.current))

    def state_dict(self) -> dict[str, Any]:
        """Every stored step with its env index and episode boundaries, as arrays."""
        def pack(episodes: list[list[tuple[np.ndarray, ...]]]) -> dict[str, Any]:
            steps = [s for ep in episodes for s in ep]
            data = {k: np.stack(col) for k, col in zip(FIELDS, zip(*steps))} if steps else {}
            return {"data": data, "lengths": np.array([len(ep) for ep in episodes], np.int64)}
        return {"done": pack(self.done_episodes), "current": pack(self.current)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore completed and unfinished episodes."""
        def unpack(packed: dict[str, Any]) -> list[list[tuple[np.ndarray, ...]]]:
            data, episodes, start = packed["data"], [], 0
            for length in np.asarray(packed["lengths"]).tolist():
                episodes.append([tuple(np.asarray(data[k][j]) for k in FIELDS)
                                 for j in range(start, start + length)])
                start += length
            return episodes
        self.done_episodes = unpack(state["done"])
        self.current = unpack(state["current"])

    def cut_episodes(self) -> None:
        """Drop every sub-env's unfinished episode; completed episodes stay.

        Dropped rather than truncated: REINFORCE's Monte-Carlo return of a cut episode would
        bootstrap 0 and bias its returns low, and this memory counts whole episodes anyway.
        """
        self.current = [[] for _ in range(self.num_envs)]


class OnPolicyCrossEntropy(OnPolicyReplay):
    """``OnPolicyReplay`` that trains on its best episodes only: the cross-entropy method's elite selection
    (SLM-Lab v4's ``OnPolicyCrossEntropy``; Kroese et al. 2013, "Cross-entropy method", section 2).

    Args:
        num_episodes, num_envs: as ``OnPolicyReplay``.
        cross_entropy: q in [0, 1]. ``pop()`` keeps the completed episodes whose undiscounted return is at least
            the q-quantile of the popped episodes' returns (``np.percentile(returns, 100 q)``, linear
            interpolation, as SLM-Lab): q = 0.5 keeps the better half, ties at the bound all kept, the best
            episode always kept; q = 1 keeps every episode (SLM-Lab filters only below 1).

    Raises:
        ValueError: if ``num_episodes`` is not positive or ``cross_entropy`` is outside [0, 1].
    """

    def __init__(self, num_episodes: int, num_envs: int, cross_entropy: float = 1.0) -> None:
        if not 0 <= cross_entropy <= 1:
            raise ValueError(f"cross_entropy must be in [0, 1], got {cross_entropy}")
        super().__init__(num_episodes, num_envs)
        self.cross_entropy = float(cross_entropy)

    def pop(self) -> Batch:
        """``OnPolicyReplay.pop`` of the kept episodes (every completed episode leaves the memory)."""
        if self.cross_entropy < 1.0 and self.done_episodes:
            returns = [sum(float(step[2]) for step in episode) for episode in self.done_episodes]
            bound = np.percentile(returns, 100 * self.cross_entropy)
            self.done_episodes = [ep for ep, ret in zip(self.done_episodes, returns) if ret >= bound]
        return super().pop()


EPISODIC = ("OnPolicyReplay", "OnPolicyCrossEntropy")  # memory names of whole-episode memories


def episodic_memory(spec: MemorySpec, num_episodes: int, num_envs: int) -> OnPolicyReplay:
    """The whole-episode memory ``spec.name`` names (one of ``EPISODIC``): ``OnPolicyReplay``, or
    ``OnPolicyCrossEntropy`` with ``spec.cross_entropy``; ``num_episodes`` completed episodes make it ready.

    Raises:
        ValueError: for another name, or as the memory's constructor.
    """
    if spec.name == "OnPolicyCrossEntropy":
        return OnPolicyCrossEntropy(num_episodes, num_envs, spec.cross_entropy)
    if spec.name != "OnPolicyReplay":
        raise ValueError(f"agent.memory.name: expected one of {list(EPISODIC)}, got {spec.name!r}")
    return OnPolicyReplay(num_episodes, num_envs)
