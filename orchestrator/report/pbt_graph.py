"""The lineage graph of a population-based training run, in PNG (matplotlib) and HTML (plotly).

Top panel: each trial's score at every generation's end, one colour per trial; a solid edge where a trial trained on
from its own state, a dashed one from the donor's point where it continued from a donor's state (an exploit); the
ancestry of the best final trial underlaid as a wide grey band, so the trials' colours stay visible. Below it, one
panel per searched key: each trial's value over frames as a step line (the value it trained with from each
generation's start, changing where a decision perturbed, resampled or copied it), as in Ray Tune's PBT examples
(log scale for a ``loguniform`` key). The legend, outside the axes, names every trial alike and each line style.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.report.compare import ASSETS_DIR, TAB10, write_html
from orchestrator.report.graphs import log_axis, png
from orchestrator.store import storage

Point = tuple[int, int]  # (generation, trial)


@dataclass(frozen=True)
class Lineage:
    """What the graph shows.

    Fields:
        points: (generation, trial) -> (frame, score) at the generation's end (score None when unknown or failed;
            ``orchestrator.search.pbt.generation_score``).
        parents: (generation, trial) -> (trial whose state generation ``generation`` continued, exploited) for
            generations after the first.
        best_path: the (generation, trial) points of the best trial's ancestry, first generation first.
        schedule: trial -> ``[(frame, values)]`` in frame order: the searched values (dotted path -> value) the trial
            trained with from ``frame`` on (0: its initial values; then each decision's ``config``).
        end_frame: the frame the last values of ``schedule`` are drawn to.
        log_keys: the searched keys drawn on a log scale (``loguniform``).
    """

    points: dict[Point, tuple[int, float | None]]
    parents: dict[Point, tuple[int, bool]]
    best_path: list[Point]
    schedule: dict[int, list[tuple[int, dict[str, Any]]]] = field(default_factory=dict)
    end_frame: int = 0
    log_keys: frozenset[str] = frozenset()

    @property
    def trials(self) -> list[int]:
        """Every trial with a point or a schedule, in order."""
        return sorted({t for _, t in self.points} | set(self.schedule))

    @property
    def keys(self) -> list[str]:
        """The searched keys of the schedule, in the order of the first trial's values."""
        for steps in self.schedule.values():
            if steps:
                return list(steps[0][1])
        return []


def lineage_of(records: Sequence[Any], initial: dict[int, dict[str, Any]], finals: dict[int, float | None],
               final_frame: int, log_keys: frozenset[str] = frozenset()) -> Lineage | None:
    """The lineage of the decisions ``records`` (``pbt.jsonl``, read as ``orchestrator.search.decision.Decision``:
    their ``generation``, ``frame``, ``trial``, ``donor``, ``score`` and ``config`` fields).

    Args:
        initial: trial -> its initial values (``orchestrator.search.pbt_policy.initial_config``).
        finals: trial -> its score at ``final_frame`` (empty while the last generation is not committed everywhere).
        final_frame: the run's last frame (``env.max_frame``'s boundary).

    Returns:
        The Lineage (best path: the ancestry of the best score of the last generation with points), or None when
        there is no decision.
    """
    if not records:
        return None
    points = {(r.generation, r.trial): (r.frame, r.score) for r in records}
    parents = {(r.generation + 1, r.trial): (r.trial if r.donor is None else r.donor, r.donor is not None)
               for r in records}
    last = max(g for g, _ in points) + 1
    for t, score in finals.items():
        points[(last, t)] = (final_frame, score)
    parents = {k: v for k, v in parents.items() if k in points}  # the generation under way has no point yet
    top = max(g for g, _ in points)
    ends = {t: s for (g, t), (_, s) in points.items() if g == top}
    best = max(sorted(ends), key=lambda t: -math.inf if ends[t] is None else ends[t])
    path = [(top, best)]
    while path[-1] in parents:
        g, t = path[-1]
        path.append((g - 1, parents[(g, t)][0]))
    schedule = {t: [(0, dict(values))] for t, values in initial.items()}
    for r in sorted(records, key=lambda r: (r.frame, r.trial)):
        schedule.setdefault(r.trial, []).append((r.frame, dict(r.config)))
    end = final_frame if finals else max(r.frame for r in records)
    return Lineage(points, parents, path[::-1], schedule, end, frozenset(log_keys))


def _edges(lin: Lineage) -> list[tuple[Point, Point, bool]]:
    """(from point, to point, exploited) for every generation after the first whose two points are known (a
    generation under way, or a stop, leaves a decision's next point out)."""
    return [((g - 1, parent), (g, t), exploited) for (g, t), (parent, exploited) in sorted(lin.parents.items())
            if (g - 1, parent) in lin.points and (g, t) in lin.points]


def _xy(lin: Lineage, a: Point, b: Point) -> tuple[list[int], list[float | None]]:
    return [lin.points[a][0], lin.points[b][0]], [lin.points[a][1], lin.points[b][1]]


def trial_colors(lin: Lineage) -> dict[int, str]:
    """Trial -> its colour (matplotlib's ``tab10`` in trial order), the same in every panel and file."""
    return {t: TAB10[i % len(TAB10)] for i, t in enumerate(lin.trials)}


def steps(lin: Lineage, key: str) -> dict[int, tuple[list[int], list[Any]]]:
    """Trial -> (frames, values) of ``key``'s step line: the value each part of the schedule trained with, from its
    first frame, and the last value repeated at ``end_frame`` (drawn with ``where="post"``)."""
    out = {}
    for t, parts in sorted(lin.schedule.items()):
        frames, values = [f for f, _ in parts], [v.get(key) for _, v in parts]
        if frames and lin.end_frame > frames[-1]:
            frames, values = frames + [lin.end_frame], values + [values[-1]]
        out[t] = (frames, values)
    return out


def short(key: str) -> str:
    """A searched key's last path component (``agent.net.optim_spec.lr`` -> ``lr``)."""
    return key.rsplit(".", 1)[-1]


def draw_scores(ax: Any, lin: Lineage, colors: dict[int, str]) -> None:
    """The score panel on a matplotlib axis: the best ancestry as a grey band, each edge in its trial's colour
    (dashed: an exploit, from the donor's point), a dot at every point."""
    best = set(zip(lin.best_path, lin.best_path[1:]))
    for a, b, exploited in _edges(lin):
        x, y = _xy(lin, a, b)
        if None in y:
            continue
        if (a, b) in best:
            ax.plot(x, y, color="0.6", lw=7, alpha=0.45, solid_capstyle="round", zorder=1)
        ax.plot(x, y, color=colors[b[1]], lw=1.5, ls="--" if exploited else "-", zorder=2)
    for t in lin.trials:
        pts = sorted((f, s) for (g, tt), (f, s) in lin.points.items() if tt == t and s is not None)
        ax.scatter([f for f, _ in pts], [s for _, s in pts], color=colors[t], s=18, zorder=3)
    ax.set_ylabel("score\n(mean return)")
    ax.grid(alpha=0.3)


def _categorical(values: list[Any]) -> bool:
    return not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def draw_values(ax: Any, lin: Lineage, key: str, colors: dict[int, str]) -> None:
    """The panel of one searched key: each trial's value over frames as a step line (categorical values: one
    y tick per value)."""
    lines = steps(lin, key)
    every = [v for _, values in lines.values() for v in values]
    cats = sorted({str(v) for v in every}) if _categorical(every) else None
    for t, (frames, values) in lines.items():
        y = [cats.index(str(v)) for v in values] if cats else values
        ax.step(frames, y, where="post", color=colors[t], lw=1.5, alpha=0.9)
        ax.scatter(frames[:len(lin.schedule[t])], y[:len(lin.schedule[t])], color=colors[t], s=10)
    if cats:
        ax.set_yticks(range(len(cats)), cats, fontsize=7)
    elif key in lin.log_keys:
        ax.set_yscale("log")
        log_axis(ax.yaxis)
    ax.set_ylabel(short(key))
    ax.grid(alpha=0.3)


def legend_handles(lin: Lineage, colors: dict[int, str]) -> list[Any]:
    """One entry per trial (all drawn alike), then one per line style of the score panel."""
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=colors[t], marker="o", ms=4, lw=1.5, label=f"t{t}") for t in lin.trials]
    handles.append(Line2D([], [], color="0.3", lw=1.5, ls="--", label="exploit: continues\nfrom a donor"))
    if len(lin.best_path) > 1:
        handles.append(Line2D([], [], color="0.6", lw=7, alpha=0.45, label="best trial's\nancestry"))
    return handles


def lineage_mpl(lin: Lineage, title: str) -> Any:
    """The graph as a matplotlib Figure: the score panel, then one panel per searched key, sharing the frame axis;
    the legend outside the axes, on the right."""
    from orchestrator.report.graphs import figure

    keys = lin.keys
    fig, axes = figure(1 + len(keys), width=10, heights=[2.6] + [1.6] * len(keys))
    colors = trial_colors(lin)
    draw_scores(axes[0], lin, colors)
    for ax, key in zip(axes[1:], keys):
        draw_values(ax, lin, key, colors)
    axes[-1].set_xlabel("frame")
    axes[0].set_title(title, fontsize=10)
    axes[0].legend(handles=legend_handles(lin, colors), loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8,
                   frameon=False)
    return fig


def lineage_png(lin: Lineage, title: str) -> bytes:
    """The graph as PNG bytes (``lineage_mpl``)."""
    return png(lineage_mpl(lin, title))


def lineage_figure(lin: Lineage, title: str) -> dict[str, Any]:
    """The graph as a plotly figure dict: the score panel (``yaxis``) above one panel per key (``yaxis2``, ...), one
    legend group per trial across the panels."""
    keys, colors = lin.keys, trial_colors(lin)
    n = 1 + len(keys)
    weights = [1.6] + [1.0] * len(keys)
    gap, tops, layout_axes = 0.04, [], {}
    top = 1.0
    for w in weights:
        h = (1.0 - gap * (n - 1)) * w / sum(weights)
        tops.append((top - h, top))
        top -= h + gap
    traces = []
    best = set(zip(lin.best_path, lin.best_path[1:]))
    for a, b, exploited in _edges(lin):
        x, y = _xy(lin, a, b)
        if (a, b) in best:
            traces.append({"type": "scatter", "x": x, "y": y, "mode": "lines", "showlegend": False,
                           "hoverinfo": "skip", "line": {"width": 9, "color": "rgba(150,150,150,0.45)"}})
        traces.append({"type": "scatter", "x": x, "y": y, "mode": "lines", "showlegend": False, "hoverinfo": "skip",
                       "legendgroup": f"t{b[1]}", "line": {"width": 1.5, "color": colors[b[1]],
                                                          "dash": "dash" if exploited else "solid"}})
    for t in lin.trials:
        pts = sorted((g, *lin.points[(g, tt)]) for g, tt in lin.points if tt == t)
        traces.append({"type": "scatter", "mode": "markers", "name": f"t{t}", "legendgroup": f"t{t}",
                       "marker": {"color": colors[t]}, "x": [p[1] for p in pts], "y": [p[2] for p in pts],
                       "text": [f"t{t} generation {p[0]}" for p in pts]})
    for i, key in enumerate(keys, start=2):
        for t, (frames, values) in steps(lin, key).items():
            traces.append({"type": "scatter", "mode": "lines+markers", "x": frames, "y": [
                v if isinstance(v, (int, float)) else str(v) for v in values], "yaxis": f"y{i}", "showlegend": False,
                "legendgroup": f"t{t}", "name": f"t{t}", "line": {"shape": "hv", "color": colors[t]}})
        layout_axes[f"yaxis{i}"] = {"domain": list(tops[i - 1]), "anchor": "x", "title": {"text": short(key)},
                                    **({"type": "log"} if key in lin.log_keys else {})}
    layout = {"title": {"text": title}, "xaxis": {"title": {"text": "frame"}, "anchor": f"y{n}" if n > 1 else "y"},
              "yaxis": {"domain": list(tops[0]), "title": {"text": "score (generation's mean return)"}},
              **layout_axes, "height": 300 + 180 * len(keys),
              "annotations": [{"xref": "paper", "yref": "paper", "x": 0, "y": -0.08, "showarrow": False,
                               "xanchor": "left", "text": "dashed: exploit (continues from a donor); "
                                                          "grey band: best trial's ancestry"}]}
    return {"data": traces, "layout": layout}


def write_lineage(graph_dir: str, name: str, lin: Lineage, title: str) -> list[str]:
    """Write ``{name}_pbt_lineage.png`` and ``.html`` into ``graph_dir`` (a run's ``graph/``: the page loads its data
    dir's shared plotly copy); returns their URIs."""
    png_uri = storage.join(graph_dir, f"{name}_pbt_lineage.png")
    html_uri = storage.join(graph_dir, f"{name}_pbt_lineage.html")
    storage.write_bytes(png_uri, lineage_png(lin, title))
    write_html(html_uri, lineage_figure(lin, title), title,
               js_dir=storage.join(storage.dirname(storage.dirname(storage.absolute(graph_dir))), ASSETS_DIR))
    return [png_uri, html_uri]
