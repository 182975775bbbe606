"""The search's experiment report: one row per trial (its variables and metrics), the experiment graph and the printed
summary."""

from __future__ import annotations

import math
import sys
from typing import Any

from orchestrator.search.trials import METRIC, final_metrics, lab_trials
from orchestrator.spec.meta import MetaSpec, with_meta
from orchestrator.spec.pbt import is_pbt
from orchestrator.spec.search_space import parse_search
from orchestrator.store import predir as predir_mod
from orchestrator.store import storage
from orchestrator.store.predir import session_seed
from orchestrator.store.record import RunRecord
from orchestrator.trial import aggregate_trial


def experiment_df(predir: str, spec: dict[str, Any], slm_metrics: dict[str, dict[str, Any]]) -> Any:
    """One row per trial, best first (by ``strength``, then final ``total_reward_ma``).

    Args:
        slm_metrics: ``{"t{T}": trial metrics}`` of ``analysis.analyze_predir`` (SLM-Lab's
            ``strength``, ``sample_efficiency``, ``stability``, ``consistency``, ...).

    Returns:
        Columns ``trial``, the searched values (by dotted path), ``status`` (done, stopped by the
        scheduler, error, running), ``final_metrics`` and ``analysis.TRIAL_METRICS``.
    """
    import pandas as pd

    from orchestrator.report.metrics import TRIAL_METRICS

    rows = []
    for t, info in sorted(lab_trials(predir).items()):
        slm = slm_metrics.get(f"t{t}", {})
        slm = {k: math.nan if slm.get(k) is None else slm[k] for k in TRIAL_METRICS}
        rows.append({"trial": t, **info["values"], "status": info["status"], **final_metrics(predir, spec, t),
                     **slm})
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    return df.sort_values(["strength", METRIC], ascending=False, na_position="last").reset_index(drop=True)


def merge_run_records(predir: str, spec_name: str) -> None:
    """Write the predir's ``run.json`` from every trial's ``t{T}/run.json`` (sessions and resumes), so
    ``lab ls`` and the graphs' resume marks see a search like a train run. Only the driver writes it,
    after ``fit``; trials, which run concurrently, each write their own."""
    record = RunRecord.load_or_new(predir, spec_name)
    sessions, resumes = {}, []
    for t in sorted(lab_trials(predir)):
        uri = storage.join(predir, f"t{t}", "run.json")
        if storage.exists(uri):
            trial_record = RunRecord.load_or_new(storage.join(predir, f"t{t}"), spec_name).data
            sessions.update(trial_record.get("sessions", {}))
            resumes += trial_record.get("resumes", [])
    resumes.sort(key=lambda r: r["at"])
    record.data.update({"sessions": sessions, "resumes": resumes, "search": True})
    record.save()


def analyzed_trials(predir: str) -> dict[str, dict[str, Any]]:
    """Trial metrics of the trials that are over (``done`` or ``stopped``) and already analyzed.

    A done trial is analyzed when it ends (the driver's ``TrialAnalyzer``), a stopped one at the end of the
    search that stopped it; their files are not written again.

    Returns:
        ``{"t{T}": info/t{T}_trial_metrics.json}``.
    """
    out = {}
    for t, info in lab_trials(predir).items():
        uri = storage.join(predir, "info", f"t{t}_trial_metrics.json")
        if info["status"] in ("done", "stopped") and storage.exists(uri):
            out[f"t{t}"] = storage.read_json(uri)
    return out


def analyze(predir: str, spec: dict[str, Any], merge: bool = True) -> Any:
    """Write experiment_df, trial_df, the experiment graph and the best trial's spec; returns the df.

    Per-session and per-trial metrics and graphs come from ``analysis.analyze_predir``, for the
    trials not already analyzed (``analyzed_trials``); a failure there only warns: the
    experiment_df then lacks SLM-Lab metrics.
    """
    from orchestrator.report.analysis import analyze_predir
    from orchestrator.report.experiment_graph import experiment_png

    if merge:  # a PBT search keeps one run.json for its population (orchestrator.search.pbt)
        merge_run_records(predir, spec["name"])
    # a PBT population's trials end together and an exploit rewrites a trial's curve: every trial is analyzed again
    # (an interrupted search's analysis stopped at the interrupt frame)
    slm_metrics = {} if is_pbt(spec) else analyzed_trials(predir)
    todo = sorted(t for t in lab_trials(predir) if f"t{t}" not in slm_metrics)
    try:
        slm_metrics.update(analyze_predir(predir, trials=todo)["trials"] if todo else {})
    except Exception as err:  # noqa: BLE001 - reported; `lab analyze` redoes it
        print(f"warning: analysis of {predir} failed ({type(err).__name__}: {err})", file=sys.stderr)
    df = experiment_df(predir, spec, slm_metrics)
    if df.empty:
        return df
    name = spec["name"]
    storage.write_parquet(storage.join(predir, "info", "experiment_df.parquet"), df)
    aggregate_trial(predir, spec, sorted(df["trial"].tolist()))
    title = f"{name}: {len(df)} trials x {MetaSpec.of(spec).max_session} sessions"
    lineage = None
    if is_pbt(spec):  # a PBT search's values changed along the run: its graph shows the lineage instead
        from orchestrator.search.pbt import lineage_of
        lineage = lineage_of(predir, spec)
    graph = experiment_png(df, parse_search(spec)[0], title, lineage)
    storage.write_bytes(storage.join(predir, "graph", f"{name}_experiment_graph.png"), graph)
    best_t = int(df["trial"].iloc[0])
    best = storage.read_json(predir_mod.spec_file(predir, name, best_t))
    # seeds of `train` on this spec = the trial's session seeds (base + 1000 T + s)
    best = with_meta(best, drop=("trial",), random_seed=session_seed(MetaSpec.of(best).random_seed, best_t, 0))
    storage.write_json(storage.join(predir, f"{name}_best_spec.json"), {name: best})
    return df


def report_summary(predir: str, spec: dict[str, Any], df: Any, interrupted: bool = False) -> None:
    """Print the experiment table and how to reproduce the best trial (so far, when ``interrupted``): the best spec's
    ``train``, or for a PBT search that made decisions (``pbt.jsonl``) its ``train --pbt-replay`` command (a PBT
    trial's values change along its run: a spec trained from scratch does not reproduce it); no best trial when none
    logged a return."""
    if df.empty:
        print(f"search: no trial ran in {predir}")
        return
    from orchestrator.commandline import lab_command

    columns = ["trial", *[v.path for v in parse_search(spec)[0]], "status", "strength", METRIC, "frame"]
    table = df[columns].assign(trial=[f"t{t}" for t in df["trial"]])
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if not df[METRIC].notna().any():  # no trial logged a return (stopped before training, or no episode ended)
        print(f"search {'interrupted' if interrupted else 'done'}: {predir}\n  no trial has logged a return yet "
              f"({METRIC}): no best trial to name")
        return
    best_t = int(df["trial"].iloc[0])
    head = f"search {'interrupted' if interrupted else 'done'}: {predir}\n  best trial " \
           f"{'so far ' if interrupted else ''}t{best_t}"
    if is_pbt(spec) and storage.exists(storage.join(predir, "pbt.jsonl")):
        replay = lab_command(predir_mod.spec_file(predir, spec["name"]), spec["name"], "train", "--pbt-replay",
                             predir, "--trial", str(best_t))
        when = " once the search is finished" if interrupted else ""
        print(f"{head}; its values changed along the run (pbt.jsonl): replay its schedule from scratch{when} with:\n"
              f"  {replay}")
        return
    if is_pbt(spec):
        head += " (no PBT decision: env.max_frame is within the first perturbation_interval, so every trial " \
                "trained its initial values)"
    best = storage.join(predir, f"{spec['name']}_best_spec.json")
    print(f"{head}; run it with:\n  {lab_command(best, spec['name'], 'train')}")


