"""The lineage graph of a population-based training run: each trial's score at every generation's end, an edge from
the state each generation continued (the trial's own, or its donor's after an exploit), exploits dashed and marked,
and the ancestry of the best trial's final state drawn thick. PNG (matplotlib) and HTML (plotly)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.report.compare import write_html
from orchestrator.report.graphs import png
from orchestrator.store import storage


@dataclass(frozen=True)
class Lineage:
    """What the graph shows.

    Fields:
        points: (generation, trial) -> (frame, score) at the generation's end (score None when unknown or failed;
            ``orchestrator.search.pbt.generation_score``).
        parents: (generation, trial) -> (trial whose state generation ``generation`` continued, exploited) for
            generations after the first.
        best_path: the (generation, trial) points of the best trial's ancestry, first generation first.
    """

    points: dict[tuple[int, int], tuple[int, float | None]]
    parents: dict[tuple[int, int], tuple[int, bool]]
    best_path: list[tuple[int, int]]


def _edges(lin: Lineage) -> list[tuple[tuple[int, int], tuple[int, int], bool]]:
    """(from point, to point, exploited) for every generation after the first whose two points are known (a
    generation under way, or a stop, leaves a decision's next point out)."""
    return [((g - 1, parent), (g, t), exploited) for (g, t), (parent, exploited) in sorted(lin.parents.items())
            if (g - 1, parent) in lin.points and (g, t) in lin.points]


def _xy(lin: Lineage, a: tuple[int, int], b: tuple[int, int]) -> tuple[list[int], list[float | None]]:
    return [lin.points[a][0], lin.points[b][0]], [lin.points[a][1], lin.points[b][1]]


def lineage_png(lin: Lineage, title: str) -> bytes:
    """The graph as PNG bytes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.5), dpi=80)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    trials = sorted({t for _, t in lin.points})
    colors = {t: f"C{i % 10}" for i, t in enumerate(trials)}
    best = set(zip(lin.best_path, lin.best_path[1:]))
    for a, b, exploited in _edges(lin):
        x, y = _xy(lin, a, b)
        if None in y:
            continue
        thick = (a, b) in best
        ax.plot(x, y, color="black" if thick else colors[b[1]], lw=3 if thick else 1.2,
                ls="--" if exploited else "-", zorder=3 if thick else 2)
    for (g, t), (frame, score) in lin.points.items():
        if score is not None:
            exploited = lin.parents.get((g + 1, t), (t, False))[1]
            ax.scatter([frame], [score], color=colors[t], marker="x" if exploited else "o", zorder=4,
                       label=f"t{t}" if g == 1 else None)
    ax.set_xlabel("frame")
    ax.set_ylabel("score (generation's mean return, mean over sessions)")
    ax.set_title(title + "\n(dashed: exploit; x: replaced at the next decision; thick: best trial's ancestry)",
                 fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return png(fig)


def lineage_figure(lin: Lineage, title: str) -> dict[str, Any]:
    """The graph as a plotly figure dict."""
    traces = []
    best = set(zip(lin.best_path, lin.best_path[1:]))
    for a, b, exploited in _edges(lin):
        x, y = _xy(lin, a, b)
        thick = (a, b) in best
        traces.append({"type": "scatter", "x": x, "y": y, "mode": "lines", "showlegend": False, "hoverinfo": "skip",
                       "line": {"width": 4 if thick else 1.5, "dash": "dash" if exploited else "solid",
                                "color": "black" if thick else None}})
    for t in sorted({t for _, t in lin.points}):
        pts = sorted((g, *lin.points[(g, tt)]) for g, tt in lin.points if tt == t)
        traces.append({"type": "scatter", "mode": "markers", "name": f"t{t}", "x": [p[1] for p in pts],
                       "y": [p[2] for p in pts], "text": [f"t{t} generation {p[0]}" for p in pts]})
    return {"data": traces, "layout": {"title": {"text": title}, "xaxis": {"title": {"text": "frame"}},
                                       "yaxis": {"title": {"text": "score (generation's mean return)"}}}}


def write_lineage(graph_dir: str, name: str, lin: Lineage, title: str) -> list[str]:
    """Write ``{name}_pbt_lineage.png`` and ``.html`` into ``graph_dir``; returns their URIs."""
    png_uri = storage.join(graph_dir, f"{name}_pbt_lineage.png")
    html_uri = storage.join(graph_dir, f"{name}_pbt_lineage.html")
    storage.write_bytes(png_uri, lineage_png(lin, title))
    write_html(html_uri, lineage_figure(lin, title), title)
    return [png_uri, html_uri]
