"""Hyperparameter search (``search``, ``search@{predir|latest}``): a Ray Tune experiment whose trials
are lab trials.

Each Tune trial runs one lab ``Trial`` of ``meta.max_session`` session actors, with the resources of
all its sessions reserved by a placement group (``[{}] + [session bundle] * max_session``: the
trial's own process takes none). The sampled values are applied to the spec (``search_space``), and
at every log checkpoint reached by all its sessions the trial reports ``{"total_reward_ma": mean over
sessions, "frame": ..., "trial": T}`` to Tune, so a scheduler (``meta.search_scheduler``: ASHA with
``time_attr="frame"``) can stop it early.

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
    graph/{spec_name}_experiment_graph.png  each metric against each searched variable
    tune/{spec_name}/                       Ray Tune's own experiment state

Resume: the lab's session checkpoints are the source of truth. The driver holds the predir's lease
(``orchestrator.lease``), rebuilds a damaged ``trial.json`` (a damaged ``search.json`` is an exit 2),
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

import argparse
import io
import math
import os
import queue
import signal
import sys
import threading
from typing import Any

import ray
from ray import tune
from ray.exceptions import RayTaskError
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

from orchestrator import predir as predir_mod
from orchestrator import storage
from orchestrator.checkpoint import CheckpointStore
from orchestrator.errors import SpecError, UsageError
from orchestrator.lease import Lease
from orchestrator.predir import session_seed
from orchestrator.search_space import SearchVar, apply_values, parse_search, plain
from orchestrator.trial import (
    HOSTS,
    RunRecord,
    SessionPlan,
    Trial,
    aggregate_trial,
    check_resources,
    export_committed,
    host_key,
    init_ray,
    missing_spec_message,
    now_iso,
    resolve_predir,
    session_done,
)

METRIC = "total_reward_ma"
TUNE_DIR = "tune"


# ---------------------------------------------------------------- search space and Tune config

def tune_domain(var: SearchVar) -> Any:
    """The Ray Tune domain of one searched variable (``normal`` is ``tune.randn``; ``choice`` takes the list)."""
    if var.kind in ("grid_search", "choice"):
        return getattr(tune, var.kind)(list(var.arg))
    kind = "randn" if var.kind == "normal" else var.kind
    return getattr(tune, kind)(*var.arg)


def param_space(spec: dict[str, Any]) -> dict[str, Any]:
    """Tune ``param_space``: ``{dotted.spec.path: domain}`` for every searched variable.

    Raises:
        SpecError: the search section is empty or invalid.
    """
    variables, problems = parse_search(spec)
    if problems:
        raise SpecError(problems)
    if not variables:
        raise SpecError("search: the spec has no search section; use train mode, or add e.g. "
                        '"search": {"agent.algorithm.gamma__grid_search": [0.9, 0.99]}')
    return {v.path: tune_domain(v) for v in variables}


# Types Optuna cannot sample as written: a grid, normal distributions, quantized log-uniform (Tune's Optuna
# bridge drops the quantization there).
OPTUNA_UNSUPPORTED = ("grid_search", "normal", "randn", "qrandn", "qloguniform")


def optuna_unsupported(spec: dict[str, Any]) -> list[str]:
    """Searched variables Optuna cannot sample: ``OPTUNA_UNSUPPORTED`` types, choices of lists or dicts."""
    return [f"search.{v.path}__{v.kind}" for v in parse_search(spec)[0]
            if v.kind in OPTUNA_UNSUPPORTED
            or (v.kind == "choice" and any(isinstance(x, (list, dict)) for x in v.arg))]


def search_alg_name(spec: dict[str, Any], requested: str = "auto") -> str:
    """``optuna`` or ``basic`` for ``--search-alg``: ``auto`` is Optuna when it is installed and can
    sample every variable, else Tune's built-in generator.

    Raises:
        UsageError: ``optuna`` requested but not installed, or unable to sample a variable.
    """
    if requested == "basic":
        return requested
    try:
        import optuna  # noqa: F401
    except ImportError:
        if requested == "optuna":
            raise UsageError("--search-alg optuna: optuna is not installed "
                             "(pip install -e '.[search]')") from None
        return "basic"
    unsupported = optuna_unsupported(spec)
    if requested == "optuna" and unsupported:
        raise UsageError(f"--search-alg optuna cannot sample {', '.join(unsupported)}; "
                         "use --search-alg basic")
    return "basic" if unsupported else "optuna"


def make_search_alg(name: str, seed: int, max_concurrent: int | None) -> Any:
    """The search algorithm, seeded from ``meta.random_seed`` so trial T samples the same values on
    every run of the same search, running at most ``max_concurrent`` trials at once (None: no limit)."""
    if name == "optuna":
        from optuna.samplers import TPESampler
        from ray.tune.search import ConcurrencyLimiter
        from ray.tune.search.optuna import OptunaSearch
        searcher = OptunaSearch(sampler=TPESampler(seed=seed % 2**32))
        return ConcurrencyLimiter(searcher, max_concurrent) if max_concurrent else searcher
    from ray.tune.search import BasicVariantGenerator
    return BasicVariantGenerator(random_state=seed % 2**32, max_concurrent=max_concurrent or 0)


def make_scheduler(spec: dict[str, Any]) -> Any:
    """ASHA on ``frame`` from ``meta.search_scheduler`` (FIFO without one; its ``name`` may be left out), each
    handing the trials that end to the driver's ``TrialAnalyzer`` (``AnalyzeEnded``).

    ``max_t`` is one frame past ``max_frame``, so ASHA never stops a trial at its end: the trial
    finishes by itself and records ``done``.
    """
    sched = spec["meta"].get("search_scheduler")
    if not sched:
        return AnalyzingFIFO()
    max_t = int(spec["env"]["max_frame"]) + 1
    return AnalyzingASHA(time_attr="frame", max_t=max_t, grace_period=min(int(sched.get("grace_period", 1)), max_t),
                         reduction_factor=float(sched.get("reduction_factor", 2)),
                         brackets=int(sched.get("brackets", 1)))


class AnalyzeEnded:
    """Scheduler mixin (Tune calls a scheduler's ``on_trial_complete`` in the driver as a trial ends): the trial
    goes to ``ANALYZER`` when its sessions ran in this search (``search_trial``'s last report has ``ran``).

    A scheduler, not a Tune callback: with any callback, ``Tuner.fit`` imports Ray's W&B, MLflow, Comet and Aim
    integrations to count callbacks for its usage stats (1.4 s of the driver's start here). Stateless, so a
    restored Tuner's copy (Tune pickles its config) routes to this process's analyzer and run directory.
    """

    def on_trial_complete(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> None:
        """The base scheduler's ``on_trial_complete``, then queue the trial for analysis."""
        super().on_trial_complete(tune_controller, trial, result)  # type: ignore[misc]
        if result.get("ran"):  # not a finished trial Tune ran again only to have its metrics reported
            ANALYZER.submit(result.get("trial"))


class AnalyzingFIFO(AnalyzeEnded, FIFOScheduler):
    """Tune's default first-in-first-out scheduler, with ``AnalyzeEnded``."""


class AnalyzingASHA(AnalyzeEnded, ASHAScheduler):
    """ASHA (``ASHAScheduler``, asynchronous successive halving), with ``AnalyzeEnded``."""


class TrialNamer:
    """Names a Tune trial ``t{T}``, T its 0-based generation index (used for its name and its dir).

    Args:
        offset: the index Tune's experiment tag counter gives the first trial (0 for the built-in
            generator, 1 for searchers such as Optuna).
    """

    def __init__(self, offset: int) -> None:
        self.offset = offset

    def __call__(self, trial: Any) -> str:
        """The name ``t{T}`` of a Tune trial, from its experiment tag."""
        return f"t{int(str(trial.experiment_tag).split('_', 1)[0]) - self.offset}"


def trial_index(name: str) -> int:
    """T of a Tune trial name or dir ``t{T}``.

    Raises:
        ValueError: another name.
    """
    if not (name.startswith("t") and name[1:].isdigit()):
        raise ValueError(f"Tune trial name '{name}' is not t{{T}}")
    return int(name[1:])


def placement(meta: dict[str, Any]) -> Any:
    """``PlacementGroupFactory([{}] + [session bundle] * max_session)``: resources of every session."""
    res = meta["resources"]
    bundle = {k: float(res.get(key, 0) or 0) for k, key in (("CPU", "num_cpus"), ("GPU", "num_gpus"))}
    bundle = {k: v for k, v in bundle.items() if v > 0} or {"CPU": 0.01}
    return tune.PlacementGroupFactory([{}] + [bundle] * int(meta["max_session"]), strategy="PACK")


# ---------------------------------------------------------------- one Tune trial = one lab trial

def trial_json(predir: str, t: int) -> str:
    """URI of ``t{T}/trial.json``."""
    return storage.join(predir, f"t{t}", "trial.json")


def write_spec_files(predir: str, spec: dict[str, Any], t: int) -> None:
    """Trial and session spec files of trial ``t`` (sampled values applied)."""
    name = spec["name"]
    storage.write_json(predir_mod.spec_file(predir, name, t), {**spec, "meta": {**spec["meta"], "trial": t}})
    for s in range(int(spec["meta"]["max_session"])):
        seed = session_seed(spec["meta"]["random_seed"], t, s)
        session_spec = predir_mod.session_spec(spec, t, s, seed)
        storage.write_json(predir_mod.spec_file(predir, name, t, s), session_spec)


def set_aside(predir: str, t: int) -> str:
    """Move ``t{T}/`` (a trial of values Tune no longer has) to ``t{T}.stale-{ts}/``; returns it."""
    src = storage.join(predir, f"t{t}")
    dst = storage.join(predir, f"t{t}.stale-{now_iso().replace(':', '')}")
    if storage.is_remote(src):
        storage.copy_tree(src, dst)
        storage.delete(src)
    else:
        storage.move(src, dst)
    print(f"warning: t{t}/ holds other sampled values than Tune's trial t{t} now has; set aside to {dst}",
          file=sys.stderr)
    return dst


def plan_sessions(predir: str, spec: dict[str, Any], t: int) -> tuple[list[SessionPlan], list[SessionPlan]]:
    """Plans of trial ``t``'s sessions, each verified in this process first (``trial.check_session``).

    A session whose newest valid checkpoint is at ``max_frame`` is done: its train_df/eval_df copies
    are re-exported from that checkpoint (a killed driver may have left older ones). Any other
    session resumes from its newest valid checkpoint (newer corrupt ones set aside with a warning),
    or starts fresh (with its seed) when it has none.

    Returns:
        (plans to run, plans of the sessions already done).

    Raises:
        UsageError: a session's checkpoints cannot be read.
    """
    plans, done = [], []
    for s in range(int(spec["meta"]["max_session"])):
        plan = SessionPlan(t, s, session_seed(spec["meta"]["random_seed"], t, s), resume=False)
        is_done, selection = session_done(predir, plan, int(spec["env"]["max_frame"]))
        if is_done:
            export_committed(predir, plan, selection)
            done.append(plan)
            continue
        plan.resume, plan.frame = selection.frame is not None, selection.frame or 0
        plans.append(plan)
    return plans, done


def session_history(predir: str, t: int, s: int) -> dict[int, float]:
    """``{frame: total_reward_ma}`` of a session's saved train_df ({} if none)."""
    uri = storage.join(predir_mod.session_dir(predir, t, s), "train_df.parquet")
    if not storage.exists(uri):
        return {}
    df = storage.read_parquet(uri)
    return dict(zip(df["frame"].astype(int).tolist(), df[METRIC].astype(float).tolist()))


class TrialReporter:
    """Reports a trial's mean ``total_reward_ma`` to Tune at each frame every live session has logged.

    Args:
        t: trial index.
        plans: the running sessions' plans (a ``failed`` one stops counting).
        history: ``{session: {frame: total_reward_ma}}``, prefilled from saved train_dfs.
        report: ``tune.report`` (a list's ``append`` in tests).
    """

    def __init__(self, t: int, plans: list[SessionPlan], history: dict[int, dict[int, float]],
                 report: Any) -> None:
        self.t, self.plans, self.history, self.report = t, {p.session: p for p in plans}, history, report
        self.reported = -1

    def __call__(self, plan: SessionPlan, row: dict[str, Any]) -> None:
        """Record one train_df row of a session; report each frame all live sessions have now reached."""
        self.history.setdefault(plan.session, {})[int(row["frame"])] = float(row[METRIC])
        live = [s for s in self.history if s not in self.plans or self.plans[s].status != "failed"]
        common = set.intersection(*(set(self.history[s]) for s in live)) if live else set()
        for frame in sorted(f for f in common if f > self.reported):
            values = [self.history[s][frame] for s in live if not math.isnan(self.history[s][frame])]
            mean = sum(values) / len(values) if values else math.nan
            self.report({METRIC: mean, "frame": frame, "trial": self.t})
            self.reported = frame


def final_metrics(predir: str, spec: dict[str, Any], t: int) -> dict[str, Any]:
    """Final metrics of trial ``t`` from its sessions' train_dfs (reported to Tune at its end).

    Returns:
        ``total_reward_ma`` / ``total_reward_ma_std``: mean / std across sessions of the last row's
        moving average; ``frame``: the least final frame; ``sessions``: sessions with a train_df.
    """
    import numpy as np

    finals, frames = [], []
    for s in range(int(spec["meta"]["max_session"])):
        uri = storage.join(predir_mod.session_dir(predir, t, s), "train_df.parquet")
        if not storage.exists(uri):
            continue
        df = storage.read_parquet(uri)
        if df.empty:
            continue
        finals.append(float(df[METRIC].iloc[-1]))
        frames.append(int(df["frame"].iloc[-1]))
    valid = [f for f in finals if not math.isnan(f)]
    return {METRIC: float(np.mean(valid)) if valid else math.nan,
            f"{METRIC}_std": float(np.std(valid)) if len(valid) > 1 else 0.0,
            "frame": min(frames) if frames else 0, "sessions": len(frames)}


def search_trial(config: dict[str, Any], spec: dict[str, Any], predir: str) -> None:
    """The Tune trainable: run (or resume, or merely report) lab trial ``t{T}`` of ``config``.

    A trial whose ``trial.json`` is final (``done``, or ``stopped`` by the scheduler) only reports its
    final metrics: Tune re-runs such a trial after a stale snapshot, or when its state was lost.

    Args:
        config: sampled values ``{dotted.spec.path: value}``.
        spec: the search's checked spec (with its search section).
        predir: run directory URI.

    Raises:
        RuntimeError: a session failed (Tune marks the trial errored; ``search@`` retries it).
    """
    ctx = tune.get_context()
    t = trial_index(ctx.get_trial_name())
    values = {k: plain(v) for k, v in config.items()}
    # the session actors start now (their processes import torch while this one waits), and one of them checks the
    # spec: this process imports no torch (docs/BENCHMARKS.md "Search overhead")
    hosts = HOSTS.warm_up(host_key(spec["meta"]), int(spec["meta"]["max_session"]))
    try:
        trial_spec = ray.get(hosts[0].check_spec.remote(apply_values(spec, values)))
    except RayTaskError as err:  # a bad variant: its SpecError as the trial's error, without the remote frames
        raise (err.cause if isinstance(err.cause, SpecError) else err) from None
    info = read_trial_info(predir, t)
    if info is not None and info["values"] != values:
        set_aside(predir, t)
        info = None
    if info is not None and is_final(info, trial_spec):
        tune.report({**final_metrics(predir, trial_spec, t), "trial": t})
        return
    write_spec_files(predir, trial_spec, t)  # a resume may have raised max_frame
    info = info or {"trial": t, "values": values, "tune_trial_id": ctx.get_trial_id(), "started": now_iso()}
    storage.write_json(trial_json(predir, t), {**info, "status": "running"})
    run_lab_trial(predir, trial_spec, t)
    metrics = final_metrics(predir, trial_spec, t)
    storage.write_json(trial_json(predir, t), {**info, "status": "done", "finished": now_iso(),
                                               "frame": metrics["frame"]})
    tune.report({**metrics, "trial": t, "ran": True})  # its graphs: the driver's TrialAnalyzer, as the next runs


class TrialAnalyzer:
    """The driver's thread that writes each ``done`` search trial's metrics and graphs
    (``analysis.analyze_after_run``) as soon as the trial ends, while the next trials run.

    In the trial's own process the analysis held the trial's placement group (its sessions' CPUs) for 1-5 s
    after its sessions ended, and the next trial waited for it (docs/BENCHMARKS.md "Search overhead"); here the
    next trial starts at once. The search's scheduler (``AnalyzeEnded``) hands it the ended trials; ``close``
    waits for the queue, after which the search's final ``analyze`` does the trials not analyzed yet (a stopped
    trial, one whose analysis failed, one that ended while the driver was killed).
    """

    def __init__(self) -> None:
        self.predir: str | None = None
        self.queue: queue.Queue[int | None] = queue.Queue()
        self.thread: threading.Thread | None = None

    def start(self, predir: str) -> None:
        """Start the thread for the search in ``predir``."""
        self.predir = predir
        self.thread = threading.Thread(target=self.run, name="search-analysis", daemon=True)
        self.thread.start()

    def submit(self, t: Any) -> None:
        """Queue trial ``t`` (ignored when no search runs in this process, or ``t`` is not a trial index)."""
        if self.thread is not None and isinstance(t, int):
            self.queue.put(t)

    def run(self) -> None:
        """Analyze queued trials until ``close``. A queued trial is ``done``: ``search_trial`` writes that to its
        ``trial.json`` before the report that queues it (``AnalyzeEnded``), so nothing is read again here."""
        from orchestrator.analysis import analyze_after_run

        while (t := self.queue.get()) is not None:
            analyze_after_run(self.predir, trials=[t])  # a failure only warns; the final analyze retries it

    def close(self) -> None:
        """Wait for the queued analyses and end the thread."""
        if self.thread is not None:
            self.queue.put(None)
            self.thread.join()
        self.thread, self.predir = None, None


ANALYZER = TrialAnalyzer()  # the running search's (one search per driver process at a time)


def is_final(info: dict[str, Any], spec: dict[str, Any]) -> bool:
    """A trial that never runs again: ``stopped`` by the scheduler, or ``done`` at the spec's
    ``max_frame`` (a ``done`` trial continues when ``search@`` raised ``env.max_frame``)."""
    max_frame = int(spec["env"]["max_frame"])
    done = info["status"] == "done" and info.get("frame", max_frame) >= max_frame
    return done or info["status"] == "stopped"


def run_lab_trial(predir: str, spec: dict[str, Any], t: int) -> None:
    """Run the unfinished sessions of trial ``t`` as actors, reporting to Tune at each log checkpoint.

    Raises:
        RuntimeError: a session failed.
    """
    plans, done = plan_sessions(predir, spec, t)
    record = RunRecord.load_or_new(storage.join(predir, f"t{t}"), spec["name"])
    for plan in done:  # the checkpoint is the truth: a killed driver may not have recorded the end
        entry = record.data["sessions"].get(plan.key, {})
        if entry.get("status") != "done" or entry.get("frame") != plan.frame:
            record.update(plan, checkpoint=plan.frame)
    if not plans:
        return
    if any(p.resume for p in plans) or record.data["sessions"]:
        entry = {"at": now_iso(), "spec_edits": [], "from_frames": {p.key: p.frame for p in plans}}
        set_aside = {p.key: p.set_aside for p in [*plans, *done] if p.set_aside}
        if set_aside:
            entry["set_aside"] = set_aside
        record.data["resumes"].append(entry)
    history = {s: session_history(predir, t, s) for s in range(int(spec["meta"]["max_session"]))}
    for plan in plans:  # rows past a resumed session's checkpoint come again; fresh ones have none
        kept = history[plan.session].items() if plan.resume else ()
        history[plan.session] = {f: v for f, v in kept if f <= plan.frame}
    reporter = TrialReporter(t, plans, history, tune.report)
    code = Trial(spec, predir, plans, record, quiet=True, on_log=reporter, analyze=False, hosts=HOSTS).run()
    if code != 0:
        failed = [f"{p.key}: {(p.error or '').strip().splitlines()[-1:]}"
                  for p in plans if p.status == "failed"]
        raise RuntimeError(f"trial t{t}: session(s) failed: {failed}")


# ---------------------------------------------------------------- the experiment (driver)

def tune_storage(predir: str) -> tuple[str, Any]:
    """(storage_path, storage_filesystem) of Tune's state under ``{predir}/tune``."""
    uri = storage.join(predir, TUNE_DIR)
    if not storage.is_remote(uri):
        return storage.resolve(uri)[1], None
    fs, path = storage.resolve(uri)
    return path, fs


def make_tuner(spec: dict[str, Any], predir: str, settings: dict[str, Any], quiet: bool) -> tune.Tuner:
    """A new Tuner for the search of ``spec`` (settings from ``search.json``)."""
    storage_path, fs = tune_storage(predir)
    meta = spec["meta"]
    namer = TrialNamer(1 if settings["search_alg"] == "optuna" else 0)
    search_alg = make_search_alg(settings["search_alg"], int(meta["random_seed"]),
                                 settings["max_concurrent_trials"])
    tune_config = tune.TuneConfig(
        metric=METRIC, mode="max", num_samples=int(meta["max_trial"]), scheduler=make_scheduler(spec),
        search_alg=search_alg, trial_name_creator=namer, trial_dirname_creator=namer, reuse_actors=True)
    run_config = tune.RunConfig(name=settings["tune_name"], storage_path=storage_path, storage_filesystem=fs,
                                failure_config=tune.FailureConfig(max_failures=int(meta["max_restarts"])),
                                verbose=0 if quiet else 1)
    return tune.Tuner(trainable(spec, predir), param_space=param_space(spec), tune_config=tune_config,
                      run_config=run_config)


def trainable(spec: dict[str, Any], predir: str) -> Any:
    """``search_trial`` bound to the spec and predir, with the placement group of its sessions."""
    bound = tune.with_parameters(search_trial, spec=spec, predir=predir)
    return tune.with_resources(bound, placement(spec["meta"]))


def restore_or_new_tuner(spec: dict[str, Any], predir: str, settings: dict[str, Any], quiet: bool,
                         restore: bool = True) -> tune.Tuner:
    """``Tuner.restore`` of the search's Tune state when it can be restored (and ``restore``), else a
    new Tuner (the old Tune state, if any, is deleted; the lab's trial dirs are what matters)."""
    storage_path, fs = tune_storage(predir)
    path = f"{storage_path}/{settings['tune_name']}"
    if restore and tune.Tuner.can_restore(path, storage_filesystem=fs):
        return tune.Tuner.restore(path, trainable(spec, predir), resume_unfinished=True, resume_errored=True,
                                  storage_filesystem=fs)
    storage.delete(storage.join(predir, TUNE_DIR, settings["tune_name"]))
    return make_tuner(spec, predir, settings, quiet)


def lab_trials(predir: str) -> dict[int, dict[str, Any]]:
    """``{T: trial.json}`` of every trial dir of a search predir."""
    out = {}
    for name in storage.listdir(predir):
        if name.startswith("t") and name[1:].isdigit():
            info = read_trial_info(predir, int(name[1:]))
            if info is not None:
                out[int(name[1:])] = info
    return out


def read_trial_info(predir: str, t: int) -> dict[str, Any] | None:
    """``t{T}/trial.json``; None if absent; a damaged one is rebuilt (``rebuild_trial_info``)."""
    uri = trial_json(predir, t)
    try:
        data = storage.read_json(uri)
    except FileNotFoundError:
        return None
    except (ValueError, UnicodeDecodeError) as err:
        return rebuild_trial_info(predir, t, f"not valid JSON: {err}")
    if not isinstance(data, dict) or not isinstance(data.get("values"), dict) or "status" not in data:
        return rebuild_trial_info(predir, t, "not an object with 'values' and 'status'")
    return data


def _lookup(spec: dict[str, Any], path: str) -> Any:
    """Value at a dotted spec path (a key may itself hold dots: the longest matching key wins).

    Raises:
        KeyError: no such path.
    """
    if path in spec:
        return spec[path]
    for i in range(path.count(".") + 1, 0, -1):
        head = ".".join(path.split(".")[:i])
        if head in spec and isinstance(spec[head], dict) and i <= path.count("."):
            return _lookup(spec[head], path[len(head) + 1:])
    raise KeyError(path)


def rebuild_trial_info(predir: str, t: int, why: str) -> dict[str, Any] | None:
    """A damaged ``t{T}/trial.json`` rebuilt from the trial's spec file and committed checkpoints.

    The damaged file is kept as ``trial.json.damaged-{ts}``, a warning names both. ``values`` come
    from ``{spec_name}_t{T}_spec.json`` at the search's variable paths; ``status`` is ``done`` when
    every session has a committed checkpoint at ``max_frame``, else ``running`` (so ``search@``
    resumes it; a trial the scheduler had ``stopped`` cannot be told apart and continues);
    ``frame`` is the least newest checkpoint frame.

    Returns:
        The rebuilt content (written), or None when the spec files needed are unreadable too (the
        damaged file is then only moved aside, and the trial is rewritten when it runs again).
    """
    uri = trial_json(predir, t)
    kept = f"{uri}.damaged-{now_iso().replace(':', '')}"
    storage.write_bytes(kept, storage.read_bytes(uri))
    name = predir_mod.spec_name_of(predir)
    try:
        spec = storage.read_json(predir_mod.spec_file(predir, name))
        trial_spec = storage.read_json(predir_mod.spec_file(predir, name, t))
        values = {v.path: _lookup(trial_spec, v.path) for v in parse_search(spec)[0]}
        max_frame, sessions = int(trial_spec["env"]["max_frame"]), int(trial_spec["meta"]["max_session"])
    except (FileNotFoundError, ValueError, KeyError, TypeError) as err:
        storage.delete(uri)
        print(f"warning: {uri} is damaged ({why}); kept as {kept}; it cannot be rebuilt ({err}) and is "
              f"rewritten when trial t{t} runs again", file=sys.stderr)
        return None
    frames = []
    for s in range(sessions):
        committed = CheckpointStore(predir_mod.session_dir(predir, t, s)).frames()
        frames.append(committed[-1] if committed else 0)
    status = "done" if frames and min(frames) >= max_frame else "running"
    info = {"trial": t, "values": values, "status": status, "frame": min(frames, default=0),
            "rebuilt": {"at": now_iso(), "why": why}}
    storage.write_json(uri, info)
    print(f"warning: {uri} is damaged ({why}); kept as {kept} and rebuilt from the trial's spec file and "
          f"committed checkpoints: status {status}, frame {info['frame']}", file=sys.stderr)
    return info


def mark_ended(predir: str, spec: dict[str, Any], results: Any,
               signalled: bool = False) -> tuple[dict[int, str], bool]:
    """After ``fit``: trials Tune ended without ``done`` become ``stopped`` (scheduler) or ``error``; after a stop
    signal (``signalled``) or an early end of ``fit``, the unfinished ones stay ``running`` (``search@`` resumes them).

    Returns:
        ({T: last line of the error} of errored trials, whether the search was interrupted before
        every trial ended).
    """
    errored = {}
    for result in results:
        if result.error is not None:
            t = trial_index(storage.basename(str(result.path)))
            errored[t] = (str(result.error).strip().splitlines() or [""])[-1]
    interrupted = signalled or results.num_terminated + results.num_errors < len(results)
    for t, info in lab_trials(predir).items():
        status = "error" if t in errored else ("stopped" if not interrupted else info["status"])
        if info["status"] == "running" and status != "running":
            frame = final_metrics(predir, spec, t)["frame"]
            storage.write_json(trial_json(predir, t), {**info, "status": status, "frame": frame,
                                                       "error": errored.get(t)})
    return errored, interrupted


def run_search(args: argparse.Namespace) -> int:
    """``search`` and ``search@{predir|latest}`` (see module docstring); returns the exit code."""
    from orchestrator.spec import load_spec  # the driver's check (torch); Tune's trial actors import none

    new_spec = load_spec(args.spec_file, args.spec_name, args.overrides)
    args.data_dir = storage.absolute(args.data_dir)
    with SearchLease(args) as lease:
        if "@" in args.mode:
            predir, spec, settings, tuner = resume_search(args, new_spec, args.mode.split("@", 1)[1], lease)
        else:
            predir, spec, settings, tuner = start_search(args, new_spec, lease)
        print(f"{args.mode}: {predir} (max_trial={spec['meta']['max_trial']}, {spec['meta']['max_session']} "
              f"session(s) per trial, search algorithm {settings['search_alg']})")
        ANALYZER.start(predir)
        try:
            results, signalled = fit_with_signals(tuner)
        finally:
            ANALYZER.close()
        return finish_search(predir, spec, results, signalled)


def fit_with_signals(tuner: Any) -> tuple[Any, bool]:
    """``tuner.fit()`` with SIGINT and SIGTERM handled by the lab; returns (its ResultGrid, whether one came).

    The first signal is recorded and handed to Tune as SIGUSR1, Tune's own graceful stop (it saves the
    experiment state and ends the trial actors; their sessions keep the checkpoints they committed); a second
    signal exits at once (1). Tune's SIGINT handler is turned off (``TUNE_DISABLE_SIGINT_HANDLER``) for the call:
    with it, Ctrl-C ended the search as if its running trials had all been stopped by the scheduler (``stopped``,
    never resumed), and SIGTERM reached Ray's fatal-signal handler (exit 1, a C++ stack on stderr). Outside the
    main thread Python allows no handlers: Tune's defaults stay.
    """
    if threading.current_thread() is not threading.main_thread():
        return tuner.fit(), False
    caught: list[int] = []

    def on_signal(signum: int, frame: Any) -> None:
        if caught:  # second signal: leave at once
            os._exit(1)
        caught.append(signum)
        print(f"\n{signal.Signals(signum).name}: stopping the search; its trials keep their committed checkpoints "
              "(again to exit at once)", file=sys.stderr)
        tune_stop = signal.getsignal(signal.SIGUSR1)
        if callable(tune_stop) and tune_stop is not previous[signal.SIGUSR1]:
            tune_stop(signal.SIGUSR1, frame)  # Tune's handler, installed once fit() set up its loop
        else:  # fit() has not set its handler up yet: stop as Python would
            raise KeyboardInterrupt

    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    env_before = os.environ.get("TUNE_DISABLE_SIGINT_HANDLER")
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    try:
        results = tuner.fit()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if env_before is None:
            os.environ.pop("TUNE_DISABLE_SIGINT_HANDLER", None)
        else:
            os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = env_before
    return results, bool(caught)


def finish_search(predir: str, spec: dict[str, Any], results: Any, signalled: bool = False) -> int:
    """After ``fit``: mark ended trials, analyze, print the summary; returns the exit code: 1 for a failed trial or
    a search Tune ended early for another reason, 0 when every trial ended or a signal (``signalled``) stopped it
    cleanly (its unfinished trials stay ``running`` for ``search@``)."""
    errors, interrupted = mark_ended(predir, spec, results, signalled)
    df = analyze(predir, spec)
    report_summary(predir, spec, df, interrupted)
    for t, error in sorted(errors.items()):
        print(f"trial t{t} failed: {error}", file=sys.stderr)
    if interrupted:
        from orchestrator.cli import lab_command
        print("interrupted; resume with:\n  "
              + lab_command(predir_mod.spec_file(predir, spec["name"]), spec["name"], f"search@{predir}"))
    return 1 if errors or (interrupted and not signalled) else 0


class SearchLease:
    """Holds the lease (``orchestrator.lease``) of the search's predir once ``take`` names it; released
    on exit. ``args`` is kept for the mode shown to a second driver."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.mode, self.lease = args.mode, None

    def take(self, predir: str) -> None:
        """Acquire the lease of ``predir``.

        Raises:
            LeaseHeldError: another live driver holds it (exit 2).
        """
        self.lease = Lease(predir, self.mode)
        self.lease.acquire()

    def __enter__(self) -> "SearchLease":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.lease is not None:
            self.lease.release()


def start_search(args: argparse.Namespace, spec: dict[str, Any],
                 lease: SearchLease) -> tuple[str, dict, dict, tune.Tuner]:
    """A new search: checks, then the predir (its lease taken) with its spec and ``search.json``, and a
    new Tuner.

    Returns:
        (predir, spec as run, settings, tuner).
    """
    param_space(spec)  # refuse a spec without a valid search section before creating anything
    if spec["meta"]["random_seed"] is None:
        import secrets
        spec["meta"]["random_seed"] = secrets.randbelow(2**31 - 1)
    settings = {"tune_name": spec["name"], "search_alg": search_alg_name(spec, args.search_alg),
                "max_concurrent_trials": args.max_concurrent_trials}
    init_ray(args.address, getattr(args, "dashboard", False), prestart=False)
    check_resources(spec["meta"], together=True)
    predir = predir_mod.new_predir(args.data_dir, spec["name"])
    lease.take(predir)
    storage.write_json(predir_mod.spec_file(predir, spec["name"]), spec)
    storage.write_json(storage.join(predir, "search.json"), settings)
    return predir, spec, settings, make_tuner(spec, predir, settings, args.quiet)


def resume_search(args: argparse.Namespace, new_spec: dict[str, Any], target: str,
                  lease: SearchLease) -> tuple[str, dict, dict, tune.Tuner]:
    """``search@{target}``: the lease of the run, the saved spec plus edits, and the restored (or a new)
    Tuner.

    Returns:
        (predir, spec as run, settings, tuner).
    """
    try:
        predir = resolve_predir(target, args.data_dir, args.spec_name)
    except UsageError as err:
        raise UsageError(str(err).replace("train@", "search@", 1)) from None
    lease.take(predir)
    spec, applied = resumed_spec(predir, new_spec)
    settings = read_settings(predir, spec["name"])
    init_ray(args.address, getattr(args, "dashboard", False), prestart=False)
    check_resources(spec["meta"], together=True)
    if applied:
        storage.write_json(predir_mod.spec_file(predir, spec["name"]), spec)
    for line in applied:
        print(f"applied spec edit: {line}")
    lab_trials(predir)  # rebuilds a damaged trial.json before Tune's trials read it
    verify_trials(predir, spec)
    # Tune keeps finished trials finished; with max_frame raised they must run again
    longer = any(line.startswith("env.max_frame:") for line in applied)
    tuner = restore_or_new_tuner(spec, predir, settings, args.quiet, restore=not longer)
    return predir, spec, settings, tuner


def verify_trials(predir: str, spec: dict[str, Any]) -> None:
    """Verify every existing session of a search in the driver before ``fit`` (``trial.check_session``).

    Corrupt newest checkpoints are set aside here, so their warnings reach the terminal (Tune's trial
    processes do not print to it); each is recorded under the session in ``t{T}/run.json``
    (``set_aside``). Sessions at ``max_frame`` get their train_df/eval_df copies re-exported from
    their checkpoint. The trials then plan from the verified checkpoints.

    Raises:
        UsageError: a session's checkpoints cannot be read.
    """
    for t in sorted(lab_trials(predir)):
        record = None
        for s in range(int(spec["meta"]["max_session"])):
            if not storage.exists(predir_mod.session_dir(predir, t, s)):
                continue
            plan = SessionPlan(t, s, 0, resume=False)
            is_done, selection = session_done(predir, plan, int(spec["env"]["max_frame"]))
            if is_done:  # also for trials Tune does not run again
                export_committed(predir, plan, selection)
            if plan.set_aside:
                record = record or RunRecord.load_or_new(storage.join(predir, f"t{t}"), spec["name"])
                entry = record.data["sessions"].setdefault(plan.key, {})
                entry["set_aside"] = entry.get("set_aside", []) + plan.set_aside
        if record is not None:
            record.save()


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
    from orchestrator.spec import resume_spec

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


# ---------------------------------------------------------------- analysis

def experiment_df(predir: str, spec: dict[str, Any], slm_metrics: dict[str, dict[str, Any]]) -> Any:
    """One row per trial, best first (by ``strength``, then final ``total_reward_ma``).

    Args:
        slm_metrics: ``{"t{T}": trial metrics}`` of ``analysis.analyze_predir`` (SLM-Lab's
            ``strength``, ``sample_efficiency``, ``stability``, ``consistency``, ...).

    Returns:
        Columns ``trial``, the searched values (by dotted path), ``status`` (done, stopped by the
        scheduler, error, running), ``final_metrics`` and ``analysis.TRIAL_METRICS``.
    """
    import pandas as pd

    from orchestrator.analysis import TRIAL_METRICS

    rows = []
    for t, info in sorted(lab_trials(predir).items()):
        slm = slm_metrics.get(f"t{t}", {})
        slm = {k: math.nan if slm.get(k) is None else slm[k] for k in TRIAL_METRICS}
        rows.append({"trial": t, **info["values"], "status": info["status"], **final_metrics(predir, spec, t),
                     **slm})
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    return df.sort_values(["strength", METRIC], ascending=False, na_position="last").reset_index(drop=True)


def experiment_graph(df: Any, variables: list[SearchVar], title: str) -> bytes:
    """PNG bytes: a grid of scatter plots, one row per metric, one column per searched variable."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = ["strength", METRIC, "frame"]
    color = df["strength"].fillna(df[METRIC]).fillna(0.0)
    fig, axes = plt.subplots(len(metrics), len(variables), squeeze=False,
                             figsize=(3.2 * len(variables) + 1, 2.6 * len(metrics)))
    for i, metric in enumerate(metrics):
        for j, var in enumerate(variables):
            ax = axes[i][j]
            x = df[var.path]
            if x.dtype == object:  # lists/strings (choice of hid_layers, names): categorical axis
                x = x.astype(str)
            ax.scatter(x, df[metric], c=color, cmap="viridis", edgecolors="k")
            if var.kind == "loguniform":
                ax.set_xscale("log")
            ax.set_xlabel(var.path if i == len(metrics) - 1 else "")
            ax.set_ylabel(metric if j == 0 else "")
            ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


def merge_run_records(predir: str, spec_name: str) -> None:
    """Write the predir's ``run.json`` from every trial's ``t{T}/run.json`` (sessions and resumes), so
    ``lab ls`` and the graphs' resume marks see a search like a train run. Only the driver writes it,
    after ``fit``; trials, which run concurrently, each write their own."""
    record = RunRecord.load_or_new(predir, spec_name)
    sessions, resumes = {}, []
    for t in sorted(lab_trials(predir)):
        uri = storage.join(predir, f"t{t}", "run.json")
        if storage.exists(uri):
            trial_record = RunRecord.load_or_new(storage.join(predir, f"t{t}"), spec_name).data
            sessions.update(trial_record.get("sessions", {}))
            resumes += trial_record.get("resumes", [])
    resumes.sort(key=lambda r: r["at"])
    record.data.update({"sessions": sessions, "resumes": resumes, "search": True})
    record.save()


def analyzed_trials(predir: str) -> dict[str, dict[str, Any]]:
    """Trial metrics of the trials that are over (``done`` or ``stopped``) and already analyzed.

    A done trial is analyzed when it ends (the driver's ``TrialAnalyzer``), a stopped one at the end of the
    search that stopped it; their files are not written again.

    Returns:
        ``{"t{T}": info/t{T}_trial_metrics.json}``.
    """
    out = {}
    for t, info in lab_trials(predir).items():
        uri = storage.join(predir, "info", f"t{t}_trial_metrics.json")
        if info["status"] in ("done", "stopped") and storage.exists(uri):
            out[f"t{t}"] = storage.read_json(uri)
    return out


def analyze(predir: str, spec: dict[str, Any]) -> Any:
    """Write experiment_df, trial_df, the experiment graph and the best trial's spec; returns the df.

    Per-session and per-trial metrics and graphs come from ``analysis.analyze_predir``, for the
    trials not already analyzed (``analyzed_trials``); a failure there only warns: the
    experiment_df then lacks SLM-Lab metrics.
    """
    from orchestrator.analysis import analyze_predir

    merge_run_records(predir, spec["name"])
    slm_metrics = analyzed_trials(predir)
    todo = sorted(t for t in lab_trials(predir) if f"t{t}" not in slm_metrics)
    try:
        slm_metrics.update(analyze_predir(predir, trials=todo)["trials"] if todo else {})
    except Exception as err:  # noqa: BLE001 - reported; `lab analyze` redoes it
        print(f"warning: analysis of {predir} failed ({type(err).__name__}: {err})", file=sys.stderr)
    df = experiment_df(predir, spec, slm_metrics)
    if df.empty:
        return df
    name = spec["name"]
    storage.write_parquet(storage.join(predir, "info", "experiment_df.parquet"), df)
    aggregate_trial(predir, spec, sorted(df["trial"].tolist()))
    title = f"{name}: {len(df)} trials x {spec['meta']['max_session']} sessions"
    graph = experiment_graph(df, parse_search(spec)[0], title)
    storage.write_bytes(storage.join(predir, "graph", f"{name}_experiment_graph.png"), graph)
    best_t = int(df["trial"].iloc[0])
    best = storage.read_json(predir_mod.spec_file(predir, name, best_t))
    best["meta"] = {k: v for k, v in best["meta"].items() if k != "trial"}
    # seeds of `train` on this spec = the trial's session seeds (base + 1000 T + s)
    best["meta"]["random_seed"] = session_seed(best["meta"]["random_seed"], best_t, 0)
    storage.write_json(storage.join(predir, f"{name}_best_spec.json"), {name: best})
    return df


def report_summary(predir: str, spec: dict[str, Any], df: Any, interrupted: bool = False) -> None:
    """Print the experiment table and where the best spec is (so far, when ``interrupted``)."""
    if df.empty:
        print(f"search: no trial ran in {predir}")
        return
    columns = ["trial", *[v.path for v in parse_search(spec)[0]], "status", "strength", METRIC, "frame"]
    print(df[columns].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    best = storage.join(predir, f"{spec['name']}_best_spec.json")
    from orchestrator.cli import lab_command
    print(f"search {'interrupted' if interrupted else 'done'}: {predir}\n  best trial "
          f"{'so far ' if interrupted else ''}t{int(df['trial'].iloc[0])}; run it with:\n"
          f"  {lab_command(best, spec['name'], 'train')}")

