"""What a plain search prints: the lab's own lines (trials ``t{T}`` with their sampled values, per-session progress
as ``train`` prints it off a terminal, each once, the end table by ``t{T}``, a TensorBoard line at the run's own
events), and nothing of Ray Tune's (its boxes, its trial ids, its TensorBoard path under Ray's temp dir).

The search runs through the CLI as a subprocess, its output to files (not a terminal), with its own embedded Ray
whose leftover processes the test kills by PID.
"""

import os
import re
import subprocess
import sys
import time

from lab_helpers import DRIVER_ENV, REPO, SPECS, descendants, kill_pids, overrides, pid_alive

from orchestrator.search.console import SearchConsole

GAMMA_GRID = 'search={"agent": {"algorithm": {"gamma__grid_search": [0.9, 0.99]}}}'
ITEMS = ["meta.max_session=1", "env.max_frame=800", "meta.log_frequency=400", "meta.checkpoint_frequency=800",
         "meta.random_seed=11", 'meta.resources={"num_cpus": 0.5, "num_gpus": 0}', GAMMA_GRID]
TUNE_BOX = re.compile("[\u2500-\u257f]")  # box-drawing characters of Tune's tables
TUNE_TRIAL_ID = re.compile(r"\b[0-9a-f]{5}_[0-9]{5}\b")
PROGRESS = re.compile(r"^t\d+_s\d+ frame \d+/800 fps \S+ total_reward_ma \S+( \w+)?$")


def run_search(tmp_path):
    """``lab SPECS ppo_cartpole search`` (no ``--quiet``) to files; returns (exit code, stdout, stderr)."""
    out_path, err_path = tmp_path / "out.txt", tmp_path / "err.txt"
    tree: set[int] = set()
    with open(out_path, "w") as out, open(err_path, "w") as err:
        driver = subprocess.Popen(
            [sys.executable, str(REPO / "run_lab.py"), SPECS, "ppo_cartpole", "search", "--data-dir",
             str(tmp_path / "data"), *overrides(ITEMS)],
            cwd=tmp_path, env={**os.environ, **DRIVER_ENV, "COLUMNS": "200"}, stdout=out, stderr=err)
        try:
            deadline = time.time() + 300
            while driver.poll() is None and time.time() < deadline:
                tree.update(descendants(driver.pid))
                time.sleep(0.5)
            assert driver.poll() is not None, "the search did not end within 300 s"
        finally:
            kill_pids([driver.pid, *(p for p in tree if pid_alive(p))])
    return driver.returncode, out_path.read_text(), err_path.read_text()


def test_a_plain_search_prints_the_labs_lines_not_tunes(tmp_path):
    code, out, err = run_search(tmp_path)
    assert code == 0, out + err
    lines = out.splitlines()
    predir = next(line.split(": ", 1)[1].split(" (")[0] for line in lines if line.startswith("search: "))
    assert f"tensorboard --logdir {predir}" in out
    for text in (out, err):
        assert not TUNE_BOX.search(text), text
        assert not TUNE_TRIAL_ID.search(text), text
    # no results or TensorBoard path of Tune's own (under ~/ray_results or Ray's temp dir); Ray may name its temp dir
    # on stderr for other reasons (e.g. a warning about /dev/shm)
    tune_paths = ("ray_results", "/tmp/ray/", "driver_artifacts")
    assert not any(p in out for p in tune_paths), out
    assert not any(p in line for line in err.splitlines() if "tensorboard" in line.lower() for p in tune_paths), err
    assert "t0 started: agent.algorithm.gamma=0.9" in lines and "t1 started: agent.algorithm.gamma=0.99" in lines
    progress = [line for line in lines if PROGRESS.match(line)]
    for t in (0, 1):
        assert any(line.startswith(f"t{t}_s0 frame 800/800 ") and line.endswith(" done") for line in progress)
        assert any(line.startswith(f"t{t} done: total_reward_ma ") for line in lines)
    assert len(progress) == len(set(progress)), progress  # each progress line once
    table = [line.split()[0] for line in lines if re.match(r"^\s*t[01]\s+0\.99?\s+done\s", line)]
    assert sorted(table) == ["t0", "t1"], out  # the end table names its trials t{T}

def test_the_console_shows_a_session_only_when_its_frame_or_status_changed(capsys):
    console = SearchConsole()
    spec = {"env": {"max_frame": 800}}
    row = {"frame": 400, "fps": 100.0, "total_reward_ma": 9.5, "status": ""}
    with console.showing(spec, quiet=False):
        console.result({"progress": {"t2_s0": row}})
        console.result({"progress": {"t2_s0": row}})  # the same row again (a sibling session advanced)
        console.result({"progress": {"t2_s0": {**row, "frame": 800, "status": "done"}}})
        console.trial_ended("t2", {"ran": True, "total_reward_ma": 9.5, "frame": 800, "sessions": 1,
                                   "progress": {"t2_s0": {**row, "frame": 800, "status": "done"}}})
    with console.showing(spec, quiet=True):
        console.trial_started("t3", {"agent.algorithm.gamma": 0.9})
        console.result({"progress": {"t3_s0": row}})
    assert capsys.readouterr().out.splitlines() == [
        "t2_s0 frame 400/800 fps 100.0 total_reward_ma 9.5",
        "t2_s0 frame 800/800 fps 100.0 total_reward_ma 9.5 done",
        "t2 done: total_reward_ma 9.5 at frame 800 (mean of 1 session(s))"]
