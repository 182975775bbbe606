"""Storage faults: a full disk and a read-only file system (a real tmpfs) and object-store errors (a fault-injecting
proxy in front of the test S3 server) either are ridden out (transient: retried, logged, the run completes) or stop
the trial cleanly (exit 75, one message, no traceback, no staging debris, every committed checkpoint intact); each
run then resumes to the end and equals an uninterrupted run."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from lab_helpers import (
    DRIVER_ENV,
    REPO,
    SPECS,
    descendants,
    kill_pids,
    overrides,
    run_cli,
    uninterrupted_df,
)

from orchestrator.errors import EXIT_RESUMABLE
from orchestrator.store import faults, storage
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
    """Exit 75, one ``error: storage fault`` message holding each needle, no traceback, no debris, every checkpoint
    verifies."""
    assert code == EXIT_RESUMABLE, (code, err)
    assert "Traceback" not in err + out
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: storage fault: "), err
    message = err[err.index("error: storage fault"):]
    for needle in needles:  # "A|B": either
        assert any(n in message for n in needle.split("|")), (needle, message)
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


def start_lab(argv: list[str], cwd: Path, **env: str) -> subprocess.Popen:
    """``python run_lab.py *argv --quiet`` with its own embedded Ray and ``env`` added, stdout/stderr captured."""
    return subprocess.Popen([sys.executable, str(REPO / "run_lab.py"), *argv, "--quiet"], cwd=cwd,
                            env={**os.environ, **DRIVER_ENV, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def run_through(driver: subprocess.Popen, timeout: float = 150) -> tuple[int, str, str]:
    """Wait for ``driver``; its exit code, stdout, stderr (its leftover processes killed by PID)."""
    try:
        out, err = driver.communicate(timeout=timeout)
    finally:
        kill_pids(descendants(driver.pid))
    return driver.returncode, out, err


@pytest.mark.parametrize("fault", ["disk full", "read-only"])
def test_local_fault_stops_cleanly_then_resumes_exactly(ray_local, small_disk, tmp_path, capsys, fault):
    """A full disk / a file system remounted read-only after the first checkpoint: exit 75 naming the path, the
    error and what to do; then (space freed / writable again) the same ``train --name`` command completes the run
    exactly."""
    data = small_disk / "data"
    argv = [SPECS, "ppo_cartpole", "train", "--name", "job", "--data-dir", str(data), *overrides(ITEMS)]
    driver = start_lab(argv, tmp_path)
    try:
        wait_for(lambda: list(data.glob("job/t0/s0/ckpt/0*/MANIFEST.json")), 120, "the first checkpoint")
    finally:
        if fault == "disk full":
            fill(small_disk, spare=32768)
        else:
            subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    code, out, err = run_through(driver)
    predir = data / "job"
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
        assert storage.read_json(str(predir / "run.json"))["sessions"]["t0_s0"]["status"] == "running"  # intact
        subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=True)

    assert run_cli(*argv) == 0
    run = storage.read_json(str(predir / "run.json"))
    assert run["sessions"]["t0_s0"]["status"] == "done" and "interrupted" not in run
    assert_resumed_equals_uninterrupted(pd.read_parquet(predir / "t0/s0/train_df.parquet"))


# ---------------------------------------------------------------- local / network file system: transient errno
class FlakyFileSystem:
    """A local pyarrow filesystem whose calls on paths below ``root`` raise ``OSError(code)``: the first ``times``
    of them, or every one (``times=None``); ``calls`` counts the faulted calls."""

    def __init__(self, root: str, code: int, times: int | None = None) -> None:
        import pyarrow.fs as pafs

        self.fs, self.root, self.code, self.times, self.calls = pafs.LocalFileSystem(), root, code, times, 0

    def __getattr__(self, name: str):
        real = getattr(self.fs, name)

        def call(*args, **kwargs):
            target = getattr(args[0], "base_dir", args[0]) if args else ""
            if isinstance(target, str) and target.startswith(self.root) and (self.times is None or self.times > 0):
                self.calls += 1
                if self.times is not None:
                    self.times -= 1
                raise OSError(self.code, os.strerror(self.code), target)
            return real(*args, **kwargs)

        return call


def flaky(monkeypatch, root: Path, code: int, times: int | None = None) -> FlakyFileSystem:
    """Make ``storage`` see ``root`` through a ``FlakyFileSystem``."""
    fs = FlakyFileSystem(str(root), code, times)
    real = storage.resolve
    monkeypatch.setattr(storage, "resolve", lambda uri: (fs, real(uri)[1]) if str(uri).startswith(str(root))
                        else real(uri))
    return fs


@pytest.mark.parametrize("code", [errno.EIO, errno.ESTALE, errno.ETIMEDOUT, errno.ENOTCONN])
def test_transient_local_errors_are_retried(tmp_path, monkeypatch, capsys, code):
    """EIO, ESTALE, ETIMEDOUT, a lost connection (an NFS or Lustre mount that hiccups): retried with a logged line,
    and the write then succeeds."""
    monkeypatch.setenv("LAB_STORAGE_RETRY_WAIT_S", "0.01")
    storage.set_retry_listener(None)  # the default, stderr (an in-process SessionRunner of another test sets its own)
    fs = flaky(monkeypatch, tmp_path, code, times=2)
    storage.write_text(str(tmp_path / "run.json"), "{}")
    assert fs.calls == 2 and (tmp_path / "run.json").read_text() == "{}"
    err = capsys.readouterr().err
    assert "retry 1 of 6 in 0.01 s" in err and "retry 2 of 6 in 0.02 s" in err and os.strerror(code) in err, err


def test_delete_whose_lookup_fails_on_a_missing_path(tmp_path, monkeypatch):
    """``delete``'s first lookup fails and the path then turns out missing (it was deleted meanwhile, or never
    there): missing is fine (once an UnboundLocalError that failed a session under 503s)."""
    fs = flaky(monkeypatch, tmp_path, errno.EIO, times=1)
    storage.delete(str(tmp_path / "ckpt" / ".staging-0"))
    assert fs.calls == 1


def test_persistent_local_error_is_a_resumable_fault(tmp_path, monkeypatch):
    """A file system still failing after every attempt: a ``StorageError`` with the hint (exit 75 at the command)."""
    monkeypatch.setenv("LAB_STORAGE_RETRY_WAIT_S", "0.01")
    monkeypatch.setenv("LAB_STORAGE_ATTEMPTS", "3")
    fs = flaky(monkeypatch, tmp_path, errno.ESTALE)
    with pytest.raises(storage.StorageError, match=r"Stale file handle.*\(failed 3 times\)") as err:
        storage.read_bytes(str(tmp_path / "run.json"))
    assert fs.calls == 3 and err.value.hint == faults.LOCAL_TRANSIENT_HINT
    assert faults.fault_of(OSError(errno.EIO, "Input/output error")) == faults.LOCAL_TRANSIENT_HINT


def test_train_on_a_failing_network_file_system_exits_75(tmp_path, monkeypatch, capsys):
    """``train --name`` on a data dir whose mount answers EIO to every call: exit 75 (resumable), one message with
    the error and what to do, no traceback."""
    monkeypatch.setenv("LAB_STORAGE_RETRY_WAIT_S", "0.01")
    monkeypatch.setenv("LAB_STORAGE_ATTEMPTS", "2")
    data = tmp_path / "nfs"
    flaky(monkeypatch, data, errno.EIO)
    code = run_cli(SPECS, "reinforce_cartpole", "train", "--name", "job", "--data-dir", str(data))
    err = capsys.readouterr().err
    assert code == EXIT_RESUMABLE, err
    assert "error: storage fault: " in err and "Input/output error" in err and "(failed 2 times)" in err, err
    assert f"{faults.LOCAL_TRANSIENT_HINT}, then run the same command" in err and "Traceback" not in err


@pytest.mark.parametrize(("name", "value"), [("LAB_STORAGE_RETRY_WAIT_S", "fast"), ("LAB_STORAGE_RETRY_WAIT_S", "0"),
                                             ("LAB_STORAGE_RETRY_WAIT_S", "nan"), ("LAB_STORAGE_ATTEMPTS", "0"),
                                             ("LAB_STORAGE_ATTEMPTS", "2.5")])
def test_a_bad_retry_setting_exits_2_before_anything_starts(tmp_path, monkeypatch, capsys, name, value):
    """A retry setting that is not a number, or out of range: one error line naming the variable, its value and
    what is expected; exit 2, no traceback, no run directory."""
    monkeypatch.setenv(name, value)
    data = tmp_path / "data"
    assert run_cli(SPECS, "reinforce_cartpole", "train", "--data-dir", str(data)) == 2
    err = capsys.readouterr().err
    expected = "a positive number of seconds" if name == "LAB_STORAGE_RETRY_WAIT_S" else "a whole number of attempts"
    assert f"error: {name}={value!r}: expected {expected}" in err and "Traceback" not in err, err
    assert not data.exists()


# ---------------------------------------------------------------- object store: faults through a proxy
RETRY_WAIT = {"LAB_STORAGE_RETRY_WAIT_S": "0.02"}  # a tenth of the default back-off: the same retries, sooner


def via(proxy: FaultProxy, attempts: int) -> dict[str, str]:
    """The environment of a driver whose S3 client goes through ``proxy`` and tries each call ``attempts`` times
    (first back-off ``RETRY_WAIT``)."""
    return {"AWS_ENDPOINT_URL": proxy.endpoint, "AWS_ENDPOINT_URL_S3": proxy.endpoint,
            "LAB_STORAGE_ATTEMPTS": str(attempts), **RETRY_WAIT}


def s3_manifests(data: str) -> list[str]:
    try:
        return [n for n in storage.list_files(data) if n.endswith("MANIFEST.json")]
    except storage.StorageError:
        return []


def retries_of(lines: list[str], prefix: str) -> list[tuple[str, str, str]]:
    """(object name, AWS error code, ``retry N of M``) of each retry line starting with ``prefix``."""
    out = []
    for line in lines:
        if line.startswith(prefix) and "; retry " in line:
            name = line[len(prefix):].split(": ", 1)[0].rsplit("/", 1)[-1]
            code = line.split("AWS Error ", 1)[1].split()[0]
            out.append((name, code, line.rsplit("; ", 1)[1].split(" in ")[0]))
    return out


@dataclasses.dataclass
class ProxyRun:
    """A ``lab ... --name job`` driver whose every request went through ``proxy``: its data dir, command line, exit
    code, stdout and stderr, and (a chaos run) the predir of the same run on local disk."""

    proxy: FaultProxy
    data: str
    argv: list[str] = dataclasses.field(default_factory=list)
    local: str = ""
    code: int | None = None
    out: str = ""
    err: str = ""


@pytest.fixture(scope="module")
def s3_faults(ray_local, s3_server, new_s3_bucket, tmp_path_factory):
    """The ``train --name job`` runs of ``ITEMS`` on ``s3://`` through a proxy each, their drivers started at once
    (they mostly wait on back-off and on the proxy, so they overlap), faulted once their first checkpoint is
    committed: ``transient`` (503 and a reset connection to run.json from the start, then two 503 and one 500 to
    the checkpoint writes; 7 attempts), ``503`` and ``403`` (every request from then on; 3 attempts). Each proxy
    stays open until the module ends."""
    with contextlib.ExitStack() as stack:
        runs = {}
        for name in ("transient", "503", "403"):
            proxy = stack.enter_context(FaultProxy(s3_server))
            runs[name] = ProxyRun(proxy, f"{new_s3_bucket()}/runs")
        runs["transient"].proxy.inject("503", "PUT", times=1, path="/run.json")
        runs["transient"].proxy.inject("reset", "PUT", times=1, path="/run.json")
        drivers = {}
        try:
            for name, run in runs.items():
                run.argv = [SPECS, "ppo_cartpole", "train", "--name", "job", "--data-dir", run.data,
                            *overrides(ITEMS)]
                drivers[name] = start_lab(run.argv, tmp_path_factory.mktemp(f"s3-{name}"),
                                          **via(run.proxy, attempts=7 if name == "transient" else 3))
            waiting, deadline = dict(runs), time.time() + 240
            while waiting:
                assert time.time() < deadline, f"no first checkpoint in time: {sorted(waiting)}"
                for name, run in list(waiting.items()):
                    if s3_manifests(run.data):
                        if name == "transient":
                            run.proxy.inject("503", "PUT", times=2, path="/ckpt/")
                            run.proxy.inject("500", "PUT", times=1, path="/ckpt/")
                        else:
                            run.proxy.inject(name)
                        del waiting[name]
                time.sleep(0.05)
            for name, run in runs.items():
                run.code, run.out, run.err = run_through(drivers[name])
                del drivers[name]
        finally:
            for driver in drivers.values():  # a run failed to start: end the drivers still running
                kill_pids([driver.pid, *descendants(driver.pid)])
        yield runs


def test_transient_s3_errors_are_retried_and_logged(s3_faults):
    """503 SlowDown, 500 InternalError and a reset connection, to the driver's run.json and to a session's checkpoint
    writes: each is retried with back-off (one warning per retry on the driver's terminal, the session's also in its
    log.txt) and the run completes, equal to an uninterrupted one."""
    run = s3_faults["transient"]
    code, err, data, proxy = run.code, run.err, run.data, run.proxy
    faulted = proxy.faulted()
    assert code == 0, err
    assert "Traceback" not in err
    assert [fault for _, _, fault in faulted] == ["503", "reset", "503", "503", "500"] and not proxy.faults, faulted
    lines = err.splitlines()
    assert retries_of(lines, "warning: write_bytes ") == [("run.json", "SLOW_DOWN", "retry 1 of 6"),
                                                          ("run.json", "NETWORK_CONNECTION", "retry 2 of 6")], err
    session = retries_of(lines, "warning: session t0_s0: storage retry: write_bytes ")
    assert [(code, n) for _, code, n in session] == [("SLOW_DOWN", "retry 1 of 6"), ("SLOW_DOWN", "retry 2 of 6"),
                                                     ("INTERNAL_FAILURE", "retry 3 of 6")], err
    assert len({name for name, _, _ in session}) == 1  # one checkpoint file, written at the fourth attempt
    waits = sorted(line.rsplit(" in ", 1)[1] for line in lines if "; retry " in line)  # LAB_STORAGE_RETRY_WAIT_S
    assert waits == ["0.02 s", "0.02 s", "0.04 s", "0.04 s", "0.08 s"], err
    log = storage.read_text(f"{data}/job/t0/s0/log.txt").splitlines()
    assert retries_of(log, "storage retry: write_bytes ") == session
    assert_resumed_equals_uninterrupted(storage.read_parquet(f"{data}/job/t0/s0/train_df.parquet"))


@pytest.mark.parametrize(("fault", "needles"), [
    ("503", ("HTTP status 503", "(failed 3 times)", "check the object store and the network, then run")),
    ("403", ("EXPIRED_TOKEN|ACCESS_DENIED", "renew the credentials or restore access to the bucket, then run")),
])
def test_persistent_s3_errors_stop_cleanly_then_resume_exactly(s3_faults, fault, needles):
    """Every request answered 503 SlowDown (the store stays down: retries exhausted) or 403 ExpiredToken (not
    retried; a HEAD's 403 has no body: ACCESS_DENIED) after the first checkpoint: exit 75 with the message; once
    the store answers again, the same ``train --name`` command completes the run exactly."""
    run = s3_faults[fault]
    predir = f"{run.data}/job"
    assert_clean_stop(f"{predir}/t0/s0", run.code, run.err, run.out, predir, *needles)
    assert run_cli(*run.argv) == 0  # in-process: straight to the store, not through the proxy
    assert storage.read_json(f"{predir}/run.json")["sessions"]["t0_s0"]["status"] == "done"
    assert_resumed_equals_uninterrupted(storage.read_parquet(f"{predir}/t0/s0/train_df.parquet"))


# ---------------------------------------------------------------- every request kind faulted at a realistic rate
CHAOS_RATE = 0.10  # of all requests answered 503 (SlowDown on S3, backendError on GCS)
TRAIN = ["meta.max_session=2", "env.max_frame=3000", "meta.log_frequency=500", "meta.checkpoint_frequency=1000",
         "meta.random_seed=56"]
PBT_SEARCH = ["meta.max_trial=2", "meta.max_session=1", "env.max_frame=1200", "meta.log_frequency=200",
              "meta.checkpoint_frequency=200", "meta.random_seed=56", 'meta.resources={"num_cpus": 0.5, "num_gpus": 0}',
              'search={"agent.net.optim_spec.lr__loguniform": [1e-4, 1e-2]}',
              'meta.search_scheduler={"name": "PBT", "perturbation_interval": 400}']


def local_run(tmp_path: Path, spec: str, mode: str, items: list[str]) -> str:
    """Predir of the same ``--name job`` run on local disk (in-process), to compare a faulted run against."""
    data = tmp_path / "local"
    assert run_cli(SPECS, spec, mode, "--name", "job", "--data-dir", str(data), *overrides(items)) == 0
    return str(data / "job")


@pytest.fixture(scope="module")
def chaos(ray_local, s3_server, gcs_server, new_s3_bucket, new_gcs_bucket, tmp_path_factory):
    """The three runs through a proxy answering ``CHAOS_RATE`` of every request with 503 (``s3-train``: the REINFORCE
    ``TRAIN`` run on ``s3://``; ``gcs-train``: the same run on ``gs://``; ``s3-pbt``: the ``PBT_SEARCH`` search on
    ``s3://``), their drivers started at once: each spends most of its time in retries' back-off, so they overlap.
    The same runs on local disk (in-process) run meanwhile. Each proxy stays open until the module ends."""
    with contextlib.ExitStack() as stack:
        proxies = {"s3-train": FaultProxy(s3_server), "gcs-train": FaultProxy(gcs_server, flavour="gcs"),
                   "s3-pbt": FaultProxy(s3_server)}
        for proxy in proxies.values():
            stack.enter_context(proxy)
        runs = {"s3-train": ProxyRun(proxies["s3-train"], f"{new_s3_bucket()}/runs"),
                "gcs-train": ProxyRun(proxies["gcs-train"], f"{new_gcs_bucket()}/runs"),
                "s3-pbt": ProxyRun(proxies["s3-pbt"], f"{new_s3_bucket()}/runs")}
        envs = {"s3-train": via(proxies["s3-train"], attempts=7), "s3-pbt": via(proxies["s3-pbt"], attempts=7),
                "gcs-train": {"STORAGE_EMULATOR_HOST": proxies["gcs-train"].endpoint, **RETRY_WAIT}}
        drivers = {}
        try:
            for name, run in runs.items():
                spec, mode, items = ("ppo_cartpole", "search", PBT_SEARCH) if name == "s3-pbt" else \
                    ("reinforce_cartpole", "train", TRAIN)
                cwd = tmp_path_factory.mktemp(name)
                run.proxy.chaos(CHAOS_RATE, seed=56)
                drivers[name] = start_lab([SPECS, spec, mode, "--name", "job", "--data-dir", run.data,
                                           *overrides(items)], cwd, **{"LAB_STORAGE_ATTEMPTS": "7", **envs[name]})
            local_train = local_run(tmp_path_factory.mktemp("local_train"), "reinforce_cartpole", "train", TRAIN)
            runs["s3-train"].local = runs["gcs-train"].local = local_train
            runs["s3-pbt"].local = local_run(tmp_path_factory.mktemp("local_pbt"), "ppo_cartpole", "search",
                                             PBT_SEARCH)
            for name, run in runs.items():
                run.code, run.out, run.err = run_through(drivers[name], timeout=300)
                del drivers[name]
                run.proxy.chaos(0.0, seed=0)
        finally:
            for driver in drivers.values():  # a local run failed: end the drivers still running
                kill_pids([driver.pid, *descendants(driver.pid)])
        yield runs


def assert_rode_out(run: ProxyRun) -> None:
    """The chaos run exited 0 with no traceback and no storage fault, and logged its retries."""
    assert run.code == 0, run.err[-4000:]
    assert "Traceback" not in run.err + run.out and "storage fault" not in run.err
    assert "; retry 1 of 6" in run.err


def assert_same_train_dfs(remote: str, local: str, sessions: list[str]) -> None:
    """Every session's train_df of the remote run equals the local run's (but ``wall_t``/``fps``)."""
    for session in sessions:
        got = storage.read_parquet(f"{remote}/{session}/train_df.parquet").drop(columns=["wall_t", "fps"])
        want = storage.read_parquet(f"{local}/{session}/train_df.parquet").drop(columns=["wall_t", "fps"])
        pd.testing.assert_frame_equal(got, want, obj=session)


def assert_every_kind_faulted(proxy: FaultProxy, kinds: tuple[str, ...]) -> None:
    """Each request kind was faulted at least once, and about ``CHAOS_RATE`` of all requests were."""
    total, faulted = proxy.fault_counts()
    assert all(faulted.get(kind, 0) >= 1 for kind in kinds), f"requests {total}, faulted {faulted}"
    share = sum(faulted.values()) / sum(total.values())
    assert 0.05 < share < 0.2 and sum(total.values()) > 100, (total, faulted)


def test_s3_train_and_multipart_writes_ride_out_503s_on_every_request_kind(chaos, monkeypatch):
    """REINFORCE CartPole, 2 sessions, through a proxy answering 10% of every kind of S3 request (and the first of each
    kind) with 503 SlowDown: exit 0 and train_dfs equal to the same run on local disk; multipart uploads (parts,
    create, complete) faulted the same way write whole objects."""
    run = chaos["s3-train"]
    assert_rode_out(run)
    proxy, data = run.proxy, run.data
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.endpoint)
    proxy.chaos(CHAOS_RATE, seed=57)
    big = os.urandom(12 * 2**20)  # over pyarrow's 10 MiB upload part: a multipart upload of 2 parts
    for i in range(3):
        storage.write_bytes(f"{data}/big{i}.bin", big)
        assert storage.read_bytes(f"{data}/big{i}.bin") == big
    proxy.chaos(0.0, seed=0)
    assert_every_kind_faulted(proxy, ("HEAD", "GET", "LIST", "PUT", "PART", "DELETE"))
    assert_same_train_dfs(f"{data}/job", run.local, ["t0/s0", "t0/s1"])
    assert storage.read_json(f"{data}/job/run.json")["sessions"]["t0_s1"]["status"] == "done"


def test_gcs_train_rides_out_503s_on_every_request_kind(chaos):
    """The same REINFORCE run on ``gs://`` through a proxy answering 10% of every kind of GCS JSON-API request with
    503 backendError: exit 0 and train_dfs equal to the run on local disk."""
    run = chaos["gcs-train"]
    assert_rode_out(run)
    assert_every_kind_faulted(run.proxy, ("HEAD", "GET", "LIST", "PUT", "DELETE"))
    assert_same_train_dfs(f"{run.data}/job", run.local, ["t0/s0", "t0/s1"])


def test_s3_pbt_search_rides_out_503s_on_every_request_kind(chaos):
    """A PBT search (2 trials, 3 generations) on ``s3://`` through the 10% 503 proxy: exit 0, the same ``pbt.jsonl``
    decisions and every trial's train_df equal to the same search on local disk."""
    run = chaos["s3-pbt"]
    assert_rode_out(run)
    assert_every_kind_faulted(run.proxy, ("HEAD", "GET", "LIST", "PUT", "DELETE"))
    assert storage.read_text(f"{run.data}/job/pbt.jsonl") == storage.read_text(f"{run.local}/pbt.jsonl")
    assert_same_train_dfs(f"{run.data}/job", run.local, ["t0/s0", "t1/s0"])


def test_a_storage_fault_in_the_spec_check_child_keeps_its_hint():
    """The spec-check child's answer carries a storage fault's hint, so the driver exits 75 for a fault of the machine
    (and 2 for bad input, which has none)."""
    from orchestrator.modes import spec_check
    from orchestrator.store.faults import StorageError

    fault = {"error": "storage", "message": "cannot read 's3://b/run/spec.json': 503", "uri": "s3://b/run/spec.json",
             "hint": "check the object store and the network", "transient": False}
    with pytest.raises(StorageError) as err:
        spec_check.decode(fault)
    assert (err.value.hint, err.value.uri) == ("check the object store and the network", "s3://b/run/spec.json")
    with pytest.raises(StorageError) as err:
        spec_check.decode({"error": "storage", "message": "no such bucket"})
    assert err.value.hint is None
