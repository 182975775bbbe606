"""Trials on Ray: ``train`` starts one ``SessionActor`` per session (per seed group with ``meta.session_batch``);
``train@{predir|latest}`` resumes.

The driver plans the sessions, starts their actors in parallel, watches their event streams with
``ray.wait`` (timeout in seconds), keeps ``run.json`` up to date, restarts an actor that died (its
process or node was lost) from the session's newest checkpoint up to ``meta.max_restarts`` times,
moves the sessions of a node Ray drains (a preemption notice) or whose actor got SIGTERM: they commit a checkpoint
at once and restart elsewhere from it (``cause: preempted`` in run.json; not counted against ``max_restarts``),
marks a session whose code raised as ``failed`` (siblings continue), and at the end aggregates
``info/trial_df.parquet`` (mean and std of returns across sessions per frame).

Integrity (docs/RELIABILITY.md): the committed checkpoints are the truth. Before it runs anything,
``train@`` holds the run's lease (``orchestrator.store.lease``: a second driver exits 2) and verifies every
session's newest checkpoint in the driver: corrupt ones are set aside with one warning per session,
``run.json`` records the frame really restored, sessions at ``max_frame`` get their train_df/eval_df
copies re-exported from their checkpoint, and a damaged ``run.json`` is rebuilt.

A persistent storage fault (disk full, permission denied, a read-only file system, rejected credentials, an object
store failing after every retry: ``orchestrator.store.faults``), met by a session (its ``storage_fault`` event) or
by the driver writing ``run.json``, stops the trial as SIGTERM does: every session stops at its committed
checkpoint (uncommitted ones removed), ``run.json`` records ``interrupted`` with the cause when it can be written,
one ``error:`` line names the path, the error and what to do, and the exit code is ``EXIT_RESUMABLE``.

While ``run`` runs, a stop request of the driver (SIGINT, SIGTERM, SIGUSR1: ``orchestrator.runtime.signals``) asks
every session to commit a final checkpoint within ``meta.shutdown_grace_s`` seconds; the trial then prints the
command that resumes the run and returns ``EXIT_RESUMABLE``, also when a session's final commit outlasted the grace
(it resumes from its last committed checkpoint). A stop during the final analysis lets the analysis finish (exit 0).

Kept whole: ``Trial`` is one state machine (its actors, their event streams, restarts, the run record and the
signals); split, every handler would pass that state around.

Seed groups (``meta.session_batch`` K > 1): the sessions of a trial are packed into groups of K consecutive session
indexes (``seed_groups``), each hosted by one actor with one session's resources (``SessionActor.run(group=...)``);
a group of one session is a plain session. The group's stream carries each session's events tagged with its index
(``Grouped``), handled as that session's own; a group actor that dies or is stopped ends (and restarts) all its
sessions together, each counting the restart. A group is never kept live (``keep_live``): the next Trial restores it
from its checkpoints, with its sessions' ``reseeds``.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable

import ray
from ray.exceptions import OutOfMemoryError, RayActorError, RayTaskError

from orchestrator.errors import EXIT_RESUMABLE
from orchestrator.global_params import GlobalParamsActor, distributed
from orchestrator.report.progress import SessionProgress
from orchestrator.runtime import ray_drain
from orchestrator.runtime.signals import STOP, pause_point
from orchestrator.session import events as ev
from orchestrator.session_hosts import SessionHosts, empty_session_actor, host_key
from orchestrator.spec.meta import MetaSpec
from orchestrator.store import predir as predir_mod
from orchestrator.store import storage
from orchestrator.store.checkpoint import CheckpointError, CheckpointStore
from orchestrator.store.lease import Lease
from orchestrator.store.predir import session_seed
from orchestrator.store.record import RunRecord, SessionPlan, now_iso
from orchestrator.verify import check_session

# No torch in the driver of a ``train`` or ``train@``: both check their spec (``train@`` also its merge into
# the saved spec) in orchestrator.modes.spec_check's child process; the cli imports orchestrator.spec for dev, search
# and enjoy only.


ANALYSIS_MODULES = ("pandas", "matplotlib.backends.backend_agg", "matplotlib.figure", "plotly.io",
                    "orchestrator.report.analysis", "orchestrator.report.stats", "orchestrator.report.compare")


def preload_analysis() -> threading.Thread:
    """Import the modules of the end-of-trial analysis (``ANALYSIS_MODULES``) in a daemon thread while the
    sessions train (``Trial`` starts it at the first log row, after the actors' start-up, when the driver only
    waits on its actors), so the analysis after the last session does not wait ~0.4-0.5 s for pandas,
    matplotlib and plotly (2 cores, docs/BENCHMARKS.md "Start-up and exit"). They are the modules the analysis
    imports anyway: the driver's peak memory is unchanged. An import that fails is left for the analysis to
    report.

    Returns:
        The started thread (nothing needs to join it).
    """
    import importlib

    def load() -> None:
        for name in ANALYSIS_MODULES:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - the analysis imports it again and reports the error
                return

    thread = threading.Thread(target=load, name="preload-analysis", daemon=True)
    thread.start()
    return thread


def seed_groups(plans: list[SessionPlan], meta: MetaSpec) -> dict[str, tuple[list[SessionPlan], list[int]]]:
    """The seed groups of ``plans`` (``meta.session_batch`` K > 1): per group its planned sessions and its
    passengers, under the key of its first planned session. A group is the sessions ``[b K, (b + 1) K)`` of a trial
    (below ``max_session``) that are planned; the block's other sessions (at ``max_frame`` already: not planned)
    are its passengers (``GroupRunner``), needed when the group still trains. Blocks with one planned session and
    no passenger, and every session when K is 1, are plain sessions (not in the result).
    """
    k = meta.session_batch
    if k == 1:
        return {}
    blocks: dict[tuple[int, int], list[SessionPlan]] = {}
    for plan in plans:
        blocks.setdefault((plan.trial, plan.session // k), []).append(plan)
    groups = {}
    for (_, b), members in blocks.items():
        planned = {p.session for p in members}
        passengers = [s for s in range(b * k, min((b + 1) * k, meta.max_session)) if s not in planned]
        if len(members) > 1 or passengers:
            groups[members[0].key] = (members, passengers)
    return groups


GRACE_PASSED = "no final checkpoint within shutdown_grace_s"  # the error of a session stopped by the grace's end
ENDED_IN_STOP = "its actor ended during the stop"  # the error of a session whose process the stop's signal ended


class Trial:
    """Runs the planned sessions of one trial as Ray actors and watches them.

    Args:
        spec: the checked spec to run (for a resume: saved spec + applied edits).
        predir: run directory URI.
        plans: sessions to run.
        record: the run's ``run.json``.
        quiet: no live progress display.
        on_log: called with (plan, train_df row) at each session log checkpoint (search mode reports
            trial metrics to Ray Tune from it); the Trial installs no signal handlers itself (``run`` is the
            target of the process's stop requests, ``orchestrator.runtime.signals.STOP``).
        analyze: at the end, aggregate trial_df, analyze the whole predir and print the summary
            (False inside a search trial: the search analyzes each trial when it ends).
        lease: the run's lease held by this driver; once another driver took it (``lease.lost``)
            the sessions are asked to stop at their next checkpoint.
        hosts: warm session actors to start sessions in, and to keep the actors of sessions that end
            ``done`` in (``SessionHosts``); None: one new actor per session, ended with it.
        specs: trial -> the spec its sessions run (population-based training: each trial its own values);
            other trials run ``spec``.
        resume_mode: the mode the printed resume command names after a stop (``train`` or ``search``).
        max_running: at most this many sessions hold an actor at once (``session_hosts.capacity``); the others
            wait, in plan order, and start as sessions end, in the actors those leave in ``hosts``. None: every
            session's actor is requested at once and Ray places them as resources allow (with ``hosts``, only
            when the plans fit the resources at once: a kept actor holds its resources).
        keep_live: with ``hosts``, a session that ends ``done`` stays live in its actor (``hosts.put_live``), so
            the next Trial of the same predir can continue it in memory (population-based training).
        continue_live: session keys whose first start continues the session live in ``hosts`` at the plan's
            frame (``SessionActor.run(extend=...)``) when an actor holds it there; otherwise they restore from
            their checkpoint as usual.
        reseeds: session key -> ``{"frame": F, "seed": S}``: a session restored from its checkpoint at frame F
            restarts its acting RNG streams at S (``SessionRunner``'s ``reseed``; PBT after an exploit).
    """

    WATCH_BATCH_S = 0.1  # seconds the watch loop gathers events before acting on them
    DRAIN_POLL_S = 2.0  # seconds between the watch loop's asks for draining nodes (one GCS RPC each)

    def __init__(self, spec: dict[str, Any], predir: str, plans: list[SessionPlan], record: RunRecord,
                 quiet: bool = False,
                 on_log: Callable[[SessionPlan, dict[str, Any]], None] | None = None,
                 analyze: bool = True, lease: Lease | None = None, hosts: SessionHosts | None = None,
                 specs: dict[int, dict[str, Any]] | None = None, resume_mode: str = "train",
                 max_running: int | None = None, keep_live: bool = False, continue_live: set[str] = frozenset(),
                 reseeds: dict[str, dict[str, int]] | None = None) -> None:
        self.spec, self.predir, self.plans, self.record, self.quiet = spec, predir, plans, record, quiet
        self.keep_live, self.continue_live, self.reseeds = keep_live, set(continue_live), reseeds or {}
        self.specs, self.resume_mode = specs or {}, resume_mode
        self.lease, self.hosts = lease, hosts
        self.on_log, self.analyze = on_log, analyze
        self.meta = MetaSpec.of(spec)
        self.by_key = {p.key: p for p in plans}
        self.groups = seed_groups(plans, self.meta)  # group key -> (planned sessions, passengers)
        self.unit_of = {p.key: key for key, (members, _) in self.groups.items() for p in members}
        self.actors: dict[str, Any] = {}  # session key -> its actor (a group's sessions share theirs)
        self.streams: dict[str, Any] = {}  # session key (a group's: the group key, ``unit``) -> its event stream
        self.pending_restart: dict[str, float] = {}  # key -> monotonic time to restart at
        self.max_running = max_running
        self.queued: list[SessionPlan] = []  # sessions waiting for a slot (max_running), in plan order
        self.stopping_since: float | None = None
        # set by the stop handler (on_stop_signal): the watch loop calls request_stop at its next turn, since
        # a handler runs between any two bytecodes and must not change the streams under the loop
        self.stop_requested = False
        self.finishing = False  # the sessions ended: the final analysis runs
        self.preload: threading.Thread | None = None  # the analysis' imports, from the first log row on
        self.progress = SessionProgress(disable=True)  # the live display, once run() starts
        self.globals: dict[int, Any] = {}  # trial index -> GlobalParamsActor (meta.distributed)
        self.node_of: dict[str, str] = {}  # key -> node id (hex) the session's current actor runs on
        self.preempting: dict[str, dict[str, Any]] = {}  # key -> {node_id, deadline} of sessions asked to leave
        self.drain_polled = 0.0  # monotonic time of the last draining-node poll
        self.fault: dict[str, Any] | None = None  # the first persistent storage fault: {uri, error, hint}
        record.data.pop("interrupted", None)  # a resumed run is no longer interrupted

    def start_globals(self) -> None:
        """With ``meta.distributed``, start one ``GlobalParamsActor`` per trial of the plans (no CPU reserved: it
        only steps optimizers); it restores the trial's newest global checkpoint when there is one."""
        if not distributed(self.spec):
            return
        for t in sorted({p.trial for p in self.plans} - set(self.globals)):
            self.globals[t] = GlobalParamsActor.options(num_cpus=0).remote(
                self.spec, self.predir, t, session_seed(self.meta.random_seed, t, 0), True)

    def stop_globals(self) -> None:
        """End the global actors (their state is in the global checkpoints the sessions triggered)."""
        for actor in self.globals.values():
            ray.kill(actor)
        self.globals.clear()

    # ---------------------------------------------------------------- actors
    def unit(self, key: str) -> str:
        """The key a session's stream and actor are under: its group's key (``seed_groups``), else its own."""
        return self.unit_of.get(key, key)

    def members(self, key: str) -> list[SessionPlan]:
        """The sessions whose actor is the one of ``key``'s unit (its group's, or its own), held now."""
        unit = self.unit(key)
        return [self.by_key[k] for k in self.actors if self.unit(k) == unit]

    def start(self, plan: SessionPlan) -> None:
        """Start (or restart) the actor of a session (of its seed group: ``start_group``) and its event stream: in a
        warm actor of ``hosts`` when one is idle, else in a new one."""
        if self.unit(plan.key) in self.groups:
            self.start_group(plan)
            return
        moved = bool(plan.restarts) and plan.restarts[-1].get("cause") == "preempted"
        spec = self.specs.get(plan.trial, self.spec)
        live = plan.key in self.continue_live and not plan.restarts and self.hosts is not None
        self.continue_live.discard(plan.key)
        actor = self.hosts.take_live(self.host_key(), plan.key, plan.frame) if live else None
        if actor is not None:  # the session continues in memory from the frame it ended at
            stream = actor.run.remote(None, extend={"spec": spec}, keep_live=self.keep_live)
        else:
            # a warm host may sit on the draining node; a new actor is placed by Ray, which skips draining nodes
            actor = self.hosts.take(self.host_key(), self.continue_live) \
                if self.hosts is not None and not moved else None
            if actor is None:
                actor = self.new_actor(plan)
            num_cpus = self.host_key()[0]
            session = {"spec": spec, "predir": self.predir, "trial": plan.trial, "session": plan.session,
                       "seed": plan.seed, "resume": plan.resume, "global_params": self.globals.get(plan.trial),
                       "num_threads": max(1, int(num_cpus))}
            if plan.key in self.reseeds:
                session["reseed"] = self.reseeds[plan.key]
            stream = actor.run.remote(session, keep_live=True) if self.keep_live else actor.run.remote(session)
        self.actors[plan.key], self.streams[plan.key] = actor, stream
        plan.status = "running"
        self.record.update(plan)

    def start_group(self, plan: SessionPlan) -> None:
        """Start (or restart) the actor of ``plan``'s seed group with its sessions not yet ended (its restarts: all
        of them, as they end together), the block's other sessions as passengers (``seed_groups``)."""
        key = self.unit(plan.key)
        members, passengers = self.groups[key]
        run = [p for p in members if p.status in ("pending", "restarting")]
        for p in run:
            self.pending_restart.pop(p.key, None)
        moved = any(p.restarts and p.restarts[-1].get("cause") == "preempted" for p in run)
        actor = self.hosts.take(self.host_key(), self.continue_live) if self.hosts is not None and not moved else None
        if actor is None:
            actor = self.new_actor(plan)
        seeds = {p.session: p.seed for p in run}
        sessions = sorted([*seeds, *passengers])
        group = {"spec": self.specs.get(plan.trial, self.spec), "predir": self.predir, "trial": plan.trial,
                 "sessions": sessions, "passengers": passengers, "num_threads": max(1, int(self.host_key()[0])),
                 "seeds": [seeds.get(s, session_seed(self.meta.random_seed, plan.trial, s)) for s in sessions],
                 "resume": bool(passengers) or any(p.resume for p in run),
                 "reseeds": {s: self.reseeds[f"t{plan.trial}_s{s}"] for s in sessions
                             if f"t{plan.trial}_s{s}" in self.reseeds}}
        self.streams[key] = actor.run.remote(group=group)
        for p in run:
            self.actors[p.key] = actor
            p.status = "running"
            self.record.update(p)

    def host_key(self) -> tuple[float, float]:
        """What a session actor is created with besides its session (``host_key``)."""
        return host_key(self.meta)

    def new_actor(self, plan: SessionPlan) -> Any:
        """An empty ``SessionActor`` with the spec's per-session resources, for ``plan`` (``start`` hands it the
        session; ``bench/driver_scale.py`` overrides this and ``end_actor`` to drive the same loop with simulated
        sessions)."""
        return empty_session_actor(self.host_key())

    def end_actor(self, actor: Any) -> None:
        """End a session's actor (its process) once its stream is dropped."""
        ray.kill(actor)

    def request_stop(self) -> None:
        """Ask every running session to commit a final checkpoint and stop; a session whose actor
        has not started yet (still waiting for resources) is not started at all: ``not started``; a
        session waiting out its restart back-off is not restarted: ``interrupted`` at its committed
        checkpoint (the one the restart would have restored). Called from the watch loop only (a signal
        handler sets ``stop_requested``)."""
        if self.stopping_since is None:
            self.stopping_since = time.monotonic()
            by_key = {p.key: p for p in self.plans}
            for plan in self.queued:
                plan.status = "not started"
                self.progress.status(plan.key, "not started")
                self.record.update(plan)
            self.queued = []
            for key in list(self.pending_restart):
                del self.pending_restart[key]
                by_key[key].status = "interrupted"
                self.progress.status(key, "interrupted")
                self.record.update(by_key[key])
            for key in list(self.streams):
                if "pid" in self.record.data["sessions"].get(key, {}) or by_key[key].restarts:
                    self.actors[key].stop.remote()
                    continue
                members = self.members(key)
                self.release(by_key[key])
                for plan in members:
                    plan.status = "not started"
                    self.progress.status(plan.key, "not started")
                    self.record.update(plan)

    # ---------------------------------------------------------------- watching
    def run(self) -> int:
        """Run all planned sessions to completion (or interruption); returns the exit code. While it runs, the
        process's stop requests come to ``on_stop_signal``."""
        with STOP.target(self.on_stop_signal):
            return self.run_sessions()

    def on_stop_signal(self, signum: int) -> str:
        """A stop request (``orchestrator.runtime.signals``): the watch loop stops the sessions at its next turn.

        Returns:
            The line the handler prints.
        """
        self.stop_requested = True
        if self.finishing:
            return "the sessions have ended; finishing the analysis (Ctrl-C twice leaves at once)"
        return (f"committing final checkpoints (up to {self.meta.shutdown_grace_s} s; Ctrl-C twice leaves at "
                "once)")

    def run_sessions(self) -> int:
        """``run`` without the stop target."""
        by_key = {p.key: p for p in self.plans}
        with SessionProgress(disable=self.quiet) as progress:
            self.progress = progress
            self.start_globals()
            self.record.hold = True  # one run.json write for all the starts
            try:
                for plan in self.plans:
                    if self.unit(plan.key) != plan.key:
                        continue  # started with its group
                    if self.max_running is not None and len(self.streams) >= self.max_running:
                        self.queued.append(plan)
                    else:
                        self.start(plan)
            finally:
                self.record.hold = False
            self.record.flush_due()
            try:
                self.watch_all(by_key)
            except BaseException:  # e.g. Tune stopping a search trial (SystemExit from tune.report)
                self.end_all()
                raise
        self.finishing = True
        self.stop_globals()
        self.record.save()
        return self.finish()

    def watch_all(self, by_key: dict[str, SessionPlan]) -> None:
        """Watch the sessions until every stream ended and no restart is pending (or the stop's grace passed)."""
        while self.streams or self.pending_restart or self.queued:
            if self.fault is None and self.record.fault is not None:  # run.json could not be written
                self.on_fault(self.record.fault.uri, str(self.record.fault), self.record.fault.hint or "")
            if self.stopping_since is None and (self.stop_requested or (self.lease is not None and self.lease.lost)):
                self.request_stop()
            self.restart_due(by_key)
            self.start_queued()
            self.leave_draining_nodes()
            if self.stopping_since is not None and \
                    time.monotonic() - self.stopping_since > self.meta.shutdown_grace_s:
                break
            if not self.streams:
                time.sleep(0.2)
                continue
            self.watch(by_key)

    def release(self, plan: SessionPlan, ended: bool = False) -> None:
        """Drop a finished session's (its seed group's) stream and actor handle, so Ray ends the actor and frees its
        resources for sessions still waiting; with ``hosts``, the actor of a session (every session of its group)
        whose stream ``ended`` after ``done`` is kept there instead (``SessionHosts``)."""
        members = self.members(plan.key)
        self.streams.pop(self.unit(plan.key), None)
        actor = None
        for member in members:
            self.node_of.pop(member.key, None)
            actor = self.actors.pop(member.key)
        if actor is None:
            return
        if ended and self.hosts is not None and all(p.status == "done" and not p.error for p in members) \
                and self.stopping_since is None:
            if self.keep_live and len(members) == 1 and self.unit(plan.key) not in self.groups:  # groups restore
                self.hosts.put_live(self.host_key(), plan.key, plan.frame, actor)
            else:
                self.hosts.put(self.host_key(), actor)
        else:
            self.end_actor(actor)

    def start_queued(self) -> None:
        """Start waiting sessions (``max_running``) while slots are free and no stop was asked; sessions waiting
        out a restart back-off keep their slots."""
        while self.queued and self.stopping_since is None and \
                len(self.streams) + len(self.pending_restart) < (self.max_running or 0):
            self.start(self.queued.pop(0))

    def end_all(self) -> None:
        """End every session actor still held (the trial is abandoned: e.g. Tune stopped it)."""
        self.streams.clear()
        for actor in {id(a): a for a in self.actors.values()}.values():
            self.end_actor(actor)
        self.actors.clear()

    def watch(self, by_key: dict[str, SessionPlan]) -> None:
        """Wait up to ``WATCH_BATCH_S`` for events (less once every stream has one), act on every event
        ready in every stream, and write run.json once.

        One ``ray.wait`` over all streams per batch, not per event (it costs microseconds per stream:
        with hundreds of sessions a wait per event was most of the driver's CPU); the ready events of
        one stream are fetched with one ``ray.get``; the batch's status changes are written together
        (``RunRecord.hold``). An event waits at most ``WATCH_BATCH_S`` (plus the batch's handling) for
        the driver.
        """
        keys = {id(s): k for k, s in self.streams.items()}
        refs = list(self.streams.values())
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=self.WATCH_BATCH_S)
        self.record.hold = True
        try:
            for stream in ready:
                key = keys[id(stream)]
                if self.streams.get(key) is stream:  # not released while this batch was handled
                    self.next_events(by_key[key], stream)
        finally:
            self.record.hold = False
        self.record.flush_due()

    def next_events(self, plan: SessionPlan, stream: Any) -> None:
        """Take the ready events of a session's stream (at least one; it was ready) and act on them in order."""
        try:
            refs = [next(stream)]
        except StopIteration:
            self.release(plan, ended=True)
            return
        while len(refs) < 64 and stream.next_ready():
            try:
                refs.append(next(stream))
            except StopIteration:  # next_ready is True for the end of the stream too: released next time
                break
        try:
            events = ray.get(refs)
        except (RayTaskError, RayActorError, OutOfMemoryError):  # one failed: each ref on its own, as it comes
            for ref in refs:
                if not self.next_event(plan, ref):
                    return
            return
        for event in events:
            self.handle(plan, event)

    def next_event(self, plan: SessionPlan, ref: Any) -> bool:
        """Take one event of a session's stream (its object ref) and act on it; False once the stream failed."""
        try:
            event = ray.get(ref)
        except RayTaskError as err:  # the session's code raised: a bug, not a fault; no retry
            members = self.members(plan.key) or [plan]  # a seed group's sessions fail together
            self.release(plan)
            for member in members:
                member.status, member.error = "failed", str(err)
                self.progress.status(member.key, "failed")
                self.record.update(member)
                self.log_error(member, str(err))
            return False
        except (RayActorError, OutOfMemoryError) as err:  # process or node died, or Ray's memory monitor
            # killed it (OutOfMemoryError is no RayActorError): restart from the newest checkpoint
            members = self.members(plan.key) or [plan]  # a seed group's sessions restart together
            self.release(plan)
            for member in members:
                self.on_actor_died(member, err)
            return False
        self.handle(plan, event)
        return True

    def handle(self, plan: SessionPlan, event: ev.Event) -> None:
        """Update progress and run.json from one session event (``orchestrator.session.events``)."""
        if isinstance(event, (ev.Batch, ev.Grouped)):
            for member, inner in self.inner_events(plan, event):
                self.handle(member, inner)
        elif isinstance(event, ev.Log):
            self.on_log_row(plan, event.row)
        elif isinstance(event, (ev.StorageFault, ev.StorageRetry)):
            self.on_storage_event(plan, event)
        elif isinstance(event, ev.CheckpointFailed):
            self.progress.status(plan.key, f"checkpoint failed at {event.frame}")
        elif isinstance(event, ev.Checkpoint):
            plan.frame = event.frame
            self.record.update(plan, checkpoint=plan.frame, defer=True)
        elif isinstance(event, ev.Started):
            self.on_started(plan, event)
        elif isinstance(event, ev.Done):  # Interrupted too
            self.on_end(plan, event)

    def inner_events(self, plan: SessionPlan, event: ev.Batch | ev.Grouped) -> list[tuple[SessionPlan, ev.Event]]:
        """The events of a ``Batch`` (one checkpoint's, all ``plan``'s) or of a ``Grouped`` (a seed group's, each
        its session's own), with the plan each is for."""
        if isinstance(event, ev.Batch):
            return [(plan, inner) for inner in event.events]
        return [(self.by_key[f"t{plan.trial}_s{session}"], inner) for session, inner in event.events]

    def on_end(self, plan: SessionPlan, event: ev.Done) -> None:
        """A session's ``Done`` or ``Interrupted`` event: recorded, or (interrupted without the driver asking: its
        node drains, ``leave_draining_nodes``, or its process got SIGTERM) restarted from its checkpoint."""
        if isinstance(event, ev.Interrupted) and self.stopping_since is None and not self.stop_requested:
            plan.frame = event.frame
            self.release(plan)
            self.schedule_restart(plan, "node draining" if plan.key in self.preempting else "SIGTERM", True)
            return
        self.preempting.pop(plan.key, None)
        plan.status, plan.frame = event.kind, event.frame
        if not event.checkpoint:
            plan.error = f"no checkpoint could be committed at frame {plan.frame} (see log.txt)"
        # a session done before the run's max_frame stopped at a PBT generation boundary: "paused", not "done"
        self.progress.status(plan.key, "paused" if event.kind == "done" and plan.frame < self.spec["env"]["max_frame"]
                             else event.kind)
        self.record.update(plan, checkpoint=plan.frame if event.checkpoint else None)

    def on_storage_event(self, plan: SessionPlan, event: ev.StorageFault | ev.StorageRetry) -> None:
        """A session's ``StorageFault`` (it stopped at its committed checkpoint: the trial stops) or
        ``StorageRetry`` (one warning line per retried object-store call)."""
        if isinstance(event, ev.StorageRetry):
            for line in event.lines:
                print(f"warning: session {plan.key}: storage retry: {line}", file=sys.stderr)
            return
        plan.status, plan.frame, plan.error = "interrupted", event.frame, f"storage fault: {event.error}"
        self.progress.status(plan.key, "storage fault")
        self.record.update(plan, checkpoint=plan.frame or None)
        self.on_fault(event.uri, event.error, event.hint)

    def on_log_row(self, plan: SessionPlan, row: dict[str, Any]) -> None:
        """A session's train_df row: progress, the ``on_log`` callback; the first row of a trial that analyzes
        itself (``analyze``; a search trial's analysis is the driver's) starts ``preload_analysis`` (a session
        trains by then: the imports do not slow the actors' start-up)."""
        if self.preload is None and self.analyze:
            self.preload = preload_analysis()
        plan.frame = int(row["frame"])
        self.progress.update(plan.key, row, int(self.spec["env"]["max_frame"]))
        if self.on_log is not None:
            self.on_log(plan, row)

    def on_started(self, plan: SessionPlan, event: ev.Started) -> None:
        """Record the actor's pid and the frame it actually restored; warn about checkpoints the
        actor itself had to set aside (damaged after the driver verified them)."""
        entry = self.record.data["sessions"][plan.key]
        entry["pid"] = event.pid
        for key in ("node_id", "hostname"):  # where the actor runs (a restart records where it died)
            if getattr(event, key):
                entry[key] = getattr(event, key)
        if event.node_id:
            self.node_of[plan.key] = event.node_id
        if event.tracking:  # the session's W&B/MLflow run (also in t{T}/s{S}/tracking.json)
            entry["tracking"] = event.tracking
        restored = event.restored_frame
        entry["restored_frame"] = restored
        if event.set_aside:
            plan.set_aside += event.set_aside
            entry["set_aside"] = entry.get("set_aside", []) + event.set_aside
            names = ", ".join(f"{r['moved_to']} ({r['reason']})" for r in event.set_aside)
            print(f"warning: session {plan.key}: set aside {names}; resumed from frame {restored}", file=sys.stderr)
        if plan.resume and restored is None and self.unit(plan.key) in self.groups:
            restored = 0  # a seed group whose sessions had no checkpoint in common started at frame 0
        if plan.resume and restored is not None and restored != plan.frame:
            if plan.restarts:
                plan.restarts[-1]["frame_restored"] = restored
                entry["restarts"][-1:] = plan.restarts[-1:]
            elif self.record.data["resumes"]:
                self.record.data["resumes"][-1]["from_frames"][plan.key] = restored
            plan.frame = restored
        self.record.update(plan)

    def leave_draining_nodes(self) -> None:
        """Every ``DRAIN_POLL_S``: ask the sessions on a node Ray drains (a preemption notice: ``ray_drain``) to commit
        a checkpoint now and stop; their ``interrupted`` event restarts them elsewhere (``schedule_restart``)."""
        now = time.monotonic()
        if self.stopping_since is not None or not self.streams or now - self.drain_polled < self.DRAIN_POLL_S:
            return
        self.drain_polled = now
        draining = ray_drain.draining_nodes()
        for key, node in list(self.node_of.items()):
            if node in draining and key not in self.preempting and self.unit(key) in self.streams:
                deadline = draining[node]
                self.preempting[key] = {"node_id": node, "deadline": deadline}
                self.actors[key].stop.remote()
                self.progress.status(key, "preempted")
                notice = f"in {max(0.0, deadline - time.time()):.0f} s" if deadline else "with no deadline"
                print(f"session {key}: its node {node} is draining (ends {notice}): committing a checkpoint, "
                      "then restarting the session on another node", file=sys.stderr)

    def on_actor_died(self, plan: SessionPlan, err: Exception) -> None:
        """Schedule a replacement actor with back-off, or mark the session failed (died more than
        ``meta.max_restarts`` times, not counting deaths of a preempted node: Ray's ``preempted``, or a drain
        noticed by ``leave_draining_nodes``); during a stop, ``interrupt_ended``."""
        if self.stopping_since is not None:
            self.interrupt_ended(plan, err)
            return
        max_restarts = self.meta.max_restarts
        preempted = bool(getattr(err, "preempted", False)) or plan.key in self.preempting
        crashes = sum(1 for r in plan.restarts if r.get("cause") != "preempted")
        if not preempted and crashes >= max_restarts:
            plan.status = "failed"
            plan.error = f"session actor died {crashes + 1} times (max_restarts={max_restarts}): " \
                         f"{type(err).__name__}"
            self.progress.status(plan.key, "failed")
            self.record.update(plan)
            return
        self.schedule_restart(plan, type(err).__name__, preempted)

    def interrupt_ended(self, plan: SessionPlan, err: Exception) -> None:
        """A session whose actor ended while the trial stops: ``interrupted`` at its newest committed checkpoint
        (run.json's ``checkpoint``), which the resume verifies and continues from.

        SLURM and Kubernetes signal every process of a job, Ray's own daemons included, so a stop can end an actor
        (``ActorUnavailableError``, ``ActorDiedError``) before or while it commits its final checkpoint; the run is
        as resumable as after a SIGKILL of the driver, and the exit code says so (75). Nothing is verified or set
        aside here: an unreachable actor's process may still be committing."""
        plan.status, plan.error = "interrupted", f"{ENDED_IN_STOP} ({type(err).__name__})"
        self.progress.status(plan.key, "interrupted")
        self.record.update(plan, checkpoint=self.newest_committed(plan))

    def newest_committed(self, plan: SessionPlan) -> int | None:
        """Frame of the session's newest committed checkpoint (manifest present; not verified), None without one or
        when the store cannot be listed."""
        try:
            frames = CheckpointStore(predir_mod.session_dir(self.predir, plan.trial, plan.session)).frames()
        except (CheckpointError, storage.StorageError, OSError):
            return None
        return frames[-1] if frames else None

    def schedule_restart(self, plan: SessionPlan, reason: str, preempted: bool) -> None:
        """Schedule a replacement actor for a session whose actor ended (at once after a preemption, else with
        back-off), or mark it failed when its checkpoints cannot be read.

        The session's checkpoints are verified here (the old actor writes no more): the restart
        records the frame of the newest valid one (``frame_restored``), what was set aside, the node it left,
        and ``cause: preempted`` with the drain's ``deadline`` (seconds since the epoch) when there was one.
        """
        notice = self.preempting.pop(plan.key, {})
        before = len(plan.set_aside)
        try:
            selection = check_session(self.predir, plan)
        except (CheckpointError, storage.StorageError) as check_err:
            plan.status, plan.error = "failed", f"after the actor died: {check_err}"
            self.progress.status(plan.key, "failed")
            self.record.update(plan)
            return
        plan.resume = selection.frame is not None
        restored = selection.frame or 0
        restart = {"at": now_iso(), "frame_restored": restored, "frames_lost": max(0, plan.frame - restored),
                   "reason": reason}
        died_on = notice.get("node_id") or self.record.data["sessions"].get(plan.key, {}).get("node_id")
        if died_on:  # the node the ended actor ran on
            restart["node_id"] = died_on
        if preempted:
            restart["cause"] = "preempted"
        if notice.get("deadline"):
            restart["deadline"] = notice["deadline"]
        if len(plan.set_aside) > before:
            restart["set_aside"] = plan.set_aside[before:]
        plan.restarts.append(restart)
        plan.frame = restored
        plan.status = "restarting"
        self.progress.status(plan.key, f"restart {len(plan.restarts)}")
        self.record.update(plan, checkpoint=selection.frame)
        crashes = sum(1 for r in plan.restarts if r.get("cause") != "preempted")
        self.pending_restart[plan.key] = time.monotonic() + (0.0 if preempted else min(2.0 ** (crashes - 1), 30.0))

    def on_fault(self, uri: str, error: str, hint: str) -> None:
        """A persistent storage fault: remember the first one and stop the trial (as SIGTERM does)."""
        if self.fault is None:
            self.fault = {"uri": uri, "error": error, "hint": hint}
        self.stop_requested = True

    def restart_due(self, by_key: dict[str, SessionPlan]) -> None:
        """Start replacement actors whose back-off has passed."""
        for key, due in list(self.pending_restart.items()):
            if key in self.pending_restart and time.monotonic() >= due:  # a group's start takes all its sessions
                del self.pending_restart[key]
                self.start(by_key[key])

    def log_error(self, plan: SessionPlan, text: str) -> None:
        """Append a failed session's traceback to its log.txt."""
        uri = storage.join(predir_mod.session_dir(self.predir, plan.trial, plan.session), "log.txt")
        try:
            storage.append_text(uri, f"[{now_iso()}] session failed:\n{text}\n")
        except storage.StorageError as err:  # the error is in run.json too; a persistent fault stops the trial
            if err.hint is None:
                raise
            self.on_fault(err.uri, str(err), err.hint)

    # ---------------------------------------------------------------- end
    def finish(self) -> int:
        """Mark unfinished sessions, aggregate trial_df, analyze, print the summary.

        Returns:
            The exit code: 0 done, ``EXIT_RESUMABLE`` (75) cleanly interrupted, 1 a session failed or could not
            commit.
        """
        if self.fault is not None and self.stopping_since is None:  # the fault came with the last events
            self.request_stop()
        self.mark_unfinished()
        if self.fault is not None:
            return self.finish_fault()
        out = None
        if self.analyze:
            pause_point("analysis")
            aggregate_trial(self.predir, self.spec, sorted({p.trial for p in self.plans}))
            from orchestrator.report.analysis import analyze_after_run  # metrics JSON + graphs; a failure only warns
            out = analyze_after_run(self.predir)
        failed = [p for p in self.plans if p.status == "failed"]
        for plan in failed:
            print(f"session {plan.key} failed: {(plan.error or '').strip().splitlines()[-1:]}", file=sys.stderr)
        if self.stopping_since is not None:
            self.print_interrupted()
            # a session whose final commit outlasted the grace resumes from its last committed checkpoint
            return 1 if failed else EXIT_RESUMABLE
        if self.analyze:
            from orchestrator.report.analysis import summary_lines
            print("\n".join([f"trial done: {self.predir}", *(summary_lines(self.predir, out) if out else [])]),
                  flush=True)  # seen at once through a pipe or nohup log, not at exit
        return 1 if failed else 0

    def finish_fault(self) -> int:
        """End of a trial stopped by a storage fault: ``run.json`` gets ``interrupted`` {at, cause, uri} (when it
        can be written), one ``error:`` line names the path, the error and what to do, the sessions' state and the
        resume command follow; no analysis (it would write to the failing store). Returns ``EXIT_RESUMABLE``."""
        fault = self.fault or {}
        self.record.data["interrupted"] = {"at": now_iso(), "cause": f"storage fault: {fault.get('error')}",
                                           "uri": fault.get("uri")}
        self.record.save()  # best effort: a write the fault refuses is left (RunRecord.fault)
        print(f"error: storage fault: {fault.get('error')}\n  the run stopped cleanly (every committed checkpoint "
              f"is intact); {fault.get('hint')}, then run the resume command below", file=sys.stderr, flush=True)
        self.print_interrupted()
        return EXIT_RESUMABLE

    def mark_unfinished(self) -> None:
        """Record the final status of sessions still running: ``interrupted`` (or ``not started``,
        a session whose actor never began, e.g. waiting for resources) after a stop, else ``failed``."""
        for plan in self.plans:
            if plan.status not in ("running", "restarting", "pending"):
                continue
            started = "pid" in self.record.data["sessions"].get(plan.key, {})
            if self.stopping_since is not None and not started and not plan.restarts:
                plan.status = "not started"
            elif self.stopping_since is not None:
                plan.status = "interrupted"
                plan.error = plan.error or GRACE_PASSED
            else:
                plan.status, plan.error = "failed", plan.error or "stream ended early"
            self.record.update(plan)

    def print_interrupted(self) -> None:
        """Print each session's state and committed checkpoint frame (from run.json), and the
        command that resumes the run (with ``--allow-fresh`` when a session has no checkpoint)."""
        from orchestrator.commandline import lab_command

        lines, fresh = ["interrupted:"], False
        for plan in self.plans:
            if (plan.error or "").startswith(ENDED_IN_STOP):  # its process may have committed once more since
                self.record.update(plan, checkpoint=self.newest_committed(plan))
            frame = self.record.data["sessions"].get(plan.key, {}).get("checkpoint")
            fresh = fresh or not frame
            if plan.status == "not started":
                what = "not started" + (f" (committed checkpoint at frame {frame})" if frame else "")
            elif frame:
                what = f"{plan.status}, committed checkpoint at frame {frame}"
            else:
                what = f"{plan.status}, no committed checkpoint"
            if plan.error == GRACE_PASSED:
                what += f" (no final checkpoint within shutdown_grace_s={self.meta.shutdown_grace_s} s)"
            lines.append(f"  {plan.key}: {what}")
        spec_file = predir_mod.spec_file(self.predir, self.spec["name"])
        extra = ("--allow-fresh",) if fresh and self.resume_mode == "train" else ()
        command = STOP.resume_command or lab_command(spec_file, self.spec["name"], f"{self.resume_mode}@{self.predir}",
                                                     *extra)  # --name: the command as the user typed it
        print("\n".join([*lines, "resume with:", "  " + command]), flush=True)


def aggregate_trial(predir: str, spec: dict[str, Any], trials: list[int]) -> None:
    """Write ``info/trial_df.parquet``: per frame, mean and std across sessions of total_reward(_ma), from each
    session's committed train_df (``report.rundata.committed_df``, as the analysis reads it)."""
    import pandas as pd

    from orchestrator.report.rundata import committed_df

    frames = []
    for t in trials:
        for s in range(MetaSpec.of(spec).max_session):
            df = committed_df(predir_mod.session_dir(predir, t, s), "train_df.parquet")
            if df is not None:
                frames.append(df[["frame", "total_reward", "total_reward_ma"]].assign(trial=t, session=s))
    if not frames:
        return
    df = pd.concat(frames)
    agg = df.groupby(["trial", "frame"])[["total_reward", "total_reward_ma"]].agg(["mean", "std"])
    agg.columns = [f"{a}_{b}" for a, b in agg.columns]
    storage.write_parquet(storage.join(predir, "info", "trial_df.parquet"), agg.reset_index())
