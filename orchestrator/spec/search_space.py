"""The spec ``search`` section (SLM-Lab syntax), without Ray: parse, validate, apply sampled values.

A search section mirrors the spec's nesting; each leaf key is ``{key}__{space_type}``, and a key may
itself be a dotted path, so these are the same search::

    {"agent": {"net": {"optim_spec": {"lr__loguniform": [1e-4, 1e-2]}}}}
    {"agent.net.optim_spec.lr__loguniform": [1e-4, 1e-2]}

Space types and their arguments: every Ray Tune search-space function SLM-Lab accepts (its
``getattr(tune, type)(*arg)``, ``choice`` taking the list itself), plus ``normal`` (= ``randn``) and
``grid_search``. ``orchestrator.search`` turns them into Ray Tune domains:

=============  =========================  ========================================================
type           argument                   values
=============  =========================  ========================================================
grid_search    [v1, v2, ...]              every value, each once per sample (multiplies ``max_trial``)
choice         [v1, v2, ...]              one value drawn uniformly
uniform        [low, high]                float in [low, high)
quniform       [low, high, q]             uniform, rounded to a multiple of q
loguniform     [low, high(, base)]        float, log-uniform in [low, high), 0 < low
qloguniform    [low, high, q(, base)]     loguniform, rounded to a multiple of q
randint        [low, high]                int in [low, high) (numpy semantics: high is exclusive)
qrandint       [low, high(, q)]           int in [low, high], a multiple of q (high inclusive)
lograndint     [low, high(, base)]        int, log-uniform in [low, high), 0 < low
qlograndint    [low, high, q(, base)]     lograndint, a multiple of q (high inclusive)
normal, randn  [mean, sd]                 float from N(mean, sd^2), sd > 0
qrandn         [mean, sd, q]              randn, rounded to a multiple of q
=============  =========================  ========================================================

``sample_from`` (a Python callable) cannot be written in a spec file and is refused by name.

SLM-Lab v4 list-shaped sections, ``{"agent": [{"algorithm": {"gamma__grid_search": [...]}}]}``
(one element per agent), are unwrapped like the v4 ``agent`` list (``spec.normalize``).

``meta.search_scheduler`` (optional): ASHA, Tune's ``AsyncHyperBandScheduler`` on ``time_attr="frame"``
and ``total_reward_ma`` (max): ``{"name": "ASHA", "grace_period": frames, "reduction_factor": r,
"brackets": n}``; ``name`` may be left out (SLM-Lab v5 writes none: it always uses ASHA),
``grace_period`` in frames (default 1, Tune's), ``r`` > 1 (default 2), ``brackets`` (default 1).
``max_t`` is ``env.max_frame`` (a ``max_t`` given must equal it); ``time_attr``, ``metric`` and
``mode`` may be given only with these values. ``{"name": "PBT"|"PB2", ...}``: population-based training
(``orchestrator.spec.pbt``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from orchestrator.spec import pbt
from orchestrator.spec.hints import did_you_mean
from orchestrator.spec.slm_lab import ANY, SLM_LAB_KEYS

# type -> (number of numeric arguments, optional trailing ones): grid_search and choice take a list of values
NUMERIC_TYPES: dict[str, tuple[int, int]] = {
    "uniform": (2, 0), "quniform": (3, 0), "loguniform": (2, 1), "qloguniform": (3, 1),
    "randint": (2, 0), "qrandint": (2, 1), "lograndint": (2, 1), "qlograndint": (3, 1),
    "normal": (2, 0), "randn": (2, 0), "qrandn": (3, 0),
}
SPACE_TYPES = ("grid_search", "choice", *NUMERIC_TYPES)
INT_TYPES = ("randint", "qrandint", "lograndint", "qlograndint")
LOG_TYPES = ("loguniform", "qloguniform", "lograndint", "qlograndint")
NORMAL_TYPES = ("normal", "randn", "qrandn")
SCHEDULERS = ("ASHA", "PBT", "PB2")
SCHEDULER_KEYS = ("name", "grace_period", "reduction_factor", "brackets", "max_t", "time_attr", "metric", "mode")
SCHEDULER_FIXED = {"time_attr": "frame", "metric": "total_reward_ma", "mode": "max"}


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


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _arg_problem(kind: str, arg: Any) -> str | None:
    """Why ``arg`` is not a valid argument of space type ``kind`` (None if it is)."""
    if kind in ("grid_search", "choice"):
        return None if isinstance(arg, list) and arg else "expected a non-empty list of values"
    need, optional = NUMERIC_TYPES[kind]
    if not (isinstance(arg, list) and need <= len(arg) <= need + optional and all(map(_is_number, arg))):
        count = f"{need}" + (f" or {need + optional}" if optional else "")
        return f"{kind} expects a list of {count} numbers, got {arg!r}"
    if kind in NORMAL_TYPES:
        return None if arg[1] > 0 else f"the standard deviation must be > 0, got {arg[1]!r}"
    low, high = arg[0], arg[1]
    if not low < high:
        return f"expected low < high, got {arg!r}"
    if kind in LOG_TYPES and low <= 0:
        return f"{kind} needs 0 < low, got {arg!r}"
    if kind in INT_TYPES and not all(isinstance(v, int) for v in arg[:3 if kind.startswith("q") else 2]):
        return f"{kind} needs int bounds (and step), got {arg!r}"
    if kind.startswith("q") and len(arg) > 2 and not arg[2] > 0:
        return f"{kind} needs a step q > 0, got {arg[2]!r}"
    if kind in LOG_TYPES and len(arg) == need + 1 and not arg[-1] > 1:
        return f"{kind} needs a log base > 1, got {arg[-1]!r}"
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
        if kind == "sample_from":
            problems.append(f"{where}: Tune's sample_from takes a Python function, which a spec file cannot hold; "
                            f"use one of {list(SPACE_TYPES)}")
            continue
        if kind not in SPACE_TYPES:
            problems.append(f"{where}: unknown space type '{kind}'{did_you_mean(kind, SPACE_TYPES)} "
                            f"(expected one of {list(SPACE_TYPES)})")
            continue
        if path.split(".")[0] in ("search", "name"):
            problems.append(f"{where}: '{path}' cannot be searched")
            continue
        inert = path in SLM_LAB_KEYS and ANY in SLM_LAB_KEYS[path][0]  # SLM-Lab reads it nowhere: set, unread
        if not _has_path(spec, path) and path in SLM_LAB_KEYS and not inert:
            problems.append(f"{where}: searches '{path}', an SLM-Lab key not supported here: {SLM_LAB_KEYS[path][1]}")
            continue
        if not _has_path(spec, path) and not inert:
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
    """Problems of ``meta.search_scheduler`` (null, an ASHA dict, ``name`` may be left out, or a PBT one:
    ``orchestrator.spec.pbt``)."""
    meta = spec.get("meta")
    sched = meta.get("search_scheduler") if isinstance(meta, dict) else None  # a non-dict meta is reported
    if sched is None:
        return []
    if not isinstance(sched, dict):
        return [f"meta.search_scheduler: expected an object or null, got {sched!r}"]
    where = "meta.search_scheduler"
    if sched.get("name") in pbt.METHODS:
        return pbt.pbt_problems(spec, parse_search(spec)[0])
    problems = [f"{where}.{k}: unknown key; valid keys: {list(SCHEDULER_KEYS)}"
                for k in sched if k not in SCHEDULER_KEYS]
    if sched.get("name", "ASHA") not in SCHEDULERS:
        problems.append(f"{where}.name: expected one of {list(SCHEDULERS)} (or no name: ASHA), "
                        f"got {sched.get('name')!r}")
    problems += [f"{where}.{k}: the lab's ASHA uses {k}={v!r}, got {sched[k]!r}"
                 for k, v in SCHEDULER_FIXED.items() if k in sched and sched[k] != v]
    for key, default in (("grace_period", 1), ("brackets", 1)):
        value = sched.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            what = "frames as an int" if key == "grace_period" else "an int"
            problems.append(f"{where}.{key}: expected {what} > 0, got {value!r}")
    factor = sched.get("reduction_factor", 2)
    if not _is_number(factor) or factor <= 1:
        problems.append(f"{where}.reduction_factor: expected a number > 1, got {factor!r}")
    max_frame = spec.get("env", {}).get("max_frame") if isinstance(spec.get("env"), dict) else None
    if "max_t" in sched and sched["max_t"] != max_frame:
        problems.append(f"{where}.max_t: ASHA's max_t is env.max_frame={max_frame!r} here, got {sched['max_t']!r}")
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
