"""Session and trial graphs (PNG through matplotlib's Agg backend): returns over frames, resume and restart markers,
the IQM band across sessions."""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def marks(run: dict[str, Any], key: str) -> list[tuple[int, str]]:
    """(frame, "resume"|"restart") points of session ``key`` from run.json (frame 0 left out).

    Returns:
        The points sorted by frame, each once.
    """
    out = [(int(r["from_frames"][key]), "resume") for r in run.get("resumes", [])
           if int(r.get("from_frames", {}).get(key) or 0) > 0]
    restarts = run.get("sessions", {}).get(key, {}).get("restarts", [])
    out += [(int(r["frame_restored"]), "restart") for r in restarts if int(r.get("frame_restored") or 0) > 0]
    return sorted(set(out))


@dataclass(frozen=True)
class Marker:
    """One resume or restart on a graph: vertical lines at ``frames`` (frames) and one ``label``."""

    frames: tuple[int, ...]
    kind: str
    label: str


def markers(run: dict[str, Any], keys: list[str]) -> list[Marker]:
    """One marker per resume of run.json (``resumes``) and per actor restart, over sessions ``keys``.

    A resume from frame 0 in every session (a fresh start) is left out; resumes whose frames are
    the same share one marker (label ``resume 2,3``).

    Returns:
        Markers sorted by their first frame.
    """
    by_frames: dict[tuple[tuple[int, ...], str], list[str]] = {}
    for i, resume in enumerate(run.get("resumes", []), start=1):
        frames = tuple(sorted({int(resume.get("from_frames", {}).get(k) or 0) for k in keys} - {0}))
        if frames:
            by_frames.setdefault((frames, "resume"), []).append(str(i))
    for key in keys:
        for restart in run.get("sessions", {}).get(key, {}).get("restarts", []):
            frame = int(restart.get("frame_restored") or 0)
            if frame > 0:
                by_frames.setdefault(((frame,), "restart"), []).append(key)
    out = [Marker(frames, kind, f"resume {','.join(ids)}" if kind == "resume" else "restart")
           for (frames, kind), ids in by_frames.items()]
    return sorted(out, key=lambda m: (m.frames[0], m.kind))


def figure(rows: int, width: float = 8.0, heights: list[float] | None = None) -> tuple[Any, list[Any]]:
    """A matplotlib Figure on the Agg canvas (no pyplot global state) with ``rows`` stacked axes sharing x.

    Args:
        width: inches; heights: each row's height in inches (default 1.8 each, plus 2 for titles and labels).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    heights = heights or [1.8] * rows
    fig = Figure(figsize=(width, 2.0 + sum(heights)), dpi=80)
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, 1, sharex=True, squeeze=False, gridspec_kw={"height_ratios": heights})[:, 0]
    return fig, list(axes)


def legend_outside(ax: Any, **kwargs: Any) -> Any:
    """The axis's legend right of its plot area (never over a curve); ``tight_layout`` (``png``) makes room."""
    return ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False, **kwargs)


MARKER_STYLE = {"resume": ("tab:red", "--"), "restart": ("tab:purple", ":")}


FLAT_REL = 1e-6  # a panel whose span is below this fraction of its magnitude is drawn as constant


def _mark(axes: list[Any], points: list[Marker]) -> None:
    """Vertical lines at each marker's frames on every axis; one horizontal label per marker on the
    first axis, its height stepped so that neighbouring labels do not overlap."""
    for i, marker in enumerate(points):
        color, style = MARKER_STYLE[marker.kind]
        for frame in marker.frames:
            for ax in axes:
                ax.axvline(frame, color=color, linestyle=style, linewidth=1)
        axes[0].annotate(marker.label, (marker.frames[0], 0.97 - 0.09 * (i % 3)),
                         xycoords=("data", "axes fraction"), xytext=(2, 0), textcoords="offset points",
                         fontsize=7, va="top", ha="left", color=color,
                         bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.7})


def log_ticks(lo: float, hi: float, most: int = 6) -> list[float]:
    """Tick values of a log axis from ``lo`` to ``hi`` (both > 0), only those inside: 1, 2 and 5 x 10^k when 2 to
    ``most`` of them fall inside; more: powers of ten (every k-th decade past ``most``); fewer (a range under a
    decade): 1, 1.5, 2, 3, 4, 5 and 7 x 10^k."""
    if not (0 < lo < hi) or not math.isfinite(hi):
        return []
    decades = range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1)

    def inside(subs: tuple[float, ...]) -> list[float]:
        return [m * 10.0 ** e for e in decades for m in subs if lo <= m * 10.0 ** e <= hi]

    ticks = inside((1.0, 2.0, 5.0))
    if len(ticks) > most:
        ticks = inside((1.0,))
    elif len(ticks) < 2:
        ticks = inside((1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 7.0))
    return ticks[::max(1, math.ceil(len(ticks) / most))]


def log_locator() -> Any:
    """A matplotlib tick locator placing ``log_ticks`` at the axis' view limits (matplotlib imported on use)."""
    from matplotlib.ticker import Locator

    class LogTicks(Locator):
        """Ticks at ``log_ticks`` of the axis' view interval."""

        def __call__(self) -> list[float]:
            lo, hi = sorted(self.axis.get_view_interval())
            return self.tick_values(lo, hi)

        def tick_values(self, vmin: float, vmax: float) -> list[float]:
            """``log_ticks(vmin, vmax)``."""
            return log_ticks(vmin, vmax)

    return LogTicks()


def log_axis(axis: Any) -> None:
    """A readable log axis: ``log_ticks`` labelled ``2e-4``, no minor labels (matplotlib's default labels every minor
    tick of a range under a decade, and they overprint)."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    axis.set_major_locator(log_locator())
    axis.set_major_formatter(FuncFormatter(lambda v, _: log_label(v)))
    axis.set_minor_formatter(NullFormatter())


def log_label(v: float) -> str:
    """``2e-4`` for 0.0002, ``1`` for 1, ``5e+3`` for 5000 (one significant digit: the log axis' tick values)."""
    if v <= 0 or not math.isfinite(v):
        return ""
    e = math.floor(math.log10(v) + 1e-9)
    m = v / 10 ** e
    if -2 <= e <= 2:
        return f"{v:g}"
    return f"{m:.2g}e{e:+d}" if e > 0 else f"{m:.2g}e{e}"





def png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def flat_ylim(values: pd.Series) -> tuple[float, float] | None:
    """Y-limits for a panel whose values are constant up to float noise, else None (autoscale).

    Returns:
        ``(v - |v|/2, v + |v|/2)`` around the mean ``v`` (``(-1, 1)`` for 0), so e.g. a constant lr is
        drawn as a flat line at its value instead of being scaled to its rounding noise.
    """
    finite = values[np.isfinite(values.astype(float))].astype(float)
    if finite.empty:
        return None
    lo, hi = float(finite.min()), float(finite.max())
    if hi - lo > FLAT_REL * max(abs(lo), abs(hi)):
        return None
    v = float(finite.mean())
    return (v - abs(v) / 2, v + abs(v) / 2) if v != 0 else (-1.0, 1.0)


def session_figure(df: pd.DataFrame, points: list[Marker], title: str) -> Any:
    """Figure of a session: total_reward and total_reward_ma, loss, lr, explore_var, entropy vs frame.

    Panels whose column is all NaN (e.g. explore_var of PPO) are left out; a constant panel gets
    ``flat_ylim``.

    Returns:
        The matplotlib Figure (axes top to bottom: return, then each panel).
    """
    panels = [c for c in ("loss", "lr", "explore_var", "entropy") if c in df and df[c].notna().any()]
    fig, axes = figure(1 + len(panels), width=9.0)
    axes[0].plot(df["frame"], df["total_reward"], color="tab:blue", alpha=0.35, linewidth=1,
                 label="total_reward")
    axes[0].plot(df["frame"], df["total_reward_ma"], color="tab:blue", linewidth=2, label="total_reward_ma")
    axes[0].set_ylabel("return")
    legend_outside(axes[0])
    for ax, col in zip(axes[1:], panels):
        ax.plot(df["frame"], df[col], color="tab:green", linewidth=1.2)
        ax.set_ylabel(col)
        ylim = flat_ylim(df[col])
        if ylim is not None:
            ax.set_ylim(*ylim)
            ax.ticklabel_format(axis="y", useOffset=False)
    axes[-1].set_xlabel("frame")
    axes[0].set_title(title)
    _mark(axes, points)
    return fig


def plot_session(df: pd.DataFrame, points: list[Marker], title: str) -> bytes:
    """PNG bytes of ``session_figure``."""
    return png(session_figure(df, points, title))


def coincide(stacked: pd.DataFrame, band: pd.DataFrame) -> bool:
    """Whether the mean and the IQM across sessions are one curve: below 4 sessions the IQM is the mean
    (``stats.iqm``), and with more they may still be equal at every frame (e.g. identical sessions)."""
    if stacked.shape[1] < 4:
        return True
    mean = stacked.loc[band.index].mean(axis=1)
    return bool(np.allclose(mean.to_numpy(), band["iqm"].to_numpy(), rtol=1e-9, atol=1e-12))


def trial_figure(dfs: dict[int, pd.DataFrame], points: list[Marker], title: str,
                 rand_return: float | None = None, threshold: float | None = None) -> Any:
    """Figure of a trial: mean total_reward_ma across sessions vs frame with a +-1 std band (ddof=1) and the
    IQM with its 95% bootstrap CI (four sessions or more); where the two coincide (``coincide``: below 4 sessions
    always) one line, the mean, with the IQM's 95% bootstrap CI as its band and one legend entry; one session is its
    own curve, with no band. The random-policy return (gray) and the env's reward threshold (black) are dotted lines
    when given; the legend is outside the plot area.

    Returns:
        The matplotlib Figure (one axis).
    """
    stacked = stack_sessions(dfs)
    mean, std = stacked.mean(axis=1), stacked.std(axis=1).fillna(0.0)
    fig, (ax,) = figure(1, width=9.0)
    band = iqm_band(stacked) if len(dfs) > 1 else None
    if band is None:
        ax.plot(mean.index, mean, color="tab:blue", linewidth=2, label="total_reward_ma (1 session)")
    elif coincide(stacked, band):
        ax.fill_between(band.index, band["low"], band["high"], color="tab:blue", alpha=0.2, linewidth=0)
        ax.plot(mean.index, mean, color="tab:blue", linewidth=2,
                label=f"mean = IQM of {len(dfs)} sessions,\nband: 95% bootstrap CI")
    else:
        ax.fill_between(mean.index, mean - std, mean + std, color="tab:blue", alpha=0.2, linewidth=0,
                        label="+-1 std across sessions")
        ax.plot(mean.index, mean, color="tab:blue", linewidth=2, label=f"mean total_reward_ma ({len(dfs)} sessions)")
        ax.fill_between(band.index, band["low"], band["high"], color="tab:orange", alpha=0.2, linewidth=0,
                        label="95% bootstrap CI of the IQM")
        ax.plot(band.index, band["iqm"], color="tab:orange", linewidth=1.5, linestyle="--",
                label="IQM across sessions")
    if rand_return is not None:
        ax.axhline(rand_return, color="gray", linestyle=":", linewidth=1, label="random policy")
    if threshold is not None:
        ax.axhline(threshold, color="black", linestyle=":", linewidth=1, label=f"reward_threshold {threshold:g}")
    ax.set_xlabel("frame")
    ax.set_ylabel("return (moving average)")
    ax.set_title(title)
    legend_outside(ax)
    _mark([ax], points)
    return fig


def stack_sessions(dfs: dict[int, pd.DataFrame], column: str = "total_reward_ma") -> pd.DataFrame:
    """One column per session of ``column``, indexed by frame (NaN where a session has no value)."""
    return pd.concat([df.set_index("frame")[column].rename(s) for s, df in dfs.items()], axis=1)


def iqm_band(stacked: pd.DataFrame) -> pd.DataFrame:
    """Per frame the IQM across sessions and its 95% stratified-bootstrap CI (``orchestrator.report.stats``),
    at the frames where every session has a value.

    Returns:
        DataFrame indexed by frame with columns ``iqm``, ``low``, ``high`` (empty if no such frame).
    """
    from orchestrator.report import stats

    full = stacked.dropna()
    if full.empty:
        return pd.DataFrame(columns=["iqm", "low", "high"], dtype=float)
    mid, low, high = stats.curve_band(full.to_numpy())
    return pd.DataFrame({"iqm": mid, "low": low, "high": high}, index=full.index)


def plot_trial(dfs: dict[int, pd.DataFrame], points: list[Marker], title: str,
               rand_return: float | None = None, threshold: float | None = None) -> bytes:
    """PNG bytes of ``trial_figure``."""
    return png(trial_figure(dfs, points, title, rand_return, threshold))


