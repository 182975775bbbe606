"""Session and trial metrics (SLM-Lab's), graphs, and ``lab analyze`` (retro-analysis).

Metrics (SLM-Lab ``experiment/analysis.py``), from a train_df (or eval_df): per log row i the mean
return ``R_i`` is ``total_reward``, ``frame_i`` and ``opt_step_i`` its clock counters, and
``R_rand`` the mean return of a uniformly random policy on the env (``random_baseline``):

* local strength ``str_i = R_i - R_rand``; ``strength`` = mean of ``str_i``, ``max_strength`` = max,
  ``final_strength`` = last;
* ``sample_efficiency`` = sum_i(str_i / frame_i) / sum_i str_i (terms with frame 0 dropped): earlier
  strength weighs more; ``training_efficiency`` = the same with ``opt_step``;
* ``stability`` = 1 - |sum_i min(str_{i+1} - str_i, 0) / sum_{i<N} str_i| (penalises drops);
* ``final_return_ma`` = mean of the last 100 ``R_i``;
* trial: the mean of each session metric, plus ``consistency`` = 1 - 2 sum_i std_j(str_ij) /
  sum_i mean_j(str_ij) over sessions j, rows aligned by frame (std with ddof=1, as pandas; undefined,
  hence null, with one session).

Non-finite values (e.g. a zero denominator) are written as JSON null.

Outputs (all through ``orchestrator.storage``):
``t{T}/s{S}/session_metrics.json`` next to ``train_df.parquet``; ``info/t{T}_trial_metrics.json``
next to ``trial_df.parquet``; ``graph/{spec_name}_t{T}_s{S}_session_graph.png`` (return and its
moving average, loss, lr, explore_var, entropy vs frames) and ``graph/{spec_name}_t{T}_trial_graph.png``
(mean ``total_reward_ma`` across sessions with a +-1 std band). Each resume (run.json ``resumes``
``from_frames``) and actor restart (``restarts`` ``frame_restored``) is one marker on one continuous
curve: vertical lines at its frames and one horizontal label (``markers``). A panel that is
constant up to float noise (e.g. a fixed lr) gets y-limits around its value (``flat_ylim``).
Session and trial metrics also hold the final ``total_reward_ma``; ``summary_lines`` turns them
into the end-of-run summary. Data is read from each session's newest committed checkpoint (verified),
falling back to ``t{T}/s{S}/train_df.parquet`` (``dev`` runs have no checkpoints).

The random baseline is computed once per (env, max_t) per machine and cached as JSON under
``{cache_dir}/random_baseline/`` (default ``$XDG_CACHE_HOME/rl-trial-lab``, else
``~/.cache/rl-trial-lab``); each run records the baseline it used in ``info/random_baseline.json`` and
later analyses of that run (``lab analyze``, also of a copied run) reuse it, so its metrics stay
comparable. The cache is kept out of the data dir so that a data dir lists only runs.
"""

from __future__ import annotations

import io
import math
import os
import re
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from orchestrator import predir as predir_mod
from orchestrator import storage
from orchestrator.checkpoint import CheckpointError, CheckpointStore
from orchestrator.errors import UsageError

SESSION_METRICS = ("final_return_ma", "strength", "max_strength", "final_strength", "sample_efficiency",
                   "training_efficiency", "stability")
TRIAL_METRICS = (*SESSION_METRICS, "consistency")
FINAL_MA_ROWS = 100  # rows averaged into final_return_ma (SLM-Lab's PLOT_MA_WINDOW)
BASELINE_EPISODES = 100
# env steps after which the baseline stops starting episodes (the one under way finishes): 100 random
# episodes of VideoPinball take tens of minutes, which a 500-frame dev run would wait for
BASELINE_MAX_STEPS = 20_000
BASELINE_VERSION = 1  # bump when the baseline's definition changes (invalidates caches)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------- metrics

def calc_strength(returns: pd.Series, rand_return: float) -> tuple[float, pd.Series]:
    """Mean local strength and the local strengths ``R_i - R_rand`` (same index as ``returns``)."""
    local = returns.astype(float) - rand_return
    return float(local.mean()), local


def calc_efficiency(local_strs: pd.Series, ts: pd.Series) -> tuple[float, pd.Series]:
    """``sum(str_i / t_i) / sum(str_i)``; terms with ``t_i = 0`` (inf or NaN) are dropped from the numerator.

    Args:
        local_strs: local strengths (N,).
        ts: frames or opt steps of each row (N,).
    """
    local_effs = (local_strs / ts.astype(float).to_numpy()).replace([np.inf, -np.inf], np.nan).dropna()
    with np.errstate(divide="ignore", invalid="ignore"):
        eff = np.float64(local_effs.sum()) / np.float64(local_strs.sum())
    return float(eff), local_effs


def calc_stability(local_strs: pd.Series) -> tuple[float, pd.Series]:
    """``1 - |sum_i min(str_{i+1} - str_i, 0) / sum_{i<N} str_i|`` and its per-row terms (N-1,)."""
    drops = local_strs.diff().shift(-1).iloc[:-1].clip(upper=0.0)
    denoms = local_strs.iloc[:-1]
    with np.errstate(divide="ignore", invalid="ignore"):
        local_stas = 1 - (drops / denoms).abs()
        sta = 1 - abs(np.float64(drops.sum()) / np.float64(denoms.sum()))
    return float(sta), local_stas


def calc_consistency(local_strs_list: list[pd.Series]) -> tuple[float, pd.Series]:
    """``1 - 2 sum_i std_j(str_ij) / sum_i mean_j(str_ij)`` over sessions j (series aligned by index).

    Returns NaN with fewer than two sessions (a standard deviation needs two).
    """
    stacked = pd.concat(local_strs_list, axis=1)
    mean, std = stacked.mean(axis=1), stacked.std(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        local_cons = 1 - 2 * std / mean
        con = 1 - 2 * np.float64(std.sum()) / np.float64(mean.sum()) if len(local_strs_list) > 1 else math.nan
    return float(con), local_cons


def session_metrics(df: pd.DataFrame, rand_return: float) -> tuple[dict[str, float], pd.DataFrame]:
    """Scalar metrics of one session and its local series, from a train_df/eval_df.

    Args:
        df: rows with ``frame``, ``opt_step``, ``total_reward`` (rows without a return are dropped).
        rand_return: mean return of the random policy on the env.

    Returns:
        ({metric: value} for ``SESSION_METRICS``, DataFrame indexed by frame with ``strength``).

    Raises:
        ValueError: no row has a return.
    """
    df = df.dropna(subset=["total_reward"]).reset_index(drop=True)
    if df.empty:
        raise ValueError("no log row has a total_reward (no episode finished)")
    returns = df["total_reward"].astype(float)
    strength, local_strs = calc_strength(returns, rand_return)
    sample_eff, _ = calc_efficiency(local_strs, df["frame"])
    train_eff, _ = calc_efficiency(local_strs, df["opt_step"])
    stability, _ = calc_stability(local_strs)
    scalar = {"final_return_ma": float(returns.iloc[-FINAL_MA_ROWS:].mean()), "strength": strength,
              "max_strength": float(local_strs.max()), "final_strength": float(local_strs.iloc[-1]),
              "sample_efficiency": sample_eff, "training_efficiency": train_eff, "stability": stability}
    local = pd.DataFrame({"strength": local_strs.to_numpy()}, index=df["frame"].to_numpy())
    return scalar, local


def trial_metrics(sessions: list[tuple[dict[str, float], pd.DataFrame]]) -> dict[str, float]:
    """Mean of the session scalars plus ``consistency`` (sessions' local strengths aligned by frame)."""
    scalars = pd.DataFrame([s for s, _ in sessions])
    out = {k: float(scalars[k].mean()) for k in SESSION_METRICS}
    out["consistency"] = calc_consistency([local["strength"] for _, local in sessions])[0]
    return out


def json_safe(metrics: dict[str, Any]) -> dict[str, Any]:
    """Replace non-finite floats with None (strict JSON)."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}


# ---------------------------------------------------------------- random baseline

def compute_random_baseline(env_name: str, max_t: int | None, episodes: int = BASELINE_EPISODES,
                            seed: int = 0, max_steps: int = BASELINE_MAX_STEPS) -> dict[str, Any]:
    """Mean/std of the return of a uniformly random policy over ``episodes`` seeded episodes, or fewer
    where they pass ``max_steps`` env steps: no episode starts after that (at least one runs; the
    ``episodes`` field of the result counts those that ran). SLM-Lab reads the same baseline (100
    episodes) from its precomputed ``spec/_random_baseline.json``."""
    import gymnasium as gym

    from envs.make import resolve_env_id

    env = gym.make(resolve_env_id(env_name), **({} if max_t is None else {"max_episode_steps": max_t}))
    env.action_space.seed(seed)
    returns, steps = [], 0
    try:
        for i in range(episodes):
            if returns and steps >= max_steps:
                break
            env.reset(seed=seed + i)
            total, done = 0.0, False
            while not done:
                _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
                total += float(reward)
                steps += 1
                done = terminated or truncated
            returns.append(total)
    finally:
        env.close()
    return {"env": env_name, "max_t": max_t, "episodes": len(returns), "seed": seed, "version": BASELINE_VERSION,
            "mean": float(np.mean(returns)), "std": float(np.std(returns))}


def default_cache_dir() -> str:
    """``$XDG_CACHE_HOME/rl-trial-lab``, else ``~/.cache/rl-trial-lab``."""
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "rl-trial-lab")


def random_baseline(env_name: str, max_t: int | None, cache_dir: str) -> dict[str, Any]:
    """Random-policy baseline of an env: read from ``{cache_dir}/random_baseline/``, else computed
    and cached there."""
    key = re.sub(r"[^A-Za-z0-9_.-]", "_", env_name) + ("" if max_t is None else f"_max_t{max_t}")
    uri = storage.join(cache_dir, "random_baseline", f"{key}.json")
    if storage.exists(uri):
        cached = storage.read_json(uri)
        if cached.get("version") == BASELINE_VERSION:
            return cached
    baseline = compute_random_baseline(env_name, max_t)
    storage.write_json(uri, baseline)
    return baseline


def run_baseline(predir: str, env: dict[str, Any], cache_dir: str) -> dict[str, Any]:
    """The baseline a run recorded (``info/random_baseline.json``, same env), else the cached one,
    which is then recorded in the run."""
    uri = storage.join(predir, "info", "random_baseline.json")
    if storage.exists(uri):
        recorded = storage.read_json(uri)
        if (recorded.get("env"), recorded.get("max_t")) == (env["name"], env.get("max_t")):
            return recorded
    baseline = random_baseline(env["name"], env.get("max_t"), cache_dir)
    storage.write_json(uri, baseline)
    return baseline


# ---------------------------------------------------------------- reading a run

def session_keys(predir: str) -> list[tuple[int, int]]:
    """(trial, session) of every ``t{T}/s{S}`` directory of a run, sorted."""
    keys = []
    for t_name in storage.listdir(predir):
        if re.fullmatch(r"t\d+", t_name):
            for s_name in storage.listdir(storage.join(predir, t_name)):
                if re.fullmatch(r"s\d+", s_name):
                    keys.append((int(t_name[1:]), int(s_name[1:])))
    return sorted(keys)


def committed_df(session_dir: str, name: str) -> pd.DataFrame | None:
    """``name`` (``train_df.parquet``/``eval_df.parquet``) of the newest checkpoint that verifies, else
    the session directory's copy, else None. Read-only: nothing is moved."""
    store = CheckpointStore(session_dir)
    for frame in store.ranked("latest"):
        try:
            return pd.read_parquet(io.BytesIO(store.read_file(frame, name)))
        except CheckpointError:
            continue
    uri = storage.join(session_dir, name)
    return storage.read_parquet(uri) if storage.exists(uri) else None


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


# ---------------------------------------------------------------- graphs

def _figure(rows: int) -> tuple[Any, list[Any]]:
    """A matplotlib Figure on the Agg canvas (no pyplot global state) with ``rows`` stacked axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 2.0 + 1.8 * rows), dpi=80)
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, 1, sharex=True, squeeze=False)[:, 0]
    return fig, list(axes)


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


def _png(fig: Any) -> bytes:
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
    fig, axes = _figure(1 + len(panels))
    axes[0].plot(df["frame"], df["total_reward"], color="tab:blue", alpha=0.35, linewidth=1,
                 label="total_reward")
    axes[0].plot(df["frame"], df["total_reward_ma"], color="tab:blue", linewidth=2, label="total_reward_ma")
    axes[0].set_ylabel("return")
    axes[0].legend(loc="lower right", fontsize=8)
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
    return _png(session_figure(df, points, title))


def trial_figure(dfs: dict[int, pd.DataFrame], points: list[Marker], title: str,
                 rand_return: float | None = None) -> Any:
    """Figure of a trial: mean total_reward_ma across sessions vs frame with a +-1 std band (ddof=1),
    and the random-policy return as a dotted line when given.

    Returns:
        The matplotlib Figure (one axis).
    """
    stacked = stack_sessions(dfs)
    mean, std = stacked.mean(axis=1), stacked.std(axis=1).fillna(0.0)
    fig, (ax,) = _figure(1)
    ax.fill_between(mean.index, mean - std, mean + std, color="tab:blue", alpha=0.2, linewidth=0,
                    label="+-1 std across sessions")
    ax.plot(mean.index, mean, color="tab:blue", linewidth=2,
            label=f"mean total_reward_ma ({len(dfs)} sessions)")
    if len(dfs) > 1:
        band = iqm_band(stacked)
        ax.fill_between(band.index, band["low"], band["high"], color="tab:orange", alpha=0.2, linewidth=0,
                        label="95% bootstrap CI of the IQM")
        ax.plot(band.index, band["iqm"], color="tab:orange", linewidth=1.5, linestyle="--",
                label="IQM across sessions")
    if rand_return is not None:
        ax.axhline(rand_return, color="gray", linestyle=":", linewidth=1, label="random policy")
    ax.set_xlabel("frame")
    ax.set_ylabel("return (moving average)")
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8)
    _mark([ax], points)
    return fig


def stack_sessions(dfs: dict[int, pd.DataFrame], column: str = "total_reward_ma") -> pd.DataFrame:
    """One column per session of ``column``, indexed by frame (NaN where a session has no value)."""
    return pd.concat([df.set_index("frame")[column].rename(s) for s, df in dfs.items()], axis=1)


def iqm_band(stacked: pd.DataFrame) -> pd.DataFrame:
    """Per frame the IQM across sessions and its 95% stratified-bootstrap CI (``orchestrator.stats``),
    at the frames where every session has a value.

    Returns:
        DataFrame indexed by frame with columns ``iqm``, ``low``, ``high`` (empty if no such frame).
    """
    from orchestrator import stats

    full = stacked.dropna()
    if full.empty:
        return pd.DataFrame(columns=["iqm", "low", "high"], dtype=float)
    mid, low, high = stats.curve_band(full.to_numpy())
    return pd.DataFrame({"iqm": mid, "low": low, "high": high}, index=full.index)


def plot_trial(dfs: dict[int, pd.DataFrame], points: list[Marker], title: str,
               rand_return: float | None = None) -> bytes:
    """PNG bytes of ``trial_figure``."""
    return _png(trial_figure(dfs, points, title, rand_return))


# ---------------------------------------------------------------- whole runs

def analyze_predir(predir: str, cache_dir: str | None = None, trials: list[int] | None = None) -> dict[str, Any]:
    """Compute and write every session's and trial's metrics and graphs of a run (see module docstring).

    Sessions without any log row with a return are skipped (no metrics, no graph). The resume and
    restart marks of trial T come from ``t{T}/run.json`` when it exists (a search trial's own
    record), else from the predir's ``run.json``.

    Args:
        predir: run directory URI.
        cache_dir: random-baseline cache root (default ``default_cache_dir()``).
        trials: analyze only these trials (default: all); other trials' files are not touched.

    Returns:
        ``{"sessions": {"t0_s0": metrics}, "trials": {"t0": metrics}, "graphs": [uri, ...]}``; a
        session's and a trial's metrics include ``total_reward_ma``, the final moving average (a
        trial's: the mean over its sessions).

    Raises:
        UsageError: ``predir`` is not a run directory.
    """
    spec = _run_spec(predir)
    rand = run_baseline(predir, spec["env"], cache_dir or default_cache_dir())["mean"]
    out: dict[str, Any] = {"sessions": {}, "trials": {}, "graphs": []}
    per_trial: dict[int, dict[int, SessionResult]] = {}
    runs: dict[int, dict[str, Any]] = {}
    for t, s in session_keys(predir):
        if trials is not None and t not in trials:
            continue
        run = runs.setdefault(t, _run_record(predir, t))
        done = _analyze_session(predir, spec["name"], t, s, run, rand, out)
        if done is not None:
            per_trial.setdefault(t, {})[s] = done
    for t, sessions in per_trial.items():
        _analyze_trial(predir, spec, t, sessions, runs[t], rand, out)
    return out


def _analyze_trial(predir: str, spec: dict[str, Any], t: int, sessions: dict[int, SessionResult],
                   run: dict[str, Any], rand: float, out: dict[str, Any]) -> None:
    """Write one trial's PNG and HTML graphs, then its metrics JSON (with ``across_sessions``; recorded in ``out``).

    The metrics JSON comes last: a search takes a trial with it as analyzed (``search.analyzed_trials``), so an
    analysis cut short (a killed driver) is done again in full by ``search@``.
    """
    from orchestrator import compare

    metrics = json_safe(trial_metrics([m for _, m in sessions.values()]))
    finals = [out["sessions"][f"t{t}_s{s}"]["total_reward_ma"] for s in sessions]
    record = {**metrics, "total_reward_ma": float(np.mean([f for f in finals if f is not None]))
              if any(f is not None for f in finals) else None,
              "sessions": len(sessions), "random_baseline": rand,
              "across_sessions": across_sessions(sessions, finals)}
    points = markers(run, [f"t{t}_s{s}" for s in sessions])
    dfs = {s: df for s, (df, _) in sessions.items()}
    stem = storage.join(predir, "graph", f"{spec['name']}_t{t}_trial_graph")
    title = f"{spec['name']} t{t}"
    storage.write_bytes(stem + ".png", plot_trial(dfs, points, title, rand))
    compare.write_html(stem + ".html", compare.trial_traces(dfs, title, rand, points), title)
    out["graphs"] += [stem + ".png", stem + ".html"]
    storage.write_json(storage.join(predir, "info", f"t{t}_trial_metrics.json"), record)
    out["trials"][f"t{t}"] = record


ROBUST_METRICS = ("strength", "final_strength", "final_return_ma")


def across_sessions(sessions: dict[int, SessionResult], finals: list[float | None]) -> dict[str, Any]:
    """Per metric, its mean, std (ddof 1), interquartile mean and stratified-bootstrap 95% CI over the
    sessions (``orchestrator.stats.summary``): the final ``total_reward_ma`` and ``ROBUST_METRICS``."""
    from orchestrator import stats

    out = {"total_reward_ma": stats.summary(finals)}
    for metric in ROBUST_METRICS:
        out[metric] = stats.summary([scalar[metric] for _, (scalar, _) in sessions.values()])
    return out


def _run_record(predir: str, t: int) -> dict[str, Any]:
    """``t{T}/run.json`` if it exists, else the predir's ``run.json``, else {}."""
    for uri in (storage.join(predir, f"t{t}", "run.json"), storage.join(predir, "run.json")):
        record = storage.read_json_or_none(uri, "graphs without resume marks (train@ rebuilds it)")
        if isinstance(record, dict):
            return record
    return {}


SessionResult = tuple[pd.DataFrame, tuple[dict[str, float], pd.DataFrame]]  # train_df, (scalars, local)


def _final_ma(df: pd.DataFrame) -> float | None:
    """The last non-NaN ``total_reward_ma`` of a train_df, or None."""
    values = df["total_reward_ma"].dropna()
    return float(values.iloc[-1]) if len(values) else None


def _analyze_session(predir: str, name: str, t: int, s: int, run: dict[str, Any], rand: float,
                     out: dict[str, Any]) -> SessionResult | None:
    """Write one session's metrics JSON and graph (recorded in ``out``); None if it has no return yet."""
    sdir = predir_mod.session_dir(predir, t, s)
    df = committed_df(sdir, "train_df.parquet")
    if df is None or df["total_reward"].notna().sum() == 0:
        return None
    key = f"t{t}_s{s}"
    scalar, local = session_metrics(df, rand)
    record = {"train": json_safe(scalar), "random_baseline": rand, "frame": int(df["frame"].iloc[-1]),
              "total_reward_ma": _final_ma(df)}
    eval_df = committed_df(sdir, "eval_df.parquet")
    if eval_df is not None and eval_df["total_reward"].notna().any():
        record["eval"] = json_safe(session_metrics(eval_df, rand)[0])
    storage.write_json(storage.join(sdir, "session_metrics.json"), record)
    out["sessions"][key] = record
    graph = storage.join(predir, "graph", f"{name}_{key}_session_graph.png")
    storage.write_bytes(graph, plot_session(df, markers(run, [key]), f"{name} {key}"))
    out["graphs"].append(graph)
    return df, (scalar, local)


def _run_spec(predir: str) -> dict[str, Any]:
    """The run's spec as saved (``{spec_name}_spec.json``).

    Raises:
        UsageError: not a run directory (no such directory or no spec file).
    """
    try:
        name = predir_mod.spec_name_of(predir)
    except ValueError as err:
        raise UsageError(str(err)) from None
    uri = predir_mod.spec_file(predir, name)
    if not storage.exists(uri):
        raise UsageError(f"'{predir}' is not a run directory: it has no {storage.basename(uri)}")
    return storage.read_json(uri)


def analyze_after_run(predir: str, trials: list[int] | None = None) -> dict[str, Any] | None:
    """End-of-trial analysis (dev, train, train@, each search trial): ``analyze_predir``, but a
    failure only warns.

    Training data is committed by then; a plotting or baseline failure must not turn a finished run
    into a failed one, so it is reported with the command that redoes it.

    Returns:
        What ``analyze_predir`` returns, or None when it failed (the warning is on stderr).
    """
    try:
        return analyze_predir(predir, trials=trials)
    except Exception as err:  # noqa: BLE001 - reported, and `lab analyze` redoes it
        from orchestrator.cli import entry_command
        print(f"warning: analysis of {predir} failed ({type(err).__name__}: {err}); "
              f"rerun with: {entry_command()} analyze {predir}", file=sys.stderr)
        return None


def reward_threshold(env_name: str) -> float | None:
    """The env's ``reward_threshold`` in gymnasium's registry (the return at which it counts as
    solved), or None when the registry has none (or does not know the env)."""
    import gymnasium as gym

    from envs.make import resolve_env_id

    try:
        threshold = gym.spec(resolve_env_id(env_name)).reward_threshold
    except Exception:  # noqa: BLE001 - an env outside the registry simply has no threshold
        return None
    return None if threshold is None else float(threshold)


def summary_lines(predir: str, out: dict[str, Any]) -> list[str]:
    """A short end-of-run summary of ``analyze_predir``'s result: per session and trial the final
    ``total_reward_ma`` and ``strength``, the env's reward_threshold (when gymnasium has one) and
    the random policy's return, and the graphs written.

    Returns:
        Lines to print, indented by two spaces ([] when no session has a logged return).
    """
    if not out["sessions"]:
        return []
    lines = []
    for key, record in out["sessions"].items():
        lines.append(f"  {key}: frame={record['frame']} total_reward_ma={_fmt(record.get('total_reward_ma'))} "
                     f"strength={_fmt(record['train'].get('strength'))}")
    for key, record in out["trials"].items():
        lines.append(f"  {key} (mean of {record['sessions']} session(s)): "
                     f"total_reward_ma={_fmt(record.get('total_reward_ma'))} "
                     f"strength={_fmt(record.get('strength'))} consistency={_fmt(record.get('consistency'))}")
        robust = record.get("across_sessions", {}).get("total_reward_ma", {})
        if robust.get("n", 0) > 1:
            lines.append(f"  {key} across sessions: total_reward_ma IQM={_fmt(robust['iqm'])} "
                         f"95% CI [{_fmt(robust['ci'][0])}, {_fmt(robust['ci'][1])}] "
                         f"mean={_fmt(robust['mean'])} std={_fmt(robust['std'])}")
    env = _run_spec(predir)["env"]["name"]
    threshold = reward_threshold(env)
    rand = next(iter(out["trials"].values()))["random_baseline"]
    lines.append(f"  {env}: reward_threshold={_fmt(threshold) if threshold is not None else 'none'}, "
                 f"random policy={_fmt(rand)} (strength = total_reward - random policy)")
    lines += [f"  graph: {uri}" for uri in out["graphs"]]
    return lines


def analyze_command(predir: str) -> int:
    """``lab analyze PREDIR``: recompute, print the metrics and the graphs written; returns 0.

    Raises:
        UsageError: not a run directory.
    """
    predir = storage.absolute(predir.rstrip("/"))
    if not storage.is_dir(predir):
        raise UsageError(f"run directory '{predir}' does not exist")
    out = analyze_predir(predir)
    if not out["sessions"]:
        print(f"{predir}: no session has a logged return yet; nothing to analyze")
        return 0
    for key, record in {**out["trials"], **{k: v["train"] for k, v in out["sessions"].items()}}.items():
        values = " ".join(f"{m}={_fmt(record.get(m))}" for m in TRIAL_METRICS if m in record)
        print(f"{key}: {values}")
    for uri in out["graphs"]:
        print(f"graph: {uri}")
    return 0


def _fmt(value: Any) -> str:
    return "null" if value is None else f"{value:.4g}"
