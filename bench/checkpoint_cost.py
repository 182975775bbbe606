"""Checkpoint cost as a fraction of training time at the default cadence, per benchmark spec, one session
in-process (no Ray), with the peer cadence "a checkpoint at every log row" (``meta.checkpoint_frequency`` =
``log_frequency``, the lab's default before the time gate) measured in the same run.

The cost is the time the training thread spends on checkpoints: serializing the session plus any wait for the
previous background write (``SessionRunner.events``' ``seconds``; the tracking writes of the rows are not counted,
see ``bench/tracking_cost.py``). Default cadence: a log row is checkpointed once ``meta.checkpoint_interval_s`` (1 s)
of training, and 199x the previous checkpoint's cost, passed since the previous checkpoint
(``orchestrator.session.runner.checkpoint_gap_s``), unless the spec sets ``meta.checkpoint_frequency`` (the Atari
specs: every 100k frames). A spec whose cadence does not fit the frame budget (Atari) is run with the probe cadence
``--probe-frequency`` to measure the cost of one checkpoint; its fraction at the default cadence is then projected as
``ms per checkpoint / (checkpoint_frequency / fps)`` (column ``basis``: ``projected``). Usage:

    python bench/checkpoint_cost.py [--specs cartpole.json:ppo_cartpole atari.json ...] [--all]
        [--frames-scale 1.0] [--out bench/results/checkpoint_cost.json]

``--specs`` takes ``FILE`` (every spec of a file in specs/benchmark/) or ``FILE:NAME``; without it a representative
set of every file runs (``CASES``); ``--all`` runs every spec of every file. ``--snapshot-ab`` instead times
``Session.to_checkpoint`` alone against the previous encoding (global RNG states as lists of ints, train_df converted
from every row at every checkpoint), interleaved in one process.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

import torch

from orchestrator.session.runner import SessionRunner, checkpoint_gap_s
from orchestrator.spec.load import load_spec
from orchestrator.spec.meta import MetaSpec
from orchestrator.store import storage

SPEC_DIR = "specs/benchmark"
FRAMES = {"cartpole.json": 30000, "pendulum.json": 10000, "box2d.json": 10000, "mujoco.json": 40000,
          "atari.json": 8000}  # per file, at least 4 log rows: several checkpoint intervals (Atari: probe checkpoints)
CASES = [  # (file, spec name, overrides)
    ("cartpole.json", "ppo_cartpole", []),
    ("cartpole.json", "reinforce_cartpole", []),
    ("cartpole.json", "a2c_gae_cartpole", []),
    ("cartpole.json", "dqn_cartpole", []),
    ("cartpole.json", "dqn_cartpole", ["agent.memory.checkpoint=true"]),
    ("pendulum.json", "ppo_pendulum", []),
    ("pendulum.json", "sac_pendulum", []),
    ("box2d.json", "ppo_lunar", []),
    ("box2d.json", "dqn_lunar", []),
    ("box2d.json", "ppo_bipedalwalker", []),
    ("mujoco.json", "ppo_hopper", []),
    ("atari.json", "ppo_atari", []),
    ("atari.json", "dqn_atari", []),
]
PEERS = {"default": [], "every log row": ["meta.checkpoint_frequency={log_frequency}"]}  # the old default cadence


def measure(file: str, name: str, overrides: list[str], peer: str, frames: int, probe_frequency: int) -> dict:
    """Train ``frames`` frames with checkpoints at the ``peer`` cadence (or the probe cadence when the spec's
    ``checkpoint_frequency`` exceeds ``frames``); return counts, seconds and the fraction at that cadence."""
    base = load_spec(os.path.join(SPEC_DIR, file), name, overrides)
    peer_overrides = [o.format(log_frequency=base["meta"]["log_frequency"]) for o in PEERS[peer]]
    spec = load_spec(os.path.join(SPEC_DIR, file), name, [f"env.max_frame={frames}", *overrides, *peer_overrides])
    meta = spec["meta"]
    default_frequency = meta.get("checkpoint_frequency")
    projected = bool(default_frequency) and default_frequency > frames // 2
    if projected:
        spec = load_spec(os.path.join(SPEC_DIR, file), name, [f"env.max_frame={frames}", *overrides,
                                                              f"meta.checkpoint_frequency={probe_frequency}"])
    root = tempfile.mkdtemp(prefix="ckpt_bench_")
    try:
        runner = SessionRunner(spec, os.path.join(root, f"{spec['name']}_2026_01_01_000000"), 0, 0, 1, resume=False)
        start, blocked, count = time.perf_counter(), 0.0, 0
        for event in runner.events():
            if event.kind == "checkpoint":
                blocked += event.seconds
                count += 1
        total = time.perf_counter() - start
        newest = runner.store.frame_uri(runner.store.frames()[-1])  # max_frame rounded up to whole vector steps
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(newest) for f in fs)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ms = 1000 * blocked / count
    if projected:  # the spec's own cadence: one checkpoint per default_frequency frames at this fps
        between_s = default_frequency / (frames / (total - blocked))
        fraction = ms / 1000 / (between_s + ms / 1000)
    else:
        between_s, fraction = (total - blocked) / count, blocked / total
    gap_s = checkpoint_gap_s(MetaSpec.of(spec))
    cadence = f"{default_frequency} frames" if default_frequency else f">= {gap_s:g} s, log rows"
    return {"spec": f"{file}:{' '.join([name, *overrides])}", "peer": peer, "frames": frames,
            "log_frequency": meta["log_frequency"], "cadence": f"{peer}: {cadence}",
            "basis": "projected" if projected else "measured", "checkpoints": count, "train_s": round(total, 2),
            "checkpoint_s": round(blocked, 3), "fraction_pct": round(100 * fraction, 2),
            "ms_per_checkpoint": round(ms, 1), "s_between_checkpoints": round(between_s, 2),
            "checkpoint_bytes": size, "load1": round(os.getloadavg()[0], 1)}


def snapshot_ab(name: str, frames: int, reps: int) -> dict:
    """Milliseconds of ``Session.to_checkpoint`` (min and median of ``reps``, interleaved) with the lab's encoding
    and with the previous one, for a session trained ``frames`` frames (its train_df holds every row)."""
    import random

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from orchestrator.session.loop import Session

    spec = load_spec(os.path.join(SPEC_DIR, "cartpole.json"), name, [f"env.max_frame={frames}"])
    s = Session(spec, 1)
    s.run_rl()
    new_state, new_rows = s.state_dict, s._train_parquet

    def old_state():
        state, np_state = new_state(), np.random.get_state()
        state["global_rng"] = {"python": random.getstate(), "torch": torch.get_rng_state(),
                               "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]]}
        return state

    class OneShot:
        def encode(self, rows):
            out = pa.BufferOutputStream()
            pq.write_table(pa.Table.from_pylist(rows).select(list(s.train_columns)), out)
            return out.getvalue().to_pybytes()

    times = {"new": [], "old": []}
    for i in range(reps):
        s.train_rows.append(dict(s.train_rows[-1], frame=s.train_rows[-1]["frame"] + 1))  # a new row per checkpoint
        for which in ("new", "old") if i % 2 else ("old", "new"):
            s.state_dict = new_state if which == "new" else old_state
            s._train_parquet = new_rows if which == "new" else OneShot()
            start = time.perf_counter()
            s.to_checkpoint()
            times[which].append(1000 * (time.perf_counter() - start))
    s.close()
    out = {"spec": name, "rows": len(s.train_rows), "load1": round(os.getloadavg()[0], 1)}
    for which, ts in times.items():
        ts.sort()
        out[f"{which}_min_ms"], out[f"{which}_median_ms"] = round(ts[0], 2), round(ts[len(ts) // 2], 2)
    return out


def cases(args: argparse.Namespace) -> list[tuple[str, str, list[str]]]:
    """The (file, name, overrides) to run from ``--specs``/``--all`` (default ``CASES``)."""
    if not args.specs and not args.all:
        return CASES
    picked = args.specs or sorted(os.listdir(SPEC_DIR))
    out = []
    for item in picked:
        file, _, name = item.partition(":")
        names = [name] if name else list(json.load(open(os.path.join(SPEC_DIR, file))))
        out += [(file, n, []) for n in names]
    return out


def main() -> None:
    """The command line (usage in the module docstring): runs the benchmark and writes its results file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--specs", nargs="*", default=None, help="FILE or FILE:NAME in specs/benchmark/")
    parser.add_argument("--all", action="store_true", help="every spec of every file in specs/benchmark/")
    parser.add_argument("--frames-scale", type=float, default=1.0, help="multiplies each file's frame budget")
    parser.add_argument("--probe-frequency", type=int, default=2000,
                        help="checkpoint_frequency used to measure specs whose own cadence exceeds the budget")
    parser.add_argument("--peers", nargs="*", default=list(PEERS), choices=list(PEERS))
    parser.add_argument("--snapshot-ab", type=int, default=0, metavar="FRAMES",
                        help="time to_checkpoint alone, new vs previous encoding, after FRAMES frames of CartPole")
    parser.add_argument("--out", default="bench/results/checkpoint_cost.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.snapshot_ab:
        for name in ("ppo_cartpole", "reinforce_cartpole"):
            print(snapshot_ab(name, args.snapshot_ab, 100), flush=True)
        return
    results = []
    print("| spec | cadence | basis | checkpoints | train s | checkpoint s | fraction (goal < 1%) | ms/ckpt "
          "| s between ckpts | bytes | load1 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for file, name, overrides in cases(args):
        meta = load_spec(os.path.join(SPEC_DIR, file), name, overrides)["meta"]
        explicit = meta.get("checkpoint_frequency")
        rows = 0 if explicit else 4 * meta["log_frequency"]  # several log rows (a frame cadence is probed instead)
        frames = int(max(FRAMES.get(file, 20000), rows) * args.frames_scale)
        for peer in args.peers if not explicit else ["default"]:  # the spec's own frame cadence: no peer
            r = measure(file, name, overrides, peer, frames, args.probe_frequency)
            results.append(r)
            # after every case, atomically: a long run stopped early keeps what it measured
            storage.write_text(args.out, json.dumps(results, indent=2))
            print(f"| {r['spec']} | {r['cadence']} | {r['basis']} | {r['checkpoints']} | {r['train_s']} "
                  f"| {r['checkpoint_s']} | {r['fraction_pct']}% | {r['ms_per_checkpoint']} "
                  f"| {r['s_between_checkpoints']} | {r['checkpoint_bytes']:,} | {r['load1']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
