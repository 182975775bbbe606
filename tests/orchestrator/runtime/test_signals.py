"""The stop contract of ``orchestrator/runtime/signals.py`` on real ``lab`` drivers (subprocesses).

The matrix: {SIGTERM, SIGINT, SIGUSR1} x {spec check, Ray start, training, final analysis} on ``train --name`` and
``search --name`` (one grid value: trial t0 trains exactly as the train run). Each (mode, phase) starts three drivers
at once, one per signal, each on a fresh run, and stops it in that phase: the test hook
``LAB_TEST_PAUSE_AT=<phase>`` (``signals.pause_point``) holds the driver there and writes a marker; training is
caught at the first committed checkpoint. Every stop must exit 75 (0 for the final analysis: the work was complete),
print no traceback, and leave no process behind: the driver's descendants (the spec-check child, a local Ray's
processes) and the session actors it started are gone within seconds of its exit. In the spec-check phase the
signal goes to the driver's whole process group (as a terminal's Ctrl-C sends it); the spec-check child runs in a
session of its own (a SIGINT never reaches its interpreter while it starts), and the driver ends it.

The same command run again (in-process, on the tests' shared Ray) must finish the run with the train_df of an
uninterrupted run (``wall_t``/``fps`` aside).
That re-run, a whole training each, is checked on a representative subset to keep the file short: per mode the
training stop (SIGTERM: a resume) and the analysis stop (SIGINT: a complete run left as it is), and train's Ray-start
stop (SIGUSR1: a fresh run); a spec-check or Ray-start stop must leave no run at all (its re-run is a fresh run).
The analysis-phase runs train 2,048 frames (``SHORT``: that phase needs a complete training, not a long one).
Spec check, Ray start and the second Ctrl-C run a local Ray per driver; training, analysis, the double SIGTERM and
the grace case join the tests' shared Ray (``--address``).

Before train's training stop (SIGTERM) is finished, its same command is stopped twice while it verifies the
checkpoints (the ``verify`` hook: SIGINT, SIGUSR1): each exits 75 and leaves the run resumable. Also: two SIGTERMs
50 ms apart are one stop (exit 75, a final checkpoint committed, run.json not ``running``); a second SIGINT leaves at
once (exit 75, no process left); a final commit that outlasts ``shutdown_grace_s`` exits 75 (these three drivers run
at once).
"""

from __future__ import annotations

import json
import os
import signal
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
    pid_alive,
    run_cli,
    uninterrupted_df,
)

from orchestrator.errors import EXIT_RESUMABLE
from orchestrator.runtime import signals

ITEMS = ["meta.max_session=1", "meta.max_trial=1", "meta.log_frequency=1024", "meta.checkpoint_frequency=1024",
         "meta.random_seed=7", "env.max_frame=8192"]
GRID = 'search={"agent.algorithm.gamma__grid_search": [0.98]}'  # the spec's own gamma: t0 trains as train's t0
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
PHASES = ("spec_check", "ray_start", "training", "analysis")
RERUN = {("train", "ray_start"): signal.SIGUSR1, ("train", "training"): signal.SIGTERM,
         ("search", "training"): signal.SIGTERM, ("train", "analysis"): signal.SIGINT,
         ("search", "analysis"): signal.SIGINT}  # (mode, phase) -> the stop whose command is run again
COMPARED = lambda df: df.drop(columns=["wall_t", "fps"]).reset_index(drop=True)  # noqa: E731


SHORT = "env.max_frame=2048"  # the analysis-phase runs: a complete training is all that phase needs


@pytest.fixture(scope="module")
def reference() -> pd.DataFrame:
    """train_df of t0_s0, uninterrupted (in-process, no Ray)."""
    return uninterrupted_df(ITEMS, 0)


@pytest.fixture(scope="module")
def short_reference() -> pd.DataFrame:
    """train_df of t0_s0 of the analysis-phase runs (``SHORT``), uninterrupted (in-process, no Ray)."""
    return uninterrupted_df([*ITEMS, SHORT], 0)


@pytest.fixture(scope="module")
def address(ray_local) -> str:
    """The GCS address of the tests' shared Ray, for drivers that join it."""
    return ray_local.get_runtime_context().gcs_address


def command(mode: str, data: Path, *extra: str) -> list[str]:
    """``lab SPECS ppo_cartpole MODE --name run`` on the tiny spec (``--quiet``)."""
    grid = ["-s", GRID] if mode == "search" else []
    return [SPECS, "ppo_cartpole", mode, "--name", "run", "--data-dir", str(data), *overrides(ITEMS), *grid,
            "--quiet", *extra]


def start(argv: list[str], cwd: Path, pause_at: str | None = None) -> subprocess.Popen:
    """A driver (``run_lab.py``) in its own process group, holding at ``pause_at`` (the test hook)."""
    env = {**os.environ, **DRIVER_ENV}
    if pause_at is not None:
        env.update(LAB_TEST_PAUSE_AT=pause_at, LAB_TEST_PAUSE_FILE=str(cwd / "paused"))
    return subprocess.Popen([sys.executable, str(REPO / "run_lab.py"), *argv], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def session_pids(predir: Path) -> list[int]:
    """PIDs of the session actors recorded in the run's run.json files."""
    pids = []
    for run in predir.glob("**/run.json"):
        try:
            pids += [e["pid"] for e in json.loads(run.read_text())["sessions"].values() if "pid" in e]
        except (ValueError, KeyError):
            continue
    return pids


def committed(predir: Path) -> list[int]:
    """Committed checkpoint frames of t0_s0."""
    return sorted(int(m.parent.name) for m in predir.glob("t0/s0/ckpt/0*/MANIFEST.json"))


class Stop:
    """One driver stopped by one signal in one phase: start, wait for the phase, signal, collect."""

    def __init__(self, mode: str, phase: str, sig: int, root: Path, address: str | None, *extra: str) -> None:
        self.mode, self.phase, self.sig = mode, phase, sig
        self.cwd = root / f"{mode}-{phase}-{sig.name}"
        self.cwd.mkdir(parents=True)
        self.data = self.cwd / "data"
        self.argv = command(mode, self.data, *(["--address", address] if address else []), *extra)
        self.predir = self.data / "run"
        self.driver = start(self.argv, self.cwd, None if phase == "training" else phase)
        self.tree: list[int] = []
        self.code, self.out, self.err = None, "", ""

    def ready(self) -> bool:
        """Whether the driver is in its phase (fails when it ended first)."""
        assert self.driver.poll() is None, f"{self.cwd.name}: ended before the signal: {self.driver.communicate()}"
        if self.phase == "training":
            return bool(committed(self.predir))
        return (self.cwd / "paused").exists()

    def send(self) -> None:
        """Signal the driver (its whole process group in the spec-check phase, as a terminal or SLURM does)."""
        self.tree = descendants(self.driver.pid)
        if self.phase == "spec_check":
            os.killpg(self.driver.pid, self.sig)
        else:
            os.kill(self.driver.pid, self.sig)

    def collect(self) -> list[int]:
        """Wait for the driver's exit; returns the PIDs it left alive 20 s later (then killed)."""
        try:
            self.out, self.err = self.driver.communicate(timeout=240)
            self.code = self.driver.returncode
            watched = self.tree + session_pids(self.predir)
            deadline = time.time() + 20
            while any(pid_alive(p) for p in watched) and time.time() < deadline:
                time.sleep(0.2)
            return [p for p in watched if pid_alive(p)]
        finally:
            kill_pids(self.tree + session_pids(self.predir) + descendants(self.driver.pid))
            if self.driver.poll() is None:
                self.driver.kill()


def stop_all(stops: list[Stop], timeout: float = 240) -> None:
    """Signal each driver as soon as it is in its phase."""
    waiting, deadline = list(stops), time.time() + timeout
    while waiting:
        assert time.time() < deadline, f"not in their phase in time: {[s.cwd.name for s in waiting]}"
        for stop in [s for s in waiting if s.ready()]:
            stop.send()
            waiting.remove(stop)
        time.sleep(0.05)


def finished_df(stop: Stop) -> pd.DataFrame:
    """Run the stopped command again (no hook), in-process on the tests' shared Ray (``run_cli``: a driver of its own
    adds nothing a plain run needs); it must finish (exit 0). Returns t0_s0's train_df."""
    assert run_cli(*stop.argv) == 0
    return pd.read_parquet(stop.predir / "t0/s0/train_df.parquet")


def assert_verify_stops_keep_it_resumable(stop: Stop) -> None:
    """The same command as ``stop`` (a run stopped in training) stopped twice while it verifies the session's
    checkpoints (SIGINT, SIGUSR1): each exits 75 with no traceback and no process left, and the run stays
    ``interrupted`` at its committed checkpoint."""
    frames = committed(stop.predir)
    for sig in (signal.SIGINT, signal.SIGUSR1):
        (stop.cwd / "paused").unlink(missing_ok=True)
        driver = start(stop.argv, stop.cwd, "verify")
        tree = []
        try:
            deadline = time.time() + 240
            while not (stop.cwd / "paused").exists():
                assert driver.poll() is None and time.time() < deadline, driver.communicate()
                time.sleep(0.05)
            tree = descendants(driver.pid)
            os.kill(driver.pid, sig)
            out, err = driver.communicate(timeout=240)
            deadline = time.time() + 20
            while any(pid_alive(p) for p in tree) and time.time() < deadline:
                time.sleep(0.2)
            left = [p for p in tree if pid_alive(p)]
        finally:
            kill_pids(tree + descendants(driver.pid))
        assert driver.returncode == EXIT_RESUMABLE, f"{sig.name}: exit {driver.returncode}\n{err[-3000:]}"
        assert "Traceback" not in err and left == [], f"{sig.name}: {left}\n{err[-3000:]}"
        assert f"{sig.name}: stopped before any session started; nothing is lost" in err, err[-3000:]
        entry = json.loads((stop.predir / "run.json").read_text())["sessions"]["t0_s0"]
        assert (entry["status"], committed(stop.predir)) == ("interrupted", frames), sig.name


@pytest.mark.parametrize("mode", ["train", "search"])
@pytest.mark.parametrize("phase", PHASES)
def test_a_stop_in_any_phase_exits_75_and_the_same_command_finishes(ray_local, address, reference, short_reference,
                                                                    tmp_path, mode, phase):
    shared = address if phase in ("training", "analysis") else None
    extra = ["-s", SHORT] if phase == "analysis" else []
    stops = [Stop(mode, phase, sig, tmp_path, shared, *extra) for sig in SIGNALS]
    try:
        stop_all(stops)
    finally:
        left = {stop.sig.name: stop.collect() for stop in stops}
    for stop in stops:
        name = stop.sig.name
        expected = 0 if phase == "analysis" else EXIT_RESUMABLE
        assert stop.code == expected, f"{name}: exit {stop.code}\n{stop.err[-3000:]}"
        assert "Traceback" not in stop.err and "BrokenPipe" not in stop.err, f"{name}:\n{stop.err[-3000:]}"
        assert left[name] == [], f"{name}: processes left: {left[name]}"
        if phase == "analysis":
            assert "finishing the analysis" in stop.err
            assert any(stop.predir.glob("graph/*_trial_graph.png")), f"{name}: the analysis did not finish"
        elif phase == "training":
            assert committed(stop.predir) and committed(stop.predir)[-1] < 8192, name
            assert "resume with:\n  lab " + " ".join(stop.argv[:3]) in stop.out + stop.err, stop.out
            assert "@" not in stop.out.split("resume with:")[-1], stop.out  # the typed command, not mode@PREDIR
        else:
            assert f"{name}: stopped before any session started; nothing is lost" in stop.err, stop.err
            assert not list(stop.predir.glob("*_spec.json")), f"{name}: a run was started"
    rerun = next((s for s in stops if RERUN.get((mode, phase)) == s.sig), None)
    if (mode, phase) == ("train", "training"):  # the run stopped by SIGTERM, stopped again while it resumes
        assert_verify_stops_keep_it_resumable(rerun)
    if rerun is not None:
        want = short_reference if phase == "analysis" else reference
        pd.testing.assert_frame_equal(COMPARED(finished_df(rerun)), COMPARED(want))


@pytest.fixture(scope="module")
def lone_stops(address, tmp_path_factory) -> dict[str, tuple[Stop, list[int]]]:
    """Three ``train --name`` drivers started at once, each stopped at its first committed checkpoint, and the PIDs
    each left alive (``Stop.collect``): ``two_sigterms`` (a second SIGTERM 50 ms after the first; shared Ray),
    ``second_ctrl_c`` (a second SIGINT 0.3 s after the first; a local Ray), ``grace`` (SIGTERM with
    ``meta.shutdown_grace_s=0.01``; shared Ray)."""
    root = tmp_path_factory.mktemp("lone_stops")
    stops = {"two_sigterms": Stop("train", "training", signal.SIGTERM, root / "two_sigterms", address),
             "second_ctrl_c": Stop("train", "training", signal.SIGINT, root / "second_ctrl_c", None),
             "grace": Stop("train", "training", signal.SIGTERM, root / "grace", address,
                           "-s", "meta.shutdown_grace_s=0.01")}
    again = {"two_sigterms": (0.05, signal.SIGTERM), "second_ctrl_c": (0.3, signal.SIGINT)}
    try:
        waiting, deadline = dict(stops), time.time() + 240
        while waiting:
            assert time.time() < deadline, f"not in their phase in time: {sorted(waiting)}"
            for name, stop in list(waiting.items()):
                if stop.ready():
                    stop.send()
                    if name in again:
                        delay, sig = again[name]
                        time.sleep(delay)
                        os.kill(stop.driver.pid, sig)
                    del waiting[name]
            time.sleep(0.05)
    finally:
        left = {name: stop.collect() for name, stop in stops.items()}
    return {name: (stop, left[name]) for name, stop in stops.items()}


def test_two_sigterms_50ms_apart_are_one_stop(lone_stops):
    """SLURM/Kubernetes signal every process of a job, a batch trap adds its own: the second SIGTERM is the same
    request: the final checkpoint is committed, run.json says ``interrupted``, exit 75."""
    stop, left = lone_stops["two_sigterms"]
    assert stop.code == EXIT_RESUMABLE, stop.err[-3000:]
    assert "Traceback" not in stop.err  # (two signals this close may reach Python's handler as one)
    assert left == []
    run = json.loads((stop.predir / "run.json").read_text())["sessions"]["t0_s0"]
    assert run["status"] == "interrupted" and run["checkpoint"] == committed(stop.predir)[-1]
    assert run["frame"] == run["checkpoint"] and run["error"] is None  # the final checkpoint, at the stop's frame


def test_a_second_ctrl_c_leaves_at_once(lone_stops):
    """A second SIGINT leaves at once, with a local Ray: exit 75, no process of the driver left."""
    stop, left = lone_stops["second_ctrl_c"]
    assert stop.code == EXIT_RESUMABLE, stop.err[-3000:]
    assert "SIGINT again: leaving at once; every committed checkpoint stays resumable" in stop.err
    assert "Traceback" not in stop.err and left == []


def test_a_final_commit_past_its_grace_exits_75(lone_stops):
    """``meta.shutdown_grace_s`` too short for the final commit: the run stops at its last committed checkpoint and
    exits 75 (resumable), not 1, naming the grace."""
    stop, left = lone_stops["grace"]
    assert stop.code == EXIT_RESUMABLE, stop.err[-3000:]
    assert left == []
    entry = json.loads((stop.predir / "run.json").read_text())["sessions"]["t0_s0"]
    assert entry["status"] == "interrupted"
    if "no final checkpoint within shutdown_grace_s=0.01 s" not in stop.out:
        # a loaded machine can hold the driver past the grace while the session commits: the driver then reads the
        # session's final commit first, and the summary names that checkpoint instead
        assert f"t0_s0: interrupted, committed checkpoint at frame {entry['checkpoint']}" in stop.out, stop.out


def test_the_handler_semantics_in_process(monkeypatch):
    """Unit level: a stop with no target raises ``Stopped``; with a target it goes to every target and repeats are
    the same request; once the work returned a stop only lets the command finish; ``deferred`` raises at its end;
    a second SIGINT leaves with ``leave_code``."""
    handler = signals.StopHandler()
    with pytest.raises(signals.Stopped):
        handler.handle(signal.SIGTERM, None)
    handler = signals.StopHandler()
    got = []
    with handler.target(lambda s: got.append(("outer", s)) or "outer"):
        with handler.target(lambda s: got.append(("inner", s)) or "inner"):
            handler.handle(signal.SIGUSR1, None)
            handler.handle(signal.SIGTERM, None)  # the same request: no second call
    assert got == [("outer", signal.SIGUSR1), ("inner", signal.SIGUSR1)]
    handler = signals.StopHandler()
    with handler.target(lambda s: "work"):
        pass
    handler.handle(signal.SIGTERM, None)  # the work has returned: the command only finishes (no Stopped)
    handler.check()
    handler = signals.StopHandler()
    with pytest.raises(signals.Stopped):
        with handler.deferred():
            handler.handle(signal.SIGTERM, None)
            got.append("finished")
    assert got[-1] == "finished"
    exits = []
    monkeypatch.setattr(signals.os, "_exit", exits.append)
    monkeypatch.setattr(signals, "kill_descendants", lambda: None)
    handler.handle(signal.SIGINT, None)  # a stop already asked: leave at once
    assert exits == [EXIT_RESUMABLE]
