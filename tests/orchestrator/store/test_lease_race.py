"""Leases by conditional writes (``orchestrator.store.conditional``): create-if-absent and replace-if-unchanged on
local disk, the local S3 server (moto honours ``If-None-Match``/``If-Match``) and the local GCS server
(gcp-storage-emulator ignores ``ifGenerationMatch``: the lease detects it and confirms by a re-read); drivers racing
for one run, of which exactly one holds it; the heartbeat fence; a timed-out ``--name`` wait exits 75, and so does a
stop during the wait."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest
from lab_helpers import DRIVER_ENV, REPO, SPECS, descendants, kill_pids, overrides, run_cli

from orchestrator.errors import EXIT_RESUMABLE
from orchestrator.store import conditional, storage
from orchestrator.store import lease as lease_mod
from orchestrator.store.faults import StorageError


@pytest.fixture(params=["local", "s3", "gs"])
def store(request, tmp_path):
    """A fresh run directory URI on local disk, the local S3 server or the local GCS server."""
    if request.param == "local":
        return str(tmp_path / "run")
    bucket = request.getfixturevalue("s3_bucket" if request.param == "s3" else "gcs_bucket")
    return f"{bucket}/runs/job"


def test_conditional_writes(store):
    """Create only if absent, replace only at the version read; S3 and local disk refuse a stale condition. The GCS
    emulator ignores preconditions (it overwrites): ``ignores_preconditions`` says so, which is what the lease uses."""
    uri = storage.join(store, "obj.json")
    assert conditional.read(uri) is None
    v1 = conditional.write(uri, b"one", None)
    assert v1 and conditional.read(uri) == (b"one", v1)
    if store.startswith("gs://"):
        assert conditional.ignores_preconditions(uri, conditional.read(uri)) is not None
        return
    assert conditional.write(uri, b"two", None) is None  # exists
    v2 = conditional.write(uri, b"two", v1)
    assert v2 and v2 != v1 and conditional.read(uri) == (b"two", v2)
    assert conditional.write(uri, b"three", v1) is None  # v1 is stale
    assert conditional.read(uri) == (b"two", v2)
    assert conditional.ignores_preconditions(uri, conditional.read(uri)) is None


RACER = """
import os, sys, time
from orchestrator.store import conditional
from orchestrator.store.lease import Lease, LeaseHeldError
conditional.read(sys.argv[1] + "/warm-up")  # the store's client is built before the race
lease = Lease(sys.argv[1], "train --name job", wait=sys.argv[4] == "wait")
print("ready", flush=True)
while not os.path.exists(sys.argv[2]):
    time.sleep(0.001)
try:
    lease.acquire()
except LeaseHeldError:
    print("held", flush=True)
    sys.exit(2)
won = time.time()
time.sleep(float(sys.argv[3]))
print("won", won, time.time(), flush=True)
lease.release()
"""


def race(predir: str, go: str, drivers: int, hold_s: float, wait: bool = False) -> list[str]:
    """``drivers`` processes that try to take the lease of ``predir`` at the same instant (once all are ready, a
    file they poll for appears), with ``Lease(wait=wait)``; each one's answer: ``held``, or ``won {t0} {t1}`` with
    the wall times (s) between which it held the lease."""
    procs = [subprocess.Popen([sys.executable, "-c", RACER, predir, go, str(hold_s), "wait" if wait else "no"],
                              env={**os.environ},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(drivers)]
    try:
        for proc in procs:
            assert proc.stdout.readline().strip() == "ready", proc.communicate(timeout=60)
        open(go, "w").close()
        outs = []
        for proc in procs:
            out, err = proc.communicate(timeout=60)
            assert "Traceback" not in err, err
            outs.append(out.strip())
    finally:
        kill_pids([p.pid for p in procs if p.poll() is None])
    return outs


def test_racing_drivers_exactly_one_holds_the_lease(store, tmp_path):
    """Three drivers take the lease of one run at the same instant, in two rounds (a fresh run, then a stale record
    left by a driver that died on another host, taken over): exactly one wins each round."""
    uri = storage.join(store, "lease.json")
    for round_ in range(2):
        if round_:  # a driver that died on another host: stale
            storage.write_json(uri, {"driver_id": "dead", "host": "elsewhere", "pid": 1, "mode": "train",
                                     "heartbeat_unix": time.time() - 3600})
        outs = race(store, str(tmp_path / f"go{round_}"), 3, hold_s=1.5)
        assert sorted(out.split()[0] for out in outs) == ["held"] * 2 + ["won"], (round_, outs)
        assert not storage.exists(uri)  # the winner released it


def test_racing_drivers_that_wait_hold_the_lease_one_after_another(store, tmp_path):
    """Two drivers that wait for the lease (``train --name``) take it at the same instant: both hold it in turn,
    never at once. On the GCS emulator both writes succeed (it ignores preconditions): the driver whose record was
    overwritten finds the other's on reading it back and waits for it, as after any lost race (it used to exit 2)."""
    outs = race(store, str(tmp_path / "go"), 2, hold_s=1.0, wait=True)
    held = sorted(tuple(map(float, out.split()[1:])) for out in outs if out.startswith("won"))
    assert len(held) == 2, outs
    assert held[0][1] <= held[1][0], held  # the second took it after the first released it
    assert not storage.exists(storage.join(store, "lease.json"))


def test_heartbeat_fence_stops_the_holder_before_its_lease_goes_stale(tmp_path, monkeypatch):
    """Heartbeat writes failing (the store keeps answering 503): once none was written for ``fence_s()`` the holder
    counts its lease as lost (``check`` raises the resumable ``LeaseLostError``), before the stale time, when another
    driver could take it over."""
    monkeypatch.setenv("LAB_LEASE_STALE_S", "3")
    monkeypatch.setenv("LAB_LEASE_HEARTBEAT_S", "0.5")
    monkeypatch.setenv("LAB_STORAGE_ATTEMPTS", "1")
    held = lease_mod.Lease(str(tmp_path), "train")
    held.acquire()
    t0 = time.monotonic()
    real_write = conditional.write

    def slow_down(uri, data, version):
        raise StorageError(f"cannot write '{uri}': AWS Error SLOW_DOWN", uri, transient=True)

    monkeypatch.setattr(conditional, "write", slow_down)
    try:
        held.check()
        while held.lost is None and time.monotonic() - t0 < 10:
            time.sleep(0.05)
        fenced = time.monotonic() - t0
        assert held.lost is not None and "no heartbeat could be written" in held.lost["reason"]
        assert lease_mod.fence_s() - 0.6 < fenced < 3.0  # fence 2 s after the last write (<= 0.5 s before t0)
        record = json.loads((tmp_path / "lease.json").read_text())
        assert lease_mod.staleness(record, 3.0) is None  # still live for others: the holder stopped first
        with pytest.raises(lease_mod.LeaseLostError, match="no longer holds the lease") as err:
            held.check()
        assert err.value.hint
    finally:
        monkeypatch.setattr(conditional, "write", real_write)
        held.release()


def test_named_wait_that_times_out_exits_75(ray_local, tmp_path, monkeypatch, capsys):
    """``train --name`` whose run is held by a driver on another host that keeps heartbeating: after its bounded
    wait it exits 75 naming the holder's host and pid and saying to re-run later; the run is untouched."""
    monkeypatch.setenv("LAB_LEASE_STALE_S", "2")
    monkeypatch.setenv("LAB_LEASE_HEARTBEAT_S", "0.3")
    predir = tmp_path / "data" / "job"
    predir.mkdir(parents=True)
    lease_file = predir / "lease.json"
    stop = threading.Event()

    def heartbeat() -> None:
        while not stop.is_set():
            lease_file.write_text(json.dumps({"driver_id": "other", "host": "node-7", "pid": 4242, "mode": "train",
                                              "since": "then", "heartbeat_unix": time.time()}))
            stop.wait(0.2)

    beating = threading.Thread(target=heartbeat, daemon=True)
    beating.start()
    try:
        code = run_cli(SPECS, "reinforce_cartpole", "train", "--name", "job", "--data-dir", str(tmp_path / "data"))
    finally:
        stop.set()
        beating.join()
    err = capsys.readouterr().err
    assert code == EXIT_RESUMABLE, err
    assert "held by host node-7 pid 4242" in err and "re-run the same command later" in err, err
    assert "Traceback" not in err
    assert sorted(p.name for p in predir.iterdir()) == ["lease.json"]


@pytest.mark.parametrize("bucket", ["s3_bucket", "gcs_bucket"])
def test_two_lab_drivers_racing_for_one_named_run_on_an_object_store_exactly_one_trains(tmp_path, request, bucket):
    """Two ``lab train --name job`` started at once on one S3 (or GCS) run: one trains; the other waits for its lease
    and then finds the run complete (exit 0, nothing trained), or exits 75 if the wait ran out."""
    data = f"{request.getfixturevalue(bucket)}/runs"
    argv = [sys.executable, str(REPO / "run_lab.py"), SPECS, "reinforce_cartpole", "train", "--name", "job",
            "--data-dir", data, "--quiet",
            *overrides(["meta.max_session=1", "env.max_frame=1000", "meta.log_frequency=500", "meta.random_seed=3"])]
    env = {**os.environ, **DRIVER_ENV, "LAB_LEASE_STALE_S": "60"}
    drivers = [subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True) for _ in range(2)]
    results = []
    try:
        for driver in drivers:
            out, err = driver.communicate(timeout=240)
            results.append((driver.returncode, out, err))
    finally:
        for driver in drivers:
            kill_pids(descendants(driver.pid))
    trained = [r for r in results if "train --name job: " in r[1] and "session(s))" in r[1]]
    assert len(trained) == 1, results
    other = next(r for r in results if r is not trained[0])
    assert trained[0][0] == 0, trained[0][2]
    assert other[0] in (0, EXIT_RESUMABLE) and "Traceback" not in other[2], other
    if other[0] == 0:
        assert "already complete" in other[1] + other[2] or "nothing to do" in other[1] + other[2], other
    run = storage.read_json(f"{data}/job/run.json")
    assert run["sessions"]["t0_s0"]["status"] == "done" and not run["sessions"]["t0_s0"].get("restarts")
    assert not storage.exists(f"{data}/job/lease.json")


def signal_when_waiting(drivers: dict, errs: dict) -> None:
    """Send each driver its signal (the dict's key) once its stderr (``errs``) says it waits for a lease."""
    waiting, deadline = dict(drivers), time.time() + 120
    while waiting:
        assert time.time() < deadline, f"no lease wait within 120 s: {list(waiting)}"
        for sig, driver in list(waiting.items()):
            assert driver.poll() is None, errs[sig].read_text()
            if "waiting up to" in errs[sig].read_text():
                driver.send_signal(sig)
                del waiting[sig]
        time.sleep(0.1)


def test_a_stop_during_the_lease_wait_exits_75_and_leaves_the_holders_run_untouched(tmp_path):
    """SIGTERM, SIGINT and SIGUSR1 to three ``train --name`` drivers, each waiting for the lease of its run (held by a
    driver on another host that keeps heartbeating): each exits 75 with no traceback and nothing left running, and
    the run still holds only the holder's lease."""
    import signal

    argv = [sys.executable, str(REPO / "run_lab.py"), SPECS, "reinforce_cartpole", "train", "--name", "job", "--quiet"]
    env = {**os.environ, **DRIVER_ENV, "LAB_LEASE_STALE_S": "120", "LAB_LEASE_HEARTBEAT_S": "0.3"}
    stop = threading.Event()
    holder = {"driver_id": "other", "host": "node-7", "pid": 4242, "mode": "train", "since": "then"}
    runs = {sig: tmp_path / sig.name / "data" / "job" for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    for predir in runs.values():
        predir.mkdir(parents=True)

    def heartbeat() -> None:
        while not stop.is_set():
            for predir in runs.values():
                (predir / "lease.json").write_text(json.dumps({**holder, "heartbeat_unix": time.time()}))
            stop.wait(0.2)

    beating = threading.Thread(target=heartbeat, daemon=True)
    beating.start()
    drivers, results = {}, {}
    try:
        for sig, predir in runs.items():
            with open(predir.parents[1] / "err.txt", "w") as err:
                drivers[sig] = subprocess.Popen([*argv, "--data-dir", str(predir.parent)], cwd=predir.parents[1],
                                                env=env, stdout=subprocess.DEVNULL, stderr=err, text=True)
        signal_when_waiting(drivers, {sig: predir.parents[1] / "err.txt" for sig, predir in runs.items()})
        for sig, driver in drivers.items():
            driver.wait(timeout=60)
            results[sig] = (driver.returncode, (runs[sig].parents[1] / "err.txt").read_text(), descendants(driver.pid))
    finally:
        stop.set()
        beating.join()
        for driver in drivers.values():
            kill_pids(descendants(driver.pid) + ([driver.pid] if driver.poll() is None else []))
    for sig, (code, err, left) in results.items():
        assert code == EXIT_RESUMABLE, (sig.name, err)
        assert "Traceback" not in err and f"{sig.name}: stopped before any session started" in err, (sig.name, err)
        assert left == [], (sig.name, left)
        assert sorted(p.name for p in runs[sig].iterdir()) == ["lease.json"], sig.name
        assert json.loads((runs[sig] / "lease.json").read_text())["driver_id"] == "other"
