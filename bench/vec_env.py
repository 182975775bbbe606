"""Vector env stepping alone: EnvPool against gymnasium's sync and async vector envs, SLM-Lab's Atari preprocessing.

Each configuration builds the session's vector env exactly as a session does (``envs.make.make_env`` with
``env.vectorization`` sync / async / envpool, ``meta.resources.num_cpus`` = threads), resets it with the session's
seeds, warms up for ``--warmup`` steps, then times ``--steps`` vector steps of uniformly random actions (drawn
before the timer starts). No agent, no memory: this is the env's share of a session's time. Observations are
what the session gets: (N, 4, 84, 84) uint8 stacks of 84x84 grayscale frames at frame skip 4, sticky actions 0.25,
life-loss terminations and clipped rewards for training.

Threads: ``sync`` steps every sub-env in this process (one thread); ``async`` runs one process per sub-env (the OS
spreads them over the cores; reported with threads = N); ``envpool`` runs ``--threads`` C++ worker threads. The
ratio reported is EnvPool's rate over gymnasium's best (sync or async).

Reported per configuration: agent steps per second (``steps_per_s``, frames of the lab's clock: N per vector step)
and emulator frames per second (x frame skip). Rounds alternate over the configurations, the median is kept.

Usage:
    python bench/vec_env.py [--env ALE/Pong-v5] [--num-envs 8] [--threads 1,2] [--steps 2000] [--rounds 3]
        [--out bench/results/vec_env.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envs.make import EnvSpec, make_env, sub_env_seeds  # noqa: E402


def measure(env_id: str, vectorization: str, num_envs: int, threads: int, steps: int, warmup: int,
            seed: int = 0) -> dict[str, Any]:
    """Agent steps per second of ``steps`` random vector steps of one vector env (built and warmed up untimed)."""
    spec = EnvSpec(env_id, max_frame=10**9, num_envs=num_envs, vectorization=vectorization)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = make_env(spec, seed, num_cpus=threads)
    env.reset(seed=sub_env_seeds(seed, num_envs))
    env.action_space.seed(seed)
    actions = [env.action_space.sample() for _ in range(warmup + steps)]
    for act in actions[:warmup]:
        env.step(act)
    start = time.perf_counter()
    for act in actions[warmup:]:
        env.step(act)
    seconds = time.perf_counter() - start
    env.close()
    return {"vectorization": vectorization, "threads": threads, "num_envs": num_envs, "seconds": seconds,
            "steps_per_s": steps * num_envs / seconds}


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else ``platform.processor()`` or the machine type."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def configurations(env_id: str, threads: list[int], num_envs: int) -> list[tuple[str, int]]:
    """(vectorization, threads) pairs: sync (one thread), async (N processes), envpool per thread count; EnvPool
    alone for ids only it has (``playground/...``)."""
    gym_path = [] if env_id.startswith("playground/") else [("sync", 1), ("async", num_envs)]
    return gym_path + [("envpool", t) for t in threads]


def main(argv: list[str] | None = None) -> int:
    """Run the rounds, print one line per configuration and the EnvPool ratios; write ``--out``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", default="ALE/Pong-v5")
    ap.add_argument("--num-envs", type=int, default=8)
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (async: processes are N)")
    ap.add_argument("--steps", type=int, default=2000, help="timed vector steps per configuration")
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--frame-skip", type=int, default=4, help="emulator frames per agent step (Atari), for the report")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")]
    runs: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.rounds):
        for vec, t in configurations(args.env, threads, args.num_envs):
            row = measure(args.env, vec, args.num_envs, t, args.steps, args.warmup)
            runs.setdefault((vec, t), []).append(row["steps_per_s"])
    rows = []
    for (vec, t), values in runs.items():
        med = statistics.median(values)
        rows.append({"vectorization": vec, "threads": t, "steps_per_s": med, "emulator_fps": med * args.frame_skip,
                     "runs": values})
        print(f"{vec:8s} threads={t} steps/s={med:8.0f} emulator frames/s={med * args.frame_skip:8.0f}")
    best_gym = max((r["steps_per_s"] for r in rows if r["vectorization"] != "envpool"), default=None)
    for r in rows if best_gym else ():
        if r["vectorization"] == "envpool":
            r["x_best_gymnasium"] = r["steps_per_s"] / best_gym
            print(f"envpool threads={r['threads']}: {r['x_best_gymnasium']:.2f}x gymnasium's best (sync or async)")
    out = {"env": args.env, "num_envs": args.num_envs, "steps": args.steps, "rounds": args.rounds,
           "machine": f"{cpu_model()}, {os.cpu_count()} CPUs", "load1": os.getloadavg()[0],
           "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    sys.exit(main())
