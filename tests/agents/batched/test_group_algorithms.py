"""Session groups (orchestrator.session.batched) of every batched algorithm: exact resume from their checkpoints (in
process, and after a SIGKILL by PID of a ``GroupRunner``), a seed's checkpoint as a separate session's, the refill of
a replay left out of the checkpoints."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from orchestrator.session.batched import SessionGroup, newest_common_frame
from orchestrator.session.loop import REPLAY_NOT_STORED, Session
from orchestrator.spec.load import load_spec
from orchestrator.store.checkpoint import CheckpointStore
from tests.agents.algorithms.helpers import SPECS

COMPARED = lambda df: df.drop(columns=["wall_t", "fps"]).reset_index(drop=True)  # noqa: E731
SEEDS = [5, 6, 7]
DQN = ["env.max_frame=768", "env.num_envs=2", "meta.log_frequency=64", "agent.algorithm.training_start_step=64",
       "agent.memory.max_size=2000", "agent.memory.batch_size=32", "agent.net.update_frequency=50",
       "agent.memory.checkpoint=true"]
REINFORCE = ["env.max_frame=768", "meta.log_frequency=64", "agent.memory.name=OnPolicyBatchReplay",
             "agent.algorithm.training_frequency=16"]
SAC = ["env.max_frame=768", "meta.log_frequency=64", "agent.algorithm.training_start_step=128",
       "agent.memory.batch_size=32", "agent.memory.max_size=2000", "agent.net.hid_layers=[32,32]",
       "agent.algorithm.training_iter=1", "agent.memory.checkpoint=true"]
# Atari PPO with its shared ConvNet on 36x36 Pong frames, a tiny conv body
ATARI = ["env.max_frame=768", "env.num_envs=2", "env.image_downsize=[36,36]", "meta.log_frequency=128",
         "agent.algorithm.training_epoch=3", "agent.algorithm.time_horizon=16", "agent.algorithm.minibatch_size=16",
         "agent.net.conv_hid_layers=[[8,8,4],[8,3,1]]", "agent.net.fc_hid_layers=[32]"]
# Atari DQN: its ConvNet on 36x36 Pong frames (tiny), each seed's frame-stack replay stored in its checkpoint
DQN_ATARI = ["env.max_frame=768", "env.num_envs=2", "env.image_downsize=[36,36]", "meta.log_frequency=128",
             "agent.net.conv_hid_layers=[[8,8,4],[8,3,1]]", "agent.net.fc_hid_layers=[32]", "agent.net.gpu=false",
             "agent.algorithm.training_start_step=64", "agent.memory.max_size=2000", "agent.memory.batch_size=16",
             "agent.net.update_frequency=50", "agent.memory.checkpoint=true",
             "agent.algorithm.explore_var_spec.start_step=0", "agent.algorithm.explore_var_spec.end_step=400",
             "agent.algorithm.explore_var_spec.end_val=0.1"]
CASES = {"dqn_cartpole": DQN, "ddqn_per_cartpole": [*DQN, "agent.algorithm.training_iter=2", "env.max_frame=512"],
         "reinforce_cartpole": REINFORCE, "sac_pendulum": SAC, "ppo_atari": ATARI,
         "dqn_atari": [*DQN_ATARI, "env.max_frame=512"]}


def spec_of(name: str, overrides: list[str]) -> dict:
    """The flat spec of benchmark spec ``name`` (CartPole's file, or Pendulum's for ``*_pendulum``, Atari's for
    ``*_atari``)."""
    other = next((f for f in ("pendulum", "atari") if name.endswith(f"_{f}")), None)
    return load_spec(str(Path(SPECS).with_name(f"{other}.json")) if other else SPECS, name, overrides)


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def _assert_same_runs(straight: SessionGroup, resumed: SessionGroup) -> None:
    for a, b in zip(straight.sessions, resumed.sessions):
        pd.testing.assert_frame_equal(COMPARED(a.train_df), COMPARED(b.train_df))
        for key in ("frame", "epi", "t", "opt_step"):
            assert getattr(a.clock, key) == getattr(b.clock, key), key
    assert straight.weights_sha256() == resumed.weights_sha256()


@pytest.mark.parametrize("name", list(CASES))
def test_group_resumes_bit_for_bit_and_a_seeds_checkpoint_is_a_separate_sessions(name):
    spec = spec_of(name, CASES[name])
    straight = SessionGroup(spec, SEEDS)
    straight.run_rl()
    first = SessionGroup(spec, SEEDS)
    first.run_rl(until_frame=328)  # mid-rollout (REINFORCE), between target updates (DQN)
    saved = first.checkpoint()
    first.close()
    for _, meta in saved:
        assert meta["batched"] == 3 and meta["exact"] and meta["memory"] and meta["clock"]["frame"] == 328
    resumed = SessionGroup(spec, SEEDS, fresh=False)
    resumed.restore([files for files, _ in saved])
    resumed.run_rl()
    _assert_same_runs(straight, resumed)
    assert straight.sessions[0].train_df["opt_step"].iloc[-1] > 0
    assert len({tuple(s.train_df[["total_reward", "loss"]].fillna(-1).to_numpy().ravel())
                for s in straight.sessions}) == 3  # three different runs
    # seed 1's checkpoint is a separate session's: its nets, counters and memory (the replay included)
    alone = Session(spec, SEEDS[1], session=1, fresh=False)
    alone.from_checkpoint(saved[1][0])
    member = first.batch.members[1]
    assert alone.weights_sha256() == saved[1][1]["weights_sha256"] == member.weights_sha256()
    assert len(alone.algorithm.memory) == len(member.memory) > 0
    assert alone.algorithm.extra_state() == member.extra_state()
    assert alone.algorithm.rng.bit_generator.state == member.rng.bit_generator.state
    alone.run_rl(until_frame=400)
    assert alone.clock.frame == 400 and alone.clock.opt_step > saved[1][1]["clock"]["opt_step"]


def test_dqn_group_resumed_without_its_replays_refills_each_seed_first():
    spec = load_spec(SPECS, "dqn_cartpole", [*DQN, "agent.memory.checkpoint=false", "meta.log_frequency=32"])
    first = SessionGroup(spec, SEEDS)
    first.run_rl(until_frame=256)
    saved = first.checkpoint()
    first.close()
    assert all(not meta["memory"] and REPLAY_NOT_STORED in meta["exact_reason"] for _, meta in saved)
    resumed = SessionGroup(spec, SEEDS, fresh=False)
    resumed.restore([files for files, _ in saved])
    steps = resumed.clock.opt_step
    assert all(s.refilling and not s.exact and len(s.algorithm.memory) == 0 for s in resumed.sessions)
    resumed.run_rl(until_frame=256 + 62)  # 31 steps of 2 envs: 62 < training_start_step 64, still refilling
    assert all(s.refilling and len(s.algorithm.memory) == 62 for s in resumed.sessions)
    assert resumed.clock.opt_step == steps  # no gradient step while the replays refill
    assert [s.train_df.set_index("frame")["refill"][288] for s in resumed.sessions] == [True] * 3
    resumed.run_rl(until_frame=256 + 128)
    assert all(not s.refilling for s in resumed.sessions) and resumed.clock.opt_step > steps
    assert [s.train_df["refill"].iloc[-1] for s in resumed.sessions] == [False] * 3


CHILD = """
import sys, time, torch
torch.set_num_threads(1)
from orchestrator.session.group_runner import GroupRunner
from tests.agents.batched.test_group_algorithms import spec_of
spec = spec_of(sys.argv[2], sys.argv[3:])
for _ in GroupRunner(spec, sys.argv[1], 0, [0, 1, 2], [5, 6, 7], resume=False).events():
    time.sleep(0.1)  # slow: the parent kills it midway
"""

PPO = ["env.max_frame=768", "env.num_envs=4", "meta.log_frequency=128", "agent.algorithm.training_epoch=3",
       "agent.algorithm.time_horizon=16", "meta.rigorous_eval=1", "meta.eval_frequency=512"]
KILLED = {"ppo_cartpole": PPO, "dqn_cartpole": DQN, "reinforce_cartpole": REINFORCE, "sac_pendulum": SAC,
          "ppo_atari": ATARI, "dqn_atari": DQN_ATARI}


@pytest.mark.parametrize("name", list(KILLED))
def test_group_killed_by_sigkill_resumes_from_its_common_checkpoint_bit_for_bit(tmp_path, name):
    """A ``GroupRunner`` (checkpoints every 128 frames) SIGKILLed by PID after its sessions' common checkpoint at
    256 or later; a resumed ``GroupRunner`` restores that frame and ends equal to the uninterrupted group."""
    from orchestrator.session.group_runner import GroupRunner

    overrides = [*KILLED[name], "meta.checkpoint_frequency=128", "meta.tensorboard=false"]
    predir = str(tmp_path / f"{name}_2026_01_01_000000")
    stores = [CheckpointStore(f"{predir}/t0/s{s}") for s in range(3)]
    root = Path(__file__).resolve().parents[3]
    child = subprocess.Popen([sys.executable, "-c", CHILD, predir, name, *overrides], cwd=root,
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
    spec = spec_of(name, overrides)
    straight = SessionGroup(spec, SEEDS)
    straight.run_rl()
    resumed = GroupRunner(spec, predir, 0, [0, 1, 2], SEEDS, resume=True)
    frame = resumed.runners[0].restored_frame
    assert 256 <= frame < 768 and frame % 128 == 0
    assert all(s.clock.frame == frame and s.clock.resume_count == 1 for s in resumed.group.sessions)
    list(resumed.events())
    _assert_same_runs(straight, resumed.group)
    for store, sha in zip(stores, straight.weights_sha256()):  # the last committed manifests say the same
        manifest, _ = store.load(768)
        assert manifest.meta["weights_sha256"] == sha and manifest.meta["batched"] == 3
        assert manifest.meta["exact"] and (manifest.meta["memory"] or name not in ("dqn_cartpole", "sac_pendulum"))
        assert Path(store.session_dir, "train_df.parquet").exists()
