"""Spec files: load, normalise, override, fill defaults, validate, and build typed sections.

A spec file maps ``spec_name -> spec``. Two shapes load (docs/ARCHITECTURE.md section 7):

* SLM-Lab v4: ``agent`` and ``env`` are one-element lists, a top-level ``body`` key (ignored),
  trailing commas allowed;
* v5 / flat: ``agent``, ``env``, ``meta`` are dicts; JSON or YAML.

The loader normalises to the flat shape before ``-s key.path=value`` overrides. Defaults come from
one place: the typed section dataclasses (``AlgorithmSpec`` subclasses, ``NetSpec``,
``MemorySpec``, ``EnvSpec``, ``MetaSpec``). Validation collects every problem with its dotted
path before raising one ``SpecError``.

Each section dataclass documents its keys in a ``Fields:`` list of its docstring (``name: meaning``); a field's
metadata holds its checks (``gt``, ``ge``, ``le``, ``choices``) and, for a key SLM-Lab does not have, its
``origin`` (``"lab"``, or the library whose name it borrows). ``tools/gen_reference.py`` writes the spec-key
reference (docs/reference/spec-keys.md) from them.
"""

from __future__ import annotations

import copy
import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Union

import torch

from agents.algorithms import ALGORITHMS, AgentSpec, AlgorithmSpec
from agents.memory import MemorySpec
from agents.nets import (
    NetSpec,
)
from envs.envpool_vec import PLAYGROUND_PREFIX
from envs.envpool_vec import VECTORIZATION as ENVPOOL
from envs.make import EnvSpec
from orchestrator.store.checkpoint import DEFAULT_CHECKPOINT_INTERVAL_S

MAX_SEED = 2**62  # seeds go to torch.manual_seed (uint64) after session offsets are added
MAX_LR = 10.0  # learning rates above this diverge at once (weights become NaN within an update)
MAX_PASSES = 10_000  # passes over the data per update: more would not finish in any run

# Upper limits on algorithm keys whose fields (agents/algorithms) only require > 0: repeat counts
# per update whose absurd values hang a session (found by bench/spec_fuzz.py).
RANGE_LIMITS: dict[str, dict[str, Any]] = {
    "agent.algorithm.training_epoch": {"le": MAX_PASSES},
    "agent.algorithm.training_iter": {"le": MAX_PASSES},
    "agent.algorithm.training_batch_iter": {"le": MAX_PASSES},
}


@dataclass(frozen=True)
class MetaSpec:
    """The spec ``meta`` section.

    Fields:
        max_session: sessions (seeds) per trial.
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
            (``orchestrator.session_actor.checkpoint_gap_s``). Ignored with ``checkpoint_frequency``.
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


@dataclass(frozen=True)
class RunSpec:
    """A validated spec as typed sections; ``raw`` is the full dict as run (defaults filled)."""

    name: str
    agent: AgentSpec
    env: EnvSpec
    meta: MetaSpec
    search: dict
    raw: dict


TOP_KEYS = ("name", "agent", "env", "meta", "search")
AGENT_KEYS = ("name", "algorithm", "memory", "net", "critic_net")


# ---------------------------------------------------------------- shape and overrides


# ---------------------------------------------------------------- defaults and validation

def section_defaults(cls: type) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def registered(registry: dict[str, Any], name: Any) -> Any:
    """``registry[name]`` for a registered string name, else None (a list or dict name is just unknown)."""
    return registry.get(name) if isinstance(name, str) else None


def section_classes(spec: dict[str, Any]) -> dict[str, type]:
    """The dataclass that defines each section, chosen by the names the spec gives."""
    algo_cls = registered(ALGORITHMS, value_at(spec, "agent.algorithm.name"))
    classes = {
        "agent.algorithm": algo_cls.spec_cls if algo_cls else AlgorithmSpec,
        "agent.memory": MemorySpec,
        "agent.net": NetSpec,
        "env": EnvSpec,
        "meta": MetaSpec,
    }
    if reads_critic_net(spec):
        classes["agent.critic_net"] = NetSpec
    return classes


def reads_critic_net(spec: dict[str, Any]) -> bool:
    """The spec has an ``agent.critic_net`` object and its algorithm builds critics from it (SAC, CrossQ)."""
    algo_cls = registered(ALGORITHMS, value_at(spec, "agent.algorithm.name"))
    return isinstance(value_at(spec, "agent.critic_net"), dict) and bool(algo_cls and algo_cls.reads_critic_net)


def value_at(spec: dict[str, Any], path: str) -> Any:
    node: Any = spec
    for key in path.split("."):
        node = node.get(key) if isinstance(node, dict) else None
    return node


def _resources_from_search_resources(meta: Any) -> None:
    """Per-session ``meta.resources`` from SLM-Lab's per-trial ``meta.search_resources`` when only that is given
    (the GPU share only where CUDA is available, as SLM-Lab does); a bad value is left for validation."""
    if not isinstance(meta, dict) or "resources" in meta or not isinstance(meta.get("search_resources"), dict):
        return
    trial, sessions = meta["search_resources"], meta.get("max_session", 1)
    cpu, gpu = trial.get("cpu", 1), trial.get("gpu", 0)
    if not all(type_ok(v, float) and v >= 0 for v in (cpu, gpu)) or not type_ok(sessions, int) or sessions < 1:
        return
    meta["resources"] = {"num_cpus": cpu / sessions, "num_gpus": gpu / sessions if torch.cuda.is_available() else 0}


def fill_defaults(spec: dict[str, Any]) -> dict[str, Any]:
    """Fill every missing key from the section dataclasses (sections must be dicts)."""
    spec = copy.deepcopy(spec)
    spec.setdefault("meta", {})
    spec.setdefault("search", {})
    if isinstance(spec.get("agent"), dict):
        spec["agent"].setdefault("memory", {})
        spec["agent"].setdefault("net", {})
    _resources_from_search_resources(spec.get("meta"))
    env = spec.get("env")
    if isinstance(env, dict) and str(env.get("name")).startswith(PLAYGROUND_PREFIX):
        env.setdefault("vectorization", ENVPOOL)  # SLM-Lab's Playground ids: only EnvPool has them
    algo_cls, memory = registered(ALGORITHMS, value_at(spec, "agent.algorithm.name")), value_at(spec, "agent.memory")
    if algo_cls is not None and isinstance(memory, dict):  # the algorithm's own memory, not always Replay
        memory.setdefault("name", algo_cls.memory_names[0])
    for path, cls in section_classes(spec).items():
        section = value_at(spec, path)
        if isinstance(section, dict):
            for key, value in section_defaults(cls).items():
                section.setdefault(key, value)
    return spec


# ---------------------------------------------------------------- entry points




def type_ok(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        return any(type_ok(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, origin or hint)


def type_name(hint: Any) -> str:
    if typing.get_origin(hint) in (Union, types.UnionType):
        return " or ".join(type_name(h) for h in typing.get_args(hint))
    return "null" if hint is type(None) else getattr(hint, "__name__", str(hint))


