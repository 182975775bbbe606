"""Start-up and shut-down cost: ``lab specs/benchmark/cartpole.json ppo_cartpole train`` with one session
vs Stable-Baselines3 doing the same training in one process.

Both are timed from outside, as a user sees them, each a fresh process started by this script:

- **command -> first frame**: from starting the process to the session's first env step. For the lab:
  until the driver records the session actor's ``pid`` in ``run.json`` (the actor's ``started``
  event, sent right before its first step; polled every 20 ms on local disk). For SB3: until its
  callback's first ``_on_step`` (written with a timestamp on stdout).
- **train**: first frame -> the session is done (``run.json`` status ``done``; SB3: ``learn()`` returns).
- **done -> exit**: the rest, until the process has exited (the lab: trial_df, metrics, graphs, the
  summary, ``ray.shutdown``; SB3: nothing but the interpreter's exit).
- **summary -> exit**: from the summary's first line (``trial done: ...``, printed with a flush once the
  analysis has written the metrics and graphs) arriving on the pipe to the process's exit (``ray.shutdown``,
  the exit handlers): the issue's "exit within 1 s after the analysis". SB3: the same as done -> exit.
- **whole**: command -> exit.
- **cpu**: CPU seconds (user + system) of the process and all its descendants (the lab: its Ray daemons and
  workers, the session actor, the spec-check child), each process's last value sampled every 0.1 s with
  psutil (so up to 0.1 s per process is missed): unlike the seconds above, little moved by other jobs
  sharing the cores.

Same work: PPO on CartPole-v1 with ``ppo_cartpole``'s hyperparameters (as ``bench/throughput.py``: 8 envs,
time_horizon/n_steps 32, batch 256, 20 epochs, linear lr and clip to 0 over the budget), one torch
thread, ``--frames`` frames (default 100,096: ``ppo_cartpole``'s own 100k-frame budget in whole rollouts of
256 frames, the work the issue's 0.8x goal was set on). The lab also checkpoints every ``log_frequency`` frames
and writes its analysis; SB3 writes nothing. Runs alternate (lab, SB3, lab, ...), each with the 1-minute load
average at its start.

``--cluster`` adds ``lab_cluster``: the same command with ``--address`` on a local Ray head this script
starts once (``ray start --head --block``, no dashboard) and ends by SIGKILL of its process group, as a user
with a running Ray would work (its CPU column is the lab's process tree only, not the head's daemons).

Usage:
    python bench/startup.py [--frames 100096] [--rounds 3] [--cluster] [--before OTHER_CHECKOUT]
        [--out bench/results/startup.json]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SPEC_FILE = ROOT / "specs/benchmark/cartpole.json"
ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}

SB3_SCRIPT = """
import sys, time
print("T import", time.time(), flush=True)
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
torch.set_num_threads(1)
frames = int(sys.argv[1])
lin = lambda v: (lambda progress_remaining: progress_remaining * v)

class First(BaseCallback):
    def _on_step(self):
        if self.n_calls == 1:
            print("T first_frame", time.time(), flush=True)
        return True

env = make_vec_env("CartPole-v1", n_envs=8, seed=1)
model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, n_epochs=20, gae_lambda=0.8, gamma=0.98,
            learning_rate=lin(1e-3), clip_range=lin(0.2), ent_coef=0.0, vf_coef=0.5, max_grad_norm=0.5,
            policy_kwargs={"net_arch": {"pi": [64, 64], "vf": [64, 64]}}, seed=1, device="cpu", verbose=0)
model.learn(total_timesteps=frames, callback=First())
print("T done", time.time(), flush=True)
"""


def lab_command(frames: int, data_dir: str, root: Path = ROOT, address: str | None = None) -> list[str]:
    """``lab SPEC ppo_cartpole train`` of one session, schedules cut to ``frames`` (as bench/throughput.py);
    with ``address``, on that running Ray (``--address``) instead of an embedded one."""
    items = ["meta.max_session=1", f"env.max_frame={frames}", "meta.log_frequency=2048", "meta.random_seed=1",
             f"agent.net.lr_scheduler_spec.frame={frames}", f"agent.algorithm.clip_eps_spec.end_step={frames}"]
    return [sys.executable, str(root / "run_lab.py"), str(SPEC_FILE), "ppo_cartpole", "train", "--quiet",
            "--data-dir", data_dir, *(["--address", address] if address else []),
            *[x for item in items for x in ("-s", item)]]


def session_entry(data_dir: Path) -> dict[str, Any]:
    """run.json entry of t0_s0 ({} until it exists)."""
    for run in data_dir.glob("ppo_cartpole_*/run.json"):
        try:
            return json.loads(run.read_text())["sessions"].get("t0_s0", {})
        except (ValueError, OSError):
            return {}
    return {}


class TreeCPU:
    """CPU seconds (user + system) of a process and its descendants, sampled every ``period`` seconds on a
    thread; ``total`` sums each process's last sample."""

    def __init__(self, pid: int, period: float = 0.1) -> None:
        try:
            import psutil
        except ImportError:  # Ray bundles psutil (ray/thirdparty_files), on sys.path once ray is imported
            import importlib

            importlib.import_module("ray")
            psutil = importlib.import_module("psutil")
        self.psutil, self.root, self.period, self.seen = psutil, psutil.Process(pid), period, {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except self.psutil.Error:
                procs = []
            for proc in procs:
                try:
                    times = proc.cpu_times()
                    self.seen[proc.pid] = times.user + times.system
                except self.psutil.Error:
                    continue
            self.stop.wait(self.period)

    def total(self) -> float:
        """Stop sampling; the CPU seconds seen."""
        self.stop.set()
        self.thread.join()
        return sum(self.seen.values())


def run_lab(frames: int, root: Path = ROOT, address: str | None = None) -> dict[str, Any]:
    """One ``lab ... train`` of the checkout at ``root`` (on the Ray at ``address``, else embedded); phase
    times in seconds. With ``address`` the CPU column counts the lab's process tree only, not the head's."""
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        t0 = time.time()
        env = {**ENV, "PYTHONPATH": str(root)}  # its code, also in the Ray workers (they inherit the environment)
        proc = subprocess.Popen(lab_command(frames, str(data), root, address), cwd=tmp, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        cpu = TreeCPU(proc.pid)
        out: list[tuple[float, str]] = []  # (arrival time, line)
        reader = threading.Thread(target=lambda: out.extend((time.time(), line) for line in proc.stdout), daemon=True)
        reader.start()
        first = done = None
        while proc.poll() is None:
            entry = session_entry(data)
            if first is None and "pid" in entry:
                first = time.time()
            if done is None and entry.get("status") == "done":
                done = time.time()
            time.sleep(0.02)
        end = time.time()
        cpu_s = cpu.total()
        reader.join()
        summary = next((t for t, line in out if line.startswith("trial done:")), None)
        if proc.returncode != 0 or first is None or done is None or summary is None:
            raise RuntimeError(f"lab train failed ({proc.returncode}):\n{''.join(x for _, x in out)[-3000:]}")
    return {"first_frame_s": first - t0, "train_s": done - first, "done_to_exit_s": end - done,
            "summary_to_exit_s": end - summary, "whole_s": end - t0, "cpu_s": cpu_s}


class RayHead:
    """A local Ray head started as a user starts one (``ray start --head --block``, its own temp dir and port,
    no dashboard) in a new process group, ended by SIGKILL of that group (every daemon it starts keeps it)."""

    def __init__(self) -> None:
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.temp_dir = tempfile.mkdtemp(prefix="rh_")
        ray = str(Path(sys.executable).with_name("ray"))
        self.proc = subprocess.Popen(
            [ray, "start", "--head", "--block", f"--port={port}", f"--temp-dir={self.temp_dir}",
             "--include-dashboard=false", "--disable-usage-stats", f"--num-cpus={os.cpu_count()}"],
            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.address = f"127.0.0.1:{port}"
        deadline = time.time() + 60
        while not glob.glob(f"{self.temp_dir}/session_latest/logs/raylet.out"):
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                raise RuntimeError(f"ray start --head did not bring up a raylet within 60 s (temp dir {self.temp_dir})")
            time.sleep(0.2)
        time.sleep(2.0)  # the raylet registers with the GCS after its log opens

    def stop(self) -> None:
        """SIGKILL the head's process group (the ``ray start`` process and every daemon it started) and remove
        its temp dir."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def run_sb3(frames: int) -> dict[str, Any]:
    """One SB3 process doing the same training; phase times in seconds."""
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "-c", SB3_SCRIPT, str(frames)], env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    cpu = TreeCPU(proc.pid)
    stdout, stderr = proc.communicate()
    end = time.time()
    cpu_s = cpu.total()
    if proc.returncode != 0:
        raise RuntimeError(f"SB3 failed:\n{stderr[-3000:]}")
    marks = {line.split()[1]: float(line.split()[2]) for line in stdout.splitlines() if line.startswith("T ")}
    return {"first_frame_s": marks["first_frame"] - t0, "train_s": marks["done"] - marks["first_frame"],
            "done_to_exit_s": end - marks["done"], "summary_to_exit_s": end - marks["done"], "whole_s": end - t0,
            "cpu_s": cpu_s}


def _rounds(args: argparse.Namespace, sb3_version: str | None, head: RayHead | None, runs: list[dict]) -> None:
    """Alternate the implementations for ``args.rounds`` rounds, appending each run's record to ``runs``."""
    for r in range(args.rounds):
        impls = [("lab", run_lab), ("sb3", run_sb3)]
        if head is not None:
            impls.insert(1, ("lab_cluster", lambda frames: run_lab(frames, address=head.address)))
        if args.before:
            impls.insert(1, ("lab_before", lambda frames: run_lab(frames, Path(args.before).resolve())))
        for impl, fn in impls:
            if impl == "sb3" and sb3_version is None:
                continue
            load = os.getloadavg()[0]
            rec = {"impl": impl, "round": r, "load1_start": load, **fn(args.frames), "load1_end": os.getloadavg()[0]}
            runs.append(rec)
            print(f"round {r} {impl}: first frame {rec['first_frame_s']:.1f} s, train {rec['train_s']:.1f} s, "
                  f"done->exit {rec['done_to_exit_s']:.1f} s, summary->exit {rec['summary_to_exit_s']:.2f} s, "
                  f"whole {rec['whole_s']:.1f} s, cpu {rec['cpu_s']:.1f} s "
                  f"(load1 {load:.2f})",
                  flush=True)


def main(argv: list[str] | None = None) -> int:
    """The command line (usage in the module docstring): runs the benchmark, writes its results; returns 0."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=100_096,
                    help="frames of training (multiple of 256; default: ppo_cartpole's 100k-frame budget, rounded up "
                         "to whole 256-frame rollouts, the issue's workload)")
    ap.add_argument("--rounds", type=int, default=3, help="(lab, SB3) pairs, alternating")
    ap.add_argument("--out", default=str(ROOT / "bench/results/startup.json"))
    ap.add_argument("--cluster", action="store_true",
                    help="also time the lab on an already-running local Ray head (ray start --head) as 'lab_cluster'")
    ap.add_argument("--before", default=None, metavar="CHECKOUT",
                    help="also time the lab of another checkout (e.g. the previous commit) as 'lab_before'")
    args = ap.parse_args(argv)
    try:
        import stable_baselines3
        sb3_version = stable_baselines3.__version__
    except ImportError:
        sb3_version = None
        print("stable-baselines3 is not installed (pip install -e '.[bench]'): timing the lab only")
    runs = []
    head = RayHead() if args.cluster else None
    try:
        _rounds(args, sb3_version, head, runs)
    finally:
        if head is not None:
            head.stop()
    keys = ("first_frame_s", "train_s", "done_to_exit_s", "summary_to_exit_s", "whole_s", "cpu_s")
    summary = {impl: {k: statistics.median(x[k] for x in runs if x["impl"] == impl) for k in keys}
               for impl in sorted({x["impl"] for x in runs})}
    import ray
    import torch
    result = {"frames": args.frames, "rounds": args.rounds, "median": summary, "runs": runs,
              "versions": {"python": sys.version.split()[0], "torch": torch.__version__, "ray": ray.__version__,
                           "stable_baselines3": sb3_version},
              "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    from orchestrator.store import storage  # atomic: a kill mid-write leaves the old file
    storage.write_text(str(args.out), json.dumps(result, indent=1) + "\n")
    for impl, med in summary.items():
        print(f"median {impl}: " + ", ".join(f"{k} {v:.1f}" for k, v in med.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
