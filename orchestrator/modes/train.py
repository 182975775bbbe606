"""The ``train`` and ``train@{predir|latest}`` modes: plan a new run or verify and resume a saved one, hold its lease,
run its trial.

``train --name RUN`` runs in ``{data_dir}/{RUN}``: a new run there, or, when it holds a run of the same spec, a
resume of it as ``train@`` would (sessions without a committed checkpoint start fresh with their seeds; a
complete run is left unchanged, exit 0), so a scheduler can re-run the same command after any interruption.
Every resume applies the run's saved ``-s`` overrides (``overrides.json``) before the ones given now."""

from __future__ import annotations

import argparse
from typing import Any, Callable

from orchestrator.commandline import lab_command, mode_header, typed_options
from orchestrator.errors import UsageError
from orchestrator.modes import spec_check
from orchestrator.runtime.ray_start import check_resources, init_ray
from orchestrator.runtime.signals import STOP
from orchestrator.store import predir as predir_mod
from orchestrator.store import storage
from orchestrator.store.checkpoint import CheckpointStore
from orchestrator.store.lease import Lease
from orchestrator.store.predir import session_seed
from orchestrator.store.record import RunRecord, SessionPlan, now_iso
from orchestrator.trial import Trial, aggregate_trial
from orchestrator.verify import export_committed, session_done


def plan_fresh(spec: dict[str, Any], data_dir: str, predir: str | None = None) -> tuple[str, list[SessionPlan]]:
    """A new predir (``predir`` when given, e.g. of ``--name``) with its spec files, and one fresh plan per session
    of trial 0."""
    if spec["meta"]["random_seed"] is None:
        import secrets
        spec["meta"]["random_seed"] = secrets.randbelow(2**31 - 1)
    base = spec["meta"]["random_seed"]
    seeds = [session_seed(base, 0, s) for s in range(spec["meta"]["max_session"])]
    predir = predir or predir_mod.new_predir(data_dir, spec["name"])
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
            raise UsageError(f"train@latest: no run of '{spec_name}' in data dir '{data_dir}'; to start a run that "
                             "the same command resumes after an interruption, use 'train --name RUN'")
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


def plan_resume(predir: str, merged: dict[str, Any], saved_sessions: int, allow_fresh: bool,
                export: bool = True) -> tuple[list[SessionPlan], list[SessionPlan]]:
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
    for plan, selection in done if export else ():
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


def refuse_dev_run(predir: str, mode: str, args: argparse.Namespace | None = None) -> None:
    """Refuse to resume a ``dev`` run: its run.json says ``"mode": "dev"`` (or, written before that
    marker, it has a train_df but no run.json). It has no checkpoints; resuming it would turn it
    into a train run in place. The message suggests a ``train`` of ``args``' spec file, name, ``-s`` overrides
    and data dir (as the user typed them), or of the run's saved spec without ``args``.

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
        name = predir_mod.spec_name_of(predir)
        # the user's spec file and overrides (the dev run's saved spec has meta.max_session rewritten to 1)
        typed = ([args.spec_file, args.spec_name, "train", *typed_options(args.overrides, args.data_dir)] if args
                 else [predir_mod.spec_file(predir, name), name, "train"])
        raise UsageError(f"{mode}: '{predir}' is a dev run, which has no checkpoints and cannot be resumed; "
                         f"start a train run instead: {lab_command(*typed)}")


def run_train(args: argparse.Namespace, checked: Callable[[], dict[str, Any]] | None = None) -> int:
    """``train`` and ``train@...`` modes (see module docstring); returns the exit code.

    ``checked``: for ``train``, the spec check already started (``orchestrator.modes.spec_check.start``); started
    here when None.

    The driver holds the run's lease (``orchestrator.store.lease``) from before it reads the run until it
    exits, so a second driver on the same run exits 2 naming this one.

    Raises:
        UsageError / SpecError: bad input (exit 2), including a run held by another live driver.
    """
    args.data_dir = storage.absolute(args.data_dir)  # actors may run in another working directory
    if getattr(args, "name", None):
        return run_named(args)
    if args.mode == "train":
        checked = checked or spec_check.start(spec_check.request_of(args))  # a child process checks while Ray starts
        init_ray(args.address, getattr(args, "dashboard", False))
        new_spec = checked()["spec"]
        check_resources(new_spec["meta"])
        with STOP.deferred():  # the new run's files are written whole
            predir, plans = plan_fresh(new_spec, args.data_dir)
            if args.overrides:
                predir_mod.save_overrides(predir, args.overrides)
        with Lease(predir, args.mode) as lease:
            record = RunRecord.load_or_new(predir, new_spec["name"])
            print(f"{mode_header(args.mode, predir)} ({len(plans)} session(s))")
            return Trial(new_spec, predir, plans, record, quiet=args.quiet, lease=lease).run()
    try:
        predir = resolve_predir(args.mode.split("@", 1)[1], args.data_dir, args.spec_name)
        if storage.exists(storage.join(predir, "search.json")):
            raise UsageError(f"{args.mode}: '{predir}' is a search; resume it with search@{predir}")
        refuse_dev_run(predir, args.mode, args)  # before the lease: a dev run stays byte-identical
    except UsageError:
        spec_check.start(spec_check.request_of(args))()  # a bad spec is named first (e.g. an env not installed)
        raise
    with Lease(predir, args.mode) as lease:
        return resume_train(args, predir, lease)


def check_named(args: argparse.Namespace, predir: str, search: bool) -> bool:
    """Whether ``predir`` (of ``--name``) holds a run to resume (False: absent or empty, start one).

    Raises:
        UsageError: it holds a run of another spec, a search where a train run is asked for (or the reverse), or
            a dev run.
    """
    if not predir_mod.has_run(predir):
        return False
    mode = f"{args.mode} --name {args.name}"
    try:
        name = predir_mod.spec_name_of(predir)
    except ValueError as err:
        raise UsageError(f"{mode}: {err}") from None
    if name != args.spec_name:
        raise UsageError(f"{mode}: '{predir}' holds a run of '{name}', not of '{args.spec_name}'; "
                         "choose another --name")
    is_search = storage.exists(storage.join(predir, "search.json"))
    if is_search != search:
        raise UsageError(f"{mode}: '{predir}' holds a {'search' if is_search else 'train run'}; resume it with "
                         f"'{'search' if is_search else 'train'} --name {args.name}'")
    refuse_dev_run(predir, mode)
    return True


def with_saved_overrides(args: argparse.Namespace, predir: str) -> list[str]:
    """Put the run's saved ``-s`` overrides before the ones given now in ``args.overrides``; returns those given now."""
    given = list(args.overrides)
    args.overrides = predir_mod.saved_overrides(predir) + given
    return given


def run_named(args: argparse.Namespace) -> int:
    """``train --name RUN`` (see the module docstring): the lease of ``{data_dir}/{RUN}`` (waiting for a
    predecessor's lease to go stale, ``Lease(wait=True)``), then a fresh run or a resume; returns the exit code.

    Raises:
        UsageError / SpecError: bad input (exit 2), see ``check_named``.
    """
    predir = predir_mod.named_predir(args.data_dir, args.name)
    spec = None
    if not check_named(args, predir, search=False):  # a new run: its spec is checked before anything is written
        checked = spec_check.start(spec_check.request_of(args))  # a child process checks while Ray starts
        init_ray(args.address, getattr(args, "dashboard", False))
        spec = checked()["spec"]
        check_resources(spec["meta"])
    storage.makedirs(predir)
    with Lease(predir, f"train --name {args.name}", wait=True) as lease:
        if check_named(args, predir, search=False):  # under the lease: a predecessor may have just started it
            args.allow_fresh = True
            return resume_train(args, predir, lease, complete_unchanged=True)
        if spec is None:  # the run was there, and is gone now
            spec = spec_check.start(spec_check.request_of(args))()["spec"]
        with STOP.deferred():  # the new run's files are written whole
            _, plans = plan_fresh(spec, args.data_dir, predir)
            if args.overrides:
                predir_mod.save_overrides(predir, args.overrides)
            record = RunRecord.load_or_new(predir, spec["name"])
        print(f"train --name {args.name}: {predir} ({len(plans)} session(s))")
        return Trial(spec, predir, plans, record, quiet=args.quiet, lease=lease).run()


def resume_train(args: argparse.Namespace, predir: str, lease: Lease, complete_unchanged: bool = False) -> int:
    """``train@{predir}`` once the lease is held: check the given spec (its saved ``-s`` overrides first) and merge
    it into the saved one in a child process while Ray starts, verify and plan the sessions, record, run; returns
    the exit code. ``complete_unchanged``: a run whose sessions are all done, with no edit given, is left as it
    is (``--name``).

    Raises:
        UsageError / SpecError: a bad spec or an edit that contradicts the run's past (``spec.resume_spec``),
            and see ``plan_resume``; nothing in the run is changed then.
    """
    given = with_saved_overrides(args, predir)
    checked = spec_check.start(spec_check.request_of(args, resume=predir))
    init_ray(args.address, getattr(args, "dashboard", False))
    answer = checked()
    spec, applied = answer["spec"], answer["applied"]
    plans, done = plan_resume(predir, spec, answer["saved_sessions"], args.allow_fresh,
                              export=not (complete_unchanged and not applied))
    check_resources(spec["meta"])
    if complete_unchanged and not plans and not applied and not any(p.set_aside for p in done):
        print(f"{args.mode} --name {args.name}: the run {predir} is already complete; nothing to do")
        return 0
    if given and applied:
        predir_mod.save_overrides(predir, args.overrides)
    record = record_resume(predir, spec, plans, applied, done)
    if not plans:
        print(f"nothing to resume: every session of {predir} is at max_frame")
        record.save()
        if done:
            aggregate_trial(predir, spec, [0])
        return 0
    total = int(spec["meta"]["max_session"])
    print(f"{mode_header(args.mode, predir)} ({len(plans)} of {total} sessions to resume, {total - len(plans)} done)")
    return Trial(spec, predir, plans, record, quiet=args.quiet, lease=lease).run()


