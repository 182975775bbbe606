"""Population-based training (PBT and PB2) against random search over the same search section, at equal frames.

Both methods run ``lab SPEC NAME search`` in a subprocess (a fresh local Ray each) with the same spec, search
section, ``meta.max_trial`` trials of ``meta.max_session`` sessions, ``env.max_frame`` frames per session,
``meta.random_seed`` and CPUs per session:

* ``random``: the search section sampled at random (Tune's built-in generator, ``--search-alg basic``), every trial
  trained with its sampled values from frame 0 to ``max_frame``;
* ``pbt``: the same section as PBT's initial samples and resample distributions
  (``meta.search_scheduler: {"name": "PBT", "perturbation_interval": max_frame / generations}``, the other PBT keys
  at their defaults), so every trial is trained to ``max_frame`` in ``generations`` synchronous generations;
* ``pb2``: the same with ``"name": "PB2"``: the explored values are the picks of PB2's Gaussian-process bandit
  (``orchestrator.search.pb2``) instead of perturbations.

The task is one where the initial values are mostly poor: PPO with a learning rate drawn log-uniformly over a range
mostly too small (``TASKS``), the lr decaying linearly to zero at ``max_frame`` and the clip range to zero as well.

Recorded per method: the final ``total_reward_ma`` (mean return of the last ``meta.ma_window`` episodes, the last
train_df row) of every session of every trial; their interquartile mean with a 95% stratified-bootstrap interval
over sessions (``orchestrator.report.stats``); the best trial's final score (mean over its sessions); frames per
session and in all; wall seconds of the whole ``search`` command; load average before and after. The PBT lineage
graph (``graph/{name}_pbt_lineage.png``) is copied to ``{img_dir}/{method}_lineage_{task}.png``. Results are
merged into ``--out`` by task and, where the task's budget (trials, sessions, frames, generations, seed) is the one
recorded there, by method; another budget replaces the task's record.

Usage::

    python bench/pbt_vs_random.py [--task cartpole] [--trials 8] [--sessions 2] [--max-frame 60000]
        [--generations 10] [--seed 1] [--methods pbt,pb2,random] [--data-dir data] [--img-dir docs/img]
        [--out bench/results/pbt_vs_random.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.vec_env import cpu_model  # noqa: E402
from orchestrator.report.stats import bootstrap_ci, iqm  # noqa: E402

CPU_PER_SESSION = 0.5
SCHEDULERS = {"pbt": "PBT", "pb2": "PB2"}  # method -> meta.search_scheduler name
METHODS = (*SCHEDULERS, "random")
BUDGET = ("trials", "sessions", "max_frame", "generations", "seed")  # a record's keys that make results comparable

# task -> (spec file, spec name, search section, extra overrides as "KEY=VALUE" with {F} = max_frame)
TASKS: dict[str, tuple[str, str, dict[str, Any], list[str]]] = {
    "cartpole": ("specs/benchmark/cartpole.json", "ppo_cartpole",
                 {"agent.net.optim_spec.lr__loguniform": [1e-6, 1e-3]},
                 ["agent.net.lr_scheduler_spec.frame={F}", "agent.algorithm.clip_eps_spec.end_step={F}"]),
}


def lab_command(task: str, method: str, args: argparse.Namespace, run_name: str) -> list[str]:
    """The ``lab ... search`` command of one method (``pbt``, ``pb2`` or ``random``) for ``task``."""
    spec_file, spec_name, search, extra = TASKS[task]
    interval = args.max_frame // args.generations
    sets = [f"meta.max_trial={args.trials}", f"meta.max_session={args.sessions}", f"env.max_frame={args.max_frame}",
            f"meta.log_frequency={args.log_frequency}", f"meta.checkpoint_frequency={args.log_frequency}",
            f"meta.random_seed={args.seed}",
            "meta.resources=" + json.dumps({"num_cpus": CPU_PER_SESSION, "num_gpus": 0}),
            "search=" + json.dumps(search)] + [s.format(F=args.max_frame) for s in extra]
    if method in SCHEDULERS:
        sets.append("meta.search_scheduler=" + json.dumps({"name": SCHEDULERS[method],
                                                           "perturbation_interval": interval}))
    cmd = [sys.executable, str(ROOT / "run_lab.py"), spec_file, spec_name, "search", "--quiet",
           "--data-dir", str(args.data_dir), "--name", run_name]
    if method == "random":
        cmd += ["--search-alg", "basic"]
    for s in sets:
        cmd += ["-s", s]
    return cmd


def final_scores(predir: Path, trials: int, sessions: int, max_frame: int) -> np.ndarray:
    """(trials, sessions) final ``total_reward_ma`` of every session (last train_df row, which must be at
    ``max_frame``).

    Raises:
        RuntimeError: a session's train_df is missing or ends before ``max_frame``.
    """
    out = np.empty((trials, sessions))
    for t in range(trials):
        for s in range(sessions):
            path = predir / f"t{t}" / f"s{s}" / "train_df.parquet"
            if not path.exists():
                raise RuntimeError(f"{path}: missing")
            last = pd.read_parquet(path).iloc[-1]
            if int(last["frame"]) != max_frame:
                raise RuntimeError(f"{path}: ends at frame {int(last['frame'])}, expected {max_frame}")
            out[t, s] = float(last["total_reward_ma"])
    return out


def run_method(task: str, method: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run one method's search and summarize it (see the module docstring)."""
    run_name = f"pbt_vs_random_{task}_{method}_{time.strftime('%Y%m%d_%H%M%S')}"
    cmd = lab_command(task, method, args, run_name)
    predir = Path(args.data_dir) / run_name
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall_s = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{method}: lab exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    scores_TS = final_scores(predir, args.trials, args.sessions, args.max_frame)
    sessions = scores_TS.ravel()
    low, high = bootstrap_ci(sessions, seed=0)
    trial_scores = scores_TS.mean(axis=1)
    best = int(np.argmax(trial_scores))
    values = {t: json.loads((predir / f"t{t}" / "trial.json").read_text())["values"] for t in range(args.trials)}
    result = {
        "method": method, "predir": _relative(predir),
        "command": " ".join(_quote(_relative(Path(c)) if c.startswith(str(ROOT)) else c) for c in cmd[1:]),
        "session_scores": scores_TS.round(4).tolist(),
        "iqm": round(iqm(sessions), 3), "iqm_ci95": [round(low, 3), round(high, 3)],
        "best_trial": best, "best_trial_score": round(float(trial_scores[best]), 3),
        "best_trial_values": values[best], "final_values": {str(t): v for t, v in values.items()},
        "frames_per_session": args.max_frame, "frames_total": args.max_frame * args.trials * args.sessions,
        "wall_s": round(wall_s, 1), "load1_before": round(load_before, 2), "load1_after": round(os.getloadavg()[0], 2),
        "date": time.strftime("%Y-%m-%d"), "machine": machine(),
    }
    if method in SCHEDULERS:
        records = [json.loads(line) for line in (predir / "pbt.jsonl").read_text().splitlines() if line.strip()]
        result["generations"] = args.generations
        result["perturbation_interval"] = args.max_frame // args.generations
        result["exploits"] = sum(r["donor"] is not None for r in records)
        png = predir / "graph" / f"{TASKS[task][1]}_pbt_lineage.png"
        if png.exists() and args.img_dir:
            dst = Path(args.img_dir) / f"{method}_lineage_{task}.png"
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(png, dst)
            result["lineage_graph"] = _relative(dst)
    return result


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_absolute() and ROOT in path.parents else str(path)


def _quote(arg: str) -> str:
    return f"'{arg}'" if any(c in arg for c in " {}\"[]") else arg


def merge(existing: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    """``existing`` results (task -> record) with ``record`` (one task's) merged in: its methods added to the task's
    earlier ones when the ``BUDGET`` keys are equal, else the task's record replaced."""
    before = existing.get(record["task"])
    if before and all(before.get(k) == record[k] for k in BUDGET):
        record = {**record, "methods": {**before["methods"], **record["methods"]}}
    return {**existing, record["task"]: record}


def machine() -> dict[str, Any]:
    """The machine a run measured on."""
    return {"cpu": cpu_model(), "cpus": os.cpu_count(), "python": platform.python_version()}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; prints one line per method and writes ``--out``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", choices=sorted(TASKS), default="cartpole")
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--sessions", type=int, default=2)
    ap.add_argument("--max-frame", type=int, default=60000, help="frames per session")
    ap.add_argument("--generations", type=int, default=10, help="PBT generations (max_frame must divide evenly)")
    ap.add_argument("--log-frequency", type=int, default=2000, help="frames between log rows and checkpoints")
    ap.add_argument("--seed", type=int, default=1, help="meta.random_seed")
    ap.add_argument("--methods", default="pbt,pb2,random", help=f"comma-separated, of {', '.join(METHODS)}")
    ap.add_argument("--data-dir", type=Path, default=ROOT / "data")
    ap.add_argument("--img-dir", type=Path, default=ROOT / "docs" / "img", help="where the lineage PNG is copied")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "pbt_vs_random.json")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.methods.split(",")) - set(METHODS))
    if unknown:
        ap.error(f"--methods: unknown {', '.join(unknown)}; expected some of {', '.join(METHODS)}")
    interval = args.max_frame // args.generations
    if args.max_frame % args.generations or interval % args.log_frequency:
        ap.error(f"--max-frame {args.max_frame} / --generations {args.generations} must be a whole multiple of "
                 f"--log-frequency {args.log_frequency}")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    args.data_dir = args.data_dir.resolve()
    results = {}
    for method in args.methods.split(","):
        r = results[method] = run_method(args.task, method, args)
        print(f"{method:6s} IQM {r['iqm']:.1f} [{r['iqm_ci95'][0]:.1f}, {r['iqm_ci95'][1]:.1f}]  best trial "
              f"t{r['best_trial']} {r['best_trial_score']:.1f}  {r['frames_total']:,} frames  {r['wall_s']:.0f} s  "
              f"sessions {sorted(round(x, 1) for row in r['session_scores'] for x in row)}", flush=True)
    record = {"task": args.task, "spec": TASKS[args.task][:2], "search": TASKS[args.task][2],
              "trials": args.trials, "sessions": args.sessions, "max_frame": args.max_frame,
              "generations": args.generations, "seed": args.seed, "cpu_per_session": CPU_PER_SESSION,
              "date": time.strftime("%Y-%m-%d"), "machine": machine(), "methods": results}
    existing = json.loads(args.out.read_text()) if args.out.exists() else {}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(merge(existing, record), indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
