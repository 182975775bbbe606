"""Population-based training settings: ``meta.search_scheduler: {"name": "PBT" or "PB2", ...}`` and the keys it may
perturb.

PBT (Jaderberg et al. 2017, "Population Based Training of Neural Networks") trains ``meta.max_trial`` trials at
once; every ``perturbation_interval`` frames the bottom ``quantile_fraction`` of trials continue from a top trial's
checkpoints (exploit) with perturbed values of the searched keys (explore). Keys and defaults follow Ray Tune's
``PopulationBasedTraining``::

    "search_scheduler": {"name": "PBT", "perturbation_interval": 10000, "quantile_fraction": 0.25,
                         "resample_probability": 0.25, "perturbation_factors": [0.8, 1.2]}

``{"name": "PB2", "perturbation_interval": N, "quantile_fraction": 0.25}`` explores with a GP bandit instead
(Parker-Holder et al. 2020): its searched keys need bounded numeric types (``PB2_SPACE_TYPES``).

Only keys whose change mid-run is consistent may be searched (``perturbable``): learning rates and other optimizer
hyperparameters (re-applied to the optimizers' param groups after every restore), loss coefficients, the discount,
GAE's lambda, the start/end values and frames of frame-driven schedules (pure functions of the frame), gradient
clipping and the LR scheduler's arguments. Each says so next to its key, in the field metadata of its section's
dataclass (``"perturbable"``, beside ``ge``/``le``/``origin``): ``True`` for the key itself; for a dict-valued key
the keys inside it that may change (``agents.nets.spec.OPTIM_PERTURBABLE``, ``agents.schedules.SCHEDULE_PERTURBABLE``),
or ``"*"`` for every key inside it but ``name``. A key outside them (a net's layers, a batch size, the memory) is an
exit 2 naming it: its change would contradict the checkpointed state.

The interval must fall on a log row and a checkpoint (a multiple of ``meta.log_frequency``,
``meta.checkpoint_frequency`` and ``env.num_envs``; the message names the nearest valid values) and below
``env.max_frame``; a searched distribution must reach values the schema allows for its key (``key_range``, which
the explore step also clamps to); a resume keeps the population's ``env.max_frame`` and ``meta.max_session``
(``PBT_RESUME_FIXED``, checked by ``orchestrator.spec.resume``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any

PBT_KEYS = ("name", "perturbation_interval", "quantile_fraction", "resample_probability", "perturbation_factors")
PB2_KEYS = ("name", "perturbation_interval", "quantile_fraction")
METHODS = ("PBT", "PB2")

# space types PBT can perturb and resample; a grid has no distribution to resample from
PBT_SPACE_TYPES = ("choice", "uniform", "quniform", "loguniform", "qloguniform", "randint", "qrandint", "lograndint",
                   "qlograndint", "normal", "randn", "qrandn")
# PB2's bandit searches a bounded box: numeric types with low and high
PB2_SPACE_TYPES = ("uniform", "quniform", "loguniform", "qloguniform", "randint", "qrandint", "lograndint",
                   "qlograndint")
# keys a resume of a PBT search may not edit although a train@ may: the population's shape and generations
PBT_RESUME_FIXED = ("env.max_frame", "meta.max_session")
# optimizer arguments torch refuses below 0 (its constructors' checks); lr also above the schema's MAX_LR
OPTIM_NONNEGATIVE = ("weight_decay", "eps", "momentum")


@dataclass(frozen=True)
class KeyRange:
    """The values the spec schema allows for one searched key (``key_range``).

    Fields:
        low, high: the bounds (None: unbounded on that side).
        low_open, high_open: the bound itself is excluded (a schema ``gt``/``lt``).
        integer: the key's type is int.
    """

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    integer: bool = False

    def contains(self, value: Any) -> bool:
        """Whether a number ``value`` lies within the range."""
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def describe(self) -> str:
        """The range as a condition, e.g. ``>= 0 and <= 1`` (``any number`` when unbounded)."""
        parts = ([f"{'>' if self.low_open else '>='} {self.low:g}"] if self.low is not None else []) + \
            ([f"{'<' if self.high_open else '<='} {self.high:g}"] if self.high is not None else [])
        return " and ".join(parts) or "any number"


@dataclass(frozen=True)
class PBTSettings:
    """A checked ``meta.search_scheduler`` of name PBT.

    Fields:
        perturbation_interval: frames between two generations' decisions (a multiple of ``meta.log_frequency``).
        quantile_fraction: share of the population in the top and in the bottom quantile, in (0, 0.5].
        resample_probability: chance that explore draws a searched key anew from its distribution, in [0, 1].
        perturbation_factors: factors a numeric key is multiplied by (one drawn per key).
        method: ``PBT`` (random perturbations) or ``PB2`` (a GP bandit picks the explored values; Parker-Holder et
            al. 2020, "Provably Efficient Online Hyperparameter Optimization with Population-Based Bandits").
    """

    perturbation_interval: int
    quantile_fraction: float = 0.25
    resample_probability: float = 0.25
    perturbation_factors: tuple[float, ...] = (0.8, 1.2)
    method: str = "PBT"

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> "PBTSettings":
        """The settings of a spec whose ``pbt_problems`` are empty."""
        sched = spec["meta"]["search_scheduler"]
        return cls(int(sched["perturbation_interval"]), float(sched.get("quantile_fraction", 0.25)),
                   float(sched.get("resample_probability", 0.25)),
                   tuple(float(f) for f in sched.get("perturbation_factors", (0.8, 1.2))), sched["name"])

    def boundaries(self, max_frame: int) -> list[int]:
        """The frames each generation ends at: multiples of ``perturbation_interval``, then ``max_frame``."""
        out = list(range(self.perturbation_interval, max_frame, self.perturbation_interval))
        return out + [max_frame]


def is_pbt(spec: dict[str, Any]) -> bool:
    """True when ``meta.search_scheduler`` names PBT or PB2."""
    sched = (spec.get("meta") or {}).get("search_scheduler")
    return isinstance(sched, dict) and sched.get("name") in METHODS


@functools.cache
def perturbable_keys() -> dict[str, dict[str, Any]]:
    """Section prefix -> ``{key: its "perturbable" field metadata}`` for the keys that have one, over every dataclass
    that may define the section (every registered algorithm's spec class for ``agent.algorithm``)."""
    from orchestrator.spec.schema import ALGORITHMS, AlgorithmSpec, EnvSpec, MemorySpec, MetaSpec, NetSpec

    sections = {"agent.algorithm": [AlgorithmSpec, *(a.spec_cls for a in ALGORITHMS.values())],
                "agent.net": [NetSpec], "agent.critic_net": [NetSpec], "agent.memory": [MemorySpec],
                "env": [EnvSpec], "meta": [MetaSpec]}
    return {prefix: {f.name: f.metadata["perturbable"] for cls in classes for f in dataclasses.fields(cls)
                     if f.metadata.get("perturbable")}
            for prefix, classes in sections.items()}


def perturbable(path: str) -> bool:
    """Whether PBT may change spec key ``path`` between generations: its field's ``perturbable`` metadata
    (``perturbable_keys``; module docstring) says so for the key, or for the key inside a dict-valued field."""
    for prefix, marks in perturbable_keys().items():
        if not path.startswith(prefix + "."):
            continue
        key, _, sub = path[len(prefix) + 1:].partition(".")
        mark = marks.get(key)
        if not sub:
            return mark is True
        return (mark == "*" and sub != "name") or (isinstance(mark, tuple) and sub in mark)
    return False


def key_range(spec: dict[str, Any], path: str) -> KeyRange:
    """The values the schema allows for spec key ``path`` of a defaults-filled ``spec``: its section dataclass's field
    metadata (``gt``, ``ge``, ``lt``, ``le``) and ``RANGE_LIMITS``; an optimizer's ``lr`` in ``[0, MAX_LR]`` and its
    ``weight_decay``, ``eps``, ``momentum`` ``>= 0`` (the checks of ``orchestrator.spec.validate`` and torch).
    Constraints across keys (a schedule's start and end) are left to the full spec check.

    Returns:
        The range (unbounded when the schema states none).
    """
    import dataclasses
    import typing

    from orchestrator.spec.schema import MAX_LR, RANGE_LIMITS, section_classes, type_ok

    for prefix, cls in section_classes(spec).items():
        if not path.startswith(prefix + "."):
            continue
        field, _, sub = path[len(prefix) + 1:].partition(".")
        if sub:  # a key inside a dict-valued field: an optimizer's arguments
            if field.endswith("optim_spec") and sub == "lr":
                return KeyRange(0.0, float(MAX_LR))
            return KeyRange(0.0) if field.endswith("optim_spec") and sub in OPTIM_NONNEGATIVE else KeyRange()
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if field not in fields:
            return KeyRange()
        meta = {**fields[field].metadata, **RANGE_LIMITS.get(path, {})}
        hint = typing.get_type_hints(cls)[field]
        integer = type_ok(1, hint) and not type_ok(0.5, hint)
        low = meta.get("gt", meta.get("ge"))
        high = meta.get("lt", meta.get("le"))
        return KeyRange(None if low is None else float(low), None if high is None else float(high),
                        "gt" in meta, "lt" in meta, integer)
    return KeyRange()


def space_box(var: Any) -> tuple[float, float] | None:
    """The closed interval a numeric search variable's values lie in, or None for the unbounded normal types and
    ``choice``: ``randint``/``lograndint`` exclude their ``high`` (numpy's semantics), the others include it."""
    if var.kind in ("choice", "grid_search", "normal", "randn", "qrandn"):
        return None
    low, high = float(var.arg[0]), float(var.arg[1])
    return (low, high - 1) if var.kind in ("randint", "lograndint") else (low, high)


def range_problems(spec: dict[str, Any], variables: list[Any]) -> list[str]:
    """Searched keys whose distribution cannot give a value the schema allows: a box (``space_box``) outside the
    key's ``key_range``, a ``choice`` value outside it, a float distribution on an int key."""
    problems = []
    for var in variables:
        name, rng = f"search.{var.path}__{var.kind}", key_range(spec, var.path)
        box = space_box(var)
        if var.kind == "choice":
            bad = [v for v in var.arg if _number(v) and not rng.contains(v)]
            if bad:
                problems.append(f"{name}: the values {bad} lie outside the values {var.path} takes ({rng.describe()})")
        elif rng.integer and var.kind not in ("randint", "qrandint", "lograndint", "qlograndint"):
            problems.append(f"{name}: {var.path} is an int; use randint, qrandint, lograndint, qlograndint or "
                            "choice")
        elif box is not None and not (rng.contains(box[0]) or rng.contains(box[1]) or
                                      (rng.low is not None and box[0] <= rng.low <= box[1])):
            problems.append(f"{name}: {var.arg} lies outside the values {var.path} takes ({rng.describe()})")
    return problems


def valid_intervals(interval: int, step: int) -> list[int]:
    """The multiples of ``step`` nearest to ``interval`` below and above it (below left out when it is 0)."""
    below = interval // step * step
    return [v for v in (below, below + step) if v > 0]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def pbt_problems(spec: dict[str, Any], variables: list[Any]) -> list[str]:
    """Problems of a PBT ``meta.search_scheduler`` and of its searched ``variables`` (``SearchVar``s).

    Returns:
        Messages naming the key and what was expected (empty when the spec can run PBT).
    """
    sched, meta, where = spec["meta"]["search_scheduler"], spec.get("meta") or {}, "meta.search_scheduler"
    method = sched["name"]
    keys = PB2_KEYS if method == "PB2" else PBT_KEYS
    problems = [f"{where}.{k}: unknown key for {method}; valid keys: {list(keys)}" for k in sched if k not in keys]
    interval = sched.get("perturbation_interval")
    if not (isinstance(interval, int) and not isinstance(interval, bool) and interval > 0):
        problems.append(f"{where}.perturbation_interval: expected frames as an int > 0, got {interval!r}")
    else:
        steps = {f"meta.{k}": meta.get(k) for k in ("log_frequency", "checkpoint_frequency")}
        steps["env.num_envs"] = (spec.get("env") or {}).get("num_envs") or 1
        steps = {k: v for k, v in steps.items() if isinstance(v, int) and not isinstance(v, bool) and v > 0}
        step = math.lcm(*steps.values())
        off = [f"{k}={v}" for k, v in steps.items() if interval % v]
        if off:
            nearest = " and ".join(map(str, valid_intervals(interval, step)))
            problems.append(f"{where}.perturbation_interval: {interval} is not a multiple of {' and '.join(off)} "
                            f"(generations end on a log row and a checkpoint); the nearest valid values are {nearest}")
        max_frame = (spec.get("env") or {}).get("max_frame")
        if isinstance(max_frame, int) and not isinstance(max_frame, bool) and interval >= max_frame:
            below = (max_frame - 1) // step * step
            hint = f" (e.g. {below})" if below > 0 else ""
            problems.append(f"{where}.perturbation_interval: {interval} is not below env.max_frame={max_frame}: the "
                            f"population would train without a single decision; use an interval below it{hint}")
    fraction = sched.get("quantile_fraction", 0.25)
    if not (_number(fraction) and 0 < fraction <= 0.5):
        problems.append(f"{where}.quantile_fraction: expected a number in (0, 0.5], got {fraction!r}")
    prob = sched.get("resample_probability", 0.25)
    if not (_number(prob) and 0 <= prob <= 1):
        problems.append(f"{where}.resample_probability: expected a number in [0, 1], got {prob!r}")
    factors = sched.get("perturbation_factors", [0.8, 1.2])
    if not (isinstance(factors, list) and factors and all(_number(f) and f > 0 for f in factors)):
        problems.append(f"{where}.perturbation_factors: expected a non-empty list of numbers > 0, got {factors!r}")
    return problems + population_problems(meta, variables, method) + range_problems(spec, variables)


def population_problems(meta: dict[str, Any], variables: list[Any], method: str = "PBT") -> list[str]:
    """Problems of a PBT/PB2 population: its size, ``meta.distributed``, and searched keys it cannot perturb."""
    problems = []
    types = PB2_SPACE_TYPES if method == "PB2" else PBT_SPACE_TYPES
    if int(meta.get("max_trial") or 0) < 2:
        problems.append(f"meta.max_trial: PBT needs a population of at least 2 trials, got {meta.get('max_trial')!r}")
    if meta.get("distributed"):
        problems.append("meta.distributed: PBT copies each session's own optimizer state; "
                        "a trial-wide global optimizer cannot be exploited session for session")
    for var in variables:
        name = f"search.{var.path}__{var.kind}"
        if var.kind not in types:
            why = ("PB2 searches the box of each key's low and high" if method == "PB2" else
                   "PBT samples its population and resamples from distributions")
            problems.append(f"{name}: {why}; use one of {list(types)} instead of {var.kind}")
        elif not perturbable(var.path):
            problems.append(f"{name}: PBT cannot change '{var.path}' mid-run (it would contradict the checkpointed "
                            "state); it may perturb learning rates, optimizer hyperparameters, loss coefficients, "
                            "gamma, lam, schedule values and frames, clip_grad_val and lr_scheduler_spec arguments")
    return problems


def replay_problems(spec: dict[str, Any], memory_class: Any) -> list[str]:
    """A PBT/PB2 search of an algorithm with a replay buffer (``memory_class.has_replay``) needs the replay in its
    checkpoints: exploits, resumes and ``--pbt-replay`` restore a trial's whole state from them
    (``orchestrator.search.pbt``).

    Returns:
        The problem naming ``agent.memory.checkpoint`` and its fix, or [].
    """
    meta, agent = spec.get("meta"), spec.get("agent")
    sched = meta.get("search_scheduler") if isinstance(meta, dict) else None
    memory = agent.get("memory") if isinstance(agent, dict) else None
    if not (isinstance(sched, dict) and sched.get("name") in ("PBT", "PB2") and spec.get("search")
            and isinstance(memory, dict) and getattr(memory_class, "has_replay", False)
            and not memory.get("checkpoint")):
        return []
    return [f"agent.memory.checkpoint: a {sched['name']} search of {memory.get('name')} (a replay buffer) needs the "
            "replay in its checkpoints, so an exploit hands it to the recipient and a resume or --pbt-replay "
            "continues exactly; set -s agent.memory.checkpoint=true"]
