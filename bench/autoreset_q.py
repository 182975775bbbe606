"""Q-values of pre-failure states after DQN training with each ``env.autoreset`` mode (a diagnostic).

Trains one in-process session of SLM-Lab's ``benchmark/dqn/dqn_cartpole.json`` ``dqn_boltzmann_cartpole`` per
mode (``same_step``, ``next_step``), one torch thread, then reads the online net's max-Q over the replay's stored
observations: all of them, the pre-failure ones (``terminated`` rows: target r = 1, nothing after) and, under
``next_step``, the reset rows' (reward 0, not terminated: a finished episode's final observation followed by the
next episode's first). It asks whether the reset rows raise the values of the states before a failure, the
hypothesis of docs/BENCHMARKS.md for the next-step DQN CartPole miss. Each mode runs in its own process.

Usage:
    SLM_LAB_SPECS=... python bench/autoreset_q.py [--frames 100000] [--seed 1] [--out bench/results/autoreset_q.json]

Output: one JSON record per mode with ``final_ma`` (last train_df ``total_reward_ma``), ``rows`` (replay size),
``q_all_mean``, ``q_preterminal_mean`` / ``_median`` and their counts, ``q_reset_rows_mean``.

Raises:
    SystemExit: 2 when ``SLM_LAB_SPECS`` is unset or the spec file is missing.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODES = ("same_step", "next_step")


def measure(mode: str, frames: int, seed: int) -> dict[str, Any]:
    """Train one session in ``mode`` for ``frames`` frames and read max-Q over its replay (see module doc)."""
    import numpy as np
    import torch

    from orchestrator.session import Session
    from orchestrator.spec import load_spec
    torch.set_num_threads(1)
    spec_file = Path(os.environ["SLM_LAB_SPECS"]) / "v5.3.0/benchmark/dqn/dqn_cartpole.json"
    spec = load_spec(str(spec_file), "dqn_boltzmann_cartpole", [f"env.max_frame={frames}", f"env.autoreset={mode}"])
    session = Session(spec, seed)
    session.run_rl()
    algo = session.algorithm
    n = len(algo.memory)
    data = algo.memory.data
    term = data["terminated"][:n] > 0
    reset_rows = ~term & (data["reward"][:n] == 0)
    with torch.no_grad():
        q = algo.nets["net"](torch.as_tensor(data["obs"][:n]).float()).max(-1).values.numpy()
    out = {"mode": mode, "seed": seed, "frames": frames, "final_ma": session.train_rows[-1]["total_reward_ma"],
           "rows": n, "q_all_mean": float(q.mean()), "n_terminated": int(term.sum()),
           "q_preterminal_mean": float(q[term].mean()) if term.any() else None,
           "q_preterminal_median": float(np.median(q[term])) if term.any() else None,
           "n_reset_rows": int(reset_rows.sum()),
           "q_reset_rows_mean": float(q[reset_rows].mean()) if reset_rows.any() else None}
    session.close()
    return out


def main(argv: list[str] | None = None) -> int:
    """Run both modes side by side (one process each) and write their records to ``--out``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--frames", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "bench/results/autoreset_q.json"))
    ap.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)  # a child's one mode
    args = ap.parse_args(argv)
    specs = os.environ.get("SLM_LAB_SPECS")
    if not specs or not (Path(specs) / "v5.3.0/benchmark/dqn/dqn_cartpole.json").is_file():
        print("error: SLM_LAB_SPECS must name the directory holding v5.3.0/benchmark/dqn/dqn_cartpole.json",
              file=sys.stderr)
        return 2
    if args.mode:
        print(json.dumps(measure(args.mode, args.frames, args.seed)))
        return 0
    procs = [subprocess.Popen([sys.executable, __file__, "--mode", m, "--frames", str(args.frames), "--seed",
                               str(args.seed)], stdout=subprocess.PIPE, text=True, cwd=ROOT) for m in MODES]
    records = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    Path(args.out).write_text(json.dumps(records, indent=1) + "\n")
    for r in records:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
