"""GPU train -> kill -> resume check through the real CLI, with a CPU-only flow for hosts without CUDA.

Phases (each a ``python run_lab.py ...`` subprocess with its own embedded Ray; ``--workload cartpole``: PPO on
CartPole-v1, 2 sessions, 8 sub-envs; ``--workload atari``: SLM-Lab's Atari PPO (``specs/benchmark/atari.json``
``ppo_atari``, Nature CNN) on ALE/Pong-v5, 2 sessions of 8 sub-envs, optionally ``--precision bfloat16``; a
checkpoint every ``--log-frequency`` frames (``meta.checkpoint_frequency``: frames alone decide, so the kill
lands mid-run however fast the device); in the gpu flow the peak GPU memory of phases 1-2 (``nvidia-smi``,
both sessions on one GPU) is recorded):

1. ``train`` with ``agent.net.gpu: true`` and ``meta.resources.num_gpus: 0.5`` (gpu flow) or
   ``false`` / ``0`` (cpu flow); the driver is SIGKILLed (with its Ray processes, by PID) once both
   sessions have committed a checkpoint.
2. ``train@latest`` on the same devices, to ``--max-frame``.
3. gpu flow only: restore the newest checkpoint of session 0 in-process on CUDA and train one more
   rollout (the algorithm's device must be ``cuda``).
4. ``enjoy@{session 0 spec}@latest`` with ``CUDA_VISIBLE_DEVICES=""`` (2 episodes).
5. ``train@{predir}`` with ``CUDA_VISIBLE_DEVICES=""``, ``meta.resources.num_gpus: 0`` and
   ``env.max_frame`` raised by ``--extra-frames``: the GPU checkpoints continue on the CPU.
6. ``train@{predir}`` back on the devices of phases 1-2 (gpu flow: CUDA, ``num_gpus: 0.5``), ``env.max_frame``
   raised by ``--extra-frames`` once more: the CPU checkpoints of phase 5 continue on CUDA.

Each phase checks its exit code and, for train phases, ``run.json`` (both sessions ``done`` at the
phase's max_frame) and train_df (one row per log frame, no gap, no duplicate). Any failure prints
``FAIL phase: why`` and exits 1. The last line holds the figures: frames, fps (median of train_df
``fps`` of the rows the phase logged) and seconds per phase; ``--out`` also gets them as JSON.

Usage:

    python bench/gpu_check.py                 # gpu flow when CUDA is visible, else the cpu flow
    python bench/gpu_check.py --mode gpu      # fail unless CUDA is visible
    python bench/gpu_check.py --mode cpu      # the same flow with gpu false / num_gpus 0
    python bench/gpu_check.py --workload atari [--precision bfloat16]   # Atari PPO on Pong (issue 11)
    python bench/gpu_check.py --workload atari --vectorization spec,envpool --num-cpus 4
    python bench/gpu_check.py --workload atari --session-batch 2   # the 2 sessions as one seed group

``--vectorization`` (comma-separated): run the whole flow once per ``env.vectorization`` (``spec``: the spec's own,
``auto`` for Atari; ``sync``, ``async``, ``envpool``), each in a fresh data dir, one figures line each (with
``envpool`` the checkpoints are ``exact: false`` and resumes reset the env). ``--num-cpus`` sets
``meta.resources.num_cpus`` per session (EnvPool's threads; ``auto`` turns async above 1).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# --workload: spec file, spec name, overrides of every phase, default --max-frame / --extra-frames / --log-frequency
WORKLOADS: dict[str, dict[str, Any]] = {
    "cartpole": {"file": str(REPO / "specs/benchmark/cartpole.json"), "name": "ppo_cartpole",
                 "items": ["agent.algorithm.training_epoch=4"], "max_frame": 8192, "extra_frames": 1024,
                 "log_frequency": 512},
    # SLM-Lab's Atari PPO (Nature CNN, 128-step rollouts, 4 epochs of batch 256) on Pong with 8 sub-envs
    "atari": {"file": str(REPO / "specs/benchmark/atari.json"), "name": "ppo_atari",
              "items": ["env.num_envs=8", "env.name=ALE/Pong-v5"], "max_frame": 8192, "extra_frames": 1024,
              "log_frequency": 1024},
}
WORKLOAD = WORKLOADS["cartpole"]  # the one this run checks (main sets it from --workload)
DRIVER_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
NO_CUDA = {"CUDA_VISIBLE_DEVICES": ""}


class CheckFailed(Exception):
    """A phase did not do what it should; the message names the phase and why."""


# ---------------------------------------------------------------- processes
def driver_argv(mode: str, data: str, items: list[str], *extra: str) -> list[str]:
    """``python run_lab.py SPEC_FILE SPEC_NAME mode --quiet --data-dir data -s item ...``."""
    sets = [x for item in items for x in ("-s", item)]
    return [sys.executable, str(REPO / "run_lab.py"), WORKLOAD["file"], WORKLOAD["name"], mode, "--quiet",
            "--data-dir", data, *sets, *extra]


def descendants(pid: int) -> list[int]:
    """PIDs of every process below ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(proc: subprocess.Popen, tree: list[int]) -> None:
    """SIGKILL the driver and the processes it started (only PIDs this script started)."""
    for pid in [proc.pid, *tree, *descendants(proc.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)


def run_phase(name: str, argv: list[str], env: dict[str, str], timeout_s: float) -> float:
    """Run a CLI command to its end; returns its seconds.

    Raises:
        CheckFailed: it exits non-zero or runs past ``timeout_s`` seconds (it is then killed).
    """
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=REPO, env={**os.environ, **DRIVER_ENV, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_tree(proc, [])
        raise CheckFailed(f"{name}: still running after {timeout_s} s") from None
    if proc.returncode != 0:
        raise CheckFailed(f"{name}: exit {proc.returncode}\n{out[-3000:]}")
    return time.perf_counter() - start


def train_then_kill(argv: list[str], env: dict[str, str], data: str, timeout_s: float) -> float:
    """Start ``train``, SIGKILL it once both sessions committed a checkpoint; returns its seconds.

    Raises:
        CheckFailed: the driver ended first, or no such checkpoints within ``timeout_s`` seconds.
    """
    start = time.perf_counter()
    log = Path(data) / "train.log"  # a file: only_predir still sees the one run dir
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, cwd=REPO, env={**os.environ, **DRIVER_ENV, **env}, stdout=out,
                                stderr=subprocess.STDOUT)
    tree: list[int] = []
    try:
        while {Path(m).parents[2].name for m in glob.glob(f"{data}/*/t0/s*/ckpt/0*/MANIFEST.json")} != {"s0", "s1"}:
            if proc.poll() is not None:
                raise CheckFailed(f"train: the driver ended (exit {proc.returncode}) before both checkpoints\n"
                                  f"{log.read_text()[-3000:]}")
            if time.perf_counter() - start > timeout_s:
                raise CheckFailed(f"train: no checkpoint of both sessions within {timeout_s} s")
            time.sleep(0.05)
        tree = descendants(proc.pid)
    finally:
        kill_tree(proc, tree)
    return time.perf_counter() - start


# ---------------------------------------------------------------- checks
def only_predir(data: str) -> Path:
    """The single run directory under ``data``."""
    (predir,) = [p for p in Path(data).iterdir() if p.is_dir() and not p.name.startswith(".")]
    return predir


def committed_frames(predir: Path) -> dict[str, int]:
    """Newest committed checkpoint frame per session (``s0``, ``s1``)."""
    return {s: max(int(m.parent.name) for m in (predir / f"t0/{s}/ckpt").glob("0*/MANIFEST.json"))
            for s in ("s0", "s1")}


def check_sessions(phase: str, predir: Path, max_frame: int, log_frequency: int, since_frame: int) -> float:
    """Both sessions ``done`` at ``max_frame`` with continuous train_dfs; returns the median fps
    of the rows logged after ``since_frame`` (frames per second, per session).

    Raises:
        CheckFailed: naming the session and what is wrong.
    """
    import pandas as pd

    run = json.loads((predir / "run.json").read_text())
    fps = []
    for s in ("s0", "s1"):
        entry = run["sessions"][f"t0_{s}"]
        if entry["status"] != "done" or entry["frame"] != max_frame:
            raise CheckFailed(f"{phase}: t0_{s} is {entry['status']} at frame {entry['frame']}, "
                              f"want done at {max_frame}")
        df = pd.read_parquet(predir / f"t0/{s}/train_df.parquet")
        want = list(range(log_frequency, max_frame + 1, log_frequency))
        if df["frame"].tolist() != want:
            raise CheckFailed(f"{phase}: t0_{s} train_df frames {df['frame'].tolist()}, want {want}")
        fps.extend(df.loc[df["frame"] > since_frame, "fps"].tolist())
    return float(pd.Series(fps).median())


def check_enjoy(predir: Path) -> float:
    """Mean return in the newest ``enjoy/**/summary.json``.

    Raises:
        CheckFailed: no summary was written.
    """
    summaries = sorted(predir.glob("enjoy/**/summary.json"), key=os.path.getmtime)
    if not summaries:
        raise CheckFailed(f"enjoy: no summary.json under {predir / 'enjoy'}")
    summary = json.loads(summaries[-1].read_text())
    return float(summary["mean"])


def restore_on_cuda(predir: Path) -> float:
    """Restore session 0's newest checkpoint in-process on CUDA and train one more PPO rollout.

    Returns:
        Seconds taken.

    Raises:
        CheckFailed: the algorithm is not on CUDA, or the restored clock does not advance.
    """
    sys.path.insert(0, str(REPO))
    from orchestrator.session.loop import Session
    from orchestrator.spec.session_spec import read_session_spec
    from orchestrator.store.checkpoint import CheckpointStore

    start = time.perf_counter()
    spec, smeta = read_session_spec(str(predir / f"{WORKLOAD['name']}_t0_s0_spec.json"), WORKLOAD["name"])
    spec["agent"]["net"]["gpu"] = True  # read_session_spec sets enjoy's CPU-only default
    loaded = CheckpointStore(str(predir / "t0/s0")).latest_valid()
    if loaded is None:
        raise CheckFailed("restore_cuda: session 0 has no valid checkpoint")
    session = Session(spec, int(smeta["session_seed"]), fresh=False)
    if session.algorithm.device.type != "cuda":
        raise CheckFailed(f"restore_cuda: the algorithm is on {session.algorithm.device}, want cuda")
    session.from_checkpoint(loaded[1])
    frame = session.clock.frame
    session.clock.max_frame = frame + spec["env"]["num_envs"] * spec["agent"]["algorithm"]["time_horizon"]
    session.run_rl()
    session.close()
    if session.clock.frame <= frame:
        raise CheckFailed(f"restore_cuda: clock stayed at frame {frame}")
    return time.perf_counter() - start


# ---------------------------------------------------------------- the flow
ENV_ITEMS: list[str] = []  # env.vectorization / meta.resources.num_cpus of the flow now running (main sets them)


def items_for(gpu: bool, num_gpus: float, max_frame: int, log_frequency: int, precision: str) -> list[str]:
    """Spec overrides of a train phase (``agent.net.gpu`` must stay as first run: not resume-editable)."""
    prec = [f"agent.net.precision={precision}"] if precision != "float32" else []
    return [f"agent.net.gpu={'true' if gpu else 'false'}", f"meta.resources.num_gpus={num_gpus}",
            "meta.max_session=2", f"env.max_frame={max_frame}", f"meta.log_frequency={log_frequency}",
            f"meta.checkpoint_frequency={log_frequency}", *WORKLOAD["items"], *prec, *ENV_ITEMS]


class GpuMemory:
    """Peak GPU memory in use (MB, all processes, ``nvidia-smi``) sampled every 0.5 s while it runs."""

    def __init__(self) -> None:
        import threading

        self.peak_mb, self._stop = 0.0, threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True, timeout=10).stdout
                self.peak_mb = max([self.peak_mb, *(float(x) for x in out.split())])
            except (OSError, ValueError, subprocess.TimeoutExpired):
                return
            self._stop.wait(0.5)

    def __enter__(self) -> "GpuMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


def run_flow(gpu: bool, args: argparse.Namespace, data: str) -> dict[str, Any]:
    """Phases 1-5 (see module docstring); returns the figures.

    Raises:
        CheckFailed: from the first phase that fails.
    """
    items = items_for(gpu, 0.5 if gpu else 0, args.max_frame, args.log_frequency, args.precision)
    device_env = {} if gpu else NO_CUDA
    fig: dict[str, Any] = {"mode": "gpu" if gpu else "cpu", "workload": WORKLOAD["name"],
                           "precision": args.precision, "max_frame": args.max_frame}
    with GpuMemory() as memory:  # phases 1-2: both sessions on one GPU (num_gpus 0.5 each)
        fig["train_s"] = train_then_kill(driver_argv("train", data, items), device_env, data, args.timeout)
        predir = only_predir(data)
        fig["killed_at"] = committed_frames(predir)
        fig["resume_s"] = run_phase("train@latest", driver_argv("train@latest", data, items), device_env,
                                    args.timeout)
    if gpu:
        fig["gpu_mem_peak_mb"] = memory.peak_mb
    fig["resume_fps"] = check_sessions("train@latest", predir, args.max_frame, args.log_frequency,
                                       min(fig["killed_at"].values()))
    if gpu:
        fig["restore_cuda_s"] = restore_on_cuda(predir)
    session_spec = predir / f"{WORKLOAD['name']}_t0_s0_spec.json"
    target = f"enjoy@{session_spec}@latest"
    fig["enjoy_s"] = run_phase("enjoy", driver_argv(target, data, [], "--episodes", "2"), NO_CUDA, args.timeout)
    fig["enjoy_return"] = check_enjoy(predir)
    more = args.max_frame + args.extra_frames
    cpu_items = items_for(gpu, 0, more, args.log_frequency, args.precision)
    fig["cpu_resume_s"] = run_phase("train@ (no CUDA)", driver_argv(f"train@{predir}", data, cpu_items), NO_CUDA,
                                    args.timeout)
    fig["cpu_resume_fps"] = check_sessions("train@ (no CUDA)", predir, more, args.log_frequency, args.max_frame)
    # and back: the CPU checkpoints of phase 5 continue on the first phases' device (CUDA in the gpu flow)
    back = more + args.extra_frames
    fig["back_s"] = run_phase("train@ (back)", driver_argv(
        f"train@{predir}", data, items_for(gpu, 0.5 if gpu else 0, back, args.log_frequency, args.precision)),
        device_env, args.timeout)
    fig["back_fps"] = check_sessions("train@ (back)", predir, back, args.log_frequency, more)
    fig["frames"] = 2 * back
    return fig


def figures_line(fig: dict[str, Any]) -> str:
    """One line: frames, fps and seconds per phase."""
    secs = " ".join(f"{k[:-2]}={fig[k]:.1f}s" for k in fig if k.endswith("_s"))
    killed = ",".join(f"{s}@{f}" for s, f in fig["killed_at"].items())
    mem = f" gpu_mem_peak={fig['gpu_mem_peak_mb']:.0f}MB" if "gpu_mem_peak_mb" in fig else ""
    extra = (fig["frames"] // 2 - fig["max_frame"]) // 2
    return (f"gpu_check OK mode={fig['mode']} workload={fig['workload']} vectorization={fig['vectorization']} "
            f"num_cpus={fig['num_cpus']} precision={fig['precision']}{mem} "
            f"frames={fig['frames']} (2 sessions to {fig['max_frame']}, +{extra} on CPU, +{extra} back on "
            f"{fig['mode'].upper()}) killed_at={killed} resume_fps={fig['resume_fps']:.0f} "
            f"cpu_resume_fps={fig['cpu_resume_fps']:.0f} back_fps={fig['back_fps']:.0f} "
            f"enjoy_return={fig['enjoy_return']:.1f} {secs}")


def main(argv: list[str] | None = None) -> int:
    """Run the check; returns the exit code (0 all phases passed, 1 a phase failed)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("auto", "gpu", "cpu"), default="auto",
                        help="auto: the gpu flow when CUDA is visible, else the cpu flow")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="cartpole",
                        help="cartpole: PPO on CartPole-v1; atari: SLM-Lab's Atari PPO on ALE/Pong-v5, 8 sub-envs")
    parser.add_argument("--precision", choices=("float32", "bfloat16"), default="float32",
                        help="agent.net.precision (bfloat16: conv nets under autocast; atari only)")
    parser.add_argument("--max-frame", type=int, default=None, help="frames per session of phases 1-2 (8192)")
    parser.add_argument("--extra-frames", type=int, default=None, help="frames per session added by phase 5 (1024)")
    parser.add_argument("--log-frequency", type=int, default=None,
                        help="frames between log rows and checkpoints (cartpole 512, atari 1024: one rollout)")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds per phase before it fails")
    parser.add_argument("--vectorization", default="spec",
                        help="comma-separated env.vectorization values, one flow each: spec, sync, async, envpool")
    parser.add_argument("--num-cpus", type=float, default=None,
                        help="meta.resources.num_cpus per session (default: the spec's)")
    parser.add_argument("--session-batch", type=int, default=1,
                        help="meta.session_batch: the 2 sessions as one seed group (2) or separate (1, default)")
    parser.add_argument("--out", default=None, help="JSON file for the figures (default: none)")
    args = parser.parse_args(argv)
    vecs = args.vectorization.split(",")
    if not set(vecs) <= {"spec", "sync", "async", "auto", "envpool"}:
        parser.error(f"--vectorization: expected spec, sync, async, auto or envpool, got {args.vectorization!r}")
    global WORKLOAD
    WORKLOAD = WORKLOADS[args.workload]
    for key in ("max_frame", "extra_frames", "log_frequency"):
        if getattr(args, key) is None:
            setattr(args, key, WORKLOAD[key])
    if args.precision != "float32" and args.workload != "atari":
        parser.error("--precision bfloat16 needs --workload atari (conv nets read agent.net.precision)")
    import torch

    cuda = torch.cuda.is_available()
    if args.mode == "gpu" and not cuda:
        print("FAIL setup: --mode gpu but torch sees no CUDA device", file=sys.stderr)
        return 1
    gpu = args.mode == "gpu" or (args.mode == "auto" and cuda)
    figs = []
    for vec in vecs:
        ENV_ITEMS[:] = ([] if vec == "spec" else [f"env.vectorization={vec}"]) + \
            ([] if args.num_cpus is None else [f"meta.resources.num_cpus={args.num_cpus}"]) + \
            ([] if args.session_batch == 1 else [f"meta.session_batch={args.session_batch}"])
        start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="gpu_check_") as data:
            try:
                fig = run_flow(gpu, args, data)
            except CheckFailed as err:
                print(f"FAIL {vec}: {err}", file=sys.stderr)
                return 1
        fig.update(vectorization=vec, num_cpus=args.num_cpus or "spec", session_batch=args.session_batch,
                   total_s=time.perf_counter() - start)
        figs.append(fig)
        print(figures_line(fig), flush=True)
    if args.out:
        from orchestrator.store import storage  # atomic: a kill mid-write leaves the old file
        storage.write_text(str(args.out), json.dumps(figs[0] if len(figs) == 1 else figs, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
