"""Tracking (issue 14): TensorBoard events hold train_df, a restore purges the steps after its
checkpoint, object-store runs upload their events, W&B (offline) and MLflow (file store) keep one
run across a resume. All in-process (``SessionRunner``), a few hundred frames each."""

import json
import math
import os
import re

import pandas as pd
import pytest
import torch
from lab_helpers import assert_tb_matches, only_predir, run_cli

from orchestrator.errors import SpecError
from orchestrator.report.tracking import TensorBoardLog, flat_spec, scalars
from orchestrator.session.runner import SessionRunner
from orchestrator.spec.load import load_spec
from orchestrator.store import storage

SPECS = "specs/benchmark/cartpole.json"
SMALL = ["env.max_frame=1600", "meta.log_frequency=400", "meta.checkpoint_frequency=400", "env.num_envs=4",
         "agent.algorithm.training_epoch=2"]
PREDIR = "ppo_cartpole_2026_01_01_000000"


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def run(spec, predir, resume=False):
    runner = SessionRunner(spec, predir, 0, 0, 7, resume=resume)
    kinds = [e.kind for e in runner.events()]
    assert kinds[-1] == "done"
    return runner


def test_tensorboard_events_hold_train_df_and_hparams(tmp_path):
    spec = load_spec(SPECS, "ppo_cartpole", SMALL)
    runner = run(spec, str(tmp_path / PREDIR))
    tb_dir = tmp_path / PREDIR / "t0/s0/tb"
    assert_tb_matches(str(tb_dir), runner.session.train_df)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    assert acc.Tags()["tensors"] == ["spec/text_summary"]
    assert {"train/wall_t", "train/t", "train/epi", "train/refill", "train/fps"}.isdisjoint(acc.Tags()["scalars"])
    assert "_hparams_/experiment" in acc.PluginTagToContent("hparams")
    tracker = runner.tracker
    print(f"tracking cost: {1000 * tracker.seconds / tracker.rows:.2f} ms per log row ({tracker.rows} rows), "
          f"{1000 * tracker.setup_seconds:.0f} ms to open and close")
    assert tracker.rows == 4 and tracker.seconds / tracker.rows < 0.5


def test_restore_purges_steps_written_after_the_checkpoint(tmp_path):
    """A killed process had written events after its last checkpoint (frames 2000, 2400): the resumed
    stream drops them, so each frame appears once and the values are the resumed train_df's."""
    predir = str(tmp_path / PREDIR)
    run(load_spec(SPECS, "ppo_cartpole", SMALL), predir)
    tb_uri = storage.join(predir, "t0/s0/tb")
    ghost = TensorBoardLog(tb_uri, None)
    ghost.write([(2000, {"train/total_reward_ma": -1.0}), (2400, {"train/total_reward_ma": -2.0})])
    # no close: the process died here
    resumed = run(load_spec(SPECS, "ppo_cartpole", SMALL + ["env.max_frame=3200"]), predir, resume=True)
    df = resumed.session.train_df
    assert df["frame"].tolist() == list(range(400, 3201, 400))
    assert_tb_matches(tb_uri, df)
    assert len(os.listdir(tb_uri)) == 3  # first run, ghost, resumed run


def test_tensorboard_on_object_store_uploads_before_commit(s3_server, s3_bucket, monkeypatch):
    predir = f"{s3_bucket}/runs/{PREDIR}"
    spec = load_spec(SPECS, "ppo_cartpole", SMALL[1:] + ["env.max_frame=800"])
    runner = run(spec, predir)
    assert [n for n in storage.listdir(f"{predir}/t0/s0/tb") if n.startswith("events.out.tfevents")]
    monkeypatch.setenv("S3_ENDPOINT", s3_server)  # TensorBoard's own S3 reader (boto3)
    assert_tb_matches(f"{predir}/t0/s0/tb", runner.session.train_df)


def test_dev_run_writes_tensorboard(tmp_path):
    data = tmp_path / "data"
    assert run_cli(SPECS, "ppo_cartpole", "dev", "--data-dir", str(data), "-s", "env.max_frame=800",
                   "-s", "meta.log_frequency=400", "-s", "env.num_envs=4") == 0
    predir = only_predir(data)
    assert_tb_matches(str(predir / "t0/s0/tb"), pd.read_parquet(predir / "t0/s0/train_df.parquet"))


def test_tensorboard_off(tmp_path):
    spec = load_spec(SPECS, "ppo_cartpole", SMALL[1:] + ["env.max_frame=400", "meta.tensorboard=false"])
    run(spec, str(tmp_path / PREDIR))
    assert not (tmp_path / PREDIR / "t0/s0/tb").exists()


def test_wandb_offline_keeps_one_run_across_resume(tmp_path):
    opts = ["meta.tracking=wandb", 'meta.tracking_options={"mode": "offline", "project": "lab-test"}']
    predir = str(tmp_path / PREDIR)
    run(load_spec(SPECS, "ppo_cartpole", SMALL[1:] + ["env.max_frame=800"] + opts), predir)
    saved = json.loads((tmp_path / PREDIR / "t0/s0/tracking.json").read_text())
    assert saved["backend"] == "wandb" and saved["group"] == PREDIR
    run(load_spec(SPECS, "ppo_cartpole", SMALL[1:] + ["env.max_frame=1600"] + opts), predir, resume=True)
    assert json.loads((tmp_path / PREDIR / "t0/s0/tracking.json").read_text()) == saved
    offline = sorted(p.name for p in (tmp_path / PREDIR / "t0/s0/wandb").glob("offline-run-*"))
    # wandb names an offline run dir offline-run-{time to the second}-{run id}, with "-1" added when a resume starts
    # within the same second
    pattern = rf"offline-run-\d{{8}}_\d{{6}}-{re.escape(saved['run_id'])}(-\d+)?"
    assert len(offline) == 2 and all(re.fullmatch(pattern, name) for name in offline), offline


def test_mlflow_keeps_one_run_and_logs_each_frame_once(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps its file store behind this switch
    uri = (tmp_path / "mlruns").as_uri()
    opts = ["meta.tracking=mlflow", json.dumps({"tracking_uri": uri, "experiment": "lab-test"}).join(
        ["meta.tracking_options=", ""])]
    predir = str(tmp_path / PREDIR)
    run(load_spec(SPECS, "ppo_cartpole", SMALL[1:] + ["env.max_frame=800"] + opts), predir)
    resumed = run(load_spec(SPECS, "ppo_cartpole", SMALL[1:] + ["env.max_frame=1600"] + opts), predir,
                  resume=True)
    client = MlflowClient(uri)
    (run_info,) = client.search_runs([client.get_experiment_by_name("lab-test").experiment_id])
    assert run_info.info.run_id == json.loads((tmp_path / PREDIR / "t0/s0/tracking.json").read_text())["run_id"]
    assert run_info.info.status == "FINISHED" and run_info.data.tags["group"] == PREDIR
    assert run_info.data.params["agent.algorithm.gamma"] == "0.98"
    history = client.get_metric_history(run_info.info.run_id, "train/opt_step")
    df = resumed.session.train_df
    assert [m.step for m in history] == df["frame"].tolist()
    assert [m.value for m in history] == df["opt_step"].astype(float).tolist()


def test_tracking_spec_errors():
    with pytest.raises(SpecError, match="meta.tracking"):
        load_spec(SPECS, "ppo_cartpole", ["meta.tracking=neptune"])
    with pytest.raises(SpecError, match="meta.tracking_options.project"):
        load_spec(SPECS, "ppo_cartpole", ["meta.tracking=mlflow", 'meta.tracking_options={"project": "x"}'])
    with pytest.raises(SpecError, match="meta.tracking_options.projekt: not an argument of wandb.init"):
        load_spec(SPECS, "ppo_cartpole", ["meta.tracking=wandb", 'meta.tracking_options={"projekt": "x"}'])
    with pytest.raises(SpecError, match="meta.tracking_options.id: set by the lab"):
        load_spec(SPECS, "ppo_cartpole", ["meta.tracking=wandb", 'meta.tracking_options={"id": "x"}'])


def test_specs_load_without_the_optional_trackers_installed(monkeypatch):
    """wandb and mlflow are optional extras: a spec that does not name them never imports them (a fresh
    `pip install -e .` has neither), and naming one that is missing is a spec error with the extra."""
    import sys

    for package in ("wandb", "mlflow"):
        for name in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
            monkeypatch.delitem(sys.modules, name)
        monkeypatch.setitem(sys.modules, package, None)  # None in sys.modules: importing it raises ImportError
    assert load_spec(SPECS, "ppo_cartpole", [])["meta"]["tracking"] == "none"
    assert load_spec(SPECS, "ppo_cartpole", ['meta.tracking_options={"project": "x"}'])["meta"]["tracking"] == "none"


def test_flat_spec():
    assert flat_spec({"a": {"b": 1, "c": [1, 2]}, "d": None, "e": {}}) == {"a.b": 1, "a.c": "[1, 2]",
                                                                             "d": "null", "e": "{}"}


def test_tensorboard_turned_on_at_resume_starts_with_the_restored_rows(tmp_path):
    predir = str(tmp_path / PREDIR)
    run(load_spec(SPECS, "ppo_cartpole", SMALL[1:] + ["env.max_frame=800", "meta.tensorboard=false"]), predir)
    resumed = run(load_spec(SPECS, "ppo_cartpole", SMALL), predir, resume=True)
    assert_tb_matches(storage.join(predir, "t0/s0/tb"), resumed.session.train_df)


def test_train_records_the_wandb_run_in_run_json(ray_local, tmp_path):
    """Through Ray: the actor's run id reaches the driver's run.json; event files are written."""
    data = tmp_path / "data"
    assert run_cli(SPECS, "ppo_cartpole", "train", "--data-dir", str(data), "-s", "env.max_frame=400",
                   "-s", "meta.log_frequency=400", "-s", "env.num_envs=4", "-s", "meta.max_session=1",
                   "-s", "meta.tracking=wandb", "-s", 'meta.tracking_options={"mode": "offline"}') == 0
    predir = only_predir(data)
    saved = json.loads((predir / "t0/s0/tracking.json").read_text())
    assert json.loads((predir / "run.json").read_text())["sessions"]["t0_s0"]["tracking"] == saved
    assert list((predir / "t0/s0/tb").glob("events.out.tfevents.*"))
    html = (predir / "graph/ppo_cartpole_t0_trial_graph.html").read_text()  # the analysis' HTML trial graph
    assert html.lower().startswith("<!doctype html>") and list((data / ".assets").glob("plotly-*.min.js"))


def test_mlflow_resume_logs_the_rows_a_killed_process_had_not_sent(tmp_path, monkeypatch):
    """Killed after checkpoint 800 committed but before its rows went to MLflow (they follow one
    checkpoint late): the resumed run asks MLflow for its last step and sends frame 800 first."""
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    spec = load_spec(SPECS, "ppo_cartpole", SMALL + ["meta.tracking=mlflow", json.dumps({"tracking_uri": uri}).join(
        ["meta.tracking_options=", ""])])
    predir = str(tmp_path / PREDIR)
    first = SessionRunner(spec, predir, 0, 0, 7, resume=False)
    events = first.events()
    for event in events:
        if event.kind == "checkpoint" and event.frame == 800:
            break
    events.close()  # the process dies here: no tracker.close
    run_id = json.loads((tmp_path / PREDIR / "t0/s0/tracking.json").read_text())["run_id"]
    client = MlflowClient(uri)
    assert [m.step for m in client.get_metric_history(run_id, "train/opt_step")] == [400]
    resumed = run(spec, predir, resume=True)
    assert resumed.restored_frame == 800
    history = client.get_metric_history(run_id, "train/opt_step")
    assert [m.step for m in history] == resumed.session.train_df["frame"].tolist()


def test_dev_with_a_tracker_that_does_not_start_exits_2_and_leaves_no_run(tmp_path, monkeypatch, capsys):
    """``dev`` whose W&B / MLflow run cannot start (e.g. no W&B login: wandb raises UsageError) used to end in
    a traceback with a half-made run directory; now exit 2 naming ``meta.tracking`` and the cause, nothing left."""
    from orchestrator.report import tracking

    def no_login(self, run_id):
        raise RuntimeError("api_key not configured (no-tty). call wandb.login(key=[your_api_key])")

    monkeypatch.setattr(tracking.SessionTracker, "open_run", no_login)
    data = tmp_path / "data"
    code = run_cli(SPECS, "ppo_cartpole", "dev", "--data-dir", str(data), "-s", "env.max_frame=400",
                   "-s", "meta.tracking=wandb")
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "meta.tracking=wandb: the tracker did not start (RuntimeError: api_key not configured" in err
    assert not data.exists() or list(data.iterdir()) == []


def test_without_modules_blocks_only_inside_the_block_and_only_modules_not_yet_imported():
    import importlib
    import sys

    from orchestrator.report.tracking import without_modules

    assert "json" in sys.modules
    name = "xml.dom.minidom"  # a stdlib module nothing here imported yet
    sys.modules.pop(name, None)
    with without_modules((name, "json")):
        with pytest.raises(ImportError):
            importlib.import_module(name)
        assert importlib.import_module("json") is sys.modules["json"]  # already imported: untouched
    assert importlib.import_module(name).__name__ == name and sys.modules[name] is not None


def test_scalars_are_the_metrics_not_the_bookkeeping_columns():
    row = {"frame": 400, "epi": 3, "t": 20, "opt_step": 12, "wall_t": 1.5, "fps": 800.0, "total_reward": 21.0,
           "total_reward_ma": 19.5, "loss": math.nan, "lr": 0.001, "refill": False}
    assert scalars(row, "train") == {"train/opt_step": 12.0, "train/total_reward": 21.0,
                                     "train/total_reward_ma": 19.5, "train/lr": 0.001}
