"""The RL loop of one session (one seed): env <-> agent <-> clock, with log and eval checkpoints.

No Ray here: a session runs in-process (tests, ``dev``) exactly as inside a session actor, which
drives it in frame chunks with ``run_rl(until_frame=...)``.

Log rows (``train_df``) are taken every ``meta.log_frequency`` frames and at ``max_frame``;
columns are ``TRAIN_COLUMNS`` (docs/ARCHITECTURE.md section 1) followed by the algorithm's ``metric_names``
(its own values from the latest update, NaN before the first; see each algorithm's docstring).
``total_reward`` is the mean undiscounted
return of the episodes that ended since the previous row (the last known return if none ended);
``total_reward_ma`` is the mean return of the last ``meta.ma_window`` episodes. With
``meta.rigorous_eval = k > 0``, every ``meta.eval_frequency`` frames k deterministic evaluation
episodes run on a separate env and give one ``eval_df`` row.

Seeds: the session seed seeds the algorithm's generators and the global RNGs; the sub-envs of the
training env are reset with ``sub_env_seeds(seed, N, TRAIN_STREAM, resume_count)`` and those of the
eval env with ``sub_env_seeds(seed, k, EVAL_STREAM, frame)``, so no two sessions of a trial share
an env stream (``envs.make.sub_env_seeds``).

Checkpoints load onto the CPU (``map_location="cpu"``): RNG states, memory, observations and
counters stay host-side; ``Algorithm.load_state_dict`` copies net and optimizer tensors into the
algorithm's device (docs/ARCHITECTURE.md section 4, item 5).

Kept whole: the RL loop and its log, eval and checkpoint points are one control flow.
"""

from __future__ import annotations

import io
import math
import os
import pickle
import random
from collections import deque
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from agents.algorithms import ALGORITHMS, Algorithm, LossStats
from agents.nets import seq_len_of
from envs import state as env_state
from envs.clock import Clock
from envs.make import (
    EVAL_STREAM,
    TRAIN_STREAM,
    episode_returns,
    eval_spec,
    final_obs,
    make_env,
    resolve_vec,
    sub_env_seeds,
)
from orchestrator.errors import UsageError
from orchestrator.runtime.allocator import retain_freed_memory
from orchestrator.session import transfer
from orchestrator.spec.load import build, spec_hash
from orchestrator.spec.schema import RunSpec
from orchestrator.store import safe_pickle

if TYPE_CHECKING:
    import pandas  # only for annotations: a session imports pandas on first train_df / eval_df

TRAIN_COLUMNS = ("frame", "epi", "t", "opt_step", "wall_t", "fps", "total_reward", "total_reward_ma", "loss",
                 "lr", "explore_var", "entropy_coef", "entropy", "grad_norm", "refill")
EVAL_COLUMNS = ("frame", "epi", "opt_step", "wall_t", "total_reward", "total_reward_std", "total_reward_ma")

LogCallback = Callable[["Session", dict[str, Any]], None]

# Why a checkpoint's resume cannot equal the uninterrupted run (its manifest's ``exact_reason``; docs/resume.md)
REPLAY_NOT_STORED = ("agent.memory.checkpoint is false: the replay is not stored, a resume refills it before "
                     "training")
REPLAY_NOT_RESTORED = "resumed from a checkpoint without the replay (refilled)"
ENV_NOT_RESTORED = "resumed from a checkpoint without env state (the env was reset)"
ENV_STATE_MISFIT = "resumed with the env reset: the checkpoint's env state does not fit this env"
LEGACY_ENV_FILE = "env.pkl"  # the pickled env of checkpoints written before env state became data (envs.state)
RNG_REDERIVED = "resumed from a torch RNG state of another device kind (re-derived from its hash)"


def seed_globals(seed: int) -> None:
    """Seed python ``random``, numpy's and torch's global RNGs (for library code that uses them), and flush
    CPU denormals to zero (``torch.set_flush_denormal``: x86 FTZ/DAZ, as XLA does on CPU). Adam's moment
    updates meet denormal floats (|x| < 1.2e-38) in small-gradient nets, and each elementwise op on them
    costs about 40x (measured: 1,164 vs 28 us for a 256x256 lerp); flushing changes only values below
    1.2e-38, and the same way in every session of a run, so resumes stay exact."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    torch.set_flush_denormal(True)


def session_cuda_index(trial: int, session: int, max_session: int, device_count: int, offset: int = 0) -> int:
    """The CUDA device index of session ``session`` of trial ``trial``: ``(trial * max_session + session + offset)
    % device_count``, SLM-Lab's GPU assignment (``util.set_cuda_id``, ``offset`` its ``CUDA_OFFSET``), so the
    sessions of a trial, and the trials of a search, spread over the GPUs a process sees.

    Raises:
        ValueError: ``device_count`` < 1.
    """
    if device_count < 1:
        raise ValueError(f"device_count must be >= 1, got {device_count}")
    return (trial * max_session + session + offset) % device_count


def select_session_gpu(gpu: bool | str, trial: int, session: int, max_session: int) -> int | None:
    """Make this session's CUDA device current (``torch.cuda.set_device``), so that its nets, optimizers and
    generators (on ``torch.device("cuda")``, see ``agents.algorithms.base.pick_device``) land on it.

    Only where ``agent.net.gpu`` asks for CUDA (true or ``"auto"``) and CUDA is visible; the index is
    ``session_cuda_index`` over the visible devices, with ``CUDA_OFFSET`` from the environment (default 0). Under
    Ray a session given GPUs (``meta.resources.num_gpus`` > 0) sees only its own (Ray sets
    ``CUDA_VISIBLE_DEVICES``), so the index is 0 for a one-GPU share; a session given none sees every GPU of its
    node, and the sessions spread over them as SLM-Lab's do.

    Returns:
        The device index made current, or None (nets on the CPU; CUDA is not initialized).

    Raises:
        UsageError: ``CUDA_OFFSET`` is not a non-negative integer.
    """
    if gpu not in (True, "auto") or not torch.cuda.is_available():
        return None
    raw = os.environ.get("CUDA_OFFSET", "0").strip() or "0"
    if not (raw.isascii() and raw.isdigit()):
        raise UsageError(f"CUDA_OFFSET must be a non-negative integer (SLM-Lab's GPU offset), got {raw!r}")
    index = session_cuda_index(trial, session, max_session, torch.cuda.device_count(), int(raw))
    torch.cuda.set_device(index)
    return index


class Session:
    """One agent trained on one env with one seed.

    Args:
        spec: a checked flat spec (``orchestrator.spec.check`` / ``load_spec`` output).
        seed: the session seed (see ``orchestrator.spec.session_seed``).
        trial: trial index t; session: session index s (names, and the CUDA device: ``select_session_gpu``).
        fresh: the session starts at frame 0 (it is not restored from a checkpoint next), so
            ``agent.net.init_from`` applies; pass False before ``from_checkpoint`` (resume, enjoy).

    Raises:
        ValueError: an env/agent combination the algorithm does not support.
        SpecError: ``agent.net.init_from`` cannot be loaded or does not fit the nets (fresh only).
        UsageError: ``CUDA_OFFSET`` is set to something other than a non-negative integer (CUDA sessions only).
    """

    def __init__(self, spec: dict[str, Any], seed: int, trial: int = 0, session: int = 0,
                 fresh: bool = True) -> None:
        self.spec: RunSpec = build(spec)
        self.seed, self.trial, self.session = int(seed), trial, session
        seed_globals(self.seed)
        retain_freed_memory()  # process-wide, as seed_globals' FTZ: freed step buffers reused, not page-faulted
        env_spec, meta = self.spec.env, self.spec.meta
        self.cuda_index = select_session_gpu(self.spec.agent.net.gpu, trial, session, meta.max_session)
        num_cpus = float(meta.resources.get("num_cpus", 1))
        self.env = make_env(resolve_vec(env_spec, num_cpus), self.seed, gamma=self.spec.agent.algorithm.gamma,
                            seq_len=seq_len_of(self.spec.agent.net), num_cpus=num_cpus)
        self.clock = Clock(env_spec.max_frame, env_spec.num_envs)
        algo_cls = ALGORITHMS[self.spec.agent.algorithm.name]
        self.algorithm: Algorithm = algo_cls(self.spec.agent, self.env.single_observation_space,
                                             self.env.single_action_space, env_spec.num_envs, self.seed)
        if fresh and self.spec.agent.net.init_from:
            transfer.init_nets(self.algorithm, self.spec.agent.net.init_from)
        self.obs: np.ndarray = self.reset_env(resume_count=0)
        self.returns: deque[float] = deque(maxlen=meta.ma_window)
        self.recent_returns: list[float] = []
        self.loss_stats = LossStats()
        self.train_rows: list[dict[str, Any]] = []
        self.eval_rows: list[dict[str, Any]] = []
        self.refilling = False
        self.stop_requested = False  # set from a signal handler: run_rl returns after this step
        self.exact = True  # false once a restore could not bring back the whole state (or meta.distributed)
        self.exact_reason: str | None = None  # why not ("; "-joined causes), see not_exact
        self._eval_env: Any = None
        self._last_log = (0, 0.0)  # (frame, wall_t) of the previous log row
        self._train_parquet = ParquetRows(self.train_columns)  # checkpoints encode only the rows added since the last
        self._eval_parquet = ParquetRows(EVAL_COLUMNS)

    # ---------------------------------------------------------------- the loop
    def run_rl(self, until_frame: int | None = None, on_log: LogCallback | None = None) -> None:
        """Train until ``clock.max_frame`` (or ``until_frame``, whichever is first).

        One vector step per iteration: act, env.step, store, tick the clock, maybe update, maybe log.
        """
        clock, algo, env, meta = self.clock, self.algorithm, self.env, self.spec.meta
        stop = clock.max_frame if until_frame is None else min(until_frame, clock.max_frame)
        obs = self.obs
        clock.start_timer()
        while clock.frame < stop and not self.stop_requested:
            act = algo.act(obs, clock)
            next_obs, reward, terminated, truncated, info = env.step(algo.env_action(act))
            done = terminated | truncated
            algo.memory.add(obs, act, reward, final_obs(next_obs, done, info), terminated, truncated)
            prev_frame = clock.frame
            clock.tick(done)
            if done.any():
                self.record_returns(episode_returns(info))
            if self.refilling:
                self.refilling = len(algo.memory) < self.refill_size
            if algo.train_ready(clock):
                self.loss_stats = algo.update(clock)
            if clock.crossed(prev_frame, meta.log_frequency) or clock.done():
                self.log(on_log)
            if meta.rigorous_eval and clock.crossed(prev_frame, meta.eval_frequency):
                self.run_eval()
            obs = next_obs
        self.obs = obs

    def record_returns(self, returns: np.ndarray) -> None:
        """Add finished episodes' returns to the moving-average window."""
        values = returns.tolist()
        self.returns.extend(values)
        self.recent_returns.extend(values)

    # ---------------------------------------------------------------- log rows
    def log(self, on_log: LogCallback | None = None) -> dict[str, Any]:
        """Append a train_df row for the current frame (once per frame) and call ``on_log``."""
        if self.train_rows and self.train_rows[-1]["frame"] == self.clock.frame:
            return self.train_rows[-1]
        row = self.make_row()
        self.train_rows.append(row)
        self._last_log = (row["frame"], row["wall_t"])
        if on_log is not None:
            on_log(self, row)
        return row

    def make_row(self) -> dict[str, Any]:
        """The train_df row of the current state (see module docstring for column meanings)."""
        self.loss_stats = self.loss_stats.resolved()  # tensors of the latest update read once, here
        clock, algo, stats = self.clock, self.algorithm, self.loss_stats
        wall_t = clock.wall_t
        d_frame, d_t = clock.frame - self._last_log[0], wall_t - self._last_log[1]
        if self.recent_returns:
            total_reward = float(np.mean(self.recent_returns))
            self.recent_returns = []
        else:
            total_reward = self.returns[-1] if self.returns else math.nan
        return {
            "frame": clock.frame, "epi": clock.epi, "t": clock.t, "opt_step": clock.opt_step,
            "wall_t": wall_t, "fps": d_frame / d_t if d_t > 0 else math.nan,
            "total_reward": total_reward,
            "total_reward_ma": float(np.mean(self.returns)) if self.returns else math.nan,
            "loss": stats.loss, "lr": algo.current_lr(), "explore_var": algo.explore_var(clock.frame),
            "entropy_coef": algo.entropy_coef(clock.frame), "entropy": stats.entropy,
            "grad_norm": stats.grad_norm, "refill": self.refilling,
            **{k: float(stats.metrics.get(k, math.nan)) for k in algo.metric_names},
        }

    @property
    def train_columns(self) -> tuple[str, ...]:
        """``TRAIN_COLUMNS`` followed by the algorithm's ``metric_names``."""
        return TRAIN_COLUMNS + tuple(self.algorithm.metric_names)

    @property
    def train_df(self) -> "pandas.DataFrame":
        """One row per log checkpoint, columns ``train_columns`` (imports pandas on first use)."""
        import pandas as pd
        return pd.DataFrame(self.train_rows, columns=list(self.train_columns))

    @property
    def eval_df(self) -> "pandas.DataFrame":
        """One row per eval checkpoint, columns ``EVAL_COLUMNS`` (imports pandas on first use)."""
        import pandas as pd
        return pd.DataFrame(self.eval_rows, columns=list(EVAL_COLUMNS))

    # ---------------------------------------------------------------- evaluation
    def eval_env(self) -> Any:
        """The evaluation env (``rigorous_eval`` sync sub-envs, no reward scaling, whole games), built once."""
        if self._eval_env is None:
            self._eval_env = make_env(eval_spec(self.spec.env, self.spec.meta.rigorous_eval), None,
                                      seq_len=seq_len_of(self.spec.agent.net))
        if self.spec.env.normalize_state or self.spec.env.normalize_obs:  # the training statistics, frozen
            self._eval_env.obs_rms = self.env.obs_rms
            self._eval_env.update_running_mean = False
        return self._eval_env

    def run_eval(self) -> dict[str, Any]:
        """Run one deterministic episode per eval sub-env; append and return an eval_df row.

        The eval env is reset with seeds derived from (session seed, frame) by ``sub_env_seeds``, so
        evaluation neither uses nor disturbs the training RNG streams. ``total_reward_ma`` is the
        mean ``total_reward`` of this row and the ``meta.ma_window - 1`` eval rows before it.

        Returns:
            The eval_df row: ``EVAL_COLUMNS`` (returns in undiscounted reward units, frames, episodes).
        """
        env = self.eval_env()
        obs, _ = env.reset(seed=sub_env_seeds(self.seed, env.num_envs, EVAL_STREAM, self.clock.frame))
        n = env.num_envs
        finished = np.zeros(n, bool)
        returns = np.zeros(n)
        while not finished.all():
            act = self.algorithm.act(obs, self.clock, deterministic=True)
            obs, _, terminated, truncated, info = env.step(self.algorithm.env_action(act))
            done = (terminated | truncated) & ~finished
            if done.any():
                returns[done] = np.asarray(info["episode"]["r"])[done]
                finished |= done
        window = self.spec.meta.ma_window
        prev = [r["total_reward"] for r in self.eval_rows[-(window - 1):]] if window > 1 else []  # [-0:] is all
        row = {"frame": self.clock.frame, "epi": self.clock.epi, "opt_step": self.clock.opt_step,
               "wall_t": self.clock.wall_t, "total_reward": float(returns.mean()),
               "total_reward_std": float(returns.std()), "total_reward_ma": float(np.mean(prev + [returns.mean()]))}
        self.eval_rows.append(row)
        return row

    # ---------------------------------------------------------------- checkpoint state
    @property
    def memory_in_checkpoint(self) -> bool:
        """On-policy memories (small) are always checkpointed; a replay buffer (``has_replay``) only on request."""
        return not getattr(self.algorithm.memory, "has_replay", False) or self.spec.agent.memory.checkpoint

    @property
    def refill_size(self) -> int:
        """Transitions a restored off-policy session collects before training resumes (``Algorithm.refill_size``)."""
        return self.algorithm.refill_size()

    def not_exact(self, reason: str) -> None:
        """Record that this session can no longer equal its uninterrupted run, and why (causes accumulate)."""
        self.exact = False
        causes = self.exact_reason.split("; ") if self.exact_reason else []
        self.exact_reason = "; ".join(causes + [reason] * (reason not in causes))

    def state_dict(self) -> dict[str, Any]:
        """Everything but the env and the dataframes, as tensors/numbers (``weights_only`` loadable)."""
        np_state = np.random.get_state()
        return {
            "algorithm": _to_torch(self.algorithm.state_dict(with_memory=self.memory_in_checkpoint)),
            "clock": self.clock.state_dict(),
            "obs": torch.from_numpy(np.asarray(self.obs)),
            "returns": list(self.returns), "recent_returns": list(self.recent_returns),
            "loss_stats": vars(self.loss_stats.resolved()).copy(), "last_log": list(self._last_log),
            "refilling": self.refilling,
            "global_rng": {"python": _python_rng_state(), "torch": torch.get_rng_state(),
                           "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]]},
        }

    def table_files(self) -> dict[str, bytes]:
        """``train_df.parquet`` and, once it has rows, ``eval_df.parquet``: the session's tables as Parquet bytes."""
        files = {"train_df.parquet": self._train_parquet.encode(self.train_rows)}
        if self.eval_rows:
            files["eval_df.parquet"] = self._eval_parquet.encode(self.eval_rows)
        return files

    def to_checkpoint(self) -> tuple[dict[str, bytes], dict[str, Any]]:
        """Serialize the session: files (name -> bytes) and manifest metadata.

        Files: ``state.pt`` (``state_dict``, torch format), ``env_state.json`` + ``env_state.bin`` (the vector
        env's state as data, ``envs.state``, when it can be captured), ``train_df.parquet`` and, once it has rows,
        ``eval_df.parquet``. Metadata: clock, ``weights_sha256`` per net, ``exact`` and ``exact_reason`` (None, or
        why a resume from this checkpoint cannot equal the uninterrupted run, causes joined by "; ": the env state
        cannot be captured (async, EnvPool, Box2D), the replay is not
        stored, and any cause recorded by ``not_exact``: an earlier inexact restore, ``meta.distributed``),
        ``total_reward_ma`` of the last log row, and whether the replay buffer is included (``memory``).
        """
        buf = io.BytesIO()
        torch.save(self.state_dict(), buf)
        files = {"state.pt": buf.getvalue(), **self.table_files()}
        causes = [] if self.exact else (self.exact_reason or "not exact").split("; ")
        try:
            files.update(env_state.to_files(self.env))
        except env_state.EnvStateError as err:  # async, EnvPool, Box2D
            causes.insert(0, f"env state not saved: {err}")
        if not self.memory_in_checkpoint:  # the replay's transitions are dropped (REPLAY_NOT_STORED covers
            causes = [c for c in causes if c != REPLAY_NOT_RESTORED] + [REPLAY_NOT_STORED]  # an earlier refill)
        last = self.train_rows[-1]["total_reward_ma"] if self.train_rows else math.nan
        meta = {"clock": self.clock.state_dict(), "spec_hash": spec_hash(self.spec.raw),
                "weights_sha256": self.weights_sha256(), "exact": not causes,
                "exact_reason": "; ".join(causes) or None,
                "total_reward_ma": None if math.isnan(last) else last, "memory": self.memory_in_checkpoint}
        return files, meta

    def from_checkpoint(self, files: dict[str, bytes]) -> None:
        """Restore a session serialized by ``to_checkpoint``; counts one more ``resume_count``.

        The spec given to the constructor may raise ``max_frame``; everything else continues from
        the checkpoint. ``state.pt`` is always loaded onto the CPU; only nets and optimizer states move
        to the algorithm's device (a GPU checkpoint resumes on a CPU-only host and vice versa). The env state
        is written into the env built for this spec (``restore_env``); without one that fits, the env is reset
        with seeds derived from (session seed, resume_count), the memory's unfinished episodes are cut
        (``memory.cut_episodes``: a PPO rollout's last step per sub-env becomes truncated, REINFORCE's partial
        episodes are dropped) so no return spans two episodes, and ``exact`` becomes false; it is also false
        when the torch RNG state was saved on another device kind (see ``Algorithm.load_state_dict``). A replay
        buffer left out of the checkpoint is refilled: rows logged until it holds ``training_start_step``
        transitions have ``refill``, and ``exact`` becomes false. Each cause is recorded by ``not_exact``.

        Args:
            files: file name -> bytes, as ``to_checkpoint`` returned them (env state optional; an older
                checkpoint's ``env.pkl`` instead).

        Raises:
            KeyError / RuntimeError: the state does not fit this spec (names the part).
        """
        state = load_state(files["state.pt"])
        if not self.algorithm.load_state_dict(state["algorithm"]):
            self.not_exact(RNG_REDERIVED)
        self.clock.load_state_dict(state["clock"])
        self.clock.resume_count += 1
        self.returns.clear()
        self.returns.extend(state["returns"])
        self.recent_returns = list(state["recent_returns"])
        self.loss_stats = LossStats(**state["loss_stats"])
        self._last_log = tuple(state["last_log"])
        rng = state["global_rng"]
        _set_python_rng_state(rng["python"])
        torch.set_rng_state(rng["torch"])
        mt = rng["numpy"][1]
        np.random.set_state((rng["numpy"][0], np.asarray(mt.numpy() if isinstance(mt, torch.Tensor) else mt, np.uint32),
                             *rng["numpy"][2:]))
        self.train_rows = _read_parquet(files["train_df.parquet"])
        self.eval_rows = _read_parquet(files["eval_df.parquet"]) if "eval_df.parquet" in files else []
        replay_lost = getattr(self.algorithm.memory, "has_replay", False) and not _has_replay(state["algorithm"])
        self.refilling = replay_lost or bool(state["refilling"])
        if replay_lost:
            self.not_exact(REPLAY_NOT_RESTORED)
        problem = self.restore_env(files)
        if problem is None:
            set_reward_gamma(self.env, self.spec.agent.algorithm.gamma)  # the spec's, if it changed since
            self.obs = state["obs"].numpy()
        else:
            self.not_exact(problem)
            self.algorithm.memory.cut_episodes()
            self.clock.t = 0
            self.obs = self.reset_env(self.clock.resume_count)

    def restore_env(self, files: dict[str, bytes]) -> str | None:
        """Write a checkpoint's env state into the freshly built training env: ``env_state.json`` +
        ``env_state.bin`` (``envs.state``), or the ``env.pkl`` of an older checkpoint read through the restricted
        unpickler (``orchestrator.store.safe_pickle``: nothing of it is constructed or called). The checkpoint store
        has already refused a pickle naming anything outside the allowlist (``CheckpointStore.load``).

        Returns:
            None when restored; otherwise why not (``ENV_NOT_RESTORED``, or a state that does not fit this env,
            named), and the env is untouched.
        """
        try:
            if all(name in files for name in env_state.STATE_FILES):
                tree, arrays = env_state.read_files(files)
            elif LEGACY_ENV_FILE in files:
                tree, arrays = env_state.legacy_tree(safe_pickle.restricted_loads(files[LEGACY_ENV_FILE]))
            else:
                return ENV_NOT_RESTORED
            env_state.restore(self.env, tree, arrays)
        except (env_state.EnvStateError, pickle.UnpicklingError) as err:
            return f"{ENV_STATE_MISFIT}: {err}"
        return None

    def extend(self, spec: dict[str, Any]) -> None:
        """Raise the frame budget to ``spec``'s ``env.max_frame`` and run on with the state in memory (the same as a
        restore of the checkpoint at the current frame with that spec, without one: population-based training's
        kept trials, ``SessionRunner.extend``). ``continue_spec_problem`` says whether ``spec`` allows it."""
        self.spec = build(spec)
        self.clock.max_frame = int(spec["env"]["max_frame"])

    def reseed(self, seed: int) -> None:
        """Restart the acting RNG streams at ``seed``: the algorithm's generators (``Algorithm.reseed``) and the
        global RNGs (``seed_globals``); nets, optimizers, memory, clock and env state untouched. Population-based
        training applies it to a trial that continues from a donor's checkpoint, so the two do not act alike."""
        self.algorithm.reseed(seed)
        seed_globals(seed)

    def reset_env(self, resume_count: int) -> np.ndarray:
        """Reset the training env with ``sub_env_seeds(seed, N, TRAIN_STREAM, resume_count)``.

        Returns:
            The first observations (N, *O).
        """
        seeds = sub_env_seeds(self.seed, self.spec.env.num_envs, TRAIN_STREAM, resume_count)
        return self.env.reset(seed=seeds)[0]

    def weights_sha256(self) -> dict[str, str]:
        """Per net and declared tensor: sha256 over its raw bytes (``Algorithm.weights_sha256``)."""
        return self.algorithm.weights_sha256()

    def close(self) -> None:
        """Close the envs."""
        self.env.close()
        if self._eval_env is not None:
            self._eval_env.close()


def _has_replay(algorithm_state: dict[str, Any]) -> bool:
    """Whether a saved algorithm state holds its replay: a ``memory`` entry (``Algorithm.state_dict(with_memory)``),
    and for ``SILReplay``, whose on-policy part is always saved, its ``replay`` entry."""
    memory = algorithm_state.get("memory")
    return memory is not None and ("onpolicy" not in memory or "replay" in memory)


def set_reward_gamma(env: Any, gamma: float) -> int:
    """Set the discount of every ``NormalizeReward`` wrapper of a (restored) vector env to ``gamma``: the env's
    running return statistics keep their state, and go on discounting with the algorithm's ``gamma`` of the spec
    now run (``make_env`` builds them with it; a restored env state holds the one it was saved with).

    Returns:
        How many wrappers were set.
    """
    import gymnasium as gym

    count, layer = 0, env
    while layer is not None:
        if isinstance(layer, gym.wrappers.vector.NormalizeReward):
            layer.gamma = float(gamma)
            if isinstance(getattr(layer, "_saved_kwargs", None), dict):
                layer._saved_kwargs["gamma"] = float(gamma)
            count += 1
        layer = getattr(layer, "env", None) if isinstance(layer, gym.vector.VectorWrapper) else None
    return count


def continue_spec_problem(old: dict[str, Any], new: dict[str, Any], clock: Clock) -> str | None:
    """Why a live session that ran with spec ``old`` cannot continue with spec ``new`` (``Session.extend``): it did
    not end at its ``max_frame``, the new ``env.max_frame`` is not larger, or anything else changed.

    Returns:
        The reason, or None when it can continue.
    """
    if not clock.done():
        return f"it stopped at frame {clock.frame}, before its max_frame {clock.max_frame}"
    if int(new["env"]["max_frame"]) <= clock.frame:
        return f"env.max_frame {new['env']['max_frame']} is not beyond frame {clock.frame}"
    strip = ({**spec, "env": {**spec["env"], "max_frame": None}} for spec in (old, new))
    if spec_hash(next(strip)) != spec_hash(next(strip)):
        return "its spec changed beyond env.max_frame (it must continue from a checkpoint instead)"
    return None


def _to_torch(tree: Any) -> Any:
    """numpy arrays -> tensors and every tensor to CPU, recursively (device-free checkpoints that
    ``torch.load(weights_only=True)`` accepts)."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().cpu()
    if isinstance(tree, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(tree))
    if isinstance(tree, dict):
        return {k: _to_torch(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_to_torch(v) for v in tree)
    if isinstance(tree, np.generic):
        return tree.item()
    return tree


def load_state(data: bytes) -> dict[str, Any]:
    """``state.pt`` bytes -> the state tree, every tensor on the CPU (``weights_only=True``).

    Never onto the algorithm's device: ``torch.Generator.set_state`` takes only a CPU ByteTensor
    and memory/observation tensors are read back with ``.numpy()``.

    Raises:
        pickle.UnpicklingError / RuntimeError: the bytes are not a ``weights_only`` torch file.
    """
    return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")


def _python_rng_state() -> list[Any]:
    """``random.getstate()`` as ``[version, int64 tensor of the 625 state words, gauss_next]``: one tensor, not 625
    pickled ints (``torch.save`` pays per object)."""
    version, internal, gauss = random.getstate()
    return [version, torch.tensor(internal, dtype=torch.int64), gauss]


def _set_python_rng_state(state: Any) -> None:
    """Restore ``random``'s state saved by ``_python_rng_state`` (or, from older checkpoints, ``random.getstate()``)."""
    version, internal, gauss = state
    if isinstance(internal, torch.Tensor):
        internal = tuple(internal.tolist())
    random.setstate((version, tuple(internal), gauss))


class ParquetRows:
    """Parquet bytes of an append-only list of log rows (dicts), pyarrow only, converting only the rows added since
    the previous ``encode`` of the same list (train_df grows by a few rows per checkpoint).

    The bytes equal a one-shot ``pa.Table.from_pylist(rows).select(columns)`` written with ``pq.write_table``: new
    rows whose inferred types differ from the table's (an int column meeting a float, a null column meeting a value)
    make the whole table be converted again. Rows already encoded must not be changed in place.

    Args:
        columns: the column order of the file.
    """

    def __init__(self, columns: tuple[str, ...] | list[str]) -> None:
        self.columns = list(columns)
        self._rows: list[dict[str, Any]] | None = None  # the list encoded last (identity), its first n rows
        self._table: pa.Table | None = None
        self._bytes = b""

    def encode(self, rows: list[dict[str, Any]]) -> bytes:
        """Parquet bytes of ``rows`` (columns ``self.columns``; an empty list gives typeless (null) columns).

        Raises:
            KeyError: a row lacks one of ``columns``.
        """
        same = self._table is not None and rows is self._rows and self._table.num_rows <= len(rows)
        done = self._table.num_rows if same else 0
        if done and done == len(rows):
            return self._bytes
        if not rows:
            table = pa.table({c: pa.nulls(0) for c in self.columns})
        elif done:  # types inferred from the new rows alone (a schema given to from_pylist would truncate 2.5 to 2)
            part = _row_table(rows[done:], self.columns)
            table = pa.concat_tables([self._table, part]).combine_chunks() if part.schema == self._table.schema \
                else _row_table(rows, self.columns)  # one chunk: write_table pays per chunk (4x at 100 chunks)
        else:
            table = _row_table(rows, self.columns)
        out = pa.BufferOutputStream()
        pq.write_table(table, out)
        self._rows, self._table, self._bytes = rows, table, out.getvalue().to_pybytes()
        return self._bytes


def _row_table(rows: list[dict[str, Any]], columns: list[str]) -> pa.Table:
    """Rows -> a pyarrow table with exactly ``columns``, types inferred from every row.

    Raises:
        KeyError: a row lacks one of ``columns``.
    """
    table = pa.Table.from_pylist(rows)
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise KeyError(f"log rows lack columns {missing}")
    return table.select(columns)


def _read_parquet(data: bytes) -> list[dict[str, Any]]:
    """Log rows (one dict per row, python values) from Parquet bytes written by ``ParquetRows`` (or by pandas, as
    older checkpoints' empty tables were)."""
    return pq.read_table(pa.BufferReader(data)).to_pylist()
