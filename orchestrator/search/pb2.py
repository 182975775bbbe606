"""PB2's explore step: a Gaussian-process bandit over the searched keys' box (Parker-Holder et al. 2020, "Provably
Efficient Online Hyperparameter Optimization with Population-Based Bandits"), in numpy, without Ray.

Data: one point per trial and generation ``k >= 2``: x = (k / generations, the trial's values during generation ``k``
mapped to [0, 1] within each key's [low, high], on a log scale for log types), y = the trial's score at the end of
``k`` minus the score of the state it started ``k`` from (its own, or its donor's after an exploit); y standardized.
Kernel: PB2's time-varying squared exponential, ``exp(-|h - h'|^2 / (2 l^2)) * (1 - eps)^(|t - t'| / 2)``, with
``(l, eps)`` chosen by the largest log marginal likelihood over a fixed grid and noise variance ``NOISE``. Each
bottom trial of a generation gets the candidate (``CANDIDATES`` seeded uniform points of the box, plus its donor's
values) of the largest upper confidence bound ``mean + sqrt(beta) * sd`` at the next generation's time, with GP-UCB's
``beta = 2 log(|candidates| n^2 pi^2 / (6 delta))`` (Srinivas et al. 2010; ``n`` data points, ``delta = 0.1``); the
picks of one generation are added to the data with their predicted mean before the next pick (the batch is spread
as in GP-BUCB). Without data (the first decision) the values are drawn uniformly from the box.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from orchestrator.spec.search_space import INT_TYPES, SearchVar

LENGTHSCALES = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6)
EPSILONS = (0.0, 0.05, 0.1, 0.2, 0.4)
NOISE = 0.01
CANDIDATES = 512
DELTA = 0.1


def _log(var: SearchVar) -> bool:
    return var.kind in ("loguniform", "qloguniform", "lograndint", "qlograndint")


def to_unit(var: SearchVar, value: float) -> float:
    """``value`` of ``var`` mapped into [0, 1] within its [low, high] (log scale for log types)."""
    low, high = float(var.arg[0]), float(var.arg[1])
    if _log(var):
        u = (math.log(value) - math.log(low)) / (math.log(high) - math.log(low))
    else:
        u = (float(value) - low) / (high - low)
    return min(1.0, max(0.0, u))


def from_unit(var: SearchVar, u: float) -> Any:
    """The value of ``var`` at ``u`` in [0, 1] (``to_unit``'s inverse; ints rounded, quantized types to ``q``)."""
    low, high = float(var.arg[0]), float(var.arg[1])
    value = math.exp(math.log(low) + u * (math.log(high) - math.log(low))) if _log(var) else low + u * (high - low)
    if var.kind.startswith("q") and len(var.arg) > 2:
        value = round(value / float(var.arg[2])) * float(var.arg[2])
    value = min(high, max(low, value))
    return int(round(value)) if var.kind in INT_TYPES else float(value)


def kernel(a: np.ndarray, b: np.ndarray, lengthscale: float, eps: float) -> np.ndarray:
    """PB2's time-varying squared exponential between rows of ``a`` (N, 1 + D) and ``b`` (M, 1 + D), column 0 the
    time; returns (N, M)."""
    dist = ((a[:, None, 1:] - b[None, :, 1:]) ** 2).sum(-1)
    dt = np.abs(a[:, None, 0] - b[None, :, 0])
    return np.exp(-dist / (2 * lengthscale**2)) * (1 - eps) ** (dt / 2)


def _fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(lengthscale, eps) of the largest log marginal likelihood over ``LENGTHSCALES`` x ``EPSILONS``."""
    best, arg = -math.inf, (LENGTHSCALES[0], EPSILONS[0])
    for ls in LENGTHSCALES:
        for eps in EPSILONS:
            k = kernel(x, x, ls, eps) + NOISE * np.eye(len(x))
            chol = np.linalg.cholesky(k)
            alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, y))
            value = -0.5 * y @ alpha - np.log(np.diag(chol)).sum()
            if value > best:
                best, arg = value, (ls, eps)
    return arg


def _posterior(x: np.ndarray, y: np.ndarray, query: np.ndarray, ls: float, eps: float) -> tuple[np.ndarray, ...]:
    """Posterior mean and standard deviation at ``query`` rows."""
    k = kernel(x, x, ls, eps) + NOISE * np.eye(len(x))
    chol = np.linalg.cholesky(k)
    ks = kernel(x, query, ls, eps)
    alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, y))
    v = np.linalg.solve(chol, ks)
    var = np.clip(1.0 - (v**2).sum(0), 1e-12, None)
    return ks.T @ alpha, np.sqrt(var)


def select(variables: list[SearchVar], data: list[tuple[float, dict[str, Any], float]], time: float,
           donors: list[dict[str, Any]], rng: np.random.Generator) -> list[dict[str, Any]]:
    """New values for a batch of exploited trials (one per donor config in ``donors``), by GP-UCB.

    Args:
        data: (time in [0, 1], values, score change) observations.
        time: the time (same scale) of the generation the values will train.
        donors: the donors' values, one per trial to explore (each is also a candidate for its trial).

    Returns:
        One ``{path: value}`` per entry of ``donors``.
    """
    dims = len(variables)
    if len(data) < 2:
        return [{v.path: from_unit(v, float(u)) for v, u in zip(variables, rng.random(dims))} for _ in donors]
    x = np.array([[t, *(to_unit(v, values[v.path]) for v in variables)] for t, values, _ in data])
    y = np.array([change for _, _, change in data], dtype=float)
    y = (y - y.mean()) / (y.std() if y.std() > 0 else 1.0)
    ls, eps = _fit(x, y)
    points = rng.random((CANDIDATES, dims))
    out = []
    for donor in donors:
        cand = np.vstack([points, [[to_unit(v, donor[v.path]) for v in variables]]])
        query = np.hstack([np.full((len(cand), 1), time), cand])
        mean, sd = _posterior(x, y, query, ls, eps)
        beta = 2 * math.log(len(cand) * len(x) ** 2 * math.pi**2 / (6 * DELTA))
        best = int(np.argmax(mean + math.sqrt(beta) * sd))
        out.append({v.path: from_unit(v, float(u)) for v, u in zip(variables, cand[best])})
        x, y = np.vstack([x, query[best]]), np.append(y, mean[best])  # the pick, believed at its mean
    return out


def observations(history: list[dict[str, Any]], scores: dict[int, float | None], generation: int,
                 generations: int) -> list[tuple[float, dict[str, Any], float]]:
    """PB2's data from the decisions so far (``history``: records of generations before ``generation``) and the
    scores at the end of ``generation``: (time, values during generation k, score change over k) for k >= 2."""
    by_gen: dict[int, dict[int, dict[str, Any]]] = {}
    for r in history:
        by_gen.setdefault(int(r["generation"]), {})[int(r["trial"])] = r
    ends = {g: {t: r["score"] for t, r in recs.items()} for g, recs in by_gen.items()}
    ends[generation] = scores
    out = []
    for k in range(2, generation + 1):
        for t, before in by_gen.get(k - 1, {}).items():
            start = before["donor_score"] if before["donor"] is not None else before["score"]
            end = ends.get(k, {}).get(t)
            if start is None or end is None or (isinstance(end, float) and math.isnan(end)):
                continue
            out.append((k / generations, before["config"], float(end) - float(start)))
    return out
