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
(mean ``total_reward_ma`` across sessions with a +-1 std band). Resume points (run.json ``resumes``
``from_frames``) and actor restarts (``restarts`` ``frame_restored``) are marked with vertical lines
on one continuous curve. Data is read from each session's newest committed checkpoint (verified),
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
                            seed: int = 0) -> dict[str, Any]:
    """Mean/std of the return of a uniformly random policy over ``episodes`` episodes (seeded)."""
    import gymnasium as gym

    from envs.make import resolve_env_id

    env = gym.make(resolve_env_id(env_name), **({} if max_t is None else {"max_episode_steps": max_t}))
    env.action_space.seed(seed)
    returns = []
    try:
        for i in range(episodes):
            env.reset(seed=seed + i)
            total, done = 0.0, False
            while not done:
                _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
    finally:
        env.close()
    return {"env": env_name, "max_t": max_t, "episodes": episodes, "seed": seed, "version": BASELINE_VERSION,
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
    """(frame, "resume"|"restart") points of session ``key`` from run.json (frame 0 left out)."""
    out = [(int(r["from_frames"][key]), "resume") for r in run.get("resumes", [])
           if int(r.get("from_frames", {}).get(key) or 0) > 0]
    restarts = run.get("sessions", {}).get(key, {}).get("restarts", [])
    out += [(int(r["frame_restored"]), "restart") for r in restarts if int(r.get("frame_restored") or 0) > 0]
    return sorted(set(out))


# ---------------------------------------------------------------- graphs

def _figure(rows: int) -> tuple[Any, list[Any]]:
    """A matplotlib Figure on the Agg canvas (no pyplot global state) with ``rows`` stacked axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 2.0 + 1.8 * rows), dpi=80)
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, 1, sharex=True, squeeze=False)[:, 0]
    return fig, list(axes)


def _mark(axes: list[Any], points: list[tuple[int, str]]) -> None:
    """Vertical lines at resume (dashed) and restart (dotted) frames, labelled on the first axis."""
    for i, (frame, kind) in enumerate(points):
        for ax in axes:
            ax.axvline(frame, color="tab:red" if kind == "resume" else "tab:purple",
                       linestyle="--" if kind == "resume" else ":", linewidth=1)
        axes[0].annotate(kind, (frame, 1.0), xycoords=("data", "axes fraction"), fontsize=7, rotation=90,
                         va="top", ha="right", color="tab:red" if kind == "resume" else "tab:purple")


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def plot_session(df: pd.DataFrame, points: list[tuple[int, str]], title: str) -> bytes:
    """PNG of a session: total_reward and total_reward_ma, loss, lr, explore_var, entropy vs frame.

    Panels whose column is all NaN (e.g. explore_var of PPO) are left out.
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
    axes[-1].set_xlabel("frame")
    axes[0].set_title(title)
    _mark(axes, points)
    return _png(fig)


def plot_trial(dfs: dict[int, pd.DataFrame], points: list[tuple[int, str]], title: str,
               rand_return: float | None = None) -> bytes:
    """PNG of a trial: mean total_reward_ma across sessions vs frame with a +-1 std band (ddof=1),
    and the random-policy return as a dotted line when given."""
    stacked = pd.concat([df.set_index("frame")["total_reward_ma"].rename(s) for s, df in dfs.items()], axis=1)
    mean, std = stacked.mean(axis=1), stacked.std(axis=1).fillna(0.0)
    fig, (ax,) = _figure(1)
    ax.fill_between(mean.index, mean - std, mean + std, color="tab:blue", alpha=0.2, linewidth=0,
                    label="+-1 std across sessions")
    ax.plot(mean.index, mean, color="tab:blue", linewidth=2,
            label=f"mean total_reward_ma ({len(dfs)} sessions)")
    if rand_return is not None:
        ax.axhline(rand_return, color="gray", linestyle=":", linewidth=1, label="random policy")
    ax.set_xlabel("frame")
    ax.set_ylabel("return (moving average)")
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8)
    _mark([ax], points)
    return _png(fig)


# ---------------------------------------------------------------- whole runs

def analyze_predir(predir: str, cache_dir: str | None = None) -> dict[str, Any]:
    """Compute and write every session's and trial's metrics and graphs of a run (see module docstring).

    Sessions without any log row with a return are skipped (no metrics, no graph).

    Args:
        predir: run directory URI.
        cache_dir: random-baseline cache root (default ``default_cache_dir()``).

    Returns:
        ``{"sessions": {"t0_s0": metrics}, "trials": {"t0": metrics}, "graphs": [uri, ...]}``.

    Raises:
        UsageError: ``predir`` is not a run directory.
    """
    spec = _run_spec(predir)
    run_uri = storage.join(predir, "run.json")
    run = storage.read_json(run_uri) if storage.exists(run_uri) else {}
    rand = run_baseline(predir, spec["env"], cache_dir or default_cache_dir())["mean"]
    out: dict[str, Any] = {"sessions": {}, "trials": {}, "graphs": []}
    per_trial: dict[int, dict[int, SessionResult]] = {}
    for t, s in session_keys(predir):
        done = _analyze_session(predir, spec["name"], t, s, run, rand, out)
        if done is not None:
            per_trial.setdefault(t, {})[s] = done
    for t, sessions in per_trial.items():
        metrics = json_safe(trial_metrics([m for _, m in sessions.values()]))
        record = {**metrics, "sessions": len(sessions), "random_baseline": rand}
        storage.write_json(storage.join(predir, "info", f"t{t}_trial_metrics.json"), record)
        out["trials"][f"t{t}"] = record
        points = sorted({p for s in sessions for p in marks(run, f"t{t}_s{s}")})
        graph = storage.join(predir, "graph", f"{spec['name']}_t{t}_trial_graph.png")
        storage.write_bytes(graph, plot_trial({s: df for s, (df, _) in sessions.items()}, points,
                                              f"{spec['name']} t{t}", rand))
        out["graphs"].append(graph)
    return out


SessionResult = tuple[pd.DataFrame, tuple[dict[str, float], pd.DataFrame]]  # train_df, (scalars, local)


def _analyze_session(predir: str, name: str, t: int, s: int, run: dict[str, Any], rand: float,
                     out: dict[str, Any]) -> SessionResult | None:
    """Write one session's metrics JSON and graph (recorded in ``out``); None if it has no return yet."""
    sdir = predir_mod.session_dir(predir, t, s)
    df = committed_df(sdir, "train_df.parquet")
    if df is None or df["total_reward"].notna().sum() == 0:
        return None
    key = f"t{t}_s{s}"
    scalar, local = session_metrics(df, rand)
    record = {"train": json_safe(scalar), "random_baseline": rand, "frame": int(df["frame"].iloc[-1])}
    eval_df = committed_df(sdir, "eval_df.parquet")
    if eval_df is not None and eval_df["total_reward"].notna().any():
        record["eval"] = json_safe(session_metrics(eval_df, rand)[0])
    storage.write_json(storage.join(sdir, "session_metrics.json"), record)
    out["sessions"][key] = record
    graph = storage.join(predir, "graph", f"{name}_{key}_session_graph.png")
    storage.write_bytes(graph, plot_session(df, marks(run, key), f"{name} {key}"))
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


def analyze_after_run(predir: str) -> None:
    """End-of-trial analysis (train, train@): like ``analyze_predir``, but a failure only warns.

    Training data is committed by then; a plotting or baseline failure must not turn a finished run
    into a failed one, so it is reported with the command that redoes it.
    """
    try:
        analyze_predir(predir)
    except Exception as err:  # noqa: BLE001 - reported, and `lab analyze` redoes it
        print(f"warning: analysis of {predir} failed ({type(err).__name__}: {err}); "
              f"rerun with: lab analyze {predir}", file=sys.stderr)


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
