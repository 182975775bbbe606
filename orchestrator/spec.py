"""Spec files: load, normalise, override, fill defaults, validate, and build typed sections.

A spec file maps ``spec_name -> spec``. Two shapes load (docs/ARCHITECTURE.md section 7):

* SLM-Lab v4: ``agent`` and ``env`` are one-element lists, a top-level ``body`` key (ignored),
  trailing commas allowed;
* v5 / flat: ``agent``, ``env``, ``meta`` are dicts; JSON or YAML.

The loader normalises to the flat shape before ``-s key.path=value`` overrides. Defaults come from
one place: the typed section dataclasses (``AlgorithmSpec`` subclasses, ``NetSpec``,
``MemorySpec``, ``EnvSpec``, ``MetaSpec``). Validation collects every problem with its dotted
path before raising one ``SpecError``.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import hashlib
import json
import math
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Union

import torch
import yaml

from agents.algorithms import ALGORITHMS, AgentSpec, AlgorithmSpec
from agents.memory import MEMORIES, MemorySpec
from agents.nets import (
    ACTIVATIONS,
    GLOBAL_OPTIMIZERS,
    INIT_FNS,
    LOSSES,
    NETS,
    OPTIMIZERS,
    PRECISION_NETS,
    NetSpec,
    arc_problems,
    conv_layer_args,
    make_loss,
    make_optim,
)
from agents.schedules import DECAYS, LR_SCHEDULERS, VarSchedule, lr_factor
from envs.make import EnvSpec, is_atari, resolve_env_id
from orchestrator import storage
from orchestrator.checkpoint import DEFAULT_CHECKPOINT_INTERVAL_S
from orchestrator.errors import SpecError  # noqa: F401  (defined there so the driver needs no torch; re-exported)
from orchestrator.predir import (
    read_json_file,
    session_seed,  # noqa: F401  (re-exported)
    spec_file,
)
from orchestrator.search_space import search_problems
from orchestrator.slm_lab import SHADOWED_BY, SLM_LAB_KEYS, slm_lab_key_problem, slm_lab_name_problem
from orchestrator.tracking import tracking_problems

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
        tensorboard: write TensorBoard event files under ``t{T}/s{S}/tb/`` (orchestrator/tracking.py).
        tracking: one run per session in ``none``, ``wandb`` or ``mlflow`` (orchestrator/tracking.py).
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
    ma_window: int = field(default=20, metadata={"gt": 0})
    checkpoint_frequency: int | None = field(default=None, metadata={"gt": 0})
    checkpoint_interval_s: float = field(default=DEFAULT_CHECKPOINT_INTERVAL_S, metadata={"ge": 0})
    keep_checkpoints: int = field(default=3, metadata={"gt": 0})
    resources: dict = field(default_factory=lambda: {"num_cpus": 1, "num_gpus": 0})
    max_restarts: int = field(default=3, metadata={"ge": 0})
    shutdown_grace_s: float = field(default=30.0, metadata={"gt": 0})
    distributed: bool | str = False
    search_scheduler: dict | None = None
    tensorboard: bool = True
    tracking: str = field(default="none", metadata={"choices": ("none", "wandb", "mlflow")})
    tracking_options: dict = field(default_factory=dict)
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


RUNTIME_META_KEYS = ("trial", "session", "session_seed", "session_dir")
TOP_KEYS = ("name", "agent", "env", "meta", "search")
AGENT_KEYS = ("name", "algorithm", "memory", "net", "critic_net")

# ---------------------------------------------------------------- reading files

def _strip_trailing_commas(text: str) -> str:
    """Remove JSON trailing commas (``,}`` / ``,]``) outside strings (SLM-Lab v4 files)."""
    out, in_str, esc, i = [], False, False, 0
    while i < len(text):
        ch = text[i]
        if in_str:
            esc = (ch == "\\") and not esc
            if ch == '"' and not esc:
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch == ",":
            j = i + 1
            while j < len(text) and text[j] in " \t\r\n":
                j += 1
            if j < len(text) and text[j] in "}]":
                i += 1
                continue
        out.append(ch)
        i += 1
    return "".join(out)


TEMPLATE_VAR = re.compile(r"\$\{(\w+)\}")


class _SpecYamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2 floats: ``1e7`` and ``10e6`` (no dot) are numbers, not strings."""


_SpecYamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(\d[\d_]*)?\.?\d*[eE][-+]?\d+$"), list("-+0123456789."))


def _is_anchor_entry(uri: str, name: Any) -> bool:
    """Whether a top-level entry of a YAML file is SLM-Lab's ``_name`` holder of anchors, not a spec."""
    return uri.endswith((".yml", ".yaml")) and isinstance(name, str) and name.startswith("_")


def fill_templates(text: str, variables: dict[str, str]) -> str:
    """Fill ``${var}`` placeholders of a spec file's text, as SLM-Lab's ``-s var=value`` does.

    A numeric value is written as a number, also in place of a quoted ``"${var}"`` (so
    ``-s max_frame=3e6`` makes ``"max_frame": 3000000``); any other value replaces ``${var}`` as text.
    """
    for key, value in variables.items():
        try:
            num = float(value)
        except ValueError:
            text = text.replace(f"${{{key}}}", value)
            continue
        canonical = str(int(num)) if math.isfinite(num) and num == int(num) else str(num)
        text = text.replace(f'"${{{key}}}"', canonical).replace(f"${{{key}}}", canonical)
    return text


def template_vars(uri: str) -> set[str]:
    """The ``${var}`` placeholder names in a spec file's text (empty when it cannot be read)."""
    try:
        return set(TEMPLATE_VAR.findall(storage.read_text(uri)))
    except (FileNotFoundError, storage.StorageError, UnicodeDecodeError):
        return set()


def read_spec_file(uri: str, variables: dict[str, str] | None = None) -> dict[str, Any]:
    """Parse a spec file (JSON, JSON with trailing commas, or YAML by extension).

    A file holding one bare spec (with ``agent`` and ``env`` keys, as saved in a run directory)
    is returned as ``{its name: spec}``. In a YAML file, top-level entries named ``_...`` only hold
    anchors for the specs (SLM-Lab v5): they may be any value and are not specs (see ``spec_names``).

    Args:
        uri: path or URI.
        variables: ``${var}`` placeholders filled in the text before parsing (``fill_templates``).

    Raises:
        SpecError: file missing, unreadable, not valid JSON/YAML (with line and column), or not a
            mapping of spec names to specs.
    """
    try:
        text = storage.read_text(uri)
    except FileNotFoundError:
        raise SpecError(f"spec file '{uri}' does not exist") from None
    except (storage.StorageError, UnicodeDecodeError) as err:
        raise SpecError(f"spec file '{uri}' cannot be read: {err}") from None
    text = fill_templates(text, variables or {})
    if uri.endswith((".yml", ".yaml")):
        try:
            data = yaml.load(text, Loader=_SpecYamlLoader)  # noqa: S506 - a SafeLoader subclass
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise SpecError(f"spec file '{uri}' is not valid YAML{where}: {getattr(err, 'problem', err)}") from None
    else:
        try:
            data = json.loads(_strip_trailing_commas(text))
        except json.JSONDecodeError as err:
            raise SpecError(f"spec file '{uri}' is not valid JSON: {err.msg} at line {err.lineno}, "
                            f"column {err.colno}") from None
    if isinstance(data, dict) and "agent" in data and "env" in data:  # a saved spec file of a run
        return {data.get("name") or storage.basename(uri).removesuffix("_spec.json"): data}
    if not isinstance(data, dict) or not all(isinstance(v, dict) for k, v in data.items()
                                             if not _is_anchor_entry(uri, k)):
        raise SpecError(f"spec file '{uri}' must map spec names to spec objects")
    return data


def spec_names(uri: str) -> list[str]:
    """The names of the specs in a spec file, in file order.

    Raises:
        SpecError: the file cannot be read (see ``read_spec_file``).
    """
    return [name for name in read_spec_file(uri) if not _is_anchor_entry(uri, name)]


# ---------------------------------------------------------------- shape and overrides

def _unwrap_v4_search(search: Any) -> None:
    """SLM-Lab v4's list-shaped search sections (``"agent": [{...}]``, one element per agent/env), in place.

    Raises:
        SpecError: a list other than one object.
    """
    for key in ("agent", "env"):
        value = search.get(key) if isinstance(search, dict) else None
        if isinstance(value, list):
            if len(value) != 1 or not isinstance(value[0], dict):
                raise SpecError(f"search.{key}: SLM-Lab v4's list-shaped search section needs one object (one "
                                f"{key}), got {value!r}")
            search[key] = value[0]


def _drop_shadowed(spec: dict[str, Any]) -> None:
    """Drop SLM-Lab v3's fixed values written beside the schedule that replaced them (``SHADOWED_BY``: e.g.
    ``clip_eps`` next to ``clip_eps_spec``), and searches over them: every SLM-Lab since v4 leaves them unread.
    Without their schedule they stay and are refused naming the v5 key."""
    search = spec.get("search") if isinstance(spec.get("search"), dict) else {}
    for dotted, sibling in SHADOWED_BY.items():
        *parents, key = dotted.split(".")
        section, nested = spec, search
        for part in parents:
            section = section.get(part) if isinstance(section, dict) else None
            nested = nested.get(part) if isinstance(nested, dict) else None
        if not (isinstance(section, dict) and isinstance(section.get(sibling), dict)):
            continue
        section.pop(key, None)
        for table, prefix in ((nested, f"{key}__"), (search, f"{dotted}__")):
            for name in [n for n in (table or {}) if isinstance(n, str) and n.startswith(prefix)]:
                del table[name]


def normalize(raw: dict[str, Any]) -> dict[str, Any]:
    """SLM-Lab v4 shape -> flat shape: unwrap one-element ``agent``/``env`` lists (also in ``search``), drop
    ``body`` and v3 fixed values beside their schedules (``_drop_shadowed``).

    Raises:
        SpecError: a list with other than one element (multi-agent/multi-env is not supported).
    """
    spec = copy.deepcopy(raw)
    spec.pop("body", None)
    if isinstance(spec.get("meta"), dict):  # indices a run writes into its trial/session spec files
        for key in RUNTIME_META_KEYS:
            spec["meta"].pop(key, None)
    for key in ("agent", "env"):
        value = spec.get(key)
        if isinstance(value, list):
            if len(value) != 1:
                hydra = " (SLM-Lab's multi-agent / multi-env hydra specs are not supported: one agent, one env)"
                raise SpecError(f"{key}: expected one {key} (a dict or a one-element list), got {len(value)}"
                                + (hydra if len(value) > 1 else ""))
            spec[key] = value[0]
    _unwrap_v4_search(spec.get("search"))
    _drop_shadowed(spec)
    meta = spec.get("meta")
    if isinstance(meta, dict):  # SLM-Lab per-session resource keys
        for old, new in (("num_cpus", "num_cpus"), ("num_gpus", "num_gpus")):
            if old in meta:
                spec["meta"].setdefault("resources", {})[new] = meta.pop(old)
    return spec


def parse_value(text: str) -> Any:
    """An override's value: JSON if it parses (numbers, true, null, lists), else the raw string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def apply_overrides(spec: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.path=value`` overrides to a flat spec, creating missing dicts on the way.

    Raises:
        SpecError: an override without ``=``, with an empty key (``=5``, ``a..b=1``) or whose path runs through
            a non-dict.
    """
    spec = copy.deepcopy(spec)
    for item in overrides:
        if "=" not in item:
            raise SpecError(f"override '{item}': expected key.path=value")
        path, value = item.split("=", 1)
        keys = path.strip().split(".")
        if not all(k.strip() for k in keys):
            raise SpecError(f"override '{item}': empty key in '{path}', expected key.path=value")
        node = spec
        for key in keys[:-1]:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise SpecError(f"override '{item}': '{key}' is not a section")
        node[keys[-1]] = parse_value(value)
    return spec


# ---------------------------------------------------------------- defaults and validation

def _defaults(cls: type) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def _registered(registry: dict[str, Any], name: Any) -> Any:
    """``registry[name]`` for a registered string name, else None (a list or dict name is just unknown)."""
    return registry.get(name) if isinstance(name, str) else None


def _section_classes(spec: dict[str, Any]) -> dict[str, type]:
    """The dataclass that defines each section, chosen by the names the spec gives."""
    algo_cls = _registered(ALGORITHMS, _get(spec, "agent.algorithm.name"))
    classes = {
        "agent.algorithm": algo_cls.spec_cls if algo_cls else AlgorithmSpec,
        "agent.memory": MemorySpec,
        "agent.net": NetSpec,
        "env": EnvSpec,
        "meta": MetaSpec,
    }
    if _reads_critic_net(spec):
        classes["agent.critic_net"] = NetSpec
    return classes


def _reads_critic_net(spec: dict[str, Any]) -> bool:
    """The spec has an ``agent.critic_net`` object and its algorithm builds critics from it (SAC, CrossQ)."""
    algo_cls = _registered(ALGORITHMS, _get(spec, "agent.algorithm.name"))
    return isinstance(_get(spec, "agent.critic_net"), dict) and bool(algo_cls and algo_cls.reads_critic_net)


def _get(spec: dict[str, Any], path: str) -> Any:
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
    if not all(_type_ok(v, float) and v >= 0 for v in (cpu, gpu)) or not _type_ok(sessions, int) or sessions < 1:
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
    algo_cls, memory = _registered(ALGORITHMS, _get(spec, "agent.algorithm.name")), _get(spec, "agent.memory")
    if algo_cls is not None and isinstance(memory, dict):  # the algorithm's own memory, not always Replay
        memory.setdefault("name", algo_cls.memory_names[0])
    for path, cls in _section_classes(spec).items():
        section = _get(spec, path)
        if isinstance(section, dict):
            for key, value in _defaults(cls).items():
                section.setdefault(key, value)
    return spec


def _type_ok(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        return any(_type_ok(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, origin or hint)


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) in (Union, types.UnionType):
        return " or ".join(_type_name(h) for h in typing.get_args(hint))
    return "null" if hint is type(None) else getattr(hint, "__name__", str(hint))


def _check_section(section: Any, cls: type, path: str, problems: list[str]) -> None:
    """Unknown keys (with a suggestion), types and ranges of one section."""
    if not isinstance(section, dict):
        problems.append(f"{path}: expected an object, got {type(section).__name__}")
        return
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for name, f in fields.items():
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required and name not in section:
            problems.append(f"{path}.{name}: required key is missing ({_type_name(hints[name])} expected)")
    for key, value in section.items():
        dotted = f"{path}.{key}"
        if key not in fields:
            table_key = dotted.replace("agent.critic_net.", "agent.net.", 1)  # a critic net takes net keys
            if table_key in SLM_LAB_KEYS:
                problem = slm_lab_key_problem(table_key, value)
                problem = problem and problem.replace(table_key, dotted, 1)
                problems.extend([problem] if problem else [])
                continue
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else f"; valid keys: {sorted(fields)}"
            problems.append(f"{dotted}: unknown key{hint}")
            continue
        if not _type_ok(value, hints[key]):
            problems.append(f"{dotted}: expected {_type_name(hints[key])}, got {value!r}")
            continue
        _check_range(value, fields[key].metadata, dotted, problems)
        _check_range(value, RANGE_LIMITS.get(dotted, {}), dotted, problems)


def _check_range(value: Any, meta: Any, dotted: str, problems: list[str]) -> None:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):  # see _check_finite
        return
    if "choices" in meta and value not in meta["choices"]:
        problems.append(f"{dotted}: expected one of {list(meta['choices'])}, got {value!r}")
    if "gt" in meta and not value > meta["gt"]:
        problems.append(f"{dotted}: must be > {meta['gt']}, got {value!r}")
    if "ge" in meta and not value >= meta["ge"]:
        problems.append(f"{dotted}: must be >= {meta['ge']}, got {value!r}")
    if "le" in meta and not value <= meta["le"]:
        problems.append(f"{dotted}: must be <= {meta['le']}, got {value!r}")


def _name_checker(problems: list[str]) -> Any:
    """``check(path, value, registry)``: record an unknown registry name with the valid ones."""
    def check(path: str, value: Any, valid: Any) -> None:
        if _registered(valid, value) is None:
            problems.append(slm_lab_name_problem(path, value, sorted(valid))
                            or f"{path}: unknown name {value!r}; expected one of {sorted(valid)}")
    return check


def _check_agent_names(spec: dict[str, Any], problems: list[str]) -> None:
    """Algorithm, net type and memory names, and the memory the algorithm allows."""
    check = _name_checker(problems)
    algo_name = _get(spec, "agent.algorithm.name")
    check("agent.algorithm.name", algo_name, ALGORITHMS)
    check("agent.net.type", _get(spec, "agent.net.type"), NETS)
    if _reads_critic_net(spec):
        check("agent.critic_net.type", _get(spec, "agent.critic_net.type"), NETS)
    mem_name = _get(spec, "agent.memory.name")
    check("agent.memory.name", mem_name, MEMORIES)
    algo_cls = _registered(ALGORITHMS, algo_name)
    if algo_cls and _registered(MEMORIES, mem_name) and mem_name not in algo_cls.memory_names:
        problems.append(f"agent.memory.name: {algo_name} needs one of "
                        f"{list(ALGORITHMS[algo_name].memory_names)}, got {mem_name!r}")


def _algo_cls(spec: dict[str, Any]) -> Any:
    """The registered algorithm class the spec names, or None."""
    return _registered(ALGORITHMS, _get(spec, "agent.algorithm.name"))


def _optim_paths(spec: dict[str, Any]) -> list[str]:
    """Dotted paths of the optimizer specs the algorithm reads (its ``optim_keys`` under ``agent``)."""
    algo_cls = _algo_cls(spec)
    return [f"agent.{key}" for key in (algo_cls.optim_keys if algo_cls else ("net.optim_spec",))]


def _schedule_paths(spec: dict[str, Any]) -> list[str]:
    """Dotted paths of the variable schedules the algorithm reads (its ``schedule_keys``)."""
    algo_cls = _algo_cls(spec)
    return [f"agent.algorithm.{key}" for key in (algo_cls.schedule_keys if algo_cls else ())]


def _unused_optim_problems(spec: dict[str, Any], problems: list[str]) -> None:
    """An optimizer spec of ``agent.net`` set (to other than its default) that the algorithm does not read."""
    net, paths, defaults = _get(spec, "agent.net"), _optim_paths(spec), _defaults(NetSpec)
    for key, value in (net.items() if isinstance(net, dict) and _algo_cls(spec) else []):
        unused = key.endswith("optim_spec") and f"agent.net.{key}" not in paths
        if unused and isinstance(value, dict) and value != defaults.get(key):
            problems.append(f"agent.net.{key}: {_get(spec, 'agent.algorithm.name')} does not read it; it reads "
                            f"{[p.removeprefix('agent.') for p in paths]}")


def _check_component_names(spec: dict[str, Any], problems: list[str]) -> None:
    """Optimizer, loss, LR scheduler and variable schedule names (and optimizer learning rates)."""
    check = _name_checker(problems)
    for path in _optim_paths(spec):
        optim = _get(spec, path)
        if isinstance(optim, dict):
            check(f"{path}.name", optim.get("name"), OPTIMIZERS)
            if optim.get("name") in GLOBAL_OPTIMIZERS and _get(spec, "meta.distributed") in (False, None):
                problems.append(f"{path}.name: {optim['name']!r} is SLM-Lab's optimizer of meta.distributed training "
                                f"(one global net per trial); set meta.distributed to 'synced' or 'shared', or use "
                                f"{optim['name'].removeprefix('Global')!r}")
            lr = optim.get("lr", 1e-3)
            if not _type_ok(lr, float) or lr < 0:
                problems.append(f"{path}.lr: expected a number >= 0, got {lr!r}")
            elif lr > MAX_LR:
                problems.append(f"{path}.lr: must be <= {MAX_LR:g} (larger steps diverge at once), got {lr!r}")
    _unused_optim_problems(spec, problems)
    for key, registry in (("loss_spec", LOSSES), ("lr_scheduler_spec", LR_SCHEDULERS)):
        section = _get(spec, f"agent.net.{key}")
        if isinstance(section, dict):
            check(f"agent.net.{key}.name", section.get("name"), registry)
    for path in _schedule_paths(spec):
        value = _get(spec, path)
        if isinstance(value, dict):
            check(f"{path}.name", value.get("name", "no_decay"), DECAYS)


def _check_env_name(spec: dict[str, Any], problems: list[str]) -> None:
    """The env id resolves to a registered gymnasium env."""
    env_name = _get(spec, "env.name")
    if not isinstance(env_name, str):
        problems.append(f"env.name: expected a gymnasium env id string, got {env_name!r}")
        return
    try:
        env_id = resolve_env_id(env_name)
    except ValueError as err:
        ale = env_name.startswith("ALE/") or "NoFrameskip" in env_name
        problems.append(f"env.name: {err}" + ("; Atari envs need: pip install ale-py" if ale else ""))
        return
    if not is_atari(env_id):
        env = spec["env"]
        for key, neutral in (("life_loss_info", (None, False)), ("repeat_action_probability", (None,)),
                             ("noop_max", (30,)), ("frame_skip", (4,))):
            if env.get(key, neutral[0]) not in neutral:
                problems.append(f"env.{key}: applies to Atari (ALE) envs only, not '{env_id}'")


def _int_at(spec: dict[str, Any], path: str) -> int | None:
    """The int at ``path``, or None when it is missing or not an int (then reported elsewhere)."""
    value = _get(spec, path)
    return value if _type_ok(value, int) else None


def _check_autoreset(spec: dict[str, Any], problems: list[str]) -> None:
    """``env.autoreset: next_step`` (SLM-Lab's vector stepping) does not combine with a RecurrentNet, whose
    observation windows (``envs.wrappers.ObsWindow``) start a new episode on the done step itself."""
    if _get(spec, "env.autoreset") == "next_step" and _get(spec, "agent.net.type") == "RecurrentNet":
        problems.append("env.autoreset: 'next_step' does not work with agent.net.type RecurrentNet (its observation "
                        "windows assume 'same_step'); expected env.autoreset: same_step")


def _check_sizes(spec: dict[str, Any], problems: list[str]) -> None:
    """Cross-key size rules: a replay sample and the training start fit in the replay (Replay memory, or
    SIL's replay beside its on-policy memory: on-policy memories ignore ``batch_size``/``max_size``), and
    one vector step fits in the frame budget."""
    max_size = _int_at(spec, "agent.memory.max_size")
    replay = _get(spec, "agent.memory.name") == "Replay" or getattr(_algo_cls(spec), "sil_replay", False)
    if replay and max_size is not None and max_size > 0:
        batch = _int_at(spec, "agent.memory.batch_size")
        if batch is not None and batch > max_size:
            problems.append(f"agent.memory.batch_size: {batch} transitions per sample exceeds the replay's "
                            f"capacity agent.memory.max_size={max_size}; expected batch_size <= max_size")
        start = _int_at(spec, "agent.algorithm.training_start_step")
        if start is not None and start > max_size:
            problems.append(f"agent.algorithm.training_start_step: {start} transitions can never be stored in a "
                            f"replay of agent.memory.max_size={max_size}, so training would never start; "
                            "expected training_start_step <= max_size")
    num_envs, max_frame = _int_at(spec, "env.num_envs"), _int_at(spec, "env.max_frame")
    if num_envs is not None and max_frame is not None and num_envs > max_frame > 0:
        problems.append(f"env.num_envs: one vector step of {num_envs} sub-envs is {num_envs} frames, more than "
                        f"the whole budget env.max_frame={max_frame}; expected num_envs <= max_frame")


RESOURCE_KEYS = ("num_cpus", "num_gpus")
NET_FIELDS = {f.name for f in dataclasses.fields(NetSpec)}
MAX_RESOURCE = 2**20  # CPUs or GPUs per session: more than any machine has (torch threads overflow at 2**31)


def _check_resources(spec: dict[str, Any], problems: list[str]) -> None:
    """``meta.resources``: only ``num_cpus`` and ``num_gpus``, each a number in [0, ``MAX_RESOURCE``] per session."""
    res = _get(spec, "meta.resources")
    if not isinstance(res, dict):
        return  # a non-dict is reported by the meta section's type check
    for key, value in res.items():
        path = f"meta.resources.{key}"
        if key not in RESOURCE_KEYS:
            close = difflib.get_close_matches(key, RESOURCE_KEYS, n=1)
            problems.append(f"{path}: unknown key" + (f"; did you mean '{close[0]}'?" if close else
                                                      f"; valid keys: {list(RESOURCE_KEYS)}"))
        elif not _type_ok(value, float) or not 0 <= value <= MAX_RESOURCE:
            unit = "CPUs" if key == "num_cpus" else "GPUs"
            problems.append(f"{path}: expected a number in [0, {MAX_RESOURCE}] ({unit} per session), got {value!r}")


SEARCH_RESOURCE_KEYS = ("cpu", "gpu")


def _check_slm_lab_meta(spec: dict[str, Any], problems: list[str]) -> None:
    """SLM-Lab meta keys with a meaning of their own: ``distributed``, v4's ``search``, ``search_resources``."""
    meta = spec.get("meta") if isinstance(spec.get("meta"), dict) else {}
    dist = meta.get("distributed", False)
    if dist not in (False, "synced", "shared"):
        problems.append(f"meta.distributed: expected false, 'synced' or 'shared', got {dist!r}")
    if meta.get("search") not in (None, "RandomSearch"):
        problems.append(f"meta.search: SLM-Lab v4's search algorithm {meta['search']!r} is not supported; expected "
                        "'RandomSearch' (or leave it out; --search-alg picks the sampler)")
    res = meta.get("search_resources")
    for key, value in (res.items() if isinstance(res, dict) else ()):
        if key not in SEARCH_RESOURCE_KEYS:
            problems.append(f"meta.search_resources.{key}: unknown key; valid keys: {list(SEARCH_RESOURCE_KEYS)}")
        elif not _type_ok(value, float) or not 0 <= value <= MAX_RESOURCE:
            problems.append(f"meta.search_resources.{key}: expected a number in [0, {MAX_RESOURCE}] per trial, "
                            f"got {value!r}")
    net = _get(spec, "agent.net") if isinstance(_get(spec, "agent.net"), dict) else {}
    for key in ("actor_init_std", "critic_init_std"):
        if net.get(key) is not None and net.get("init_fn") != "orthogonal_" and key not in NET_FIELDS:
            problems.append(f"agent.net.{key}: SLM-Lab's head init std applies only with init_fn 'orthogonal_' here "
                            f"(the lab's gains 0.01 policy / 1 value), got init_fn {net.get('init_fn')!r}")


def _check_finite(tree: Any, path: str, problems: list[str]) -> None:
    """NaN and infinities anywhere (Python's JSON reader accepts ``NaN``/``Infinity``): no spec value
    is meant to be one, and they turn into NaN weights instead of an error."""
    if isinstance(tree, float) and not math.isfinite(tree):
        problems.append(f"{path}: expected a finite number, got {tree!r}")
    elif isinstance(tree, dict):
        for key, value in tree.items():
            _check_finite(value, f"{path}.{key}" if path else str(key), problems)
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            _check_finite(value, f"{path}[{i}]", problems)


def _check_names(spec: dict[str, Any], problems: list[str]) -> None:
    """Registry names: algorithm, net, memory, optimizers, losses, schedules, env id."""
    _check_agent_names(spec, problems)
    _check_component_names(spec, problems)
    _check_env_name(spec, problems)


def _try_build(problems: list[str], path: str, build_fn: Any, *args: Any) -> None:
    """Record ``path: message`` if building a registered object from spec arguments fails."""
    try:
        build_fn(*args)
    except (ValueError, TypeError, ArithmeticError) as err:
        problems.append(f"{path}: cannot build from {args[-1]!r}: {err}")


def _check_layers(net: dict[str, Any], problems: list[str], path: str = "agent.net") -> None:
    """``hid_layers`` / ``fc_hid_layers``: positive ints; ``conv_hid_layers``: [out, kernel, stride, padding,
    dilation] lists (``agents.nets.conv_layer_args``); ``arc`` of a TorchArcNet: a spec torcharc builds; a
    ``RecurrentNet``'s ``rnn_hidden_size`` and ``seq_len``."""
    for key in ("hid_layers", "fc_hid_layers"):
        hid = net.get(key)
        if isinstance(hid, list) and not all(_type_ok(h, int) and h > 0 for h in hid):
            problems.append(f"{path}.{key}: expected a list of positive ints, got {hid!r}")
    for i, layer in enumerate(net.get("conv_hid_layers") or []):
        try:
            conv_layer_args(layer if isinstance(layer, list) else [layer])
        except ValueError as err:
            problems.append(f"{path}.conv_hid_layers[{i}]: {err}")
    arc, is_arc = net.get("arc"), net.get("type") == "TorchArcNet"
    if is_arc and arc is None:
        problems.append(f"{path}.arc: net.type TorchArcNet needs a torcharc spec {{modules, graph}}")
    elif is_arc and isinstance(arc, dict):  # another type is reported by the section's type check
        problems += [p.replace("agent.net.", f"{path}.", 1) for p in arc_problems(arc)]
    if net.get("precision", "float32") != "float32" and net.get("type") not in PRECISION_NETS:
        problems.append(f"{path}.precision: {net['precision']!r} is read by net types {list(PRECISION_NETS)} "
                        f"only, not {net.get('type')!r}; use 'float32'")
    for key in ("rnn_hidden_size", "seq_len") if net.get("type") == "RecurrentNet" else ():
        if net.get(key) is None:
            problems.append(f"{path}.{key}: net.type RecurrentNet needs it (a positive int; SLM-Lab has no default)")


def _check_build_args(spec: dict[str, Any], problems: list[str]) -> None:
    """What only a constructor can check: net activations/init/widths, schedule steps, and the
    keyword arguments of optimizers and LR schedulers (built once on a dummy parameter)."""
    net = _get(spec, "agent.net") if isinstance(_get(spec, "agent.net"), dict) else {}
    _check_net_build_args(net, "agent.net", problems)
    if _reads_critic_net(spec):
        _check_net_build_args(_get(spec, "agent.critic_net"), "agent.critic_net", problems)
    for path in _schedule_paths(spec):
        value = _get(spec, path)
        if isinstance(value, dict) and _registered(DECAYS, value.get("name", "no_decay")):
            _try_build(problems, path, VarSchedule.from_spec, value)
    for path in _optim_paths(spec):
        optim = _get(spec, path)
        known = isinstance(optim, dict) and _registered(OPTIMIZERS, optim.get("name"))
        if known and _type_ok(optim.get("lr", 0), float) and 0 <= optim.get("lr", 0) <= MAX_LR:  # else reported
            _try_build(problems, path, _check_optim_args, optim)


def _check_net_build_args(net: dict[str, Any], path: str, problems: list[str]) -> None:
    """A net section's activations, init, layers, loss and LR scheduler (built once on a dummy parameter)."""
    for key, valid in (("hid_layers_activation", ACTIVATIONS), ("out_layer_activation", ACTIVATIONS),
                       ("init_fn", INIT_FNS)):
        if net.get(key) is not None and _registered(valid, net[key]) is None:
            problems.append(f"{path}.{key}: unknown name {net[key]!r}; expected one of {sorted(valid)}")
    _check_layers(net, problems, path)
    loss = net.get("loss_spec")
    if isinstance(loss, dict) and _registered(LOSSES, loss.get("name")):
        _try_build(problems, f"{path}.loss_spec", make_loss, loss)
    sched = net.get("lr_scheduler_spec")
    if isinstance(sched, dict) and _registered(LR_SCHEDULERS, sched.get("name")):
        _try_build(problems, f"{path}.lr_scheduler_spec", lambda spec: lr_factor(spec)(0), sched)


def _check_optim_args(optim_spec: dict[str, Any]) -> None:
    """Build the optimizer of ``optim_spec`` on an empty parameter list: torch's optimizers check
    their arguments before their parameters, and this never calls ``add_param_group``, whose first
    call imports ``torch._dynamo`` (1 to 4 s of the driver's start-up on 2 cores).

    Raises:
        ValueError / TypeError: a bad argument (anything but torch's "empty parameter list").
    """
    try:
        make_optim([], optim_spec)
    except ValueError as err:
        if "empty parameter list" not in str(err):
            raise


def _check_agent_keys(agent: dict[str, Any], problems: list[str]) -> None:
    """Keys of the ``agent`` section: its sections, ``name``, and SLM-Lab's agent-level keys (``critic_net``)."""
    for key in agent:
        if f"agent.{key}" in SLM_LAB_KEYS:
            problem = slm_lab_key_problem(f"agent.{key}", agent[key])
            problems.extend([problem] if problem else [])
        elif key not in AGENT_KEYS:
            close = difflib.get_close_matches(key, AGENT_KEYS, n=1)
            problems.append(f"agent.{key}: unknown key" + (f"; did you mean '{close[0]}'?" if close else ""))


def validate(spec: dict[str, Any]) -> list[str]:
    """Every problem of a defaults-filled flat spec, each prefixed by its dotted path."""
    problems: list[str] = []
    for key in spec:
        if key not in TOP_KEYS:
            close = difflib.get_close_matches(key, TOP_KEYS, n=1)
            problems.append(f"{key}: unknown top-level key" + (f"; did you mean '{close[0]}'?" if close else ""))
    agent = spec.get("agent")
    if not isinstance(agent, dict):
        return problems + [f"agent: expected an object with {list(AGENT_KEYS[1:])}, got {agent!r}"]
    _check_agent_keys(agent, problems)
    if "critic_net" in agent and not isinstance(agent["critic_net"], dict):
        problems.append(f"agent.critic_net: expected an object (a net spec), got {agent['critic_net']!r}")
    elif "critic_net" in agent and not _reads_critic_net(spec) and _algo_cls(spec) is not None:
        problems.append(f"agent.critic_net: {_get(spec, 'agent.algorithm.name')} does not read it (a separate "
                        f"critic net spec, read by SoftActorCritic and CrossQ); expected no agent.critic_net")
    if not isinstance(spec.get("env"), dict):
        return problems + [f"env: expected an object, got {spec.get('env')!r}"]
    known_algo = _registered(ALGORITHMS, _get(spec, "agent.algorithm.name")) is not None
    for path, cls in _section_classes(spec).items():
        if path != "agent.algorithm" or known_algo:  # an unknown algorithm has no key set to check
            _check_section(_get(spec, path), cls, path, problems)
    _check_names(spec, problems)
    _check_build_args(spec, problems)
    _check_sizes(spec, problems)
    _check_autoreset(spec, problems)
    _check_resources(spec, problems)
    _check_slm_lab_meta(spec, problems)
    _check_finite(spec, "", problems)
    if not isinstance(spec.get("search"), dict):
        problems.append(f"search: expected an object, got {spec.get('search')!r}")
    else:
        problems += search_problems(spec)
    problems += tracking_problems(spec.get("meta"))
    return problems


# ---------------------------------------------------------------- entry points

def split_overrides(uri: str, overrides: list[str]) -> tuple[dict[str, str], list[str]]:
    """``-s`` items -> (template variables, ``key.path=value`` overrides).

    An item ``var=value`` whose ``var`` is a ``${var}`` placeholder of the file fills it (SLM-Lab's
    ``-s``); every other item is an override of a spec leaf.
    """
    names = template_vars(uri) if any("=" in item for item in overrides) else set()
    variables, rest = {}, []
    for item in overrides:
        key, sep, value = item.partition("=")
        if sep and key.strip() in names:
            variables[key.strip()] = value
        else:
            rest.append(item)
    return variables, rest


def _unfilled(tree: Any, path: str = "") -> list[tuple[str, str]]:
    """``(dotted path, var)`` for every ``${var}`` placeholder left in a parsed spec."""
    if isinstance(tree, str):
        return [(path, var) for var in TEMPLATE_VAR.findall(tree)]
    if isinstance(tree, dict):
        return [hit for key, value in tree.items() for hit in _unfilled(value, f"{path}.{key}" if path else str(key))]
    if isinstance(tree, list):
        return [hit for i, value in enumerate(tree) for hit in _unfilled(value, f"{path}[{i}]")]
    return []


def load_spec(uri: str, name: str, overrides: list[str] | None = None) -> dict[str, Any]:
    """Read, fill templates, normalise, override, default and validate one spec.

    Args:
        uri: spec file path or URI.
        name: spec name inside the file.
        overrides: ``-s`` strings: ``var=value`` fills the file's ``${var}`` placeholders (SLM-Lab v5),
            any other ``key.path=value`` is applied after normalisation.

    Returns:
        The full flat spec as run (defaults filled), with ``name`` set and a relative local
        ``agent.net.init_from`` made absolute.

    Raises:
        SpecError: listing every problem found.
    """
    variables, overrides = split_overrides(uri, overrides or [])
    specs = read_spec_file(uri, variables)
    if _is_anchor_entry(uri, name) and name in specs:
        raise SpecError(f"spec name '{name}': in SLM-Lab YAML files, top-level '_' entries only hold anchors for "
                        f"the specs, they are not specs; the specs are: {', '.join(spec_names(uri))}")
    if name not in specs:
        names = [n for n in specs if not _is_anchor_entry(uri, n)]
        close = difflib.get_close_matches(name, names, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise SpecError(f"spec name '{name}' is not in '{uri}'; it has: {', '.join(sorted(names))}.{hint}")
    unfilled = _unfilled(specs[name])
    if unfilled:
        raise SpecError([f"{path}: '${{{var}}}' is a template variable of the spec file (SLM-Lab v5); fill it on "
                         f"the command line with -s {var}=VALUE" for path, var in unfilled])
    spec = apply_overrides(normalize(specs[name]), overrides)
    spec["name"] = name
    spec = check(spec)
    if isinstance(spec["agent"]["net"].get("init_from"), str):  # actors may run in another directory
        spec["agent"]["net"]["init_from"] = storage.absolute(spec["agent"]["net"]["init_from"])
    return spec


def coerce_integral_floats(spec: dict[str, Any]) -> dict[str, Any]:
    """A copy with integral floats made ints in int-typed keys (``"max_frame": 1e6``, ASHA's
    ``grace_period``), as SLM-Lab's spec check casts them; a fractional float there stays and is reported."""
    spec = copy.deepcopy(spec)
    for path, cls in _section_classes(spec).items():
        section = _get(spec, path)
        if not isinstance(section, dict):
            continue
        hints = typing.get_type_hints(cls)
        for key, value in section.items():
            hint = hints.get(key)
            int_only = hint is not None and _type_ok(1, hint) and not _type_ok(0.5, hint)
            if int_only and isinstance(value, float) and value.is_integer():
                section[key] = int(value)
    sched = _get(spec, "meta.search_scheduler")
    for key in ("grace_period", "brackets", "max_t") if isinstance(sched, dict) else ():
        if isinstance(sched.get(key), float) and sched[key].is_integer():
            sched[key] = int(sched[key])
    return spec


def apply_use_same_optim(spec: dict[str, Any]) -> dict[str, Any]:
    """SLM-Lab's ``agent.net.use_same_optim: true``: an unshared ActorCritic builds its critic from the actor's
    net spec, so the critic's optimizer spec is the actor's (``actor_optim_spec``, else ``optim_spec``). Here that
    is written into ``critic_optim_spec``; with a shared net, or an algorithm without a critic optimizer, the key
    has no effect (as in SLM-Lab). Returns a copy."""
    spec = copy.deepcopy(spec)
    net, algo_cls = _get(spec, "agent.net"), _algo_cls(spec)
    if not isinstance(net, dict) or net.get("use_same_optim") is not True or net.get("shared", False) is not False:
        return spec
    if algo_cls is None or "net.critic_optim_spec" not in algo_cls.optim_keys:
        return spec
    source = net.get("actor_optim_spec") or net.get("optim_spec")
    if isinstance(source, dict):
        net["critic_optim_spec"] = copy.deepcopy(source)
    return spec


def check(spec: dict[str, Any]) -> dict[str, Any]:
    """Fill defaults and validate a flat spec; returns the filled copy.

    Raises:
        SpecError: listing every problem found.
    """
    spec = fill_defaults(apply_use_same_optim(coerce_integral_floats(spec)))
    problems = validate(spec)
    if problems:
        raise SpecError(problems)
    return spec


def _known(cls: type, section: dict[str, Any]) -> dict[str, Any]:
    """The keys of ``section`` that are fields of ``cls`` (drops inert SLM-Lab keys)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in section.items() if k in names}


def build(spec: dict[str, Any]) -> RunSpec:
    """Typed sections of a checked spec (``check``/``load_spec`` output)."""
    agent, env = spec["agent"], spec["env"]
    algo_cls = ALGORITHMS[agent["algorithm"]["name"]]
    agent_spec = AgentSpec(algo_cls.spec_cls(**_known(algo_cls.spec_cls, agent["algorithm"])),
                           MemorySpec(**_known(MemorySpec, agent["memory"])),
                           NetSpec(**_known(NetSpec, agent["net"])),
                           NetSpec(**_known(NetSpec, agent["critic_net"])) if "critic_net" in agent else None)
    return RunSpec(spec["name"], agent_spec, EnvSpec(**_known(EnvSpec, env)),
                   MetaSpec(**_known(MetaSpec, spec["meta"])), spec.get("search", {}), spec)


def spec_hash(spec: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of a spec (first 16 hex digits)."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]



# Edits a resume may apply: they change only the future of a run (docs/ARCHITECTURE.md section 5).
RESUME_EDITABLE = ("env.max_frame", "meta.log_frequency", "meta.eval_frequency", "meta.checkpoint_frequency",
                   "meta.checkpoint_interval_s", "meta.keep_checkpoints", "meta.resources", "meta.max_session",
                   "meta.rigorous_eval",
                   "meta.max_restarts", "meta.shutdown_grace_s", "meta.tensorboard", "meta.tracking",
                   "meta.tracking_options")


# null in the spec given on train@ keeps the saved value: the seed, and the replay layout (null picks one by the
# observations; a run saved with an explicit true/false keeps the layout its checkpointed replay is in)
KEEP_SAVED_IF_UNSET = ("meta.random_seed", "agent.memory.optimize_memory_usage")


def _leaves(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Flatten nested dicts to ``{dotted.path: leaf}`` (lists are leaves)."""
    if not isinstance(tree, dict) or not tree:
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(_leaves(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def resume_edits(saved: dict[str, Any], new: dict[str, Any]) -> tuple[dict[str, Any], list[str], list[str]]:
    """Compare the spec a run was saved with against the spec given on ``train@``.

    Edits under ``RESUME_EDITABLE`` are applied (``max_frame`` and ``max_session`` only upwards);
    every other difference contradicts the past. ``meta.random_seed`` unset in the new spec means
    "keep the saved seed", ``agent.memory.optimize_memory_usage`` unset "keep the saved replay layout". Keys
    the saved spec lacks (fields added to the lab since it was saved, e.g. ``env.noop_max``,
    ``agent.net.conv_hid_layers``) take their current defaults, so older runs resume.

    Args:
        saved: the checked spec stored in the predir.
        new: the checked spec from the spec file and ``-s`` overrides.

    Returns:
        (merged spec, applied edits as "key: old -> new", conflicts as "key: saved X, given Y").
    """
    saved = fill_defaults(saved)  # keys added to the lab after the run was saved: their defaults
    old_leaves, new_leaves = _leaves(saved), _leaves(new)
    merged = copy.deepcopy(saved)
    applied, conflicts = [], []
    for key in sorted(set(old_leaves) | set(new_leaves)):
        old, value = old_leaves.get(key), new_leaves.get(key)
        if old == value or key == "name" or (key in KEEP_SAVED_IF_UNSET and value is None):
            continue
        editable = any(key == e or key.startswith(e + ".") for e in RESUME_EDITABLE)
        lowered = key in ("env.max_frame", "meta.max_session") and isinstance(old, int) and value < old
        if not editable or lowered:
            why = " (may only be raised)" if lowered else ""
            conflicts.append(f"{key}: the run was saved with {old!r}, the spec gives {value!r}{why}")
            continue
        node = merged
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
        applied.append(f"{key}: {old!r} -> {value!r}")
    return merged, applied, conflicts


def resume_spec(predir: str, new_spec: dict[str, Any],
                what: str = "the run's saved spec") -> tuple[dict[str, Any], list[str], dict[str, Any]]:
    """The spec a resume of ``predir`` runs (``train@``, ``search@``): the run's saved spec with the edits of
    ``new_spec`` (the checked spec given now) merged by ``resume_edits``, checked again.

    Returns:
        (merged checked spec, applied edits as "key: old -> new", the saved spec as read).

    Raises:
        SpecError: edits that contradict the run's past (each key with both values).
        UsageError: the saved spec is missing or damaged (``what`` names it).
        storage.StorageError: the store cannot be read.
    """
    saved = read_json_file(spec_file(predir, new_spec["name"]), what)
    merged, applied, conflicts = resume_edits(saved, new_spec)
    if conflicts:
        raise SpecError([f"cannot resume {predir}: the spec contradicts the run's past"] + conflicts)
    return check(merged), applied, saved
