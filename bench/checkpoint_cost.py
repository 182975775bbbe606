"""Checkpoint cost as a fraction of training time at the default cadence (a checkpoint every
``meta.log_frequency`` frames), per benchmark spec, one session in-process (no Ray).

The cost is the time the training thread spends on checkpoints: serializing the session plus any
wait for the previous background write. Usage:

    python bench/checkpoint_cost.py [--frames 30000] [--out bench/results/checkpoint_cost.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

import torch

from orchestrator.session_actor import SessionRunner
from orchestrator.spec import load_spec

SPECS = "specs/benchmark/cartpole.json"
CASES = [
    ("ppo_cartpole", []),
    ("reinforce_cartpole", []),
    ("dqn_cartpole", []),
    ("dqn_cartpole (memory.checkpoint)", ["agent.memory.checkpoint=true"]),
]


def measure(name: str, overrides: list[str], frames: int) -> dict:
    """Train ``frames`` frames with checkpoints; return counts and seconds."""
    spec = load_spec(SPECS, name.split()[0], [f"env.max_frame={frames}", *overrides])
    root = tempfile.mkdtemp(prefix="ckpt_bench_")
    try:
        runner = SessionRunner(spec, os.path.join(root, f"{spec['name']}_2026_01_01_000000"), 0, 0, 1, resume=False)
        start, blocked, count = time.perf_counter(), 0.0, 0
        for event in runner.events():
            if event["kind"] == "checkpoint":
                blocked += event["seconds"]
                count += 1
        total = time.perf_counter() - start
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(runner.store.frame_uri(frames))
                   for f in fs)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"spec": name, "frames": frames, "log_frequency": spec["meta"]["log_frequency"], "checkpoints": count,
            "train_s": round(total, 2), "checkpoint_s": round(blocked, 3),
            "fraction_pct": round(100 * blocked / total, 2), "ms_per_checkpoint": round(1000 * blocked / count, 1),
            "checkpoint_bytes": size, "load1": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=30000)
    parser.add_argument("--out", default="bench/results/checkpoint_cost.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = [measure(name, overrides, args.frames) for name, overrides in CASES]
    print("| spec | checkpoints | train s | checkpoint s | fraction | ms/ckpt | bytes | load1 |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['spec']} | {r['checkpoints']} | {r['train_s']} | {r['checkpoint_s']} | {r['fraction_pct']}% "
              f"| {r['ms_per_checkpoint']} | {r['checkpoint_bytes']} | {r['load1']:.1f} |")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
