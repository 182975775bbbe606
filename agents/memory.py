"""Memories: store transitions and hand them out; they never decide when to train.

``MEMORIES`` maps the spec's ``agent.memory.name`` to a class. All memories take vector-env
transitions, one row of N sub-envs per ``add``:

    obs_NO (N, *O) in the observation space's dtype (uint8 pixels on Atari), act_NA (N, *A), reward_N (N,),
    next_obs_NO (N, *O) (the true next
    observation, also on done rows), terminated_N (N,) bool, truncated_N (N,) bool.

Each exposes ``state_dict()`` / ``load_state_dict()`` of plain numpy arrays and ints, so a
checkpoint can store it (``memory.checkpoint: true``), and ``cut_episodes()``, called when the env
was reset under a restored memory (a checkpoint without env state) so that no stored episode runs
on into the new one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from agents.returns import calc_returns

Batch = dict[str, np.ndarray]


@dataclass(frozen=True)
class MemorySpec:
    """The spec ``agent.memory`` section (SLM-Lab key names).

    Fields:
        name: key of ``MEMORIES`` (default: the algorithm's first memory).
        batch_size: transitions per replay sample.
        max_size: replay capacity in transitions.
        use_cer: combined experience replay (the newest transition joins every sample).
        checkpoint: store the replay buffer in checkpoints so a resume continues training at once.
        optimize_memory_usage: SB3's key name; the sampled batches are the same either way. null stores each frame
            of (K, H, W) frame stacks once (``FrameStackReplay``; ``PrioritizedFrameStackReplay`` under
            ``PrioritizedReplay``) and other observations as they are; true does the same and also stores other
            observations once, the next one found by index (``FrameOnceReplay``; not with ``PrioritizedReplay``);
            false stores every observation and next observation (``Replay``, SLM-Lab's layout).
        obs_dtype: storage dtype of floating observations, ``float32`` or ``float16``, SLM-Lab's ``Replay`` (it
            stores every non-uint8 observation as float16: half the bytes, values rounded to about 3 significant
            digits; the nets still compute in float32); integer observations (uint8 frames) are stored as they
            are either way. SLM-Lab has no switch.
        alpha: ``PrioritizedReplay``: priority exponent.
        epsilon: ``PrioritizedReplay``: added to |TD error|.
        beta_start: ``PrioritizedReplay``: None: SLM-Lab's variant, no importance weights; a number: the paper's,
            importance-weight exponent at frame 0.
        beta_end_step: ``PrioritizedReplay``: frame at which beta reaches 1.
        cross_entropy: ``OnPolicyCrossEntropy`` only: q in [0, 1], the quantile of episode returns an episode must
            reach to be trained on (SLM-Lab v4's key; 1 keeps every episode).
        sil_replay_name: SIL / PPOSIL only: the kind of the self-imitation replay beside the on-policy memory
            ``name`` (``Replay`` or ``PrioritizedReplay``; null means ``Replay``; see ``SILReplay``).
    """

    name: str = "Replay"
    batch_size: int = field(default=32, metadata={"gt": 0})
    max_size: int = field(default=10000, metadata={"gt": 0})
    use_cer: bool = False
    checkpoint: bool = field(default=False, metadata={"origin": "lab"})
    optimize_memory_usage: bool | None = field(default=None, metadata={"origin": "SB3"})
    obs_dtype: str = field(default="float32", metadata={"origin": "lab", "choices": ("float32", "float16")})
    alpha: float = field(default=0.6, metadata={"ge": 0})
    epsilon: float = field(default=1e-4, metadata={"ge": 0})
    beta_start: float | None = field(default=None, metadata={"origin": "lab", "ge": 0, "le": 1})
    beta_end_step: int = field(default=100000, metadata={"origin": "lab", "gt": 0})
    cross_entropy: float = field(default=1.0, metadata={"ge": 0, "le": 1})
    sil_replay_name: str | None = field(default=None,
                                        metadata={"origin": "lab", "choices": ("Replay", "PrioritizedReplay")})


FIELDS = ("obs", "act", "reward", "next_obs", "terminated", "truncated")
ROLLOUT_FIELDS = ("obs", "act", "reward", "terminated", "truncated")  # an OnPolicyBatchReplay row (next obs apart)


def storage_dtype(obs_dtype: Any, float_dtype: Any = np.float32) -> np.dtype:
    """Replay storage dtype of observations: integer and bool dtypes as they are, float16 as it is, other
    floating ones ``float_dtype`` (float32, or float16 for ``MemorySpec.obs_dtype: float16``).

    Raises:
        TypeError: not a numpy dtype (or something ``np.dtype`` accepts).
    """
    dtype = np.dtype(obs_dtype)
    if not np.issubdtype(dtype, np.floating) or dtype == np.float16:
        return dtype
    return np.dtype(float_dtype)


def transition_bytes(spec: MemorySpec, obs_space: Any, act_shape: tuple[int, ...], act_dtype: Any,
                     name: str | None = None, store_next_obs: bool = True) -> float:
    """Bytes per transition of the replay ``Replay.from_spec`` builds for these arguments: its preallocated arrays
    (and a ``PrioritizedReplay``'s sum tree) over ``spec.max_size`` rows, without what a stream adds beside them
    (whole stacks at episode ends and starts: about 49 KB per Atari episode). Builds the replay at 1,024 rows
    (its arrays are zero pages until written), so it costs no memory.

    Raises:
        ValueError: as ``Replay.from_spec``.
    """
    rows = min(1024, spec.max_size)
    memory = Replay.from_spec(dataclasses.replace(spec, max_size=rows), obs_space, act_shape, act_dtype, name,
                              store_next_obs)
    if not isinstance(memory, PrioritizedReplay):
        return memory.nbytes / rows
    tree = SumTree(spec.max_size).tree.nbytes  # (2P,) for the power of two P >= max_size: not linear in rows
    return (memory.nbytes - memory.sum_tree.tree.nbytes) / rows + tree / spec.max_size


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
            ones as float32 (MuJoCo's float64 included: the nets compute in float32). ``from_spec`` passes
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

    @staticmethod
    def from_spec(spec: MemorySpec, obs_space: Any, act_shape: tuple[int, ...], act_dtype: Any,
                  name: str | None = None, store_next_obs: bool = True, num_envs: int = 0) -> Replay:
        """The replay ``spec`` asks for, for ``obs_space`` (a gymnasium space with ``shape`` and ``dtype``:
        observations stored in its dtype, floating ones in ``spec.obs_dtype``, see ``storage_dtype``): a
        ``PrioritizedReplay`` when ``name`` (default ``spec.name``) says so, else a ``Replay``; with
        ``spec.optimize_memory_usage`` (see ``MemorySpec``) their frame-once kinds: ``FrameStackReplay`` /
        ``PrioritizedFrameStackReplay`` for (K, H, W) frame stacks, ``FrameOnceReplay`` for other observations.
        ``store_next_obs`` false: no next observations (then ``optimize_memory_usage`` has nothing to save).
        ``num_envs``: N, rows per ``add`` (0: taken from the first add); a frame-once kind needs it to load a
        ``Replay`` state (a checkpoint written without ``optimize_memory_usage``).

        Raises:
            ValueError: as the constructors; ``optimize_memory_usage: true`` with ``PrioritizedReplay`` on
                observations that are not (K, H, W) stacks.
        """
        obs_dtype = storage_dtype(obs_space.dtype, spec.obs_dtype)
        args = (spec.max_size, obs_space.shape, act_shape, act_dtype, spec.batch_size, spec.use_cer, obs_dtype)
        stacks = len(obs_space.shape) == 3
        optimize = store_next_obs and (stacks if spec.optimize_memory_usage is None else spec.optimize_memory_usage)
        if (name or spec.name) == "PrioritizedReplay":
            per = {"alpha": spec.alpha, "epsilon": spec.epsilon, "beta_start": spec.beta_start,
                   "beta_end_step": spec.beta_end_step}
            if not optimize:
                return PrioritizedReplay(*args, **per, store_next_obs=store_next_obs)
            if not stacks:
                raise ValueError("agent.memory.optimize_memory_usage: true is available with PrioritizedReplay "
                                 f"only for (K, H, W) frame stacks, not observations of shape {obs_space.shape}")
            return PrioritizedFrameStackReplay(*args, **per, num_envs=num_envs)
        if not optimize:
            return Replay(*args, store_next_obs=store_next_obs)
        return (FrameStackReplay if stacks else FrameOnceReplay)(*args, num_envs=num_envs)

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


class FrameOnceReplay(Replay):
    """A ``Replay`` that stores each observation once (SB3 ``ReplayBuffer(optimize_memory_usage=True)``'s idea,
    reimplemented): the next observation of row r is the observation of row (r + N) % max_size, the same
    sub-env's next step, so no ``next_obs`` array is kept. Rows whose true next observation differs from that
    successor (episode ends whose successor is the reset observation; a restored env; any mismatch, checked on
    every add) keep theirs in ``final``; the newest N rows, whose successors are not written yet, read it from
    ``pending``. ``sample`` returns exactly what ``Replay`` would, at about half the memory: an Atari
    (4, 84, 84) uint8 transition is 28,240 bytes instead of 56,464 (float32 two-copy storage: 225,808).

    Same arguments as ``Replay`` (``store_next_obs`` must be true: the next observations are what it keeps by
    index), plus ``num_envs``: N, the rows of every ``add`` (the number of sub-envs; 0: taken from the first add).
    With N known it also loads a ``Replay`` state (see ``from_replay_state``).

    Raises:
        ValueError: as ``Replay``; ``store_next_obs`` false; ``max_size`` < 2 N; on ``add``, a row count that
            differs from N.
    """

    def __init__(self, max_size: int, obs_shape: tuple[int, ...], act_shape: tuple[int, ...],
                 act_dtype: np.dtype, batch_size: int, use_cer: bool = False, obs_dtype: Any = np.float32,
                 store_next_obs: bool = True, num_envs: int = 0) -> None:
        if not store_next_obs:
            raise ValueError(f"{type(self).__name__} keeps next observations by index; without them use Replay")
        if num_envs and max_size < 2 * num_envs:
            raise ValueError(f"{type(self).__name__} needs max_size >= 2 * num_envs, got {max_size} < 2 * {num_envs}")
        super().__init__(max_size, obs_shape, act_shape, act_dtype, batch_size, use_cer, obs_dtype,
                         store_next_obs=False)
        self.num_envs = int(num_envs)  # N, else set by the first add
        self.final: dict[int, np.ndarray] = {}  # row -> true next observation (O,)
        self.pending_rows = np.zeros(0, np.int64)  # rows of the newest add, (N,)
        self.pending = np.zeros((0, *self.obs_shape), self.obs_dtype)  # their next observations (N, *O)

    def add(self, obs_NO: np.ndarray, act_NA: np.ndarray, reward_N: np.ndarray, next_obs_NO: np.ndarray,
            terminated_N: np.ndarray, truncated_N: np.ndarray) -> None:
        """Write N transitions at the head; settle the previous add's next observations against ``obs_NO``
        (a row whose true next observation is not its successor's observation keeps it in ``final``)."""
        n = len(reward_N)
        if self.num_envs == 0:
            if self.max_size < 2 * n:
                raise ValueError(f"{type(self).__name__} needs max_size >= 2 * num_envs, got {self.max_size} < 2 * {n}")
            self.num_envs = n
        elif n != self.num_envs:
            raise ValueError(f"{type(self).__name__} takes {self.num_envs} rows per add, got {n}")
        stored_NO = np.asarray(obs_NO).astype(self.obs_dtype, copy=False)  # as stored (float16 rounds)
        for k, row in enumerate(self.pending_rows.tolist()):  # their successors are the rows written now
            if row not in self.final and not np.array_equal(self.pending[k], stored_NO[k]):
                self.final[row] = self.pending[k].copy()
        rows = (self.head + np.arange(n)) % self.max_size
        for row in rows.tolist():
            self.final.pop(row, None)
        self.write_obs(rows, stored_NO)
        data = self.data
        data["act"][rows] = act_NA
        data["reward"][rows] = reward_N
        data["terminated"][rows] = terminated_N
        self.pending_rows, self.pending = rows, np.array(next_obs_NO, dtype=self.obs_dtype)
        self.head = (self.head + n) % self.max_size
        self.size = min(self.size + n, self.max_size)

    def write_obs(self, rows: np.ndarray, obs_NO: np.ndarray) -> None:
        """Store the observations (N, *O) (storage dtype) of the rows (N,) being written."""
        self.data["obs"][rows] = obs_NO

    def observations(self, rows: np.ndarray) -> np.ndarray:
        """Stored observations (R, *O) of valid rows (R,)."""
        return self.data["obs"][rows]

    def next_obs(self, idx: np.ndarray) -> np.ndarray:
        """True next observations (B, *O) of rows ``idx`` (B,)."""
        out = self.observations((idx + self.num_envs) % self.max_size)
        newest = {row: k for k, row in enumerate(self.pending_rows.tolist())}
        for i, row in enumerate(idx.tolist()):
            if row in self.final:
                out[i] = self.final[row]
            elif row in newest:
                out[i] = self.pending[newest[row]]
        return out

    def gather(self, idx: np.ndarray) -> Batch:
        """As ``Replay.gather``: obs, act, reward, next_obs, terminated of rows ``idx`` (any shape S), (*S, ...)."""
        data, flat = self.data, idx.reshape(-1)
        return {"obs": self.observations(flat).reshape(*idx.shape, *self.obs_shape), "act": data["act"][idx],
                "reward": data["reward"][idx], "next_obs": self.next_obs(flat).reshape(*idx.shape, *self.obs_shape),
                "terminated": data["terminated"][idx]}

    @property
    def nbytes(self) -> int:
        """Bytes of the preallocated arrays plus the stored final observations."""
        return super().nbytes + sum(v.nbytes for v in self.final.values()) + self.pending.nbytes

    def state_dict(self) -> dict[str, Any]:
        """``Replay``'s rows and pointers plus ``final`` (rows (F,), observations (F, *O)), ``pending``, N."""
        state = super().state_dict()
        rows = sorted(self.final)
        state.update({"final_rows": np.array(rows, np.int64), "num_envs": self.num_envs,
                      "final_obs": np.stack([self.final[r] for r in rows]) if rows
                      else np.zeros((0, *self.obs_shape), self.obs_dtype),
                      "pending_rows": self.pending_rows.copy(), "pending": self.pending.copy()})
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore rows, pointers, ``final`` and ``pending``.

        Raises:
            ValueError: as ``Replay.load_state_dict`` and ``from_replay_state``.
        """
        if "final_rows" not in state:
            state = self.from_replay_state(state)
        super().load_state_dict(state)
        self.num_envs = int(state["num_envs"])
        rows, final_obs = np.asarray(state["final_rows"]), np.asarray(state["final_obs"])
        self.final = {int(r): final_obs[i].copy() for i, r in enumerate(rows.tolist())}
        self.pending_rows = np.asarray(state["pending_rows"], np.int64).copy()
        self.pending = np.asarray(state["pending"]).astype(self.obs_dtype)

    def from_replay_state(self, state: dict[str, Any], chunk: int = 4096) -> dict[str, Any]:
        """This class's state for a ``Replay`` state (a checkpoint written without ``optimize_memory_usage``):
        its observations; the newest N rows' next observations as ``pending``; ``final`` for the other rows whose
        next observation is not their successor's observation (compared in chunks of ``chunk`` rows).

        Raises:
            ValueError: a state without next observations, or N not known (``num_envs`` 0 and no add yet).
        """
        data = state.get("data", {})
        if "next_obs" not in data or "obs" not in data:
            raise ValueError(f"saved replay is not a {type(self).__name__} or Replay state "
                             "(agent.memory.optimize_memory_usage or agent.memory.name differs)")
        n, m = self.num_envs, self.max_size
        if not n:
            raise ValueError(f"{type(self).__name__} loads a Replay state only with num_envs known")
        obs, nxt = np.asarray(data["obs"]), np.asarray(data["next_obs"])
        size, head = int(state["size"]), int(state["head"])
        newest = (head - n + np.arange(n)) % m if size else np.zeros(0, np.int64)
        final = [np.zeros(0, np.int64)]
        for start in range(0, size, chunk):
            rows = np.arange(start, min(size, start + chunk))
            succ = (rows + n) % m
            kept = (succ < size) & ~np.isin(rows, newest)
            same = (nxt[rows] == obs[np.where(kept, succ, rows)]).reshape(len(rows), -1).all(axis=1)
            final.append(rows[kept & ~same])
        final_rows = np.concatenate(final)
        return {**state, "data": {k: v for k, v in data.items() if k != "next_obs"}, "num_envs": n,
                "final_rows": final_rows, "final_obs": nxt[final_rows], "pending_rows": newest, "pending": nxt[newest]}


class FrameStackReplay(FrameOnceReplay):
    """A ``FrameOnceReplay`` of stacked frames, observations (K, *F) with the newest frame last on axis 0 (the
    lab's Atari (4, 84, 84): ``FrameStackObservation``, zero-padded at resets), that stores each frame once:
    about 7,073 bytes per Atari transition (a frame, act, reward, terminated and a head flag) instead of 28,240,
    so 1M transitions fit in about 7.1 GB (DeepMind's DQN code for Mnih et al. 2015 and Dopamine's replay also keep
    single frames and stack them when sampling).

    Row r keeps only its newest frame obs[-1] (F) in ``frame``; its stack is rebuilt from the rows r - N,
    r - 2N, ... (mod ``max_size``), the same sub-env's previous steps. That holds only where the stack really
    continues its predecessor's, so each ``add`` checks it by value: a row whose obs[:-1] is not the previous
    observation of its sub-env shifted by one frame (an episode's first step, a reset under a restored
    buffer, the first add, any other stack) is a *head* and keeps its K - 1 older frames in ``heads``. When
    the ring overwrites row p, the next row of p's stream, p + N, becomes the stream's oldest and is made a
    head (its stack written out before p goes), so a rebuild walks back at most K - 1 valid rows and stops at
    the first head. Next observations are ``FrameOnceReplay``'s: the successor's stack, or ``final`` /
    ``pending`` where they differ. ``sample`` returns exactly what ``Replay`` would.

    Loads its own states, ``FrameOnceReplay``'s (a checkpoint written before this class: the newest frame
    of each saved observation kept, heads found by the same check) and, with ``num_envs`` known, ``Replay``'s.

    Args:
        as ``FrameOnceReplay``; ``obs_shape`` must have 3 axes (K, H, W), chosen by ``Replay.from_spec`` for
        such spaces unless ``optimize_memory_usage`` is false. Stacks whose frames are several slices of axis 0 (a
        ``frame_op: concat`` of colour frames, (3K, H, W)) fail the check on every row: correct, each row a
        head, no saving over ``FrameOnceReplay``.

    Raises:
        ValueError: as ``FrameOnceReplay``; ``obs_shape`` without 3 axes.
    """

    def __init__(self, max_size: int, obs_shape: tuple[int, ...], act_shape: tuple[int, ...],
                 act_dtype: np.dtype, batch_size: int, use_cer: bool = False, obs_dtype: Any = np.float32,
                 store_next_obs: bool = True, num_envs: int = 0) -> None:
        if len(obs_shape) != 3:
            raise ValueError(f"FrameStackReplay needs (K, H, W) observations, got shape {tuple(obs_shape)}")
        super().__init__(max_size, obs_shape, act_shape, act_dtype, batch_size, use_cer, obs_dtype, store_next_obs,
                         num_envs)
        self.is_head = np.zeros(self.max_size, bool)  # (M,) row keeps its older frames in heads
        self.heads: dict[int, np.ndarray] = {}  # head row -> its stack's K - 1 older frames (K - 1, *F)

    def obs_storage(self) -> Batch:
        """The preallocated frames: ``frame`` (max_size, *F), each row's newest frame."""
        return {"frame": np.zeros((self.max_size, *self.obs_shape[1:]), self.obs_dtype)}

    def write_obs(self, rows: np.ndarray, obs_NO: np.ndarray) -> None:
        """Store the newest frames of ``obs_NO`` (N, K, *F) at ``rows`` (N,); keep heads as the class says."""
        n, m = self.num_envs, self.max_size
        old = rows[rows < self.size]  # rows holding transitions about to be overwritten
        succ = (old + n) % m
        succ = succ[~self.is_head[succ]]
        if len(succ):  # each overwritten row's successor becomes its stream's oldest: a head
            self.set_heads(succ, self.observations(succ)[:, :-1])
        for row in rows.tolist():
            self.heads.pop(row, None)
        self.is_head[rows] = False
        if len(self.pending_rows):  # the previous add's rows: the same sub-envs one step earlier
            prev_NO = self.observations(self.pending_rows)
            cont = (obs_NO[:, :-1] == prev_NO[:, 1:]).reshape(n, -1).all(axis=1)
        else:
            cont = np.zeros(len(rows), bool)
        if not cont.all():
            self.set_heads(rows[~cont], obs_NO[~cont, :-1])
        self.data["frame"][rows] = obs_NO[:, -1]

    def set_heads(self, rows: np.ndarray, older: np.ndarray) -> None:
        """Make ``rows`` (R,) heads keeping their stacks' older frames ``older`` (R, K - 1, *F)."""
        for i, row in enumerate(rows.tolist()):
            self.heads[row] = older[i].copy()
        self.is_head[rows] = True

    def observations(self, rows: np.ndarray) -> np.ndarray:
        """Stacks (R, K, *F) of valid rows (R,): frames of rows r - (K-1)N, ..., r - N, r, the older ones
        from the nearest head at or before r within those K rows."""
        k = self.obs_shape[0]
        back = (rows[:, None] - self.num_envs * np.arange(k - 1, -1, -1)) % self.max_size  # (R, K): oldest first
        out = self.data["frame"][back]
        hit = self.is_head[back]
        for i in np.flatnonzero(hit.any(axis=1)).tolist():
            c = k - 1 - int(np.argmax(hit[i, ::-1]))  # column of the nearest head, K - 1 - c steps back
            out[i, :c] = self.heads[int(back[i, c])][k - 1 - c:]
        return out

    @property
    def nbytes(self) -> int:
        """Bytes of the preallocated arrays (frames, act, reward, terminated, ``is_head``), the heads' older
        frames, the final and pending next observations."""
        return super().nbytes + self.is_head.nbytes + sum(v.nbytes for v in self.heads.values())

    def state_dict(self) -> dict[str, Any]:
        """``FrameOnceReplay``'s state with ``frame`` (S, *F) for ``obs``, plus ``head_rows`` (H,) and
        ``head_frames`` (H, K - 1, *F)."""
        state = super().state_dict()
        rows = sorted(self.heads)
        state.update({"head_rows": np.array(rows, np.int64),
                      "head_frames": np.stack([self.heads[r] for r in rows]) if rows
                      else np.zeros((0, self.obs_shape[0] - 1, *self.obs_shape[1:]), self.obs_dtype)})
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict``, a ``FrameOnceReplay`` state or a ``Replay`` state (see the class).

        Raises:
            ValueError: as ``FrameOnceReplay.load_state_dict``; stacks or heads of another shape.
        """
        if "final_rows" not in state:
            state = self.from_replay_state(state)
        if "obs" in state["data"]:
            state = self.from_frame_once_state(state)
        super().load_state_dict(state)
        rows, older = np.asarray(state["head_rows"], np.int64), np.asarray(state["head_frames"])
        if older.shape[1:] != (self.obs_shape[0] - 1, *self.obs_shape[1:]):
            raise ValueError(f"replay heads hold {older.shape[1:]} older frames, expected "
                             f"{(self.obs_shape[0] - 1, *self.obs_shape[1:])} for stacks {self.obs_shape}")
        self.heads, self.is_head[:] = {}, False
        self.set_heads(rows, older.astype(self.obs_dtype, copy=False))

    def from_frame_once_state(self, state: dict[str, Any], chunk: int = 4096) -> dict[str, Any]:
        """This class's state for a ``FrameOnceReplay`` state of (S, K, *F) stacks: each row's newest frame; a
        row is a head where its stream's previous row is not stored (the N oldest rows) or its stack does not
        continue that row's (checked in chunks of ``chunk`` rows, so no second copy of the stacks is made).

        Raises:
            ValueError: saved stacks of another shape than ``obs_shape``.
        """
        obs = np.asarray(state["data"]["obs"])
        if obs.shape[1:] != self.obs_shape:
            raise ValueError(f"replay field 'obs' shape {obs.shape[1:]} != {self.obs_shape}")
        size, head, n = int(state["size"]), int(state["head"]), int(state["num_envs"])
        oldest_first = (np.arange(size) - (head if size == self.max_size else 0)) % max(size, 1)  # ring age rank
        heads = []
        for start in range(0, size, chunk):
            rows = np.arange(start, min(size, start + chunk))
            prev = (rows - n) % self.max_size
            no_prev = oldest_first[rows] < n
            cont = (obs[rows, :-1] == obs[np.where(no_prev, rows, prev), 1:]).reshape(len(rows), -1).all(axis=1)
            heads.append(rows[no_prev | ~cont])
        head_rows = np.concatenate(heads) if heads else np.zeros(0, np.int64)
        data = {k: v for k, v in state["data"].items() if k != "obs"}
        return {**state, "data": {"frame": obs[:, -1], **data}, "head_rows": head_rows,
                "head_frames": obs[head_rows, :-1]}


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
    ``Replay.from_spec`` for SLM-Lab's Atari PER specs). Arguments: ``PrioritizedReplay``'s plus ``num_envs``
    (``FrameStackReplay``'s). Loads its own states and a ``PrioritizedReplay``'s (with ``num_envs`` known).

    Raises:
        ValueError: as both bases.
    """


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


MEMORIES = {"Replay": Replay, "PrioritizedReplay": PrioritizedReplay, "OnPolicyReplay": OnPolicyReplay,
            "OnPolicyCrossEntropy": OnPolicyCrossEntropy,
            "OnPolicyBatchReplay": OnPolicyBatchReplay}
