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
metadata holds its checks (``gt``, ``ge``, ``le``, ``choices``), whether PBT may perturb it (``perturbable``:
``orchestrator.spec.pbt``) and, for a key SLM-Lab does not have, its ``origin`` (``"lab"``, or the library whose
name it borrows). ``tools/gen_reference.py`` writes the spec-key reference (docs/reference/spec-keys.md) from them.
"""

from __future__ import annotations

import copy
import dataclasses
import types
import typing
from dataclasses import dataclass
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
from orchestrator.spec.meta import MetaSpec

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


def word_problems(value: str, words: Any, dotted: str) -> list[str]:
    """[] when ``value`` is one of ``words`` (a key taking a number or these strings), else the problem."""
    return [] if value in words else [f"{dotted}: expected a number or one of {list(words)}, got {value!r}"]


def type_name(hint: Any, metadata: Any = None) -> str:
    """The name of a type hint in messages; a field's ``metadata`` with ``words`` (the only strings a ``str`` in it
    takes) names them instead of ``str``."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        return " or ".join(type_name(h, metadata) for h in typing.get_args(hint))
    if hint is str and (metadata or {}).get("words"):
        return f"one of {list(metadata['words'])}"
    return "null" if hint is type(None) else getattr(hint, "__name__", str(hint))


