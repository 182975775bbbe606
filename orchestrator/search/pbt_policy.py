"""PBT's decisions, without Ray or torch: the population's initial samples, and per generation the ranking, the
exploits and the explored values (Jaderberg et al. 2017; the explore step as Ray Tune's ``PopulationBasedTraining``).

Every draw comes from a numpy ``Generator`` seeded from ``meta.random_seed`` and the generation (ranking ties and
donors: ``(seed, generation)``; a recipient's explored values: ``(seed, generation, trial)``; initial samples:
``(seed, trial)``), and a generation is decided once from the scores of checkpoints committed at the same frame, so
the same search gives the same decisions whichever trial finished first, and a resumed search re-derives the
decisions it had not recorded yet exactly.

Ranking (``rank``): trials with a finite score, best first, equal scores in a seeded random order (not by index);
then trials without one (no episode ended yet); failed trials last. Exploit: every failed trial, and the lowest
trials with a score up to ``ceil(quantile_fraction * population)`` recipients in all, take a donor drawn from the
top quantile among the trials with a finite score strictly above their own. A trial without a finite score is
never a donor, a trial without one that has not failed is never a recipient, and an equal score is no reason to
exploit. A failed trial, when no trial has a score yet, takes a healthy trial's state (any beats a failed one); a
population where every trial failed raises ``PopulationFailed``.

Explore, per searched key: with ``resample_probability`` a fresh draw from the key's distribution; otherwise a
``choice`` moves to a neighbouring value of its list (clamped at the ends), and a number is multiplied by one of
``perturbation_factors``, an integer moving at least one step (``q``) in the factor's direction. The value is then
fitted (``fit``) to the distribution's values (``randint``/``lograndint`` exclude ``high``; quantized types stay on
their grid of multiples of ``q``; normal types are unbounded) and to the schema's range of the key
(``orchestrator.spec.pbt.key_range``). The explored config then passes the full spec check (``problems``) before it
is recorded: a config it refuses is drawn again from the recipient's stream (the keys the problems name, or all),
up to ``MAX_REDRAWS`` times, and after that the donor's own values (which trained) are kept, so a recorded
decision always applies.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Collection

import numpy as np

from orchestrator.errors import SpecError
from orchestrator.report.rows import format_value
from orchestrator.search import pb2
from orchestrator.search.decision import VERSION, Decision
from orchestrator.spec.pbt import KeyRange, PBTSettings, space_box
from orchestrator.spec.search_space import INT_TYPES, NORMAL_TYPES, SearchVar, plain

SEED_INITIAL, SEED_DECIDE, SEED_EXPLORE, SEED_RESEED, SEED_PB2 = 0, 1, 2, 3, 4  # stream tags of the kinds of draws
MAX_REDRAWS = 16
OPEN_MARGIN = 1e-9  # a float clamped to an open bound (a schema ``gt``) lands this far inside it (relative, or absolute
# below 1); not the next float: a subnormal is flushed to 0 where torch set the CPU's flush-to-zero mode
RESEED_RANGE = 2**31  # reseed values fit every RNG the sessions seed (int32 for EnvPool)

Problems = Callable[[dict[str, Any]], list[str]]


class PopulationFailed(RuntimeError):
    """Every trial of a PBT population failed: no state is left to continue from."""


def _quantize(value: float, q: float | None) -> float:
    return value if q is None else round(value / q) * q


def _step(var: SearchVar) -> float | None:
    """The grid step of a quantized or integer type (None for continuous types)."""
    if var.kind.startswith("q") and len(var.arg) > 2:
        return float(var.arg[2])
    return 1.0 if var.kind in INT_TYPES else None


def sample(var: SearchVar, rng: np.random.Generator) -> Any:
    """One draw of ``var`` from its distribution (``orchestrator.spec.search_space`` types but grid_search).

    Returns:
        A plain Python value (int for integer types).
    """
    kind, arg = var.kind, var.arg
    if kind == "choice":
        return plain(arg[int(rng.integers(len(arg)))])
    if kind in NORMAL_TYPES:
        return float(_quantize(rng.normal(arg[0], arg[1]), arg[2] if kind == "qrandn" else None))
    low, high = float(arg[0]), float(arg[1])
    log = kind in ("loguniform", "qloguniform", "lograndint", "qlograndint")
    q = float(arg[2]) if kind.startswith("q") and len(arg) > 2 else (1.0 if kind == "qrandint" else None)
    if log:
        base = float(arg[-1]) if len(arg) == (4 if kind.startswith("q") else 3) else 10.0
        value = base ** rng.uniform(math.log(low, base), math.log(high, base))
    elif kind == "randint":
        return int(rng.integers(int(low), int(high)))
    else:
        value = rng.uniform(low, high)
    value = _quantize(value, q)
    return int(round(value)) if kind in INT_TYPES else float(value)


def bounds(var: SearchVar, key: KeyRange | None = None) -> tuple[float, float]:
    """The closed interval of values ``var`` may take after explore: the distribution's (``space_box``; unbounded for
    normal types) within the schema's ``key`` range (an open bound moved to the next grid point, or ``OPEN_MARGIN``),
    shrunk to the grid of a quantized or integer type."""
    low, high = space_box(var) or (-math.inf, math.inf)
    step = _step(var)
    if key is not None and key.low is not None:
        edge = key.low if not key.low_open else \
            (math.floor(key.low / step) + 1) * step if step else key.low + OPEN_MARGIN * max(abs(key.low), 1.0)
        low = max(low, edge)
    if key is not None and key.high is not None:
        edge = key.high if not key.high_open else \
            (math.ceil(key.high / step) - 1) * step if step else key.high - OPEN_MARGIN * max(abs(key.high), 1.0)
        high = min(high, edge)
    if step and math.isfinite(low):
        low = math.ceil(low / step - 1e-9) * step
    if step and math.isfinite(high):
        high = math.floor(high / step + 1e-9) * step
    return low, high


def fit(var: SearchVar, value: Any, key: KeyRange | None = None) -> tuple[Any, bool]:
    """``value`` moved into ``bounds(var, key)`` and onto its type's grid (ints as int).

    Returns:
        (the fitted value, whether it was clamped to a bound).
    """
    if var.kind == "choice":
        return value, False
    step = _step(var)
    out = _quantize(float(value), step)
    low, high = bounds(var, key)
    if low > high:  # no value of the grid inside: the spec check refuses such a search (range_problems)
        return value, False
    clamped = min(max(out, low), high)
    hit = clamped != out
    if step:
        clamped = min(max(_quantize(clamped, step), low), high)
    return (int(round(clamped)) if var.kind in INT_TYPES else float(clamped)), hit


def initial_config(variables: list[SearchVar], seed: int, trial: int, ranges: dict[str, KeyRange] | None = None,
                   problems: Problems | None = None) -> dict[str, Any]:
    """The sampled values of trial ``trial`` of a population (``{dotted.path: value}``), each fitted to
    ``ranges[path]`` (``fit``) and, with ``problems`` (the full spec check of a config: its problems), drawn again
    from the same stream while the check refuses them (``MAX_REDRAWS`` times).

    Raises:
        SpecError: no valid config in ``MAX_REDRAWS`` draws (the check's problems).
    """
    rng = np.random.default_rng([seed, SEED_INITIAL, trial])
    ranges = ranges or {}
    config = {v.path: fit(v, sample(v, rng), ranges.get(v.path))[0] for v in variables}
    found = problems(config) if problems else []
    for _ in range(MAX_REDRAWS if found else 0):
        again = _to_redraw(variables, found)
        config = {v.path: fit(v, sample(v, rng), ranges.get(v.path))[0] if v.path in again else config[v.path]
                  for v in variables}
        found = problems(config)
        if not found:
            break
    if found:
        raise SpecError([f"search: no valid initial values for trial {trial} in {MAX_REDRAWS + 1} draws"] + found)
    return config


def _to_redraw(variables: list[SearchVar], found: list[str]) -> set[str]:
    """The paths to draw again for the check's ``found`` problems: the keys a problem's path names (the key, a key
    under it or the section above it), or every key when none is named (a problem of another key)."""
    heads = [p.split(":", 1)[0].strip() for p in found]
    named = {v.path for v in variables
             if any(h == v.path or h.startswith(v.path + ".") or v.path.startswith(h + ".") for h in heads)}
    return named or {v.path for v in variables}


def perturb(var: SearchVar, value: Any, settings: PBTSettings, rng: np.random.Generator,
            key: KeyRange | None = None) -> Any:
    """Explore one key: resample with ``settings.resample_probability``, else perturb (module docstring).

    Returns:
        The new value (``explore_key``'s without its record).
    """
    return explore_key(var, value, settings, rng, key)[0]


def explore_key(var: SearchVar, value: Any, settings: PBTSettings, rng: np.random.Generator,
                key: KeyRange | None = None) -> tuple[Any, dict[str, Any]]:
    """Explore one key (module docstring) and fit the result to ``bounds(var, key)``.

    Returns:
        (new value, ``{"op": "resample" | "shift" | "perturb", "factor" (perturb only), "before", "after",
        "clamped"}``).
    """
    if rng.random() < settings.resample_probability:
        op: dict[str, Any] = {"op": "resample"}
        out = sample(var, rng)
    elif var.kind == "choice":
        i = next((i for i, v in enumerate(var.arg) if v == value), 0)
        shift = -1 if rng.random() < 0.5 else 1
        op, out = {"op": "shift"}, plain(var.arg[min(len(var.arg) - 1, max(0, i + shift))])
    else:
        factor = settings.perturbation_factors[int(rng.integers(len(settings.perturbation_factors)))]
        op, out, step = {"op": "perturb", "factor": factor}, value * factor, _step(var)
        if step:
            out = _quantize(out, step)
            if out == value and factor != 1:  # a factor too small to move an integer: one step its way
                out = value + math.copysign(step, (factor - 1) * (value or 1))
    out, clamped = fit(var, out, key)
    return out, {**op, "before": value, "after": out, "clamped": clamped}


def quantile_size(population: int, fraction: float) -> int:
    """Trials in the top and in the bottom quantile: ``ceil(population * fraction)``, at most half (Tune's rule)."""
    return min(int(math.ceil(population * fraction)), population // 2)


def finite(score: float | None) -> bool:
    """Whether ``score`` ranks a trial: a number that is neither NaN nor infinite."""
    return score is not None and math.isfinite(float(score))


def rank(scores: dict[int, float | None], trials: Collection[int], failed: Collection[int],
         rng: np.random.Generator) -> list[int]:
    """The trials best first: finite scores descending, then the trials without one, failed trials last; each group's
    ties in the order of one seeded permutation of ``sorted(trials)`` drawn from ``rng``."""
    order = sorted(trials)
    tie = dict(zip(order, rng.permutation(len(order)).tolist()))

    def key(t: int) -> tuple[int, float, int]:
        if t in failed:
            return (2, 0.0, tie[t])
        return (0, -float(scores[t]), tie[t]) if finite(scores.get(t)) else (1, 0.0, tie[t])
    return sorted(order, key=key)


def donors_of(ranked: list[int], scores: dict[int, float | None], failed: Collection[int], fraction: float,
              rng: np.random.Generator) -> dict[int, int]:
    """Recipient -> donor for one generation (module docstring), donors drawn from ``rng`` in recipient order.

    Raises:
        PopulationFailed: every trial failed.
    """
    failed = set(failed)
    if failed and failed >= set(ranked):
        raise PopulationFailed(f"every trial of the population failed ({', '.join(f't{t}' for t in sorted(failed))})"
                               ": no trial's state is left to continue from; see the sessions' errors in their logs")
    k = quantile_size(len(ranked), fraction)
    scored = [t for t in ranked if t not in failed and finite(scores.get(t))]
    top, rest, more = scored[:k], scored[k:], k - len(failed)
    lowest = rest[-more:] if more > 0 else []
    donors = {}
    for t in sorted(failed | set(lowest)):
        pool = [d for d in top if t in failed or float(scores[d]) > float(scores[t])]
        if not pool and t in failed:  # no scores yet: any healthy state beats a failed one
            pool = [d for d in ranked if d not in failed]
        if pool:
            donors[t] = pool[int(rng.integers(len(pool)))]
    return donors


def reseed(seed: int, trial: int, generation: int) -> int:
    """The seed a recipient's acting RNG streams restart from after the exploit of ``generation``, so that it is no
    bit-identical twin of its donor: a value in ``[0, RESEED_RANGE)`` from ``(seed, trial, generation)``."""
    state = np.random.SeedSequence([seed, SEED_RESEED, trial, generation]).generate_state(1, np.uint32)
    return int(state[0]) % RESEED_RANGE


def decide(generation: int, frame: int, scores: dict[int, float | None], configs: dict[int, dict[str, Any]],
           variables: list[SearchVar], settings: PBTSettings, seed: int, history: list[Decision] = (),
           generations: int = 1, failed: Collection[int] = (), ranges: dict[str, KeyRange] | None = None,
           problems: Problems | None = None) -> list[Decision]:
    """The decisions of one generation: one ``Decision`` per trial, in trial order (module docstring).

    Args:
        generation: 1 for the first decision.
        frame: the frame every trial's checkpoint was committed at.
        scores: trial -> mean over its sessions of ``total_reward_ma`` at ``frame`` (None or NaN: no score).
        configs: trial -> its searched values during the generation that ended.
        history: PB2's data, the records of the earlier generations, of ``generations`` in all.
        failed: trials whose sessions failed (an exception, a diverged loss): ranked last and replaced first.
        ranges: path -> the schema's range of the key (``orchestrator.spec.pbt.key_range``); none: unbounded.
        problems: the full spec check of a config: its problems (empty when it is valid).

    Returns:
        The ``Decision``s of version ``VERSION`` (recipients with ``explore``, ``redraws`` and ``reseed``).

    Raises:
        PopulationFailed: every trial failed.
        SpecError: the donor's own values fail the check (the spec changed under the population).
    """
    failed = set(failed)
    rng = np.random.default_rng([seed, SEED_DECIDE, generation])
    ranked = rank(scores, configs, failed, rng)
    donors = donors_of(ranked, scores, failed, settings.quantile_fraction, rng)
    ranges = ranges or {}
    picks: dict[int, dict[str, Any]] = {}
    if settings.method == "PB2" and donors:
        data = pb2.observations(list(history), scores, generation, generations)
        pb2_rng = np.random.default_rng([seed, SEED_PB2, generation])
        chosen = pb2.select(variables, data, (generation + 1) / generations, [configs[d] for d in donors.values()],
                            pb2_rng)
        picks = dict(zip(donors, chosen))
    records = []
    for t in sorted(configs):
        donor, record = donors.get(t), {"explore": None, "redraws": [], "reseed": None}
        if donor is not None:
            config, explore, redraws = _explore(t, configs[donor], picks.get(t), variables, settings, ranges, problems,
                                                np.random.default_rng([seed, SEED_EXPLORE, generation, t]))
            record = {"explore": explore, "redraws": redraws, "reseed": reseed(seed, t, generation)}
        else:
            config = dict(configs[t])
        records.append(Decision(generation, frame, t, donor, _json_score(scores.get(t)),
                                _json_score(scores.get(donor)) if donor is not None else None, config,
                                version=VERSION, rank=ranked.index(t) + 1, failed=t in failed, **record))
    return records


def _explore(trial: int, donor_config: dict[str, Any], pick: dict[str, Any] | None, variables: list[SearchVar],
             settings: PBTSettings, ranges: dict[str, KeyRange], problems: Problems | None,
             rng: np.random.Generator) -> tuple[dict[str, Any], dict[str, dict[str, Any]], list[list[str]]]:
    """One recipient's explored config, its per-key record and the problems of each refused config (``decide``)."""
    explore = {}
    for v in variables:
        before = donor_config[v.path]
        if pick is not None:  # PB2's value, fitted like a perturbed one
            after, clamped = fit(v, pick[v.path], ranges.get(v.path))
            explore[v.path] = {"op": "pb2", "before": before, "after": after, "clamped": clamped}
        else:
            explore[v.path] = explore_key(v, before, settings, rng, ranges.get(v.path))[1]
    config = {path: e["after"] for path, e in explore.items()}
    redraws: list[list[str]] = []
    found = problems(config) if problems else []
    while found and len(redraws) < MAX_REDRAWS:
        redraws.append(found)
        again = _to_redraw(variables, found)
        for v in variables:
            if v.path in again:
                after, clamped = fit(v, sample(v, rng), ranges.get(v.path))
                explore[v.path] = {"op": "redraw", "before": donor_config[v.path], "after": after, "clamped": clamped}
        config = {path: e["after"] for path, e in explore.items()}
        found = problems(config)
    if found:  # the donor's values trained: they apply
        redraws.append(found)
        config = dict(donor_config)
        explore = {v.path: {"op": "kept", "before": donor_config[v.path], "after": donor_config[v.path],
                            "clamped": False} for v in variables}
        own = problems(config) if problems else []
        if own:
            raise SpecError([f"PBT: trial t{trial}'s donor values {config} fail the spec check"] + own)
    return config, explore, redraws


def _json_score(score: float | None) -> float | None:
    return float(score) if finite(score) else None


def _fmt_score(score: float | None) -> str:
    return "n/a" if score is None else f"{score:.4g}"


def format_exploit(record: Decision, method: str = "PBT") -> str:
    """The console line of one exploit: who continues from whom, and per key the explore operation with its value
    before and after (records without ``explore``, written before it existed: the values after)."""
    explore = record.explore
    if explore:
        parts = []
        for path, e in explore.items():
            name, op = path.rsplit(".", 1)[-1], e["op"]
            how = f"x{e['factor']:g}" if op == "perturb" else op
            clamp = ", clamped" if e.get("clamped") else ""
            parts.append(f"{name} {format_value(e['before'])} -> {format_value(e['after'])} ({how}{clamp})")
        values = ", ".join(parts)
    else:
        values = ", ".join(f"{k.rsplit('.', 1)[-1]}={format_value(v)}" for k, v in record.config.items())
    who = f"t{record.trial} ({'failed' if record.failed else 'score ' + _fmt_score(record.score)})"
    return (f"{method} generation {record.generation} (frame {record.frame}): {who} continues from "
            f"t{record.donor} (score {_fmt_score(record.donor_score)}) with {values}")


def lineage(records: list[Decision], trial: int, initial: dict[int, dict[str, Any]],
            generations: int) -> list[dict[str, Any]]:
    """The schedule that produced trial ``trial``'s final state: per generation ``g`` (1..``generations``), the
    trial whose sessions trained frames ``(F_{g-1}, F_g]`` of that state, the config they trained with, and the
    reseed applied when that part began with an exploit (None otherwise, and in records before ``VERSION`` 2).

    Args:
        records: every decision (``pbt.jsonl``), of generations 1..``generations - 1``.
        initial: trial -> its initial config.

    Returns:
        ``[{"generation": g, "trial": A_g, "config": ..., "reseed": ...}]`` in generation order.
    """
    by_gen: dict[int, dict[int, Decision]] = {}
    for r in records:
        by_gen.setdefault(r.generation, {})[r.trial] = r
    owners = [trial]
    for g in range(generations - 1, 0, -1):  # decision g happened at the end of generation g
        rec = by_gen[g][owners[-1]]
        owners.append(rec.donor if rec.exploited else owners[-1])
    owners.reverse()  # owners[g - 1]: who trained generation g
    out = []
    for g, owner in enumerate(owners, start=1):
        rec = by_gen[g - 1][owner] if g > 1 else None
        out.append({"generation": g, "trial": owner, "config": initial[owner] if rec is None else rec.config,
                    "reseed": None if rec is None else rec.reseed})
    return out
