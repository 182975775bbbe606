"""One search trial: its spec files and session plans, the Tune function that runs it as a lab trial, its reports to
Tune, and its record when it ends."""

from __future__ import annotations

import math
import queue
import sys
import threading
from typing import Any

import ray
from ray import tune
from ray.exceptions import RayTaskError

from orchestrator.errors import EXIT_RESUMABLE, SpecError
from orchestrator.session_hosts import HOSTS, host_key
from orchestrator.spec.meta import MetaSpec, with_meta
from orchestrator.spec.search_space import apply_values, parse_search, plain
from orchestrator.store import predir as predir_mod
from orchestrator.store import storage
from orchestrator.store.checkpoint import CheckpointStore
from orchestrator.store.predir import session_seed
from orchestrator.store.record import RunRecord, SessionPlan, now_iso
from orchestrator.trial import Trial
from orchestrator.verify import export_committed, session_done


def trial_json(predir: str, t: int) -> str:
    """URI of ``t{T}/trial.json``."""
    return storage.join(predir, f"t{t}", "trial.json")


def write_spec_files(predir: str, spec: dict[str, Any], t: int) -> None:
    """Trial and session spec files of trial ``t`` (sampled values applied)."""
    name = spec["name"]
    meta = MetaSpec.of(spec)
    storage.write_json(predir_mod.spec_file(predir, name, t), with_meta(spec, trial=t))
    for s in range(meta.max_session):
        seed = session_seed(meta.random_seed, t, s)
        session_spec = predir_mod.session_spec(spec, t, s, seed)
        storage.write_json(predir_mod.spec_file(predir, name, t, s), session_spec)


def set_aside(predir: str, t: int) -> str:
    """Move ``t{T}/`` (a trial of values Tune no longer has) to ``t{T}.stale-{ts}/``; returns it."""
    src = storage.join(predir, f"t{t}")
    dst = storage.join(predir, f"t{t}.stale-{now_iso().replace(':', '')}")
    if storage.is_remote(src):
        storage.copy_tree(src, dst)
        storage.delete(src)
    else:
        storage.move(src, dst)
    print(f"warning: t{t}/ holds other sampled values than Tune's trial t{t} now has; set aside to {dst}",
          file=sys.stderr)
    return dst


def plan_sessions(predir: str, spec: dict[str, Any], t: int) -> tuple[list[SessionPlan], list[SessionPlan]]:
    """Plans of trial ``t``'s sessions, each verified in this process first (``trial.check_session``).

    A session whose newest valid checkpoint is at ``max_frame`` is done: its train_df/eval_df copies
    are re-exported from that checkpoint (a killed driver may have left older ones). Any other
    session resumes from its newest valid checkpoint (newer corrupt ones set aside with a warning),
    or starts fresh (with its seed) when it has none.

    Returns:
        (plans to run, plans of the sessions already done).

    Raises:
        UsageError: a session's checkpoints cannot be read.
    """
    plans, done = [], []
    meta = MetaSpec.of(spec)
    for s in range(meta.max_session):
        plan = SessionPlan(t, s, session_seed(meta.random_seed, t, s), resume=False)
        is_done, selection = session_done(predir, plan, int(spec["env"]["max_frame"]))
        if is_done:
            export_committed(predir, plan, selection)
            done.append(plan)
            continue
        plan.resume, plan.frame = selection.frame is not None, selection.frame or 0
        plans.append(plan)
    return plans, done


def session_history(predir: str, t: int, s: int) -> dict[int, float]:
    """``{frame: total_reward_ma}`` of a session's saved train_df ({} if none)."""
    uri = storage.join(predir_mod.session_dir(predir, t, s), "train_df.parquet")
    if not storage.exists(uri):
        return {}
    df = storage.read_parquet(uri)
    return dict(zip(df["frame"].astype(int).tolist(), df[METRIC].astype(float).tolist()))


class TrialReporter:
    """Reports a trial's mean ``total_reward_ma`` to Tune at each frame every live session has logged, with the latest
    row of each session for the driver's console (``progress``, ``orchestrator.search.console``).

    Args:
        t: trial index.
        plans: the running sessions' plans (a ``failed`` one stops counting).
        history: ``{session: {frame: total_reward_ma}}``, prefilled from saved train_dfs.
        report: ``tune.report`` (a list's ``append`` in tests).
    """

    def __init__(self, t: int, plans: list[SessionPlan], history: dict[int, dict[int, float]],
                 report: Any) -> None:
        self.t, self.plans, self.history, self.report = t, {p.session: p for p in plans}, history, report
        self.reported = -1
        self.latest = {s: {"frame": max(h), METRIC: h[max(h)]} for s, h in history.items() if h}

    def __call__(self, plan: SessionPlan, row: dict[str, Any]) -> None:
        """Record one train_df row of a session; report each frame all live sessions have now reached."""
        self.history.setdefault(plan.session, {})[int(row["frame"])] = float(row[METRIC])
        self.latest[plan.session] = {"frame": int(row["frame"]), "fps": row.get("fps"), METRIC: float(row[METRIC])}
        live = [s for s in self.history if s not in self.plans or self.plans[s].status != "failed"]
        common = set.intersection(*(set(self.history[s]) for s in live)) if live else set()
        for frame in sorted(f for f in common if f > self.reported):
            values = [self.history[s][frame] for s in live if not math.isnan(self.history[s][frame])]
            mean = sum(values) / len(values) if values else math.nan
            self.report({METRIC: mean, "frame": frame, "trial": self.t, "progress": self.progress()})
            self.reported = frame

    def progress(self) -> dict[str, dict[str, Any]]:
        """``{"t{T}_s{S}": {"frame", "fps", "total_reward_ma", "status"}}``: each session's latest row and its status
        (``""`` while it runs or waits; a session not run in this trial process was ``done`` before)."""
        out = {}
        for s, row in sorted(self.latest.items()):
            status = self.plans[s].status if s in self.plans else "done"
            out[f"t{self.t}_s{s}"] = {**row, "status": "" if status in ("running", "pending") else status}
        return out


def final_metrics(predir: str, spec: dict[str, Any], t: int) -> dict[str, Any]:
    """Final metrics of trial ``t`` from its sessions' committed train_dfs (reported to Tune at its end).

    Each session's train_df is its newest valid checkpoint's (``report.rundata.committed_df``), the one the analysis
    reads, so every column of a search's table describes the same rows, also when a stop left the session directory's
    copy behind its last commit.

    Returns:
        ``total_reward_ma`` / ``total_reward_ma_std``: mean / std across sessions of the last row's
        moving average; ``frame``: the least final frame; ``sessions``: sessions with a train_df.
    """
    import numpy as np

    from orchestrator.report.rundata import committed_df

    finals, frames = [], []
    for s in range(MetaSpec.of(spec).max_session):
        df = committed_df(predir_mod.session_dir(predir, t, s), "train_df.parquet")
        if df is None or df.empty:
            continue
        finals.append(float(df[METRIC].iloc[-1]))
        frames.append(int(df["frame"].iloc[-1]))
    valid = [f for f in finals if not math.isnan(f)]
    return {METRIC: float(np.mean(valid)) if valid else math.nan,
            f"{METRIC}_std": float(np.std(valid)) if len(valid) > 1 else 0.0,
            "frame": min(frames) if frames else 0, "sessions": len(frames)}


def search_trial(config: dict[str, Any], spec: dict[str, Any], predir: str) -> None:
    """The Tune trainable: run (or resume, or merely report) lab trial ``t{T}`` of ``config``.

    A trial whose ``trial.json`` is final (``done``, or ``stopped`` by the scheduler) only reports its
    final metrics: Tune re-runs such a trial after a stale snapshot, or when its state was lost.

    Args:
        config: sampled values ``{dotted.spec.path: value}``.
        spec: the search's checked spec (with its search section).
        predir: run directory URI.

    Raises:
        RuntimeError: a session failed (Tune marks the trial errored; ``search@`` retries it).
    """
    ctx = tune.get_context()
    t = trial_index(ctx.get_trial_name())
    values = {k: plain(v) for k, v in config.items()}
    # the session actors start now (their processes import torch while this one waits), and one of them checks the
    # spec: this process imports no torch (docs/search.md "Scheduling and sampling")
    meta = MetaSpec.of(spec)
    hosts = HOSTS.warm_up(host_key(meta), meta.session_actors)
    try:
        trial_spec = ray.get(hosts[0].check_spec.remote(apply_values(spec, values)))
    except RayTaskError as err:  # a bad variant: its SpecError as the trial's error, without the remote frames
        raise (err.cause if isinstance(err.cause, SpecError) else err) from None
    info = read_trial_info(predir, t)
    if info is not None and info["values"] != values:
        set_aside(predir, t)
        info = None
    if info is not None and is_final(info, trial_spec):
        tune.report({**final_metrics(predir, trial_spec, t), "trial": t})
        return
    write_spec_files(predir, trial_spec, t)  # a resume may have raised max_frame
    info = info or {"trial": t, "values": values, "tune_trial_id": ctx.get_trial_id(), "started": now_iso()}
    storage.write_json(trial_json(predir, t), {**info, "status": "running"})
    progress = run_lab_trial(predir, trial_spec, t)
    metrics = final_metrics(predir, trial_spec, t)
    storage.write_json(trial_json(predir, t), {**info, "status": "done", "finished": now_iso(),
                                               "frame": metrics["frame"]})
    # its graphs: the driver's TrialAnalyzer, as the next runs
    tune.report({**metrics, "trial": t, "ran": True, "progress": progress})


class TrialAnalyzer:
    """The driver's thread that writes each ``done`` search trial's metrics and graphs
    (``analysis.analyze_after_run``) as soon as the trial ends, while the next trials run.

    In the trial's own process the analysis held the trial's placement group (its sessions' CPUs) for 1-5 s
    after its sessions ended, and the next trial waited for it (docs/BENCHMARKS.md "Search overhead"); here the
    next trial starts at once. The search's scheduler (``AnalyzeEnded``) hands it the ended trials; ``close``
    waits for the queue, after which the search's final ``analyze`` does the trials not analyzed yet (a stopped
    trial, one whose analysis failed, one that ended while the driver was killed).
    """

    def __init__(self) -> None:
        self.predir: str | None = None
        self.queue: queue.Queue[int | None] = queue.Queue()
        self.thread: threading.Thread | None = None

    def start(self, predir: str) -> None:
        """Start the thread for the search in ``predir``."""
        self.predir = predir
        self.thread = threading.Thread(target=self.run, name="search-analysis", daemon=True)
        self.thread.start()

    def submit(self, t: Any) -> None:
        """Queue trial ``t`` (ignored when no search runs in this process, or ``t`` is not a trial index)."""
        if self.thread is not None and isinstance(t, int):
            self.queue.put(t)

    def run(self) -> None:
        """Analyze queued trials until ``close``. A queued trial is ``done``: ``search_trial`` writes that to its
        ``trial.json`` before the report that queues it (``AnalyzeEnded``), so nothing is read again here."""
        from orchestrator.report.analysis import analyze_after_run

        while (t := self.queue.get()) is not None:
            analyze_after_run(self.predir, trials=[t])  # a failure only warns; the final analyze retries it

    def close(self) -> None:
        """Wait for the queued analyses and end the thread."""
        if self.thread is not None:
            self.queue.put(None)
            self.thread.join()
        self.thread, self.predir = None, None


ANALYZER = TrialAnalyzer()  # the running search's (one search per driver process at a time)


def is_final(info: dict[str, Any], spec: dict[str, Any]) -> bool:
    """A trial that never runs again: ``stopped`` by the scheduler, or ``done`` at the spec's
    ``max_frame`` (a ``done`` trial continues when ``search@`` raised ``env.max_frame``)."""
    max_frame = int(spec["env"]["max_frame"])
    done = info["status"] == "done" and info.get("frame", max_frame) >= max_frame
    return done or info["status"] == "stopped"


def search_complete(predir: str, spec: dict[str, Any]) -> bool:
    """Whether every trial of the search exists and is final (``is_final``): ``meta.max_trial`` samples times the
    grid's combinations."""
    grid = math.prod(len(v.arg) for v in parse_search(spec)[0] if v.kind == "grid_search")
    trials = lab_trials(predir)
    return len(trials) == MetaSpec.of(spec).max_trial * grid and all(is_final(i, spec) for i in trials.values())


def run_lab_trial(predir: str, spec: dict[str, Any], t: int) -> dict[str, dict[str, Any]]:
    """Run the unfinished sessions of trial ``t`` as actors, reporting to Tune at each log checkpoint.

    Returns:
        The sessions' latest rows and statuses (``TrialReporter.progress``; {} when every session was done).

    Raises:
        RuntimeError: a session failed.
    """
    plans, done = plan_sessions(predir, spec, t)
    record = RunRecord.load_or_new(storage.join(predir, f"t{t}"), spec["name"])
    for plan in done:  # the checkpoint is the truth: a killed driver may not have recorded the end
        entry = record.data["sessions"].get(plan.key, {})
        if entry.get("status") != "done" or entry.get("frame") != plan.frame:
            record.update(plan, checkpoint=plan.frame)
    if not plans:
        return {}
    if any(p.resume for p in plans) or record.data["sessions"]:
        entry = {"at": now_iso(), "spec_edits": [], "from_frames": {p.key: p.frame for p in plans}}
        set_aside = {p.key: p.set_aside for p in [*plans, *done] if p.set_aside}
        if set_aside:
            entry["set_aside"] = set_aside
        record.data["resumes"].append(entry)
    history = {s: session_history(predir, t, s) for s in range(MetaSpec.of(spec).max_session)}
    for plan in plans:  # rows past a resumed session's checkpoint come again; fresh ones have none
        kept = history[plan.session].items() if plan.resume else ()
        history[plan.session] = {f: v for f, v in kept if f <= plan.frame}
    reporter = TrialReporter(t, plans, history, tune.report)
    code = Trial(spec, predir, plans, record, quiet=True, on_log=reporter, analyze=False, hosts=HOSTS).run()
    if code not in (0, EXIT_RESUMABLE):  # EXIT_RESUMABLE: stopped cleanly (a signal, or Tune stopping the trial)
        failed = [f"{p.key}: {(p.error or '').strip().splitlines()[-1:]}"
                  for p in plans if p.status == "failed"]
        raise RuntimeError(f"trial t{t}: session(s) failed: {failed}")
    return reporter.progress()


def lab_trials(predir: str) -> dict[int, dict[str, Any]]:
    """``{T: trial.json}`` of every trial dir of a search predir."""
    out = {}
    for name in storage.listdir(predir):
        if name.startswith("t") and name[1:].isdigit():
            info = read_trial_info(predir, int(name[1:]))
            if info is not None:
                out[int(name[1:])] = info
    return out


def read_trial_info(predir: str, t: int) -> dict[str, Any] | None:
    """``t{T}/trial.json``; None if absent; a damaged one is rebuilt (``rebuild_trial_info``)."""
    uri = trial_json(predir, t)
    try:
        data = storage.read_json(uri)
    except FileNotFoundError:
        return None
    except (ValueError, UnicodeDecodeError) as err:
        return rebuild_trial_info(predir, t, f"not valid JSON: {err}")
    if not isinstance(data, dict) or not isinstance(data.get("values"), dict) or "status" not in data:
        return rebuild_trial_info(predir, t, "not an object with 'values' and 'status'")
    return data


def lookup(spec: dict[str, Any], path: str) -> Any:
    """Value at a dotted spec path (a key may itself hold dots: the longest matching key wins).

    Raises:
        KeyError: no such path.
    """
    if path in spec:
        return spec[path]
    for i in range(path.count(".") + 1, 0, -1):
        head = ".".join(path.split(".")[:i])
        if head in spec and isinstance(spec[head], dict) and i <= path.count("."):
            return lookup(spec[head], path[len(head) + 1:])
    raise KeyError(path)


def rebuild_trial_info(predir: str, t: int, why: str) -> dict[str, Any] | None:
    """A damaged ``t{T}/trial.json`` rebuilt from the trial's spec file and committed checkpoints.

    The damaged file is kept as ``trial.json.damaged-{ts}``, a warning names both. ``values`` come
    from ``{spec_name}_t{T}_spec.json`` at the search's variable paths; ``status`` is ``done`` when
    every session has a committed checkpoint at ``max_frame``, else ``running`` (so ``search@``
    resumes it; a trial the scheduler had ``stopped`` cannot be told apart and continues);
    ``frame`` is the least newest checkpoint frame.

    Returns:
        The rebuilt content (written), or None when the spec files needed are unreadable too (the
        damaged file is then only moved aside, and the trial is rewritten when it runs again).
    """
    uri = trial_json(predir, t)
    kept = f"{uri}.damaged-{now_iso().replace(':', '')}"
    storage.write_bytes(kept, storage.read_bytes(uri))
    name = predir_mod.spec_name_of(predir)
    try:
        spec = storage.read_json(predir_mod.spec_file(predir, name))
        trial_spec = storage.read_json(predir_mod.spec_file(predir, name, t))
        values = {v.path: lookup(trial_spec, v.path) for v in parse_search(spec)[0]}
        max_frame, sessions = int(trial_spec["env"]["max_frame"]), MetaSpec.of(trial_spec).max_session
    except (FileNotFoundError, ValueError, KeyError, TypeError) as err:
        storage.delete(uri)
        print(f"warning: {uri} is damaged ({why}); kept as {kept}; it cannot be rebuilt ({err}) and is "
              f"rewritten when trial t{t} runs again", file=sys.stderr)
        return None
    frames = []
    for s in range(sessions):
        committed = CheckpointStore(predir_mod.session_dir(predir, t, s)).frames()
        frames.append(committed[-1] if committed else 0)
    status = "done" if frames and min(frames) >= max_frame else "running"
    info = {"trial": t, "values": values, "status": status, "frame": min(frames, default=0),
            "rebuilt": {"at": now_iso(), "why": why}}
    storage.write_json(uri, info)
    print(f"warning: {uri} is damaged ({why}); kept as {kept} and rebuilt from the trial's spec file and "
          f"committed checkpoints: status {status}, frame {info['frame']}", file=sys.stderr)
    return info


def mark_ended(predir: str, spec: dict[str, Any], results: Any,
               signalled: bool = False) -> tuple[dict[int, str], bool]:
    """After ``fit``: trials Tune ended without ``done`` become ``stopped`` (scheduler) or ``error``; after a stop
    signal (``signalled``) or an early end of ``fit``, the unfinished ones stay ``running`` (``search@`` resumes them).

    Returns:
        ({T: last line of the error} of errored trials, whether the search was interrupted before
        every trial ended).
    """
    errored = {}
    for result in results:
        if result.error is not None:
            t = trial_index(storage.basename(str(result.path)))
            errored[t] = (str(result.error).strip().splitlines() or [""])[-1]
    interrupted = signalled or results.num_terminated + results.num_errors < len(results)
    for t, info in lab_trials(predir).items():
        status = "error" if t in errored else ("stopped" if not interrupted else info["status"])
        if info["status"] == "running" and status != "running":
            frame = final_metrics(predir, spec, t)["frame"]
            storage.write_json(trial_json(predir, t), {**info, "status": status, "frame": frame,
                                                       "error": errored.get(t)})
    return errored, interrupted


METRIC = "total_reward_ma"


def trial_index(name: str) -> int:
    """T of a Tune trial name or dir ``t{T}``.

    Raises:
        ValueError: another name.
    """
    if not (name.startswith("t") and name[1:].isdigit()):
        raise ValueError(f"Tune trial name '{name}' is not t{{T}}")
    return int(name[1:])


