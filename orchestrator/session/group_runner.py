"""``GroupRunner``: a seed group (``meta.session_batch``; ``orchestrator.session.batched.SessionGroup``) run as
``SessionRunner`` runs one session: the same checkpoint cadence and commits (``runner.checkpoint_rounds``), every
session's checkpoint at the same frames in its own directory, each session's events tagged with its session index.
Ray-free: ``SessionActor`` hosts it in one worker (``run(group=...)``), tests use it directly.

A resumed group restores the newest checkpoint frame common to its sessions (``batched.newest_common_frame``: a
group killed between its sessions' commits), so it continues exactly as the uninterrupted group. Sessions at
``max_frame`` whose group still trains (a group killed between the final commits of its sessions) ride along as
passengers: restored and trained with the group, so its batched arithmetic is the uninterrupted one, but they
write nothing and report nothing (their committed checkpoints already hold the state they reach again).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator, Sequence

from orchestrator.session import events as ev
from orchestrator.session.runner import SessionRunner, best_of, checkpoint_rounds
from orchestrator.spec.meta import MetaSpec
from orchestrator.store import predir as predir_mod
from orchestrator.store import storage
from orchestrator.store.checkpoint import CheckpointError, CheckpointStore


class GroupRunner:
    """Runs the sessions ``sessions`` (seeds ``seeds``) of trial ``trial`` as one seed group with checkpoints.

    Args:
        spec: checked flat spec (``meta.session_batch`` > 1 checked by ``spec.load.check``).
        predir: run directory URI.
        trial: trial index; sessions: the group's session indexes, ascending; seeds: their seeds.
        resume: restore the newest checkpoint frame common to the sessions first; when they have none in common
            (a group killed before every session's first commit), the group starts at frame 0 and says so in each
            session's log.txt.
        passengers: session indexes (of ``sessions``) that train with the group but write and report nothing
            (see module docstring).
        timer: as ``SessionRunner``'s.
        reseeds: session index -> ``{"frame": F, "seed": S}``: restored from its checkpoint at frame F, that
            session restarts its acting RNG streams at S (``SessionRunner``'s ``reseed``; PBT after an exploit),
            in session order (the global RNGs, which every session of the group shares, end at the last one's).

    Attributes:
        runners: one ``SessionRunner`` per reporting session (its store, tracker, log.txt, commits), in order.

    Raises:
        UsageError: the spec cannot run batched (``SessionGroup``).
        CheckpointError / storage.StorageError: the checkpoints cannot be read.
    """

    def __init__(self, spec: dict[str, Any], predir: str, trial: int, sessions: Sequence[int], seeds: Sequence[int],
                 resume: bool, passengers: Sequence[int] = (), timer: Callable[[], float] = time.monotonic,
                 reseeds: dict[int, dict[str, int]] | None = None) -> None:
        from orchestrator.session.batched import SessionGroup, newest_common_frame  # torch: inside the worker

        self.sessions, self.spec, self.keep_live = list(sessions), spec, False
        keep = MetaSpec.of(spec).keep_checkpoints
        stores = [CheckpointStore(predir_mod.session_dir(predir, trial, s), keep=keep) for s in self.sessions]
        frame = None
        if resume:
            for store in stores:
                store.collect_garbage()
            frame = newest_common_frame(stores)
        self.group = SessionGroup(spec, seeds, trial, self.sessions, fresh=frame is None)
        reporting = [k for k, s in enumerate(self.sessions) if s not in set(passengers)]
        self.reported = [self.sessions[k] for k in reporting]  # session index of each runner
        self.runners = [SessionRunner(spec, predir, trial, self.sessions[k], seeds[k], resume=False, timer=timer,
                                      prebuilt=self.group.sessions[k]) for k in reporting]
        storage.set_retry_listener(self.runners[0].retry_lines.append)  # the group's retries: its first session's
        self.timer = timer
        self.restore(frame, stores, reseeds or {}, resume)

    def restore(self, frame: int | None, stores: list[CheckpointStore], reseeds: dict[int, dict[str, int]],
                resume: bool) -> None:
        """Restore the group from its sessions' checkpoints at ``frame`` (None: none in common; with ``resume`` each
        session's log says the group starts at frame 0), apply the ``reseeds`` of that frame, and refresh each
        reporting session's user copies from its checkpoint (``SessionRunner.export_restored``)."""
        files = [store.load(frame)[1] for store in stores] if frame is not None else []
        if frame is not None:
            self.group.restore(files)
            for k, session in enumerate(self.sessions):
                reseed = reseeds.get(session)
                if reseed is not None and int(reseed["frame"]) == frame:
                    self.group.sessions[k].reseed(int(reseed["seed"]))
                    if session in self.reported:
                        self.runners[self.reported.index(session)].log_line(
                            f"acting RNG streams reseeded with {reseed['seed']} at frame {frame}")
        elif resume:
            for runner in self.runners:
                runner.log_line("no checkpoint frame common to the sessions of its group "
                                f"{self.sessions}: the group starts at frame 0")
        for runner in self.runners:
            runner.restored_frame = frame
            runner.best = best_of(runner.store)
            if frame is not None:
                runner.export_restored(files[self.sessions.index(runner.index)])

    def stop(self) -> None:
        """Ask every session of the group to stop after the current step and commit a final checkpoint."""
        for session in self.group.sessions:
            session.stop_requested = True

    def stopped(self) -> bool:
        """Whether a stop was asked (of any session: the group stops as one)."""
        return any(s.stop_requested for s in self.group.sessions)

    def events(self) -> Iterator[tuple[int, ev.Event, bool]]:
        """Run the group to ``max_frame`` (or a stop), yielding (session index, event, more) for the reporting
        sessions: each one's ``Started``, then ``runner.checkpoint_rounds``'s events (``more``: more events of the
        same checkpoint follow), then each one's ``Done``/``Interrupted``.

        Raises:
            storage.StorageError / CheckpointError / OSError: a persistent fault of a write.
        """
        group, runners = self.group, self.runners
        for runner in runners:
            runner.start_tracking()
        yield from _with_more(self.reported, [runner.started_event() for runner in runners])
        index = {id(session): n for n, session in enumerate(runner.session for runner in runners)}

        def train(until: int, rows: list[list[dict[str, Any]]]) -> None:
            def on_log(session: Any, row: dict[str, Any]) -> None:
                if id(session) in index:  # a passenger's rows are in its committed checkpoint already
                    rows[index[id(session)]].append(row)

            group.run_rl(until_frame=until, on_log=on_log)

        def snapshots() -> list[tuple[int, dict[str, bytes], dict[str, Any]]]:
            reporting = {id(runner.session) for runner in runners}
            return [(group.clock.frame, files, meta) for session, (files, meta)
                    in zip(group.sessions, group.checkpoint()) if id(session) in reporting]

        for n, event, more in checkpoint_rounds(runners, train, snapshots, group.clock, self.stopped, self.timer):
            yield self.reported[n], event, more
        if self.stopped():
            self.stop()  # every session ends interrupted, as the group stopped
        ends = [runner.end_event() for runner in runners]  # closes the session's envs
        reporting = {id(runner.session) for runner in runners}
        for session in group.sessions:
            if id(session) not in reporting:
                session.close()
        yield from _with_more(self.reported, ends)


def _with_more(sessions: list[int], events: list[ev.Event]) -> Iterator[tuple[int, ev.Event, bool]]:
    """(session, event, more) of one event per session; ``more`` False for the last."""
    for n, (session, event) in enumerate(zip(sessions, events)):
        yield session, event, n < len(events) - 1


def group_batches(runner: GroupRunner) -> Iterator[ev.Grouped]:
    """``runner.events()`` as ``Grouped`` events, one per checkpoint (its sessions' commit events and log rows), the
    ``Started`` events and the ends; the group's object-store retries as its first session's ``StorageRetry``. A
    persistent storage fault (``storage.fault_of``) ends the stream with each session's ``storage_fault`` event
    (``runner.checkpoint_batches`` does the same for one session)."""
    batch: list[tuple[int, ev.Event]] = []
    lead = runner.runners[0]
    try:
        for session, event, more in runner.events():
            batch.append((session, event))
            if not more:
                yield ev.Grouped(batch)
                batch = []
                if lead.retries_sent:
                    yield ev.Grouped([(runner.reported[0], ev.StorageRetry(lead.take_retries()))])
    except (storage.StorageError, CheckpointError, OSError) as err:
        hint = storage.fault_of(err)
        if hint is None:
            raise
        yield ev.Grouped([*batch, *((s, r.fault_event(err, hint)) for s, r in zip(runner.reported, runner.runners))])
