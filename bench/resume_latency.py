"""``train@latest`` latency: seconds from the command to every session ready to step its first new
frame (the ``started`` event, sent after the restore), against a fresh ``train`` of the same spec.

Both go through the real CLI in a subprocess, with a fresh embedded Ray each time. Usage:

    python bench/resume_latency.py [--repeats 3] [--out bench/results/resume_latency.json]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

SPEC = ["specs/benchmark/cartpole.json", "ppo_cartpole"]
ITEMS = ["-s", "meta.max_session=2", "-s", "meta.log_frequency=1000", "-s", "env.max_frame=400000"]


def time_to_started(mode: str, data: str, old_pids: set[int]) -> tuple[float, set[int]]:
    """Run ``lab ... mode`` until every session reported ``started`` from a new actor process.

    Returns the seconds from the command to that moment and the new actor PIDs; the run is then
    interrupted with SIGTERM (after a few seconds of training when it is a fresh run, so that it
    leaves checkpoints to resume from).

    Raises:
        RuntimeError: the lab's process exited before both sessions started.
    """
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "run_lab.py", *SPEC, mode, "--quiet", "--data-dir", data, *ITEMS],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            pids = set()
            for run_json in glob.glob(f"{data}/*/run.json"):
                try:
                    with open(run_json) as f:
                        sessions = json.load(f)["sessions"].values()
                except (OSError, ValueError):
                    continue
                pids = {s["pid"] for s in sessions if s.get("status") == "running" and s.get("pid")} - old_pids
            if len(pids) == 2:
                elapsed = time.perf_counter() - start
                break
            if proc.poll() is not None:  # it ended before both sessions started: fail, never poll forever
                raise RuntimeError(f"{mode}: the lab exited with code {proc.returncode} before its 2 sessions started")
            time.sleep(0.02)
        if not old_pids:
            time.sleep(4)  # let both sessions commit checkpoints before the interruption
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    return elapsed, pids


def main() -> None:
    """The command line (usage in the module docstring): runs the benchmark and writes its results file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="bench/results/resume_latency.json")
    args = parser.parse_args()
    results = []
    for _ in range(args.repeats):
        data = tempfile.mkdtemp(prefix="resume_bench_")
        fresh, pids = time_to_started("train", data, set())
        resumed, _ = time_to_started("train@latest", data, pids)
        results.append({"fresh_s": round(fresh, 2), "resume_s": round(resumed, 2),
                        "extra_s": round(resumed - fresh, 2), "load1": os.getloadavg()[0]})
        print(results[-1])
    extra = round(statistics.median(r["extra_s"] for r in results), 2)  # the mean of the middle two when even
    print(f"median extra seconds of train@latest over train: {extra} (goal < 2 s)")
    from orchestrator.store import storage  # atomic: a kill mid-write leaves the old file
    storage.write_text(args.out, json.dumps({"runs": results, "median_extra_s": extra}, indent=2))


if __name__ == "__main__":
    main()
