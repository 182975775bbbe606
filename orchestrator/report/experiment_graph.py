"""The experiment graph of a search (``graph/{spec_name}_experiment_graph.png``), landscape.

* A search whose trials kept their sampled values: one scatter panel per (metric, searched key), each trial a dot
  coloured by its ``strength`` (the title says so). A metric that is the same for every trial (e.g. ``frame``
  when every trial ran to ``env.max_frame``) draws no panel: the title says its value. A ``loguniform`` key gets a
  log axis labelled at 1, 2 and 5 times each power of ten, with no minor labels.
* A PBT search that made decisions (its trials' values changed along the run): the final score of each trial as a
  bar, best first, labelled with the trial's last values, beside the lineage's score panel
  (``orchestrator.report.pbt_graph``); final values against score would hide that each trial trained with several.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from orchestrator.report.graphs import log_axis, png
from orchestrator.report.pbt_graph import Lineage, draw_scores, short, trial_colors

METRICS = ("strength", "total_reward_ma", "frame")  # rows of a plain search's graph, when they vary


def constant(values: pd.Series) -> bool:
    """Whether a metric column has one value for every trial (NaN aside; an empty column counts as constant)."""
    finite = pd.to_numeric(values, errors="coerce").dropna()
    return finite.empty or bool(np.isclose(finite.min(), finite.max(), rtol=1e-9, atol=0.0))


def _canvas(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=80)
    FigureCanvasAgg(fig)
    return fig


def plain_figure(df: pd.DataFrame, variables: list[Any], title: str) -> Any:
    """The scatter grid of a search whose trials kept their values: a row per varying metric (``METRICS``, at least
    ``total_reward_ma``), a column per searched key (``SearchVar``: ``path``, ``kind``)."""
    metrics = [m for m in METRICS if m in df and not constant(df[m])] or ["total_reward_ma"]
    fixed = [f"{m}={df[m].dropna().iloc[0]:.4g}" for m in METRICS if m in df and m not in metrics
             and df[m].notna().any()]
    cols, rows = len(variables), len(metrics)
    fig = _canvas(max(10.0, 3.4 * cols + 1.0), 2.6 * rows + 1.2)
    axes = fig.subplots(rows, cols, squeeze=False)
    color = df["strength"].fillna(df["total_reward_ma"]).fillna(0.0) if "strength" in df else None
    for i, metric in enumerate(metrics):
        for j, var in enumerate(variables):
            ax = axes[i][j]
            x = df[var.path]
            if x.dtype == object:  # lists/strings (choice of hid_layers, names): categorical axis
                x = x.astype(str)
            ax.scatter(x, df[metric], c=color, cmap="viridis", edgecolors="k")
            if var.kind == "loguniform":
                ax.set_xscale("log")
                log_axis(ax.xaxis)
            ax.set_xlabel(var.path if i == rows - 1 else "")
            ax.set_ylabel(metric if j == 0 else "")
            ax.grid(alpha=0.3)
    notes = ["a dot per trial, coloured by strength (yellow: highest)"] + \
        [f"the same for every trial: {', '.join(fixed)}"] * bool(fixed)
    fig.suptitle(f"{title}\n({'; '.join(notes)})", fontsize=10)
    return fig


def pbt_figure(df: pd.DataFrame, lineage: Lineage, title: str) -> Any:
    """A PBT search's graph: the final ``total_reward_ma`` of each trial (bars, best at the top, each labelled with
    the trial's last values and ``strength``) and the lineage's score panel, in the lineage's trial colours."""
    fig = _canvas(13.0, 0.5 + max(4.0, 0.45 * len(df) + 1.5))
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.0, 1.3]})
    colors = trial_colors(lineage)
    order = df.sort_values("total_reward_ma", ascending=True, na_position="first")
    y = np.arange(len(order))
    trials = [int(t) for t in order["trial"]]
    scores = order["total_reward_ma"].astype(float).fillna(0.0)
    left.barh(y, scores, color=[colors.get(t, "0.5") for t in trials])
    keys = lineage.keys
    labels = []
    for t, (_, row) in zip(trials, order.iterrows()):
        values = ", ".join(f"{short(k)}={row[k]:.3g}" if isinstance(row[k], float) else f"{short(k)}={row[k]}"
                           for k in keys if k in row)
        strength = row.get("strength")
        tail = f"; strength {strength:.3g}" if isinstance(strength, float) and math.isfinite(strength) else ""
        labels.append(f"t{t}\n{values}{tail}")
    left.set_yticks(y, labels, fontsize=8)
    left.set_xlabel("final total_reward_ma (mean over sessions)")
    left.set_title("final score per trial (its last values)", fontsize=9)
    left.grid(axis="x", alpha=0.3)
    draw_scores(right, lineage, colors)
    right.set_xlabel("frame")
    right.set_title("score at each generation's end (dashed: exploit; grey: best trial's ancestry)", fontsize=9)
    fig.suptitle(title, fontsize=10)
    return fig


def experiment_figure(df: pd.DataFrame, variables: list[Any], title: str, lineage: Lineage | None = None) -> Any:
    """The experiment graph as a matplotlib Figure: ``pbt_figure`` with a lineage (a PBT search that decided),
    else ``plain_figure``.

    Args:
        df: the search's experiment_df (``trial``, the searched values by path, ``strength``, ``total_reward_ma``,
            ``frame``).
        variables: the searched keys (``orchestrator.spec.search_space.SearchVar``).
    """
    if lineage is not None:
        return pbt_figure(df, lineage, title)
    return plain_figure(df, variables, title)


def experiment_png(df: pd.DataFrame, variables: list[Any], title: str, lineage: Lineage | None = None) -> bytes:
    """PNG bytes of ``experiment_figure``."""
    return png(experiment_figure(df, variables, title, lineage))
