"""``GroupRunner`` (Ray-free): a seed group's sessions checkpointed at the same frames, stopped together, resumed from
their common checkpoint, with passengers that write nothing; each ends equal to the uninterrupted group."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest
import torch

from orchestrator.session.group_runner import GroupRunner, group_batches
from orchestrator.spec.load import load_spec
from orchestrator.store.checkpoint import CheckpointStore
from tests.agents.algorithms.helpers import SPECS
from tests.orchestrator.lab_helpers import files_digest

COMPARED = lambda df: df.drop(columns=["wall_t", "fps"]).reset_index(drop=True)  # noqa: E731
OVERRIDES = ["env.max_frame=1024", "env.num_envs=4", "meta.log_frequency=128", "agent.algorithm.training_epoch=2",
             "agent.algorithm.time_horizon=16", "meta.checkpoint_frequency=256", "meta.session_batch=2",
             "meta.tensorboard=false"]
SEEDS = [5, 6]


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The uninterrupted group's sessions and events (one torch thread, as every test here)."""
    torch.set_num_threads(1)
    spec = load_spec(SPECS, "ppo_cartpole", OVERRIDES)
    runner = GroupRunner(spec, str(tmp_path_factory.mktemp("straight")), 0, [0, 1], SEEDS, resume=False)
    events = list(group_batches(runner))
    return [r.session for r in runner.runners], events


def assert_equal(sessions, runners):
    for a, runner in zip(sessions, runners):
        pd.testing.assert_frame_equal(COMPARED(a.train_df), COMPARED(runner.session.train_df))
        assert a.weights_sha256() == runner.session.weights_sha256()


def test_group_events_are_each_sessions_own_and_checkpoints_are_at_the_same_frames(straight, tmp_path):
    sessions, events = straight
    tagged = [(s, e.kind, e.row["frame"] if e.kind == "log" else getattr(e, "frame", None))
              for g in events for s, e in g.events]
    assert tagged[:2] == [(0, "started", None), (1, "started", None)]
    assert tagged[-2:] == [(0, "done", 1024), (1, "done", 1024)]
    for s in (0, 1):
        assert [f for k, kind, f in tagged if k == s and kind == "checkpoint"] == [256, 512, 768, 1024]
        assert [f for k, kind, f in tagged if k == s and kind == "log"] == list(range(128, 1025, 128))
    assert sessions[0].train_df["total_reward"].tolist() != sessions[1].train_df["total_reward"].tolist()


def test_stopped_group_commits_every_session_then_resumes_equal(straight, tmp_path):
    spec = load_spec(SPECS, "ppo_cartpole", OVERRIDES)
    runner = GroupRunner(spec, str(tmp_path), 0, [0, 1], SEEDS, resume=False)
    ends = []
    for s, event, _ in runner.events():
        if event.kind == "checkpoint" and event.frame == 256:
            runner.group.sessions[0].stop_requested = True  # as SIGTERM: one session's flag stops the group
        if event.kind in ("done", "interrupted"):
            ends.append((s, event.kind, event.frame, event.checkpoint))
    assert ends == [(0, "interrupted", 512, True), (1, "interrupted", 512, True)]
    resumed = GroupRunner(spec, str(tmp_path), 0, [0, 1], SEEDS, resume=True)
    assert [r.restored_frame for r in resumed.runners] == [512, 512]
    list(resumed.events())
    assert_equal(straight[0], resumed.runners)


def test_group_killed_between_its_sessions_final_commits_resumes_with_a_passenger(straight, tmp_path):
    """Session 0 committed the final frame, session 1 did not: session 1 resumes from their common frame with
    session 0 riding along (restored and trained, writing nothing) and ends equal to the uninterrupted run."""
    spec = load_spec(SPECS, "ppo_cartpole", OVERRIDES)
    list(GroupRunner(spec, str(tmp_path), 0, [0, 1], SEEDS, resume=False).events())
    shutil.rmtree(tmp_path / "t0/s1/ckpt/000000001024")
    shutil.rmtree(tmp_path / "t0/s1/ckpt/000000000768")
    before = files_digest(tmp_path / "t0/s0")
    resumed = GroupRunner(spec, str(tmp_path), 0, [0, 1], SEEDS, resume=True, passengers=[0])
    assert resumed.reported == [1] and resumed.runners[0].restored_frame == 512
    kinds = [(s, e.kind, getattr(e, "frame", None)) for s, e, _ in resumed.events() if e.kind != "log"]
    assert kinds == [(1, "started", None), (1, "checkpoint", 768), (1, "checkpoint", 1024), (1, "done", 1024)]
    assert_equal(straight[0][1:], resumed.runners)
    assert files_digest(tmp_path / "t0/s0") == before  # the passenger wrote nothing
    manifest, _ = CheckpointStore(str(tmp_path / "t0/s1")).load(1024)
    assert manifest.meta["batched"] == 2 and manifest.meta["batch_sessions"] == [0, 1]


def test_a_group_killed_between_a_final_commit_and_its_export_restores_the_user_copies(straight, tmp_path):
    """Both sessions committed the final frame but session 1's user train_df is an older one: the restored group
    (nothing left to train) rewrites it from the checkpoint."""
    spec = load_spec(SPECS, "ppo_cartpole", OVERRIDES)
    list(GroupRunner(spec, str(tmp_path), 0, [0, 1], SEEDS, resume=False).events())
    copy = tmp_path / "t0/s1/train_df.parquet"
    full = pd.read_parquet(copy)
    full.iloc[:5].to_parquet(copy)
    resumed = GroupRunner(spec, str(tmp_path), 0, [0, 1], SEEDS, resume=True)
    assert [r.restored_frame for r in resumed.runners] == [1024, 1024]
    pd.testing.assert_frame_equal(pd.read_parquet(copy), full)
    assert [e.kind for _, e, _ in resumed.events()] == ["started", "started", "done", "done"]
    pd.testing.assert_frame_equal(pd.read_parquet(copy), full)


def test_group_with_no_common_checkpoint_starts_at_frame_zero_and_says_so(straight, tmp_path):
    spec = load_spec(SPECS, "ppo_cartpole", OVERRIDES)
    list(GroupRunner(spec, str(tmp_path), 0, [0, 1], SEEDS, resume=False).events())
    for frame in (256, 512, 768, 1024):
        shutil.rmtree(tmp_path / f"t0/s1/ckpt/{frame:012d}", ignore_errors=True)
    resumed = GroupRunner(spec, str(tmp_path), 0, [0, 1], SEEDS, resume=True)
    assert [r.restored_frame for r in resumed.runners] == [None, None]
    list(resumed.events())
    assert_equal(straight[0], resumed.runners)
    assert "no checkpoint frame common to the sessions of its group [0, 1]" in (tmp_path / "t0/s1/log.txt").read_text()
