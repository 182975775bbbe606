"""Run integrity on resume (issue 15 items 1-4, issue 9 item 6): the committed checkpoint is the truth.

A kill between a session's last commit and its exports is repaired; a damaged newest checkpoint is
set aside with a warning and run.json records the frame really restored; damaged run.json /
trial.json / search.json and a missing saved spec give a warning or one clear error; a second driver
on a run held by a live one exits 2. Most tests copy one finished 1-session run (3 checkpoints).
"""

from __future__ import annotations

import json
import os
import shutil
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
    files_digest,
    kill_pids,
    only_predir,
    overrides,
    run_cli,
    start_driver,
)

from orchestrator.errors import EXIT_RESUMABLE
from orchestrator.modes import search
from orchestrator.search import trials as trials_mod
from orchestrator.session.events import Started
from orchestrator.spec.load import load_spec
from orchestrator.store import lease as lease_mod
from orchestrator.store import storage
from orchestrator.store.checkpoint import CheckpointStore
from orchestrator.store.record import RunRecord, SessionPlan
from orchestrator.trial import Trial

ITEMS = ["meta.max_session=1", "meta.log_frequency=1000", "meta.checkpoint_frequency=1000", "env.max_frame=3000",
         "meta.random_seed=7"]


@pytest.fixture(scope="module")
def finished_run(ray_local, tmp_path_factory) -> Path:
    """A finished ``train`` of PPO on CartPole: 1 session, checkpoints at 1000, 2000, 3000 frames."""
    data = tmp_path_factory.mktemp("integrity") / "data"
    assert run_cli(SPECS, "ppo_cartpole", "train", "--data-dir", str(data), *overrides(ITEMS)) == 0
    predir = only_predir(data)
    assert CheckpointStore(str(predir / "t0/s0")).frames() == [1000, 2000, 3000]
    return predir


@pytest.fixture
def run_copy(finished_run, tmp_path) -> Path:
    """A private copy of ``finished_run`` (same name) in ``tmp_path/data``."""
    copy = tmp_path / "data" / finished_run.name
    shutil.copytree(finished_run, copy)
    return copy


def ckpt_file(predir: Path, frame: int, name: str) -> bytes:
    return (predir / f"t0/s0/ckpt/{frame:012d}" / name).read_bytes()


def make_stale(predir: Path) -> None:
    """Leave the files as a driver killed right after the commit at 3000 would: exports of 2000."""
    (predir / "t0/s0/train_df.parquet").write_bytes(ckpt_file(predir, 2000, "train_df.parquet"))
    run = json.loads((predir / "run.json").read_text())
    run["sessions"]["t0_s0"].update(status="running", frame=2000, checkpoint=2000)
    (predir / "run.json").write_text(json.dumps(run))


# ---------------------------------------------------------------- A: kill between commit and exports
def test_kill_between_last_checkpoint_and_exports_is_repaired_on_resume(run_copy, capsys):
    make_stale(run_copy)
    assert run_cli(SPECS, "ppo_cartpole", f"train@{run_copy}", *overrides(ITEMS)) == 0
    assert (run_copy / "t0/s0/train_df.parquet").read_bytes() == ckpt_file(run_copy, 3000, "train_df.parquet")
    assert pd.read_parquet(run_copy / "t0/s0/train_df.parquet")["frame"].tolist() == [1000, 2000, 3000]
    entry = json.loads((run_copy / "run.json").read_text())["sessions"]["t0_s0"]
    assert (entry["status"], entry["frame"], entry["checkpoint"]) == ("done", 3000, 3000)
    assert "train_df.parquet rewritten from its committed checkpoint at frame 3000" in capsys.readouterr().err


def test_search_trial_killed_before_exports_reports_the_checkpoint_frame(run_copy):
    make_stale(run_copy)
    spec = load_spec(SPECS, "ppo_cartpole", ITEMS)
    # the metrics read the committed checkpoint, not the stale copy (a search's table: one frame in every column)
    assert trials_mod.final_metrics(str(run_copy), spec, 0)["frame"] == 3000
    trials_mod.run_lab_trial(str(run_copy), spec, 0)  # no session left to run: only the repair
    assert trials_mod.final_metrics(str(run_copy), spec, 0)["frame"] == 3000
    assert (run_copy / "t0/s0/train_df.parquet").read_bytes() == ckpt_file(run_copy, 3000, "train_df.parquet")
    entry = json.loads((run_copy / "t0/run.json").read_text())["sessions"]["t0_s0"]
    assert (entry["status"], entry["frame"]) == ("done", 3000)


# ---------------------------------------------------------------- B: damaged newest checkpoint
def _delete_state(d: Path) -> None:
    (d / "state.pt").unlink()


def _flip_state(d: Path) -> None:
    data = bytearray((d / "state.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (d / "state.pt").write_bytes(bytes(data))


def _truncate_manifest(d: Path) -> None:
    text = (d / "MANIFEST.json").read_text()
    (d / "MANIFEST.json").write_text(text[: len(text) // 2])


DAMAGE = {"missing file": (_delete_state, "file 'state.pt' is missing"),
          "flipped byte": (_flip_state, "file 'state.pt' fails its sha256 check"),
          "truncated manifest": (_truncate_manifest, "bad MANIFEST.json")}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_newest_checkpoint_warns_and_records_the_frame_restored(run_copy, damage, capsys):
    inject, reason = DAMAGE[damage]
    inject(run_copy / "t0/s0/ckpt/000000003000")
    assert run_cli(SPECS, "ppo_cartpole", f"train@{run_copy}", *overrides(ITEMS)) == 0
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("warning: session t0_s0")]
    assert len(warnings) == 1, err
    assert reason in warnings[0] and ".corrupt-3000-" in warnings[0]
    assert "resuming from checkpoint" in warnings[0] and warnings[0].endswith("000000002000 instead")
    assert reason in (run_copy / "t0/s0/log.txt").read_text()
    run = json.loads((run_copy / "run.json").read_text())
    assert run["resumes"][-1]["from_frames"] == {"t0_s0": 2000}
    (aside,) = run["resumes"][-1]["set_aside"]["t0_s0"]
    assert aside["frame"] == 3000 and reason in aside["reason"] and aside["moved_to"].startswith("ckpt/.corrupt-3000-")
    assert (run_copy / "t0/s0" / aside["moved_to"]).is_dir()
    assert run["sessions"]["t0_s0"]["restored_frame"] == 2000 and run["sessions"]["t0_s0"]["status"] == "done"
    assert pd.read_parquet(run_copy / "t0/s0/train_df.parquet")["frame"].tolist() == [1000, 2000, 3000]


class _Progress:
    def status(self, key, text):
        pass


def test_actor_restart_records_the_frame_restored_and_what_was_set_aside(run_copy, capsys):
    _flip_state(run_copy / "t0/s0/ckpt/000000003000")
    spec = load_spec(SPECS, "ppo_cartpole", ITEMS)
    plan = SessionPlan(0, 0, 7, resume=True, status="running", frame=3000)
    record = RunRecord.load_or_new(str(run_copy), "ppo_cartpole")
    trial = Trial(spec, str(run_copy), [plan], record, quiet=True)
    trial.progress = _Progress()
    trial.on_actor_died(plan, RuntimeError("lost"))
    (restart,) = json.loads((run_copy / "run.json").read_text())["sessions"]["t0_s0"]["restarts"]
    assert restart["frame_restored"] == 2000 and restart["frames_lost"] == 1000
    assert restart["set_aside"][0]["frame"] == 3000 and "sha256" in restart["set_aside"][0]["reason"]
    assert "warning: session t0_s0" in capsys.readouterr().err


def test_stop_during_a_restart_back_off_does_not_restart(run_copy):
    """A stop that finds a session waiting out its restart back-off leaves it ``interrupted`` at its committed
    checkpoint instead of starting a replacement that would train until the grace period ends."""
    spec = load_spec(SPECS, "ppo_cartpole", ITEMS)
    plan = SessionPlan(0, 0, 7, resume=True, status="running", frame=3000)
    trial = Trial(spec, str(run_copy), [plan], RunRecord.load_or_new(str(run_copy), "ppo_cartpole"), quiet=True)
    trial.progress = _Progress()
    trial.on_actor_died(plan, RuntimeError("lost"))
    assert plan.status == "restarting" and "t0_s0" in trial.pending_restart
    trial.request_stop()
    assert trial.pending_restart == {} and plan.status == "interrupted" and plan.error is None
    trial.restart_due({plan.key: plan})
    assert trial.actors == {} and trial.streams == {}
    entry = json.loads((run_copy / "run.json").read_text())["sessions"]["t0_s0"]
    assert entry["status"] == "interrupted" and len(entry["restarts"]) == 1


def test_an_actor_that_ends_during_a_stop_leaves_its_session_interrupted_at_its_newest_checkpoint(run_copy, capsys):
    """SLURM and Kubernetes signal every process of a job, Ray's own included: an actor that ends while the trial
    stops leaves its session ``interrupted`` at its newest committed checkpoint, and the trial exits 75, as after a
    driver SIGKILL; it is not ``failed``. A checkpoint its process commits after that is the one printed."""
    from ray.exceptions import ActorUnavailableError

    late = run_copy / "t0/s0/ckpt/000000003000"
    hidden = late.with_name("000000003000.hidden")
    late.rename(hidden)  # committed by the ended actor's process after the driver saw it end
    spec = load_spec(SPECS, "ppo_cartpole", ITEMS)
    plan = SessionPlan(0, 0, 7, resume=True, status="running", frame=3000)
    trial = Trial(spec, str(run_copy), [plan], RunRecord.load_or_new(str(run_copy), "ppo_cartpole"), quiet=True,
                  analyze=False)
    trial.progress = _Progress()
    trial.request_stop()
    trial.on_actor_died(plan, ActorUnavailableError("the raylet got SIGTERM", None))
    entry = json.loads((run_copy / "run.json").read_text())["sessions"]["t0_s0"]
    assert (plan.status, entry["status"], entry["checkpoint"]) == ("interrupted", "interrupted", 2000)
    assert entry["restarts"] == [] and "ActorUnavailableError" in entry["error"]
    hidden.rename(late)
    assert trial.finish() == EXIT_RESUMABLE
    assert "t0_s0: interrupted, committed checkpoint at frame 3000" in capsys.readouterr().out


def test_search_resume_verifies_sessions_in_the_driver(run_copy, capsys):
    _delete_state(run_copy / "t0/s0/ckpt/000000003000")
    (run_copy / "t0/trial.json").write_text(json.dumps({"trial": 0, "values": {}, "status": "running"}))
    spec = load_spec(SPECS, "ppo_cartpole", ITEMS)
    search.verify_trials(str(run_copy), spec)
    warning = capsys.readouterr().err
    assert "warning: session t0_s0" in warning and "file 'state.pt' is missing" in warning
    (aside,) = json.loads((run_copy / "t0/run.json").read_text())["sessions"]["t0_s0"]["set_aside"]
    assert aside["frame"] == 3000 and aside["moved_to"].startswith("ckpt/.corrupt-3000-")
    plans, done = trials_mod.plan_sessions(str(run_copy), spec, 0)
    assert [(p.key, p.resume, p.frame) for p in plans] == [("t0_s0", True, 2000)] and done == []


def test_actor_side_fallback_is_logged_and_recorded_by_the_driver(run_copy, capsys):
    """A checkpoint damaged after the driver verified it: the actor sets it aside, logs it, reports it in
    ``started``; the driver prints it and corrects ``from_frames`` to the frame really restored."""
    from orchestrator.session.runner import SessionRunner

    spec = load_spec(SPECS, "ppo_cartpole", ITEMS)
    _flip_state(run_copy / "t0/s0/ckpt/000000003000")
    runner = SessionRunner(spec, str(run_copy), 0, 0, 7, resume=True)
    runner.restore()
    assert runner.restored_frame == 2000 and runner.set_aside[0]["frame"] == 3000
    assert "fails its sha256 check" in (run_copy / "t0/s0/log.txt").read_text()
    runner.session.close()
    plan = SessionPlan(0, 0, 7, resume=True, status="running", frame=3000)
    record = RunRecord.load_or_new(str(run_copy), "ppo_cartpole")
    record.data["resumes"].append({"at": "now", "spec_edits": [], "from_frames": {"t0_s0": 3000}})
    record.update(plan)
    trial = Trial(spec, str(run_copy), [plan], record, quiet=True)
    trial.on_started(plan, Started(pid=1, device="cpu", restored_frame=2000, set_aside=runner.set_aside))
    run = json.loads((run_copy / "run.json").read_text())
    assert run["resumes"][-1]["from_frames"] == {"t0_s0": 2000}
    entry = run["sessions"]["t0_s0"]
    assert entry["restored_frame"] == 2000 and entry["set_aside"][0]["frame"] == 3000
    assert "warning: session t0_s0: set aside ckpt/.corrupt-3000-" in capsys.readouterr().err


def test_actor_killed_by_rays_memory_monitor_is_restarted(run_copy, monkeypatch):
    """Ray reports a memory-monitor kill as OutOfMemoryError, not RayActorError (seen under load)."""
    from ray.exceptions import OutOfMemoryError

    from orchestrator import trial as trial_mod

    def oom(_ref):
        raise OutOfMemoryError("1 worker(s) were killed due to the node running low on memory")

    monkeypatch.setattr(trial_mod.ray, "get", oom)
    spec = load_spec(SPECS, "ppo_cartpole", ITEMS + ["meta.max_restarts=2"])
    plan = SessionPlan(0, 0, 7, resume=True, status="running", frame=3000)
    trial = Trial(spec, str(run_copy), [plan], RunRecord.load_or_new(str(run_copy), "ppo_cartpole"), quiet=True)
    trial.progress = _Progress()
    assert trial.next_event(plan, object()) is False
    assert plan.status == "restarting" and "t0_s0" in trial.pending_restart
    assert plan.restarts[0]["reason"] == "OutOfMemoryError" and plan.restarts[0]["frame_restored"] == 3000


# ---------------------------------------------------------------- C: damaged run.json / trial.json / search.json
def test_truncated_run_json_is_rebuilt_with_a_warning(run_copy, capsys):
    damaged = (run_copy / "run.json").read_bytes()[:40]
    (run_copy / "run.json").write_bytes(damaged)
    assert run_cli(SPECS, "ppo_cartpole", f"train@{run_copy}", *overrides(ITEMS)) == 0
    err = capsys.readouterr().err
    assert "run.json is damaged" in err and "rebuilt" in err and "Traceback" not in err
    run = json.loads((run_copy / "run.json").read_text())
    entry = run["sessions"]["t0_s0"]
    assert (entry["status"], entry["frame"], entry["checkpoint"], entry["seed"]) == ("done", 3000, 3000, 7)
    (kept,) = run_copy.glob("run.json.damaged-*")
    assert kept.read_bytes() == damaged


def test_damaged_trial_json_is_rebuilt_from_spec_and_checkpoints(run_copy, capsys):
    spec_file = run_copy / "ppo_cartpole_spec.json"
    spec = json.loads(spec_file.read_text())
    spec["search"] = {"agent.algorithm.gamma__grid_search": [0.99, 0.9]}
    spec_file.write_text(json.dumps(spec))
    gamma = json.loads((run_copy / "ppo_cartpole_t0_spec.json").read_text())["agent"]["algorithm"]["gamma"]
    (run_copy / "t0/trial.json").write_text('{"trial": 0, "values": {"agent.al')
    info = search.lab_trials(str(run_copy))[0]
    assert info["values"] == {"agent.algorithm.gamma": gamma}
    assert (info["status"], info["frame"]) == ("done", 3000)
    assert json.loads((run_copy / "t0/trial.json").read_text())["values"] == info["values"]
    assert len(list((run_copy / "t0").glob("trial.json.damaged-*"))) == 1
    assert "trial.json is damaged" in capsys.readouterr().err


def test_damaged_search_json_exits_2_naming_it(run_copy, capsys):
    (run_copy / "search.json").write_text('{"tune_name": "ppo_cart')
    before = files_digest(run_copy)
    assert run_cli(SPECS, "ppo_cartpole", f"search@{run_copy}", *overrides(ITEMS)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "search.json" in err and "damaged" in err and "Traceback" not in err
    assert files_digest(run_copy) == before


# ---------------------------------------------------------------- D: missing saved spec
def test_missing_saved_spec_names_the_file_and_how_to_restore_it(run_copy, capsys):
    (run_copy / "ppo_cartpole_spec.json").unlink()
    before = files_digest(run_copy)
    assert run_cli(SPECS, "ppo_cartpole", f"train@{run_copy}", *overrides(ITEMS)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "not of 'ppo_cartpole'" not in err
    assert "ppo_cartpole_spec.json is missing" in err
    assert "ppo_cartpole_t0_spec.json" in err and "ppo_cartpole_t0_s0_spec.json" in err
    assert files_digest(run_copy) == before
    # the way back the message gives works
    trial_spec = json.loads((run_copy / "ppo_cartpole_t0_spec.json").read_text())
    del trial_spec["meta"]["trial"]
    (run_copy / "ppo_cartpole_spec.json").write_text(json.dumps(trial_spec))
    assert run_cli(SPECS, "ppo_cartpole", f"train@{run_copy}", *overrides(ITEMS)) == 0


# ---------------------------------------------------------------- E: two drivers on one run
HOLDER = """
import sys, time
from orchestrator.store.lease import Lease
lease = Lease(sys.argv[1], "train")
lease.acquire()
print("held", flush=True)
time.sleep(600)
"""


def test_second_driver_on_a_held_run_exits_2_then_takes_over_once_the_holder_died(run_copy, capsys):
    env = {**os.environ, **DRIVER_ENV, "PYTHONPATH": str(REPO)}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_copy)], env=env, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        record = json.loads((run_copy / "lease.json").read_text())
        assert record["pid"] == holder.pid
        before = {k: v for k, v in files_digest(run_copy).items() if k != "lease.json"}
        data = str(run_copy.parent)
        for mode in ("train@latest", f"search@{run_copy}"):
            assert run_cli(SPECS, "ppo_cartpole", mode, "--data-dir", data, *overrides(ITEMS)) == 2
            err = capsys.readouterr().err
            assert err.startswith("error:") and f"pid {holder.pid}" in err and record["since"] in err, err
            assert "in use by another driver" in err
        assert {k: v for k, v in files_digest(run_copy).items() if k != "lease.json"} == before
    finally:
        kill_pids([holder.pid])
        holder.wait()
    assert run_cli(SPECS, "ppo_cartpole", "train@latest", "--data-dir", str(run_copy.parent),
                   *overrides(ITEMS)) == 0
    assert f"taking over the lease of {run_copy} from host" in capsys.readouterr().err
    assert not (run_copy / "lease.json").exists()  # released on exit


def test_second_train_on_a_running_train_exits_2_naming_its_pid(ray_local, tmp_path, capsys):
    items = ["meta.max_session=1", "meta.log_frequency=1000", "env.max_frame=200000", "meta.random_seed=3"]
    driver = start_driver([SPECS, "ppo_cartpole", "train", *overrides(items)], tmp_path)
    tree = []
    try:
        deadline = time.time() + 240
        while not list(tmp_path.glob("data/*/t0/s0/ckpt/0*/MANIFEST.json")):
            assert driver.poll() is None and time.time() < deadline, "the driver ended or never checkpointed"
            time.sleep(0.2)
        tree = descendants(driver.pid)
        predir = only_predir(tmp_path / "data")
        holder = json.loads((predir / "lease.json").read_text())
        assert holder["pid"] == driver.pid
        cwd = os.getcwd()
        os.chdir(tmp_path)
        try:
            assert run_cli(SPECS, "ppo_cartpole", "train@latest", *overrides(items)) == 2
        finally:
            os.chdir(cwd)
        err = capsys.readouterr().err
        assert f"pid {driver.pid}" in err and "in use by another driver" in err and "Traceback" not in err
        run = json.loads((predir / "run.json").read_text())
        assert run["resumes"] == [] and run["sessions"]["t0_s0"]["status"] == "running"
        assert json.loads((predir / "lease.json").read_text())["driver_id"] == holder["driver_id"]
    finally:
        kill_pids([driver.pid] + tree + descendants(driver.pid))
        driver.wait(timeout=30)


def test_stale_lease_is_taken_over(run_copy, capsys):
    old = time.time() - 60
    record = {"driver_id": "x", "host": "elsewhere", "pid": 1, "mode": "train", "since": "2026-01-01T00:00:00",
              "heartbeat": "2026-01-01T00:00:00", "heartbeat_unix": old}
    (run_copy / "lease.json").write_text(json.dumps(record))
    assert run_cli(SPECS, "ppo_cartpole", f"train@{run_copy}", *overrides(ITEMS)) == 0
    err = capsys.readouterr().err
    assert "taking over the lease" in err and "host elsewhere pid 1" in err and "no heartbeat for 60 s" in err
    assert not (run_copy / "lease.json").exists()


def test_holder_that_lost_its_lease_notices_at_its_next_heartbeat(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_LEASE_HEARTBEAT_S", "0.1")
    monkeypatch.setattr(lease_mod, "CONFIRM_DELAY_S", 0.0)
    held = lease_mod.Lease(str(tmp_path), "train")
    held.acquire()
    try:
        other = {**held.record(), "driver_id": "other", "pid": 4242}
        storage.write_json(str(tmp_path / "lease.json"), other)
        deadline = time.time() + 10
        while held.lost is None and time.time() < deadline:
            time.sleep(0.05)
        assert held.lost is not None and held.lost["pid"] == 4242
    finally:
        held.release()
    assert json.loads((tmp_path / "lease.json").read_text())["driver_id"] == "other"  # not deleted: not ours


def test_local_lease_needs_no_confirming_wait(tmp_path, monkeypatch):
    """Local writes of the lease are conditional (an exclusive create, a compare-and-rename takeover), so neither a
    fresh lease nor the takeover of a stale record is re-read after a delay."""
    monkeypatch.setattr(lease_mod, "CONFIRM_DELAY_S", 3.0)
    t0 = time.monotonic()
    first = lease_mod.Lease(str(tmp_path / "fresh"), "train")
    first.acquire()
    fresh_s = time.monotonic() - t0
    first.release()
    assert fresh_s < 2.0
    stale = {"driver_id": "x", "host": "elsewhere", "pid": 1, "mode": "train", "heartbeat_unix": time.time() - 600}
    (tmp_path / "lease.json").write_text(json.dumps(stale))
    t0 = time.monotonic()
    second = lease_mod.Lease(str(tmp_path), "train@latest")
    second.acquire()
    takeover_s = time.monotonic() - t0
    assert json.loads((tmp_path / "lease.json").read_text())["driver_id"] == second.driver_id
    second.release()
    assert takeover_s < 2.0


def test_lease_on_s3(s3_bucket, monkeypatch):
    monkeypatch.setattr(lease_mod, "CONFIRM_DELAY_S", 0.05)
    predir = f"{s3_bucket}/runs/ppo_cartpole_2026_01_01_000000"
    first = lease_mod.Lease(predir, "train")
    first.acquire()
    try:
        with pytest.raises(lease_mod.LeaseHeldError, match=f"pid {os.getpid()}"):
            lease_mod.Lease(predir, "train@latest").acquire()
        assert storage.read_json(f"{predir}/lease.json")["driver_id"] == first.driver_id
    finally:
        first.release()
    assert not storage.exists(f"{predir}/lease.json")
    storage.write_json(f"{predir}/lease.json", {**first.record(), "host": "elsewhere",
                                                "heartbeat_unix": time.time() - 3600})
    second = lease_mod.Lease(predir, "train@latest")
    second.acquire()  # stale: taken over
    assert storage.read_json(f"{predir}/lease.json")["driver_id"] == second.driver_id
    second.release()
