"""Trials on Ray: ``train`` starts one ``SessionActor`` per session; ``train@{predir|latest}`` resumes.

The driver plans the sessions, starts their actors in parallel, watches their event streams with
``ray.wait`` (timeout in seconds), keeps ``run.json`` up to date, restarts an actor that died (its
process or node was lost) from the session's newest checkpoint up to ``meta.max_restarts`` times,
marks a session whose code raised as ``failed`` (siblings continue), and at the end aggregates
``info/trial_df.parquet`` (mean and std of returns across sessions per frame).

SIGINT/SIGTERM to the driver asks every session to commit a final checkpoint within
``meta.shutdown_grace_s`` seconds and prints the command that resumes the run; a second signal
exits at once (committed checkpoints are never half-written).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

import ray
from ray.exceptions import RayActorError, RayTaskError

from orchestrator import predir as predir_mod
from orchestrator import storage
from orchestrator.checkpoint import CheckpointStore
from orchestrator.errors import UsageError
from orchestrator.progress import SessionProgress
from orchestrator.session_actor import SessionActor
from orchestrator.spec import SpecError, check, load_spec, resume_edits, session_seed


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

    @property
    def key(self) -> str:
        return f"t{self.trial}_s{self.session}"


def now_iso() -> str:
    """Current UTC time, ISO 8601."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def versions() -> dict[str, str]:
    """Versions of the libraries a run depends on (written to run.json)."""
    import gymnasium
    import numpy
    import torch
    return {"python": sys.version.split()[0], "ray": ray.__version__, "torch": torch.__version__,
            "gymnasium": gymnasium.__version__, "numpy": numpy.__version__}


def init_ray(address: str | None) -> None:
    """Join ``address`` / ``RAY_ADDRESS`` or start a local Ray (no-op if already initialized)."""
    if ray.is_initialized():
        return
    ray.init(address=address or os.environ.get("RAY_ADDRESS") or "local", include_dashboard=False,
             log_to_driver=False, logging_level="ERROR")


def check_resources(meta: dict[str, Any]) -> None:
    """Refuse per-session resources that can never fit the cluster (instead of waiting forever).

    Raises:
        UsageError: naming what was asked and what exists.
    """
    total = ray.cluster_resources()
    res = meta["resources"]
    for key, name in (("num_cpus", "CPU"), ("num_gpus", "GPU")):
        asked = float(res.get(key, 0) or 0)
        if asked > float(total.get(name, 0)):
            raise UsageError(f"meta.resources.{key}={asked} per session can never fit: the Ray cluster has "
                             f"{total.get(name, 0)} {name} in total")


class RunRecord:
    """``run.json`` of a predir (DESIGN.md section 7), written atomically on each change."""

    def __init__(self, predir: str, data: dict[str, Any]) -> None:
        self.uri, self.data = storage.join(predir, "run.json"), data

    @classmethod
    def load_or_new(cls, predir: str, spec_name: str) -> "RunRecord":
        """Read an existing run.json or start a new record."""
        uri = storage.join(predir, "run.json")
        if storage.exists(uri):
            return cls(predir, storage.read_json(uri))
        return cls(predir, {"spec_name": spec_name, "created": now_iso(), "versions": versions(),
                            "sessions": {}, "resumes": []})

    def update(self, plan: SessionPlan, checkpoint: int | None = None) -> None:
        """Record a session's status, frame, restarts and error; write the file."""
        entry = self.data["sessions"].setdefault(plan.key, {})
        entry.update({"status": plan.status, "frame": plan.frame, "seed": plan.seed,
                      "restarts": entry.get("restarts", []) + plan.restarts[len(entry.get("restarts", [])):],
                      "error": plan.error})
        if checkpoint is not None:
            entry["checkpoint"] = checkpoint
        self.save()

    def save(self) -> None:
        """Write run.json atomically."""
        storage.write_json(self.uri, self.data)


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
    """

    def __init__(self, spec: dict[str, Any], predir: str, plans: list[SessionPlan], record: RunRecord,
                 quiet: bool = False,
                 on_log: Callable[[SessionPlan, dict[str, Any]], None] | None = None,
                 analyze: bool = True) -> None:
        self.spec, self.predir, self.plans, self.record, self.quiet = spec, predir, plans, record, quiet
        self.on_log, self.analyze = on_log, analyze
        self.meta = spec["meta"]
        self.actors: dict[str, Any] = {}
        self.streams: dict[str, Any] = {}
        self.pending_restart: dict[str, float] = {}  # key -> monotonic time to restart at
        self.stopping_since: float | None = None
        self.checkpoint_seconds: list[float] = []
        self.progress = SessionProgress(disable=True)  # the live display, once run() starts

    # ---------------------------------------------------------------- actors
    def start(self, plan: SessionPlan) -> None:
        """Start (or restart) the actor of a session and its event stream."""
        res = self.meta["resources"]
        num_cpus = float(res.get("num_cpus", 1) or 0)
        actor = SessionActor.options(num_cpus=num_cpus, num_gpus=float(res.get("num_gpus", 0) or 0)).remote(
            self.spec, self.predir, plan.trial, plan.session, plan.seed, plan.resume, max(1, int(num_cpus)))
        self.actors[plan.key], self.streams[plan.key] = actor, actor.run.remote()
        plan.status = "running"
        self.record.update(plan)

    def request_stop(self) -> None:
        """Ask every running session to commit a final checkpoint and stop; a session whose actor
        has not started yet (still waiting for resources) is not started at all: ``not started``."""
        if self.stopping_since is None:
            self.stopping_since = time.monotonic()
            by_key = {p.key: p for p in self.plans}
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
            for plan in self.plans:
                self.start(plan)
            while self.streams or self.pending_restart:
                self.restart_due(by_key)
                if self.stopping_since is not None and \
                        time.monotonic() - self.stopping_since > float(self.meta["shutdown_grace_s"]):
                    break
                if not self.streams:
                    time.sleep(0.2)
                    continue
                ready, _ = ray.wait(list(self.streams.values()), num_returns=1, timeout=1.0)
                for stream in ready:
                    key = next(k for k, s in self.streams.items() if s is stream)
                    self.next_event(by_key[key], stream)
        return self.finish()

    def release(self, plan: SessionPlan) -> None:
        """Drop a finished session's stream and actor handle, so Ray ends the actor and frees its
        resources for sessions still waiting."""
        self.streams.pop(plan.key, None)
        actor = self.actors.pop(plan.key, None)
        if actor is not None:
            ray.kill(actor)

    def next_event(self, plan: SessionPlan, stream: Any) -> None:
        """Take one event of a session's stream and act on it."""
        try:
            event = ray.get(next(stream))
        except StopIteration:
            self.release(plan)
            return
        except RayTaskError as err:  # the session's code raised: a bug, not a fault; no retry
            self.release(plan)
            plan.status, plan.error = "failed", str(err)
            self.progress.status(plan.key, "failed")
            self.record.update(plan)
            self.log_error(plan, str(err))
            return
        except RayActorError as err:  # process or node died: restart from the newest checkpoint
            self.release(plan)
            self.on_actor_died(plan, err)
            return
        self.handle(plan, event)

    def handle(self, plan: SessionPlan, event: dict[str, Any]) -> None:
        """Update progress and run.json from one session event."""
        kind = event["kind"]
        if kind == "log":
            plan.frame = int(event["row"]["frame"])
            self.progress.update(plan.key, event["row"], int(self.spec["env"]["max_frame"]))
            if self.on_log is not None:
                self.on_log(plan, event["row"])
        elif kind == "checkpoint_failed":
            self.progress.status(plan.key, f"checkpoint failed at {event['frame']}")
        elif kind == "checkpoint":
            plan.frame = int(event["frame"])
            self.checkpoint_seconds.append(float(event["seconds"]))
            self.record.update(plan, checkpoint=plan.frame)
        elif kind == "started":
            self.record.data["sessions"][plan.key]["pid"] = event["pid"]
            if event.get("tracking"):  # the session's W&B/MLflow run (also in t{T}/s{S}/tracking.json)
                self.record.data["sessions"][plan.key]["tracking"] = event["tracking"]
            self.record.update(plan)
        elif kind in ("done", "interrupted"):
            plan.status, plan.frame = kind, int(event["frame"])
            if not event["checkpoint"]:
                plan.error = f"no checkpoint could be committed at frame {plan.frame} (see log.txt)"
            self.progress.status(plan.key, kind)
            self.record.update(plan, checkpoint=plan.frame if event["checkpoint"] else None)

    def on_actor_died(self, plan: SessionPlan, err: Exception) -> None:
        """Schedule a replacement actor with back-off, or mark the session failed."""
        max_restarts = int(self.meta["max_restarts"])
        if self.stopping_since is not None or len(plan.restarts) >= max_restarts:
            plan.status = "failed"
            plan.error = f"session actor died {len(plan.restarts) + 1} times (max_restarts={max_restarts}): " \
                         f"{type(err).__name__}"
            self.progress.status(plan.key, "failed")
            self.record.update(plan)
            return
        store = CheckpointStore(predir_mod.session_dir(self.predir, plan.trial, plan.session))
        frames = store.frames()
        plan.resume = bool(frames)
        restored = frames[-1] if frames else 0
        plan.restarts.append({"at": now_iso(), "frame_restored": restored,
                              "frames_lost": max(0, plan.frame - restored), "reason": type(err).__name__})
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
            print("\n".join([f"trial done: {self.predir}", *(summary_lines(self.predir, out) if out else [])]))
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
    if name != spec_name or not storage.exists(predir_mod.spec_file(predir, spec_name)):
        raise UsageError(f"train@{target}: '{predir}' is a run of '{name}', not of '{spec_name}'")
    return predir


def plan_resume(predir: str, new_spec: dict[str, Any],
                allow_fresh: bool) -> tuple[dict[str, Any], list[SessionPlan], list[str]]:
    """Merge spec edits and plan one resumed actor per unfinished session.

    Returns:
        (spec to run, plans, applied edits).

    Raises:
        SpecError: edits that contradict the past (each key with both values).
        UsageError: sessions with no committed checkpoint (unless ``allow_fresh``).
    """
    saved = storage.read_json(predir_mod.spec_file(predir, new_spec["name"]))
    merged, applied, conflicts = resume_edits(saved, new_spec)
    if conflicts:
        raise SpecError([f"cannot resume {predir}: the spec contradicts the run's past"] + conflicts)
    merged = check(merged)
    base, max_frame = merged["meta"]["random_seed"], merged["env"]["max_frame"]
    plans, missing = [], []
    for s in range(merged["meta"]["max_session"]):
        seed = session_seed(base, 0, s)
        if s >= saved["meta"]["max_session"]:  # max_session raised: a fresh session
            plans.append(SessionPlan(0, s, seed, resume=False))
            continue
        frames = CheckpointStore(predir_mod.session_dir(predir, 0, s)).frames()
        if frames and frames[-1] >= max_frame:
            continue  # already at max_frame
        if not frames and not allow_fresh:
            missing.append(f"t0_s{s}")
        plans.append(SessionPlan(0, s, seed, resume=bool(frames), frame=frames[-1] if frames else 0))
    if missing:
        raise UsageError(f"train@{predir}: no committed checkpoint for session(s) {', '.join(missing)}; "
                         "pass --allow-fresh to start them from frame 0")
    return merged, plans, applied


def record_resume(predir: str, spec: dict[str, Any], plans: list[SessionPlan], applied: list[str]) -> RunRecord:
    """Save the edited spec (if any edit applied) and append the resume to run.json's history."""
    record = RunRecord.load_or_new(predir, spec["name"])
    if applied:
        storage.write_json(predir_mod.spec_file(predir, spec["name"]), spec)
    if plans:  # a resume with nothing to do leaves no entry
        record.data["resumes"].append({"at": now_iso(), "spec_edits": applied,
                                       "from_frames": {p.key: p.frame for p in plans}})
    for line in applied:
        print(f"applied spec edit: {line}")
    return record


def run_with_signals(trial: Trial, spec: dict[str, Any]) -> int:
    """Run a trial; SIGINT/SIGTERM ask for final checkpoints, a second one exits at once.

    Handlers are installed only from the main thread (elsewhere Python forbids it).
    """
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def on_signal(signum: int, frame: Any) -> None:
        if trial.stopping_since is not None:  # second signal: leave at once
            os._exit(1)
        print(f"\n{signal.Signals(signum).name}: committing final checkpoints "
              f"(up to {spec['meta']['shutdown_grace_s']} s; again to exit at once)", file=sys.stderr)
        trial.request_stop()

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
    run_uri = storage.join(predir, "run.json")
    if storage.exists(run_uri):
        dev = storage.read_json(run_uri).get("mode") == "dev"
    else:
        dev = storage.exists(storage.join(predir_mod.session_dir(predir, 0, 0), "train_df.parquet"))
    if dev:
        from orchestrator.cli import lab_command
        name = predir_mod.spec_name_of(predir)
        raise UsageError(f"{mode}: '{predir}' is a dev run, which has no checkpoints and cannot be resumed; "
                         f"start a train run instead: {lab_command(predir_mod.spec_file(predir, name), name, 'train')}")


def run_train(args: argparse.Namespace) -> int:
    """``train`` and ``train@...`` modes (see module docstring); returns the exit code."""
    new_spec = load_spec(args.spec_file, args.spec_name, args.overrides)
    args.data_dir = storage.absolute(args.data_dir)  # actors may run in another working directory
    resume = args.mode != "train"
    if resume:
        predir = resolve_predir(args.mode.split("@", 1)[1], args.data_dir, args.spec_name)
        if storage.exists(storage.join(predir, "search.json")):
            raise UsageError(f"{args.mode}: '{predir}' is a search; resume it with search@{predir}")
        refuse_dev_run(predir, args.mode)
        spec, plans, applied = plan_resume(predir, new_spec, args.allow_fresh)
    else:
        spec = new_spec
    init_ray(args.address)
    check_resources(spec["meta"])
    if resume:
        record = record_resume(predir, spec, plans, applied)
        if not plans:
            print(f"nothing to resume: every session of {predir} is at max_frame")
            record.save()
            return 0
    else:
        predir, plans = plan_fresh(spec, args.data_dir)
        record = RunRecord.load_or_new(predir, spec["name"])
    if resume:
        total = int(spec["meta"]["max_session"])
        print(f"{args.mode}: {predir} ({len(plans)} of {total} sessions to resume, {total - len(plans)} done)")
    else:
        print(f"{args.mode}: {predir} ({len(plans)} session(s))")
    return run_with_signals(Trial(spec, predir, plans, record, quiet=args.quiet), spec)
