"""PBT's decisions, without Ray or torch: the population's initial samples, and per generation the ranking, the
exploits and the explored values (Jaderberg et al. 2017; the explore step as Ray Tune's ``PopulationBasedTraining``).

Every draw comes from a numpy ``Generator`` seeded from ``(meta.random_seed, generation)`` (initial samples:
``(meta.random_seed, trial)``), and a generation is decided once from the scores of checkpoints committed at the
same frame, so the same search gives the same decisions whichever trial finished first, and a resumed search
re-derives the decisions it had not recorded yet exactly.

Explore, per searched key: with ``resample_probability`` a fresh draw from the key's distribution; otherwise a
``choice`` moves to a neighbouring value of its list (clamped at the ends), and a number is multiplied by one of
``perturbation_factors`` (integer types rounded to an int, quantized types to their step ``q``), clamped to the
distribution's ``[low, high]`` (normal distributions are unbounded).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from orchestrator.search import pb2
from orchestrator.spec.pbt import PBTSettings
from orchestrator.spec.search_space import INT_TYPES, SearchVar, plain

SEED_INITIAL, SEED_DECIDE = 0, 1  # stream tags of the two kinds of draws


def _quantize(value: float, q: float | None) -> float:
    return value if q is None else round(value / q) * q


def sample(var: SearchVar, rng: np.random.Generator) -> Any:
    """One draw of ``var`` from its distribution (``orchestrator.spec.search_space`` types but grid_search).

    Returns:
        A plain Python value (int for integer types).
    """
    kind, arg = var.kind, var.arg
    if kind == "choice":
        return plain(arg[int(rng.integers(len(arg)))])
    if kind in ("normal", "randn", "qrandn"):
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


def initial_config(variables: list[SearchVar], seed: int, trial: int) -> dict[str, Any]:
    """The sampled values of trial ``trial`` of a population (``{dotted.path: value}``)."""
    rng = np.random.default_rng([seed, SEED_INITIAL, trial])
    return {v.path: sample(v, rng) for v in variables}


def perturb(var: SearchVar, value: Any, settings: PBTSettings, rng: np.random.Generator) -> Any:
    """Explore one key: resample with ``settings.resample_probability``, else perturb (module docstring)."""
    if rng.random() < settings.resample_probability:
        return sample(var, rng)
    if var.kind == "choice":
        i = next((i for i, v in enumerate(var.arg) if v == value), 0)
        shift = -1 if rng.random() < 0.5 else 1
        return plain(var.arg[min(len(var.arg) - 1, max(0, i + shift))])
    factor = settings.perturbation_factors[int(rng.integers(len(settings.perturbation_factors)))]
    out = value * factor
    if var.kind.startswith("q"):
        q = float(var.arg[2]) if len(var.arg) > 2 else 1.0
        out = _quantize(out, q)
    if var.kind not in ("normal", "randn", "qrandn"):  # bounded distributions: clamped to [low, high]
        out = min(max(out, var.arg[0]), var.arg[1])
    return int(round(out)) if var.kind in INT_TYPES else float(out)


def quantile_size(population: int, fraction: float) -> int:
    """Trials in the top and in the bottom quantile: ``ceil(population * fraction)``, at most half (Tune's rule)."""
    return min(int(math.ceil(population * fraction)), population // 2)


def decide(generation: int, frame: int, scores: dict[int, float | None], configs: dict[int, dict[str, Any]],
           variables: list[SearchVar], settings: PBTSettings, seed: int, history: list[dict[str, Any]] = (),
           generations: int = 1) -> list[dict[str, Any]]:
    """The decisions of one generation: one record per trial, in trial order.

    Trials are ranked by score (a missing or NaN score ranks last; ties by trial index). Each trial of the bottom
    quantile takes a donor drawn from the top quantile and the donor's config explored (PBT: ``perturb``; PB2:
    ``orchestrator.search.pb2.select``, from ``history``, the records of the earlier generations, of
    ``generations`` in all); the others keep theirs.

    Args:
        generation: 1 for the first decision.
        frame: the frame every trial's checkpoint was committed at.
        scores: trial -> mean over its sessions of ``total_reward_ma`` at ``frame``.
        configs: trial -> its searched values during the generation that ended.

    Returns:
        ``[{"generation", "frame", "trial", "donor" (None when kept), "score", "donor_score", "config"}]``
        with ``config`` the values after the decision.
    """
    def rank_key(t: int) -> tuple[float, int]:
        s = scores.get(t)
        return (-s if s is not None and not math.isnan(s) else math.inf, t)

    ranked = sorted(configs, key=rank_key)
    k = quantile_size(len(ranked), settings.quantile_fraction)
    top, bottom = ranked[:k], set(ranked[len(ranked) - k:]) if k else set()
    rng = np.random.default_rng([seed, SEED_DECIDE, generation])
    donors = {t: top[int(rng.integers(len(top)))] for t in sorted(bottom)}
    if settings.method == "PB2":
        data = pb2.observations(list(history), scores, generation, generations)
        picks = pb2.select(variables, data, (generation + 1) / generations, [configs[d] for d in donors.values()], rng)
        explored = dict(zip(donors, picks))
    else:
        explored = {t: {v.path: perturb(v, configs[d][v.path], settings, rng) for v in variables}
                    for t, d in donors.items()}
    records = []
    for t in sorted(configs):
        donor, config = donors.get(t), explored.get(t, dict(configs[t]))
        score = scores.get(t)
        records.append({"generation": generation, "frame": frame, "trial": t, "donor": donor,
                        "score": _json_score(score), "donor_score": _json_score(scores.get(donor)) if donor is not None
                        else None, "config": config})
    return records


def _json_score(score: float | None) -> float | None:
    return None if score is None or math.isnan(score) else float(score)


def lineage(records: list[dict[str, Any]], trial: int, initial: dict[int, dict[str, Any]],
            generations: int) -> list[dict[str, Any]]:
    """The schedule that produced trial ``trial``'s final state: per generation ``g`` (1..``generations``), the
    trial whose sessions trained frames ``(F_{g-1}, F_g]`` of that state and the config they trained with.

    Args:
        records: every decision (``pbt.jsonl``), of generations 1..``generations - 1``.
        initial: trial -> its initial config.

    Returns:
        ``[{"generation": g, "trial": A_g, "config": ...}]`` in generation order.
    """
    by_gen: dict[int, dict[int, dict[str, Any]]] = {}
    for r in records:
        by_gen.setdefault(int(r["generation"]), {})[int(r["trial"])] = r
    owners = [trial]
    for g in range(generations - 1, 0, -1):  # decision g happened at the end of generation g
        rec = by_gen[g][owners[-1]]
        owners.append(rec["donor"] if rec["donor"] is not None else owners[-1])
    owners.reverse()  # owners[g - 1]: who trained generation g
    out = []
    for g, owner in enumerate(owners, start=1):
        config = initial[owner] if g == 1 else by_gen[g - 1][owner]["config"]
        out.append({"generation": g, "trial": owner, "config": config})
    return out
