"""Ray Tune's wiring for a search: the param space from the spec's search section, the search algorithm, the scheduler,
the trainable and the Tuner (new or restored)."""

from __future__ import annotations

import signal
import threading
from typing import Any, Callable, ClassVar

from ray import tune
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

from orchestrator.errors import SpecError, UsageError
from orchestrator.runtime.signals import STOP
from orchestrator.search.console import ConsoleRelay
from orchestrator.search.trials import ANALYZER, METRIC, search_trial
from orchestrator.spec.meta import MetaSpec
from orchestrator.spec.search_space import SearchVar, parse_search
from orchestrator.store import storage

TUNE_DIR = "tune"


def tune_domain(var: SearchVar) -> Any:
    """The Ray Tune domain of one searched variable (``normal`` is ``tune.randn``; ``choice`` takes the list)."""
    if var.kind in ("grid_search", "choice"):
        return getattr(tune, var.kind)(list(var.arg))
    kind = "randn" if var.kind == "normal" else var.kind
    return getattr(tune, kind)(*var.arg)


# the example of the error for a spec without a search section: a space every search method samples (basic, optuna,
# PBT, PB2), unlike grid_search, which PBT refuses
NO_SEARCH_EXAMPLE = '"search": {"agent.net.optim_spec.lr__loguniform": [0.0001, 0.01]}'


def param_space(spec: dict[str, Any]) -> dict[str, Any]:
    """Tune ``param_space``: ``{dotted.spec.path: domain}`` for every searched variable.

    Raises:
        SpecError: the search section is empty or invalid.
    """
    variables, problems = parse_search(spec)
    if problems:
        raise SpecError(problems)
    if not variables:
        raise SpecError(f"search: the spec has no search section; use train mode, or add e.g. {NO_SEARCH_EXAMPLE}")
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
    sched = MetaSpec.of(spec).search_scheduler
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


def placement(meta: MetaSpec) -> Any:
    """``PlacementGroupFactory([{}] + [session bundle] * session_actors)``: resources of every session actor (one
    per session, or per seed group with ``meta.session_batch``)."""
    res = meta.resources
    bundle = {k: float(res.get(key, 0) or 0) for k, key in (("CPU", "num_cpus"), ("GPU", "num_gpus"))}
    bundle = {k: v for k, v in bundle.items() if v > 0} or {"CPU": 0.01}
    return tune.PlacementGroupFactory([{}] + [bundle] * meta.session_actors, strategy="PACK")


def tune_storage(predir: str) -> tuple[str, Any]:
    """(storage_path, storage_filesystem) of Tune's state under ``{predir}/tune``."""
    uri = storage.join(predir, TUNE_DIR)
    if not storage.is_remote(uri):
        return storage.resolve(uri)[1], None
    fs, path = storage.resolve(uri)
    return path, fs


class StopSignalRelay(tune.Callback):
    """Hands the process's stop request (``orchestrator.runtime.signals.STOP``) to Tune's graceful stop while
    ``fit`` runs: Tune then saves its experiment state and ends the trial actors; their sessions keep the
    checkpoints they committed, and the unfinished trials stay resumable (exit 75).

    ``fit()`` installs Tune's own SIGUSR1 handler (its graceful stop) before it sets its callbacks up; this callback
    (public ``tune.Callback`` API, run in the driver's main thread) keeps Tune's handler as ``tune_stop`` and puts
    the lab's back, so every stop signal, SIGUSR1 included, reaches the lab's handler, whose target (``request``)
    calls ``tune_stop``. A stop asked before Tune's handler exists is handed over once it does (``pending``).
    Tune's SIGINT handler is off (``TUNE_DISABLE_SIGINT_HANDLER``, ``orchestrator.modes.search.fit_with_signals``).
    """

    tune_stop: ClassVar[Callable[[int, Any], None] | None] = None
    pending: ClassVar[bool] = False

    @classmethod
    def request(cls, signum: int) -> str:
        """The stop target of a running ``fit``: Tune's stop now, or once its handler exists; returns the line the
        handler prints."""
        if cls.tune_stop is not None:
            cls.tune_stop(signal.SIGUSR1, None)
        else:
            cls.pending = True
        return "stopping the search; its trials keep their committed checkpoints (Ctrl-C twice leaves at once)"

    @classmethod
    def reset(cls) -> None:
        """Forget Tune's handler (``fit`` has returned)."""
        cls.tune_stop, cls.pending = None, False

    def setup(self, **info: Any) -> None:
        """Take over from Tune's handler as ``fit`` starts (after Tune installed it)."""
        self.take_over()

    def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
        """Take over again if Tune's handler came back (a no-op otherwise)."""
        self.take_over()

    def take_over(self) -> None:
        """Keep Tune's SIGUSR1 handler as ``tune_stop`` and put the lab's back (main thread only); a pending stop
        goes to Tune now."""
        if threading.current_thread() is not threading.main_thread() or not STOP.installed:
            return
        cls = StopSignalRelay
        current = signal.getsignal(signal.SIGUSR1)
        if current != STOP.handle:
            cls.tune_stop = current if callable(current) else cls.tune_stop
            STOP.reinstall()
        if cls.pending and cls.tune_stop is not None:
            cls.pending = False
            cls.tune_stop(signal.SIGUSR1, None)


def make_tuner(spec: dict[str, Any], predir: str, settings: dict[str, Any]) -> tune.Tuner:
    """A new Tuner for the search of ``spec`` (settings from ``search.json``), with Tune's own output off
    (``verbose=0``; ``console.quiet_tune`` while it runs): the console shows the lab's (``ConsoleRelay``)."""
    storage_path, fs = tune_storage(predir)
    meta = MetaSpec.of(spec)
    namer = TrialNamer(1 if settings["search_alg"] == "optuna" else 0)
    search_alg = make_search_alg(settings["search_alg"], int(meta.random_seed), settings["max_concurrent_trials"])
    tune_config = tune.TuneConfig(
        metric=METRIC, mode="max", num_samples=meta.max_trial, scheduler=make_scheduler(spec),
        search_alg=search_alg, trial_name_creator=namer, trial_dirname_creator=namer, reuse_actors=True)
    run_config = tune.RunConfig(name=settings["tune_name"], storage_path=storage_path, storage_filesystem=fs,
                                failure_config=tune.FailureConfig(max_failures=meta.max_restarts),
                                verbose=0, callbacks=[StopSignalRelay(), ConsoleRelay()])
    return tune.Tuner(trainable(spec, predir), param_space=param_space(spec), tune_config=tune_config,
                      run_config=run_config)


def trainable(spec: dict[str, Any], predir: str) -> Any:
    """``search_trial`` bound to the spec and predir, with the placement group of its sessions."""
    bound = tune.with_parameters(search_trial, spec=spec, predir=predir)
    return tune.with_resources(bound, placement(MetaSpec.of(spec)))


def restore_or_new_tuner(spec: dict[str, Any], predir: str, settings: dict[str, Any],
                         restore: bool = True) -> tune.Tuner:
    """``Tuner.restore`` of the search's Tune state when it can be restored (and ``restore``), else a
    new Tuner (the old Tune state, if any, is deleted; the lab's trial dirs are what matters)."""
    storage_path, fs = tune_storage(predir)
    path = f"{storage_path}/{settings['tune_name']}"
    if restore and tune.Tuner.can_restore(path, storage_filesystem=fs):
        return tune.Tuner.restore(path, trainable(spec, predir), resume_unfinished=True, resume_errored=True,
                                  storage_filesystem=fs)
    storage.delete(storage.join(predir, TUNE_DIR, settings["tune_name"]))
    return make_tuner(spec, predir, settings)


