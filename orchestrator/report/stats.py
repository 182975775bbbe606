"""Robust statistics over sessions (seeds): interquartile mean and stratified-bootstrap confidence
intervals, after Agarwal et al., "Deep Reinforcement Learning at the Edge of the Statistical
Precipice" (NeurIPS 2021) and its library ``rliable`` (``metrics.aggregate_iqm``,
``library.get_interval_estimates``).

* ``iqm``: the mean of the middle 50% of the scores: sort, drop ``floor(n / 4)`` from each end
  (``scipy.stats.trim_mean(x, 0.25)``, as rliable). With fewer than 4 scores nothing is dropped and
  it is the mean.
* ``bootstrap_ci``: a percentile bootstrap over runs (sessions), stratified by task: each resample
  draws, for every task (column) separately, as many runs as it has, with replacement; the statistic
  is computed on each resample and the interval is its ``(1 - confidence) / 2`` and
  ``(1 + confidence) / 2`` percentiles (rliable's default ``percentile`` method). A trial is one task
  (one env), so the strata are trivial and runs = sessions. The generator is seeded (``seed``), so
  an analysis is reproducible. With one session the interval is that session's value.

Units are those of the scores (returns, strengths); counts are sessions.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95


def iqm(scores: np.ndarray, axis: int = 0) -> np.ndarray | float:
    """Interquartile mean along ``axis`` (NaNs are not allowed).

    Args:
        scores: array of scores, e.g. (R runs,) or (R runs, F frames) with ``axis=0``.
        axis: the runs axis.

    Returns:
        A float for 1-D input, else the array without ``axis``.

    Raises:
        ValueError: no score along ``axis``, or a NaN in ``scores``.
    """
    scores = np.asarray(scores, dtype=float)
    n = scores.shape[axis]
    if n == 0:
        raise ValueError("iqm of no scores")
    if np.isnan(scores).any():
        raise ValueError("iqm: scores contain NaN")
    cut = n // 4
    middle = np.take(np.sort(scores, axis=axis), range(cut, n - cut), axis=axis)
    out = middle.mean(axis=axis)
    return float(out) if np.ndim(out) == 0 else out


def bootstrap_ci(scores: np.ndarray, statistic: Callable[[np.ndarray], np.ndarray] = iqm,
                 resamples: int = BOOTSTRAP_RESAMPLES, confidence: float = CONFIDENCE,
                 seed: int = 0) -> tuple[np.ndarray | float, np.ndarray | float]:
    """Stratified percentile-bootstrap interval of ``statistic`` over runs.

    Args:
        scores: (R runs,) for one task, or (R runs, F) where every column is resampled with the same
            run indices (e.g. one statistic per frame: curves of R sessions); strata are tasks, and
            a trial has one.
        statistic: maps an (R, ...) array to its statistic along axis 0 (default ``iqm``).
        resamples: bootstrap resamples. confidence: interval coverage in (0, 1).
        seed: seed of the numpy generator that draws the resamples.

    Returns:
        ``(low, high)``: floats for 1-D ``scores``, else arrays of shape (F,).

    Raises:
        ValueError: no runs, NaN scores, or ``confidence`` outside (0, 1).
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    scores = np.asarray(scores, dtype=float)
    if scores.shape[0] == 0 or np.isnan(scores).any():
        raise ValueError("bootstrap_ci needs at least one run and no NaN scores")
    rng = np.random.default_rng(seed)
    idx_BR = rng.integers(0, scores.shape[0], size=(resamples, scores.shape[0]))
    boot = np.stack([np.asarray(statistic(scores[idx])) for idx in idx_BR])  # (B,) or (B, F)
    low, high = np.percentile(boot, [50 * (1 - confidence), 50 * (1 + confidence)], axis=0)
    return (float(low), float(high)) if np.ndim(low) == 0 else (low, high)


def summary(scores: list[float] | np.ndarray, seed: int = 0) -> dict[str, float | list[float] | None]:
    """Mean, std (ddof 1; None with one run), IQM and its 95% bootstrap CI of per-session scores.

    Returns:
        ``{"mean", "std", "iqm", "ci": [low, high], "n"}``; all None (n 0) when there is no score.
    """
    values = np.asarray([s for s in scores if s is not None and np.isfinite(s)], dtype=float)
    if values.size == 0:
        return {"mean": None, "std": None, "iqm": None, "ci": None, "n": 0}
    low, high = bootstrap_ci(values, seed=seed)
    return {"mean": float(values.mean()), "std": float(values.std(ddof=1)) if values.size > 1 else None,
            "iqm": iqm(values), "ci": [low, high], "n": int(values.size)}


def curve_band(stacked_FR: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per frame IQM across sessions and its 95% bootstrap CI.

    Args:
        stacked_FR: (F frames, R sessions) values, no NaN (drop frames some session lacks first).

    Returns:
        ``(iqm_F, low_F, high_F)``.
    """
    runs_first = np.asarray(stacked_FR, dtype=float).T  # (R, F)
    low, high = bootstrap_ci(runs_first, seed=seed)
    return np.asarray(iqm(runs_first)), np.asarray(low), np.asarray(high)
