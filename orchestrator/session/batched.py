"""K sessions of one spec (K seeds) trained in lockstep as one batched program, each still its own session.

``SessionGroup`` builds the K ``Session``s as a trial builds them (seed, trial, session index; each with its own
training env of N sub-envs, clock, returns, train_df, eval env and checkpoint), then runs their algorithms as one
``agents.batched`` seed batch: per vector step one batched forward for the K x N observations, each session's env
stepped with its N actions, the K x N transitions stored (on-policy: one rollout of K x N columns; replay-based:
each seed's N in its own replay), and one batched update when the algorithm's cadence says so (the seeds fill their
rollouts or replays at the same steps, so they train at the same steps). Every session logs, evaluates and
checkpoints as it does alone (``Session.log``, ``run_eval``, ``to_checkpoint``); ``checkpoint`` first gives each
member algorithm its seed's optimizer slice, counters and rollout columns (a replay is the member's own), so a
session's checkpoint is a separate session's (its replay included when ``agent.memory.checkpoint`` is true), and
``restore`` takes the group back from the K checkpoints, so a resumed group continues exactly as the uninterrupted
one (the envs, generators and global RNG states come back as ``Session.from_checkpoint`` restores them).

A batched seed's numbers differ from the same seed run alone only through float rounding of the batched kernels
(``agents.batched``); its manifest says it ran batched (``batched``: K, ``batch_sessions``).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from agents.batched import SeedBatch, batch_problem, batched_algorithm
from envs.make import episode_returns, final_obs
from orchestrator.errors import UsageError
from orchestrator.runtime.allocator import TRIM_THRESHOLD_BYTES, retain_freed_memory
from orchestrator.session.loop import LogCallback, Session
from orchestrator.store.checkpoint import CheckpointError, CheckpointStore


class SessionGroup:
    """K sessions (``seeds[k]``, session index ``sessions[k]``) of one spec in lockstep; see module docstring.

    Args:
        spec: a checked flat spec, the same for every seed.
        seeds: the K session seeds.
        trial: trial index t.
        sessions: session index of each seed (default 0 .. K-1).
        fresh: as ``Session``'s (False before ``restore``).

    Raises:
        UsageError: a spec that cannot run batched (``agents.batched.batch_problem``, naming the key).
        ValueError: seeds and session indexes of different lengths.
    """

    def __init__(self, spec: dict[str, Any], seeds: Sequence[int], trial: int = 0,
                 sessions: Sequence[int] | None = None, fresh: bool = True) -> None:
        sessions = list(range(len(seeds))) if sessions is None else list(sessions)
        if len(sessions) != len(seeds) or not seeds:
            raise ValueError(f"a session group needs one session index per seed, got {sessions} for {list(seeds)}")
        self.sessions = [Session(spec, seed, trial, s, fresh) for seed, s in zip(seeds, sessions)]
        # a batched step holds K seeds' step buffers at once (Atari PPO: K x 60 MB): each seed keeps a session's
        # allowance of freed heap (at most 1 GiB in all), else every step of K >= 3 seeds page-faults them afresh
        retain_freed_memory(trim_threshold=min(TRIM_THRESHOLD_BYTES * len(seeds), 2**30))
        first = self.sessions[0]
        problem = batch_problem(first.spec.agent)
        if problem is not None:
            self.close()
            raise UsageError(problem)
        algo = first.algorithm
        self.n = first.spec.env.num_envs
        self.batch: SeedBatch = batched_algorithm(first.spec.agent.algorithm.name)(
            first.spec.agent, algo.obs_space, algo.action_space, self.n, [s.seed for s in self.sessions],
            members=[s.algorithm for s in self.sessions])

    @property
    def clock(self) -> Any:
        """The clock the batched update runs on (session 0's; every session's frame and t are equal)."""
        return self.sessions[0].clock

    def run_rl(self, until_frame: int | None = None, on_log: LogCallback | None = None) -> None:
        """Train every session until ``clock.max_frame`` (or ``until_frame``), as ``Session.run_rl`` does one:
        one vector step of all K per iteration, then each session's log and eval points."""
        sessions, batch, n, meta = self.sessions, self.batch, self.n, self.sessions[0].spec.meta
        clock = self.clock
        stop = clock.max_frame if until_frame is None else min(until_frame, clock.max_frame)
        obs = np.concatenate([s.obs for s in sessions])
        for s in sessions:
            s.clock.start_timer()
        while clock.frame < stop and not any(s.stop_requested for s in sessions):
            act = batch.act(obs, clock)
            prev_frame = clock.frame
            next_obs = self.step(obs, act)
            self.learn()
            for k, s in enumerate(sessions):
                if s.clock.crossed(prev_frame, meta.log_frequency) or s.clock.done():
                    s.obs = next_obs[k * n:(k + 1) * n]
                    s.log(on_log)
                if meta.rigorous_eval and s.clock.crossed(prev_frame, meta.eval_frequency):
                    s.run_eval()
            obs = next_obs
        for k, s in enumerate(sessions):
            s.obs = obs[k * n:(k + 1) * n]

    def learn(self) -> None:
        """After a vector step, as ``Session.run_rl``: each session's refill state (a session restored without its
        replay collects ``refill_size`` transitions first), then the batched update when the algorithm's cadence
        is due, each session taking its seed's ``LossStats`` and the update's ``opt_step``."""
        clock = self.clock
        for s in self.sessions:
            if s.refilling:
                s.refilling = len(s.algorithm.memory) < s.refill_size
        if self.batch.train_ready(clock):
            for s, stats in zip(self.sessions, self.batch.update(clock)):
                s.loss_stats = stats
                s.clock.opt_step = clock.opt_step

    def step(self, obs: np.ndarray, act: np.ndarray) -> np.ndarray:
        """One vector step of every session: seed k's env takes its N of the actions (K*N,), the transitions of
        all K x N sub-envs go to the group's rollout, each session's clock and returns advance; returns the next
        observations (K*N, *O)."""
        sessions, n = self.sessions, self.n
        env_act = self.batch.env_action(act)
        steps = [s.env.step(env_act[k * n:(k + 1) * n]) for k, s in enumerate(sessions)]
        next_obs = np.concatenate([step[0] for step in steps])
        reward, terminated, truncated = (np.concatenate([step[i] for step in steps]) for i in (1, 2, 3))
        dones = [step[2] | step[3] for step in steps]
        ended = any(done.any() for done in dones)
        finals = np.concatenate([final_obs(step[0], done, step[4]) for step, done in zip(steps, dones)]) \
            if ended else next_obs  # the same array: the rollout then stores this obs once
        self.batch.memory.add(obs, act, reward, finals, terminated, truncated)
        for s, step, done in zip(sessions, steps, dones):
            s.clock.tick(done)
            if done.any():
                s.record_returns(episode_returns(step[4]))
        return next_obs

    def checkpoint(self) -> list[tuple[dict[str, bytes], dict[str, Any]]]:
        """Each session's ``to_checkpoint`` (files, manifest metadata), in session order, with its seed's
        optimizer slice and rollout columns (``SeedBatch.sync_members``); the metadata says the session ran
        batched: ``batched`` (K) and ``batch_sessions`` (the group's session indexes)."""
        self.batch.sync_members()
        out = []
        for s in self.sessions:
            files, meta = s.to_checkpoint()
            meta["batched"] = len(self.sessions)
            meta["batch_sessions"] = [x.session for x in self.sessions]
            out.append((files, meta))
        return out

    def restore(self, checkpoints: Sequence[dict[str, bytes]]) -> None:
        """Restore every session from its files (``checkpoint`` output, in session order) and the group from the
        restored members (``SeedBatch.pull_members``).

        Raises:
            ValueError: checkpoints of different frames (a group resumes from a frame common to its seeds), or as
                many checkpoints as sessions not given.
            KeyError / RuntimeError: a checkpoint that does not fit (names the part).
        """
        if len(checkpoints) != len(self.sessions):
            raise ValueError(f"{len(checkpoints)} checkpoints for a group of {len(self.sessions)} sessions")
        for s, files in zip(self.sessions, checkpoints):
            s.from_checkpoint(files)
        frames = {s.clock.frame for s in self.sessions}
        if len(frames) != 1:
            raise ValueError(f"a session group resumes from one frame common to its seeds, got frames {sorted(frames)}")
        self.batch.pull_members()  # each session recorded an inexact restore (RNG_REDERIVED) on its own

    def weights_sha256(self) -> list[dict[str, str]]:
        """Each session's ``weights_sha256``, in session order."""
        return [s.weights_sha256() for s in self.sessions]

    def close(self) -> None:
        """Close every session's envs."""
        for s in self.sessions:
            s.close()


def newest_common_frame(stores: Sequence[CheckpointStore]) -> int | None:
    """The newest frame at which every store (one per session of a group) holds a committed checkpoint that
    verifies, None when there is none: where a group killed between its sessions' commits resumes.

    Raises:
        storage.StorageError: a store cannot be listed.
    """
    common = set.intersection(*(set(store.frames()) for store in stores))
    for frame in sorted(common, reverse=True):
        try:
            for store in stores:
                store.load(frame)
        except CheckpointError:
            continue
        return frame
    return None
