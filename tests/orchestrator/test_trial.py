"""Trials as Ray actors: train, SIGKILL of the driver, train@latest, edits on resume, object storage.

The in-process runs share the session-scoped ``ray_local``; the SIGKILL test runs its driver as a
subprocess (it must die), which starts a Ray of its own, whose leftover processes the test kills
by PID.
"""

import json
import os

import pandas as pd
import pytest
from lab_helpers import (
    SPECS,
    assert_continuous,
    assert_tb_matches,
    files_digest,
    kill_driver_when,
    only_predir,
    overrides,
    run_cli,
    start_driver,
    uninterrupted_df,
)

from orchestrator.store import storage

PPO_SMALL = ["meta.max_session=2", "meta.log_frequency=800", "meta.checkpoint_frequency=800", "meta.random_seed=11"]


def test_train_sigkill_driver_then_resume_latest(ray_local, tmp_path):
    items = PPO_SMALL + ["env.max_frame=16000"]
    driver = start_driver([SPECS, "ppo_cartpole", "train", *overrides(items)], tmp_path)
    kill_driver_when(driver, lambda: {m.parents[2].name for m in tmp_path.glob("data/*/t0/s*/ckpt/0*/MANIFEST.json")}
                     == {"s0", "s1"}, 180, "a committed checkpoint in both sessions")
    predir = only_predir(tmp_path / "data")
    killed_at = {s: max(int(p.name) for p in (predir / f"t0/s{s}/ckpt").glob("0*")) for s in (0, 1)}
    assert min(killed_at.values()) < 16000, "the driver was killed after the run finished"

    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert run_cli(SPECS, "ppo_cartpole", "train@latest", *overrides(items)) == 0
    finally:
        os.chdir(cwd)
    run = storage.read_json(str(predir / "run.json"))
    assert [r["from_frames"] for r in run["resumes"]] == [{f"t0_s{s}": killed_at[s] for s in (0, 1)}]
    for s in (0, 1):
        assert run["sessions"][f"t0_s{s}"]["status"] == "done"
        resumed = pd.read_parquet(predir / f"t0/s{s}/train_df.parquet")
        assert_continuous(resumed, 800, 16000)
        straight = uninterrupted_df(items, s)
        pd.testing.assert_frame_equal(resumed.drop(columns=["wall_t", "fps"]),
                                      straight.drop(columns=["wall_t", "fps"]))
        assert_tb_matches(str(predir / f"t0/s{s}/tb"), resumed)  # no step twice, last values = train_df's


def test_edit_on_resume_raises_max_frame_and_refuses_hid_layers(ray_local, tmp_path):
    items = PPO_SMALL + ["env.max_frame=1600"]
    data = str(tmp_path / "data")
    assert run_cli(SPECS, "ppo_cartpole", "train", "--data-dir", data, *overrides(items)) == 0
    predir = only_predir(tmp_path / "data")
    before = files_digest(predir)

    code = run_cli(SPECS, "ppo_cartpole", f"train@{predir}", "--data-dir", data,
                   *overrides(items + ["agent.net.hid_layers=[32]"]))
    assert code == 2
    assert files_digest(predir) == before, "a refused resume changed the run directory"

    assert run_cli(SPECS, "ppo_cartpole", "train@latest", "--data-dir", data,
                   *overrides(PPO_SMALL + ["env.max_frame=3200"])) == 0
    for s in (0, 1):
        df = pd.read_parquet(predir / f"t0/s{s}/train_df.parquet")
        assert_continuous(df, 800, 3200)
    saved = storage.read_json(str(predir / "ppo_cartpole_spec.json"))
    assert saved["env"]["max_frame"] == 3200
    run = storage.read_json(str(predir / "run.json"))
    assert run["resumes"][-1]["spec_edits"] == ["env.max_frame: 1600 -> 3200"]


def test_refused_edit_names_key_and_values(ray_local, tmp_path, capsys):
    items = PPO_SMALL + ["env.max_frame=800", "meta.max_session=1"]
    data = str(tmp_path / "data")
    assert run_cli(SPECS, "ppo_cartpole", "train", "--data-dir", data, *overrides(items)) == 0
    capsys.readouterr()
    code = run_cli(SPECS, "ppo_cartpole", "train@latest", "--data-dir", data,
                   *overrides(items + ["agent.net.hid_layers=[32]", "agent.algorithm.gamma=0.9"]))
    err = capsys.readouterr().err
    assert code == 2
    assert "agent.net.hid_layers" in err and "[64, 64]" in err and "[32]" in err
    assert "agent.algorithm.gamma" in err and "Traceback" not in err


STORE_ITEMS = PPO_SMALL + ["env.max_frame=1600", "meta.max_session=1"]


@pytest.fixture(scope="module")
def local_predir(ray_local, tmp_path_factory):
    """Predir of a finished local ``STORE_ITEMS`` train run, which each object-store test copies into its bucket (the
    copy is resumed; this run is only read)."""
    local = tmp_path_factory.mktemp("local") / "data"
    assert run_cli(SPECS, "ppo_cartpole", "train", "--data-dir", str(local), *overrides(STORE_ITEMS)) == 0
    return only_predir(local)


@pytest.mark.parametrize("store", ["s3", "gcs"])
def test_resume_on_an_object_store_and_from_a_copied_predir(ray_local, local_predir, request, store):
    """On S3 (moto server) and GCS (gcp-storage-emulator): train, resume with ``train@latest``, and resume a local
    run copied into the bucket."""
    bucket = request.getfixturevalue(f"{store}_bucket")
    items = STORE_ITEMS
    data = f"{bucket}/runs"
    assert run_cli(SPECS, "ppo_cartpole", "train", "--data-dir", data, *overrides(items)) == 0
    (name,) = [n for n in storage.listdir(data) if not n.startswith(".")]  # .assets: the graphs' plotly js
    assert run_cli(SPECS, "ppo_cartpole", "train@latest", "--data-dir", data,
                   *overrides(items[:-2] + ["env.max_frame=3200", "meta.max_session=1"])) == 0
    df = storage.read_parquet(f"{data}/{name}/t0/s0/train_df.parquet")
    assert_continuous(df, 800, 3200)

    # a local run copied into the bucket resumes from there
    predir = local_predir
    target = f"{bucket}/copied/{predir.name}"
    for path in predir.rglob("*"):
        if path.is_file():
            storage.write_bytes(f"{target}/{path.relative_to(predir).as_posix()}", path.read_bytes())
    assert run_cli(SPECS, "ppo_cartpole", f"train@{target}",
                   *overrides(items[:-2] + ["env.max_frame=2400", "meta.max_session=1"])) == 0
    df = storage.read_parquet(f"{target}/t0/s0/train_df.parquet")
    assert_continuous(df, 800, 2400)


def test_sessions_beyond_the_cluster_wait_for_freed_resources(ray_local, tmp_path):
    """3 sessions of 2 CPUs on a 4-CPU Ray: the third starts once a finished actor is released."""
    items = ["meta.max_session=3", "meta.log_frequency=400", "env.max_frame=800",
             'meta.resources={"num_cpus": 2, "num_gpus": 0}']
    assert run_cli(SPECS, "ppo_cartpole", "train", "--data-dir", str(tmp_path / "data"), *overrides(items)) == 0
    run = storage.read_json(str(only_predir(tmp_path / "data") / "run.json"))
    assert [run["sessions"][f"t0_s{s}"]["status"] for s in range(3)] == ["done"] * 3


def test_run_json_checkpoint_updates_are_amortized(tmp_path, monkeypatch):
    """1,000 checkpoint events within a second cost one run.json write (the first); a status change is written at
    once with every pending frame; after CHECKPOINT_WRITE_S the next checkpoint event writes again."""
    from orchestrator.store.record import RunRecord, SessionPlan

    clock = [100.0]
    monkeypatch.setattr("orchestrator.store.record.time.monotonic", lambda: clock[0])
    writes = []
    monkeypatch.setattr(storage, "write_text", lambda uri, text: writes.append(json.loads(text)))
    record = RunRecord(str(tmp_path), {"sessions": {}})
    plans = [SessionPlan(0, s, s, False, status="running") for s in range(4)]
    for frame in range(1, 251):
        for plan in plans:
            plan.frame = frame
            record.update(plan, checkpoint=frame, defer=True)
    assert len(writes) == 1 and writes[0]["sessions"]["t0_s0"]["checkpoint"] == 1
    plans[0].status = "done"
    record.update(plans[0])
    assert len(writes) == 2 and {e["checkpoint"] for e in writes[1]["sessions"].values()} == {250}
    record.update(plans[1], checkpoint=251, defer=True)
    assert len(writes) == 2
    clock[0] += RunRecord.CHECKPOINT_WRITE_S
    record.flush_due()
    assert len(writes) == 3 and writes[2]["sessions"]["t0_s1"]["checkpoint"] == 251
