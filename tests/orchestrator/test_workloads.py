"""Workloads beyond classic control, at tiny budgets: ``dev`` runs of PPO and DQN with a ConvNet on
ALE/Pong-v5, PPO and DQN on LunarLander-v3, continuous PPO on Hopper-v5; exact resume of an Atari session
(PPO, and DQN with its uint8 replay checkpointed) and of a MuJoCo session from a mid-chunk frame; a Box2D
session's checkpoint records ``exact: false`` with the reason."""

import json

import pandas as pd
import pytest
import torch

from agents import memory
from agents.memory import factory
from orchestrator.session.loop import Session
from orchestrator.session.runner import SessionRunner
from orchestrator.spec.load import load_spec
from tests.orchestrator.lab_helpers import REPO, only_predir, overrides, run_cli
from tests.orchestrator.session.test_resume_exact import COMPARED, interrupted_then_resumed, uninterrupted

ATARI, BOX2D, MUJOCO = (str(REPO / f"specs/benchmark/{f}.json") for f in ("atari", "box2d", "mujoco"))
TINY_CONV = ["agent.net.conv_hid_layers=[[8,8,4],[16,4,2]]", "agent.net.fc_hid_layers=[32]"]
TINY_PPO = ["agent.algorithm.time_horizon=32", "agent.algorithm.minibatch_size=32", "agent.algorithm.training_epoch=1"]
PPO_ATARI = ["env.num_envs=2", "env.max_frame=256", "meta.log_frequency=64", *TINY_CONV, *TINY_PPO]
DQN_ATARI = ["env.num_envs=2", "env.max_frame=192", "meta.log_frequency=64", "agent.memory.max_size=400",
             "agent.algorithm.training_start_step=64", "agent.net.update_frequency=64", *TINY_CONV]


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


@pytest.mark.parametrize("spec_file, name, items", [
    (ATARI, "ppo_atari", PPO_ATARI),
    (ATARI, "dqn_atari", DQN_ATARI),
    (BOX2D, "ppo_lunar", ["env.num_envs=2", "env.max_frame=256", "meta.log_frequency=128", *TINY_PPO]),
    (BOX2D, "dqn_lunar", ["env.num_envs=2", "env.max_frame=256", "meta.log_frequency=128"]),
    (MUJOCO, "ppo_hopper", ["env.num_envs=2", "env.max_frame=256", "meta.log_frequency=128", *TINY_PPO]),
])
def test_dev_run(tmp_path, monkeypatch, spec_file, name, items):
    """``lab SPEC NAME dev`` writes a train_df with one row per log frame and gradient steps taken."""
    monkeypatch.chdir(tmp_path)
    assert run_cli(spec_file, name, "dev", *overrides(items)) == 0
    (df_path,) = only_predir(tmp_path / "data").rglob("train_df.parquet")
    df = pd.read_parquet(df_path)
    spec = load_spec(spec_file, name, items)
    log, max_frame = spec["meta"]["log_frequency"], spec["env"]["max_frame"]
    assert df["frame"].tolist() == list(range(log, max_frame + 1, log))
    assert df["opt_step"].iloc[-1] > 0 and df["loss"].notna().iloc[-1]


@pytest.mark.parametrize("spec_file, name, items, stop_frame", [
    (ATARI, "ppo_atari", PPO_ATARI, 102),
    (ATARI, "ppo_atari", [*PPO_ATARI, "agent.net.precision=bfloat16"], 102),  # conv nets under bfloat16 autocast
    (ATARI, "dqn_atari", [*DQN_ATARI, "agent.memory.checkpoint=true", "env.max_frame=128"], 98),  # FrameStackReplay
    (ATARI, "dqn_atari", [*DQN_ATARI, "agent.memory.checkpoint=true", "agent.memory.optimize_memory_usage=false",
                          "env.max_frame=128"], 70),
    (MUJOCO, "ppo_hopper", ["env.num_envs=2", "env.max_frame=256", "meta.log_frequency=64", *TINY_PPO], 90),
])
def test_resume_is_exact(tmp_path, spec_file, name, items, stop_frame):
    """Stopped at a frame that is no log or checkpoint boundary, restored from the store (env state with the
    ALE / MuJoCo simulator state), run to the end: the same train_df and weights as the straight run."""
    spec = load_spec(spec_file, name, [*items, "meta.random_seed=3"])
    straight = uninterrupted(spec, seed=3)
    resumed = interrupted_then_resumed(spec, 3, stop_frame, str(tmp_path / f"{name}_2026_01_01_000000"))
    assert resumed.exact
    pd.testing.assert_frame_equal(COMPARED(straight.train_df), COMPARED(resumed.train_df))
    assert straight.weights_sha256() == resumed.weights_sha256()


@pytest.mark.parametrize("before", ["FrameOnceReplay", "Replay"])
def test_older_replay_checkpoint_resumes_into_frame_stack_replay(tmp_path, monkeypatch, before):
    """A DQN Atari checkpoint whose replay was written by ``FrameOnceReplay`` (whole stacks: what
    ``optimize_memory_usage: true`` stored before ``FrameStackReplay``) or by ``Replay`` (obs and next_obs: the
    default before), its ring wrapped, resumes into a ``FrameStackReplay`` and ends with the same train_df and
    weights as the uninterrupted run."""
    spec = load_spec(ATARI, "dqn_atari", [*DQN_ATARI, "agent.memory.checkpoint=true", "env.max_frame=128",
                                          "agent.memory.max_size=64", "meta.random_seed=3"])
    straight = uninterrupted(spec, seed=3)
    assert type(straight.algorithm.memory) is memory.FrameStackReplay
    predir = str(tmp_path / "dqn_atari_2026_01_01_000000")
    with monkeypatch.context() as m:
        older = getattr(memory, before)
        m.setattr(factory, "FrameStackReplay", lambda *args, num_envs: older(*args))  # the replay before this class
        first = SessionRunner(spec, predir, 0, 0, 3, resume=False)
        for event in first.events():
            if event.kind == "started":
                first.session.run_rl(until_frame=98)
                first.session.stop_requested = True
        assert event.kind == "interrupted" and type(first.session.algorithm.memory) is older
        assert len(first.session.algorithm.memory) == 64  # the ring has wrapped
    second = SessionRunner(spec, predir, 0, 0, 3, resume=True)
    assert [e.kind for e in second.events()][-1] == "done" and second.restored_frame == 98
    assert type(second.session.algorithm.memory) is memory.FrameStackReplay
    pd.testing.assert_frame_equal(COMPARED(straight.train_df), COMPARED(second.session.train_df))
    assert straight.weights_sha256() == second.session.weights_sha256()


def test_box2d_checkpoint_is_not_exact_with_reason():
    spec = load_spec(BOX2D, "ppo_lunar", ["env.num_envs=1", "env.max_frame=64", "meta.log_frequency=32", *TINY_PPO])
    session = Session(spec, 1)
    session.run_rl(until_frame=40)
    files, meta = session.to_checkpoint()
    assert "env_state.json" not in files and meta["exact"] is False
    assert "LunarLander" in meta["exact_reason"] and "EzPickle" in meta["exact_reason"]
    json.dumps(meta)  # the manifest metadata stays JSON
    session.close()


def test_auto_vectorization_is_async_with_cpus_and_not_exact():
    """``vectorization: auto`` with ``meta.resources.num_cpus`` 2: an AsyncVectorEnv (one process per
    sub-env) that trains, and whose checkpoint records why it is not exact."""
    from gymnasium.vector import AsyncVectorEnv

    spec = load_spec(MUJOCO, "ppo_hopper", ["env.num_envs=2", "env.max_frame=64", "meta.log_frequency=64",
                                            'meta.resources={"num_cpus": 2, "num_gpus": 0}', *TINY_PPO])
    session = Session(spec, 1)
    try:
        assert isinstance(session.env.unwrapped, AsyncVectorEnv)
        session.run_rl()
        files, meta = session.to_checkpoint()
        assert session.clock.opt_step > 0 and meta["exact"] is False and "env_state.json" not in files
        assert meta["exact_reason"].startswith("env state not saved: AsyncVectorEnv")
    finally:
        session.close()


def test_atari_rigorous_eval_plays_whole_games_unclipped():
    """The eval env of an Atari session: same frame stack and sticky actions, no life-loss terminations,
    no reward clipping; here cut by ``max_t`` (agent steps) so an episode is short."""
    from gymnasium.wrappers.vector import TransformReward

    from envs.wrappers import LifeLossTermination

    spec = load_spec(ATARI, "ppo_atari", [*PPO_ATARI, "env.max_frame=64", "env.max_t=40", "meta.rigorous_eval=2",
                                          "meta.eval_frequency=64"])
    session = Session(spec, 2)
    try:
        session.run_rl()
        (row,) = session.eval_rows
        assert row["frame"] == 64 and row["total_reward"] <= 0  # Pong: an untrained agent scores no points
        env = session.eval_env()
        assert env.single_observation_space.shape == (4, 84, 84) and env.num_envs == 2
        wrappers, node = [], env
        while hasattr(node, "env"):
            wrappers.append(type(node))
            node = node.env
        assert LifeLossTermination not in wrappers and TransformReward not in wrappers
        assert LifeLossTermination in [type(w) for w in _chain(session.env)]
    finally:
        session.close()


def _chain(env):
    """The vector wrappers of ``env``, outermost first."""
    out = []
    while hasattr(env, "env"):
        out.append(env)
        env = env.env
    return out
