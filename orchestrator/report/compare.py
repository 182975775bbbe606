"""``lab compare PREDIR_OR_TRIAL ...``: one graph of several runs or trials, and the interactive HTML
trial graph that ``lab analyze`` writes.

Each source is a run directory (each of its trials is one curve; a ``train`` run has one, ``t0``)
or one trial of a run, ``{predir}/t{T}`` (path or URI). A curve is the interquartile mean across
the trial's sessions of ``total_reward_ma`` against frames, with its 95% stratified-bootstrap CI as
a band (``orchestrator.report.stats``; with one session, the session's own curve), at the frames where
every session has a value; sessions are read from their newest verified checkpoint (a ``dev`` run's
train_df), as ``lab analyze`` does. Each curve has its own colour (matplotlib's ``tab10``) in both
files, and each env's gymnasium ``reward_threshold`` is a dotted horizontal line.

Outputs: ``{out}.png`` (matplotlib) and ``{out}.html`` (plotly; it loads the data dir's shared
``.assets/plotly-{version}.min.js`` when the page is inside a data dir, else that file written once beside it,
so the page works offline); ``--out`` ending in ``.png`` or ``.html`` is taken as given; it defaults to
``compare_{YYYY_MM_DD_HHMMSS}`` in the working directory. Nothing is written into the compared runs.
"""

from __future__ import annotations

import functools
import posixpath
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pandas as pd

from orchestrator.errors import UsageError
from orchestrator.store import predir as predir_mod
from orchestrator.store import storage

TAB10 = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
         "#17becf")
PLOTLY_JS = "plotly.min.js"
ASSETS_DIR = ".assets"  # in a data dir: the plotly-{version}.min.js that every run's HTML graphs load


@dataclass(frozen=True)
class Curve:
    """One trial's curve: ``label`` (``{run}`` or ``{run}/t{T}``), env name, sessions, its band (index frame; iqm,
    low, high) and ``detail``: what it ran (a search trial's searched values, else the spec name and algorithm)."""

    label: str
    env: str
    sessions: int
    band: pd.DataFrame
    detail: str = ""

    @property
    def legend(self) -> str:
        """The curve's legend entry: ``{label}: {detail} ({n} sessions)``."""
        detail = f": {self.detail}" if self.detail else ""
        return f"{self.label}{detail} ({self.sessions} session{'s' if self.sessions != 1 else ''})"


# ---------------------------------------------------------------- reading sources

def split_source(source: str) -> tuple[str, int | None]:
    """``(predir, trial)`` of a compare source: ``{predir}`` (trial None: all) or ``{predir}/t{T}``.

    Raises:
        UsageError: the path does not exist or is not a run directory (or a trial of one).
    """
    uri = storage.absolute(source.rstrip("/"))
    m = re.fullmatch(r"t(\d+)", storage.basename(uri))
    predir, trial = (storage.dirname(uri), int(m.group(1))) if m else (uri, None)
    if not storage.is_dir(uri):
        raise UsageError(f"compare: '{source}' does not exist")
    try:
        name = predir_mod.spec_name_of(predir)
    except ValueError:
        raise UsageError(f"compare: '{source}' is neither a run directory ({{spec_name}}_{{YYYY_MM_DD_HHMMSS}}) "
                         "nor a trial of one ({predir}/t{T})") from None
    if not storage.exists(predir_mod.spec_file(predir, name)):
        raise UsageError(f"compare: '{predir}' is not a run directory: it has no {name}_spec.json")
    return predir, trial


def trial_dfs(predir: str, only: int | None) -> dict[int, dict[int, pd.DataFrame]]:
    """``{trial: {session: train_df}}`` of the sessions with a logged return (committed data), of trial
    ``only`` or of every trial."""
    from orchestrator.report.rundata import committed_df, session_keys

    out: dict[int, dict[int, pd.DataFrame]] = {}
    for t, s in session_keys(predir):
        if only is not None and t != only:
            continue
        df = committed_df(predir_mod.session_dir(predir, t, s), "train_df.parquet")
        if df is not None and df["total_reward_ma"].notna().any():
            out.setdefault(t, {})[s] = df
    return out


def source_curves(source: str) -> list[Curve]:
    """The curves of one source (``{predir}`` or ``{predir}/t{T}``): one per trial with a logged
    return, labelled ``{predir name}/t{T}`` (a run of one trial, given as a run: its name alone), with the
    trial's ``detail`` (``curve_detail``)."""
    from orchestrator.report.graphs import iqm_band, stack_sessions

    predir, only = split_source(source)
    name = predir_mod.spec_name_of(predir)
    spec = storage.read_json(predir_mod.spec_file(predir, name))
    by_trial = trial_dfs(predir, only)
    curves = []
    for t, dfs in by_trial.items():
        label = storage.basename(predir) if len(by_trial) == 1 and only is None \
            else f"{storage.basename(predir)}/t{t}"
        curves.append(Curve(label, spec["env"]["name"], len(dfs), iqm_band(stack_sessions(dfs)),
                            curve_detail(predir, spec, t)))
    return curves


def curve_detail(predir: str, spec: dict[str, Any], t: int) -> str:
    """What trial ``t`` of a run ran, for its legend: a search trial's values from ``t{T}/trial.json``
    (``lr=0.00123, gamma=0.99``: each key's last path component; a PBT trial's values at its end), else the algorithm
    and the spec name (``PPO ppo_cartpole``; the spec name left out when the run's directory name starts with it)."""
    info = storage.read_json_or_none(storage.join(predir, f"t{t}", "trial.json"), "its legend without its values") \
        if "search" in spec else None
    values = info.get("values") if isinstance(info, dict) else None
    if isinstance(values, dict) and values:
        return ", ".join(f"{k.rsplit('.', 1)[-1]}={v:.4g}" if isinstance(v, float) else f"{k.rsplit('.', 1)[-1]}={v}"
                         for k, v in values.items())
    agent = spec.get("agent")
    algorithm = agent.get("algorithm", {}).get("name") if isinstance(agent, dict) else None
    name = spec.get("name", "")
    parts = [str(algorithm)] if algorithm else []
    if name and not storage.basename(predir).startswith(name):
        parts.append(name)
    return " ".join(parts)


# ---------------------------------------------------------------- drawing

def compare_png(curves: list[Curve], thresholds: dict[str, float], title: str) -> bytes:
    """PNG bytes of ``compare_mpl``."""
    from orchestrator.report.graphs import png

    return png(compare_mpl(curves, thresholds, title))


def compare_mpl(curves: list[Curve], thresholds: dict[str, float], title: str) -> Any:
    """matplotlib Figure: each curve's IQM line and CI band, each env's reward threshold dotted; the legend below the
    plot area (it never hides a curve), one entry per curve (``Curve.legend``)."""
    from orchestrator.report.graphs import figure

    entries = len(curves) + len(thresholds)
    fig, (ax,) = figure(1, width=9.0, heights=[2.8 + 0.2 * entries])
    for i, curve in enumerate(curves):
        color = TAB10[i % len(TAB10)]
        ax.fill_between(curve.band.index, curve.band["low"], curve.band["high"], color=color, alpha=0.2,
                        linewidth=0)
        ax.plot(curve.band.index, curve.band["iqm"], color=color, linewidth=2, label=curve.legend)
    for env, value in thresholds.items():
        ax.axhline(value, color="black", linestyle=":", linewidth=1, label=f"{env} reward_threshold {value:g}")
    ax.set_xlabel("frame")
    ax.set_ylabel("total_reward_ma: IQM, 95% CI")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(0.0, -0.16), fontsize=8, frameon=False)
    return fig


def _band_traces(band: pd.DataFrame, color: str, label: str, legend: str) -> list[dict[str, Any]]:
    """Plotly traces of a band (a filled low..high polygon) and its centre line."""
    x = [int(f) for f in band.index]
    return [{"type": "scatter", "x": x + x[::-1], "y": list(band["high"]) + list(band["low"])[::-1],
             "fill": "toself", "fillcolor": color, "opacity": 0.2, "line": {"width": 0}, "hoverinfo": "skip",
             "legendgroup": legend, "showlegend": False, "name": f"{label} CI"},
            {"type": "scatter", "x": x, "y": list(band["iqm"]), "mode": "lines", "line": {"color": color},
             "legendgroup": legend, "name": label}]


def compare_figure(curves: list[Curve], thresholds: dict[str, float], title: str) -> dict[str, Any]:
    """Plotly figure (as a dict) of ``compare_png``'s content."""
    traces = []
    for i, curve in enumerate(curves):
        traces += _band_traces(curve.band, TAB10[i % len(TAB10)], curve.legend, curve.label)
    shapes = [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": v, "y1": v,
               "line": {"dash": "dot", "color": "black", "width": 1}} for v in thresholds.values()]
    notes = [{"xref": "paper", "x": 0, "y": v, "text": f"{env} reward_threshold {v:g}", "showarrow": False,
              "yanchor": "bottom", "xanchor": "left"} for env, v in thresholds.items()]
    return {"data": traces, "layout": {"title": {"text": title}, "xaxis": {"title": {"text": "frame"}},
                                       "yaxis": {"title": {"text": "total_reward_ma: IQM, 95% CI"}},
                                       "shapes": shapes, "annotations": notes, "hovermode": "x unified",
                                       "legend": LEGEND_BELOW}}


LEGEND_BELOW = {"orientation": "h", "yanchor": "top", "y": -0.2, "xanchor": "left", "x": 0}  # plotly: under the plot


def trial_traces(dfs: dict[int, pd.DataFrame], title: str, rand_return: float | None,
                 points: list[Any], threshold: float | None = None) -> dict[str, Any]:
    """Plotly figure (dict) of a trial: per-session ``total_reward_ma`` (thin), the mean with a +-1 std
    band and the IQM with its 95% bootstrap CI (four sessions or more; where they coincide, ``graphs.coincide``, one
    line with the CI as its band; one session: its curve alone), the random policy's return, the env's reward
    threshold and the resume/restart lines; the legend below the plot.

    Args:
        dfs: session -> train_df; points: ``analysis.Marker`` list (frames, label).
    """
    from orchestrator.report.graphs import coincide, iqm_band, stack_sessions

    stacked = stack_sessions(dfs)
    mean, std = stacked.mean(axis=1), stacked.std(axis=1).fillna(0.0)
    traces = [{"type": "scatter", "x": [int(f) for f in stacked.index], "y": list(stacked[s]), "mode": "lines",
               "line": {"width": 1, "color": "#aec7e8"}, "name": f"s{s}", "legendgroup": "sessions"}
              for s in stacked.columns]
    if len(dfs) > 1:
        band = iqm_band(stacked)
        if coincide(stacked, band):
            traces += _band_traces(band.assign(iqm=mean.loc[band.index]), TAB10[0],
                                   f"mean = IQM of {len(dfs)} sessions, band: 95% bootstrap CI", "mean")
        else:
            mean_band = pd.DataFrame({"iqm": mean, "low": mean - std, "high": mean + std})
            traces += _band_traces(mean_band, TAB10[0], f"mean +-1 std ({len(dfs)} sessions)", "mean")
            traces += _band_traces(band, TAB10[1], "IQM, 95% bootstrap CI", "iqm")
    shapes = [{"type": "line", "yref": "paper", "y0": 0, "y1": 1, "x0": f, "x1": f,
               "line": {"dash": "dash", "color": "red", "width": 1}} for m in points for f in m.frames]
    notes = [{"yref": "paper", "y": 1, "x": m.frames[0], "text": m.label, "showarrow": False, "yanchor": "top",
              "xanchor": "left", "font": {"color": "red", "size": 10}} for m in points]
    if rand_return is not None:
        shapes.append({"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": rand_return, "y1": rand_return,
                       "line": {"dash": "dot", "color": "gray", "width": 1}})
        notes.append({"xref": "paper", "x": 1, "y": rand_return, "text": "random policy", "showarrow": False,
                      "xanchor": "right", "yanchor": "bottom"})
    if threshold is not None:
        shapes.append({"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": threshold, "y1": threshold,
                       "line": {"dash": "dot", "color": "black", "width": 1}})
        notes.append({"xref": "paper", "x": 0, "y": threshold, "text": f"reward_threshold {threshold:g}",
                      "showarrow": False, "xanchor": "left", "yanchor": "bottom"})
    return {"data": traces, "layout": {"title": {"text": title}, "xaxis": {"title": {"text": "frame"}},
                                       "yaxis": {"title": {"text": "return (moving average)"}},
                                       "shapes": shapes, "annotations": notes, "hovermode": "x unified",
                                       "legend": LEGEND_BELOW}}


def write_html(uri: str, figure: dict[str, Any], title: str, js_dir: str | None = None) -> None:
    """Write a plotly figure as an HTML page at ``uri`` that loads plotly's JavaScript by relative path (it works
    offline): ``plotly.min.js`` beside the page, written once per directory, or with ``js_dir`` one
    ``plotly-{version}.min.js`` there (a data dir's ``ASSETS_DIR``: every run's pages share one copy of its 4.8 MB,
    and a page keeps the plotly version it was written with).

    Raises:
        storage.StorageError: a write failed.
    """
    import pkgutil
    from importlib.metadata import version

    import plotly.io as pio

    page_dir = storage.dirname(uri)
    if js_dir is None:
        js = storage.join(page_dir, PLOTLY_JS)
    else:
        js = storage.join(js_dir, f"plotly-{version('plotly')}.min.js")
    if not storage.exists(js):  # plotly's own file, as plotly.offline.get_plotlyjs reads it (bytes: no str copies)
        storage.write_bytes(js, pkgutil.get_data("plotly", "package_data/plotly.min.js"))
    src = relative_path(js, page_dir)
    template = default_template()
    if template is None:  # a plotly without its template file: its own validation applies the template
        html = pio.to_html(figure, include_plotlyjs=src, full_html=True, validate=True)
    else:
        layout = {"template": template, **figure.get("layout", {})}
        html = pio.to_html({**figure, "layout": layout}, include_plotlyjs=src, full_html=True, validate=False)
    storage.write_text(uri, html.replace("<head>", f"<head><title>{title}</title>", 1))


def relative_path(uri: str, start: str) -> str:
    """``uri`` relative to the directory ``start`` of the same store, '/'-separated (e.g. ``../../a/b.js``)."""
    def path(u: str) -> str:
        return u.split("://", 1)[1] if "://" in u else storage.absolute(u)

    return posixpath.relpath(path(uri), path(start) or ".")


@functools.cache
def default_template() -> dict[str, Any] | None:
    """plotly's default ``plotly`` template as a dict, from its package data, or None where it is not there.

    ``pio.to_html(validate=True)`` would apply it too, by building a ``plotly.graph_objects.Figure``, which imports
    plotly's validator tree (about 16 MB of the driver's RSS, most of its peak at the analysis: docs/BENCHMARKS.md
    "Process memory"); the figures here are the lab's own, so the template is set directly and the same page is
    written without it (its JSON keys in the order given instead of sorted)."""
    import json
    import pkgutil

    try:
        data = pkgutil.get_data("plotly", "package_data/templates/plotly.json")
    except (OSError, ImportError):
        return None
    return json.loads(data) if data else None


# ---------------------------------------------------------------- the command

def final_lines(curves: list[Curve]) -> list[str]:
    """One line per curve: its last frame and the IQM of ``total_reward_ma`` there with its 95% CI."""
    lines = []
    for curve in curves:
        last = curve.band.iloc[-1]
        lines.append(f"{curve.label}: frame={int(curve.band.index[-1])} IQM total_reward_ma={last['iqm']:.4g} "
                     f"95% CI [{last['low']:.4g}, {last['high']:.4g}] ({curve.sessions} sessions)")
    return lines


def compare_command(sources: list[str], out: str | None) -> int:
    """``lab compare``: write ``{out}.png`` and ``{out}.html`` and print their paths; returns 0.

    Raises:
        UsageError: a source is not a run or trial, or no source has a session with a logged return.
    """
    from orchestrator.report.rundata import reward_threshold

    curves = [c for source in sources for c in source_curves(source)]
    curves = [c for c in curves if not c.band.empty]
    if not curves:
        raise UsageError(f"compare: no session of {', '.join(sources)} has a logged return yet")
    thresholds = {env: v for env in dict.fromkeys(c.env for c in curves) if (v := reward_threshold(env)) is not None}
    png, html = output_paths(out or f"compare_{datetime.now().strftime(predir_mod.TS_FORMAT)}")
    title = " vs ".join(c.label for c in curves) if len(curves) <= 3 else f"{len(curves)} trials"
    storage.write_bytes(png, compare_png(curves, thresholds, title))
    write_html(html, compare_figure(curves, thresholds, title), title, js_dir=assets_dir(storage.dirname(html)))
    print("\n".join(final_lines(curves)))
    print(f"graph: {png}\ngraph: {html}")
    return 0


def output_paths(out: str) -> tuple[str, str]:
    """The PNG and HTML paths of ``--out``: taken as given when it ends in ``.png`` or ``.html`` (the other file
    gets the same stem), else ``{out}.png`` and ``{out}.html``."""
    out = storage.absolute(out)
    stem, ext = posixpath.splitext(out)
    if ext.lower() in (".png", ".html", ".htm"):
        other = stem + (".html" if ext.lower() == ".png" else ".png")
        return (out, other) if ext.lower() == ".png" else (other, out)
    return out + ".png", out + ".html"


def assets_dir(page_dir: str) -> str:
    """Where a page in ``page_dir`` finds plotly's JavaScript: the ``ASSETS_DIR`` of the data dir that holds it
    (the nearest ancestor with one), else ``page_dir`` itself (a versioned ``plotly-{version}.min.js`` there)."""
    d = page_dir
    while True:
        if storage.is_dir(storage.join(d, ASSETS_DIR)):
            return storage.join(d, ASSETS_DIR)
        parent = storage.dirname(d)
        if not parent or parent == d:
            return page_dir
        d = parent
