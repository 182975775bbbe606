"""Helpers shared by the orchestrator tests: running the CLI in-process, driver subprocesses that
the test kills (and whose leftover Ray processes it kills by PID), run-directory digests."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pandas as pd
import pytest

from orchestrator import cli

REPO = Path(__file__).resolve().parents[2]
SPECS = str(REPO / "specs/benchmark/cartpole.json")
DRIVER_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


def run_cli(*argv: str) -> int:
    """``lab ...`` in-process (``--quiet`` added to run modes); returns its exit code."""
    extra = [] if argv[:1] in (("analyze",), ("ls",), ("compare",)) else ["--quiet"]
    try:
        return cli.main(list(argv) + extra)
    except SystemExit as exc:
        return int(exc.code)


def overrides(items: list[str]) -> list[str]:
    """``["a=1", "b=2"]`` -> ``["-s", "a=1", "-s", "b=2"]``."""
    return [x for item in items for x in ("-s", item)]


def descendants(pid: int) -> list[int]:
    """PIDs of every process below ``pid`` (read from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, exited but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def kill_pids(pids: list[int]) -> None:
    """SIGKILL each PID that still exists (only PIDs the test started)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def start_driver(argv: list[str], cwd: Path, capture: bool = False) -> subprocess.Popen:
    """``python run_lab.py *argv`` as a subprocess with its own embedded Ray."""
    pipe = subprocess.PIPE if capture else subprocess.DEVNULL
    return subprocess.Popen([sys.executable, str(REPO / "run_lab.py"), *argv, "--quiet"], cwd=cwd,
                            env={**os.environ, **DRIVER_ENV}, stdout=pipe, stderr=pipe, text=True)


def kill_driver_when(driver: subprocess.Popen, ready: Callable[[], bool], timeout: float, what: str) -> None:
    """SIGKILL a driver once ``ready()`` holds, then kill its leftover Ray processes by PID.

    Fails the test if the driver ends first or ``timeout`` seconds pass.
    """
    tree: list[int] = []
    try:
        deadline = time.time() + timeout
        while not ready():
            assert driver.poll() is None, "the driver ended before it could be killed"
            if time.time() > deadline:
                pytest.fail(f"{what} not reached within {timeout} s")
            time.sleep(0.1)
        tree = descendants(driver.pid)
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=30)
    finally:
        kill_pids(descendants(driver.pid) + tree)


def uninterrupted_df(items: list[str], session: int, spec_file: str = SPECS,
                     name: str = "ppo_cartpole") -> pd.DataFrame:
    """train_df of session ``session`` (trial 0) of spec ``name`` with ``items`` overrides, run in-process without
    interruption (one torch thread), to compare a killed-and-resumed session against."""
    import torch

    from orchestrator.session.loop import Session
    from orchestrator.spec.load import load_spec
    from orchestrator.store.predir import session_seed

    torch.set_num_threads(1)
    spec = load_spec(spec_file, name, items)
    run = Session(spec, session_seed(spec["meta"]["random_seed"], 0, session))
    run.run_rl()
    return run.train_df


def files_digest(root: Path) -> dict[str, str]:
    """sha256 of every file below ``root``, by relative path."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def only_predir(data_dir: Path) -> Path:
    """The single run directory in a data dir."""
    (predir,) = [p for p in data_dir.iterdir() if p.is_dir() and not p.name.startswith(".")]
    return predir


def assert_continuous(df: pd.DataFrame, log_frequency: int, max_frame: int) -> None:
    """One train_df row per log frame (no duplicate, no gap); wall_t, opt_step and epi monotonic."""
    assert df["frame"].tolist() == list(range(log_frequency, max_frame + 1, log_frequency))
    assert df["wall_t"].is_monotonic_increasing
    assert df["opt_step"].is_monotonic_increasing and df["epi"].is_monotonic_increasing


def tb_scalars(tb_dir: str) -> dict[str, list[tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` of the scalars in a TensorBoard log dir, as TensorBoard shows
    them (``EventAccumulator``: purge_step applied, every scalar kept)."""
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    acc = EventAccumulator(tb_dir, size_guidance={SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def assert_tb_matches(tb_dir: str, df: pd.DataFrame, columns: tuple[str, ...] = ("total_reward_ma", "opt_step",
                                                                                 "lr", "loss")) -> None:
    """Each column's finite train_df values are the TensorBoard scalars ``train/{col}``: one per frame
    (no step twice), same order, equal up to float32."""
    got = tb_scalars(tb_dir)
    for col in columns:
        want = df[["frame", col]].dropna()
        steps, values = zip(*got[f"train/{col}"])
        assert list(steps) == want["frame"].tolist(), col
        assert list(values) == pytest.approx(want[col].astype(float).tolist(), rel=1e-6), col
