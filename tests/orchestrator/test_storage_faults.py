"""Storage faults: a full disk and a read-only file system (a real tmpfs) and object-store errors (a fault-injecting
proxy in front of the test S3 server) either are ridden out (transient: retried, logged, the run completes) or stop
the trial cleanly (exit 75, one message, no traceback, no staging debris, every committed checkpoint intact); each
run then resumes to the end and equals an uninterrupted run."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from lab_helpers import DRIVER_ENV, REPO, SPECS, descendants, kill_pids, only_predir, overrides, run_cli, \
    uninterrupted_df

from orchestrator.errors import EXIT_RESUMABLE
from orchestrator.store import storage
from orchestrator.store.checkpoint import CheckpointStore

sys.path.insert(0, str(REPO / "tests"))
from storage_proxy import FaultProxy  # noqa: E402

ITEMS = ["meta.max_session=1", "meta.log_frequency=400", "meta.checkpoint_frequency=400", "meta.random_seed=21",
         "env.max_frame=3200"]


@functools.cache
def straight_df() -> pd.DataFrame:
    """train_df of the uninterrupted run every test compares its resumed run against."""
    return uninterrupted_df(ITEMS, 0).drop(columns=["wall_t", "fps"])


def assert_resumed_equals_uninterrupted(df: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(df.drop(columns=["wall_t", "fps"]), straight_df())


def wait_for(predicate, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def committed_frames(session_dir: str) -> list[int]:
    return CheckpointStore(session_dir).frames()


def assert_clean_stop(session_dir: str, code: int, err: str, out: str, *needles: str) -> None:
    """Exit 75, one ``error: storage fault`` line with the needles, no traceback, no debris, every checkpoint
    verifies."""
    assert code == EXIT_RESUMABLE, (code, err)
    assert "Traceback" not in err + out
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: storage fault: "), err
    message = err[err.index("error: storage fault"):]
    for needle in needles:
        assert needle in message, (needle, message)
    assert "resume with:" in out
    store = CheckpointStore(session_dir)
    names = storage.listdir(store.ckpt_dir)
    assert not [n for n in names if n.startswith((".staging-", ".tmp-"))], names
    frames = store.frames()
    assert frames and frames[-1] < 3200
    for frame in frames:  # every committed checkpoint is intact (sha256 of each file against its manifest)
        store.load(frame)


# ---------------------------------------------------------------- local: a real tmpfs
@pytest.fixture
def small_disk(tmp_path):
    """A 6 MB tmpfs mounted for the test (root only; skipped elsewhere), unmounted afterwards."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(mnt: Path, spare: int) -> Path:
    """Write zeros to ``mnt/filler`` until the disk is full, then give ``spare`` bytes back (room for a run.json
    and a few log lines, none for a checkpoint)."""
    filler = mnt / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    os.truncate(filler, filler.stat().st_size - spare)
    return filler


@pytest.mark.parametrize("fault", ["disk full", "read-only"])
def test_local_fault_stops_cleanly_then_resumes_exactly(ray_local, small_disk, capsys, fault):
    """A full disk / a file system remounted read-only after the first checkpoint: exit 75 naming the path, the
    error and what to do; then (space freed / writable again) ``train@`` completes the run exactly."""
    data = small_disk / "data"

    def inject() -> None:
        wait_for(lambda: list(data.glob("*/t0/s0/ckpt/0*/MANIFEST.json")), 120, "the first checkpoint")
        if fault == "disk full":
            fill(small_disk, spare=32768)
        else:
            subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)

    injector = threading.Thread(target=inject, daemon=True)
    injector.start()
    code = run_cli(SPECS, "ppo_cartpole", "train", "--data-dir", str(data), *overrides(ITEMS))
    injector.join(timeout=5)
    out, err = capsys.readouterr()
    predir = only_predir(data)
    sdir = str(predir / "t0/s0")
    if fault == "disk full":
        assert_clean_stop(sdir, code, err, out, str(predir), "No space left on device", "free space, then run")
        run = storage.read_json(str(predir / "run.json"))
        assert "No space left on device" in run["interrupted"]["cause"]
        assert run["sessions"]["t0_s0"]["status"] == "interrupted"
        (small_disk / "filler").unlink()
    else:
        assert_clean_stop(sdir, code, err, out, str(predir), "Read-only file system",
                          "make the file system writable again, then run")
        storage.read_json(str(predir / "run.json"))  # not written, and not damaged
        subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=True)

    assert run_cli(SPECS, "ppo_cartpole", f"train@{predir}", *overrides(ITEMS)) == 0
    run = storage.read_json(str(predir / "run.json"))
    assert run["sessions"]["t0_s0"]["status"] == "done" and "interrupted" not in run
    assert_resumed_equals_uninterrupted(pd.read_parquet(predir / "t0/s0/train_df.parquet"))


# ---------------------------------------------------------------- object store: faults through a proxy
def start_proxied_driver(argv: list[str], cwd: Path, endpoint: str, attempts: int) -> subprocess.Popen:
    """``python run_lab.py *argv`` with its own embedded Ray, its S3 client pointed at ``endpoint``."""
    env = {**os.environ, **DRIVER_ENV, "AWS_ENDPOINT_URL": endpoint, "AWS_ENDPOINT_URL_S3": endpoint,
           "LAB_STORAGE_ATTEMPTS": str(attempts)}
    return subprocess.Popen([sys.executable, str(REPO / "run_lab.py"), *argv, "--quiet"], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def s3_manifests(data: str) -> list[str]:
    try:
        return [n for n in storage.list_files(data) if n.endswith("MANIFEST.json")]
    except storage.StorageError:
        return []


def run_through(driver: subprocess.Popen, timeout: float = 150) -> tuple[int, str, str]:
    try:
        out, err = driver.communicate(timeout=timeout)
    finally:
        kill_pids(descendants(driver.pid))
    return driver.returncode, out, err


def test_transient_s3_errors_are_retried_and_logged(ray_local, tmp_path, s3_server, s3_bucket):
    """503 SlowDown, 500 and reset connections, to the driver and to a session's checkpoint writes: every one is
    retried (one warning each on the driver's terminal, the session's in its log.txt) and the run completes exactly."""
    data = f"{s3_bucket}/runs"
    with FaultProxy(s3_server) as proxy:
        proxy.inject("503", "PUT", times=1, path="run.json")
        proxy.inject("reset", "GET", times=1)
        driver = start_proxied_driver([SPECS, "ppo_cartpole", "train", "--data-dir", data, *overrides(ITEMS)],
                                      tmp_path, proxy.endpoint, attempts=7)
        wait_for(lambda: s3_manifests(data), 120, "the first checkpoint")
        proxy.inject("503", "PUT", times=2, path="/ckpt/")
        proxy.inject("500", "PUT", times=1, path="/ckpt/")
        code, out, err = run_through(driver)
        faulted = proxy.faulted()
    assert code == 0, err
    assert "Traceback" not in err
    assert len(faulted) == 5 and not proxy.faults, faulted
    (name,) = storage.listdir(data)
    log = storage.read_text(f"{data}/{name}/t0/s0/log.txt")
    session_retries = [line for line in log.splitlines() if line.startswith("storage retry: ")]
    assert len(session_retries) == 3, log
    assert sum("SLOW_DOWN" in line for line in session_retries) == 2
    assert sum("INTERNAL_FAILURE" in line for line in session_retries) == 1
    warnings = [line for line in err.splitlines() if line.startswith("warning:") and "retry 1 of 6" in line]
    assert len(warnings) == 2 + 3, err  # the driver's own two, and the session's three forwarded
    assert sum(line.startswith("warning: session t0_s0: storage retry: ") for line in warnings) == 3
    assert_resumed_equals_uninterrupted(storage.read_parquet(f"{data}/{name}/t0/s0/train_df.parquet"))


def test_persistent_s3_errors_stop_cleanly_then_resume_exactly(ray_local, tmp_path, s3_server, s3_bucket):
    """Every request answered 503 after the first checkpoint (the store stays down): retries exhausted, exit 75
    with the message; once the store answers again, ``train@`` completes the run exactly."""
    data = f"{s3_bucket}/runs"
    with FaultProxy(s3_server) as proxy:
        driver = start_proxied_driver([SPECS, "ppo_cartpole", "train", "--data-dir", data, *overrides(ITEMS)],
                                      tmp_path, proxy.endpoint, attempts=3)
        wait_for(lambda: s3_manifests(data), 120, "the first checkpoint")
        proxy.inject("503")
        code, out, err = run_through(driver)
    (name,) = storage.listdir(data)
    predir = f"{data}/{name}"
    assert_clean_stop(f"{predir}/t0/s0", code, err, out, predir, "HTTP status 503", "(failed 3 times)",
                      "check the object store and the network, then run")
    assert run_cli(SPECS, "ppo_cartpole", f"train@{predir}", *overrides(ITEMS)) == 0
    assert storage.read_json(f"{predir}/run.json")["sessions"]["t0_s0"]["status"] == "done"
    assert_resumed_equals_uninterrupted(storage.read_parquet(f"{predir}/t0/s0/train_df.parquet"))
