"""Exact resume without Ray: a session interrupted at an arbitrary frame, checkpointed through the
checkpoint store and resumed, gives the same train_df (all columns but wall_t, fps) and the same
weights as the uninterrupted run (DESIGN.md section 5; issue: exactness)."""

import pandas as pd
import pytest
import torch

from orchestrator.session import Session
from orchestrator.session_actor import SessionRunner
from orchestrator.spec import load_spec

SPECS = "specs/benchmark/cartpole.json"
COMPARED = lambda df: df.drop(columns=["wall_t", "fps"]).reset_index(drop=True)  # noqa: E731


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def uninterrupted(spec, seed):
    session = Session(spec, seed)
    session.run_rl()
    return session


def interrupted_then_resumed(spec, seed, stop_frame, predir):
    """Run a SessionRunner until ``stop_frame`` (not a checkpoint boundary), stop it like SIGTERM
    would, then resume a fresh runner from the store and run to the end."""
    first = SessionRunner(spec, predir, 0, 0, seed, resume=False)
    events = first.events()
    for event in events:
        if event["kind"] == "started":
            first.session.run_rl(until_frame=stop_frame)  # reach an arbitrary mid-chunk frame
            first.session.stop_requested = True
    assert event["kind"] == "interrupted" and event["frame"] == stop_frame
    second = SessionRunner(spec, predir, 0, 0, seed, resume=True)
    kinds = [e["kind"] for e in second.events()]
    assert kinds[-1] == "done"
    assert second.restored_frame == stop_frame
    return second.session


@pytest.mark.parametrize("name, overrides, stop_frame", [
    ("reinforce_cartpole", ["env.max_frame=3000", "meta.log_frequency=500"], 1236),
    ("ppo_cartpole", ["env.max_frame=3200", "meta.log_frequency=400"], 1304),
    ("dqn_cartpole", ["env.max_frame=2000", "meta.log_frequency=250", "agent.algorithm.training_start_step=200",
                      "agent.memory.checkpoint=true"], 911),
])
def test_resume_is_exact(tmp_path, name, overrides, stop_frame):
    spec = load_spec(SPECS, name, overrides)
    straight = uninterrupted(spec, seed=7)
    resumed = interrupted_then_resumed(spec, 7, stop_frame, str(tmp_path / f"{name}_2026_01_01_000000"))
    pd.testing.assert_frame_equal(COMPARED(straight.train_df), COMPARED(resumed.train_df))
    assert straight.weights_sha256() == resumed.weights_sha256()
    for key in ("frame", "epi", "t", "opt_step"):
        assert getattr(straight.clock, key) == getattr(resumed.clock, key), key
    assert resumed.clock.resume_count == 1


def test_wall_t_continues_across_resume(tmp_path):
    spec = load_spec(SPECS, "ppo_cartpole", ["env.max_frame=1600", "meta.log_frequency=400"])
    resumed = interrupted_then_resumed(spec, 3, 808, str(tmp_path / "ppo_cartpole_2026_01_01_000000"))
    wall_t = resumed.train_df["wall_t"]
    assert wall_t.is_monotonic_increasing and wall_t.iloc[0] > 0


def test_dqn_refills_replay_before_training(tmp_path):
    """Without memory.checkpoint the resumed DQN collects training_start_step transitions, with no
    gradient step, before training again; those log rows are marked refill=True."""
    start = 600
    spec = load_spec(SPECS, "dqn_cartpole", ["env.max_frame=3000", "meta.log_frequency=100",
                                             f"agent.algorithm.training_start_step={start}"])
    predir = str(tmp_path / "dqn_cartpole_2026_01_01_000000")
    first = SessionRunner(spec, predir, 0, 0, 5, resume=False)
    for event in first.events():
        if event["kind"] == "started":
            first.session.run_rl(until_frame=1500)
            first.session.stop_requested = True
    opt_step_at_stop = first.session.clock.opt_step
    assert opt_step_at_stop > 0
    second = SessionRunner(spec, predir, 0, 0, 5, resume=True)
    list(second.events())
    df = second.session.train_df
    after = df[df.frame > 1500]
    refill = after[after.refill]
    # every refill row is before the buffer could hold training_start_step transitions again
    assert len(refill) > 0 and refill.frame.max() <= 1500 + start
    assert (refill.opt_step == opt_step_at_stop).all(), "a gradient step happened during refill"
    trained = after[~after.refill]
    assert trained.opt_step.iloc[-1] > opt_step_at_stop
    # no catch-up burst: the first training rows grow opt_step at the normal rate only
    per_row = spec["agent"]["algorithm"]["training_iter"] * spec["meta"]["log_frequency"] // \
        spec["agent"]["algorithm"]["training_frequency"]
    assert (trained.opt_step.diff().dropna() <= per_row).all()
