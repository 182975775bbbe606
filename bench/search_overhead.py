"""Wall time of a 4-trial x 2-session CartPole search, and the share of it spent outside training.

A ``search`` over a 4-value ``grid_search`` of the learning rate (``meta.max_trial=1``), PPO on
CartPole-v1, 2 sessions per trial at 0.5 CPU each, on an embedded local Ray sized to this machine,
so 2 trials (4 sessions) run at once on 2 cores. Measured:

* ``wall_s``: the whole ``lab ... search`` call (Tune setup, trials, analysis), the local Ray the search
  starts (``orchestrator.trial.init_ray``) started before it and timed apart (``ray_init_s``);
* ``train_s``: the sum over the 8 sessions of their final ``wall_t`` (the session clock counts
  training time only: env steps, updates, logging; not actor start-up, checkpoints or restores);
* ``occupancy``: ``train_s / (wall_s * slots)`` with ``slots`` = sessions that can run at once
  (CPUs / CPU per session); ``outside_training`` = 1 - occupancy: Ray/Tune start-up of trial and
  session actors, checkpoints, waiting for a wave of trials to end, and the final analysis.

Usage::

    python bench/search_overhead.py [--frames 20000] [--out bench/results/search_overhead.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

import pandas as pd
import ray

from orchestrator import cli
from orchestrator.runtime.ray_start import init_ray
from orchestrator.store import storage

SPECS = "specs/benchmark/cartpole.json"
SEARCH = 'search={"agent.net.optim_spec.lr__grid_search": [0.0003, 0.001, 0.003, 0.01]}'
CPU_PER_SESSION = 0.5


def run(frames: int, data_dir: str) -> dict:
    """One search; returns its timings (seconds) and per-session training time."""
    argv = [SPECS, "ppo_cartpole", "search", "--quiet", "--data-dir", data_dir,
            "-s", "meta.max_session=2", "-s", "meta.max_trial=1", "-s", "meta.random_seed=1",
            "-s", f"env.max_frame={frames}", "-s", f"meta.log_frequency={max(frames // 10, 8)}",
            "-s", f'meta.resources={{"num_cpus": {CPU_PER_SESSION}, "num_gpus": 0}}', "-s", SEARCH]
    start = time.perf_counter()
    code = cli.main(argv)
    wall = time.perf_counter() - start
    (name,) = os.listdir(data_dir)
    predir = os.path.join(data_dir, name)
    per_session = {}
    for t in range(4):
        for s in range(2):
            df = pd.read_parquet(os.path.join(predir, f"t{t}", f"s{s}", "train_df.parquet"))
            per_session[f"t{t}_s{s}"] = round(float(df["wall_t"].iloc[-1]), 2)
    return {"exit_code": code, "wall_s": round(wall, 2), "train_s": round(sum(per_session.values()), 2),
            "per_session_train_s": per_session}


def main() -> None:
    """The command line (usage in the module docstring): runs the benchmark and writes its results file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=20000, help="max_frame of each session")
    parser.add_argument("--out", default="bench/results/search_overhead.json")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    cpus = os.cpu_count() or 1
    load_start = os.getloadavg()[0]
    start = time.perf_counter()
    init_ray(None, prestart=False)  # the local Ray a `search` starts (orchestrator.search), timed apart
    init_s = time.perf_counter() - start
    root = tempfile.mkdtemp(prefix="search_bench_")
    try:
        result = run(args.frames, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        ray.shutdown()
    slots = min(8, int(cpus / CPU_PER_SESSION))
    occupancy = result["train_s"] / (result["wall_s"] * slots)
    result.update({"frames_per_session": args.frames, "trials": 4, "sessions_per_trial": 2, "cpus": cpus,
                   "slots": slots, "ray_init_s": round(init_s, 2), "occupancy": round(occupancy, 3),
                   "outside_training": round(1 - occupancy, 3), "load1_start": round(load_start, 1),
                   "load1": round(os.getloadavg()[0], 1)})
    print("| frames/session | wall s | ray.init s | sum of session train s | slots | occupancy | outside "
          "training | load1 |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| {args.frames} | {result['wall_s']} | {result['ray_init_s']} | {result['train_s']} | {slots} | "
          f"{100 * occupancy:.0f}% | {100 * (1 - occupancy):.0f}% | {result['load1']} |")
    storage.write_text(args.out, json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
