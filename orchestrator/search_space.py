"""The spec ``search`` section (SLM-Lab syntax), without Ray: parse, validate, apply sampled values.

A search section mirrors the spec's nesting; each leaf key is ``{key}__{space_type}``, and a key may
itself be a dotted path, so these are the same search::

    {"agent": {"net": {"optim_spec": {"lr__loguniform": [1e-4, 1e-2]}}}}
    {"agent.net.optim_spec.lr__loguniform": [1e-4, 1e-2]}

Space types and their arguments (``orchestrator.search`` turns them into Ray Tune domains):

=============  ===================  ==============================================================
type           argument             values
=============  ===================  ==============================================================
grid_search    [v1, v2, ...]        every value, each once per sample (multiplies ``max_trial``)
choice         [v1, v2, ...]        one value drawn uniformly
uniform        [low, high]          float in [low, high)
loguniform     [low, high]          float, log-uniform in [low, high), 0 < low
randint        [low, high]          int in [low, high) (numpy semantics: high is exclusive)
normal         [mean, sd]           float from N(mean, sd^2), sd > 0
=============  ===================  ==============================================================

``meta.search_scheduler`` (optional): ``{"name": "ASHA", "grace_period": frames,
"reduction_factor": r}``; ``grace_period`` in frames, ``r`` > 1 (default 2).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

SPACE_TYPES = ("grid_search", "choice", "uniform", "loguniform", "randint", "normal")
SCHEDULERS = ("ASHA",)
SCHEDULER_KEYS = ("name", "grace_period", "reduction_factor")


@dataclass(frozen=True)
class SearchVar:
    """One searched spec leaf.

    Fields:
        path: dotted spec path of the leaf, e.g. ``agent.net.optim_spec.lr``.
        kind: one of ``SPACE_TYPES``.
        arg: the list given in the spec (values, or bounds / mean and sd).
    """

    path: str
    kind: str
    arg: Any


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{dotted.key__type: arg}`` of a (possibly nested) search section."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if "__" not in str(key) and isinstance(value, dict):
            out.update(_flatten(value, dotted))
        else:
            out[dotted] = value
    return out


def _arg_problem(kind: str, arg: Any) -> str | None:
    """Why ``arg`` is not a valid argument of space type ``kind`` (None if it is)."""
    if kind in ("grid_search", "choice"):
        return None if isinstance(arg, list) and arg else "expected a non-empty list of values"
    numbers = isinstance(arg, list) and len(arg) == 2 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in arg)
    if not numbers:
        return "expected a list of two numbers"
    low, high = arg
    if kind == "normal":
        return None if high > 0 else f"the standard deviation must be > 0, got {high!r}"
    if not low < high:
        return f"expected low < high, got {arg!r}"
    if kind == "loguniform" and low <= 0:
        return f"loguniform needs 0 < low, got {arg!r}"
    if kind == "randint" and not all(isinstance(v, int) for v in arg):
        return f"randint needs two ints, got {arg!r}"
    return None


def _has_path(spec: dict[str, Any], path: str) -> bool:
    node: Any = spec
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


def parse_search(spec: dict[str, Any]) -> tuple[list[SearchVar], list[str]]:
    """The searched variables of a defaults-filled spec, and every problem of its search section.

    Returns:
        (variables in the order given, problems each prefixed by ``search.{dotted key}``).
    """
    search = spec.get("search") or {}
    variables, problems = [], []
    for key, arg in _flatten(search).items():
        where = f"search.{key}"
        path, sep, kind = key.rpartition("__")
        if not sep or not path:
            problems.append(f"{where}: expected '{{spec.path}}__{{type}}', type one of {list(SPACE_TYPES)}")
            continue
        if kind not in SPACE_TYPES:
            problems.append(f"{where}: unknown space type '{kind}'; expected one of {list(SPACE_TYPES)}")
            continue
        if path.split(".")[0] in ("search", "name"):
            problems.append(f"{where}: '{path}' cannot be searched")
            continue
        if not _has_path(spec, path):
            problems.append(f"{where}: '{path}' does not exist in the spec")
            continue
        if any(v.path == path for v in variables):
            problems.append(f"{where}: '{path}' is searched twice")
            continue
        problem = _arg_problem(kind, arg)
        if problem:
            problems.append(f"{where}: {problem}")
            continue
        variables.append(SearchVar(path, kind, arg))
    return variables, problems


def scheduler_problems(spec: dict[str, Any]) -> list[str]:
    """Problems of ``meta.search_scheduler`` (null, or an ASHA dict)."""
    meta = spec.get("meta")
    sched = meta.get("search_scheduler") if isinstance(meta, dict) else None  # a non-dict meta is reported
    if sched is None:
        return []
    if not isinstance(sched, dict):
        return [f"meta.search_scheduler: expected an object or null, got {sched!r}"]
    problems = [f"meta.search_scheduler.{k}: unknown key; valid keys: {list(SCHEDULER_KEYS)}"
                for k in sched if k not in SCHEDULER_KEYS]
    if sched.get("name") not in SCHEDULERS:
        problems.append(f"meta.search_scheduler.name: expected one of {list(SCHEDULERS)}, "
                        f"got {sched.get('name')!r}")
    grace = sched.get("grace_period")
    if not isinstance(grace, int) or isinstance(grace, bool) or grace <= 0:
        problems.append(f"meta.search_scheduler.grace_period: expected frames as an int > 0, got {grace!r}")
    factor = sched.get("reduction_factor", 2)
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or factor <= 1:
        problems.append(f"meta.search_scheduler.reduction_factor: expected a number > 1, got {factor!r}")
    return problems


def search_problems(spec: dict[str, Any]) -> list[str]:
    """Every problem of the ``search`` section and ``meta.search_scheduler`` (for ``spec.validate``)."""
    return parse_search(spec)[1] + scheduler_problems(spec)


def plain(value: Any) -> Any:
    """A JSON-ready Python value from a sampled one (numpy scalars -> int/float/bool)."""
    if hasattr(value, "item") and not isinstance(value, (list, dict, str)):
        return value.item()
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def apply_values(spec: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``spec`` with each ``{dotted.path: value}`` set and the ``search`` section emptied.

    Raises:
        KeyError: a path that does not exist in the spec (``parse_search`` reports these first).
    """
    out = copy.deepcopy(spec)
    for path, value in values.items():
        *parents, leaf = path.split(".")
        node = out
        for key in parents:
            node = node[key]
        if leaf not in node:
            raise KeyError(f"search path '{path}' does not exist in the spec")
        node[leaf] = plain(value)
    out["search"] = {}
    return out
