"""``SessionRunner``: one session run in checkpoint-sized frame chunks, each chunk's end a checkpoint opportunity,
its progress yielded as typed events (``orchestrator.session.events``). Ray-free: ``SessionActor`` hosts it in a
worker, ``dev`` runs it in-process with checkpoints off, tests and benches use it directly.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterator

from orchestrator.report.rows import format_row
from orchestrator.report.tracking import SessionTracker
from orchestrator.runtime import pyarrow_probe as pyarrow_probe_mod
from orchestrator.session import events as ev
from orchestrator.spec.meta import MetaSpec
from orchestrator.store import predir as predir_mod
from orchestrator.store import storage
from orchestrator.store.checkpoint import DEFAULT_CHECKPOINT_INTERVAL_S, CheckpointError, CheckpointStore

COMMIT_BACKOFF_S = (0.5, 1.0, 2.0)  # waits between checkpoint write attempts, seconds
CHECKPOINT_TIME_SHARE = 0.005  # without checkpoint_frequency: the share of training time checkpoints may take
# (half the < 1% goal: the first checkpoint, after the interval alone, and the last one, forced, come on top)


def checkpoint_frequency(meta: MetaSpec) -> int:
    """Frames between checkpoint opportunities: ``meta.checkpoint_frequency`` or ``meta.log_frequency``."""
    return int(meta.checkpoint_frequency or meta.log_frequency)


def checkpoint_gap_s(meta: MetaSpec, cost_s: float = 0.0) -> float:
    """Least training seconds from the end of a checkpoint to the next one (taken at the first chunk end after it).

    With ``meta.checkpoint_frequency`` set: 0 (frames alone decide: a checkpoint at every boundary). Otherwise the
    larger of ``meta.checkpoint_interval_s`` (default ``checkpoint.DEFAULT_CHECKPOINT_INTERVAL_S``) and
    ``cost_s * (1 - CHECKPOINT_TIME_SHARE) / CHECKPOINT_TIME_SHARE``, so that a checkpoint costing as much as the
    previous one (``cost_s``: seconds the training thread spent on it) takes at most ``CHECKPOINT_TIME_SHARE`` of
    training time, however slow the machine or large the checkpoint.
    """
    if meta.checkpoint_frequency:
        return 0.0
    value = meta.checkpoint_interval_s
    interval = float(DEFAULT_CHECKPOINT_INTERVAL_S if value is None else value)
    return max(interval, cost_s * (1 - CHECKPOINT_TIME_SHARE) / CHECKPOINT_TIME_SHARE)


class SessionRunner:
    """Runs one session with checkpoints (or, for ``dev``, without); the Ray-free core of ``SessionActor``.

    Args:
        spec: checked flat spec (its ``max_frame`` may be raised relative to the checkpoint's).
        predir: run directory URI.
        trial, session: indices; seed: the session seed.
        resume: restore the newest valid checkpoint first.
        reseed: ``{"frame": F, "seed": S}``: a restore of the checkpoint at frame F restarts the acting RNG
            streams at S (``Session.reseed``; PBT after an exploit); of another frame, or None: the restored ones.
        exchange: with ``meta.distributed``, ``exchange(key, algorithm)`` builds the session's
            ``orchestrator.global_params.GlobalExchange`` over the trial's global actor: the session's optimizer
            steps become pushes to it, it starts from (and at each checkpoint loads) the global weights, and its
            manifests say ``exact: false`` with the exchange's ``exact_reason``; the manifest meta gains
            ``global_step`` and ``global_weights_sha256``.
        timer: seconds (monotonic) for the checkpoint time gate (``checkpoint_gap_s``); tests inject one.
        checkpoints: False (``dev``): no checkpoint is ever taken; the session trains in ``log_frequency`` chunks,
            its rows go to log.txt and the trackers as they come, and train_df/eval_df are written when it ends,
            stopped or not (``events``).
        prebuilt: the ``Session`` of (spec, seed, trial, session), already built (``dev`` builds it before the
            run directory exists, so a bad env/agent combination leaves nothing behind); None builds it here.

    Raises:
        orchestrator.store.checkpoint.CheckpointError: ``resume`` is set and no checkpoint exists.
    """

    def __init__(self, spec: dict[str, Any], predir: str, trial: int, session: int, seed: int,
                 resume: bool, exchange: Callable[[str, Any], Any] | None = None,
                 timer: Callable[[], float] = time.monotonic, reseed: dict[str, int] | None = None,
                 checkpoints: bool = True, prebuilt: Any = None) -> None:
        from orchestrator.session.loop import Session  # heavy torch: imported inside the worker

        pyarrow_probe_mod.skip_pandas_probe()  # Parquet without pandas (docs/BENCHMARKS.md "Process memory")
        self.spec, self.key = spec, f"t{trial}_s{session}"
        self.predir, self.trial, self.index = predir, trial, session
        self.reseed = reseed
        self.keep_live = False  # a ``done`` session keeps its envs open to continue (``extend``)
        self.session_dir = predir_mod.session_dir(predir, trial, session)
        self.store = CheckpointStore(self.session_dir, keep=MetaSpec.of(spec).keep_checkpoints)
        self.session = prebuilt if prebuilt is not None else Session(spec, seed, trial, session, fresh=not resume)
        self.resume, self.checkpoints = resume, checkpoints
        self.timer = timer
        self.restored_frame: int | None = None
        self.set_aside: list[dict[str, Any]] = []  # checkpoints ``restore`` set aside as corrupt
        self.best: tuple[float, int] | None = None  # (total_reward_ma, frame) of the best checkpoint
        self.tracker = SessionTracker(spec, predir, trial, session, self.log_line)  # TensorBoard, W&B, MLflow
        self.exchange: Any = None
        self.tracking = False  # the trackers' streams are open (``start_tracking``)
        self.burst_open = False  # True while the event just yielded has more of its checkpoint's events after it
        self.retry_lines: list[str] = []  # object-store retries not yet in log.txt / sent to the driver
        self.retries_sent = 0
        storage.set_retry_listener(self.retry_lines.append)
        if exchange is not None:
            self.exchange = exchange(self.key, self.session.algorithm)
            self.session.algorithm.grad_exchange = self.exchange
            self.session.exact, self.session.exact_reason = False, self.exchange.exact_reason

    def restore(self) -> None:
        """Load the newest valid checkpoint; one set aside as corrupt is logged and reported in ``started``.

        The driver verifies and sets aside before it starts the actor, so here ``set_aside`` is
        normally empty; it is not when a checkpoint was damaged in between.

        Raises:
            FileNotFoundError: no checkpoint was ever committed here.
            orchestrator.store.checkpoint.CheckpointError: none verifies (all set aside), or unreadable.
        """
        self.store.collect_garbage()
        selection = self.store.select_latest()
        self.set_aside = [r.to_json() for r in selection.rejected]
        if selection.rejected:
            self.log_line(f"warning: {selection.describe()}")
        if selection.manifest is None:
            if selection.rejected or selection.earlier_corrupt:
                raise CheckpointError(selection.describe())
            raise FileNotFoundError(f"no committed checkpoint in {self.session_dir}")
        self.session.from_checkpoint(selection.files)
        if self.reseed is not None and selection.manifest.frame == int(self.reseed["frame"]):
            self.session.reseed(int(self.reseed["seed"]))
            self.log_line(f"acting RNG streams reseeded with {self.reseed['seed']} at frame {self.reseed['frame']}")
        self.restored_frame = selection.manifest.frame
        self.best = best_of(self.store)
        self.export_restored(selection.files)

    def export_restored(self, files: dict[str, bytes]) -> None:
        """The user copies (train_df, eval_df) from the restored checkpoint's ``files`` where they differ: a process
        killed between a commit and its export left them older than the checkpoint, and a restore at ``max_frame``
        writes no checkpoint that would refresh them. A fault is logged, not raised (the checkpoint holds them)."""
        try:
            self.store.export(files, changed_only=True)
        except (CheckpointError, storage.StorageError, OSError) as err:
            self.log_line(f"after restoring checkpoint {self.restored_frame}: {err}")

    def extend(self, spec: dict[str, Any]) -> None:
        """Continue the live session (ended ``done``, envs open: ``keep_live``) to ``spec``'s larger ``env.max_frame``
        with no restore: ``events`` trains on from memory (replay included), ``restored_frame`` = the current frame.

        Raises:
            ValueError: the session did not end at its ``max_frame``, or ``spec`` changes more than that.
        """
        from orchestrator.session.loop import continue_spec_problem

        problem = continue_spec_problem(self.spec, spec, self.session.clock)
        if problem:
            raise ValueError(f"session {self.key} cannot continue live: {problem}")
        self.session.extend(spec)
        self.spec, self.resume, self.restored_frame, self.set_aside = spec, False, self.session.clock.frame, []
        self.tracker = SessionTracker(spec, self.predir, self.trial, self.index, self.log_line)

    def snapshot(self) -> tuple[int, dict[str, bytes], dict[str, Any]]:
        """Serialize the session now (frame, files, manifest meta); the training thread pays this.

        With a global actor, the global state is checkpointed first and its weights loaded, so this checkpoint
        holds the weights of global checkpoint ``meta["global_step"]``.
        """
        extra = {}
        if self.exchange is not None:
            try:
                step, sha = self.exchange.checkpoint()
                extra = {"global_step": step, "global_weights_sha256": sha}
            except Exception as err:  # noqa: BLE001  # a resume takes the weights of the newest global checkpoint
                self.log_line(f"global checkpoint at frame {self.session.clock.frame} failed: {err}")
                extra = {"global_step": None, "global_weights_sha256": None}
        files, meta = self.session.to_checkpoint()
        return self.session.clock.frame, files, {**meta, **extra}

    def write(self, frame: int, files: dict[str, bytes], meta: dict[str, Any]) -> bool:
        """Commit a serialized checkpoint, then prune old ones and refresh the user copy of train_df.

        Runs on the writer thread. A failed write (full disk, lost permission, store unavailable)
        is retried ``len(COMMIT_BACKOFF_S)`` times with back-off and logged; if it still fails,
        training goes on and the next checkpoint tries again (the store never shows a half
        checkpoint as newest).

        Returns:
            True once committed, False if every attempt failed.
        """
        self.tracker.upload()  # object stores: events up to this frame are stored before it commits
        for attempt, backoff in enumerate((*COMMIT_BACKOFF_S, None)):
            try:
                self.store.commit(frame, files, meta)
                break
            except (CheckpointError, storage.StorageError, OSError) as err:
                self.log_line(f"checkpoint at frame {frame} failed (attempt {attempt + 1}): {err}")
                if storage.fault_of(err) is not None:  # disk full, read-only, ...: stops the trial (checkpoint_batches)
                    raise
                if backoff is None:
                    return False
                time.sleep(backoff)
        ma = meta["total_reward_ma"]
        if ma is not None and (self.best is None or ma >= self.best[0]):
            self.best = (ma, frame)
        try:  # housekeeping: retention (the newest is always kept) and the user copy of train_df
            self.store.prune(best_frame=self.best[1] if self.best else None)
            self.store.export(files)  # the user copies (the checkpoint's are authoritative)
        except (CheckpointError, storage.StorageError, OSError) as err:
            self.log_line(f"after checkpoint {frame}: {err}")
        return True

    def log_line(self, text: str) -> None:
        """Append one line to the session's log.txt (best effort: the log may sit on the failing store)."""
        try:
            storage.append_text(storage.join(self.session_dir, "log.txt"), text + "\n")
        except (storage.StorageError, OSError):
            pass

    def append_log(self, rows: list[dict[str, Any]]) -> None:
        """Append train_df rows as text lines to the session's log.txt, after the object-store retries since the
        last call (``storage_retry`` lines).

        Raises:
            storage.StorageError: the write failed.
        """
        lines = [f"storage retry: {line}" for line in self.retry_lines[self.retries_sent:]]
        lines += [format_row(row) for row in rows]
        if lines:
            storage.append_text(storage.join(self.session_dir, "log.txt"), "\n".join(lines) + "\n")
            self.retries_sent = len(self.retry_lines)

    def take_retries(self) -> list[str]:
        """The object-store retry lines written to log.txt and not yet sent to the driver (each is sent once)."""
        lines = self.retry_lines[:self.retries_sent]
        del self.retry_lines[:self.retries_sent]
        self.retries_sent = 0
        return lines

    def fault_event(self, err: BaseException, hint: str) -> ev.StorageFault:
        """The ``storage_fault`` event of a persistent fault, after removing uncommitted checkpoint debris (best
        effort: the store is failing; ``collect_garbage`` runs again at the resume)."""
        try:
            self.store.collect_garbage()
        except (CheckpointError, storage.StorageError, OSError):
            pass
        self.log_line(f"storage fault: {err}")
        uri = getattr(err, "uri", "") or getattr(err.__cause__, "uri", "") or self.session_dir
        return ev.StorageFault(uri=uri, error=str(err), hint=hint, frame=getattr(self, "committed", None) or 0)

    def events(self) -> Iterator[ev.Event]:
        """Run to ``max_frame`` (or until ``stop_requested``), yielding progress events.

        Cadence, commits and the grouping of events: ``checkpoint_rounds`` (this session alone). A ``checkpoint``
        event is yielded once its write committed; log rows are yielded with the checkpoint that follows them
        (``burst_open`` is True while more of that checkpoint's events follow).

        With ``checkpoints`` off: ``unsaved_events``.
        """
        session = self.session
        if self.resume:
            self.restore()
        if self.exchange is not None:
            self.exchange.sync()
        self.start_tracking()
        if not self.checkpoints:
            yield from self.unsaved_events()
            return
        yield self.started_event()

        def train(until: int, rows: list[list[dict[str, Any]]]) -> None:
            session.run_rl(until_frame=until, on_log=lambda _s, row: rows[0].append(row))

        for _, event, more in checkpoint_rounds([self], train, lambda: [self.snapshot()], session.clock,
                                                lambda: session.stop_requested, self.timer):
            self.burst_open = more  # the rows follow the commit event (SessionActor.run batches)
            yield event
        self.burst_open = False
        yield self.end_event()

    def started_event(self) -> ev.Started:
        """The ``Started`` event of the session (restored or fresh; checkpoints set aside by ``restore``)."""
        return ev.Started(pid=os.getpid(), device=str(self.session.algorithm.device),
                          restored_frame=self.restored_frame, set_aside=self.set_aside, exact=self.session.exact,
                          tracking=self.tracker.record())

    def end_event(self) -> ev.Done:
        """After the run: the trackers closed, the envs closed (unless the session stays live: ``keep_live``), and
        the ``Done`` (at ``max_frame``) or ``Interrupted`` event."""
        session = self.session
        self.tracker.close(session, self.committed)
        last = session.train_rows[-1]["total_reward_ma"] if session.train_rows else None
        end = ev.Interrupted if session.stop_requested and not session.clock.done() else ev.Done
        if not (end is ev.Done and self.keep_live and self.committed == session.clock.frame):
            session.close()
            self.keep_live = False
        return end(frame=session.clock.frame, total_reward_ma=last, checkpoint=self.committed == session.clock.frame)

    def start_tracking(self) -> None:
        """Open the trackers' streams (TensorBoard, W&B, MLflow) once; ``events`` calls it unless a caller did.

        Raises:
            Exception: whatever the tracking backend raises (e.g. no W&B login); nothing is open then.
        """
        if not self.tracking:
            self.tracker.start(self.session, self.restored_frame)
            self.tracking = True

    def unsaved_events(self) -> Iterator[ev.Event]:
        """``events`` with checkpoints off: chunks of ``log_frequency`` frames, each chunk's rows written to log.txt
        and the trackers, then yielded as ``Log`` events; at the end, stopped or raised (``KeyboardInterrupt``),
        the rows so far in log.txt, train_df/eval_df in the session directory, the trackers and envs closed."""
        session = self.session
        yield ev.Started(pid=os.getpid(), device=str(session.algorithm.device), restored_frame=None,
                         set_aside=[], exact=session.exact, tracking=self.tracker.record())
        freq = MetaSpec.of(self.spec).log_frequency
        rows: list[dict[str, Any]] = []
        try:
            while not session.clock.done() and not session.stop_requested:
                session.run_rl(until_frame=(session.clock.frame // freq + 1) * freq,
                               on_log=lambda _s, row: rows.append(row))
                self.tracker.log(session, session.clock.frame)
                self.append_log(rows)
                chunk, rows = rows, []
                yield from (ev.Log(row) for row in chunk)
        finally:
            self.append_log(rows)
            self.store.export(session.table_files())
            self.tracker.close(session, session.clock.frame)
            session.close()
        last = session.train_rows[-1]["total_reward_ma"] if session.train_rows else None
        end = ev.Interrupted if session.stop_requested and not session.clock.done() else ev.Done
        yield end(frame=session.clock.frame, total_reward_ma=last, checkpoint=False)


def checkpoint_batches(runner: SessionRunner) -> Iterator[ev.Event]:
    """``runner.events()`` with the events of one checkpoint (its commit event and the chunk's log rows, which
    ``events`` yields back to back) grouped as one ``Batch``; a lone event as is.

    The driver pays per Ray object, so a checkpoint of N log rows costs it one object, not N + 1.
    A persistent storage fault (``storage.fault_of``) ends the stream with a ``storage_fault`` event instead of
    an error; transient object-store retries come as ``storage_retry`` events after the batch they happened in.
    """
    batch: list[ev.Event] = []
    try:
        for event in runner.events():
            batch.append(event)
            if not runner.burst_open:
                yield batch[0] if len(batch) == 1 else ev.Batch(batch)
                batch = []
                if runner.retries_sent:
                    yield ev.StorageRetry(runner.take_retries())
    except (storage.StorageError, CheckpointError, OSError) as err:
        hint = storage.fault_of(err)
        if hint is None:
            raise
        yield ev.Batch([*batch, runner.fault_event(err, hint)])


def checkpoint_rounds(runners: list[SessionRunner], train: Callable[[int, list[list[dict[str, Any]]]], None],
                      snapshots: Callable[[], list[tuple[int, dict[str, bytes], dict[str, Any]]]], clock: Any,
                      stopped: Callable[[], bool], timer: Callable[[], float]) -> Iterator[tuple[int, ev.Event, bool]]:
    """The checkpointed run of one session, or of a seed group whose sessions train together (``runners``, one per
    session, all at ``clock.frame``): ``SessionRunner.events``'s cadence, yielding one ``Burst`` per checkpoint.

    Cadence: training goes in chunks up to the next multiple of ``checkpoint_frequency`` frames (``train(until,
    rows)``, appending each runner's train_df rows to ``rows[i]``); at the end of a chunk a checkpoint of every
    runner (``snapshots()``: (frame, files, meta) per runner, taken on this thread) is taken once
    ``checkpoint_gap_s(meta, cost)`` seconds of ``timer`` passed since the previous one ended (``cost``: its
    ``timer`` seconds; for the first, ``checkpoint_interval_s`` since the start or the restore), and always at
    ``max_frame`` and on a stop (``stopped()``). Which frames get a checkpoint never changes the training: chunks
    end on the same boundaries either way.

    One background writer thread commits the runners' checkpoints of a frame one after the other
    (``SessionRunner.write``) while the next chunk trains; at most one frame's writes are in flight. A checkpoint's
    events are each runner's ``checkpoint``/``checkpoint_failed`` event of the previous frame's write (its
    ``seconds``: the time this thread spent on it, serializing plus waiting for the write, each wait counted once),
    yielded before the next write is submitted, then each runner's ``Log`` rows of the chunk, written to log.txt
    and the trackers (``SessionTracker.log``, not counted) first; the final write's events come last. Each
    runner's ``committed`` is kept up to date.

    Raises:
        storage.StorageError / CheckpointError / OSError: a persistent fault of a write (``SessionRunner.write``).
    """
    spec_meta = MetaSpec.of(runners[0].spec)
    freq, gap = checkpoint_frequency(spec_meta), checkpoint_gap_s(spec_meta)
    rows: list[list[dict[str, Any]]] = [[] for _ in runners]
    for runner in runners:
        runner.committed = runner.restored_frame
    last_end = timer()  # when the previous checkpoint's work on this thread ended
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-writer") as writer:
        pending: tuple[int, Future, float] | None = None
        while True:
            if not clock.done() and not stopped():
                train((clock.frame // freq + 1) * freq, rows)
            due = clock.done() or stopped() or timer() - last_end >= gap
            new = any(r.committed != clock.frame for r in runners) and clock.frame != (pending and pending[0])
            if due and new:
                start, timer_start = time.perf_counter(), timer()
                snaps = snapshots()
                snapshot_s = time.perf_counter() - start  # this one's wait for its write is added when it ends
                # before the next write starts (a kill now loses nothing); adds the wait to the previous one's seconds
                yield from _with_more(_finish_writes(runners, pending), any(rows))
                gap = checkpoint_gap_s(spec_meta, timer() - timer_start)
                for runner in runners:
                    runner.tracker.log(runner.session, runner.committed)  # before this frame's write is submitted
                pending = (snaps[0][0], writer.submit(_write_all, runners, snaps), snapshot_s)
                logs = []
                for runner, chunk in zip(runners, rows):
                    runner.append_log(chunk)
                    logs.append([ev.Log(row) for row in chunk])
                    chunk.clear()
                yield from _with_more(logs)
                last_end = timer()
            if clock.done() or stopped():
                break
        yield from _with_more(_finish_writes(runners, pending))


def _with_more(events: list[list[ev.Event]], more_after: bool = False) -> Iterator[tuple[int, ev.Event, bool]]:
    """Per-runner event lists as (runner index, event, more), runner by runner; ``more`` is False only for the last
    event, unless ``more_after``."""
    flat = [(i, event) for i, runner_events in enumerate(events) for event in runner_events]
    for n, (i, event) in enumerate(flat):
        yield i, event, n < len(flat) - 1 or more_after


def _write_all(runners: list[SessionRunner], snaps: list[tuple[int, dict[str, bytes], dict[str, Any]]]) -> list[bool]:
    """``SessionRunner.write`` of each runner's snapshot, in order (on the writer thread)."""
    return [runner.write(*snap) for runner, snap in zip(runners, snaps)]


def _finish_writes(runners: list[SessionRunner], pending: tuple[int, Future, float] | None) -> list[list[ev.Event]]:
    """Wait for the in-flight writes (if any): per runner its ``checkpoint``/``checkpoint_failed`` event (or none)."""
    if pending is None:
        return [[] for _ in runners]
    frame, future, blocked_s = pending
    start = time.perf_counter()
    oks = future.result()
    blocked_s += time.perf_counter() - start
    out: list[list[ev.Event]] = []
    for runner, ok in zip(runners, oks):
        if ok:
            runner.committed = frame
        out.append([ev.Checkpoint(frame=frame, seconds=blocked_s) if ok else ev.CheckpointFailed(frame=frame)])
    return out


def best_of(store: CheckpointStore) -> tuple[float, int] | None:
    """(total_reward_ma, frame) of the best committed checkpoint of ``store``, from the manifests (None: none)."""
    best = None
    for frame in store.frames():
        try:
            ma = store.manifest(frame).meta.get("total_reward_ma")
        except CheckpointError:
            continue
        if ma is not None and (best is None or ma >= best[0]):
            best = (ma, frame)
    return best
