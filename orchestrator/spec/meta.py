"""The spec's ``meta`` section as a typed record, importable without torch: the drivers (trial, search, modes) hold
a ``MetaSpec`` instead of reading ``spec["meta"]``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from orchestrator.store.checkpoint import DEFAULT_CHECKPOINT_INTERVAL_S

MAX_SEED = 2**62  # seeds go to torch.manual_seed (uint64) after session offsets are added


@dataclass(frozen=True)
class MetaSpec:
    """The spec ``meta`` section.

    Fields:
        max_session: sessions (seeds) per trial.
        session_batch: seeds trained as one batched program in one actor: the trial's sessions are packed into
            groups of this many consecutive session indexes (a smaller remainder group when it does not divide
            ``max_session``; a group of one is a plain session), each group in one actor with one session's
            ``resources``. Every session keeps its own directory, train_df and checkpoints (docs/batched-seeds.md).
            1: off. Needs an algorithm and net that run batched (``agents.batched.batch_problem``). ``"auto"``: a
            new run picks it from the Ray cluster's resources when it starts (``resolve_session_batch`` in
            ``orchestrator.modes.common``) and saves the number in its spec, so every resume keeps it.
        max_trial: search samples (Ray Tune ``num_samples``).
        log_frequency: frames between train_df rows.
        eval_frequency: frames between eval checkpoints (used when ``rigorous_eval`` > 0).
        rigorous_eval: evaluation episodes per eval checkpoint (0 disables eval_df).
        random_seed: base seed in [0, 2**62]; session s of trial t uses ``random_seed + 1000 * t + s``. None: a
            seed is drawn once and written into the saved spec.
        ma_window: episodes in the ``total_reward_ma`` moving average.
        checkpoint_frequency: frames between checkpoints (None: at log rows, time-gated by
            ``checkpoint_interval_s``).
        checkpoint_interval_s: without ``checkpoint_frequency``, the least training seconds between two checkpoints:
            a log row is checkpointed once this much time, and 199x the previous checkpoint's cost (so checkpoints
            take at most 0.5% of training time), passed since the previous one; ``max_frame`` and stops always are
            (``orchestrator.session.runner.checkpoint_gap_s``). Ignored with ``checkpoint_frequency``.
        keep_checkpoints: newest checkpoints kept per session (plus the best).
        resources: per-session Ray resources ``{"num_cpus": float, "num_gpus": float}``.
        max_restarts: replacements of a dead session actor before it is marked failed.
        shutdown_grace_s: seconds sessions get to commit a final checkpoint on SIGTERM/SIGINT.
        distributed: SLM-Lab's asynchronous training: ``false`` (each session trains its own nets), ``"synced"`` or
            ``"shared"`` (the sessions of a trial train one global net held by a Ray actor; ``shared`` behaves as
            ``synced``, see ``orchestrator.global_params``).
        search_scheduler: optional Ray Tune scheduler for ``search`` mode.
        tensorboard: write TensorBoard event files under ``t{T}/s{S}/tb/`` (orchestrator/report/tracking.py).
        tracking: one run per session in ``none``, ``wandb`` or ``mlflow`` (orchestrator/report/tracking.py).
        tracking_options: ``wandb.init`` keyword arguments, or MLflow ``tracking_uri``/``experiment``.
        search: SLM-Lab v4's search algorithm name: only ``"RandomSearch"`` (Tune's generator sampling
            at random, which is what the lab's ``--search-alg basic`` does), or null.
        search_resources: SLM-Lab's per-trial resources of a search, ``{"cpu": n, "gpu": m}``; when
            ``meta.resources`` is not given, each of the trial's ``max_session`` sessions gets
            ``{"num_cpus": n / max_session, "num_gpus": m / max_session}`` (the GPU part only where CUDA
            is available, as in SLM-Lab), in every mode.
    """

    max_session: int = field(default=1, metadata={"gt": 0})
    session_batch: int | str = field(default=1, metadata={"origin": "lab", "gt": 0, "words": ("auto",)})
    max_trial: int = field(default=1, metadata={"gt": 0})
    log_frequency: int = field(default=1000, metadata={"gt": 0})
    eval_frequency: int = field(default=10000, metadata={"gt": 0})
    rigorous_eval: int = field(default=0, metadata={"ge": 0})
    random_seed: int | None = field(default=None, metadata={"ge": 0, "le": MAX_SEED})
    ma_window: int = field(default=20, metadata={"origin": "lab", "gt": 0})
    checkpoint_frequency: int | None = field(default=None, metadata={"origin": "lab", "gt": 0})
    checkpoint_interval_s: float = field(default=DEFAULT_CHECKPOINT_INTERVAL_S, metadata={"origin": "lab", "ge": 0})
    keep_checkpoints: int = field(default=3, metadata={"origin": "lab", "gt": 0})
    resources: dict = field(default_factory=lambda: {"num_cpus": 1, "num_gpus": 0}, metadata={"origin": "lab"})
    max_restarts: int = field(default=3, metadata={"origin": "lab", "ge": 0})
    shutdown_grace_s: float = field(default=30.0, metadata={"origin": "lab", "gt": 0})
    distributed: bool | str = False
    search_scheduler: dict | None = field(default=None, metadata={"origin": "lab"})
    tensorboard: bool = field(default=True, metadata={"origin": "lab"})
    tracking: str = field(default="none", metadata={"origin": "lab", "choices": ("none", "wandb", "mlflow")})
    tracking_options: dict = field(default_factory=dict, metadata={"origin": "lab"})
    search: str | None = None
    search_resources: dict | None = None

    @property
    def session_actors(self) -> int:
        """Actors the sessions of a trial run in: one per seed group, ``ceil(max_session / session_batch)``.

        Raises:
            ValueError: ``session_batch`` still ``"auto"`` (a new run resolves it first).
        """
        if not isinstance(self.session_batch, int):
            raise ValueError(f"meta.session_batch {self.session_batch!r} is not resolved to a number yet")
        return -(-self.max_session // self.session_batch)

    @classmethod
    def of(cls, spec: dict) -> MetaSpec:
        """The ``meta`` section of a loaded spec (defaults filled by ``orchestrator.spec.load``); keys this
        version does not know are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        meta: dict[str, Any] = spec.get("meta", {})
        return cls(**{k: v for k, v in meta.items() if k in names})


def set_meta(spec: dict, **values: Any) -> None:
    """Write ``values`` into the ``meta`` section of a loaded spec, in place (the drivers read it as a ``MetaSpec``).

    Raises:
        KeyError: a name that is not a ``MetaSpec`` field.
    """
    unknown = set(values) - {f.name for f in dataclasses.fields(MetaSpec)}
    if unknown:
        raise KeyError(f"not meta keys: {sorted(unknown)}")
    spec.setdefault("meta", {}).update(values)


def with_meta(spec: dict[str, Any], drop: tuple[str, ...] = (), **values: Any) -> dict[str, Any]:
    """A copy of ``spec`` whose ``meta`` section has ``values`` set and the keys ``drop`` removed (``spec`` itself
    is left as it is)."""
    meta = {k: v for k, v in spec.get("meta", {}).items() if k not in drop}
    return {**spec, "meta": {**meta, **values}}
