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
