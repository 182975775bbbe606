"""Fault tolerance: a killed session actor recovers by itself, a raising session fails alone, a
session killed too often is marked failed, SIGTERM to the driver interrupts cleanly, a lost node's
session comes back elsewhere, and failed checkpoint writes are retried without losing training."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from lab_helpers import DRIVER_ENV, REPO, SPECS, descendants, kill_pids, only_predir, overrides, run_cli, start_driver

from orchestrator.errors import EXIT_RESUMABLE
from orchestrator.session import runner as runner_mod
from orchestrator.session.runner import SessionRunner
from orchestrator.spec.load import load_spec
from orchestrator.store import checkpoint, storage

PPO = ["meta.max_session=2", "meta.log_frequency=1000", "meta.checkpoint_frequency=1000", "meta.random_seed=10"]


def run_in_thread(*argv):
    """Start ``lab ...`` in a background thread; returns (thread, result list)."""
    result = []
    thread = threading.Thread(target=lambda: result.append(run_cli(*argv)), daemon=True)
    thread.start()
    return thread, result


def wait_for(predicate, timeout=180, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


def session_entry(data: Path, key: str):
    """run.json entry of a session, once the run and the entry exist."""
    runs = list(data.glob("*/run.json"))
    if not runs:
        return None
    try:
        return storage.read_json(str(runs[0]))["sessions"].get(key)
    except (ValueError, FileNotFoundError):
        return None


def kill_when_checkpointed(data: Path, key: str, min_frame: int, old_pid=None) -> int:
    """SIGKILL a session actor's worker (its PID from run.json) once it has committed ``min_frame``."""
    entry = wait_for(lambda: (e := session_entry(data, key)) and e.get("pid") and e.get("pid") != old_pid
                     and e.get("status") == "running" and e.get("checkpoint", 0) >= min_frame and e,
                     what=f"{key} to checkpoint frame {min_frame}")
    os.kill(entry["pid"], signal.SIGKILL)
    return entry["pid"]


def assert_rows(df: pd.DataFrame, log_frequency: int, max_frame: int) -> None:
    assert df["frame"].tolist() == list(range(log_frequency, max_frame + 1, log_frequency))


def test_killed_session_actor_is_restarted_from_its_checkpoint(ray_local, tmp_path):
    data = tmp_path / "data"
    thread, result = run_in_thread(SPECS, "ppo_cartpole", "train", "--data-dir", str(data),
                                   *overrides(PPO + ["env.max_frame=12000"]))
    kill_when_checkpointed(data, "t0_s0", 3000)
    thread.join(timeout=300)
    assert result == [0]
    predir = only_predir(data)
    run = storage.read_json(str(predir / "run.json"))
    s0, s1 = run["sessions"]["t0_s0"], run["sessions"]["t0_s1"]
    assert s0["status"] == s1["status"] == "done" and s0["frame"] == s1["frame"] == 12000
    assert len(s0["restarts"]) == 1 and s0["restarts"][0]["frame_restored"] >= 3000
    assert s0["restarts"][0]["reason"] == "ActorDiedError" and s1["restarts"] == []
    for s in (0, 1):  # no duplicate and no missing log rows
        assert_rows(pd.read_parquet(predir / f"t0/s{s}/train_df.parquet"), 1000, 12000)


def test_session_killed_more_than_max_restarts_is_failed(ray_local, tmp_path):
    data = tmp_path / "data"
    thread, result = run_in_thread(SPECS, "ppo_cartpole", "train", "--data-dir", str(data),
                                   *overrides(PPO + ["env.max_frame=12000", "meta.max_restarts=1"]))
    pid = kill_when_checkpointed(data, "t0_s0", 2000)
    kill_when_checkpointed(data, "t0_s0", 2000, old_pid=pid)
    thread.join(timeout=300)
    assert result == [1]
    run = storage.read_json(str(only_predir(data) / "run.json"))
    assert run["sessions"]["t0_s0"]["status"] == "failed"
    assert "max_restarts=1" in run["sessions"]["t0_s0"]["error"]
    assert run["sessions"]["t0_s1"]["status"] == "done"


def test_raising_session_fails_alone(ray_local, tmp_path, capsys):
    data = tmp_path / "data"
    code = run_cli(SPECS, "ppo_cartpole", "train", "--data-dir", str(data),
                   *overrides(PPO + ["env.max_frame=4000", "env.num_envs=1",
                                   "env.name=tests.fault_envs:FailingCartPole-v0"]))
    assert code == 1
    predir = only_predir(data)
    run = storage.read_json(str(predir / "run.json"))
    s0, s1 = run["sessions"]["t0_s0"], run["sessions"]["t0_s1"]
    assert s0["status"] == "failed" and "injected failure" in s0["error"] and s0["restarts"] == []
    assert s1["status"] == "done" and s1["frame"] == 4000
    assert "injected failure" in (predir / "t0/s0/log.txt").read_text()
    assert "t0_s0 failed" in capsys.readouterr().err


def test_sigterm_to_driver_interrupts_then_train_latest_completes(ray_local, tmp_path):
    items = PPO + ["env.max_frame=16000"]
    driver = start_driver([SPECS, "ppo_cartpole", "train", *overrides(items)], tmp_path, capture=True)
    tree = []
    try:
        wait_for(lambda: {m.parents[2].name for m in tmp_path.glob("data/*/t0/s*/ckpt/0*/MANIFEST.json")}
                 == {"s0", "s1"}, what="checkpoints of both sessions")
        predir = only_predir(tmp_path / "data")
        before = {s: max(int(p.name) for p in (predir / f"t0/s{s}/ckpt").glob("0*")) for s in (0, 1)}
        tree = descendants(driver.pid)
        driver.send_signal(signal.SIGTERM)
        out, err = driver.communicate(timeout=90)
    finally:
        kill_pids(tree + descendants(driver.pid))
    assert driver.returncode == EXIT_RESUMABLE, err
    assert f"train@{predir}" in out
    run = storage.read_json(str(predir / "run.json"))
    for s in (0, 1):
        entry = run["sessions"][f"t0_s{s}"]
        assert entry["status"] == "interrupted" and entry["checkpoint"] >= before[s]
        assert checkpoint.CheckpointStore(str(predir / f"t0/s{s}")).frames()[-1] == entry["checkpoint"]
    assert run_cli(SPECS, "ppo_cartpole", "train@latest", "--data-dir", str(tmp_path / "data"),
                   *overrides(items)) == 0
    run = storage.read_json(str(predir / "run.json"))
    for s in (0, 1):
        assert run["sessions"][f"t0_s{s}"]["status"] == "done"
        assert_rows(pd.read_parquet(predir / f"t0/s{s}/train_df.parquet"), 1000, 16000)


def test_signal_while_the_driver_handles_a_batch_stops_cleanly(ray_local, tmp_path, monkeypatch, capsys):
    """SIGTERM arriving between the watch loop's ``ray.wait`` and the handling of its ready streams (here: right
    after the first wait that returns a ready stream, before the sessions' ``started`` events are read) used to
    release the streams under the loop (KeyError, exit 1, no final checkpoints); the handler now only flags the
    stop and the loop acts on it at its next turn."""
    from orchestrator import trial as trial_mod

    real_wait, sent = trial_mod.ray.wait, []

    def wait_then_signal(refs, **kwargs):
        ready, rest = real_wait(refs, **kwargs)
        if ready and not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGTERM)  # its Python handler runs here, in this (main) thread
        return ready, rest

    monkeypatch.setattr(trial_mod.ray, "wait", wait_then_signal)
    data = tmp_path / "data"
    code = run_cli(SPECS, "ppo_cartpole", "train", "--data-dir", str(data), *overrides(PPO + ["env.max_frame=200000"]))
    out, err = capsys.readouterr()
    assert sent and "SIGTERM: committing final checkpoints" in err and "Traceback" not in err
    assert code == EXIT_RESUMABLE, err
    predir = only_predir(data)
    assert f"train@{predir}" in out
    run = storage.read_json(str(predir / "run.json"))
    for s in (0, 1):
        entry = run["sessions"][f"t0_s{s}"]
        assert entry["status"] in ("interrupted", "not started"), entry
        if entry["status"] == "interrupted":  # its final checkpoint is committed and is the newest on disk
            assert checkpoint.CheckpointStore(str(predir / f"t0/s{s}")).frames()[-1] == entry["checkpoint"]


NODE_LOSS_SCRIPT = textwrap.dedent("""
    import json, os, signal, sys, threading, time
    import ray
    from ray.cluster_utils import Cluster
    from orchestrator.cli import parse
    from orchestrator.store import storage
    from orchestrator.modes.train import run_train

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    worker = cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    blocker = ray.remote(num_cpus=1)(lambda: time.sleep(600)).remote()  # holds the head's CPU at first
    data = sys.argv[1]
    args = parse([sys.argv[2], "ppo_cartpole", "train", "--data-dir", data, "--quiet",
                  "-s", "meta.max_session=1", "-s", "meta.log_frequency=1000",
                  "-s", "meta.checkpoint_frequency=1000", "-s", "env.max_frame=10000"])
    def remove_node():
        while True:
            runs = [os.path.join(data, d, "run.json") for d in os.listdir(data)] if os.path.isdir(data) else []
            entry = storage.read_json(runs[0])["sessions"].get("t0_s0", {}) if runs and os.path.exists(runs[0]) else {}
            if entry.get("checkpoint", 0) >= 3000:
                break
            time.sleep(0.1)
        ray.cancel(blocker, force=True)       # free the head's CPU for the replacement
        cluster.remove_node(worker)           # the node running the session is lost
    threading.Thread(target=remove_node, daemon=True).start()
    code = run_train(args)
    print("EXIT", code)
    ray.shutdown()
    cluster.shutdown()
""")


def test_node_loss_session_comes_back_on_remaining_node(tmp_path):
    script = tmp_path / "node_loss.py"
    script.write_text(NODE_LOSS_SCRIPT)
    env = {**os.environ, **DRIVER_ENV, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "data"), SPECS], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        kill_pids(descendants(proc.pid))
    assert "EXIT 0" in out, err[-3000:]
    predir = only_predir(tmp_path / "data")
    entry = storage.read_json(str(predir / "run.json"))["sessions"]["t0_s0"]
    assert entry["status"] == "done" and len(entry["restarts"]) == 1
    assert entry["restarts"][0]["frame_restored"] >= 3000
    assert_rows(pd.read_parquet(predir / "t0/s0/train_df.parquet"), 1000, 10000)


def test_failed_checkpoint_writes_are_retried_and_training_continues(tmp_path, monkeypatch):
    spec = load_spec(SPECS, "ppo_cartpole", ["env.max_frame=4000", "meta.log_frequency=1000",
                                             "meta.checkpoint_frequency=1000"])
    monkeypatch.setattr(runner_mod, "COMMIT_BACKOFF_S", (0.0, 0.0))
    real_commit, calls = checkpoint.CheckpointStore.commit, []

    def flaky_commit(self, frame, files, meta):
        calls.append(frame)
        if frame == 2000:  # the store is unavailable for every attempt at frame 2000
            raise storage.StorageError("injected: store unavailable")
        return real_commit(self, frame, files, meta)

    monkeypatch.setattr(checkpoint.CheckpointStore, "commit", flaky_commit)
    runner = SessionRunner(spec, str(tmp_path / "ppo_cartpole_2026_01_01_000000"), 0, 0, 1, resume=False)
    events = list(runner.events())
    kinds = [(e.kind, getattr(e, "frame", None)) for e in events if e.kind != "log"]
    assert ("checkpoint_failed", 2000) in kinds and ("checkpoint", 3000) in kinds and kinds[-1] == ("done", 4000)
    assert calls.count(2000) == 3  # first try + 2 retries
    store = checkpoint.CheckpointStore(runner.session_dir)
    assert 2000 not in store.frames() and store.frames()[-1] == 4000
    manifest, _ = store.latest_valid()
    assert manifest.frame == 4000
    assert "injected: store unavailable" in (Path(runner.session_dir) / "log.txt").read_text()


def test_sigterm_to_a_session_actor_commits_a_final_checkpoint_and_ends_an_empty_one(ray_local, tmp_path):
    """SIGTERM to a session actor's process (as Ray or a node's shutdown sends it): a hosted session stops at its
    next step and commits a final checkpoint (``interrupted``, the stream ends cleanly); an actor with no session
    yet has nothing to save and its process ends, as the signal's default action would."""
    import psutil
    import ray

    from orchestrator.session_actor import SessionActor

    spec = load_spec(SPECS, "ppo_cartpole", ["env.max_frame=300000", "meta.log_frequency=512",
                                             "meta.tensorboard=false", "meta.random_seed=3"])
    predir = tmp_path / "ppo_cartpole_2026_01_01_000000"
    actor = SessionActor.options(num_cpus=0.5).remote()
    empty = SessionActor.options(num_cpus=0.5).remote()
    try:
        pid, empty_pid = ray.get([actor.pid.remote(), empty.pid.remote()])
        stream = actor.run.remote({"spec": spec, "predir": str(predir), "trial": 0, "session": 0, "seed": 3,
                                   "resume": False, "num_threads": 1})
        events, sent = [], False
        for ref in stream:
            event = ray.get(ref)
            events.append(event)
            if event.kind == "batch" and not sent:  # it trains: a checkpoint was committed
                os.kill(pid, signal.SIGTERM)
                sent = True
        last = events[-1]
        assert last.kind == "interrupted" and last.checkpoint and 0 < last.frame < 300000
        assert checkpoint.CheckpointStore(str(predir / "t0/s0")).frames()[-1] == last.frame
        assert psutil.pid_exists(pid)  # the actor stays, for another session
        os.kill(empty_pid, signal.SIGTERM)
        wait_for(lambda: not psutil.pid_exists(empty_pid) or psutil.Process(empty_pid).status() == "zombie",
                 timeout=30, what="the empty actor's process to end")
    finally:
        ray.kill(actor)
        ray.kill(empty)


def test_sigterm_to_a_session_actor_moves_the_session_from_a_checkpoint_taken_after_it(ray_local, tmp_path):
    """SIGTERM to a running session's actor (a node's processes ended as a pod's are): the session commits a
    checkpoint at once and the driver restarts it in a new actor from that checkpoint (run.json: ``cause:
    preempted``, ``reason: SIGTERM``, nothing lost), not counted against ``meta.max_restarts`` (0 here); the run
    completes with every log row once. ``SlowCartPole`` trains at most ~1,000 frames/s, so the signal lands between
    the periodic checkpoints (every 2,048 frames)."""
    data = tmp_path / "data"
    items = ["meta.max_session=1", "env.num_envs=4", "env.name=tests.fault_envs:SlowCartPole-v0", "env.max_frame=6144",
             "meta.log_frequency=512", "meta.checkpoint_frequency=2048", "meta.max_restarts=0", "meta.random_seed=3"]
    thread, result = run_in_thread(SPECS, "ppo_cartpole", "train", "--data-dir", str(data), "--quiet",
                                   *overrides(items))
    entry = wait_for(lambda: (e := session_entry(data, "t0_s0")) and e.get("pid") and e.get("checkpoint", 0) >= 2048
                     and e, what="t0_s0 to checkpoint frame 2048")
    time.sleep(0.3)  # into the next checkpoint interval
    periodic = checkpoint.CheckpointStore(str(only_predir(data) / "t0/s0")).frames()
    os.kill(entry["pid"], signal.SIGTERM)
    thread.join(timeout=300)
    assert result == [0]
    predir = only_predir(data)
    s0 = storage.read_json(str(predir / "run.json"))["sessions"]["t0_s0"]
    assert s0["status"] == "done" and s0["frame"] == 6144 and s0["pid"] != entry["pid"]
    (restart,) = s0["restarts"]
    assert restart["cause"] == "preempted" and restart["reason"] == "SIGTERM" and restart["frames_lost"] == 0
    assert restart["frame_restored"] > max(periodic)  # committed after the signal, mid-interval
    assert_rows(pd.read_parquet(predir / "t0/s0/train_df.parquet"), 512, 6144)
