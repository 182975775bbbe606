"""Node frames/s of K seeds of one spec trained as one batched program against the same K seeds as separate
sessions, side by side in one process, one torch thread.

Per round (the variants alternate, so machine load hits both alike):

- ``separate``: K ``Session``s (the lab's spec, seeds ``seed .. seed+K-1``, session indexes 0..K-1), each run with
  ``Session.run_rl`` to ``--frames``, one after the other: what K session processes sharing a core compute;
- ``batched``: one ``SessionGroup`` (``orchestrator.session.batched``) of the same K seeds to the same frame.

Both include acting, the env steps, the rollout, the updates and the train_df rows (no evaluation); building the
sessions is not timed. Measured: wall seconds and CPU seconds (``time.process_time``) of each variant, and the
CPU seconds spent in updates and in acting (the rest: env steps, rollout, log rows); node frames/s = K * frames /
wall. On a shared machine the CPU-second ratios are the steadier ones. Ratios are per round (batched over
separate, in the same round), and the summary gives their median and range over the rounds.

Peak memory: ``--rss`` instead runs one separate session (one process, one seed) and one group of K seeds (one
process) to ``--frames`` in fresh child processes and compares the group's peak RSS per seed with the single
session's (separate sessions are separate processes, each with its own interpreter, torch and envs).

Usage:
    python bench/batched_seeds.py [--spec ppo_cartpole] [--seeds 8] [--frames 4096] [--rounds 3]
        [--override key=value ...] [--out bench/results/batched_seeds_{spec}.json] [--rss]

Specs: any of ``specs/benchmark/*.json`` that runs batched (PPO, A2C, REINFORCE with ``OnPolicyBatchReplay``, the
DQN family, SAC), e.g. ``--spec dqn_cartpole`` (its ``training_start_step`` of 1,000 frames: the updates start
there), or Atari PPO with its shared Nature CNN, ``--spec ppo_atari --seeds 4 --frames 2048`` (per seed one rollout
of 16 envs x 128 steps and its update).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SPEC_DIR = ROOT / "specs" / "benchmark"


def spec_file(name: str) -> Path:
    """The benchmark spec file (``specs/benchmark/*.json``) that defines spec ``name``.

    Raises:
        SystemExit: no benchmark file defines it.
    """
    for path in sorted(SPEC_DIR.glob("*.json")):
        if name in json.loads(path.read_text()):
            return path
    raise SystemExit(f"no spec '{name}' in {SPEC_DIR}/*.json")


def timed(algo: Any, method: str, spent: list[float]) -> None:
    """Wrap ``algo.<method>`` so that each call's CPU seconds (``time.process_time``) are appended to ``spent``."""
    fn = getattr(algo, method)

    def call(*args: Any, **kwargs: Any) -> Any:
        t0 = time.process_time()
        out = fn(*args, **kwargs)
        spent.append(time.process_time() - t0)
        return out

    setattr(algo, method, call)


def run_variant(variant: str, spec: dict[str, Any], seeds: list[int], frames: int) -> dict[str, Any]:
    """One timed run of ``variant`` (``separate`` or ``batched``) of ``seeds`` to ``frames`` frames per seed."""
    from orchestrator.session.batched import SessionGroup
    from orchestrator.session.loop import Session

    spent: list[float] = []
    acting: list[float] = []
    if variant == "separate":
        sessions = [Session(spec, seed, session=k) for k, seed in enumerate(seeds)]
        for s in sessions:
            timed(s.algorithm, "update", spent)
            timed(s.algorithm, "act", acting)
        runs = [lambda s=s: s.run_rl(until_frame=frames) for s in sessions]
        closers, clocks = sessions, [s.clock for s in sessions]
    else:
        group = SessionGroup(spec, seeds)
        timed(group.batch, "update", spent)
        timed(group.batch, "act", acting)
        runs, closers, clocks = [lambda: group.run_rl(until_frame=frames)], [group], [s.clock for s in group.sessions]
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for run in runs:
        run()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    total = sum(c.frame for c in clocks)
    for c in closers:
        c.close()
    return {"variant": variant, "frames": total, "wall_s": wall, "cpu_s": cpu, "update_cpu_s": sum(spent),
            "act_cpu_s": sum(acting), "node_fps": total / wall, "cpu_us_per_frame": 1e6 * cpu / total}


RSS_CHILD = """
import json, resource, sys, torch
torch.set_num_threads(1)
from orchestrator.session.batched import SessionGroup
from orchestrator.session.loop import Session
from orchestrator.spec.load import load_spec
spec_file, name, frames = sys.argv[1], sys.argv[2], int(sys.argv[3])
seeds, overrides = [int(x) for x in sys.argv[4].split(",")], sys.argv[5:]
spec = load_spec(spec_file, name, ["meta.rigorous_eval=0", f"env.max_frame={frames}", *overrides])
run = Session(spec, seeds[0]) if len(seeds) == 1 else SessionGroup(spec, seeds)
run.run_rl()
print(json.dumps({"seeds": len(seeds), "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def peak_rss(spec: str, seeds: list[int], frames: int, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Peak RSS (MB, ``ru_maxrss``) of a fresh process that runs one session (one seed) or a group (several) of
    ``spec`` with ``key=value`` ``overrides``."""
    import subprocess

    out = subprocess.run([sys.executable, "-c", RSS_CHILD, str(spec_file(spec)), spec, str(frames),
                          ",".join(map(str, seeds)), *overrides],
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    """The command line (usage in the module docstring): runs the rounds, prints the ratios, writes the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default="ppo_cartpole")
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--frames", type=int, default=4096, help="frames per seed per run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=None, help="default bench/results/batched_seeds_{spec}.json")
    ap.add_argument("--rss", action="store_true", help="compare peak RSS per seed instead (fresh processes)")
    ap.add_argument("--override", action="append", default=[], help="key=value spec override (repeatable)")
    args = ap.parse_args(argv)
    seeds = list(range(args.seed, args.seed + args.seeds))
    if args.rss:
        single = peak_rss(args.spec, seeds[:1], args.frames, args.override)
        group = peak_rss(args.spec, seeds, args.frames, args.override)
        per_seed = group["max_rss_mb"] / len(seeds)
        print(f"peak RSS: one separate session {single['max_rss_mb']:.0f} MB; a group of {len(seeds)} "
              f"{group['max_rss_mb']:.0f} MB, {per_seed:.0f} MB per seed ({per_seed / single['max_rss_mb']:.2f}x)")
        return 0
    import torch

    from orchestrator.spec.load import load_spec

    torch.set_num_threads(1)
    spec = load_spec(str(spec_file(args.spec)), args.spec, ["meta.rigorous_eval=0", f"env.max_frame={args.frames}",
                                                             *args.override])
    run_variant("separate", spec, seeds[:2], 512)  # warm-up: lazy imports, allocator, first kernels
    run_variant("batched", spec, seeds[:2], 512)
    runs = []
    for r in range(args.rounds):
        pair = {}
        for variant in (("separate", "batched") if r % 2 == 0 else ("batched", "separate")):
            rec = run_variant(variant, spec, seeds, args.frames)
            rec.update(round=r, load1=os.getloadavg()[0])
            runs.append(rec)
            pair[variant] = rec
            print(f"round {r} {variant:8s}: {rec['node_fps']:8.0f} node frames/s, {rec['cpu_us_per_frame']:6.1f} "
                  f"CPU us/frame (updates {rec['update_cpu_s']:.2f}, acting {rec['act_cpu_s']:.2f} of "
                  f"{rec['cpu_s']:.2f} CPU s; load {rec['load1']:.1f})", flush=True)
        sep, bat = pair["separate"], pair["batched"]
        for rec in pair.values():
            rec["fps_ratio"] = bat["node_fps"] / sep["node_fps"]
            rec["cpu_ratio"] = sep["cpu_s"] / bat["cpu_s"]
            rec["update_ratio"] = sep["update_cpu_s"] / bat["update_cpu_s"]
            rec["act_ratio"] = sep["act_cpu_s"] / bat["act_cpu_s"]
            rec["agent_ratio"] = (sep["update_cpu_s"] + sep["act_cpu_s"]) / (bat["update_cpu_s"] + bat["act_cpu_s"])
            rec["rest_ratio"] = (sep["cpu_s"] - sep["update_cpu_s"] - sep["act_cpu_s"]) / \
                (bat["cpu_s"] - bat["update_cpu_s"] - bat["act_cpu_s"])
    batched = [x for x in runs if x["variant"] == "batched"]
    summary = {key: {"median": statistics.median(x[key] for x in batched), "min": min(x[key] for x in batched),
                     "max": max(x[key] for x in batched)}
               for key in ("fps_ratio", "cpu_ratio", "update_ratio", "act_ratio", "agent_ratio", "rest_ratio")}
    out = Path(args.out or ROOT / f"bench/results/batched_seeds_{args.spec}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"spec": args.spec, "overrides": args.override, "seeds": args.seeds,
                               "frames_per_seed": args.frames,
                               "rounds": args.rounds, "torch_threads": 1, "cpu_count": os.cpu_count(),
                               "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "summary": summary, "runs": runs},
                              indent=1) + "\n")
    for key, label in (("fps_ratio", "node frames/s"), ("cpu_ratio", "CPU s per frame (inverse)"),
                       ("update_ratio", "update CPU s (inverse)"), ("act_ratio", "acting CPU s (inverse)"),
                       ("agent_ratio", "acting + update CPU s (inverse)"),
                       ("rest_ratio", "env steps, rollout, log CPU s (inverse)")):
        s = summary[key]
        print(f"batched / separate, {label}: {s['median']:.2f}x (rounds {s['min']:.2f}-{s['max']:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
