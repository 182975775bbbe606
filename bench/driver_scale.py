"""The driver's cost per session with many sessions: a **simulation of the driver's load**, not of training.

The real driver code path (``orchestrator.trial.Trial``: its ``run``/``watch`` loop, ``next_events``/``handle``,
``RunRecord`` with its amortized ``run.json`` writes, the end-of-run bookkeeping) watches N simulated
sessions. Each simulated session is a Ray streaming-generator task that emits the event stream a
``SessionActor`` emits (``started``; a train_df row every ``--log-every-s`` seconds of simulated
training, and every ``--ckpt-every`` rows a ``checkpoint`` commit with that chunk's ``log`` rows as one
``batch`` event, as ``SessionActor.run`` sends them; ``done``; see ``orchestrator.session_actor``), with the same
payloads, but does no RL and imports no torch, so hundreds of them fit in this machine's memory. Only
``Trial.new_actor``/``end_actor`` are replaced (they start a simulated session instead of a
``SessionActor``); everything the driver does with the events is the lab's code.

Sessions are hosted ``--per-host`` to a Ray actor process (threaded actors on a
``ray.cluster_utils.Cluster`` of ``--nodes`` virtual nodes, spread over them): one process per session
(``--per-host 1``) costs a Ray worker's memory (~70 MB) per session, which 1,000 sessions do not fit in
here. For the driver it is the same load: one object-ref generator per session, the same events.

Measured in the driver process over the window where every session is running (after the last
``started``, before the first ``done``):

- **driver CPU**: ``resource.getrusage(RUSAGE_SELF)`` user+system seconds per wall second (the driver's
  Python thread and Ray's core-worker threads in it), as % of one core;
- **progress latency**: event emitted (wall clock in the session, just before ``yield``) -> handled by
  the driver (``Trial.handle``), p50/p99/max, over ``log`` and ``checkpoint`` events;
- **run.json writes**: writes per second and bytes per second (``RunRecord.save`` counted), and over the
  whole run.

``--real N`` instead runs N real sessions through the CLI (``lab ... ppo_cartpole train``, fractional CPUs)
and records the wall time and that every session finished.

Usage:
    python bench/driver_scale.py [--sessions 16 64 256] [--duration 60] [--nodes 4] [--per-host 16]
        [--log-every-s 1] [--ckpt-every 5] [--out bench/results/driver_scale.json]
    python bench/driver_scale.py --real 16 [--real-frames 4096] [--real-cpus 0.125]   # real sessions, CLI
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import ray  # noqa: E402

from orchestrator import trial as trial_mod  # noqa: E402
from orchestrator.modes import train as train_mod  # noqa: E402
from orchestrator.session import events as ev  # noqa: E402
from orchestrator.spec.load import load_spec  # noqa: E402
from orchestrator.store import storage  # noqa: E402

SPEC_FILE = ROOT / "specs/benchmark/cartpole.json"
FRAMES_PER_LOG = 2048  # ppo_cartpole's log_frequency: frames per simulated log row


def timed(event_cls: type) -> type:
    """``event_cls`` (an ``orchestrator.session.events`` record) with the wall-clock second it was emitted at
    (``t_emit``); the driver handles it as the event it extends."""
    cls = dataclasses.make_dataclass(f"Timed{event_cls.__name__}", [("t_emit", float, 0.0)], bases=(event_cls,),
                                     frozen=True)
    cls.__module__ = __name__  # pickled by reference, as a module-level class
    return cls


TimedStarted, TimedLog, TimedCheckpoint, TimedDone, TimedInterrupted = (
    timed(c) for c in (ev.Started, ev.Log, ev.Checkpoint, ev.Done, ev.Interrupted))


@ray.remote(num_cpus=0)
class SessionHost:
    """A Ray actor process hosting simulated sessions, one thread each (``max_concurrency`` set by the caller).

    ``run`` is a generator method: the event stream of one session (see ``orchestrator.session_actor``).
    """

    def __init__(self) -> None:
        self.stopped: set[str] = set()

    def stop(self, key: str) -> None:
        """Ask session ``key`` to stop at its next event (it then reports ``interrupted``)."""
        self.stopped.add(key)

    def run(self, key: str, duration_s: float, log_every_s: float, ckpt_every: int) -> Iterator[ev.Event]:
        """Emit ``started``, then a log row every ``log_every_s`` s (a checkpoint every ``ckpt_every`` rows)
        for ``duration_s`` s, then ``done``; every event carries ``t_emit`` (wall clock, s)."""
        import os
        import socket
        import time

        rng = random.Random(key)
        time.sleep(rng.uniform(0, log_every_s))  # sessions out of phase, as real ones are
        yield TimedStarted(pid=os.getpid(), device="cpu", restored_frame=None, set_aside=[], exact=True, tracking=None,
                           node_id=ray.get_runtime_context().get_node_id(), hostname=socket.gethostname(),
                           t_emit=time.time())
        start, n, frame = time.monotonic(), 0, 0
        returns: list[float] = []
        rows: list[dict[str, Any]] = []
        while time.monotonic() - start < duration_s and key not in self.stopped:
            n += 1
            time.sleep(max(0.0, start + n * log_every_s - time.monotonic()))
            frame += 2048
            returns.append(rng.uniform(10, 500))
            rows.append({"frame": frame, "epi": n * 7, "t": frame // 8, "opt_step": n * 160,
                         "wall_t": time.monotonic() - start, "fps": 2048 / log_every_s, "total_reward": returns[-1],
                         "total_reward_ma": sum(returns[-100:]) / len(returns[-100:]), "loss": rng.random(),
                         "lr": 1e-3, "explore_var": float("nan"), "entropy_coef": 0.0, "entropy": rng.random(),
                         "grad_norm": rng.random(), "refill": False, "clip_eps": 0.2})
            if n % ckpt_every == 0:  # as SessionActor.run: a checkpoint's commit and the chunk's rows, one batch
                t = time.time()
                commit = TimedCheckpoint(frame=frame, seconds=0.006, t_emit=t)
                yield ev.Batch([commit, *(TimedLog(row=row, t_emit=t) for row in rows)])
                rows.clear()
        end = TimedInterrupted if key in self.stopped else TimedDone
        yield end(frame=frame, total_reward_ma=returns[-1] if returns else None, checkpoint=True, t_emit=time.time())


class SimActor:
    """What ``Trial`` holds as a session's actor handle: ``run.remote(session)`` / ``stop.remote()`` of one
    session on its ``SessionHost`` (the session's arguments are the simulation's own)."""

    class _Method:
        def __init__(self, fn: Any) -> None:
            self.remote = fn

    def __init__(self, host: Any, key: str, duration_s: float, log_every_s: float, ckpt_every: int) -> None:
        self.run = self._Method(lambda session=None: host.run.remote(key, duration_s, log_every_s, ckpt_every))
        self.stop = self._Method(lambda: host.stop.remote(key))


class CountingRecord(trial_mod.RunRecord):
    """``RunRecord`` that counts its writes and their bytes."""

    def __init__(self, predir: str, data: dict[str, Any]) -> None:
        super().__init__(predir, data)
        self.writes: list[tuple[float, int]] = []  # (monotonic time, bytes)

    def save(self) -> None:
        """Write run.json and record when and how many bytes."""
        super().save()
        self.writes.append((time.monotonic(), os.path.getsize(self.uri)))


class SimTrial(trial_mod.Trial):
    """The lab's ``Trial`` watching simulated sessions; records each event's latency."""

    def __init__(self, *args: Any, hosts: list[Any], duration_s: float, log_every_s: float, ckpt_every: int,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sim_hosts, self.sim = hosts, (duration_s, log_every_s, ckpt_every)
        self.latency: list[tuple[float, float]] = []  # (monotonic time seen, latency s) of log/checkpoint events
        self.started_at: dict[str, float] = {}
        self.done_at: dict[str, float] = {}

    def new_actor(self, plan: trial_mod.SessionPlan) -> SimActor:
        """A simulated session on one of the shared host processes (round robin)."""
        return SimActor(self.sim_hosts[plan.session % len(self.sim_hosts)], plan.key, *self.sim)

    def end_actor(self, actor: Any) -> None:
        """Nothing to end: the host processes are shared and end with the cluster."""

    def handle(self, plan: trial_mod.SessionPlan, event: ev.Event) -> None:
        """Handle an event as the driver does; record its latency (s) from emission and each session's start and end."""
        seen = time.time()
        super().handle(plan, event)
        now = time.monotonic()
        if event.kind in ("log", "checkpoint"):
            self.latency.append((now, seen - event.t_emit))
        elif event.kind == "started":
            self.started_at[plan.key] = now
        elif event.kind in ("done", "interrupted"):
            self.done_at[plan.key] = now


def cpu_s() -> float:
    """User + system CPU seconds of this process (all its threads)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0-1) of ``values`` (nearest rank)."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))] if s else math.nan


def run_one(n: int, args: argparse.Namespace, data_dir: str) -> dict[str, Any]:
    """Watch ``n`` simulated sessions with the lab's driver code; returns the figures."""
    spec = load_spec(str(SPEC_FILE), "ppo_cartpole", [f"meta.max_session={n}", "meta.random_seed=1",
                                                      f"env.max_frame={10**9}"])
    n_hosts = max(1, math.ceil(n / args.per_host))
    per = math.ceil(n / n_hosts)
    hosts = [SessionHost.options(max_concurrency=per + 2, num_cpus=0.001, scheduling_strategy="SPREAD").remote()
             for _ in range(n_hosts)]
    ray.get([h.stop.remote("-") for h in hosts])  # every host process is up before the clock starts
    predir, plans = train_mod.plan_fresh(spec, data_dir)
    record = CountingRecord(predir, CountingRecord.new_data(spec["name"]))
    trial = SimTrial(spec, predir, plans, record, quiet=True, analyze=False, hosts=hosts,
                     duration_s=args.duration, log_every_s=args.log_every_s, ckpt_every=args.ckpt_every)
    samples: list[tuple[float, float]] = []  # (monotonic, cpu s), 5 Hz
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append((time.monotonic(), cpu_s()))
            stop.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0, main0 = time.monotonic(), time.thread_time()
    code = trial.run()
    wall, main_cpu = time.monotonic() - t0, time.thread_time() - main0
    stop.set()
    sampler.join()
    for h in hosts:
        ray.kill(h)
    lo = max(trial.started_at.values()) + 1.0  # steady state: all sessions running
    hi = min(trial.done_at.values()) - 0.5
    win = [s for s in samples if lo <= s[0] <= hi]
    cpu_pct = 100 * (win[-1][1] - win[0][1]) / (win[-1][0] - win[0][0]) if len(win) >= 2 else math.nan
    lat = [x for t, x in trial.latency if lo <= t <= hi]
    writes = [w for w in record.writes if lo <= w[0] <= hi]
    span = hi - lo
    events = sum(1 for t, _ in trial.latency if lo <= t <= hi)
    statuses = sorted({p.status for p in plans})
    out = {"sessions": n, "hosts": n_hosts, "nodes": args.nodes, "exit_code": code, "statuses": statuses,
           "wall_s": round(wall, 1), "window_s": round(span, 1),
           "start_spread_s": round(max(trial.started_at.values()) - min(trial.started_at.values()), 1),
           "events_per_s": round(events / span, 1) if span > 0 else None,
           "driver_cpu_pct": round(cpu_pct, 2),
           "driver_main_thread_cpu_pct_whole_run": round(100 * main_cpu / wall, 2),
           "driver_cpu_pct_whole_run": round(100 * (samples[-1][1] - samples[0][1]) / wall, 2),
           "driver_cpu_ms_per_event": round(10 * cpu_pct / (events / span), 3) if events else None,
           "latency_p50_ms": round(1000 * pct(lat, 0.5), 1), "latency_p99_ms": round(1000 * pct(lat, 0.99), 1),
           "latency_max_ms": round(1000 * max(lat), 1) if lat else None,
           "run_json_writes_per_s": round(len(writes) / span, 2) if span > 0 else None,
           "run_json_kb_per_s": round(sum(b for _, b in writes) / span / 1024, 1) if span > 0 else None,
           "run_json_kb": round(record.writes[-1][1] / 1024, 1), "run_json_writes_total": len(record.writes),
           "driver_maxrss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
           "load1_end": round(os.getloadavg()[0], 2)}
    print(json.dumps(out), flush=True)
    return out


def real_run(n: int, frames: int, num_cpus: float) -> dict[str, Any]:
    """``lab specs/benchmark/cartpole.json ppo_cartpole train`` with ``n`` real sessions of ``frames`` frames,
    ``num_cpus`` CPU each, through the CLI (a fresh process, embedded Ray); wall time and every session's status."""
    import subprocess

    with tempfile.TemporaryDirectory() as data_dir:
        items = [f"meta.max_session={n}", f"meta.resources.num_cpus={num_cpus}", f"env.max_frame={frames}",
                 "meta.log_frequency=1024", "meta.random_seed=1", f"agent.net.lr_scheduler_spec.frame={frames}",
                 f"agent.algorithm.clip_eps_spec.end_step={frames}"]
        cmd = [sys.executable, str(ROOT / "run_lab.py"), str(SPEC_FILE), "ppo_cartpole", "train", "--quiet",
               "--data-dir", data_dir, *[x for item in items for x in ("-s", item)]]
        start = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ})
        wall = time.monotonic() - start
        (run_json,) = Path(data_dir).glob("ppo_cartpole_*/run.json")
        sessions = json.loads(run_json.read_text())["sessions"]
    statuses = {k: v["status"] for k, v in sessions.items()}
    out = {"real_sessions": n, "frames_per_session": frames, "num_cpus_per_session": num_cpus,
           "exit_code": proc.returncode, "wall_s": round(wall, 1),
           "done": sum(v == "done" for v in statuses.values()),
           "frames_done": {k: v["frame"] for k, v in sessions.items()},
           "nodes_seen": len({v.get("node_id") for v in sessions.values()}), "load1_end": round(os.getloadavg()[0], 2),
           "stderr_tail": proc.stderr.strip().splitlines()[-3:]}
    print(json.dumps(out), flush=True)
    return out


def main() -> None:
    """Parse arguments, start the cluster, run each size, write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, nargs="+", default=[16, 64, 256])
    ap.add_argument("--duration", type=float, default=60.0, help="seconds each simulated session runs")
    ap.add_argument("--nodes", type=int, default=4, help="virtual Ray nodes (the head included)")
    ap.add_argument("--per-host", type=int, default=16, help="simulated sessions per actor process")
    ap.add_argument("--log-every-s", type=float, default=1.0)
    ap.add_argument("--ckpt-every", type=int, default=5, help="log rows per checkpoint commit")
    ap.add_argument("--label", default="", help="a name for this configuration in the JSON")
    ap.add_argument("--out", default=str(ROOT / "bench/results/driver_scale.json"))
    ap.add_argument("--real", type=int, default=0, help="instead: a real train of this many sessions (CLI)")
    ap.add_argument("--real-frames", type=int, default=4096)
    ap.add_argument("--real-cpus", type=float, default=0.125, help="meta.resources.num_cpus per real session")
    args = ap.parse_args()
    if args.real:
        result = {"date": time.strftime("%Y-%m-%d %H:%M"), "label": args.label,
                  **real_run(args.real, args.real_frames, args.real_cpus)}
        out = Path(args.out)
        old = json.loads(out.read_text()) if out.exists() else []
        storage.write_text(str(out), json.dumps([*old, result], indent=2) + "\n")
        return
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    for _ in range(args.nodes - 1):
        cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
    results = []
    try:
        with tempfile.TemporaryDirectory() as data_dir:
            for n in args.sessions:
                results.append(run_one(n, args, data_dir))
    finally:
        ray.shutdown()
        cluster.shutdown()
    record = {"date": time.strftime("%Y-%m-%d %H:%M"), "label": args.label, "duration_s": args.duration,
              "log_every_s": args.log_every_s, "ckpt_every": args.ckpt_every, "per_host": args.per_host,
              "results": results}
    out = Path(args.out)
    old = json.loads(out.read_text()) if out.exists() else []
    storage.write_text(str(out), json.dumps([*(old if isinstance(old, list) else [old]), record], indent=2) + "\n")


if __name__ == "__main__":
    main()
