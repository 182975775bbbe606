"""Cost of one update inside a real session loop, with the lab's allocator setting and with glibc's defaults.

Builds ``Session(ours_spec(algo, frames), seed)`` (``bench/throughput.py``'s rl-zoo settings) in a fresh spawned
process, one torch thread, runs ``Session.run_rl()`` with a wall-clock timer around each ``Algorithm.update`` call,
and records the mean milliseconds per update, the rest of the loop per frame (acting, the env, the replay,
logging) and the process's minor page faults over the run. Two variants, alternating per round:

- ``lab``: as a session runs (``Session`` calls ``orchestrator.runtime.allocator.retain_freed_memory``);
- ``glibc``: the same with that call made a no-op before the session is built, i.e. glibc's default thresholds.

Everything else is the same code, seed and arithmetic (the allocator changes where buffers live, not values), so
the difference is what the allocator setting costs or saves (docs/BENCHMARKS.md, "Throughput vs
Stable-Baselines3", the allocator setting).

Usage:
    python bench/update_cost.py [--algo sac|sac_hopper|dqn|ppo|ppo_atari] [--frames 1600] [--rounds 2] [--seed 1]
        [--out bench/results/update_cost_{algo}.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

VARIANTS = ("lab", "glibc")


def run_variant(variant: str, algo: str, frames: int, seed: int) -> dict[str, Any]:
    """One timed ``run_rl`` of ``algo`` in this (fresh) process under ``variant`` (``VARIANTS``)."""
    import resource

    import torch
    from throughput import ours_spec

    from orchestrator.session import loop as session_mod

    torch.set_num_threads(1)
    if variant == "glibc":
        session_mod.retain_freed_memory = lambda: False  # glibc's defaults: the setting is never made
    session = session_mod.Session(ours_spec(algo, frames), seed)
    update, update_s = session.algorithm.update, []

    def timed(clock: Any) -> Any:
        t0 = time.perf_counter()
        out = update(clock)
        update_s.append(time.perf_counter() - t0)
        return out

    session.algorithm.update = timed
    faults0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
    session.run_rl()
    wall = time.perf_counter() - t0
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0
    frame = session.clock.frame
    session.close()
    return {"variant": variant, "frames": frame, "updates": len(update_s), "wall_s": wall,
            "update_ms": 1e3 * statistics.fmean(update_s) if update_s else float("nan"),
            "rest_ms_per_frame": 1e3 * (wall - sum(update_s)) / frame, "minor_page_faults": faults}


def main(argv: list[str] | None = None) -> int:
    """The command line (usage in the module docstring): runs the variants, writes the JSON; returns 0."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--algo", default="sac", choices=("sac", "sac_hopper", "dqn", "ppo", "ppo_atari"))
    ap.add_argument("--frames", type=int, default=1600)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=None, help="default bench/results/update_cost_{algo}.json")
    args = ap.parse_args(argv)
    from throughput import in_fresh_process

    out = Path(args.out or ROOT / f"bench/results/update_cost_{args.algo}.json")
    runs = []
    for r in range(args.rounds):
        for variant in VARIANTS:
            rec = in_fresh_process(run_variant, variant, args.algo, args.frames, args.seed)
            rec.update(round=r, load1=os.getloadavg()[0])
            runs.append(rec)
            print(f"round {r} {variant:5s}: {rec['updates']} updates, {rec['update_ms']:.2f} ms per update, "
                  f"{rec['rest_ms_per_frame']:.3f} ms per frame besides, {rec['minor_page_faults']:,} page faults",
                  flush=True)
    summary = {v: {k: statistics.median(x[k] for x in runs if x["variant"] == v)
                   for k in ("update_ms", "rest_ms_per_frame", "minor_page_faults")} for v in VARIANTS}
    summary["update_ratio_lab/glibc"] = summary["lab"]["update_ms"] / summary["glibc"]["update_ms"]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"algo": args.algo, "frames": args.frames, "rounds": args.rounds, "seed": args.seed,
                               "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "summary": summary, "runs": runs},
                              indent=1) + "\n")
    print(f"median ms per update: lab {summary['lab']['update_ms']:.2f}, glibc {summary['glibc']['update_ms']:.2f} "
          f"({summary['update_ratio_lab/glibc']:.3f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
