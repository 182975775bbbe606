"""A group of batched sessions (orchestrator.session.batched): per-seed sessions, exact resume, refusals."""

from __future__ import annotations

import io

import pandas as pd
import pytest
import torch

from orchestrator.errors import UsageError
from orchestrator.session.batched import SessionGroup
from orchestrator.session.loop import Session
from orchestrator.spec.load import load_spec
from tests.agents.algorithms.helpers import SPECS

COMPARED = lambda df: df.drop(columns=["wall_t", "fps"]).reset_index(drop=True)  # noqa: E731
SEEDS = [5, 6, 7]
OVERRIDES = ["env.max_frame=1024", "env.num_envs=4", "meta.log_frequency=128", "agent.algorithm.training_epoch=3",
             "agent.algorithm.time_horizon=16", "meta.rigorous_eval=1", "meta.eval_frequency=512"]


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


A2C_OVERRIDES = ["env.max_frame=1024", "env.num_envs=4", "meta.log_frequency=128", "meta.rigorous_eval=1",
                 "meta.eval_frequency=512", "agent.algorithm.training_frequency=16"]


@pytest.mark.parametrize("name,overrides,steps_per_update", [("ppo_cartpole", OVERRIDES, 3),
                                                             ("a2c_gae_cartpole", A2C_OVERRIDES, 1)])
def test_group_resumes_bit_for_bit_and_each_seed_is_its_own_session(name, overrides, steps_per_update):
    spec = load_spec(SPECS, name, overrides)
    straight = SessionGroup(spec, SEEDS, sessions=[0, 1, 2])
    straight.run_rl()
    first = SessionGroup(spec, SEEDS, sessions=[0, 1, 2])
    first.run_rl(until_frame=392)  # 98 steps of 4 envs: mid-rollout (16 steps per rollout)
    saved = first.checkpoint()
    first.close()
    for files, meta in saved:
        assert meta["batched"] == 3 and meta["batch_sessions"] == [0, 1, 2] and meta["exact"]
        assert meta["clock"]["frame"] == 392
    resumed = SessionGroup(spec, SEEDS, sessions=[0, 1, 2], fresh=False)
    resumed.restore([files for files, _ in saved])
    resumed.run_rl()
    for a, b in zip(straight.sessions, resumed.sessions):
        pd.testing.assert_frame_equal(COMPARED(a.train_df), COMPARED(b.train_df))
        pd.testing.assert_frame_equal(a.eval_df.drop(columns=["wall_t"]), b.eval_df.drop(columns=["wall_t"]))
        for key in ("frame", "epi", "t", "opt_step"):
            assert getattr(a.clock, key) == getattr(b.clock, key), key
    assert straight.weights_sha256() == resumed.weights_sha256()
    frames = straight.sessions[0].train_df["frame"].tolist()
    assert frames == list(range(128, 1025, 128))
    returns = [tuple(s.train_df["total_reward"].fillna(-1)) for s in straight.sessions]
    assert len(set(returns)) == len(SEEDS)  # three seeds, three different runs
    assert straight.sessions[0].clock.opt_step == (1024 // (16 * 4)) * steps_per_update


def test_a_seeds_checkpoint_resumes_as_a_separate_session():
    spec = load_spec(SPECS, "ppo_cartpole", OVERRIDES)
    group = SessionGroup(spec, SEEDS[:2])
    group.run_rl(until_frame=256)
    files, meta = group.checkpoint()[1]
    alone = Session(spec, SEEDS[1], session=1, fresh=False)
    alone.from_checkpoint(files)
    assert alone.weights_sha256() == group.sessions[1].weights_sha256() == meta["weights_sha256"]
    state = torch.load(io.BytesIO(files["state.pt"]), weights_only=True)
    steps = int(state["algorithm"]["optims"]["net"]["state"][0]["step"])
    assert steps == alone.clock.opt_step == 12  # 4 rollouts x 3 epochs
    alone.run_rl(until_frame=320)
    assert alone.clock.frame == 320


def test_unsupported_algorithm_is_refused_by_name():
    with pytest.raises(UsageError, match="'SARSA' does not run with seeds batched"):
        SessionGroup(load_spec(SPECS, "sarsa_cartpole", ["env.max_frame=100"]), SEEDS[:2])


CHILD = """
import sys, time, torch
torch.set_num_threads(1)
from orchestrator.session.batched import SessionGroup, run_checkpointed
from orchestrator.spec.load import load_spec
from orchestrator.store.checkpoint import CheckpointStore
from tests.agents.algorithms.helpers import SPECS
spec = load_spec(SPECS, "ppo_cartpole", sys.argv[2:])
group = SessionGroup(spec, [5, 6, 7], trial=0, sessions=[0, 1, 2])
stores = [CheckpointStore(f"{sys.argv[1]}/t0/s{s}") for s in range(3)]
run_checkpointed(group, stores, 128, on_log=lambda s, row: time.sleep(0.1))  # slow: the parent kills it midway
"""


KILL_OVERRIDES = [*OVERRIDES, "env.max_frame=768"]


def test_group_killed_by_sigkill_resumes_from_its_common_checkpoint_bit_for_bit(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from orchestrator.session.batched import newest_common_frame, restore_group, run_checkpointed
    from orchestrator.store.checkpoint import CheckpointStore

    spec = load_spec(SPECS, "ppo_cartpole", KILL_OVERRIDES)
    predir = str(tmp_path / "ppo_cartpole_2026_01_01_000000")
    stores = [CheckpointStore(f"{predir}/t0/s{s}") for s in range(3)]
    root = Path(__file__).resolve().parents[3]
    child = subprocess.Popen([sys.executable, "-c", CHILD, predir, *KILL_OVERRIDES], cwd=root,
                             env={**os.environ, "PYTHONPATH": str(root)})
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and child.poll() is None:
            if all(Path(store.ckpt_dir).exists() for store in stores) and (newest_common_frame(stores) or 0) >= 256:
                break
            time.sleep(0.05)
        assert child.poll() is None, "the child ended before it could be killed"
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=60) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
    straight = SessionGroup(spec, SEEDS, sessions=[0, 1, 2])
    straight.run_rl()
    resumed = SessionGroup(spec, SEEDS, sessions=[0, 1, 2], fresh=False)
    frame = restore_group(resumed, stores)
    assert 256 <= frame < 768 and frame % 128 == 0
    assert all(s.clock.frame == frame and s.clock.resume_count == 1 for s in resumed.sessions)
    run_checkpointed(resumed, stores, 128)
    for a, b in zip(straight.sessions, resumed.sessions):
        pd.testing.assert_frame_equal(COMPARED(a.train_df), COMPARED(b.train_df))
    assert straight.weights_sha256() == resumed.weights_sha256()
    for store, sha in zip(stores, straight.weights_sha256()):  # the last committed manifests say the same
        manifest, _ = store.load(768)
        assert manifest.meta["weights_sha256"] == sha and manifest.meta["batched"] == 3
    assert (Path(predir) / "t0" / "s2" / "train_df.parquet").exists()
