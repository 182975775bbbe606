"""Time-to-solve benchmark: CartPole-v1 benchmark specs, several seeds, in-process sessions.

For each spec and seed it runs one ``orchestrator.session.Session`` to the spec's ``max_frame``
with ``torch.set_num_threads(1)`` and records

* ``solve_frame`` / ``solve_wall_s``: frame and training wall seconds of the first train_df row
  whose ``total_reward_ma`` (mean return of the last ``meta.ma_window`` = 20 episodes) is
  >= the threshold (475); null if never reached. Rows come every ``meta.log_frequency`` frames,
  so ``solve_frame`` is a multiple of it (an upper bound of the exact crossing);
* ``final_ma``: ``total_reward_ma`` of the last row; ``best_ma``: its maximum over rows;
* ``fps``: frames / training wall seconds of the whole session; ``wall_s``; ``opt_steps``.

Sessions run one after another in this process (one benchmark process at a time on a shared box).
Seeds are the trial-0 session seeds of the spec: ``meta.random_seed + s`` for s < ``--seeds``.

Usage:
    python bench/time_to_solve.py [--specs ppo_cartpole dqn_cartpole ...] [--seeds 3]
        [--spec-file specs/benchmark/cartpole.json] [--out bench/results/time_to_solve.json]
        [-s agent.net.optim_spec.lr=0.001 ...] [--stop-on-solve]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.vec_env import cpu_model  # noqa: E402
from orchestrator.session.loop import Session  # noqa: E402
from orchestrator.spec.load import load_spec  # noqa: E402
from orchestrator.store import storage  # noqa: E402
from orchestrator.store.predir import session_seed  # noqa: E402

DEFAULT_SPECS = ("ppo_cartpole", "dqn_cartpole", "ddqn_cartpole", "reinforce_cartpole")
GOALS = {"ppo_cartpole": 100_000, "dqn_cartpole": 100_000, "ddqn_cartpole": 100_000,
         "reinforce_cartpole": 200_000}  # frames to reach the threshold (issue 2)
THRESHOLD = 475.0


class _StopSession(Exception):
    pass


def run_one(spec: dict[str, Any], seed: int, threshold: float, stop_on_solve: bool) -> dict[str, Any]:
    """Run one session; return its time-to-solve record."""
    solved: dict[str, Any] = {}

    def on_log(sess: Session, row: dict[str, Any]) -> None:
        ma = row["total_reward_ma"]
        if not solved and ma == ma and ma >= threshold:
            solved.update(frame=row["frame"], wall_s=row["wall_t"], epi=row["epi"])
            if stop_on_solve:
                raise _StopSession

    session = Session(spec, seed)
    t0 = time.perf_counter()
    try:
        session.run_rl(on_log=on_log)
    except _StopSession:
        pass
    loop_s = time.perf_counter() - t0
    session.close()
    rows = session.train_rows
    last = rows[-1]
    mas = [r["total_reward_ma"] for r in rows if r["total_reward_ma"] == r["total_reward_ma"]]
    return {
        "seed": seed, "solve_frame": solved.get("frame"), "solve_wall_s": solved.get("wall_s"),
        "solve_epi": solved.get("epi"), "final_frame": last["frame"], "final_ma": last["total_reward_ma"],
        "best_ma": max(mas) if mas else None, "episodes": last["epi"], "opt_steps": last["opt_step"],
        "wall_s": loop_s, "fps": last["frame"] / loop_s,
        "curve": [[r["frame"], round(r["total_reward_ma"], 1)] for r in rows],
    }


def machine_info() -> dict[str, Any]:
    """CPU, versions and load averages (the box is shared; wall-clock numbers depend on load)."""
    import gymnasium
    import numpy
    return {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "gymnasium": gymnasium.__version__, "numpy": numpy.__version__,
            "torch_threads": torch.get_num_threads()}


def fmt(v: Any, spec: str = ",.0f") -> str:
    """``v`` formatted with ``spec``; ``-`` for None."""
    return "-" if v is None else format(v, spec)


def markdown(results: list[dict[str, Any]]) -> str:
    """Per spec and seed rows plus a per-spec summary line."""
    lines = ["| spec | seed | solve frame | solve wall s | goal (frames) | met | final ma-20 | best ma-20 "
             "| fps | wall s | load1 at start |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        goal = GOALS.get(r["spec"])
        met = r["solve_frame"] is not None and (goal is None or r["solve_frame"] <= goal)
        lines.append(f"| {r['spec']} | {r['seed']} | {fmt(r['solve_frame'])} "
                     f"| {fmt(r['solve_wall_s'], '.1f')} | {fmt(goal)} | {'yes' if met else 'no'} "
                     f"| {r['final_ma']:.1f} | {fmt(r['best_ma'], '.1f')} | {r['fps']:,.0f} "
                     f"| {r['wall_s']:.1f} | {r['load_start'][0]:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """The command line (usage in the module docstring): runs the benchmark, writes its results; returns 0."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--specs", nargs="+", default=list(DEFAULT_SPECS))
    ap.add_argument("--seeds", type=int, default=3, help="sessions (seeds) per spec")
    ap.add_argument("--spec-file", default=str(ROOT / "specs/benchmark/cartpole.json"))
    ap.add_argument("--out", default=str(ROOT / "bench/results/time_to_solve.json"))
    ap.add_argument("-s", "--set", dest="overrides", action="append", default=[],
                    help="spec override key.path=value (applied to every spec)")
    ap.add_argument("--threshold", type=float, default=THRESHOLD)
    ap.add_argument("--stop-on-solve", action="store_true", help="end a session at its solve row")
    args = ap.parse_args(argv)

    torch.set_num_threads(1)
    results = []
    for name in args.specs:
        spec = load_spec(args.spec_file, name, args.overrides)
        for s in range(args.seeds):
            seed = session_seed(spec["meta"]["random_seed"], 0, s)
            load_start = os.getloadavg()
            rec = run_one(spec, seed, args.threshold, args.stop_on_solve)
            rec.update(spec=name, load_start=load_start, load_end=os.getloadavg())
            results.append(rec)
            print(f"{name} seed {seed}: solve_frame={rec['solve_frame']} solve_wall_s="
                  f"{fmt(rec['solve_wall_s'], '.1f')} final_ma={rec['final_ma']:.1f} fps={rec['fps']:.0f} "
                  f"load1={load_start[0]:.2f}", flush=True)
    out = {"threshold": args.threshold, "ma_window": 20, "spec_file": os.path.relpath(args.spec_file, ROOT),
           "overrides": args.overrides, "stop_on_solve": args.stop_on_solve, "machine": machine_info(),
           "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "results": results}
    storage.write_text(str(args.out), json.dumps(out, indent=1) + "\n")
    print(markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
