"""Is a session on CUDA bitwise reproducible, and is its resume exact? Measured per workload, in-process.

For each case (a spec with small budgets, ``agent.net.gpu: true``): two uninterrupted runs A and B of the same
seed, and a run stopped at a mid-chunk frame, checkpointed through the store and resumed (R), as
``tests/orchestrator/session/test_resume_exact.py`` does on CPU. Compared: train_df (every column but ``wall_t`` /
``fps``) and ``weights_sha256``; ``repeat_equal`` (A == B) says whether the device itself repeats, ``resume_equal``
(A == R) whether the resume is exact, ``max_loss_diff`` the largest |loss A - loss R| over the log rows, and
``manifest_exact`` what R's checkpoint manifest claims. ``--deterministic`` runs everything with
``torch.use_deterministic_algorithms(True)`` (and cuDNN's deterministic flag, ``CUBLAS_WORKSPACE_CONFIG``
``:4096:8``). A last row times SLM-Lab's Atari PPO (Nature CNN, 8 envs) on the device: frames per second of
``Session.run_rl`` after one warm-up rollout.

Usage (on a CUDA host; the lab and its packages on PYTHONPATH):

    python bench/gpu_exact.py [--deterministic] [--out FILE.json]

Exit codes: 0 measured (whatever the outcome); 1 no CUDA device (and no ``--cpu``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ATARI, CARTPOLE, PENDULUM = (str(REPO / f"specs/benchmark/{f}.json") for f in ("atari", "cartpole", "pendulum"))
# (label, spec file, spec name, overrides, stop frame: no log or checkpoint boundary)
CASES: list[tuple[str, str, str, list[str], int]] = [
    ("ppo_atari (Nature CNN)", ATARI, "ppo_atari",
     ["env.num_envs=4", "env.max_frame=1024", "meta.log_frequency=256", "agent.algorithm.time_horizon=64",
      "agent.algorithm.minibatch_size=64", "agent.algorithm.training_epoch=2"], 392),
    ("dqn_atari (Nature CNN)", ATARI, "dqn_atari",
     ["env.num_envs=2", "env.max_frame=512", "meta.log_frequency=128", "agent.memory.max_size=1000",
      "agent.algorithm.training_start_step=128", "agent.net.update_frequency=128", "agent.memory.checkpoint=true"],
     300),
    ("ppo_cartpole (MLP)", CARTPOLE, "ppo_cartpole", ["env.max_frame=3200", "meta.log_frequency=400"], 1304),
    ("sac_pendulum (MLP)", PENDULUM, "sac_pendulum",
     ["env.max_frame=1200", "meta.log_frequency=200", "agent.algorithm.training_start_step=200",
      "agent.memory.checkpoint=true"], 652),
]


def compare(a: Any, b: Any) -> tuple[bool, float]:
    """(train_df and weights equal, max |loss difference|) of two finished sessions."""
    from tests.orchestrator.session.test_resume_exact import COMPARED

    da, db = COMPARED(a.train_df), COMPARED(b.train_df)
    equal = da.equals(db) and a.weights_sha256() == b.weights_sha256()
    diff = (da["loss"] - db["loss"]).abs().max() if len(da) == len(db) else float("inf")
    return equal, float(diff)


def run_case(label: str, spec_file: str, name: str, items: list[str], stop: int) -> dict[str, Any]:
    """A, B and R of one case (``stop``: the frame R is stopped at, a multiple of ``env.num_envs``).

    Returns:
        The row: ``repeat_equal``/``resume_equal`` (bool), ``repeat_max_loss_diff``/``max_loss_diff`` (loss units),
        ``manifest_exact``, ``device``, ``seconds`` (wall seconds of the three runs).

    Raises:
        AssertionError: R did not stop at ``stop`` or did not finish (``interrupted_then_resumed``'s checks).
    """
    from orchestrator.spec.load import load_spec
    from tests.orchestrator.session.test_resume_exact import interrupted_then_resumed, uninterrupted

    spec = load_spec(spec_file, name, [*items, "agent.net.gpu=true", "meta.random_seed=3"])
    start = time.perf_counter()
    a, b = uninterrupted(spec, 3), uninterrupted(spec, 3)
    with tempfile.TemporaryDirectory() as tmp:
        r = interrupted_then_resumed(spec, 3, stop, f"{tmp}/{name}_2026_01_01_000000")
    repeat_equal, repeat_diff = compare(a, b)
    resume_equal, resume_diff = compare(a, r)
    row = {"case": label, "device": str(a.algorithm.device), "repeat_equal": repeat_equal,
           "repeat_max_loss_diff": repeat_diff, "resume_equal": resume_equal, "max_loss_diff": resume_diff,
           "manifest_exact": r.to_checkpoint()[1]["exact"], "seconds": time.perf_counter() - start}
    for s in (a, b, r):
        s.close()
    return row


def atari_fps(frames: int) -> dict[str, Any]:
    """Frames per second of SLM-Lab's Atari PPO (Nature CNN, 8 sync envs) on CUDA after a warm-up rollout."""
    import torch

    from orchestrator.session.loop import Session
    from orchestrator.spec.load import load_spec

    spec = load_spec(ATARI, "ppo_atari", ["env.num_envs=8", f"env.max_frame={frames + 1024}",
                                          "meta.log_frequency=1024", "agent.net.gpu=true"])
    session = Session(spec, 1)
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    session.run_rl(until_frame=1024)  # one rollout and update: cuDNN picks its algorithms, caches warm
    sync()
    start = time.perf_counter()
    session.run_rl()
    sync()
    seconds = time.perf_counter() - start
    session.close()
    return {"case": "ppo_atari fps (Nature CNN, 8 envs)", "frames": frames, "seconds": seconds,
            "fps": frames / seconds}


def main(argv: list[str] | None = None) -> int:
    """Run every case; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deterministic", action="store_true", help="torch.use_deterministic_algorithms(True)")
    parser.add_argument("--fps-frames", type=int, default=8192, help="frames timed in the Atari fps row")
    parser.add_argument("--out", default=None, help="JSON file for the rows")
    parser.add_argument("--cpu", action="store_true", help="rehearse on a host without CUDA (nets on the CPU)")
    args = parser.parse_args(argv)
    if args.fps_frames <= 0:
        parser.error(f"--fps-frames must be > 0, got {args.fps_frames}")
    if args.deterministic:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # before the first cuBLAS handle
    sys.path.insert(0, str(REPO))
    import torch

    if not torch.cuda.is_available() and not args.cpu:
        print("FAIL no CUDA device", file=sys.stderr)
        return 1
    if args.deterministic:
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    torch.set_num_threads(1)
    rows = []
    for case in CASES:
        try:
            rows.append(run_case(*case))
        except Exception as err:  # a failing case is a finding, not the end of the probe
            rows.append({"case": case[0], "error": f"{type(err).__name__}: {err}"[:500]})
        print(json.dumps({"deterministic": args.deterministic, **rows[-1]}), flush=True)
    rows.append(atari_fps(args.fps_frames))
    print(json.dumps({"deterministic": args.deterministic, **rows[-1]}), flush=True)
    if args.out:
        from orchestrator.store import storage  # atomic: a kill mid-write leaves the old file
        storage.write_text(str(args.out), json.dumps({"deterministic": args.deterministic, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
