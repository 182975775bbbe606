"""``SILReplay``: the self-imitation memory, an on-policy memory plus a replay of past transitions with their
returns."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from agents.memory.prioritized import PrioritizedReplay
from agents.memory.replay import Replay
from agents.memory.spec import Batch
from agents.returns import calc_returns


class SILReplay:
    """Self-imitation memory (Oh et al. 2018, arXiv:1806.05635, section 3; SLM-Lab's SILReplay): the
    algorithm's on-policy memory plus a replay of past transitions (s, a, R), R the discounted Monte-Carlo
    return of the episode from that step on.

    Every ``add`` goes to the on-policy memory (``ready``/``pop`` are its own) and to one unfinished episode
    per sub-env; when a sub-env's episode ends (terminated or truncated), its T steps enter the replay with
    ``R_t = r_t + gamma * R_{t+1}``, ``R_T = r_T`` (``returns.calc_returns``; a time-limit cut bootstraps 0,
    so R is a lower bound of the return, which is what SIL's ``max(R - V, 0)`` needs). The replay is a
    ``Replay`` or ``PrioritizedReplay`` without next observations; its ``reward`` column holds R.

    ``len()`` is the replay's size (the refill gate of a resume without the replay); ``has_replay`` is
    true, so ``state_dict(with_replay=False)`` (no ``memory.checkpoint``) saves the on-policy memory and
    the unfinished episodes but not the replay.

    Args:
        onpolicy: ``OnPolicyBatchReplay`` or ``OnPolicyReplay``.
        replay: a ``Replay`` / ``PrioritizedReplay`` built with ``store_next_obs=False``.
        gamma: discount in [0, 1].
        num_envs: N, sub-envs per ``add``.
    """

    has_replay = True

    def __init__(self, onpolicy: Any, replay: Replay, gamma: float, num_envs: int) -> None:
        self.onpolicy, self.replay, self.gamma, self.num_envs = onpolicy, replay, float(gamma), int(num_envs)
        self.current: list[list[tuple[np.ndarray, np.ndarray, float]]] = [[] for _ in range(num_envs)]

    def add(self, obs_NO: np.ndarray, act_NA: np.ndarray, reward_N: np.ndarray, next_obs_NO: np.ndarray,
            terminated_N: np.ndarray, truncated_N: np.ndarray) -> None:
        """Store one vector step in the on-policy memory; extend each sub-env's episode and move the
        episodes that end here, with their returns, into the replay."""
        self.onpolicy.add(obs_NO, act_NA, reward_N, next_obs_NO, terminated_N, truncated_N)
        for i in range(self.num_envs):
            self.current[i].append((np.array(obs_NO[i]), np.array(act_NA[i]), float(reward_N[i])))
            if terminated_N[i] or truncated_N[i]:
                self.store_episode(self.current[i])
                self.current[i] = []

    def store_episode(self, steps: list[tuple[np.ndarray, np.ndarray, float]]) -> None:
        """Write one finished episode's T steps (obs, act, reward) with returns R (T,) into the replay (only
        its last ``max_size`` steps when it is longer than the replay)."""
        reward = torch.tensor([r for _, _, r in steps], dtype=torch.float64)
        ret = calc_returns(reward, torch.zeros_like(reward), self.gamma).numpy().astype(np.float32)
        keep = slice(max(0, len(steps) - self.replay.max_size), len(steps))
        obs = np.stack([o for o, _, _ in steps])[keep]
        act = np.stack([a for _, a, _ in steps])[keep]
        flags = np.zeros(len(obs), bool)
        self.replay.add(obs, act, ret[keep], None, flags, flags)

    def ready(self) -> bool:
        """The on-policy memory's ``ready``."""
        return self.onpolicy.ready()

    def pop(self) -> Batch:
        """The on-policy memory's ``pop`` (its rollout or episodes)."""
        return self.onpolicy.pop()

    def sample(self, rng: np.random.Generator, frame: int = 0) -> Batch:
        """A replay sample of ``batch_size`` rows: obs (B, *O), act (B, *A), ret (B,) float32, plus ``idx`` and
        ``weight`` (B,) from a ``PrioritizedReplay`` (beta at ``frame``).

        Raises:
            ValueError: if the replay is empty.
        """
        batch = self.replay.sample(rng, frame) if isinstance(self.replay, PrioritizedReplay) \
            else self.replay.sample(rng)
        batch["ret"] = batch.pop("reward")
        del batch["terminated"]
        return batch

    def __len__(self) -> int:
        return len(self.replay)

    @property
    def nbytes(self) -> int:
        """Bytes of the replay's preallocated arrays."""
        return self.replay.nbytes

    def state_dict(self, with_replay: bool = True) -> dict[str, Any]:
        """The on-policy memory, the unfinished episodes (per sub-env: obs (L, *O), act (L, *A), reward (L,))
        and, with ``with_replay``, the replay."""
        def pack(steps: list[tuple[np.ndarray, np.ndarray, float]]) -> dict[str, np.ndarray]:
            if not steps:
                return {}
            return {"obs": np.stack([o for o, _, _ in steps]), "act": np.stack([a for _, a, _ in steps]),
                    "reward": np.array([r for _, _, r in steps], np.float64)}
        state = {"onpolicy": self.onpolicy.state_dict(), "current": [pack(ep) for ep in self.current]}
        if with_replay:
            state["replay"] = self.replay.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` saved; without ``replay`` in it the replay stays empty (to be refilled).

        Raises:
            ValueError: a saved state for another number of sub-envs, or as ``Replay.load_state_dict``.
        """
        if len(state["current"]) != self.num_envs:
            raise ValueError(f"saved SIL memory has {len(state['current'])} sub-envs, expected {self.num_envs}")
        self.onpolicy.load_state_dict(state["onpolicy"])
        self.current = [[(np.asarray(ep["obs"][j]), np.asarray(ep["act"][j]), float(ep["reward"][j]))
                         for j in range(len(ep.get("reward", [])))] for ep in state["current"]]
        if "replay" in state:
            self.replay.load_state_dict(state["replay"])

    def cut_episodes(self) -> None:
        """The on-policy memory's ``cut_episodes``; the unfinished episodes are dropped (their returns would
        be cut short by the env reset)."""
        self.onpolicy.cut_episodes()
        self.current = [[] for _ in range(self.num_envs)]
