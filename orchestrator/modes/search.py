"""Hyperparameter search (``search``, ``search@{predir|latest}``): a Ray Tune experiment whose trials
are lab trials.

Each Tune trial runs one lab ``Trial`` of ``meta.max_session`` session actors, with the resources of
all its sessions reserved by a placement group (``[{}] + [session bundle] * max_session``: the
trial's own process takes none). The sampled values are applied to the spec (``search_space``), and
at every log checkpoint reached by all its sessions the trial reports ``{"total_reward_ma": mean over
sessions, "frame": ..., "trial": T, "progress": each session's latest row}`` to Tune, so a scheduler
(``meta.search_scheduler``: ASHA with ``time_attr="frame"``) can stop it early and the driver's console
(``orchestrator.search.console``: the lab's lines and bars, Tune's own output off) shows every session.

Trial numbering: trial ``T`` is the T-th configuration Tune generates (its experiment tag counter),
given to the trial as its name ``t{T}``. The built-in generator is seeded from ``meta.random_seed``,
so the same search always samples the same configuration for the same ``T``; a Tune trial restored
from a stale experiment snapshot, or regenerated when no snapshot survived, finds its own ``t{T}/``.

Predir (docs/ARCHITECTURE.md section 3) of a search::

    {spec_name}_spec.json                   the spec with its search section, as run
    {spec_name}_t{T}_spec.json              trial spec: sampled values applied, search emptied
    {spec_name}_t{T}_s{S}_spec.json         session specs
    {spec_name}_best_spec.json              {spec_name: best trial's spec}: ``lab FILE NAME train`` runs it
    search.json                             search settings (Tune name, search algorithm, concurrency)
    t{T}/trial.json                         sampled values and status: running | done | stopped | error
    t{T}/run.json                           session statuses of the trial (as ``run.json`` of ``train``)
    run.json                                all trials' sessions and resumes, merged after each ``fit``
    t{T}/s{S}/...                           sessions (checkpoints, train_df, log.txt)
    info/experiment_df.parquet              one row per trial: searched values + metrics, by strength
    info/trial_df.parquet                   per trial and frame: mean/std of returns across sessions
    info/t{T}_trial_metrics.json, graph/... SLM-Lab metrics and graphs per session and trial (analysis.py),
                                            written when the trial ends
    graph/{spec_name}_experiment_graph.png  each metric against each searched variable (PBT: final score per trial
                                            and the score lineage, report/experiment_graph.py)
    tune/{spec_name}/                       Ray Tune's own experiment state

Resume: the lab's session checkpoints are the source of truth. The driver holds the predir's lease
(``orchestrator.store.lease``), rebuilds a damaged ``trial.json`` (a damaged ``search.json`` is an exit 2),
and verifies every session before ``fit`` (corrupt checkpoints set aside with a warning). A trial
whose ``trial.json`` says
``done`` at ``max_frame`` (or ``stopped``: ended early by the scheduler) reports its final metrics and
returns without touching a file; any other trial resumes its sessions from their newest valid checkpoints (a
session without one starts from frame 0 with its seed). Tune's state is restored with
``Tuner.restore`` when it exists; it may be stale after a SIGKILL, which the numbering above makes
harmless. Without any Tune state a new Tuner regenerates the same trials (seeded generator); so does
``search@`` with ``env.max_frame`` raised, and done trials then continue to the new ``max_frame``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from ray import tune

from orchestrator.commandline import Command, lab_command, mode_header
from orchestrator.errors import EXIT_RESUMABLE, SpecError, UsageError
from orchestrator.modes.common import (
    check_named,
    draw_seed,
    missing_spec_message,
    resolve_predir,
    resolve_session_batch,
    with_saved_overrides,
)
from orchestrator.runtime.ray_start import check_resources, init_ray
from orchestrator.runtime.signals import STOP, pause_point
from orchestrator.search.console import CONSOLE, quiet_tune
from orchestrator.search.report import analyze, report_summary
from orchestrator.search.trials import ANALYZER, lab_trials, mark_ended, search_complete
from orchestrator.search.tune import StopSignalRelay, make_tuner, param_space, restore_or_new_tuner, search_alg_name
from orchestrator.spec.meta import MetaSpec
from orchestrator.spec.pbt import is_pbt
from orchestrator.store import predir as predir_mod
from orchestrator.store import storage
from orchestrator.store.lease import Lease
from orchestrator.store.record import RunRecord, SessionPlan
from orchestrator.verify import export_committed, inexact_note, session_done


def run_search(cmd: Command) -> int:
    """``search`` and ``search@{predir|latest}`` (see module docstring); returns the exit code."""
    from orchestrator.spec.load import load_spec  # the driver's check torch; Tune's trial actors import none

    target = cmd.target
    named = predir_mod.named_predir(cmd.data_dir, cmd.name) if cmd.name else None
    if named is not None and check_named(cmd, named, search=True):
        target = named
    overrides, given = list(cmd.overrides), []
    if target is not None:  # the run's saved -s overrides go first
        try:
            overrides = with_saved_overrides(cmd, resolve_predir(target, cmd.data_dir, cmd.spec_name))
            given = list(cmd.overrides)
        except UsageError:
            pass  # resume_search names the problem once the spec is known to be good
    pause_point("spec_check")  # test hook (orchestrator.runtime.signals)
    new_spec = load_spec(cmd.spec_file, cmd.spec_name, overrides)
    if named is not None and target == named and named_complete(named, new_spec):
        print(f"{cmd.word} --name {cmd.name}: the search {named} is already complete at its max_frame "
              f"{new_spec['env']['max_frame']}; nothing to do")
        return 0
    with SearchLease(cmd) as lease:
        if target is not None:
            predir, spec, settings, tuner = resume_search(cmd, new_spec, target, lease, overrides, given)
        else:
            predir, spec, settings, tuner = start_search(cmd, new_spec, lease, named)
        meta = MetaSpec.of(spec)
        print(f"{mode_header(cmd.word, predir)} (max_trial={meta.max_trial}, {meta.max_session} "
              f"session(s) per trial, search algorithm {settings['search_alg']})")
        if meta.tensorboard:
            print(f"TensorBoard (every session's events, t{{T}}/s{{S}}/tb/): tensorboard --logdir {predir}")
        if is_pbt(spec):
            return run_population(predir, spec, lease.lease, cmd.quiet)
        ANALYZER.start(predir)
        try:
            with CONSOLE.showing(spec, cmd.quiet), quiet_tune():
                results, signalled = fit_with_signals(tuner)
        finally:
            ANALYZER.close()
        return finish_search(predir, spec, results, signalled)


def named_complete(predir: str, new_spec: dict[str, Any]) -> bool:
    """Whether the search of ``search --name`` in ``predir`` is complete and the spec given now edits nothing (read
    only: a complete search run again is left byte for byte as it was)."""
    try:
        spec, applied = resumed_spec(predir, new_spec)
    except (UsageError, SpecError):
        return False  # resume_search names the problem
    return not applied and search_complete(predir, spec)


def run_population(predir: str, spec: dict[str, Any], lease: Lease | None, quiet: bool) -> int:
    """A PBT search (``orchestrator.search.pbt``): the generations, then the analysis, the lineage graph and the
    summary with the command that replays the best trial (``report_summary``); returns the exit code."""
    from orchestrator.search.pbt import Population, lineage_graph
    from orchestrator.spec.load import check

    population = Population(predir, spec, lease, quiet, check)
    with STOP.target(population.on_stop_signal):
        code = population.run()
    with STOP.target(finishing):
        pause_point("analysis")
        df = analyze(predir, spec, merge=False)
        lineage_graph(predir, spec)
        report_summary(predir, spec, df, interrupted=code != 0)
    if code == EXIT_RESUMABLE:
        print("interrupted; resume with:\n  " + resume_command(predir, spec))
    return code


def resume_command(predir: str, spec: dict[str, Any]) -> str:
    """The command that resumes a stopped search: as the user typed it for ``--name``, else ``search@PREDIR``."""
    return STOP.resume_command or lab_command(predir_mod.spec_file(predir, spec["name"]), spec["name"],
                                              f"search@{predir}")


def fit_with_signals(tuner: Any) -> tuple[Any, bool]:
    """``tuner.fit()`` as the target of the process's stop requests (``orchestrator.runtime.signals``); returns (its
    ResultGrid, whether a stop was asked).

    A stop request goes to Tune's own graceful stop (``StopSignalRelay``: it saves the experiment state and ends the
    trial actors; their sessions keep the checkpoints they committed). Tune's SIGINT handler is turned off
    (``TUNE_DISABLE_SIGINT_HANDLER``) for the call: with it, Ctrl-C ended the search as if its running trials had
    all been stopped by the scheduler (``stopped``, never resumed).
    """
    env_before = os.environ.get("TUNE_DISABLE_SIGINT_HANDLER")
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    try:
        with STOP.target(StopSignalRelay.request):
            results = tuner.fit()
    finally:
        StopSignalRelay.reset()
        STOP.reinstall()
        if env_before is None:
            os.environ.pop("TUNE_DISABLE_SIGINT_HANDLER", None)
        else:
            os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = env_before
    return results, STOP.requested


def finishing(signum: int) -> str:
    """The stop target of a search's final analysis: it finishes (the trials have ended)."""
    return "the trials have ended; finishing the analysis (Ctrl-C twice leaves at once)"


def finish_search(predir: str, spec: dict[str, Any], results: Any, signalled: bool = False) -> int:
    """After ``fit``: mark ended trials, analyze, print the summary; returns the exit code: 1 for a failed trial, 0
    when every trial ended, ``EXIT_RESUMABLE`` when the search stopped early with no failed trial: a signal
    (``signalled``: SIGINT, SIGTERM) or Tune's own SIGUSR1 stop (SLURM's ``--signal=B:USR1@N``); its unfinished
    trials stay ``running`` for ``search@``."""
    errors, interrupted = mark_ended(predir, spec, results, signalled)
    with STOP.target(finishing):
        pause_point("analysis")
        df = analyze(predir, spec)
        report_summary(predir, spec, df, interrupted)
    for t, error in sorted(errors.items()):
        print(f"trial t{t} failed: {error}", file=sys.stderr)
    if interrupted:
        print("interrupted; resume with:\n  " + resume_command(predir, spec))
    if errors:
        return 1
    return EXIT_RESUMABLE if interrupted else 0


class SearchLease:
    """Holds the lease (``orchestrator.store.lease``) of the search's predir once ``take`` names it; released
    on exit. The command's mode word is shown to a second driver."""

    def __init__(self, cmd: Command) -> None:
        self.mode, self.lease, self.wait = cmd.word, None, bool(cmd.name)

    def take(self, predir: str) -> None:
        """Acquire the lease of ``predir``.

        Raises:
            LeaseHeldError: another live driver holds it (exit 2).
        """
        self.lease = Lease(predir, self.mode, wait=self.wait)
        self.lease.acquire()

    def __enter__(self) -> "SearchLease":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.lease is not None:
            self.lease.release()


def start_search(cmd: Command, spec: dict[str, Any], lease: SearchLease,
                 named: str | None = None) -> tuple[str, dict, dict, tune.Tuner]:
    """A new search: checks, then the predir (``named``, of ``--name``, or a new timestamped one; its lease
    taken) with its spec, ``search.json`` and ``-s`` overrides, and a new Tuner.

    Returns:
        (predir, spec as run, settings, tuner).
    """
    param_space(spec)  # refuse a spec without a valid search section before creating anything
    draw_seed(spec)
    meta = MetaSpec.of(spec)
    alg = meta.search_scheduler["name"] if is_pbt(spec) else search_alg_name(spec, cmd.search_alg)
    settings = {"tune_name": spec["name"], "search_alg": alg, "max_concurrent_trials": cmd.max_concurrent_trials}
    init_ray(cmd.address, cmd.dashboard, prestart=False)
    if resolve_session_batch(spec, min(meta.max_trial, cmd.max_concurrent_trials or meta.max_trial)) is not None:
        meta = MetaSpec.of(spec)
    check_resources(meta.resources, meta.session_actors, together=True)
    if named is not None:
        storage.makedirs(named)
    predir = named or predir_mod.new_predir(cmd.data_dir, spec["name"])
    lease.take(predir)
    with STOP.deferred():  # the new search's files are written whole
        if cmd.overrides:
            predir_mod.save_overrides(predir, list(cmd.overrides))
        storage.write_json(predir_mod.spec_file(predir, spec["name"]), spec)
        storage.write_json(storage.join(predir, "search.json"), settings)
    return predir, spec, settings, None if is_pbt(spec) else make_tuner(spec, predir, settings)


def resume_search(cmd: Command, new_spec: dict[str, Any], target: str, lease: SearchLease,
                  overrides: list[str], given: list[str]) -> tuple[str, dict, dict, tune.Tuner]:
    """``search@{target}``: the lease of the run, the saved spec plus edits, and the restored (or a new)
    Tuner. ``overrides``: the run's saved ``-s`` overrides and ``given``, the ones given now; recorded when they edit
    the spec and ``given`` is not empty.

    Returns:
        (predir, spec as run, settings, tuner).
    """
    try:
        predir = resolve_predir(target, cmd.data_dir, cmd.spec_name)
    except UsageError as err:
        raise UsageError(str(err).replace("train@", "search@", 1)) from None
    lease.take(predir)
    spec, applied = resumed_spec(predir, new_spec)
    settings = read_settings(predir, spec["name"])
    init_ray(cmd.address, cmd.dashboard, prestart=False)
    meta = MetaSpec.of(spec)
    check_resources(meta.resources, meta.session_actors, together=True)
    if applied:
        storage.write_json(predir_mod.spec_file(predir, spec["name"]), spec)
        if given:
            predir_mod.save_overrides(predir, overrides)
    for line in applied:
        print(f"applied spec edit: {line}")
    lab_trials(predir)  # rebuilds a damaged trial.json before Tune's trials read it
    verify_trials(predir, spec)
    # Tune keeps finished trials finished; with max_frame raised they must run again
    if is_pbt(spec):  # its env.max_frame and meta.max_session are fixed (spec.resume refuses their edits)
        return predir, spec, settings, None
    longer = any(line.startswith("env.max_frame:") for line in applied)
    tuner = restore_or_new_tuner(spec, predir, settings, restore=not longer)
    return predir, spec, settings, tuner


def verify_trials(predir: str, spec: dict[str, Any]) -> None:
    """Verify every existing session of a search in the driver before ``fit`` (``trial.check_session``).

    Corrupt newest checkpoints are set aside here, so their warnings reach the terminal (Tune's trial
    processes do not print to it); each is recorded under the session in ``t{T}/run.json``
    (``set_aside``). Sessions at ``max_frame`` get their train_df/eval_df copies re-exported from
    their checkpoint. The trials then plan from the verified checkpoints. When any unfinished session resumes from
    an ``exact: false`` checkpoint, one line on stderr says which and why (``verify.inexact_note``).

    Raises:
        UsageError: a session's checkpoints cannot be read.
    """
    restored = []
    for t in sorted(lab_trials(predir)):
        record = None
        for s in range(MetaSpec.of(spec).max_session):
            if not storage.exists(predir_mod.session_dir(predir, t, s)):
                continue
            plan = SessionPlan(t, s, 0, resume=False)
            is_done, selection = session_done(predir, plan, int(spec["env"]["max_frame"]))
            if is_done:  # also for trials Tune does not run again
                export_committed(predir, plan, selection)
            else:
                restored.append((plan.key, selection))
            if plan.set_aside:
                record = record or RunRecord.load_or_new(storage.join(predir, f"t{t}"), spec["name"])
                entry = record.data["sessions"].setdefault(plan.key, {})
                entry["set_aside"] = entry.get("set_aside", []) + plan.set_aside
        if record is not None:
            record.save()
    note = inexact_note(restored)
    if note:
        print(note, file=sys.stderr)


def resumed_spec(predir: str, new_spec: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The saved spec of a search plus the future-only edits of ``new_spec``.

    Raises:
        SpecError: edits that contradict the past (the search section, algorithm, ...).
        UsageError: the predir is not a search.
    """
    if not storage.exists(storage.join(predir, "search.json")):
        raise UsageError(f"search@: '{predir}' is not a search run (no search.json); resume it with train@")
    if not storage.exists(predir_mod.spec_file(predir, new_spec["name"])):
        raise UsageError(missing_spec_message("search@", predir, new_spec["name"]))
    from orchestrator.spec.resume import resume_spec

    merged, applied, _ = resume_spec(predir, new_spec, "search@: the search's saved spec")
    return merged, applied


def read_settings(predir: str, spec_name: str) -> dict[str, Any]:
    """``search.json`` (Tune name, search algorithm, concurrency) of a search.

    Raises:
        UsageError: it is damaged (not valid JSON, or lacks a key): names it and what to write back.
    """
    uri = storage.join(predir, "search.json")
    try:
        settings = storage.read_json(uri)
        if isinstance(settings, dict) and {"tune_name", "search_alg", "max_concurrent_trials"} <= set(settings):
            return settings
        why = "it lacks tune_name, search_alg or max_concurrent_trials"
    except (ValueError, UnicodeDecodeError) as err:
        why = f"not valid JSON: {err}"
    raise UsageError(f"search@: the search settings {uri} are damaged ({why}). They cannot be rebuilt "
                     "safely: the search algorithm decides which values each trial samples. Write back "
                     f'{{"tune_name": "{spec_name}", "search_alg": "basic" or "optuna" (the one the search '
                     'started with), "max_concurrent_trials": N or null}, then resume again')
