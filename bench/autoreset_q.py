"""Q-values of pre-failure states after DQN training with each ``env.autoreset`` mode (a diagnostic).

Trains one in-process session of SLM-Lab's ``benchmark/dqn/dqn_cartpole.json`` ``dqn_boltzmann_cartpole`` per
mode (``same_step``, ``next_step``), one torch thread, then reads the online net's max-Q over the replay's stored
observations: all of them, the pre-failure ones (``terminated`` rows: target r = 1, nothing after) and, under
``next_step``, the reset rows' (reward 0, not terminated: a finished episode's final observation followed by the
next episode's first). It asks whether the reset rows raise the values of the states before a failure, the
hypothesis of docs/algorithms/dqn.md "Results" for the next-step DQN CartPole miss. Each mode
runs in its own process.

Usage:
    SLM_LAB_SPECS=... python bench/autoreset_q.py [--frames 100000] [--seed 1] [--out bench/results/autoreset_q.json]

Output: one JSON record per mode with ``final_ma`` (last train_df ``total_reward_ma``), ``rows`` (replay size),
``q_all_mean``, ``q_preterminal_mean`` / ``_median`` and their counts, ``q_reset_rows_mean``.

Exit codes: 2 when ``SLM_LAB_SPECS`` is unset or the spec file is missing; 1 when a mode's run fails (``--out`` is
then left as it was).
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
SPEC_FILE = "v5.3.0/benchmark/dqn/dqn_cartpole.json"  # under $SLM_LAB_SPECS


def measure(mode: str, frames: int, seed: int) -> dict[str, Any]:
    """Train one session in ``mode`` for ``frames`` frames and read max-Q over its replay (see module doc)."""
    import numpy as np
    import torch

    from orchestrator.session.loop import Session
    from orchestrator.spec.load import load_spec
    torch.set_num_threads(1)
    spec = load_spec(str(Path(os.environ["SLM_LAB_SPECS"]) / SPEC_FILE), "dqn_boltzmann_cartpole",
                     [f"env.max_frame={frames}", f"env.autoreset={mode}"])
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


def positive_int(text: str) -> int:
    """An argparse type: an int > 0 (else argparse's exit 2 naming the flag)."""
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected an integer > 0, got {text}")
    return value


def main(argv: list[str] | None = None) -> int:
    """Run both modes side by side (one process each) and write their records to ``--out``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--frames", type=positive_int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "bench/results/autoreset_q.json"))
    ap.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)  # a child's one mode
    args = ap.parse_args(argv)
    specs = os.environ.get("SLM_LAB_SPECS")
    if not specs or not (Path(specs) / SPEC_FILE).is_file():
        print(f"error: SLM_LAB_SPECS must name the directory holding {SPEC_FILE}", file=sys.stderr)
        return 2
    if args.mode:
        print(json.dumps(measure(args.mode, args.frames, args.seed)))
        return 0
    procs = [subprocess.Popen([sys.executable, __file__, "--mode", m, "--frames", str(args.frames), "--seed",
                               str(args.seed)], stdout=subprocess.PIPE, text=True, cwd=ROOT) for m in MODES]
    outputs = [p.communicate()[0] for p in procs]
    failed = [m for m, p in zip(MODES, procs) if p.returncode != 0]
    if failed:  # the child's traceback is on stderr already; nothing is written
        print(f"error: the {', '.join(failed)} run failed; {args.out} left as it was", file=sys.stderr)
        return 1
    records = [json.loads(out.strip().splitlines()[-1]) for out in outputs]
    from orchestrator.store import storage
    storage.write_json(args.out, records)  # atomic: a kill mid-write leaves the old file
    for r in records:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
