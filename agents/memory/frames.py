"""Frame-once replays: ``FrameOnceReplay`` stores each observation once, ``FrameStackReplay`` each frame of
(K, H, W) frame stacks once; both sample exactly what ``Replay`` would."""

from __future__ import annotations

from typing import Any

import numpy as np

from agents.memory.replay import Replay
from agents.memory.spec import Batch


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
        as ``FrameOnceReplay``; ``obs_shape`` must have 3 axes (K, H, W), chosen by ``make_replay`` for
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
