"""Resuming runs whose checkpoints hold an ``env.pkl`` (docs/resume.md "Trust boundary"): a run written before env
state became data resumes exactly through the restricted unpickler and then writes the new format; a planted
hostile ``env.pkl`` in a committed checkpoint never runs: that checkpoint is set aside as corrupt with a warning
naming it and the next older one is used, or, with none left, the session stops."""

import hashlib
import json
import pickle
import tarfile
from pathlib import Path

import pandas as pd
import pytest
import torch

from envs.state import STATE_FILES
from orchestrator.session.runner import SessionRunner
from orchestrator.store.checkpoint import CheckpointError
from tests.orchestrator.session.test_resume_exact import COMPARED

RUN = Path(__file__).resolve().parents[2] / "fixtures" / "legacy_env" / "ppo_cartpole_run.tgz"
NAME = "ppo_cartpole_2026_01_01_000000"


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def legacy_run(tmp_path):
    """The fixture run (checkpoints at frames 400 and 800 with env.pkl, written by the code before this format),
    its spec with ``max_frame`` raised to 1200, and the train_df its resume gave then."""
    with tarfile.open(RUN) as tar:
        tar.extractall(tmp_path, filter="data")
    spec = json.loads((tmp_path / "spec.json").read_text())
    spec["env"]["max_frame"] = 1200
    return spec, str(tmp_path / NAME), pd.read_parquet(tmp_path / "resumed_train_df.parquet")


def plant(ckpt: Path, data: bytes) -> None:
    """Replace the checkpoint's env.pkl with ``data`` and update its manifest: what a writer of the store can do."""
    (ckpt / "env.pkl").write_bytes(data)
    manifest = json.loads((ckpt / "MANIFEST.json").read_text())
    manifest["files"]["env.pkl"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (ckpt / "MANIFEST.json").write_text(json.dumps(manifest))


class Creates:
    """Unpickled by a plain ``pickle.loads``, creates the file ``path``."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return open, (self.path, "w")


def resume(spec, predir):
    runner = SessionRunner(spec, predir, 0, 0, 7, resume=True)
    kinds = [e.kind for e in runner.events()]
    assert kinds[-1] == "done", kinds
    return runner


def test_a_run_written_before_the_change_resumes_exactly_then_writes_env_state(tmp_path):
    spec, predir, before = legacy_run(tmp_path)
    runner = resume(spec, predir)
    assert runner.restored_frame == 800 and runner.session.exact and runner.set_aside == []
    # the same continuation as the pre-change code gave from this checkpoint (tolerance: another CPU may round
    # a float differently; on the machine that wrote the fixture the frames are equal)
    pd.testing.assert_frame_equal(COMPARED(before), COMPARED(runner.session.train_df), check_exact=False, rtol=1e-5)
    newest = Path(predir) / "t0" / "s0" / "ckpt" / "000000001200"
    assert {p.name for p in newest.iterdir()} >= set(STATE_FILES) and not (newest / "env.pkl").exists()
    assert json.loads((newest / "MANIFEST.json").read_text())["meta"]["exact"] is True


def test_a_planted_env_pkl_never_runs_and_the_resume_falls_back(tmp_path):
    spec, predir, _ = legacy_run(tmp_path)
    ckpt = Path(predir) / "t0" / "s0" / "ckpt"
    marker = tmp_path / "created_by_env_pkl"
    plant(ckpt / "000000000800", pickle.dumps({"env": Creates(str(marker))}))
    runner = resume(spec, predir)
    assert not marker.exists()
    assert runner.restored_frame == 400 and runner.session.exact
    (aside,) = runner.set_aside
    assert aside["frame"] == 800 and "file 'env.pkl' is refused" in aside["reason"] and "io.open" in aside["reason"]
    log = (Path(predir) / "t0" / "s0" / "log.txt").read_text()
    assert "warning: checkpoint" in log and "000000000800 failed verification" in log
    assert "resuming from checkpoint" in log and "000000000400" in log
    (corrupt,) = ckpt.glob(".corrupt-800-*")  # kept for inspection, never loaded again
    assert (corrupt / "env.pkl").exists() and not (ckpt / "000000000800" / "env.pkl").exists()  # 800: rewritten


def test_with_every_checkpoint_planted_the_session_stops_without_running_it(tmp_path):
    spec, predir, _ = legacy_run(tmp_path)
    ckpt = Path(predir) / "t0" / "s0" / "ckpt"
    marker = tmp_path / "created_by_env_pkl"
    for frame in ("000000000400", "000000000800"):
        plant(ckpt / frame, pickle.dumps(Creates(str(marker))))
    runner = SessionRunner(spec, predir, 0, 0, 7, resume=True)
    with pytest.raises(CheckpointError, match="no valid checkpoint.*env.pkl' is refused"):
        runner.restore()
    assert not marker.exists()
