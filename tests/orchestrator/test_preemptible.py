"""Runs on preemptible capacity: ``train/search --name RUN`` re-run after SIGKILLs and SIGTERMs of its driver ends
exactly like an uninterrupted run, a finished run is left unchanged, a resume re-applies the run's own ``-s``
overrides, a restarted command takes its dead predecessor's lease, and the exit codes a scheduler reads."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pandas as pd
import pytest
import torch
from lab_helpers import (
    SPECS,
    descendants,
    files_digest,
    kill_driver_when,
    kill_pids,
    only_predir,
    overrides,
    run_cli,
    start_driver,
)

from orchestrator.errors import EXIT_RESUMABLE
from orchestrator.store import storage
from orchestrator.store.lease import Lease, LeaseBusyError

ITEMS = ["meta.max_session=1", "meta.log_frequency=800", "meta.checkpoint_frequency=800", "meta.random_seed=5",
         "env.max_frame=12000"]
COMPARED = lambda df: df.drop(columns=["wall_t", "fps"]).reset_index(drop=True)  # noqa: E731


def committed(predir, session=0):
    """Frames of the committed checkpoints of session ``session`` (trial 0)."""
    return sorted(int(m.parent.name) for m in predir.glob(f"t0/s{session}/ckpt/0*/MANIFEST.json"))


def newest_manifest(predir, session=0):
    """The newest committed checkpoint's manifest of a session."""
    frame = committed(predir, session)[-1]
    (path,) = [m for m in predir.glob(f"t0/s{session}/ckpt/0*/MANIFEST.json") if int(m.parent.name) == frame]
    return json.loads(path.read_text())


def sigterm_when(driver, ready, timeout=120, signum=signal.SIGTERM):
    """Signal (SIGTERM) a driver once ``ready()`` holds; returns its (exit code, stdout, stderr)."""
    tree = []
    try:
        deadline = time.time() + timeout
        while not ready():
            assert driver.poll() is None, "the driver ended before the signal"
            assert time.time() < deadline, "not ready in time"
            time.sleep(0.1)
        tree = descendants(driver.pid)
        driver.send_signal(signum)
        out, err = driver.communicate(timeout=90)
    finally:
        kill_pids(tree + descendants(driver.pid))
    return driver.returncode, out, err


def test_train_name_restart_loop_is_exact(ray_local, tmp_path, capsys):
    """The same ``train --name`` command, re-run after a SIGKILL before the first checkpoint, a SIGTERM, a SIGKILL
    and a SIGUSR1 at later checkpoints, ends with the train_df and weights of an uninterrupted run."""
    from orchestrator.session.loop import Session
    from orchestrator.spec.load import load_spec

    data = tmp_path / "data"
    command = [SPECS, "ppo_cartpole", "train", "--name", "job-42", "--data-dir", str(data), *overrides(ITEMS)]
    predir = data / "job-42"
    # 1: killed before its first checkpoint: the next run starts the session fresh with its seed
    kill_driver_when(start_driver(command, tmp_path), lambda: (predir / "ppo_cartpole_t0_s0_spec.json").exists(),
                     120, "the run's session spec")
    assert committed(predir) == []
    # 2: SIGTERM after a checkpoint: final checkpoint, exit 75
    code, out, err = sigterm_when(start_driver(command, tmp_path, capture=True),
                                  lambda: committed(predir) and committed(predir)[-1] >= 1600)
    assert code == EXIT_RESUMABLE, err
    assert "Traceback" not in err
    after_term = committed(predir)[-1]
    assert after_term < 12000
    # 3: SIGKILL at a later checkpoint
    later = lambda: committed(predir) and committed(predir)[-1] >= after_term + 1600  # noqa: E731
    kill_driver_when(start_driver(command, tmp_path), later, 120, "a later checkpoint")
    killed_at = committed(predir)[-1]
    assert after_term < killed_at < 12000
    # 4: SIGUSR1 (SLURM's warning before the time limit), like SIGTERM
    code, out, err = sigterm_when(start_driver(command, tmp_path, capture=True),
                                  lambda: committed(predir)[-1] >= killed_at + 1600, signum=signal.SIGUSR1)
    assert code == EXIT_RESUMABLE and "SIGUSR1: committing final checkpoints" in err, err
    after_usr1 = committed(predir)[-1]
    assert after_usr1 < 12000
    # 5: to the end
    assert run_cli(*command) == 0
    run = storage.read_json(str(predir / "run.json"))
    assert run["sessions"]["t0_s0"]["status"] == "done"
    assert [r["from_frames"]["t0_s0"] for r in run["resumes"]] == [0, after_term, killed_at, after_usr1]
    torch.set_num_threads(1)
    spec = load_spec(SPECS, "ppo_cartpole", ITEMS)
    straight = Session(spec, 5)
    straight.run_rl()
    resumed = pd.read_parquet(predir / "t0/s0/train_df.parquet")
    pd.testing.assert_frame_equal(COMPARED(resumed), COMPARED(straight.train_df))
    assert newest_manifest(predir)["meta"]["weights_sha256"] == straight.weights_sha256()
    # 6: the finished command again: exit 0, no file changed
    before = files_digest(predir)
    capsys.readouterr()
    assert run_cli(*command) == 0
    assert "is already complete at its max_frame 12000" in capsys.readouterr().out
    assert files_digest(predir) == before
    assert run_cli("ls", "--data-dir", str(data)) == 0
    assert "job-42  spec=ppo_cartpole  max_frame=12000" in capsys.readouterr().out


def test_resume_keeps_the_runs_own_overrides(ray_local, tmp_path, capsys):
    """Started with ``-s meta.max_session=2`` and resumed with the spec file (which says 4): still 2 sessions, no
    edit; a new ``-s`` given on the resume is the only edit, and it is remembered for the next resume."""
    data = tmp_path / "data"
    items = ["meta.max_session=2", "meta.log_frequency=800", "meta.checkpoint_frequency=800",
             "meta.random_seed=3", "env.max_frame=4000"]
    driver = start_driver([SPECS, "ppo_cartpole", "train", "--data-dir", str(data), *overrides(items)], tmp_path)
    kill_driver_when(driver, lambda: {p.parents[2].name for p in data.glob("*/t0/s*/ckpt/0*/MANIFEST.json")}
                     == {"s0", "s1"}, 120,  # each session committed (a loaded machine may run one ahead)
                     "a checkpoint")
    predir = only_predir(data)
    with open(SPECS, encoding="utf-8") as f:
        assert json.load(f)["ppo_cartpole"]["meta"]["max_session"] == 4
    capsys.readouterr()
    assert run_cli(SPECS, "ppo_cartpole", "train@latest", "--data-dir", str(data), "-s", "env.max_frame=4800") == 0
    out = capsys.readouterr().out
    assert "applied spec edit: env.max_frame: 4000 -> 4800" in out and "max_session" not in out
    run = storage.read_json(str(predir / "run.json"))
    assert sorted(run["sessions"]) == ["t0_s0", "t0_s1"] and not (predir / "t0/s2").exists()
    assert run["resumes"][-1]["spec_edits"] == ["env.max_frame: 4000 -> 4800"]
    saved = storage.read_json(str(predir / "overrides.json"))["overrides"]
    assert saved == items + ["env.max_frame=4800"]
    for s in (0, 1):
        assert pd.read_parquet(predir / f"t0/s{s}/train_df.parquet")["frame"].iloc[-1] == 4800


def test_name_bad_input_exits_2_and_changes_nothing(tmp_path, capsys):
    data = tmp_path / "data"
    other = data / "shared"
    other.mkdir(parents=True)
    (other / "dqn_cartpole_spec.json").write_text("{}")
    before = files_digest(data)
    assert run_cli(SPECS, "ppo_cartpole", "train", "--name", "shared", "--data-dir", str(data)) == 2
    err = capsys.readouterr().err
    assert "holds a run of 'dqn_cartpole', not of 'ppo_cartpole'" in err and "Traceback" not in err
    for bad in ("../up", "a/b", ".hidden", "", "x" * 201):
        assert run_cli(SPECS, "ppo_cartpole", "train", "--name", bad, "--data-dir", str(data)) == 2
        assert "expected a plain directory name" in capsys.readouterr().err
    assert run_cli(SPECS, "ppo_cartpole", "train", "--name", "new", "--data-dir", str(data),
                   "-s", "env.max_frame=-1") == 2
    assert "env.max_frame" in capsys.readouterr().err
    assert run_cli(SPECS, "ppo_cartpole", "dev", "--name", "x", "--data-dir", str(data)) == 2
    assert "--name applies to the modes train and search" in capsys.readouterr().err
    assert files_digest(data) == before
    assert sorted(p.name for p in data.iterdir() if not p.name.startswith(".")) == ["shared"]  # .assets: graphs' js


def test_train_latest_without_a_run_suggests_name(tmp_path, capsys):
    assert run_cli(SPECS, "ppo_cartpole", "train@latest", "--data-dir", str(tmp_path)) == 2
    assert "use 'train --name RUN'" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ lease takeover
@pytest.fixture
def fast_lease(monkeypatch):
    monkeypatch.setenv("LAB_LEASE_STALE_S", "2")
    monkeypatch.setenv("LAB_LEASE_HEARTBEAT_S", "0.3")


def lease_record(predir, **fields):
    """Write a holder's lease record with a heartbeat now."""
    record = {"driver_id": "other", "host": "elsewhere", "pid": 1, "pid_start": None, "mode": "train --name x",
              "since": "2026-01-01T00:00:00+00:00", "heartbeat": "now", "heartbeat_unix": time.time(), **fields}
    (predir / "lease.json").write_text(json.dumps(record))


def test_restart_takes_a_dead_local_holders_lease_at_once(tmp_path, fast_lease, capsys):
    import socket

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    lease_record(tmp_path, host=socket.gethostname(), pid=gone.pid)
    start = time.monotonic()
    with Lease(str(tmp_path), "train --name x", wait=True):
        took = time.monotonic() - start
    assert took < 1.5
    err = capsys.readouterr().err
    assert f"its process {gone.pid} on this host is gone" in err and "waiting" not in err


def test_restart_waits_for_another_hosts_lease_to_go_stale(tmp_path, fast_lease, capsys):
    lease_record(tmp_path)
    start = time.monotonic()
    with Lease(str(tmp_path), "train --name x", wait=True):
        took = time.monotonic() - start
        assert json.loads((tmp_path / "lease.json").read_text())["pid"] == os.getpid()
    assert 1.5 < took < 4.5
    err = capsys.readouterr().err
    assert "waiting up to" in err and "no heartbeat for 2 s" in err and "taking over the lease" in err


def test_two_live_copies_never_both_hold_the_lease(tmp_path, fast_lease, capsys):
    with Lease(str(tmp_path), "train --name x") as first:
        start = time.monotonic()
        with pytest.raises(LeaseBusyError, match=f"held by host {socket.gethostname()} pid {os.getpid()}"):
            Lease(str(tmp_path), "train --name x", wait=True).acquire()
        assert 2.0 < time.monotonic() - start < 5.0  # waited its bound (stale time + 2 heartbeats), then gave up
        assert json.loads((tmp_path / "lease.json").read_text())["driver_id"] == first.driver_id
        assert first.lost is None
    assert "waiting up to 2.6 s" in capsys.readouterr().err


SEARCH = ["meta.max_session=1", "meta.log_frequency=800", "meta.checkpoint_frequency=800", "meta.random_seed=11",
          'meta.resources={"num_cpus": 0.5, "num_gpus": 0}', "env.max_frame=4000",
          'search={"agent": {"algorithm": {"gamma__grid_search": [0.9, 0.99]}}}']


def test_search_name_sigterm_then_same_command_completes(ray_local, tmp_path):
    """``search --name``: SIGTERM gives exit 75, the same command finishes the search, and once more it leaves
    the finished trials untouched."""
    data = tmp_path / "data"
    command = [SPECS, "ppo_cartpole", "search", "--name", "sweep", "--data-dir", str(data), *overrides(SEARCH)]
    predir = data / "sweep"
    code, out, err = sigterm_when(start_driver(command, tmp_path, capture=True),
                                  lambda: list(predir.glob("t*/s0/ckpt/0*/MANIFEST.json")))
    assert code == EXIT_RESUMABLE, err
    assert run_cli(*command) == 0
    for t in (0, 1):
        assert pd.read_parquet(predir / f"t{t}/s0/train_df.parquet")["frame"].iloc[-1] == 4000
    trials = {t: files_digest(predir / f"t{t}") for t in (0, 1)}
    assert run_cli(*command) == 0
    assert {t: files_digest(predir / f"t{t}") for t in (0, 1)} == trials
