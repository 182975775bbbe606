"""Loading a spec: read it, apply ``-s`` overrides, fill defaults, validate (exit 2 on problems), and build the typed
``RunSpec``."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import hashlib
import json
import sys
import typing
from typing import Any

from agents.algorithms import ALGORITHMS, AgentSpec
from agents.memory import MemorySpec
from agents.nets import (
    NetSpec,
)
from envs.make import EnvSpec
from orchestrator.errors import SpecError
from orchestrator.spec.aliases import apply_key_aliases
from orchestrator.spec.files import TEMPLATE_VAR, is_anchor_entry, normalize, read_spec_file, spec_names, template_vars
from orchestrator.spec.meta import MetaSpec
from orchestrator.spec.schema import RunSpec, fill_defaults, section_classes, type_ok, value_at
from orchestrator.spec.search_space import parse_search
from orchestrator.spec.validate import algorithm_class, validate
from orchestrator.store import storage


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


def _unfilled_problem(raw: dict[str, Any], path: str, var: str) -> str:
    """Why ``${var}`` at ``path`` of spec ``raw`` is unfilled: a variable of SLM-Lab v4's ``spec_params`` (its
    experiment grid, not expanded here), of another v4-shaped spec, or a template variable (SLM-Lab v5)."""
    params = raw.get("spec_params")
    if isinstance(params, dict) and var in params:
        values = params[var] if isinstance(params[var], list) else [params[var]]
        example = values[0] if values else "VALUE"
        return (f"{path}: '${{{var}}}' is a variable of spec_params (SLM-Lab v4's parametrized spec, one trial per "
                f"combination of {var} in {values}), which this lab does not expand: run one combination per "
                f"command with -s {var}={example}")
    if isinstance(raw.get("agent"), list) or "body" in raw:
        return (f"{path}: '${{{var}}}' is a placeholder of this SLM-Lab v4 spec (v4 fills it from the entry's "
                f"spec_params, which it does not have); fill it on the command line with -s {var}=VALUE")
    return (f"{path}: '${{{var}}}' is a template variable of the spec file (SLM-Lab v5); fill it on "
            f"the command line with -s {var}=VALUE")


_WARNED: set[str] = set()  # warning lines printed by this process


def _search_section_problems(spec: dict[str, Any]) -> bool:
    """Whether the ``search`` section of a defaults-filled spec has problems; if so, print them as one warning line
    on stderr, once per process (a mode that does not search ignores the section: ``load_spec`` with ``search``
    false; the CLI's preflight loads the spec too)."""
    section = spec.get("search")
    problems = parse_search(spec)[1] if isinstance(section, dict) else [f"search: expected an object, got {section!r}"]
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    line = f"warning: the search section, which this mode does not read, has problems and is ignored: " \
           f"{problems[0]}{more}" if problems else None
    if line and line not in _WARNED:
        _WARNED.add(line)
        print(line, file=sys.stderr)
    return bool(problems)


def load_spec(uri: str, name: str, overrides: list[str] | None = None, search: bool = True) -> dict[str, Any]:
    """Read, fill templates, normalise, override, default and validate one spec.

    Args:
        uri: spec file path or URI.
        name: spec name inside the file.
        overrides: ``-s`` strings: ``var=value`` fills the file's ``${var}`` placeholders (SLM-Lab v5, and the
            variables of SLM-Lab v4's ``spec_params``: one of its combinations per command), any other
            ``key.path=value`` is applied after normalisation.
        search: the mode reads the ``search`` section (``search``); false (``dev``, ``train``): a section with
            problems is one warning line on stderr and is dropped, not refused, as SLM-Lab ignores the section in
            those modes.

    Returns:
        The full flat spec as run (defaults filled), with ``name`` set and a relative local
        ``agent.net.init_from`` made absolute.

    Raises:
        SpecError: listing every problem found.
    """
    variables, overrides = split_overrides(uri, overrides or [])
    specs = read_spec_file(uri, variables)
    if is_anchor_entry(uri, name) and name in specs:
        raise SpecError(f"spec name '{name}': in SLM-Lab YAML files, top-level '_' entries only hold anchors for "
                        f"the specs, they are not specs; the specs are: {', '.join(spec_names(uri))}")
    if name not in specs:
        names = [n for n in specs if not is_anchor_entry(uri, n)]
        close = difflib.get_close_matches(name, names, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise SpecError(f"spec name '{name}' is not in '{uri}'; it has: {', '.join(sorted(names))}.{hint}")
    raw = specs[name]
    unfilled = _unfilled({key: value for key, value in raw.items() if key != "spec_params"})
    if unfilled:
        raise SpecError([_unfilled_problem(raw, path, var) for path, var in unfilled])
    spec = apply_key_aliases(apply_overrides(normalize(raw), overrides))
    spec["name"] = name
    if not search and _search_section_problems(fill_defaults(copy.deepcopy(spec))):
        spec["search"] = {}  # ignored, as SLM-Lab ignores it outside its search mode (warned once)
    spec = check(spec)
    if isinstance(spec["agent"]["net"].get("init_from"), str):  # actors may run in another directory
        spec["agent"]["net"]["init_from"] = storage.absolute(spec["agent"]["net"]["init_from"])
    return spec


def coerce_integral_floats(spec: dict[str, Any]) -> dict[str, Any]:
    """A copy with integral floats made ints in int-typed keys (``"max_frame": 1e6``, ASHA's
    ``grace_period``), as SLM-Lab's spec check casts them; a fractional float there stays and is reported."""
    spec = copy.deepcopy(spec)
    for path, cls in section_classes(spec).items():
        section = value_at(spec, path)
        if not isinstance(section, dict):
            continue
        hints = typing.get_type_hints(cls)
        for key, value in section.items():
            hint = hints.get(key)
            int_only = hint is not None and type_ok(1, hint) and not type_ok(0.5, hint)
            if int_only and isinstance(value, float) and value.is_integer():
                section[key] = int(value)
    sched = value_at(spec, "meta.search_scheduler")
    for key in ("grace_period", "brackets", "max_t") if isinstance(sched, dict) else ():
        if isinstance(sched.get(key), float) and sched[key].is_integer():
            sched[key] = int(sched[key])
    return spec


def apply_use_same_optim(spec: dict[str, Any]) -> dict[str, Any]:
    """SLM-Lab's ``agent.net.use_same_optim: true``: an unshared ActorCritic builds its critic from the actor's
    net spec, so the critic's optimizer spec is the actor's (``actor_optim_spec``, else ``optim_spec``), and so is
    its TorchArcNet body (``actor_arc``, else ``arc``). Here that is written into ``critic_optim_spec`` and, for
    an algorithm with ``role_arcs``, ``critic_arc``; with a shared net, or an algorithm without a critic
    optimizer, the key has no effect (as in SLM-Lab). Returns a copy."""
    spec = copy.deepcopy(spec)
    net, algo_cls = value_at(spec, "agent.net"), algorithm_class(spec)
    if not isinstance(net, dict) or net.get("use_same_optim") is not True or net.get("shared", False) is not False:
        return spec
    if algo_cls is None or "net.critic_optim_spec" not in algo_cls.optim_keys:
        return spec
    source = net.get("actor_optim_spec") or net.get("optim_spec")
    if isinstance(source, dict):
        net["critic_optim_spec"] = copy.deepcopy(source)
    if algo_cls.role_arcs and (net.get("actor_arc") is not None or net.get("critic_arc") is not None):
        net["critic_arc"] = copy.deepcopy(net.get("actor_arc"))  # None: the critic's body is arc, as the actor's
    return spec


def check(spec: dict[str, Any]) -> dict[str, Any]:
    """Fill defaults and validate a flat spec (earlier key names mapped to their keys, silently:
    ``orchestrator.spec.aliases``); returns the filled copy.

    Raises:
        SpecError: listing every problem found.
    """
    spec = apply_key_aliases(copy.deepcopy(spec), warn=False)  # load_spec warned; saved specs map silently
    spec = fill_defaults(apply_use_same_optim(coerce_integral_floats(spec)))
    problems = validate(spec) or session_batch_problems(spec)
    if problems:
        raise SpecError(problems)
    return spec


def session_batch_problems(spec: dict[str, Any]) -> list[str]:
    """Why a valid spec's ``meta.session_batch`` > 1 cannot run: an agent that does not run with seeds batched
    (``agents.batched.batch_problem``) or ``meta.distributed`` (one global net per trial); [] when it can."""
    k = spec["meta"].get("session_batch", 1)
    if k == 1 or k == "auto":  # "auto" picks 1 where seeds cannot run batched (modes.common.resolve_session_batch)
        return []
    if spec["meta"].get("distributed"):
        return [f"meta.session_batch: {k} cannot run with meta.distributed (each session pushes to the trial's "
                "global net on its own); set meta.session_batch to 1 or meta.distributed to false"]
    from agents.batched import batch_problem

    problem = batch_problem(build(spec).agent)
    return [] if problem is None else [f"meta.session_batch: {k} needs an agent that runs with seeds batched: "
                                       f"{problem}; set meta.session_batch to 1"]


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


