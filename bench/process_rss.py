"""Resident memory of the lab's processes during a 1-session ``train`` of ``ppo_cartpole``.

Starts ``lab specs/benchmark/cartpole.json ppo_cartpole train`` (one session, ``--frames`` frames,
embedded local Ray) as a fresh process and samples, every 0.2 s until it exits, the RSS (resident set
size, MB = 2**20 bytes, from psutil) of the driver and of every process below it: Ray's daemons
(``gcs_server``, ``raylet``, the dashboard and its agents, the log monitor, the runtime-env agent, ...),
the session actor's worker (``ray::SessionActor``), idle Ray workers and the driver's spec-check child
(``orchestrator.modes.spec_check``: torch and gymnasium for a few seconds while Ray starts; reported on its
own, not a daemon). Reported per process kind: the peak RSS (the kernel's ``VmHWM``, so no peak between
samples is missed) of one process, and for the daemons the peak of their sum. Goals (issue 13): a CPU session
actor <= 350 MB, the driver <= 250 MB, Ray's daemons <= 250 MB together.

RSS counts shared pages (libraries such as torch's) in every process that maps them; USS (unique set
size: pages only this process holds) is recorded too.

Usage:
    python bench/process_rss.py [--frames 20480] [--label NAME] [--checkout OTHER_CHECKOUT]
        [--out bench/results/process_rss.json]
        [--] [extra lab arguments, e.g. --dashboard]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

try:
    import psutil
except ImportError:  # Ray bundles psutil (ray/thirdparty_files), on sys.path once ray is imported
    import importlib

    importlib.import_module("ray")
    psutil = importlib.import_module("psutil")

ROOT = Path(__file__).resolve().parents[1]
SPEC_FILE = ROOT / "specs/benchmark/cartpole.json"
ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
MB = 2 ** 20
NOT_DAEMONS = ("driver", "session_actor", "ray_worker_other", "gone", "spec_check")


def kind_of(proc: psutil.Process, driver_pid: int) -> str:
    """The kind of a process of the run: driver, session_actor, ray_worker_other, gone, or the daemon's name."""
    if proc.pid == driver_pid:
        return "driver"
    try:
        cmd, name = " ".join(proc.cmdline()), proc.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "gone"
    exe = cmd.split(" ")[0]
    # (kind, test) in order: the raylet's arguments name default_worker.py, Ray's agents are named like workers
    rules = [("session_actor", lambda: "SessionActor" in cmd or name.startswith("ray::SessionAct")),  # comm: 15 chars
             ("spec_check", lambda: "orchestrator.modes.spec_check" in cmd),  # the driver's short-lived check child
             ("DashboardAgent", lambda: "DashboardAgent" in cmd), ("RuntimeEnvAgent", lambda: "RuntimeEnvAgent" in cmd),
             ("gcs_server", lambda: name == "gcs_server" or exe.endswith("/gcs_server")),
             ("raylet", lambda: name == "raylet" or exe.endswith("/raylet")),
             ("ray_worker_other", lambda: cmd.startswith("ray::") or "default_worker.py" in cmd),
             ("agent", lambda: "dashboard/agent.py" in cmd), ("dashboard", lambda: "dashboard/dashboard.py" in cmd),
             ("log_monitor", lambda: "log_monitor.py" in cmd), ("monitor", lambda: "monitor.py" in cmd)]
    return next((kind for kind, test in rules if test()), "other:" + name)


def peak_rss(pid: int) -> int:
    """The kernel's peak RSS of a process so far (``VmHWM`` of /proc/PID/status, bytes; 0 where unreadable):
    exact, where 0.2 s samples can miss a peak."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:")), 0)
    except OSError:
        return 0


def sample(driver: psutil.Process) -> dict[int, tuple[str, float, float, float]]:
    """pid -> (kind, rss MB, uss MB, peak rss MB so far) of the driver and all its descendants now."""
    out = {}
    try:
        procs = [driver, *driver.children(recursive=True)]
    except psutil.NoSuchProcess:
        return out
    for proc in procs:
        try:
            mem = proc.memory_full_info()
            out[proc.pid] = (kind_of(proc, driver.pid), mem.rss / MB, mem.uss / MB, peak_rss(proc.pid) / MB)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def measure(frames: int, extra: list[str], root: Path = ROOT) -> dict[str, Any]:
    """Run one train of the checkout at ``root`` and return the peak RSS/USS per process kind."""
    with tempfile.TemporaryDirectory() as data_dir:
        cmd = [sys.executable, str(root / "run_lab.py"), str(SPEC_FILE), "ppo_cartpole", "train", "--quiet",
               "--data-dir", data_dir, "-s", "meta.max_session=1", "-s", f"env.max_frame={frames}",
               "-s", "meta.random_seed=1", *extra]
        start = time.monotonic()
        env = {**ENV, "PYTHONPATH": str(root)}  # its code, also in the Ray workers (they inherit the environment)
        # cwd: Ray workers put the driver's working directory first on sys.path, so not a checkout's root
        proc = subprocess.Popen(cmd, env=env, cwd=data_dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        driver = psutil.Process(proc.pid)
        peak: dict[int, tuple[str, float, float]] = {}
        daemons_sum_peak, kinds_seen = 0.0, {}
        while proc.poll() is None:
            now = sample(driver)
            for pid, (kind, rss, uss, hwm) in now.items():
                old = peak.get(pid, (kind, 0.0, 0.0))
                if kind in ("gone", "ray_worker_other") and old[0] not in ("gone",):
                    kind = old[0]  # a worker keeps the kind it had as an actor; a dying process its kind
                peak[pid] = (kind, max(old[1], rss, hwm), max(old[2], uss))
                kinds_seen.setdefault(kind, set()).add(pid)
            daemons_sum_peak = max(daemons_sum_peak, sum(r for k, r, _, _ in now.values() if k not in NOT_DAEMONS))
            time.sleep(0.2)
        output = proc.stdout.read()
        wall = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"lab exited {proc.returncode}:\n{output[-3000:]}")
    by_kind: dict[str, dict[str, Any]] = {}
    for kind, rss, uss in peak.values():
        entry = by_kind.setdefault(kind, {"processes": 0, "peak_rss_mb": 0.0, "peak_uss_mb": 0.0})
        entry["processes"] += 1
        entry["peak_rss_mb"] = round(max(entry["peak_rss_mb"], rss), 1)
        entry["peak_uss_mb"] = round(max(entry["peak_uss_mb"], uss), 1)
    daemons = {k: v for k, v in by_kind.items() if k not in NOT_DAEMONS}
    return {"frames": frames, "extra_args": extra, "wall_s": round(wall, 1), "by_kind": by_kind,
            "driver_rss_mb": by_kind.get("driver", {}).get("peak_rss_mb"),
            "session_actor_rss_mb": by_kind.get("session_actor", {}).get("peak_rss_mb"),
            "spec_check_rss_mb": by_kind.get("spec_check", {}).get("peak_rss_mb"),
            "ray_daemons_rss_mb_peak_sum": round(daemons_sum_peak, 1),
            "ray_daemons": sorted(daemons),
            "load1": round(os.getloadavg()[0], 2)}


def main() -> None:
    """Parse arguments, measure, print and append to the JSON results."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=20480)
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default=str(ROOT / "bench/results/process_rss.json"))
    ap.add_argument("--checkout", default=str(ROOT), help="measure the lab of another checkout (e.g. the previous "
                    "commit's worktree); default: this one")
    ap.add_argument("extra", nargs="*", help="extra lab arguments (after --)")
    args = ap.parse_args()
    result = {"date": time.strftime("%Y-%m-%d %H:%M"), "label": args.label, "checkout": Path(args.checkout).name,
              **measure(args.frames, args.extra, Path(args.checkout).resolve())}
    print(json.dumps(result, indent=2))
    out = Path(args.out)
    old = json.loads(out.read_text()) if out.exists() else []
    from orchestrator.store import storage  # atomic: a kill mid-write leaves the old file
    storage.write_text(str(out), json.dumps([*old, result], indent=2) + "\n")


if __name__ == "__main__":
    main()
