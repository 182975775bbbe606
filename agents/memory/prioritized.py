"""Prioritized replay (Schaul et al. 2016): ``PrioritizedReplay`` with its ``SumTree``, and
``PrioritizedFrameStackReplay`` over ``FrameStackReplay``'s storage."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from agents.memory.frames import FrameStackReplay
from agents.memory.replay import Replay
from agents.memory.spec import Batch


class SumTree:
    """Binary sum tree over P leaves (P = the power of two >= capacity) in one float64 array (2P,): the
    root is node 1, node i has children 2i and 2i + 1, leaf j is node P + j. Each parent is recomputed as
    the sum of its children (never updated by deltas), so the tree is a pure function of its leaves.

    Args:
        capacity: number of leaves used (> 0).
    """

    def __init__(self, capacity: int) -> None:
        self.leaves = 1 << max(int(capacity) - 1, 0).bit_length()
        self.tree = np.zeros(2 * self.leaves, np.float64)

    @property
    def total(self) -> float:
        """Sum of all leaves."""
        return float(self.tree[1])

    def get(self, idx: np.ndarray) -> np.ndarray:
        """Leaf values (B,) at leaf indices (B,)."""
        return self.tree[self.leaves + np.asarray(idx)]

    def set(self, idx: np.ndarray, value: np.ndarray) -> None:
        """Set leaves ``idx`` (B,) to ``value`` (B,) (the last write wins on repeats), then their ancestors."""
        node = self.leaves + np.asarray(idx, np.int64)
        self.tree[node] = value
        for _ in range(self.leaves.bit_length() - 1):  # one level up per pass; repeated nodes get the same sum
            node = node // 2
            self.tree[node] = self.tree[2 * node] + self.tree[2 * node + 1]

    def find(self, value: np.ndarray) -> np.ndarray:
        """Leaf indices (B,) whose prefix-sum interval holds each of ``value`` (B,) in [0, total).

        Descends from the root, going right when the value is at least the left subtree's sum and the
        right subtree is non-empty, so a zero leaf is never returned while the tree is non-empty.
        """
        value = np.array(value, np.float64)
        node = np.ones(len(value), np.int64)
        while node[0] < self.leaves:
            left = 2 * node
            left_sum = self.tree[left]
            right = (value >= left_sum) & (self.tree[left + 1] > 0)
            value = np.where(right, value - left_sum, value)
            node = np.where(right, left + 1, left)
        return node - self.leaves


class PrioritizedReplay(Replay):
    """Proportional prioritized replay (Schaul et al. 2016, arXiv:1511.05952) over ``Replay``'s ring buffer.

    Transition i is sampled with probability ``P(i) = p_i / sum_j p_j`` where ``p_i = (|delta_i| +
    epsilon) ** alpha`` from its latest TD error (``update_priorities``). ``sample`` draws one value per equal
    slice of the total (stratified, as in the paper) from ``rng``. Two variants, by ``beta_start``:

    * ``beta_start`` None (default): SLM-Lab v5.3's ``PrioritizedReplay``. A new transition enters with the
      priority of a TD error of ``NEW_ERROR`` (1e5, SLM-Lab's ``add_experience`` default, so each is sampled
      soon after it arrives) and samples are not importance-weighted (``weight`` is 1 for every row).
    * ``beta_start`` a number: the paper's. A new transition gets the largest priority seen so far (1 at
      first), and ``sample`` returns importance weights ``w_i = (size * P(i)) ** -beta`` divided by the
      batch's largest, with ``beta`` linear in the frame from ``beta_start`` (frame 0) to 1 (``beta_end_step``
      frames and after).

    Args:
        max_size, obs_shape, act_shape, act_dtype, batch_size, use_cer, store_next_obs: as ``Replay``;
            ``storage``: the storage class's own arguments (``num_envs`` of ``PrioritizedFrameStackReplay``).
        alpha: priority exponent >= 0 (0 is uniform).
        epsilon: added to |TD error| (>= 0) so no transition gets priority 0.
        beta_start: None (SLM-Lab's variant), or beta at frame 0, in [0, 1].
        beta_end_step: frame at which beta reaches 1 (> 0).

    Raises:
        ValueError: as ``Replay``; a negative ``alpha`` / ``epsilon`` or ``beta_end_step`` <= 0.
    """

    NEW_ERROR: ClassVar[float] = 1e5  # SLM-Lab's TD error of a new transition (its add_experience error=100000)

    def __init__(self, max_size: int, obs_shape: tuple[int, ...], act_shape: tuple[int, ...], act_dtype: np.dtype,
                 batch_size: int, use_cer: bool = False, obs_dtype: Any = np.float32, alpha: float = 0.6,
                 epsilon: float = 1e-4, beta_start: float | None = None, beta_end_step: int = 100000,
                 store_next_obs: bool = True, **storage: Any) -> None:
        super().__init__(max_size, obs_shape, act_shape, act_dtype, batch_size, use_cer, obs_dtype,
                         store_next_obs=store_next_obs, **storage)
        if alpha < 0 or epsilon < 0 or beta_end_step <= 0:
            raise ValueError(f"alpha ({alpha}) and epsilon ({epsilon}) must be >= 0, beta_end_step "
                             f"({beta_end_step}) > 0 frames")
        self.alpha, self.epsilon = float(alpha), float(epsilon)
        self.beta_start = None if beta_start is None else float(beta_start)
        self.beta_end_step = int(beta_end_step)
        self.sum_tree = SumTree(self.max_size)
        self.max_priority = 1.0

    def add(self, obs_NO: np.ndarray, act_NA: np.ndarray, reward_N: np.ndarray, next_obs_NO: np.ndarray,
            terminated_N: np.ndarray, truncated_N: np.ndarray) -> None:
        """``Replay.add``; the N new rows get ``new_priority``."""
        rows = (self.head + np.arange(len(reward_N))) % self.max_size
        super().add(obs_NO, act_NA, reward_N, next_obs_NO, terminated_N, truncated_N)
        self.sum_tree.set(rows, np.full(len(rows), self.new_priority))

    @property
    def new_priority(self) -> float:
        """Priority of a new transition: ``(NEW_ERROR + epsilon) ** alpha`` (SLM-Lab's variant) or
        ``max_priority`` (the paper's, with ``beta_start``)."""
        if self.beta_start is None:
            return (self.NEW_ERROR + self.epsilon) ** self.alpha
        return self.max_priority

    def beta(self, frame: int) -> float:
        """Importance-weight exponent at ``frame``: linear from ``beta_start`` to 1 at ``beta_end_step`` (0 in
        SLM-Lab's variant: no weighting)."""
        if self.beta_start is None:
            return 0.0
        return min(1.0, self.beta_start + (1.0 - self.beta_start) * frame / self.beta_end_step)

    def sample_many(self, rng: np.random.Generator, n: int) -> Batch:
        """Not available: each prioritized sample depends on the priorities the previous step set."""
        raise NotImplementedError("PrioritizedReplay samples one batch at a time (sample)")

    def sample(self, rng: np.random.Generator, frame: int = 0) -> Batch:
        """Prioritized sample of ``batch_size`` rows at ``frame`` (for beta).

        Returns:
            ``Replay.sample``'s arrays plus ``idx`` (B,) int64 rows (for ``update_priorities``) and
            ``weight`` (B,) float32 importance weights in (0, 1].

        Raises:
            ValueError: if the buffer is empty.
        """
        if self.size == 0:
            raise ValueError("cannot sample from an empty PrioritizedReplay")
        b, total = self.batch_size, self.sum_tree.total
        idx = self.sum_tree.find((np.arange(b) + rng.random(b)) * (total / b))
        idx = np.minimum(idx, self.size - 1)
        if self.use_cer:
            idx[-1] = (self.head - 1) % self.max_size
        batch = self.gather(idx)
        if self.beta_start is None:  # SLM-Lab: no importance weighting
            weight = np.ones(b, np.float32)
        else:
            weight = (self.size * self.sum_tree.get(idx) / total) ** -self.beta(frame)
            weight = (weight / weight.max()).astype(np.float32)
        batch["idx"], batch["weight"] = idx, weight
        return batch

    def update_priorities(self, idx: np.ndarray, td_error: np.ndarray) -> None:
        """Set rows ``idx`` (B,) to priority ``(|td_error| + epsilon) ** alpha`` (B,); raises ``max_priority``."""
        priority = (np.abs(np.asarray(td_error, np.float64)) + self.epsilon) ** self.alpha
        self.sum_tree.set(idx, priority)
        self.max_priority = max(self.max_priority, float(priority.max()))

    @property
    def nbytes(self) -> int:
        """The storage's bytes plus the sum tree's (2P float64, P the power of two >= max_size)."""
        return super().nbytes + self.sum_tree.tree.nbytes

    def state_dict(self) -> dict[str, Any]:
        """``Replay.state_dict`` plus the sum tree (2P,) float64 and ``max_priority``."""
        return {**super().state_dict(), "sum_tree": self.sum_tree.tree.copy(), "max_priority": self.max_priority}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore rows, pointer, sum tree and ``max_priority``.

        Raises:
            ValueError: as ``Replay``, or a sum tree of another capacity.
        """
        super().load_state_dict(state)
        tree = np.asarray(state["sum_tree"], np.float64)
        if tree.shape != self.sum_tree.tree.shape:
            raise ValueError(f"saved sum tree {tree.shape} != {self.sum_tree.tree.shape}")
        self.sum_tree.tree[:] = tree
        self.max_priority = float(state["max_priority"])


class PrioritizedFrameStackReplay(PrioritizedReplay, FrameStackReplay):
    """``PrioritizedReplay`` over ``FrameStackReplay``'s storage: the same priorities, rows and samples as a
    ``PrioritizedReplay`` of the same transitions, each frame of the (K, H, W) stacks stored once (chosen by
    ``make_replay`` for SLM-Lab's Atari PER specs). Arguments: ``PrioritizedReplay``'s plus ``num_envs``
    (``FrameStackReplay``'s). Loads its own states and a ``PrioritizedReplay``'s (with ``num_envs`` known).

    Raises:
        ValueError: as both bases.
    """
