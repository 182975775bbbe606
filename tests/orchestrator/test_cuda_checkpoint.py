"""Runs written on a GPU resume on a CPU-only host (issue 11: a GPU checkpoint is not tied to its device).

``tests/fixtures/cuda_run_h200.tgz`` was written on CUDA by ``bench/gpu_run.sh`` step 5 (one NVIDIA H200,
torch 2.11.0+cu130, Python 3.12.3, 2026-12-04): ``ppo_cartpole`` (MLP) and a small-conv ``ppo_atari``
(ALE/Pong-v5, 2 sync sub-envs), one session each, ``agent.net.gpu: true``, 1,024 frames, a checkpoint every
256. Each test restores the newest checkpoint on this CPU (nets, optimizer, replay of PPO's rollout, env state)
and continues it: in-process, then through the CLI's ``train@{predir}`` with Ray, and the two continuations
must agree value by value. The sessions here run on the CPU (CI has no GPU); ``exact`` becomes false because
the torch RNG state came from another device kind (CUDA Philox), which the checkpoint manifest must say.
"""

import json
import tarfile
from pathlib import Path

import pandas as pd
import pytest
import torch
from lab_helpers import REPO, assert_continuous, overrides, run_cli

from orchestrator.session.loop import Session
from orchestrator.spec.session_spec import read_session_spec
from orchestrator.store import storage
from orchestrator.store.checkpoint import CheckpointStore

FIXTURE = REPO / "tests/fixtures/cuda_run_h200.tgz"
COMPARED = lambda df: df.drop(columns=["wall_t", "fps"]).reset_index(drop=True)  # noqa: E731
WRITTEN = 1024  # frames each fixture run reached on the GPU
MORE = 1536  # frames the CPU continuation runs to
# name -> (spec file, the overrides the fixture was trained with: a resume must restate them)
RUNS = {
    "ppo_cartpole": ("specs/benchmark/cartpole.json", []),
    "ppo_atari": ("specs/benchmark/atari.json", [
        "env.num_envs=2", "agent.net.conv_hid_layers=[[8,8,4],[16,4,2]]", "agent.net.fc_hid_layers=[32]",
        "agent.algorithm.time_horizon=32", "agent.algorithm.minibatch_size=32", "agent.algorithm.training_epoch=1"]),
}
COMMON = ["meta.max_session=1", "meta.log_frequency=256", "meta.checkpoint_frequency=256", "meta.keep_checkpoints=1",
          "agent.net.gpu=true", 'meta.resources={"num_cpus": 1, "num_gpus": 0}', f"env.max_frame={MORE}"]


def unpack(name: str, data: Path) -> Path:
    """The fixture run ``name`` unpacked under ``data``; returns its predir."""
    with tarfile.open(FIXTURE) as tar:
        members = [m for m in tar.getmembers() if m.name.removeprefix("./").startswith(f"{name}_")]
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # Python >= 3.10.12 / 3.11.4
        tar.extractall(data, members=members, **safe)
    (predir,) = data.glob(f"{name}_*")
    return predir


def continue_in_process(predir: Path, name: str) -> tuple[Session, dict, pd.DataFrame]:
    """Session 0 restored on the CPU from its newest checkpoint and run to ``MORE`` frames.

    Returns:
        (the session after the run, the restored checkpoint's manifest meta, train_df right after the restore).
    """
    spec, smeta = read_session_spec(str(predir / f"{name}_t0_s0_spec.json"), name)
    spec["env"]["max_frame"] = MORE
    loaded = CheckpointStore(str(predir / "t0/s0")).latest_valid()  # file sha256s checked against the manifest
    assert loaded is not None, "the fixture has no valid checkpoint"
    manifest, files = loaded
    session = Session(spec, int(smeta["session_seed"]), fresh=False)
    session.from_checkpoint(files)
    restored_df = session.train_df
    assert session.algorithm.device.type == "cpu"
    assert session.clock.frame == WRITTEN == manifest.frame
    # the CUDA-written weights arrive bit for bit: the same sha256 the GPU session recorded
    assert session.weights_sha256() == manifest.meta["weights_sha256"]
    assert session.exact is False  # torch RNG state of another device kind (CUDA Philox)
    session.run_rl()
    session.close()
    return session, manifest.meta, restored_df


@pytest.mark.parametrize("name", list(RUNS))
def test_cuda_checkpoint_continues_on_cpu(ray_local, tmp_path, name):
    torch.set_num_threads(1)
    data = tmp_path / "data"
    predir = unpack(name, data)
    written_df = pd.read_parquet(predir / "t0/s0/train_df.parquet")
    assert written_df["frame"].tolist() == list(range(256, WRITTEN + 1, 256))
    assert json.loads((predir / "run.json").read_text())["versions"]["torch"] == "2.11.0"

    session, meta, restored_df = continue_in_process(predir, name)
    assert meta["exact"] is True  # written and checked on the GPU
    pd.testing.assert_frame_equal(COMPARED(restored_df), COMPARED(written_df))
    in_process = session.train_df
    assert in_process["frame"].tolist()[-1] == MORE

    spec_file, items = RUNS[name]
    assert run_cli(spec_file, name, f"train@{predir}", "--data-dir", str(data), *overrides(items + COMMON)) == 0
    run = storage.read_json(str(predir / "run.json"))
    assert run["sessions"]["t0_s0"]["status"] == "done"
    assert [r["from_frames"] for r in run["resumes"]] == [{"t0_s0": WRITTEN}]
    resumed = pd.read_parquet(predir / "t0/s0/train_df.parquet")
    assert_continuous(resumed, 256, MORE)
    pd.testing.assert_frame_equal(COMPARED(resumed), COMPARED(in_process))
    newest = max((predir / "t0/s0/ckpt").glob("0*"))
    manifest = json.loads((newest / "MANIFEST.json").read_text())
    assert int(newest.name) == MORE and manifest["meta"]["exact"] is False
    assert "another device kind" in manifest["meta"]["exact_reason"]
    assert manifest["meta"]["weights_sha256"] == session.weights_sha256()
