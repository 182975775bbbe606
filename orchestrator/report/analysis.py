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

Outputs (all through ``orchestrator.store.storage``):
``t{T}/s{S}/session_metrics.json`` next to ``train_df.parquet``; ``info/t{T}_trial_metrics.json``
next to ``trial_df.parquet``; ``graph/{spec_name}_t{T}_s{S}_session_graph.png`` (return and its
moving average, loss, lr, explore_var, entropy vs frames) and ``graph/{spec_name}_t{T}_trial_graph.png``
(mean ``total_reward_ma`` across sessions with a +-1 std band and the IQM with its CI, or one line and band where
they coincide: ``graphs.trial_figure``). Each resume (run.json ``resumes``
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

import sys
from typing import Any

import numpy as np
import pandas as pd

from orchestrator.errors import UsageError
from orchestrator.report.graphs import markers, plot_session, plot_trial
from orchestrator.report.metrics import (
    TRIAL_METRICS,
    default_cache_dir,
    json_safe,
    run_baseline,
    session_metrics,
    trial_metrics,
)
from orchestrator.report.rundata import committed_df, no_episode_note, reward_threshold, session_keys
from orchestrator.store import predir as predir_mod
from orchestrator.store import storage


def analyze_predir(predir: str, cache_dir: str | None = None, trials: list[int] | None = None) -> dict[str, Any]:
    """Compute and write every session's and trial's metrics and graphs of a run (see module docstring).

    Sessions without any log row with a return get the graph of what they logged (losses, lr, entropy, ...) and
    no metrics; they are listed in ``no_episode`` with their last logged frame. The resume and
    restart marks of trial T come from ``t{T}/run.json`` when it exists (a search trial's own
    record), else from the predir's ``run.json``.

    Args:
        predir: run directory URI.
        cache_dir: random-baseline cache root (default ``default_cache_dir()``).
        trials: analyze only these trials (default: all); other trials' files are not touched.

    Returns:
        ``{"sessions": {"t0_s0": metrics}, "trials": {"t0": metrics}, "graphs": [uri, ...],
        "no_episode": {"t0_s1": frame}}``; a
        session's and a trial's metrics include ``total_reward_ma``, the final moving average (a
        trial's: the mean over its sessions).

    Raises:
        UsageError: ``predir`` is not a run directory.
    """
    spec = _run_spec(predir)
    rand = run_baseline(predir, spec["env"], cache_dir or default_cache_dir())["mean"]
    out: dict[str, Any] = {"sessions": {}, "trials": {}, "graphs": [], "no_episode": {}}
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
    from orchestrator.report import compare

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
    threshold = reward_threshold(spec["env"]["name"])
    storage.write_bytes(stem + ".png", plot_trial(dfs, points, title, rand, threshold))
    compare.write_html(stem + ".html", compare.trial_traces(dfs, title, rand, points, threshold), title,
                       js_dir=storage.join(storage.dirname(storage.absolute(predir)), compare.ASSETS_DIR))
    out["graphs"] += [stem + ".png", stem + ".html"]
    storage.write_json(storage.join(predir, "info", f"t{t}_trial_metrics.json"), record)
    out["trials"][f"t{t}"] = record


ROBUST_METRICS = ("strength", "final_strength", "final_return_ma")


def across_sessions(sessions: dict[int, SessionResult], finals: list[float | None]) -> dict[str, Any]:
    """Per metric, its mean, std (ddof 1), interquartile mean and stratified-bootstrap 95% CI over the
    sessions (``orchestrator.report.stats.summary``): the final ``total_reward_ma`` and ``ROBUST_METRICS``."""
    from orchestrator.report import stats

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
    if df is None or df.empty:
        return None
    key = f"t{t}_s{s}"
    graph = storage.join(predir, "graph", f"{name}_{key}_session_graph.png")
    if df["total_reward"].notna().sum() == 0:  # no episode ended yet: the graph of what was logged, no metrics
        storage.write_bytes(graph, plot_session(df, markers(run, [key]), f"{name} {key}"))
        out["graphs"].append(graph)
        out["no_episode"][key] = int(df["frame"].iloc[-1])
        return None
    scalar, local = session_metrics(df, rand)
    record = {"train": json_safe(scalar), "random_baseline": rand, "frame": int(df["frame"].iloc[-1]),
              "total_reward_ma": _final_ma(df)}
    eval_df = committed_df(sdir, "eval_df.parquet")
    if eval_df is not None and eval_df["total_reward"].notna().any():
        record["eval"] = json_safe(session_metrics(eval_df, rand)[0])
    storage.write_json(storage.join(sdir, "session_metrics.json"), record)
    out["sessions"][key] = record
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
        from orchestrator.commandline import entry_command
        print(f"warning: analysis of {predir} failed ({type(err).__name__}: {err}); "
              f"rerun with: {entry_command()} analyze {predir}", file=sys.stderr)
        return None


def summary_lines(predir: str, out: dict[str, Any]) -> list[str]:
    """A short end-of-run summary of ``analyze_predir``'s result: per session and trial the final
    ``total_reward_ma`` and ``strength``, the env's reward_threshold (when gymnasium has one) and
    the random policy's return, and the graphs written.

    Returns:
        Lines to print, indented by two spaces: a session with no finished episode says so and why
        (``rundata.no_episode_note``); [] when no session logged anything.
    """
    env_spec = _run_spec(predir)["env"]
    lines = [f"  {key}: {no_episode_note(env_spec, frame)}" for key, frame in out.get("no_episode", {}).items()]
    if not out["sessions"]:
        return lines + [f"  graph: {uri}" for uri in out["graphs"]]
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
    env = env_spec["name"]
    threshold = reward_threshold(env)
    rand = next(iter(out["trials"].values()))["random_baseline"]
    lines.append(f"  {env}: reward_threshold={_fmt(threshold) if threshold is not None else 'none'}, "
                 f"random policy={_fmt(rand)} (strength = total_reward - random policy)")
    lines += [f"  graph: {uri}" for uri in out["graphs"]]
    return lines


def analyze_command(predir: str) -> int:
    """``lab analyze PREDIR``: recompute, then print what the end-of-run summary prints (``summary_lines``:
    the final ``total_reward_ma`` per session and trial, the IQM across sessions, the reward threshold, the
    graphs) and a ``metrics`` line per trial and session with SLM-Lab's metrics under the names of
    ``METRIC_LABELS``; returns 0.

    Raises:
        UsageError: not a run directory.
    """
    predir = storage.absolute(predir.rstrip("/"))
    if not storage.is_dir(predir):
        raise UsageError(f"run directory '{predir}' does not exist")
    out = analyze_predir(predir)
    if not out["sessions"] and not out["no_episode"]:
        print(f"{predir}: no session has logged a row yet; nothing to analyze")
        return 0
    print(f"analysis: {predir}")
    print("\n".join(summary_lines(predir, out)))
    for key, record in {**out["trials"], **{k: v["train"] for k, v in out["sessions"].items()}}.items():
        values = " ".join(f"{METRIC_LABELS.get(m, m)}={_fmt(record.get(m))}" for m in TRIAL_METRICS if m in record)
        print(f"  {key} metrics: {values}")
    return 0


# metric names as printed: final_return_ma (its JSON key, kept) is not the total_reward_ma the summary shows
METRIC_LABELS = {"final_return_ma": "total_reward_mean_last_100_rows"}


def _fmt(value: Any) -> str:
    return "null" if value is None else f"{value:.4g}"
