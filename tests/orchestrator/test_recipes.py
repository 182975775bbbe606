"""The scheduler recipes in examples/, run the way each scheduler runs them and signalled the way it signals,
without the scheduler: a real ``lab ... train --name`` (tiny CartPole budget) each time.

- SLURM (``slurm_requeue.sbatch`` under bash, fake ``scontrol`` on PATH recording its calls, ``SLURM_JOB_ID`` set,
  the job in its own process group): SIGUSR1 to the batch shell (``--signal=B:USR1@N``), then SIGTERM to every
  process of the job (what SLURM does at the time limit and on preemption), then SIGKILL to what is left after a
  wait (KillWait). The lab commits and exits 75, the script requeues once and exits 75; the requeued job finishes
  the run (0, no requeue); a bad spec exits 2 with no requeue.
- Kubernetes (``k8s_job.yaml``): the container's command run as the container runs it (PID 1 of its own PID
  namespace where this machine allows it), SIGTERM to that process only, SIGKILL after the manifest's grace: exit 75
  within it, and the same command (the Job's next pod) finishes the run from the committed checkpoint.
- KubeRay (``kuberay_rayjob.yaml``): the entrypoint's retry loop, run as Ray's job supervisor runs it, with a
  stand-in ``lab`` that records its calls.
- ``ray_job_submit.py`` against a real ``ray start --head``: a driver stopped by SIGTERM (75) is submitted again,
  a ``ray job stop`` is not, and the run then finishes.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
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
    """An executable file ``path`` with content ``text``."""
    path.write_text(text)
    path.chmod(0o755)


def lab_shim(bin_dir: Path) -> None:
    """``bin_dir/lab``: this checkout's ``run_lab.py`` exec'd (the ``lab`` process is the shim's PID)."""
    bin_dir.mkdir(exist_ok=True)
    write_exe(bin_dir / "lab", f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {REPO / "run_lab.py"} "$@"\n')


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    """A job's working directory: ``specs`` (the repo's), ``bin/`` with ``lab`` (this checkout's ``run_lab.py``),
    and fake ``scontrol`` and ``srun`` that append their arguments to ``calls.txt``."""
    (tmp_path / "specs").symlink_to(REPO / "specs")
    bin_dir = tmp_path / "bin"
    lab_shim(bin_dir)
    for tool in ("scontrol", "srun"):
        write_exe(bin_dir / tool, f'#!/bin/sh\necho "{tool} $*" >> {tmp_path / "calls.txt"}\n')
    return tmp_path


def job_env(job_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a job: ``bin/`` first on PATH, the Ray settings of the tests' drivers."""
    return {**os.environ, **DRIVER_ENV, "PATH": f"{job_dir / 'bin'}:{os.environ['PATH']}", **extra}


def calls(job_dir: Path) -> list[str]:
    """The recorded calls of the fake ``scontrol`` and ``srun``, one line each."""
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
    """Poll ``ready()`` until it holds; fail the test (killing the job) if the job ends first or ``timeout``
    seconds pass."""
    deadline = time.time() + timeout
    while not ready():
        if job.poll() is not None:
            pytest.fail(f"the job ended before {what}:\n{job.stdout.read()[-3000:] if job.stdout else ''}")
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
    assert at_signal <= final < 4800 and f"t0_s0: interrupted, committed checkpoint at frame {final}" in out, out
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


def pid1_prefix() -> list[str]:
    """``unshare`` arguments that run a command as PID 1 of a new PID namespace, as a container's main process runs
    (a signal from outside reaches it only through a handler it installed; when it exits, the namespace's other
    processes are killed); empty where this machine does not allow it (not root): the command then runs as a plain
    child, which Kubernetes' SIGTERM reaches the same way."""
    prefix = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "--"]
    try:
        ok = subprocess.run([*prefix, "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return prefix if ok else []


def namespace_pid(pid: int) -> int | None:
    """The PID process ``pid`` has in its own (innermost) PID namespace (``NSpid`` of /proc/PID/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    (line,) = [ln for ln in status.splitlines() if ln.startswith("NSpid:")]
    return int(line.split()[-1])


def container_command(job_dir: Path, items: list[str]) -> tuple[list[str], int]:
    """The ``lab`` container's ``command`` of examples/k8s_job.yaml with ``--data-dir`` set to the job's directory
    and ``items`` appended as ``-s`` overrides (later ones win), and the pod's terminationGracePeriodSeconds."""
    manifest = yaml.safe_load((EXAMPLES / "k8s_job.yaml").read_text())
    pod = manifest["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "lab"]
    command = list(container["command"])
    assert command[0] == "lab" and "args" not in container
    command[command.index("--data-dir") + 1] = str(job_dir / "data")
    return [sys.executable, str(REPO / "run_lab.py"), *command[1:], *overrides(items)], \
        int(pod["terminationGracePeriodSeconds"])


def test_kubernetes_sigterm_to_the_container_process_exits_75_within_the_grace_and_resumes(job_dir):
    """The container's command as the container's main process; SIGTERM to it alone (what the kubelet sends), SIGKILL
    to everything once the manifest's terminationGracePeriodSeconds passed: the lab exits 75 before that, having
    committed a final checkpoint; the Job's next pod (the same command) finishes the run from it."""
    command, grace = container_command(job_dir, TINY)
    name = command[command.index("--name") + 1]
    predir = job_dir / "data" / name
    prefix = pid1_prefix()
    pod = subprocess.Popen([*prefix, *command], cwd=job_dir, env=job_env(job_dir), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
    wait_for(lambda: committed(predir) and committed(predir)[-1] >= 800, pod, 180, "a checkpoint")
    at_signal = committed(predir)[-1]
    main = pod.pid
    if prefix:  # the lab is the child of unshare: PID 1 inside its namespace
        (main,) = [p for p in descendants(pod.pid) if namespace_pid(p) == 1]
    started = time.monotonic()
    os.kill(main, signal.SIGTERM)
    code, out = finish(pod, kill_after=grace)
    took = time.monotonic() - started
    assert code == 75, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    final = committed(predir)[-1]
    assert at_signal <= final < 4800 and f"t0_s0: interrupted, committed checkpoint at frame {final}" in out, out
    # the Job's next pod: the same command
    code, out = finish(subprocess.Popen([*prefix, *command], cwd=job_dir, env=job_env(job_dir),
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        start_new_session=True), kill_after=300)
    assert code == 0, out[-3000:]
    run = storage.read_json(str(predir / "run.json"))
    assert run["sessions"]["t0_s0"]["status"] == "done"
    assert run["resumes"][-1]["from_frames"]["t0_s0"] == final
    assert_continuous(pd.read_parquet(predir / "t0/s0/train_df.parquet"), 800, 4800)
    print(f"SIGTERM to exit 75: {took:.1f} s (grace {grace} s)")


@pytest.mark.parametrize("codes, runs, final", [([75, 75, 0], 3, 0), ([2], 1, 2), ([1], 1, 1), ([75, 2], 2, 2)])
def test_kuberay_entrypoint_runs_the_command_again_on_75_only(tmp_path, codes, runs, final):
    """The RayJob's entrypoint, run as Ray's job supervisor runs it (``/bin/sh -c ENTRYPOINT``), with a stand-in
    ``lab`` that exits with the given codes in turn: the lab command again after each 75, any other code is the
    entrypoint's (the RayJob's SUCCEEDED or FAILED, never retried by KubeRay)."""
    entrypoint = yaml.safe_load((EXAMPLES / "kuberay_rayjob.yaml").read_text())["spec"]["entrypoint"]
    (tmp_path / "codes").write_text("\n".join(map(str, codes)) + "\n")
    write_exe(tmp_path / "lab", f'#!/bin/sh\necho "$*" >> {tmp_path / "calls"}\n'
              f'code=$(head -n 1 {tmp_path / "codes"}); sed -i 1d {tmp_path / "codes"}; exit "$code"\n')
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "LAB_RETRY_DELAY_S": "0"}
    proc = subprocess.run(["/bin/sh", "-c", entrypoint], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == final, proc.stdout + proc.stderr
    lines = (tmp_path / "calls").read_text().splitlines()
    assert len(lines) == runs and len(set(lines)) == 1 and "--name ppo-cartpole-1" in lines[0]


def test_ray_job_submit_recipe_maps_job_outcomes_to_the_labs_exit_codes():
    """``examples/ray_job_submit.py``'s decision per finished Ray job (status, the entrypoint's exit code)."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        import ray_job_submit
    finally:
        sys.path.remove(str(EXAMPLES))
    decide = ray_job_submit.exit_code
    assert decide("SUCCEEDED", 0) == 0
    assert decide("FAILED", 75) is None  # submitted again
    assert decide("FAILED", 2) == 2 and decide("FAILED", 1) == 1
    assert decide("FAILED", -9) == 1 and decide("FAILED", None) == 1  # killed, or never started
    assert decide("STOPPED", None) == 75  # ray job stop: resumable, not submitted again


def lab_drivers(marker: str) -> list[int]:
    """PIDs of the ``run_lab.py`` processes whose command line holds ``marker``."""
    out = []
    for cmd in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmd.read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(w.endswith("run_lab.py") for w in words) and any(marker in w for w in words):
            out.append(int(cmd.parent.name))
    return out


def test_ray_job_submit_recipe_resubmits_after_75_only(tmp_path):
    """``examples/ray_job_submit.py`` against a real head (``ray start --head`` with its dashboard): the driver
    stopped by SIGTERM (exit 75, a FAILED job for Ray) is submitted again; ``ray job stop`` of that second job (a
    STOPPED job, for which ``ray job submit`` exits 0) ends the recipe with 75 and no third submission, the lab having
    committed a final checkpoint within the recipe's stop wait; the recipe run again finishes the run (0)."""
    from ray.job_submission import JobSubmissionClient
    from test_cluster import Cluster

    bin_dir = tmp_path / "bin"
    lab_shim(bin_dir)
    env = {**os.environ, **DRIVER_ENV, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    data = tmp_path / "data"
    predir = data / "rj-1"
    command = ["lab", str(REPO / "specs/benchmark/cartpole.json"), "ppo_cartpole", "train", "--name", "rj-1",
               "--data-dir", str(data), "--quiet", *overrides(TINY)]
    cluster = Cluster(Path(tempfile.mkdtemp(prefix="lab-rj-")), env)  # short: Ray's socket paths are limited
    recipe = None
    try:
        cluster.start_head()
        recipe_cmd = [sys.executable, str(EXAMPLES / "ray_job_submit.py"), "--address", cluster.dashboard,
                      "--delay", "1", "--", *command]
        log = tmp_path / "recipe.log"
        with open(log, "w") as out:
            recipe = subprocess.Popen(recipe_cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        submitted = lambda: [ln.split()[3].rstrip(":") for ln in log.read_text().splitlines()  # noqa: E731
                             if ln.startswith("submitted Ray job ")]
        wait_for(lambda: committed(predir) and committed(predir)[-1] >= 800, recipe, 240, "a checkpoint")
        (driver,) = lab_drivers(str(data))
        os.kill(driver, signal.SIGTERM)  # the driver alone (a storage fault or a lease wait exits 75 the same way)
        wait_for(lambda: len(submitted()) == 2, recipe, 120, "a second submission")
        first = committed(predir)[-1]
        wait_for(lambda: committed(predir)[-1] > first, recipe, 240, "a checkpoint of the second submission")
        JobSubmissionClient(cluster.dashboard).stop_job(submitted()[1])
        assert recipe.wait(timeout=180) == 75, log.read_text()[-3000:]
        text = log.read_text()
        assert len(submitted()) == 2 and "the job was stopped (ray job stop)" in text, text[-3000:]
        assert "committed checkpoint at frame" in text and "Traceback" not in text, text[-3000:]
        stopped_at = committed(predir)[-1]
        assert first < stopped_at < 4800
        # the recipe again: the run finishes
        proc = subprocess.run(recipe_cmd, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0 and proc.stdout.count("submitted Ray job ") == 1, proc.stdout[-3000:]
        run = storage.read_json(str(predir / "run.json"))
        assert run["sessions"]["t0_s0"]["status"] == "done"
        assert [r["from_frames"]["t0_s0"] for r in run["resumes"]] == [first, stopped_at]
    finally:
        if recipe is not None and recipe.poll() is None:
            recipe.kill()
        kill_pids(lab_drivers(str(data)))
        cluster.kill_all()
        shutil.rmtree(cluster.root, ignore_errors=True)


def test_kuberay_entrypoint_is_not_run_again_after_ray_job_stop(tmp_path):
    """``ray job stop`` sends SIGTERM to the entrypoint's shell and every process below it (Ray 2.60's job
    supervisor): the stand-in ``lab`` exits 75 on it, as the lab does, and the shell loop ends with it: no second
    run of the command."""
    entrypoint = yaml.safe_load((EXAMPLES / "kuberay_rayjob.yaml").read_text())["spec"]["entrypoint"]
    write_exe(tmp_path / "lab", f'#!/bin/sh\necho "$*" >> {tmp_path / "calls"}\n'
              "trap 'exit 75' TERM\nsleep 60 & wait\n")
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "LAB_RETRY_DELAY_S": "0"}
    shell = subprocess.Popen(["/bin/sh", "-c", entrypoint], env=env, start_new_session=True)
    deadline = time.time() + 30
    while not (tmp_path / "calls").exists():
        assert time.time() < deadline and shell.poll() is None
        time.sleep(0.05)
    time.sleep(0.2)
    for pid in [shell.pid, *descendants(shell.pid)]:
        os.kill(pid, signal.SIGTERM)
    shell.wait(timeout=30)
    time.sleep(0.5)  # a loop that went on would have started the command again by now
    try:
        assert len((tmp_path / "calls").read_text().splitlines()) == 1
    finally:
        kill_pids([pid for pid in descendants(shell.pid) if pid_alive(pid)])


@pytest.mark.parametrize("lab_code, requeues", [(75, 1), (0, 0), (1, 0), (2, 0), (None, 0)])
def test_slurm_script_exits_with_the_labs_code_and_requeues_on_75_only(job_dir, lab_code, requeues):
    """The batch script around a stand-in ``lab`` that stops on SIGTERM/SIGUSR1 half a second after the first one
    (its commit) and exits ``lab_code`` (None: it is SIGKILLed instead): USR1 to the batch shell, TERM to every
    process of the job while the shell waits, then the stand-in's end. The script waits through both signals, exits
    with the stand-in's own status (137 for the SIGKILL, never bash's 138/143 of an interrupted ``wait``) and calls
    ``scontrol requeue`` once after 75 only."""
    write_exe(job_dir / "bin" / "lab", "#!/bin/bash\n"
              f"echo $$ > {job_dir / 'lab.pid'}\n"
              "trap 'got=1' TERM USR1\n"
              "while [ -z \"$got\" ]; do sleep 0.05; done\n"
              "sleep 0.5\n"
              f"exit {lab_code if lab_code is not None else 0}\n")
    job = start_slurm_job(job_dir, [])
    deadline = time.time() + 30
    while not (job_dir / "lab.pid").exists():
        assert time.time() < deadline and job.poll() is None
        time.sleep(0.05)
    time.sleep(0.2)  # the batch shell is in its `wait`
    os.kill(job.pid, signal.SIGUSR1)
    time.sleep(0.05)
    signal_job(job, signal.SIGTERM)
    if lab_code is None:
        os.kill(int((job_dir / "lab.pid").read_text()), signal.SIGKILL)
    code, out = finish(job, kill_after=30)
    assert code == (137 if lab_code is None else lab_code), out
    assert calls(job_dir) == [f"scontrol requeue {JOB_ID}"] * requeues
