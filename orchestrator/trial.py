"""Trials on Ray: ``train`` starts one ``SessionActor`` per session; ``train@{predir|latest}`` resumes.

The driver plans the sessions, starts their actors in parallel, watches their event streams with
``ray.wait`` (timeout in seconds), keeps ``run.json`` up to date, restarts an actor that died (its
process or node was lost) from the session's newest checkpoint up to ``meta.max_restarts`` times,
marks a session whose code raised as ``failed`` (siblings continue), and at the end aggregates
``info/trial_df.parquet`` (mean and std of returns across sessions per frame).

Integrity (docs/RELIABILITY.md): the committed checkpoints are the truth. Before it runs anything,
``train@`` holds the run's lease (``orchestrator.lease``: a second driver exits 2) and verifies every
session's newest checkpoint in the driver: corrupt ones are set aside with one warning per session,
``run.json`` records the frame really restored, sessions at ``max_frame`` get their train_df/eval_df
copies re-exported from their checkpoint, and a damaged ``run.json`` is rebuilt.

SIGINT/SIGTERM to the driver asks every session to commit a final checkpoint within
``meta.shutdown_grace_s`` seconds and prints the command that resumes the run; a second signal
exits at once (committed checkpoints are never half-written).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Iterator

import ray
from ray.exceptions import OutOfMemoryError, RayActorError, RayTaskError

from orchestrator import predir as predir_mod
from orchestrator import spec_check, storage
from orchestrator.checkpoint import CheckpointError, CheckpointStore, Selection
from orchestrator.errors import UsageError
from orchestrator.global_params import GlobalParamsActor, distributed
from orchestrator.lease import Lease
from orchestrator.predir import session_seed
from orchestrator.progress import SessionProgress
from orchestrator.session_actor import EXPORTED_FILES, SessionActor

# No torch in the driver of a ``train`` or ``train@``: both check their spec (``train@`` also its merge into
# the saved spec) in orchestrator.spec_check's child process; the cli imports orchestrator.spec for dev, search
# and enjoy only.


@dataclass
class SessionPlan:
    """One session to run: indices, seed, whether to restore, and its live status."""

    trial: int
    session: int
    seed: int
    resume: bool
    status: str = "pending"
    frame: int = 0
    restarts: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    set_aside: list[dict[str, Any]] = field(default_factory=list)  # corrupt checkpoints found on planning

    @property
    def key(self) -> str:
        """The session's key in ``run.json`` and file names, ``t{trial}_s{session}``."""
        return f"t{self.trial}_s{self.session}"


def now_iso() -> str:
    """Current UTC time, ISO 8601."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def versions() -> dict[str, str]:
    """Versions of the libraries a run depends on (written to run.json), from the installed packages'
    metadata (``importlib.metadata``: importing torch and gymnasium for them would cost the driver ~250 MB);
    "unknown" for one that is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    def of(dist: str) -> str:
        try:
            return version(dist)
        except PackageNotFoundError:
            return "unknown"
    return {"python": sys.version.split()[0], "ray": ray.__version__, "torch": of("torch"),
            "gymnasium": of("gymnasium"), "numpy": of("numpy")}


def init_ray(address: str | None, dashboard: bool = False, prestart: bool = True) -> None:
    """Join ``address`` / ``RAY_ADDRESS`` or start a local Ray (no-op if already initialized).

    Args:
        dashboard: start the Ray dashboard with a local Ray (``lab --dashboard``; it needs
            ``ray[default]``, the ``cluster`` extra). Off by default: a lighter start. A cluster's
            dashboard is the head's (``ray start --head --include-dashboard=true``).
        prestart: let a local Ray start one idle worker process per CPU when the driver connects (Ray's
            default; the first session actor of a ``train`` takes one). False for a ``search``: Tune starts its
            trial actors with their own ``runtime_env``, so they and their session actors never take those
            workers, which only cost the start-up CPU time (docs/BENCHMARKS.md "Search overhead").

    Raises:
        UsageError: ``dashboard`` without the dashboard's packages installed.
    """
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS") or "local"
    local = {} if prestart else {"_system_config": {"prestart_worker_first_driver": False}}
    if dashboard and address == "local":
        from ray._private.utils import get_dashboard_dependency_error
        if get_dashboard_dependency_error() is not None:
            raise UsageError("--dashboard needs the Ray dashboard's packages: pip install 'rl-trial-lab[cluster]' "
                             "(ray[default])")
        context = ray.init(address=address, include_dashboard=True, log_to_driver=False, logging_level="ERROR",
                           **local)
        print(f"Ray dashboard: http://{context.dashboard_url}")
        return
    if address == "local":
        with lean_head_params():
            ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="ERROR", **local)
        return
    ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="ERROR")


@contextlib.contextmanager
def lean_head_params() -> Iterator[None]:
    """While a local Ray starts: no autoscaler monitor, no log monitor, no dashboard API server, and the raylet's
    dashboard agent in its minimal mode (docs/BENCHMARKS.md "Process memory" and "Start-up and exit").

    A one-machine Ray never autoscales; with ``log_to_driver=False`` the log monitor, which only forwards worker
    output to drivers, has nothing to do; the API server, which Ray starts even with ``include_dashboard=False``
    (it serves ``ray list``'s state API and job submission, neither of which the lab uses on its own Ray;
    ``--dashboard`` starts the full one), costs about 100 MB, and ``ray.init`` waits about 0.8 s for it before it
    starts the raylet; and the agent's full mode (metrics export and the dashboard's node reports) costs the
    driver about 0.25 s of imports (aiohttp and the like) to decide on it. ``ray.init`` has no option for any of
    these, so for its duration its node parameters (``RayParams``, Ray 2.60, whose ``no_monitor`` /
    ``include_log_monitor`` fields ``ray start`` sets) get the first two defaults, the node's ``start_api_server``
    records no web UI, as Ray does for a minimal install that starts no server, and Ray's dashboard-dependency
    check answers as it does for a minimal install. Last, the head waits for its raylet to register with Ray's own
    lookup, which here took 1.0 s every time (it looks again about once a second); ``services.get_node`` first
    polls the GCS's node table every 20 ms (0.3-0.9 s less). With a Ray that lacks these, nothing changes.
    """
    import ray._private.node as node
    import ray._private.parameter as parameter
    import ray._private.services as services
    import ray._private.state as ray_state
    import ray._private.utils as ray_utils

    base = parameter.RayParams
    start_api_server = getattr(node.Node, "start_api_server", None)
    dependency_error = getattr(ray_utils, "get_dashboard_dependency_error", None)
    get_node = getattr(services, "get_node", None)
    if not {"no_monitor", "include_log_monitor"} <= set(inspect.signature(base).parameters) or \
            start_api_server is None or "include_dashboard" not in inspect.signature(start_api_server).parameters \
            or dependency_error is None or get_node is None:
        yield
        return

    class LeanParams(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("no_monitor", True)
            kwargs.setdefault("include_log_monitor", False)
            super().__init__(*args, **kwargs)

    def no_api_server(self: Any, *, include_dashboard: bool | None, raise_on_failure: bool) -> None:
        self._webui_url = ""  # what Ray records when it starts no server (a minimal install)

    def get_node_when_registered(gcs_address: str, node_id: str) -> Any:
        try:
            table = ray_state.GlobalState()
            table._initialize_global_state(services._get_gcs_client_options(gcs_address))
            try:
                deadline = time.monotonic() + 10  # then Ray's own lookup and its timeout take over
                while time.monotonic() < deadline and all(n["NodeID"] != node_id for n in table.node_table()):
                    time.sleep(0.02)
            finally:
                table.disconnect()
        except Exception:  # noqa: BLE001  (the poll only saves time: Ray's own lookup below decides)
            pass
        return get_node(gcs_address, node_id)

    parameter.RayParams = LeanParams
    node.Node.start_api_server = no_api_server
    ray_utils.get_dashboard_dependency_error = lambda: "the lab's local Ray: dashboard agent in minimal mode"
    services.get_node = get_node_when_registered
    try:
        yield
    finally:
        parameter.RayParams = base
        node.Node.start_api_server = start_api_server
        ray_utils.get_dashboard_dependency_error = dependency_error
        services.get_node = get_node


def check_resources(meta: dict[str, Any], together: bool = False) -> None:
    """Refuse resources that can never fit the cluster (instead of waiting forever): one session's, and with
    ``together`` (a search trial, whose placement group reserves all ``meta.max_session`` sessions at once) the
    sum over the trial's sessions.

    Raises:
        UsageError: naming what was asked and what exists.
    """
    total = ray.cluster_resources()
    res = meta["resources"]
    sessions = int(meta["max_session"])
    for key, name in (("num_cpus", "CPU"), ("num_gpus", "GPU")):
        asked, exists = float(res.get(key, 0) or 0), float(total.get(name, 0))
        if asked > exists:
            raise UsageError(f"meta.resources.{key}={asked} per session can never fit: the Ray cluster has "
                             f"{exists} {name} in total")
        if together and asked * sessions > exists:
            raise UsageError(f"meta.resources.{key}={asked} x meta.max_session={sessions}: a search trial reserves "
                             f"all its sessions at once, and {asked * sessions:g} {name} can never fit: the Ray "
                             f"cluster has {exists} {name} in total (lower either, or add nodes)")


class RunRecord:
    """``run.json`` of a predir (docs/ARCHITECTURE.md section 7), written atomically.

    Status changes (started, restarted, done, failed, interrupted) are written at once (while ``hold`` is
    set, by the driver loop handling a batch of events, once at the end of that batch: ``flush_due``); the
    frequent checkpoint-frame updates are amortized: written at most once per ``CHECKPOINT_WRITE_S`` seconds
    (``flush_due`` from the driver loop, ``save`` at the end), so 1,000 sessions checkpointing every
    second cost one rewrite per second, not 1,000. A driver killed in between leaves checkpoint frames up to
    that old in run.json; a resume reads the checkpoints themselves, never these frames. The file holds one
    line per session (``dumps``): a rewrite with 1,000 sessions costs milliseconds, not an indented dump.
    """

    CHECKPOINT_WRITE_S = 1.0

    def __init__(self, predir: str, data: dict[str, Any]) -> None:
        self.uri, self.data = storage.join(predir, "run.json"), data
        self.dirty, self.last_write = False, 0.0
        self.hold, self.urgent = False, False  # hold: status writes wait for flush_due (end of an event batch)

    @classmethod
    def load_or_new(cls, predir: str, spec_name: str) -> "RunRecord":
        """Read an existing run.json or start a new record; a damaged one is rebuilt (see ``rebuild``).

        Args:
            predir: the directory holding run.json (a run, or a search's ``t{T}`` dir).

        Raises:
            storage.StorageError: the store cannot be read.
        """
        uri = storage.join(predir, "run.json")
        try:
            data = storage.read_json(uri)
        except FileNotFoundError:
            return cls(predir, cls.new_data(spec_name))
        except (ValueError, UnicodeDecodeError) as err:
            return cls.rebuild(predir, spec_name, f"not valid JSON: {err}")
        if not isinstance(data, dict) or not isinstance(data.get("sessions"), dict) \
                or not isinstance(data.get("resumes"), list):
            return cls.rebuild(predir, spec_name, "not an object with 'sessions' and 'resumes'")
        return cls(predir, data)

    @staticmethod
    def new_data(spec_name: str) -> dict[str, Any]:
        """The content of a new run.json."""
        return {"spec_name": spec_name, "created": now_iso(), "versions": versions(), "sessions": {},
                "resumes": []}

    @classmethod
    def rebuild(cls, predir: str, spec_name: str, why: str) -> "RunRecord":
        """A run.json rebuilt from the run's session spec files and committed checkpoints, with a warning.

        The damaged file is kept as ``run.json.damaged-{ts}``. Per session: ``frame``/``checkpoint`` =
        its newest committed checkpoint (verified later by the resume), ``status`` ``done`` at the
        session spec's ``max_frame``, else ``interrupted``; the seed from its spec file. The resume and
        restart history cannot be recovered and starts empty.

        Returns:
            The rebuilt record (already written).
        """
        uri = storage.join(predir, "run.json")
        kept = f"{uri}.damaged-{now_iso().replace(':', '')}"
        storage.write_bytes(kept, storage.read_bytes(uri))
        record = cls(predir, {**cls.new_data(spec_name), "rebuilt": {"at": now_iso(), "why": why}})
        root = predir_mod_run_root(predir)
        for trial, session in record_sessions(predir):
            spec_uri = predir_mod.spec_file(root, spec_name, trial, session)
            try:
                spec = storage.read_json(spec_uri)
                seed, max_frame = spec["meta"]["session_seed"], int(spec["env"]["max_frame"])
            except (FileNotFoundError, ValueError, KeyError, TypeError):
                seed, max_frame = None, None
            frames = CheckpointStore(predir_mod.session_dir(root, trial, session)).frames()
            frame = frames[-1] if frames else 0
            status = "done" if max_frame is not None and frame >= max_frame else "interrupted"
            record.data["sessions"][f"t{trial}_s{session}"] = {
                "status": status, "frame": frame, "checkpoint": frame if frames else None, "seed": seed,
                "restarts": [], "error": None}
        record.save()
        print(f"warning: {uri} is damaged ({why}); kept as {kept} and rebuilt from the spec files and "
              f"committed checkpoints ({len(record.data['sessions'])} session(s); the resume history is lost)",
              file=sys.stderr)
        return record

    def update(self, plan: SessionPlan, checkpoint: int | None = None, defer: bool = False) -> None:
        """Record a session's status, frame (env frames), restarts and error; write the file (with
        ``defer``, a checkpoint-frame update, only when ``CHECKPOINT_WRITE_S`` passed since the last write).

        Raises:
            storage.StorageError: the write failed.
        """
        entry = self.data["sessions"].setdefault(plan.key, {})
        entry.update({"status": plan.status, "frame": plan.frame, "seed": plan.seed,
                      "restarts": entry.get("restarts", []) + plan.restarts[len(entry.get("restarts", [])):],
                      "error": plan.error})
        if checkpoint is not None:
            entry["checkpoint"] = checkpoint
        self.dirty = True
        if self.hold:  # the driver loop writes once at the end of its batch (flush_due)
            self.urgent = self.urgent or not defer
        elif defer:
            self.flush_due()
        else:
            self.save()

    def flush_due(self) -> None:
        """Write pending updates: status changes held back (``hold``) now, checkpoint frames if
        ``CHECKPOINT_WRITE_S`` passed since the last write."""
        if self.urgent or (self.dirty and time.monotonic() - self.last_write >= self.CHECKPOINT_WRITE_S):
            self.save()

    def save(self) -> None:
        """Write run.json atomically."""
        storage.write_text(self.uri, self.dumps(self.data))
        self.dirty, self.urgent, self.last_write = False, False, time.monotonic()

    @staticmethod
    def dumps(data: dict[str, Any]) -> str:
        """run.json's text: JSON with one line per top-level key, per session and per resume (the C
        encoder's speed; an indented ``json.dumps`` of 1,000 sessions takes ~40 ms in pure Python)."""
        def block(value: Any) -> str:
            if isinstance(value, dict) and value:
                items = (f"    {json.dumps(k)}: {json.dumps(v, default=str)}" for k, v in value.items())
                return "{\n" + ",\n".join(items) + "\n  }"
            if isinstance(value, list) and value:
                return "[\n" + ",\n".join(f"    {json.dumps(v, default=str)}" for v in value) + "\n  ]"
            return json.dumps(value, default=str)
        return "{\n" + ",\n".join(f"  {json.dumps(k)}: {block(v)}" for k, v in data.items()) + "\n}\n"


class SessionHosts:
    """Session actors whose session ended ``done``, kept warm in the process that owns them, to host the
    sessions of the next trial that process runs (``SessionActor.run(session=...)``).

    A new session actor is a new Python process that imports torch and the lab before its session starts
    (seconds, most of a short search trial's fixed cost: docs/BENCHMARKS.md "Search overhead"). A search's
    Tune trial actor is reused for the next trial Tune starts with the same resources (``reuse_actors``),
    within the same placement group, so the session actors it started stay in that placement group's
    bundles and host the next trial's sessions. An actor is reused only after its session ended ``done``
    and only for the same resources (``key``); any other ending (failure, death, stop) ends the actor.
    Owned by the process, hosts end with it (Tune ending its trial actor, or the driver exiting).
    """

    def __init__(self) -> None:
        self.idle: list[tuple[tuple[Any, ...], Any]] = []

    def take(self, key: tuple[Any, ...]) -> Any | None:
        """An idle actor for sessions of resources ``key`` (None when there is none); idle actors of other
        resources are ended (they hold resources of the placement group the new sessions need)."""
        self.keep_only(key)
        return self.idle.pop()[1] if self.idle else None

    def keep_only(self, key: tuple[Any, ...]) -> None:
        """End the idle actors of resources other than ``key``."""
        for _, actor in [item for item in self.idle if item[0] != key]:
            ray.kill(actor)
        self.idle = [item for item in self.idle if item[0] == key]

    def warm_up(self, key: tuple[float, float], count: int) -> list[Any]:
        """Start empty session actors (``SessionActor()``) of resources ``key`` = (num_cpus, num_gpus) until
        ``count`` are idle, in the caller's placement group: their processes start (a worker, torch, the lab)
        while the caller checks its spec and plans; ``take`` hands them to its sessions.

        Returns:
            The idle actors of ``key`` (at least ``count``).
        """
        self.keep_only(key)
        while len(self.idle) < count:
            self.idle.append((key, empty_session_actor(key)))
        return [actor for _, actor in self.idle]

    def put(self, key: tuple[Any, ...], actor: Any) -> None:
        """Keep an actor whose session ended ``done`` for the next session of resources ``key``."""
        self.idle.append((key, actor))

    def clear(self) -> None:
        """End every idle actor."""
        for _, actor in self.idle:
            ray.kill(actor)
        self.idle = []


def empty_session_actor(key: tuple[float, float]) -> Any:
    """A new ``SessionActor`` with no session, holding ``key`` = (num_cpus, num_gpus) (``host_key``); its
    ``run(session=...)`` builds the session."""
    num_cpus, num_gpus = key
    return SessionActor.options(num_cpus=num_cpus, num_gpus=num_gpus).remote()


def host_key(meta: dict[str, Any]) -> tuple[float, float]:
    """What a session actor is created with besides its session: (num_cpus, num_gpus) of ``meta.resources``."""
    res = meta["resources"]
    return float(res.get("num_cpus", 1) or 0), float(res.get("num_gpus", 0) or 0)


HOSTS = SessionHosts()  # this process's warm session actors (used by search trials: orchestrator.search)


ANALYSIS_MODULES = ("pandas", "matplotlib.backends.backend_agg", "matplotlib.figure", "plotly.io",
                    "orchestrator.analysis", "orchestrator.stats", "orchestrator.compare")


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


class Trial:
    """Runs the planned sessions of one trial as Ray actors and watches them.

    Args:
        spec: the checked spec to run (for a resume: saved spec + applied edits).
        predir: run directory URI.
        plans: sessions to run.
        record: the run's ``run.json``.
        quiet: no live progress display.
        on_log: called with (plan, train_df row) at each session log checkpoint (search mode reports
            trial metrics to Ray Tune from it); the Trial installs no signal handlers itself.
        analyze: at the end, aggregate trial_df, analyze the whole predir and print the summary
            (False inside a search trial: the search analyzes each trial when it ends).
        lease: the run's lease held by this driver; once another driver took it (``lease.lost``)
            the sessions are asked to stop at their next checkpoint.
        hosts: warm session actors to start sessions in, and to keep the actors of sessions that end
            ``done`` in (``SessionHosts``); None: one new actor per session, ended with it.
    """

    WATCH_BATCH_S = 0.1  # seconds the watch loop gathers events before acting on them

    def __init__(self, spec: dict[str, Any], predir: str, plans: list[SessionPlan], record: RunRecord,
                 quiet: bool = False,
                 on_log: Callable[[SessionPlan, dict[str, Any]], None] | None = None,
                 analyze: bool = True, lease: Lease | None = None, hosts: SessionHosts | None = None) -> None:
        self.spec, self.predir, self.plans, self.record, self.quiet = spec, predir, plans, record, quiet
        self.lease, self.hosts = lease, hosts
        self.on_log, self.analyze = on_log, analyze
        self.meta = spec["meta"]
        self.actors: dict[str, Any] = {}
        self.streams: dict[str, Any] = {}
        self.pending_restart: dict[str, float] = {}  # key -> monotonic time to restart at
        self.stopping_since: float | None = None
        # set by a signal handler (run_with_signals): the watch loop calls request_stop at its next turn, since
        # a handler runs between any two bytecodes and must not change the streams under the loop
        self.stop_requested = False
        self.preload: threading.Thread | None = None  # the analysis' imports, from the first log row on
        self.progress = SessionProgress(disable=True)  # the live display, once run() starts
        self.globals: dict[int, Any] = {}  # trial index -> GlobalParamsActor (meta.distributed)

    def start_globals(self) -> None:
        """With ``meta.distributed``, start one ``GlobalParamsActor`` per trial of the plans (no CPU reserved: it
        only steps optimizers); it restores the trial's newest global checkpoint when there is one."""
        if not distributed(self.spec):
            return
        for t in sorted({p.trial for p in self.plans} - set(self.globals)):
            self.globals[t] = GlobalParamsActor.options(num_cpus=0).remote(
                self.spec, self.predir, t, session_seed(self.meta["random_seed"], t, 0), True)

    def stop_globals(self) -> None:
        """End the global actors (their state is in the global checkpoints the sessions triggered)."""
        for actor in self.globals.values():
            ray.kill(actor)
        self.globals.clear()

    # ---------------------------------------------------------------- actors
    def start(self, plan: SessionPlan) -> None:
        """Start (or restart) the actor of a session and its event stream: in a warm actor of ``hosts``
        when one is idle, else in a new one."""
        actor = self.hosts.take(self.host_key()) if self.hosts is not None else None
        if actor is None:
            actor = self.new_actor(plan)
        num_cpus = self.host_key()[0]
        stream = actor.run.remote({"spec": self.spec, "predir": self.predir, "trial": plan.trial,
                                   "session": plan.session, "seed": plan.seed, "resume": plan.resume,
                                   "global_params": self.globals.get(plan.trial), "num_threads": max(1, int(num_cpus))})
        self.actors[plan.key], self.streams[plan.key] = actor, stream
        plan.status = "running"
        self.record.update(plan)

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
            for key in list(self.pending_restart):
                del self.pending_restart[key]
                by_key[key].status = "interrupted"
                self.progress.status(key, "interrupted")
                self.record.update(by_key[key])
            for key in list(self.streams):
                if "pid" in self.record.data["sessions"].get(key, {}) or by_key[key].restarts:
                    self.actors[key].stop.remote()
                    continue
                self.release(by_key[key])
                by_key[key].status = "not started"
                self.progress.status(key, "not started")
                self.record.update(by_key[key])

    # ---------------------------------------------------------------- watching
    def run(self) -> int:
        """Run all planned sessions to completion (or interruption); returns the exit code."""
        by_key = {p.key: p for p in self.plans}
        with SessionProgress(disable=self.quiet) as progress:
            self.progress = progress
            self.start_globals()
            self.record.hold = True  # one run.json write for all the starts
            try:
                for plan in self.plans:
                    self.start(plan)
            finally:
                self.record.hold = False
            self.record.flush_due()
            try:
                self.watch_all(by_key)
            except BaseException:  # e.g. Tune stopping a search trial (SystemExit from tune.report)
                self.end_all()
                raise
        self.stop_globals()
        self.record.save()
        return self.finish()

    def watch_all(self, by_key: dict[str, SessionPlan]) -> None:
        """Watch the sessions until every stream ended and no restart is pending (or the stop's grace passed)."""
        while self.streams or self.pending_restart:
            if self.stopping_since is None and (self.stop_requested or (self.lease is not None and self.lease.lost)):
                self.request_stop()
            self.restart_due(by_key)
            if self.stopping_since is not None and \
                    time.monotonic() - self.stopping_since > float(self.meta["shutdown_grace_s"]):
                break
            if not self.streams:
                time.sleep(0.2)
                continue
            self.watch(by_key)

    def release(self, plan: SessionPlan, ended: bool = False) -> None:
        """Drop a finished session's stream and actor handle, so Ray ends the actor and frees its
        resources for sessions still waiting; with ``hosts``, the actor of a session whose stream
        ``ended`` after ``done`` is kept there instead (``SessionHosts``)."""
        self.streams.pop(plan.key, None)
        actor = self.actors.pop(plan.key, None)
        if actor is None:
            return
        if ended and self.hosts is not None and plan.status == "done" and not plan.error \
                and self.stopping_since is None:
            self.hosts.put(self.host_key(), actor)
        else:
            self.end_actor(actor)

    def end_all(self) -> None:
        """End every session actor still held (the trial is abandoned: e.g. Tune stopped it)."""
        for key in list(self.actors):
            self.streams.pop(key, None)
            self.end_actor(self.actors.pop(key))

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
            self.release(plan)
            plan.status, plan.error = "failed", str(err)
            self.progress.status(plan.key, "failed")
            self.record.update(plan)
            self.log_error(plan, str(err))
            return False
        except (RayActorError, OutOfMemoryError) as err:  # process or node died, or Ray's memory monitor
            # killed it (OutOfMemoryError is no RayActorError): restart from the newest checkpoint
            self.release(plan)
            self.on_actor_died(plan, err)
            return False
        self.handle(plan, event)
        return True

    def handle(self, plan: SessionPlan, event: dict[str, Any]) -> None:
        """Update progress and run.json from one session event."""
        kind = event["kind"]
        if kind == "batch":  # one checkpoint's events (SessionActor.run)
            for inner in event["events"]:
                self.handle(plan, inner)
        elif kind == "log":
            self.on_log_row(plan, event["row"])
        elif kind == "checkpoint_failed":
            self.progress.status(plan.key, f"checkpoint failed at {event['frame']}")
        elif kind == "checkpoint":
            plan.frame = int(event["frame"])
            self.record.update(plan, checkpoint=plan.frame, defer=True)
        elif kind == "started":
            self.on_started(plan, event)
        elif kind in ("done", "interrupted"):
            plan.status, plan.frame = kind, int(event["frame"])
            if not event["checkpoint"]:
                plan.error = f"no checkpoint could be committed at frame {plan.frame} (see log.txt)"
            self.progress.status(plan.key, kind)
            self.record.update(plan, checkpoint=plan.frame if event["checkpoint"] else None)

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

    def on_started(self, plan: SessionPlan, event: dict[str, Any]) -> None:
        """Record the actor's pid and the frame it actually restored; warn about checkpoints the
        actor itself had to set aside (damaged after the driver verified them)."""
        entry = self.record.data["sessions"][plan.key]
        entry["pid"] = event["pid"]
        for key in ("node_id", "hostname"):  # where the actor runs (a restart records where it died)
            if event.get(key):
                entry[key] = event[key]
        if event.get("tracking"):  # the session's W&B/MLflow run (also in t{T}/s{S}/tracking.json)
            entry["tracking"] = event["tracking"]
        restored = event.get("restored_frame")
        entry["restored_frame"] = restored
        if event.get("set_aside"):
            plan.set_aside += event["set_aside"]
            entry["set_aside"] = entry.get("set_aside", []) + event["set_aside"]
            names = ", ".join(f"{r['moved_to']} ({r['reason']})" for r in event["set_aside"])
            print(f"warning: session {plan.key}: set aside {names}; resumed from frame {restored}", file=sys.stderr)
        if plan.resume and restored is not None and restored != plan.frame:
            if plan.restarts:
                plan.restarts[-1]["frame_restored"] = restored
                entry["restarts"][-1:] = plan.restarts[-1:]
            elif self.record.data["resumes"]:
                self.record.data["resumes"][-1]["from_frames"][plan.key] = restored
            plan.frame = restored
        self.record.update(plan)

    def on_actor_died(self, plan: SessionPlan, err: Exception) -> None:
        """Schedule a replacement actor with back-off, or mark the session failed.

        The session's checkpoints are verified here (the dead actor writes no more): the restart
        records the frame of the newest valid one (``frame_restored``) and what was set aside.
        """
        max_restarts = int(self.meta["max_restarts"])
        if self.stopping_since is not None or len(plan.restarts) >= max_restarts:
            plan.status = "failed"
            plan.error = f"session actor died {len(plan.restarts) + 1} times (max_restarts={max_restarts}): " \
                         f"{type(err).__name__}"
            self.progress.status(plan.key, "failed")
            self.record.update(plan)
            return
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
                   "reason": type(err).__name__}
        died_on = self.record.data["sessions"].get(plan.key, {}).get("node_id")
        if died_on:  # the node the dead actor ran on
            restart["node_id"] = died_on
        if len(plan.set_aside) > before:
            restart["set_aside"] = plan.set_aside[before:]
        plan.restarts.append(restart)
        plan.frame = restored
        plan.status = "restarting"
        self.progress.status(plan.key, f"restart {len(plan.restarts)}")
        self.record.update(plan)
        self.pending_restart[plan.key] = time.monotonic() + min(2.0 ** (len(plan.restarts) - 1), 30.0)

    def restart_due(self, by_key: dict[str, SessionPlan]) -> None:
        """Start replacement actors whose back-off has passed."""
        for key, due in list(self.pending_restart.items()):
            if time.monotonic() >= due:
                del self.pending_restart[key]
                self.start(by_key[key])

    def log_error(self, plan: SessionPlan, text: str) -> None:
        """Append a failed session's traceback to its log.txt."""
        uri = storage.join(predir_mod.session_dir(self.predir, plan.trial, plan.session), "log.txt")
        storage.append_text(uri, f"[{now_iso()}] session failed:\n{text}\n")

    # ---------------------------------------------------------------- end
    def finish(self) -> int:
        """Mark unfinished sessions, aggregate trial_df, analyze, print the summary.

        Returns:
            The exit code: 0 done (or cleanly interrupted), 1 a session failed or could not commit.
        """
        self.mark_unfinished()
        out = None
        if self.analyze:
            aggregate_trial(self.predir, self.spec, sorted({p.trial for p in self.plans}))
            from orchestrator.analysis import analyze_after_run  # metrics JSON + graphs; a failure only warns
            out = analyze_after_run(self.predir)
        failed = [p for p in self.plans if p.status == "failed"]
        for plan in failed:
            print(f"session {plan.key} failed: {(plan.error or '').strip().splitlines()[-1:]}", file=sys.stderr)
        if self.stopping_since is not None:
            self.print_interrupted()
            clean = all(p.status in ("interrupted", "done", "not started") and not p.error for p in self.plans)
            return 0 if clean else 1
        if self.analyze:
            from orchestrator.analysis import summary_lines
            print("\n".join([f"trial done: {self.predir}", *(summary_lines(self.predir, out) if out else [])]),
                  flush=True)  # seen at once through a pipe or nohup log, not at exit
        return 1 if failed else 0

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
                plan.error = plan.error or "no final checkpoint within shutdown_grace_s"
            else:
                plan.status, plan.error = "failed", plan.error or "stream ended early"
            self.record.update(plan)

    def print_interrupted(self) -> None:
        """Print each session's state and committed checkpoint frame (from run.json), and the
        command that resumes the run (with ``--allow-fresh`` when a session has no checkpoint)."""
        from orchestrator.cli import lab_command

        lines, fresh = ["interrupted:"], False
        for plan in self.plans:
            frame = self.record.data["sessions"].get(plan.key, {}).get("checkpoint")
            fresh = fresh or not frame
            if plan.status == "not started":
                what = "not started" + (f" (committed checkpoint at frame {frame})" if frame else "")
            elif frame:
                what = f"{plan.status}, committed checkpoint at frame {frame}"
            else:
                what = f"{plan.status}, no committed checkpoint"
            lines.append(f"  {plan.key}: {what}")
        spec_file = predir_mod.spec_file(self.predir, self.spec["name"])
        extra = ("--allow-fresh",) if fresh else ()
        lines += ["resume with:", "  " + lab_command(spec_file, self.spec["name"], f"train@{self.predir}", *extra)]
        print("\n".join(lines))


def aggregate_trial(predir: str, spec: dict[str, Any], trials: list[int]) -> None:
    """Write ``info/trial_df.parquet``: per frame, mean and std across sessions of total_reward(_ma)."""
    import pandas as pd

    frames = []
    for t in trials:
        for s in range(int(spec["meta"]["max_session"])):
            uri = storage.join(predir_mod.session_dir(predir, t, s), "train_df.parquet")
            if storage.exists(uri):
                df = storage.read_parquet(uri)[["frame", "total_reward", "total_reward_ma"]]
                frames.append(df.assign(trial=t, session=s))
    if not frames:
        return
    df = pd.concat(frames)
    agg = df.groupby(["trial", "frame"])[["total_reward", "total_reward_ma"]].agg(["mean", "std"])
    agg.columns = [f"{a}_{b}" for a, b in agg.columns]
    storage.write_parquet(storage.join(predir, "info", "trial_df.parquet"), agg.reset_index())


def predir_mod_run_root(record_dir: str) -> str:
    """The run directory of a run.json's directory: the predir itself, or the parent of a ``t{T}`` dir."""
    return storage.dirname(record_dir) if re.fullmatch(r"t\d+", storage.basename(record_dir)) else record_dir


def record_sessions(record_dir: str) -> list[tuple[int, int]]:
    """(trial, session) of the session dirs a run.json in ``record_dir`` covers, sorted."""
    name = storage.basename(record_dir)
    if re.fullmatch(r"t\d+", name):
        trials = [(int(name[1:]), record_dir)]
    else:
        trials = [(int(n[1:]), storage.join(record_dir, n)) for n in storage.listdir(record_dir)
                  if re.fullmatch(r"t\d+", n)]
    return sorted((t, int(n[1:])) for t, tdir in trials for n in storage.listdir(tdir) if re.fullmatch(r"s\d+", n))


def check_session(predir: str, plan: SessionPlan) -> Selection:
    """Verify a session's checkpoints in the driver before it runs: the newest valid one is the truth.

    Collects debris of killed writers, sets aside newer checkpoints that fail verification (one
    warning on stderr and in the session's log.txt naming each, why, and the checkpoint used) and
    records them in ``plan.set_aside``. Call only while no actor writes this session (planning, or
    after its actor died).

    Returns:
        The selection (``frame`` None when no checkpoint verifies).

    Raises:
        CheckpointError: the store cannot be read, or a checkpoint of a newer format.
    """
    sdir = predir_mod.session_dir(predir, plan.trial, plan.session)
    store = CheckpointStore(sdir)
    store.collect_garbage()
    selection = store.select_latest()
    if selection.rejected:
        plan.set_aside += [r.to_json() for r in selection.rejected]
        text = f"warning: session {plan.key}: {selection.describe()}"
        print(text, file=sys.stderr)
        try:
            storage.append_text(storage.join(sdir, "log.txt"), f"[{now_iso()}] {text}\n")
        except (storage.StorageError, OSError):
            pass
    return selection


def export_committed(predir: str, plan: SessionPlan, selection: Selection) -> list[str]:
    """Make a session's user copies (train_df/eval_df parquet) equal to its checkpoint's.

    A driver killed between a session's last commit and its exports leaves older copies; the
    committed checkpoint is authoritative. Only files that differ are rewritten.

    Returns:
        Names of the files rewritten.

    Raises:
        storage.StorageError: a write failed.
    """
    sdir = predir_mod.session_dir(predir, plan.trial, plan.session)
    written = []
    for name in EXPORTED_FILES:
        if name not in selection.files:
            continue
        uri = storage.join(sdir, name)
        current = storage.read_bytes(uri) if storage.exists(uri) else None
        if current != selection.files[name]:
            storage.write_bytes(uri, selection.files[name])
            written.append(name)
    if written:
        print(f"session {plan.key}: {', '.join(written)} rewritten from its committed checkpoint at frame "
              f"{selection.frame}", file=sys.stderr)
    return written


def session_done(predir: str, plan: SessionPlan, max_frame: int) -> tuple[bool, Selection]:
    """Verify a session (``check_session``) and, if its newest valid checkpoint is at ``max_frame``
    (frames), mark ``plan`` done at that frame (the caller then re-exports with ``export_committed``).

    Returns:
        (done, selection).

    Raises:
        UsageError: its checkpoints cannot be read (names the session).
    """
    try:
        selection = check_session(predir, plan)
    except CheckpointError as err:
        raise UsageError(f"session {plan.key}: {err}") from None
    if selection.frame is None or selection.frame < max_frame:
        return False, selection
    plan.status, plan.frame = "done", selection.frame
    return True, selection


# ---------------------------------------------------------------- planning train / train@

def plan_fresh(spec: dict[str, Any], data_dir: str) -> tuple[str, list[SessionPlan]]:
    """A new predir with its spec files, and one fresh plan per session of trial 0."""
    if spec["meta"]["random_seed"] is None:
        import secrets
        spec["meta"]["random_seed"] = secrets.randbelow(2**31 - 1)
    base = spec["meta"]["random_seed"]
    seeds = [session_seed(base, 0, s) for s in range(spec["meta"]["max_session"])]
    predir = predir_mod.new_predir(data_dir, spec["name"])
    predir_mod.save_specs(predir, spec, 0, seeds)
    return predir, [SessionPlan(0, s, seed, resume=False) for s, seed in enumerate(seeds)]


def resolve_predir(target: str, data_dir: str, spec_name: str) -> str:
    """The predir of ``train@{target}``: ``latest`` or a path/URI of a run of ``spec_name``.

    Raises:
        UsageError: no such run, or a run of another spec.
    """
    if target == "latest":
        predir = predir_mod.latest_predir(data_dir, spec_name)
        if predir is None:
            raise UsageError(f"train@latest: no run of '{spec_name}' in data dir '{data_dir}'")
        return predir
    predir = storage.absolute(target.rstrip("/"))
    if not storage.is_dir(predir):
        raise UsageError(f"train@{target}: run directory '{predir}' does not exist")
    try:
        name = predir_mod.spec_name_of(predir)
    except ValueError as err:
        raise UsageError(f"train@{target}: {err}") from None
    if name != spec_name:
        raise UsageError(f"train@{target}: '{predir}' is a run of '{name}', not of '{spec_name}'")
    if not storage.exists(predir_mod.spec_file(predir, spec_name)):
        raise UsageError(missing_spec_message(f"train@{target}", predir, spec_name))
    return predir


def missing_spec_message(mode: str, predir: str, spec_name: str) -> str:
    """Why a run without its saved spec cannot resume, which spec files remain, and how to proceed."""
    missing = predir_mod.spec_file(predir, spec_name)
    left = sorted(n for n in storage.listdir(predir) if n.endswith("_spec.json"))
    text = (f"{mode}: the run's saved spec {missing} is missing (deleted or never written); a resume "
            f"needs it (it is the spec as run, edits included). Spec files left in the run: "
            f"{', '.join(left) or 'none'}. ")
    trial_spec = predir_mod.spec_file(predir, spec_name, 0)
    if storage.exists(storage.join(predir, "search.json")):
        return text + (f"The trial spec files hold sampled values, not the search: write the spec "
                       f"'{spec_name}' the search was started with (search section included) to {missing}")
    if storage.basename(trial_spec) in left:
        return text + (f"{storage.basename(trial_spec)} is the same spec plus \"trial\": 0 under \"meta\": "
                       f"copy it to {missing} and delete that key, then resume again")
    return text + f"Write the spec '{spec_name}' the run was started with to {missing}, then resume again"


def plan_resume(predir: str, merged: dict[str, Any], saved_sessions: int,
                allow_fresh: bool) -> tuple[list[SessionPlan], list[SessionPlan]]:
    """Plan one resumed actor per unfinished session of ``predir``, run with ``merged`` (``spec.resume_spec``: the
    saved spec with the edits given now); sessions from ``saved_sessions`` (the saved ``meta.max_session``) on
    are new ones.

    Each saved session is verified here, in the driver (``check_session``): its plan's ``frame`` is
    the frame of its newest checkpoint that verifies (newer corrupt ones are set aside, with a
    warning, and listed in ``set_aside``). A session whose valid checkpoint is at ``max_frame`` is
    done: its train_df/eval_df copies are re-exported from that checkpoint.

    Returns:
        (plans to run, plans of the sessions already done).

    Raises:
        UsageError: sessions with no valid checkpoint (unless ``allow_fresh``); unreadable checkpoints.
    """
    base, max_frame = merged["meta"]["random_seed"], merged["env"]["max_frame"]
    plans, done, missing = [], [], []
    for s in range(merged["meta"]["max_session"]):
        plan = SessionPlan(0, s, session_seed(base, 0, s), resume=False)
        if s >= saved_sessions:  # max_session raised: a fresh session
            plans.append(plan)
            continue
        is_done, selection = session_done(predir, plan, max_frame)
        if is_done:
            done.append((plan, selection))
            continue
        if selection.frame is None and not allow_fresh:
            bad = selection.rejected or selection.earlier_corrupt
            missing.append(plan.key + (" (every checkpoint failed verification, set aside as .corrupt-*)"
                                       if bad else ""))
        plan.resume, plan.frame = selection.frame is not None, selection.frame or 0
        plans.append(plan)
    if missing:
        raise UsageError(f"train@{predir}: no committed checkpoint for session(s) {', '.join(missing)}; "
                         "pass --allow-fresh to start them from frame 0")
    for plan, selection in done:
        export_committed(predir, plan, selection)
    return plans, [plan for plan, _ in done]


def record_resume(predir: str, spec: dict[str, Any], plans: list[SessionPlan], applied: list[str],
                  done: list[SessionPlan] | None = None) -> RunRecord:
    """Save the edited spec (if any edit applied), append the resume to run.json's history, and
    record the sessions found done (status, frame and checkpoint from their committed checkpoint).

    ``from_frames`` holds the frame each session is actually restored from; ``set_aside`` (present
    when any) the checkpoints set aside as corrupt per session.

    Returns:
        The run's record (written).

    Raises:
        storage.StorageError: a write failed.
    """
    record = RunRecord.load_or_new(predir, spec["name"])
    if applied:
        storage.write_json(predir_mod.spec_file(predir, spec["name"]), spec)
    entry = {"at": now_iso(), "spec_edits": applied, "from_frames": {p.key: p.frame for p in plans}}
    done = done or []
    set_aside = {p.key: p.set_aside for p in [*plans, *done] if p.set_aside}
    if set_aside:
        entry["set_aside"] = set_aside
    if plans or set_aside:  # a resume with nothing to do (and nothing set aside) leaves no entry
        record.data["resumes"].append(entry)
    for plan in done:
        record.update(plan, checkpoint=plan.frame)
    for line in applied:
        print(f"applied spec edit: {line}")
    return record


def run_with_signals(trial: Trial, spec: dict[str, Any]) -> int:
    """Run a trial; SIGINT/SIGTERM ask for final checkpoints, a second one exits at once.

    Handlers are installed only from the main thread (elsewhere Python forbids it).
    """
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def on_signal(signum: int, frame: Any) -> None:
        if trial.stop_requested:  # second signal: leave at once
            os._exit(1)
        print(f"\n{signal.Signals(signum).name}: committing final checkpoints "
              f"(up to {spec['meta']['shutdown_grace_s']} s; again to exit at once)", file=sys.stderr)
        trial.stop_requested = True  # acted on by the watch loop (Trial.watch_all), not here

    in_main = threading.current_thread() is threading.main_thread()
    for sig in previous if in_main else ():
        signal.signal(sig, on_signal)
    try:
        return trial.run()
    finally:
        for sig, handler in previous.items() if in_main else ():
            signal.signal(sig, handler)


def refuse_dev_run(predir: str, mode: str) -> None:
    """Refuse to resume a ``dev`` run: its run.json says ``"mode": "dev"`` (or, written before that
    marker, it has a train_df but no run.json). It has no checkpoints; resuming it would turn it
    into a train run in place.

    Raises:
        UsageError: ``predir`` is a dev run (nothing is written).
    """
    run_uri, sdir = storage.join(predir, "run.json"), predir_mod.session_dir(predir, 0, 0)
    try:
        data = storage.read_json(run_uri)
        dev = isinstance(data, dict) and data.get("mode") == "dev"
    except FileNotFoundError:  # written before the marker: a train_df and no checkpoint at all
        dev = storage.exists(storage.join(sdir, "train_df.parquet")) and not CheckpointStore(sdir).frames()
    except (ValueError, UnicodeDecodeError):  # damaged: RunRecord.load_or_new rebuilds it with a warning
        dev = False
    if dev:
        from orchestrator.cli import lab_command
        name = predir_mod.spec_name_of(predir)
        raise UsageError(f"{mode}: '{predir}' is a dev run, which has no checkpoints and cannot be resumed; "
                         f"start a train run instead: {lab_command(predir_mod.spec_file(predir, name), name, 'train')}")


def run_train(args: argparse.Namespace, checked: Callable[[], dict[str, Any]] | None = None) -> int:
    """``train`` and ``train@...`` modes (see module docstring); returns the exit code.

    ``checked``: for ``train``, the spec check already started (``orchestrator.spec_check.start``); started
    here when None.

    The driver holds the run's lease (``orchestrator.lease``) from before it reads the run until it
    exits, so a second driver on the same run exits 2 naming this one.

    Raises:
        UsageError / SpecError: bad input (exit 2), including a run held by another live driver.
    """
    args.data_dir = storage.absolute(args.data_dir)  # actors may run in another working directory
    if args.mode == "train":
        checked = checked or spec_check.start(spec_check.request_of(args))  # a child process checks while Ray starts
        init_ray(args.address, getattr(args, "dashboard", False))
        new_spec = checked()["spec"]
        check_resources(new_spec["meta"])
        predir, plans = plan_fresh(new_spec, args.data_dir)
        with Lease(predir, args.mode) as lease:
            record = RunRecord.load_or_new(predir, new_spec["name"])
            print(f"{args.mode}: {predir} ({len(plans)} session(s))")
            return run_with_signals(Trial(new_spec, predir, plans, record, quiet=args.quiet, lease=lease), new_spec)
    try:
        predir = resolve_predir(args.mode.split("@", 1)[1], args.data_dir, args.spec_name)
        if storage.exists(storage.join(predir, "search.json")):
            raise UsageError(f"{args.mode}: '{predir}' is a search; resume it with search@{predir}")
        refuse_dev_run(predir, args.mode)  # before the lease: a dev run stays byte-identical
    except UsageError:
        spec_check.start(spec_check.request_of(args))()  # a bad spec is named first (e.g. an env not installed)
        raise
    # the given spec's check and its merge into the saved spec, in a child process while Ray starts
    checked = spec_check.start(spec_check.request_of(args, resume=predir))
    with Lease(predir, args.mode) as lease:
        return resume_train(args, predir, checked, lease)


def resume_train(args: argparse.Namespace, predir: str, checked: Callable[[], dict[str, Any]], lease: Lease) -> int:
    """``train@{predir}`` once the lease is held: start Ray, take the merged spec from ``checked``
    (``spec_check.start``), verify and plan the sessions, record, run; returns the exit code.

    Raises:
        UsageError / SpecError: a bad spec or an edit that contradicts the run's past (``spec.resume_spec``),
            and see ``plan_resume``; nothing in the run is changed then.
    """
    init_ray(args.address, getattr(args, "dashboard", False))
    answer = checked()
    spec, applied = answer["spec"], answer["applied"]
    plans, done = plan_resume(predir, spec, answer["saved_sessions"], args.allow_fresh)
    check_resources(spec["meta"])
    record = record_resume(predir, spec, plans, applied, done)
    if not plans:
        print(f"nothing to resume: every session of {predir} is at max_frame")
        record.save()
        if done:
            aggregate_trial(predir, spec, [0])
        return 0
    total = int(spec["meta"]["max_session"])
    print(f"{args.mode}: {predir} ({len(plans)} of {total} sessions to resume, {total - len(plans)} done)")
    return run_with_signals(Trial(spec, predir, plans, record, quiet=args.quiet, lease=lease), spec)
