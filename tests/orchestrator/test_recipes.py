"""The scheduler recipes in examples/, run the way each scheduler runs them and signalled the way it signals,
without the scheduler: a real ``lab ... train --name`` (tiny CartPole budget) each time.

- SLURM (``slurm_requeue.sbatch`` under bash, fake ``scontrol`` on PATH recording its calls, ``SLURM_JOB_ID`` set,
  the job in its own process group): SIGUSR1 to the batch shell (``--signal=B:USR1@N``), then SIGTERM to every
  process of the job (what SLURM does at the time limit, on preemption and on ``scancel``), then SIGKILL to what is
  left after a wait (KillWait). The lab commits and exits 75, the script requeues once and exits 75; the requeued
  job finishes the run (0, no requeue); a bad spec exits 2 with no requeue.
- Kubernetes (``k8s_job.yaml``): the container's command run as the container runs it (the lab is the process
  Kubernetes signals), SIGTERM to that process only, SIGKILL after the manifest's grace: exit 75 within it, and the
  same command (the Job's next pod) finishes the run from the committed checkpoint.
- KubeRay (``kuberay_rayjob.yaml``): the entrypoint's retry loop with a stand-in ``lab`` that records its calls.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from lab_helpers import DRIVER_ENV, REPO, assert_continuous, descendants, kill_pids, overrides, pid_alive

from orchestrator.store import storage

EXAMPLES = REPO / "examples"
JOB_ID = "4242"
TINY = ["meta.max_session=1", "env.num_envs=4", "meta.log_frequency=800", "meta.checkpoint_frequency=800",
        "meta.random_seed=5", "env.max_frame=4800"]


def committed(predir: Path) -> list[int]:
    """Frames of the committed checkpoints of session t0_s0."""
    return sorted(int(m.parent.name) for m in predir.glob("t0/s0/ckpt/0*/MANIFEST.json"))


def write_exe(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    """A job's working directory: ``specs`` (the repo's), ``bin/`` with ``lab`` (this checkout's ``run_lab.py``),
    and fake ``scontrol`` and ``srun`` that append their arguments to ``calls.txt``."""
    (tmp_path / "specs").symlink_to(REPO / "specs")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    write_exe(bin_dir / "lab", f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {REPO / "run_lab.py"} "$@"\n')
    for tool in ("scontrol", "srun"):
        write_exe(bin_dir / tool, f'#!/bin/sh\necho "{tool} $*" >> {tmp_path / "calls.txt"}\n')
    return tmp_path


def job_env(job_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a job: ``bin/`` first on PATH, the Ray settings of the tests' drivers."""
    return {**os.environ, **DRIVER_ENV, "PATH": f"{job_dir / 'bin'}:{os.environ['PATH']}", **extra}


def calls(job_dir: Path) -> list[str]:
    path = job_dir / "calls.txt"
    return path.read_text().splitlines() if path.exists() else []


def start_slurm_job(job_dir: Path, items: list[str]) -> subprocess.Popen:
    """``bash slurm_requeue.sbatch -s ...`` as SLURM starts a batch job: in its own session and process group, in
    the job's directory, with ``SLURM_JOB_ID`` set (sbatch passes the script's arguments through)."""
    return subprocess.Popen(["bash", str(EXAMPLES / "slurm_requeue.sbatch"), *overrides(items)], cwd=job_dir,
                            env=job_env(job_dir, SLURM_JOB_ID=JOB_ID), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def signal_job(job: subprocess.Popen, signum: int) -> None:
    """``signum`` to every process of the job, as slurmd does (its cgroup holds every process the batch shell
    started, those in other process groups too: Ray's workers): the process group and every descendant."""
    members = descendants(job.pid)
    try:
        os.killpg(job.pid, signum)
    except ProcessLookupError:
        pass
    for pid in members:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def finish(job: subprocess.Popen, kill_after: float) -> tuple[int, str]:
    """Wait for the job for up to ``kill_after`` seconds, then SIGKILL every process of it (KillWait passed);
    returns (exit code, output). Fails the test if the kill was needed."""
    tree = descendants(job.pid)
    try:
        out, _ = job.communicate(timeout=kill_after)
    except subprocess.TimeoutExpired:
        signal_job(job, signal.SIGKILL)
        out, _ = job.communicate(timeout=30)
        pytest.fail(f"the job outlived the grace of {kill_after} s and was killed:\n{out[-3000:]}")
    finally:
        kill_pids([pid for pid in tree + descendants(job.pid) if pid_alive(pid)])
    return job.returncode, out


def wait_for(ready, job: subprocess.Popen, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not ready():
        if job.poll() is not None:
            pytest.fail(f"the job ended before {what}:\n{job.stdout.read()[-3000:]}")
        if time.time() > deadline:
            signal_job(job, signal.SIGKILL)
            pytest.fail(f"{what} not reached within {timeout} s")
        time.sleep(0.1)


def test_slurm_preemption_requeues_once_and_the_requeued_job_finishes(job_dir):
    """USR1 to the batch shell, SIGTERM to every process of the job 0.05 s later (the lab gets two stop requests),
    SIGKILL 60 s after that: the lab commits a final checkpoint and exits 75, the script requeues exactly once and
    exits 75. The requeued job (the same script, the same SLURM_JOB_ID) finishes the run from that checkpoint: exit
    0, no requeue, one train_df row per log frame."""
    predir = job_dir / "data" / JOB_ID
    job = start_slurm_job(job_dir, TINY)
    wait_for(lambda: committed(predir) and committed(predir)[-1] >= 800, job, 180, "a checkpoint")
    at_signal = committed(predir)[-1]
    os.kill(job.pid, signal.SIGUSR1)  # --signal=B:USR1@N: the batch shell only
    time.sleep(0.05)
    signal_job(job, signal.SIGTERM)  # the time limit (or a preemption, or scancel): every process of the job
    code, out = finish(job, kill_after=60)
    assert code == 75, out[-3000:]
    assert calls(job_dir) == [f"scontrol requeue {JOB_ID}"], out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    final = committed(predir)[-1]
    assert at_signal <= final < 4800
    run = storage.read_json(str(predir / "run.json"))
    assert run["sessions"]["t0_s0"]["status"] != "done"
    # the requeued job: SLURM runs the same script again with the same SLURM_JOB_ID
    (job_dir / "calls.txt").unlink()
    code, out = finish(start_slurm_job(job_dir, TINY), kill_after=300)
    assert code == 0, out[-3000:]
    assert calls(job_dir) == []
    run = storage.read_json(str(predir / "run.json"))
    assert run["sessions"]["t0_s0"]["status"] == "done"
    assert run["resumes"][-1]["from_frames"]["t0_s0"] == final
    assert_continuous(pd.read_parquet(predir / "t0/s0/train_df.parquet"), 800, 4800)


def test_slurm_bad_spec_exits_2_without_requeue(job_dir):
    code, out = finish(start_slurm_job(job_dir, ["env.max_frame=-1"]), kill_after=180)
    assert code == 2 and "env.max_frame" in out, out[-3000:]
    assert calls(job_dir) == []
