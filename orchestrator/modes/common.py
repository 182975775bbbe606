"""What several modes share: the preflight check before a mode starts, the run a ``@target`` or ``--name`` names
(``resolve_predir``, ``check_named``, ``refuse_dev_run``, ``is_dev_run``), a resumed run's saved ``-s`` overrides,
and the base seed of a new run. No mode imports another mode; each imports this module."""

from __future__ import annotations

import secrets
from typing import Any

from orchestrator.commandline import Command, lab_command, typed_options
from orchestrator.errors import UsageError
from orchestrator.spec.meta import MetaSpec, set_meta, with_meta
from orchestrator.store import predir as predir_mod
from orchestrator.store import storage
from orchestrator.store.checkpoint import CheckpointStore


def preflight(cmd: Command) -> None:
    """Load the spec ``cmd`` will run and run ``orchestrator.spec.preflight.check_spec`` on it; called by
    ``orchestrator.cli`` before every mode but ``train`` (whose driver checks in ``modes.spec_check``).

    ``enjoy@`` checks the session spec file it targets; ``search@`` checks the spec given (the env and sizes a resume
    keeps). With ``--address`` (a Ray cluster) sessions may run on other machines, so memory is checked for one
    session against this machine.

    Raises:
        SpecError / UsageError: as the mode itself would raise for a bad spec or target, and as ``check_spec``.
    """
    from orchestrator.spec.load import load_spec
    from orchestrator.spec.preflight import check_spec

    if cmd.mode == "enjoy":
        from orchestrator.spec.session_spec import parse_target, read_session_spec
        spec = read_session_spec(parse_target(cmd.target, cmd.ckpt)[0], cmd.spec_name)[0]
    else:
        spec = load_spec(cmd.spec_file, cmd.spec_name, list(cmd.overrides), search=cmd.mode == "search")
    check_spec(spec, "dev" if cmd.address is not None else cmd.mode, cmd.max_concurrent_trials)


def draw_seed(spec: dict[str, Any]) -> int:
    """``meta.random_seed`` of ``spec``, drawn once and written into it when unset, so the saved spec replays the
    run."""
    seed = MetaSpec.of(spec).random_seed
    if seed is None:
        seed = secrets.randbelow(2**31 - 1)
        set_meta(spec, random_seed=seed)
    return seed


def resolve_session_batch(spec: dict[str, Any], trials: int = 1) -> int | None:
    """``meta.session_batch: "auto"`` of a new run, resolved in place to the number it runs with and printed with
    the reason, once Ray is up (the saved spec holds the number, so every resume keeps it); other values are left.

    The trial's sessions share the session actors the cluster fits at once (``session_hosts.capacity`` of
    ``meta.resources``, all its CPUs or GPUs, in use or not): ``ceil(max_session * trials / slots)`` seeds per
    actor, at most ``max_session``, so every seed of ``trials`` trials running together gets a slot. 1 (separate
    sessions) where that already fits, and where seeds cannot run batched (``meta.distributed``, an
    agent ``agents.batched.batch_problem`` refuses).

    Args:
        spec: a checked spec of a new run.
        trials: trials that run at the same time (a search: ``max_trial``, or ``--max-concurrent-trials``; a PBT
            population: ``max_trial``).

    Returns:
        The number picked, or None when ``session_batch`` was not ``"auto"``.
    """
    if MetaSpec.of(spec).session_batch != "auto":
        return None
    from orchestrator.session_hosts import capacity, host_key
    from orchestrator.spec.load import session_batch_problems

    set_meta(spec, session_batch=1)
    meta = MetaSpec.of(spec)
    refusal = session_batch_problems(with_meta(spec, session_batch=2))
    if refusal:
        k, why = 1, refusal[0].removeprefix("meta.session_batch: 2 ").split("; set meta.session_batch")[0]
    elif meta.max_session == 1:
        k, why = 1, "one session per trial"
    else:
        slots, seeds = capacity(host_key(meta)), meta.max_session * trials
        k = min(meta.max_session, -(-seeds // slots))
        res = ", ".join(f"{v:g} {n}" for n, v in zip(("CPU", "GPU"), host_key(meta)) if v)
        why = (f"{seeds} session(s) of {trials} trial(s) at once, {slots} session actor(s) of {res} fit the "
               f"Ray cluster")
    set_meta(spec, session_batch=k)
    print(f"meta.session_batch auto: {k} ({why})")
    return k


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


def is_dev_run(predir: str) -> bool:
    """Whether ``predir`` is a ``dev`` run: its run.json says ``"mode": "dev"`` (or, written before that marker, it
    has a train_df but no run.json and no checkpoint); False for a damaged run.json."""
    run_uri, sdir = storage.join(predir, "run.json"), predir_mod.session_dir(predir, 0, 0)
    try:
        data = storage.read_json(run_uri)
        return isinstance(data, dict) and data.get("mode") == "dev"
    except FileNotFoundError:  # written before the marker: a train_df and no checkpoint at all
        return storage.exists(storage.join(sdir, "train_df.parquet")) and not CheckpointStore(sdir).frames()
    except (ValueError, UnicodeDecodeError):  # damaged: RunRecord.load_or_new rebuilds it with a warning
        return False


def dev_run_hint(predir: str, cmd: Command | None = None) -> str:
    """The ``train`` command to run instead of using the dev run ``predir``: ``cmd``'s spec file, name, ``-s``
    overrides and data dir (as the user typed them), or without ``cmd`` the run's saved spec (with meta.max_session
    rewritten to 1) and its data dir."""
    name = predir_mod.spec_name_of(predir)
    typed = ([cmd.spec_file, cmd.spec_name, "train", *typed_options(list(cmd.overrides), cmd.data_dir)] if cmd
             else [predir_mod.spec_file(predir, name), name, "train", *typed_options([], storage.dirname(predir))])
    return lab_command(*typed)


def refuse_dev_run(predir: str, mode: str, cmd: Command | None = None) -> None:
    """Refuse to resume a ``dev`` run: its run.json says ``"mode": "dev"`` (or, written before that
    marker, it has a train_df but no run.json). It has no checkpoints; resuming it would turn it
    into a train run in place. The message suggests a ``train`` of ``cmd``'s spec file, name, ``-s`` overrides
    and data dir (as the user typed them), or of the run's saved spec without ``cmd``.

    Raises:
        UsageError: ``predir`` is a dev run (nothing is written).
    """
    if is_dev_run(predir):
        raise UsageError(f"{mode}: '{predir}' is a dev run, which has no checkpoints and cannot be resumed; "
                         f"start a train run instead: {dev_run_hint(predir, cmd)}")


def check_named(cmd: Command, predir: str, search: bool) -> bool:
    """Whether ``predir`` (of ``--name``) holds a run to resume (False: absent or empty, start one).

    Raises:
        UsageError: it holds a run of another spec, a search where a train run is asked for (or the reverse), or
            a dev run.
    """
    if not predir_mod.has_run(predir):
        return False
    mode = f"{cmd.word} --name {cmd.name}"
    try:
        name = predir_mod.spec_name_of(predir)
    except ValueError as err:
        raise UsageError(f"{mode}: {err}") from None
    if name != cmd.spec_name:
        raise UsageError(f"{mode}: '{predir}' holds a run of '{name}', not of '{cmd.spec_name}'; "
                         "choose another --name")
    is_search = storage.exists(storage.join(predir, "search.json"))
    if is_search != search:
        raise UsageError(f"{mode}: '{predir}' holds a {'search' if is_search else 'train run'}; resume it with "
                         f"'{'search' if is_search else 'train'} --name {cmd.name}'")
    refuse_dev_run(predir, mode)
    return True


def with_saved_overrides(cmd: Command, predir: str) -> list[str]:
    """The ``-s`` overrides a resume of ``predir`` applies: the run's saved ones, then those ``cmd`` gives now."""
    return predir_mod.saved_overrides(predir) + list(cmd.overrides)
