"""``Replay``: the off-policy experience replay, a preallocated numpy ring buffer of transitions."""

from __future__ import annotations

from typing import Any

import numpy as np

from agents.memory.spec import Batch, storage_dtype


class Replay:
    """Off-policy experience replay: a preallocated numpy ring buffer (Lin 1992; Mnih et al. 2015).

    Args:
        max_size: capacity in transitions.
        obs_shape: O, shape of one observation.
        act_shape: A, shape of one action (``()`` for discrete).
        act_dtype: numpy dtype of actions.
        batch_size: transitions per ``sample``.
        obs_dtype: dtype of the observation space. Integer dtypes are stored as they are (an 84x84x4 uint8
            Atari stack is 28,224 bytes per observation, a quarter of float32), float16 too; other floating
            ones as float32 (MuJoCo's float64 included: the nets compute in float32). ``make_replay`` passes
            float16 here for ``memory.obs_dtype: float16`` (``storage_dtype``).
        use_cer: combined experience replay (Zhang & Sutton 2017): the newest transition is always
            in the sample.
        store_next_obs: false keeps no ``next_obs`` array (``add`` ignores its argument, ``sample`` returns
            none): the SIL replay needs none (``SILReplay``).

    Raises:
        ValueError: if ``max_size`` or ``batch_size`` is not positive.
    """

    has_replay = True  # a buffer checkpointed only with memory.checkpoint, else refilled (docs/ARCHITECTURE.md 5)

    def __init__(self, max_size: int, obs_shape: tuple[int, ...], act_shape: tuple[int, ...],
                 act_dtype: np.dtype, batch_size: int, use_cer: bool = False, obs_dtype: Any = np.float32,
                 store_next_obs: bool = True) -> None:
        if max_size <= 0 or batch_size <= 0:
            raise ValueError(f"max_size ({max_size}) and batch_size ({batch_size}) must be > 0")
        self.max_size, self.batch_size, self.use_cer = int(max_size), int(batch_size), use_cer
        obs_dtype = storage_dtype(obs_dtype)
        self.obs_shape, self.obs_dtype = tuple(obs_shape), np.dtype(obs_dtype)  # O and its storage dtype
        self.data: Batch = {
            **self.obs_storage(),
            "act": np.zeros((max_size, *act_shape), act_dtype),
            "reward": np.zeros(max_size, np.float32),
        }
        if store_next_obs:
            self.data["next_obs"] = np.zeros((max_size, *obs_shape), obs_dtype)
        self.data["terminated"] = np.zeros(max_size, np.float32)
        self.head = 0  # next write index
        self.size = 0  # number of valid rows

    def obs_storage(self) -> Batch:
        """The preallocated observation arrays: ``obs`` (max_size, *O) in the storage dtype."""
        return {"obs": np.zeros((self.max_size, *self.obs_shape), self.obs_dtype)}

    def add(self, obs_NO: np.ndarray, act_NA: np.ndarray, reward_N: np.ndarray, next_obs_NO: np.ndarray,
            terminated_N: np.ndarray, truncated_N: np.ndarray) -> None:
        """Write N transitions at the head, wrapping around and overwriting the oldest."""
        n = len(reward_N)
        idx = (self.head + np.arange(n)) % self.max_size if self.head + n > self.max_size \
            else slice(self.head, self.head + n)
        data = self.data
        data["obs"][idx] = obs_NO
        data["act"][idx] = act_NA
        data["reward"][idx] = reward_N
        if "next_obs" in data:
            data["next_obs"][idx] = next_obs_NO
        data["terminated"][idx] = terminated_N
        self.head = (self.head + n) % self.max_size
        self.size = min(self.size + n, self.max_size)

    def sample(self, rng: np.random.Generator) -> Batch:
        """Uniform sample with replacement of ``batch_size`` transitions.

        Returns:
            dict of arrays with leading dim B = batch_size: obs (B, *O) and next_obs (B, *O; unless
            ``store_next_obs`` is false) in the storage dtype (uint8 for pixels), act (B, *A), reward (B,)
            float32, terminated (B,) float32.

        Raises:
            ValueError: if the buffer is empty.
        """
        return {k: v[0] for k, v in self.sample_many(rng, 1).items()}

    def sample_many(self, rng: np.random.Generator, n: int) -> Batch:
        """``n`` uniform samples of ``batch_size`` in one draw and one gather: arrays with leading dims (n, B),
        row i what the i-th of n ``sample`` calls would return (``rng.integers`` of n*B values is the same
        stream as n calls of B).

        Raises:
            ValueError: if the buffer is empty.
        """
        if self.size == 0:
            raise ValueError("cannot sample from an empty Replay")
        idx = rng.integers(0, self.size, size=(n, self.batch_size))
        if self.use_cer:
            idx[:, -1] = (self.head - 1) % self.max_size
        return self.gather(idx)

    def gather(self, idx: np.ndarray) -> Batch:
        """The stored fields of rows ``idx`` (any shape S): arrays (*S, ...)."""
        return {k: v[idx] for k, v in self.data.items()}

    def __len__(self) -> int:
        return self.size

    @property
    def nbytes(self) -> int:
        """Bytes of the preallocated arrays (the replay's memory at ``max_size``)."""
        return sum(v.nbytes for v in self.data.values())

    @property
    def obs_nbytes(self) -> int:
        """Bytes of one sampled observation (O in the storage dtype)."""
        return int(np.prod(self.obs_shape, dtype=np.int64)) * self.obs_dtype.itemsize

    def state_dict(self) -> dict[str, Any]:
        """The valid rows (in storage order) plus ``head`` and ``size``."""
        return {"data": {k: v[: self.size].copy() for k, v in self.data.items()},
                "head": self.head, "size": self.size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore rows and write pointer.

        Raises:
            ValueError: if the saved buffer does not fit this capacity or shapes differ.
        """
        size = int(state["size"])
        if size > self.max_size:
            raise ValueError(f"saved replay holds {size} rows > max_size {self.max_size}")
        for k, v in self.data.items():
            saved = np.asarray(state["data"][k])
            if saved.shape[1:] != v.shape[1:]:
                raise ValueError(f"replay field '{k}' shape {saved.shape[1:]} != {v.shape[1:]}")
            v[:size] = saved
        self.head, self.size = int(state["head"]), size

    def cut_episodes(self) -> None:
        """Nothing to cut: each row is one transition with its true next observation, so no row
        spans the env reset (rows stay as stored)."""
