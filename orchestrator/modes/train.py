"""The ``train`` and ``train@{predir|latest}`` modes: plan a new run or verify and resume a saved one, hold its lease,
run its trial.

``train --name RUN`` runs in ``{data_dir}/{RUN}``: a new run there, or, when it holds a run of the same spec, a
resume of it as ``train@`` would (sessions without a committed checkpoint start fresh with their seeds; a
complete run is left unchanged, exit 0), so a scheduler can re-run the same command after any interruption.
Every resume applies the run's saved ``-s`` overrides (``overrides.json``) before the ones given now."""

from __future__ import annotations

import sys
from typing import Any, Callable

from orchestrator.commandline import Command, mode_header, typed_options
from orchestrator.errors import UsageError
from orchestrator.modes import spec_check
from orchestrator.modes.common import (
    check_named,
    draw_seed,
    refuse_dev_run,
    resolve_predir,
    resolve_session_batch,
    with_saved_overrides,
)
from orchestrator.runtime.ray_start import check_resources, init_ray
from orchestrator.runtime.signals import STOP, pause_point
from orchestrator.spec.meta import MetaSpec
from orchestrator.store import predir as predir_mod
from orchestrator.store import storage
from orchestrator.store.lease import Lease
from orchestrator.store.predir import session_seed
from orchestrator.store.record import RunRecord, SessionPlan, now_iso
from orchestrator.trial import Trial, aggregate_trial
from orchestrator.verify import export_committed, inexact_note, session_done


def plan_fresh(spec: dict[str, Any], data_dir: str, predir: str | None = None) -> tuple[str, list[SessionPlan]]:
    """A new predir (``predir`` when given, e.g. of ``--name``) with its spec files, and one fresh plan per session
    of trial 0 (``meta.random_seed`` drawn into ``spec`` when unset)."""
    base = draw_seed(spec)
    seeds = [session_seed(base, 0, s) for s in range(MetaSpec.of(spec).max_session)]
    predir = predir or predir_mod.new_predir(data_dir, spec["name"])
    predir_mod.save_specs(predir, spec, 0, seeds)
    return predir, [SessionPlan(0, s, seed, resume=False) for s, seed in enumerate(seeds)]


def plan_resume(predir: str, merged: dict[str, Any], saved_sessions: int, allow_fresh: bool,
                export: bool = True) -> tuple[list[SessionPlan], list[SessionPlan]]:
    """Plan one resumed actor per unfinished session of ``predir``, run with ``merged`` (``spec.resume_spec``: the
    saved spec with the edits given now); sessions from ``saved_sessions`` (the saved ``meta.max_session``) on
    are new ones.

    Each saved session is verified here, in the driver (``check_session``): its plan's ``frame`` is
    the frame of its newest checkpoint that verifies (newer corrupt ones are set aside, with a
    warning, and listed in ``set_aside``). A session whose valid checkpoint is at ``max_frame`` is
    done: its train_df/eval_df copies are re-exported from that checkpoint. When any session resumes from an
    ``exact: false`` checkpoint, one line on stderr says which and why (``verify.inexact_note``).

    Returns:
        (plans to run, plans of the sessions already done).

    Raises:
        UsageError: sessions with no valid checkpoint (unless ``allow_fresh``); unreadable checkpoints.
    """
    meta, max_frame = MetaSpec.of(merged), merged["env"]["max_frame"]
    plans, done, missing, restored = [], [], [], []
    for s in range(meta.max_session):
        pause_point("verify")  # test hook (orchestrator.runtime.signals)
        plan = SessionPlan(0, s, session_seed(meta.random_seed, 0, s), resume=False)
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
        restored.append((plan.key, selection))
    if missing:
        raise UsageError(f"train@{predir}: no committed checkpoint for session(s) {', '.join(missing)}; "
                         "pass --allow-fresh to start them from frame 0")
    for plan, selection in done if export else ():
        export_committed(predir, plan, selection)
    note = inexact_note(restored)
    if note:
        print(note, file=sys.stderr)
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


def run_train(cmd: Command, checked: Callable[[], dict[str, Any]] | None = None) -> int:
    """``train`` and ``train@...`` modes (see module docstring); returns the exit code.

    ``checked``: for ``train``, the spec check already started (``orchestrator.modes.spec_check.start``); started
    here when None.

    The driver holds the run's lease (``orchestrator.store.lease``) from before it reads the run until it
    exits, so a second driver on the same run exits 2 naming this one.

    Raises:
        UsageError / SpecError: bad input (exit 2), including a run held by another live driver.
    """
    if cmd.name:
        return run_named(cmd)
    if cmd.target is None:
        checked = checked or spec_check.start(spec_check.request_of(cmd))  # a child process checks while Ray starts
        init_ray(cmd.address, cmd.dashboard)
        new_spec = checked()["spec"]
        resolve_session_batch(new_spec)
        check_fits(new_spec)
        with STOP.deferred():  # the new run's files are written whole
            predir, plans = plan_fresh(new_spec, cmd.data_dir)
            if cmd.overrides:
                predir_mod.save_overrides(predir, list(cmd.overrides))
        with Lease(predir, cmd.word) as lease:
            record = RunRecord.load_or_new(predir, new_spec["name"])
            print(f"{mode_header(cmd.word, predir)} ({len(plans)} session(s))")
            return Trial(new_spec, predir, plans, record, quiet=cmd.quiet, lease=lease).run()
    try:
        predir = resolve_predir(cmd.target, cmd.data_dir, cmd.spec_name)
        if storage.exists(storage.join(predir, "search.json")):
            raise UsageError(f"{cmd.word}: '{predir}' is a search; resume it with search@{predir}")
        refuse_dev_run(predir, cmd.word, cmd)  # before the lease: a dev run stays byte-identical
    except UsageError:
        spec_check.start(spec_check.request_of(cmd))()  # a bad spec is named first (e.g. an env not installed)
        raise
    with Lease(predir, cmd.word) as lease:
        return resume_train(cmd, predir, lease, cmd.allow_fresh)


def check_fits(spec: dict[str, Any]) -> None:
    """``ray_start.check_resources`` of one session of ``spec`` on the Ray cluster.

    Raises:
        UsageError: its ``meta.resources`` can never fit.
    """
    meta = MetaSpec.of(spec)
    check_resources(meta.resources, meta.max_session)


def run_named(cmd: Command) -> int:
    """``train --name RUN`` (see the module docstring): the lease of ``{data_dir}/{RUN}`` (waiting for a
    predecessor's lease to go stale, ``Lease(wait=True)``), then a fresh run or a resume; returns the exit code.

    Raises:
        UsageError / SpecError: bad input (exit 2), see ``check_named``.
    """
    predir = predir_mod.named_predir(cmd.data_dir, cmd.name)
    spec = None
    if not check_named(cmd, predir, search=False):  # a new run: its spec is checked before anything is written
        checked = spec_check.start(spec_check.request_of(cmd))  # a child process checks while Ray starts
        init_ray(cmd.address, cmd.dashboard)
        spec = checked()["spec"]
        resolve_session_batch(spec)
        check_fits(spec)
    storage.makedirs(predir)
    with Lease(predir, f"train --name {cmd.name}", wait=True) as lease:
        if check_named(cmd, predir, search=False):  # under the lease: a predecessor may have just started it
            return resume_train(cmd, predir, lease, allow_fresh=True, complete_unchanged=True)
        if spec is None:  # the run was there, and is gone now
            spec = spec_check.start(spec_check.request_of(cmd))()["spec"]
            init_ray(cmd.address, cmd.dashboard)  # a no-op when started above
            resolve_session_batch(spec)
        with STOP.deferred():  # the new run's files are written whole
            _, plans = plan_fresh(spec, cmd.data_dir, predir)
            if cmd.overrides:
                predir_mod.save_overrides(predir, list(cmd.overrides))
            record = RunRecord.load_or_new(predir, spec["name"])
        print(f"train --name {cmd.name}: {predir} ({len(plans)} session(s))")
        return Trial(spec, predir, plans, record, quiet=cmd.quiet, lease=lease).run()


def resume_train(cmd: Command, predir: str, lease: Lease, allow_fresh: bool, complete_unchanged: bool = False) -> int:
    """``train@{predir}`` once the lease is held: check the given spec (its saved ``-s`` overrides first) and merge
    it into the saved one in a child process while Ray starts, verify and plan the sessions, record, run; returns
    the exit code. ``allow_fresh``: sessions without a committed checkpoint start from frame 0.
    ``complete_unchanged``: a run whose sessions are all done, with no edit given, is left as it is (``--name``).

    Raises:
        UsageError / SpecError: a bad spec or an edit that contradicts the run's past (``spec.resume_spec``),
            and see ``plan_resume``; nothing in the run is changed then.
    """
    overrides = with_saved_overrides(cmd, predir)
    checked = spec_check.start(spec_check.request_of(cmd, overrides, resume=predir))
    # Ray starts while the child checks, unless the run looks complete: then the answer comes without Ray
    if not (complete_unchanged and not cmd.overrides and recorded_done(predir)):
        init_ray(cmd.address, cmd.dashboard)
    answer = checked()
    spec, applied = answer["spec"], answer["applied"]
    plans, done = plan_resume(predir, spec, answer["saved_sessions"], allow_fresh,
                              export=not (complete_unchanged and not applied))
    if complete_unchanged and not plans and not applied and not any(p.set_aside for p in done):
        print(complete_note(cmd, predir, spec["env"]["max_frame"]))
        return 0
    init_ray(cmd.address, cmd.dashboard)  # a no-op when started above
    check_fits(spec)
    if cmd.overrides and applied:
        predir_mod.save_overrides(predir, overrides)
    record = record_resume(predir, spec, plans, applied, done)
    if not plans:
        print(f"nothing to resume: every session of {predir} is at max_frame")
        record.save()
        if done:
            aggregate_trial(predir, spec, [0])
        return 0
    total = MetaSpec.of(spec).max_session
    print(f"{mode_header(cmd.word, predir)} ({len(plans)} of {total} sessions to resume, {total - len(plans)} done)")
    return Trial(spec, predir, plans, record, quiet=cmd.quiet, lease=lease).run()


def recorded_done(predir: str) -> bool:
    """Whether run.json records every session of ``predir`` as done (a cheap guess, verified after; False when
    run.json is missing or unreadable)."""
    try:
        data = storage.read_json(storage.join(predir, "run.json"))
    except (FileNotFoundError, ValueError, UnicodeDecodeError):  # a damaged one is named by RunRecord later
        return False
    sessions = data.get("sessions") if isinstance(data, dict) else None
    return bool(sessions) and all(isinstance(s, dict) and s.get("status") == "done" for s in sessions.values())


def complete_note(cmd: Command, predir: str, max_frame: int) -> str:
    """What ``train --name RUN`` says of a complete run it leaves as it is: its max_frame (the saved spec's, with the
    ``-s`` overrides the run was started with, which apply again) and how to train it longer."""
    saved = predir_mod.saved_overrides(predir)
    started = f" (the -s overrides it was started with apply again: {' '.join(typed_options(saved))})" if saved else ""
    return (f"{cmd.word} --name {cmd.name}: the run {predir} is already complete at its max_frame {max_frame}"
            f"{started}; nothing to do. To train it longer, run the same command with -s env.max_frame=N "
            f"(N > {max_frame})")
