"""PB2's explore step: a Gaussian-process bandit over the searched keys' box (Parker-Holder et al. 2020, "Provably
Efficient Online Hyperparameter Optimization with Population-Based Bandits"), in numpy, without Ray.

Data: one point per trial and generation ``k >= 2``: x = (k / generations, the trial's values during generation ``k``
mapped to [0, 1] within each key's [low, high], on a log scale for log types), y = the trial's score at the end of
``k`` minus the score of the state it started ``k`` from (its own, or its donor's after an exploit). The latest
``MAX_DATA`` points are kept; y is standardized and clipped to [-2, 2] (as Ray Tune's PB2 does: one diverged trial
does not flatten the others' differences).

Model: a zero-mean GP with PB2's time-varying squared exponential (Bogunovic et al. 2016's TV-GP-UCB kernel)
``k(x, x') = s2 * exp(-|h - h'|^2 / (2 l^2)) * (1 - eps)^(|t - t'| / 2)`` plus Gaussian noise of variance ``n2``.
All four hyperparameters are fitted by the largest log marginal likelihood: ``l`` over ``LENGTHSCALES`` (in unit
coordinates, at least 0.1, so a few noisy points cannot be "explained" by a wiggle through each), ``eps`` over
``EPSILONS`` (Ray's bound, [0, 0.5]), the noise-to-signal ratio ``n2 / s2`` over ``NOISE_RATIOS`` (1e-3 to 100: from
near-exact to almost all noise), and ``s2`` in closed form given the others (the likelihood's maximizer,
``y' (C + r I)^-1 y / n``). For each ``(l, eps)`` one eigendecomposition of the correlation matrix gives the
likelihood at every ratio, so the fit is exact on the grid and deterministic.

Acquisition: each bottom trial of a generation gets the candidate (``CANDIDATES`` seeded uniform points of the box,
plus its donor's values) of the largest upper confidence bound on the latent score change at the next generation's
time, ``mean + kappa * sd`` with Ray Tune's PB2 weight ``kappa = sqrt(0.2 + max(0, log(0.4 n)))`` (``n`` data points;
Ray applies it to the predictive variance, here it scales the standard deviation as in GP-UCB). Srinivas et al.'s
theoretical ``beta`` (``sqrt(beta)`` about 5 at PBT's sizes) is not used: it makes UCB pick the points farthest from
the data whatever they scored. The picks of one generation are added to the data at their predicted mean before the
next pick, as nearly exact observations (GP-BUCB's hallucination, Desautels et al. 2014, with ``PENDING_NOISE``
instead of the fitted noise: with the fitted noise, a hallucinated pick barely lowers the bound around it and the
batch would repeat it). Without data (the first decision) the values are drawn uniformly from the box.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from orchestrator.search.decision import Decision
from orchestrator.spec.search_space import INT_TYPES, SearchVar

LENGTHSCALES = tuple(float(v) for v in np.geomspace(0.1, 2.0, 10))
EPSILONS = (0.0, 0.1, 0.25, 0.5)
NOISE_RATIOS = tuple(float(v) for v in np.geomspace(1e-3, 1e2, 31))
CLIP = 2.0
MAX_DATA = 500
CANDIDATES = 512
JITTER = 1e-8
PENDING_NOISE = 1e-6  # noise variance of a pending pick, relative to the signal's: practically exact, still definite
MIN_SIGNAL = 1e-6  # floor of the signal variance (of standardized targets): equal score changes give a flat model


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
    """PB2's time-varying squared exponential correlation (unit signal variance) between rows of ``a`` (N, 1 + D)
    and ``b`` (M, 1 + D), column 0 the time; returns (N, M)."""
    dist = ((a[:, None, 1:] - b[None, :, 1:]) ** 2).sum(-1)
    dt = np.abs(a[:, None, 0] - b[None, :, 0])
    return np.exp(-dist / (2 * lengthscale**2)) * (1 - eps) ** (dt / 2)


def fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float, float]:
    """``(lengthscale, eps, signal variance, noise variance)`` of the largest log marginal likelihood of ``y`` (N,)
    at ``x`` (N, 1 + D) over ``LENGTHSCALES`` x ``EPSILONS`` x ``NOISE_RATIOS``, the signal variance profiled out."""
    n = len(y)
    ratios = np.array(NOISE_RATIOS)
    best, arg = -math.inf, (LENGTHSCALES[0], EPSILONS[0], 1.0, NOISE_RATIOS[0])
    for ls in LENGTHSCALES:
        for eps in EPSILONS:
            lam, vec = np.linalg.eigh(kernel(x, x, ls, eps))
            lam = np.clip(lam, 0.0, None)[None, :] + ratios[:, None]  # (ratios, N) eigenvalues of C + r I
            quad = ((vec.T @ y) ** 2 / lam).sum(1)  # y' (C + r I)^-1 y
            value = -0.5 * n * np.log(np.maximum(quad, 1e-300) / n) - 0.5 * np.log(lam).sum(1)
            i = int(np.argmax(value))
            if value[i] > best:
                s2 = max(float(quad[i] / n), MIN_SIGNAL)
                best, arg = float(value[i]), (ls, eps, s2, s2 * float(ratios[i]))
    return arg


def posterior(x: np.ndarray, y: np.ndarray, query: np.ndarray, params: tuple[float, float, float, float],
              pending: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Posterior mean and standard deviation of the latent function at ``query`` rows (M, 1 + D), given ``params``
    from ``fit``; both (M,). The last ``pending`` rows of ``x`` are picks believed at their ``y`` with
    ``PENDING_NOISE`` instead of the fitted noise."""
    ls, eps, s2, n2 = params
    noise = np.full(len(x), n2)
    noise[len(x) - pending:] = PENDING_NOISE * s2
    k = s2 * kernel(x, x, ls, eps) + np.diag(noise + JITTER * s2)
    chol = np.linalg.cholesky(k)
    ks = s2 * kernel(x, query, ls, eps)
    alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, y))
    v = np.linalg.solve(chol, ks)
    var = np.clip(s2 - (v**2).sum(0), 1e-12 * s2, None)
    return ks.T @ alpha, np.sqrt(var)


def kappa(n: int) -> float:
    """Ray Tune's PB2 UCB weight for ``n`` data points: ``sqrt(0.2 + max(0, log(0.4 n)))``."""
    return math.sqrt(0.2 + max(0.0, math.log(0.4 * n)))


def select(variables: list[SearchVar], data: list[tuple[float, dict[str, Any], float]], time: float,
           donors: list[dict[str, Any]], rng: np.random.Generator) -> list[dict[str, Any]]:
    """New values for a batch of exploited trials (one per donor config in ``donors``), by batch GP-UCB.

    Args:
        data: (time in [0, 1], values, score change) observations; the latest ``MAX_DATA`` by time with a finite
            change are used.
        time: the time (same scale) of the generation the values will train.
        donors: the donors' values, one per trial to explore (each is also a candidate for its trial).
        rng: draws the candidates (and the values when ``data`` has under 2 points).

    Returns:
        One ``{path: value}`` per entry of ``donors``.
    """
    dims = len(variables)
    data = [d for d in data if math.isfinite(d[2])]
    if len(data) < 2:
        return [{v.path: from_unit(v, float(u)) for v, u in zip(variables, rng.random(dims))} for _ in donors]
    data = sorted(data, key=lambda d: d[0])[-MAX_DATA:]
    x = np.array([[t, *(to_unit(v, values[v.path]) for v in variables)] for t, values, _ in data])
    y = np.array([change for _, _, change in data], dtype=float)
    y = np.clip((y - y.mean()) / (y.std() if y.std() > 0 else 1.0), -CLIP, CLIP)
    params = fit(x, y)
    weight = kappa(len(x))
    points = rng.random((CANDIDATES, dims))
    out = []
    for donor in donors:
        cand = np.vstack([points, [[to_unit(v, donor[v.path]) for v in variables]]])
        query = np.hstack([np.full((len(cand), 1), time), cand])
        mean, sd = posterior(x, y, query, params, len(out))
        best = int(np.argmax(mean + weight * sd))
        out.append({v.path: from_unit(v, float(u)) for v, u in zip(variables, cand[best])})
        x, y = np.vstack([x, query[best]]), np.append(y, mean[best])  # the pick, believed at its mean
    return out


def observations(history: list[Decision], scores: dict[int, float | None], generation: int,
                 generations: int) -> list[tuple[float, dict[str, Any], float]]:
    """PB2's data from the decisions so far (``history``: records of generations before ``generation``) and the
    scores at the end of ``generation``: (time, values during generation k, score change over k) for k >= 2 (a
    change that is missing or not finite is left out)."""
    by_gen: dict[int, dict[int, Decision]] = {}
    for r in history:
        by_gen.setdefault(r.generation, {})[r.trial] = r
    ends = {g: {t: r.score for t, r in recs.items()} for g, recs in by_gen.items()}
    ends[generation] = scores
    out = []
    for k in range(2, generation + 1):
        for t, before in by_gen.get(k - 1, {}).items():
            start = before.donor_score if before.exploited else before.score
            end = ends.get(k, {}).get(t)
            if start is None or end is None or not math.isfinite(float(end) - float(start)):
                continue
            out.append((k / generations, before.config, float(end) - float(start)))
    return out
