"""A checkpoint says ``exact: false`` and why whenever a resume from it cannot equal the uninterrupted run, one
test per cause: the replay not stored (every replay-based algorithm), a restore without env state or with an env
state that does not fit the env, a torch RNG
state of another device kind; and a resume from such checkpoints says so in one line. The env causes (Box2D, async
vector envs, EnvPool) are tested in test_workloads.py and test_envpool_session.py, ``meta.distributed`` in
test_distributed.py."""

from __future__ import annotations

import io

import pandas as pd
import pytest
import torch

from envs.state import STATE_FILES
from orchestrator.modes.train import plan_resume
from orchestrator.session.loop import (
    ENV_NOT_RESTORED,
    ENV_STATE_MISFIT,
    REPLAY_NOT_RESTORED,
    REPLAY_NOT_STORED,
    RNG_REDERIVED,
    Session,
)
from orchestrator.spec.load import load_spec
from orchestrator.store import storage
from tests.orchestrator.session.test_resume_exact import COMPARED, interrupted_then_resumed, uninterrupted

CARTPOLE = "specs/benchmark/cartpole.json"
PENDULUM = "specs/benchmark/pendulum.json"
SIL = "specs/sil.json"
DQN = ["env.max_frame=600", "meta.log_frequency=200", "agent.algorithm.training_start_step=100"]


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


@pytest.mark.parametrize("spec_file, name, overrides", [
    (CARTPOLE, "dqn_cartpole", DQN),
    (CARTPOLE, "ddqn_per_cartpole", DQN),
    (PENDULUM, "sac_pendulum", ["env.max_frame=400", "agent.algorithm.training_start_step=100"]),
    (PENDULUM, "crossq_pendulum", ["env.max_frame=400", "agent.algorithm.training_start_step=100"]),
    (SIL, "sil_cartpole", ["env.max_frame=400"]),  # SIL's replay beside its always-stored on-policy memory
])
def test_a_replay_left_out_of_the_checkpoint_makes_it_inexact(spec_file, name, overrides):
    for stored in (False, True):
        session = Session(load_spec(spec_file, name, [*overrides, f"agent.memory.checkpoint={str(stored).lower()}"]),
                          3)
        session.run_rl(until_frame=150)
        assert len(session.algorithm.memory) > 0
        files, meta = session.to_checkpoint()
        expected = (True, None) if stored else (False, REPLAY_NOT_STORED)
        assert (meta["exact"], meta["exact_reason"], meta["memory"]) == (*expected, stored), name
        session.close()


def test_on_policy_checkpoints_stay_exact():
    session = Session(load_spec(CARTPOLE, "ppo_cartpole", ["env.max_frame=400", "meta.log_frequency=200"]), 3)
    session.run_rl(until_frame=150)
    _, meta = session.to_checkpoint()
    assert (meta["exact"], meta["exact_reason"], meta["memory"]) == (True, None, True)


def test_a_dqn_resume_without_its_replay_differs_and_every_checkpoint_says_why(tmp_path):
    """dqn_cartpole stopped mid-run and resumed without ``memory.checkpoint``: the resumed train_df differs from the
    uninterrupted one (rows marked ``refill``, later updates), so every manifest before and after says
    ``exact: false`` with the cause, once."""
    spec = load_spec(CARTPOLE, "dqn_cartpole", DQN)
    straight = uninterrupted(spec, seed=7)
    predir = tmp_path / "dqn_cartpole_2026_01_01_000000"
    resumed = interrupted_then_resumed(spec, 7, 333, str(predir))
    assert not COMPARED(straight.train_df).equals(COMPARED(resumed.train_df))
    assert resumed.train_df["refill"].any() and not straight.train_df["refill"].any()
    assert resumed.exact is False and resumed.exact_reason == REPLAY_NOT_RESTORED
    manifests = sorted((predir / "t0" / "s0" / "ckpt").glob("0*/MANIFEST.json"))
    assert manifests
    for path in manifests:
        meta = storage.read_json(str(path))["meta"]
        assert (meta["exact"], meta["exact_reason"], meta["memory"]) == (False, REPLAY_NOT_STORED, False), path


def test_a_restore_without_env_state_makes_later_checkpoints_inexact():
    spec = load_spec(CARTPOLE, "ppo_cartpole", ["env.max_frame=600", "meta.log_frequency=200"])
    first = Session(spec, 3)
    first.run_rl(until_frame=200)
    files, meta = first.to_checkpoint()
    assert meta["exact"] is True and set(STATE_FILES) <= set(files)
    second = Session(spec, 3, fresh=False)
    second.from_checkpoint({k: v for k, v in files.items() if k not in STATE_FILES})
    second.run_rl(until_frame=400)
    _, meta = second.to_checkpoint()
    assert (meta["exact"], meta["exact_reason"]) == (False, ENV_NOT_RESTORED)
    straight = uninterrupted(spec, 3)  # the reset env took another trajectory: the row at frame 400 differs
    head = straight.train_df[straight.train_df.frame <= 400]
    assert list(head.frame) == list(second.train_df.frame) == [200, 400]
    assert not COMPARED(head).equals(COMPARED(second.train_df))


def test_a_restore_with_an_env_state_that_does_not_fit_the_env_makes_later_checkpoints_inexact():
    """Another env's state (Acrobot's) in a CartPole checkpoint: the env is reset, the reason names both envs' layers,
    and every later checkpoint says so."""
    items = ["env.max_frame=600", "meta.log_frequency=200"]
    spec = load_spec(CARTPOLE, "ppo_cartpole", items)
    first = Session(spec, 3)
    first.run_rl(until_frame=200)
    files, meta = first.to_checkpoint()
    assert meta["exact"] is True
    acrobot = Session(load_spec(CARTPOLE, "ppo_cartpole", [*items, "env.name=Acrobot-v1"]), 3)
    acrobot.run_rl(until_frame=200)
    other, _ = acrobot.to_checkpoint()
    second = Session(spec, 3, fresh=False)
    second.from_checkpoint({**files, **{name: other[name] for name in STATE_FILES}})
    assert second.exact is False and second.exact_reason.startswith(f"{ENV_STATE_MISFIT}: sub-env 0: ")
    assert "cartpole.CartPoleEnv" in second.exact_reason and "acrobot.AcrobotEnv" in second.exact_reason
    second.run_rl(until_frame=400)
    _, meta = second.to_checkpoint()
    assert (meta["exact"], meta["exact_reason"]) == (False, second.exact_reason)
    assert list(second.train_df.frame) == [200, 400]


def test_a_torch_rng_state_of_another_device_kind_is_recorded():
    """A CUDA Philox state (16 bytes) restored on the CPU is re-derived, not set: the next checkpoint says so."""
    spec = load_spec(CARTPOLE, "ppo_cartpole", ["env.max_frame=600", "meta.log_frequency=200"])
    first = Session(spec, 3)
    first.run_rl(until_frame=200)
    files, _ = first.to_checkpoint()
    state = torch.load(io.BytesIO(files["state.pt"]), weights_only=True)
    state["algorithm"]["rng"]["torch"] = torch.arange(16, dtype=torch.uint8)
    buf = io.BytesIO()
    torch.save(state, buf)
    second = Session(spec, 3, fresh=False)
    second.from_checkpoint({**files, "state.pt": buf.getvalue()})
    _, meta = second.to_checkpoint()
    assert (meta["exact"], meta["exact_reason"]) == (False, RNG_REDERIVED)


def test_causes_accumulate_once_each():
    session = Session(load_spec(CARTPOLE, "dqn_cartpole", DQN), 3)
    session.run_rl(until_frame=50)
    for reason in (ENV_NOT_RESTORED, RNG_REDERIVED, ENV_NOT_RESTORED):
        session.not_exact(reason)
    _, meta = session.to_checkpoint()
    assert meta["exact_reason"] == "; ".join([ENV_NOT_RESTORED, RNG_REDERIVED, REPLAY_NOT_STORED])


def commit(predir, spec, session_index, frames):
    """Run session ``session_index`` of ``spec`` in-process to ``frames`` and commit its checkpoint there."""
    from orchestrator.session.runner import SessionRunner

    runner = SessionRunner(spec, str(predir), 0, session_index, 3 + session_index, resume=False)
    for event in runner.events():
        if event.kind == "started":
            runner.session.run_rl(until_frame=frames)
            runner.session.stop_requested = True


@pytest.mark.parametrize("name, overrides, note", [
    ("dqn_cartpole", DQN, f"t0_s0, t0_s1: {REPLAY_NOT_STORED}"),
    ("dqn_cartpole", [*DQN, "agent.memory.checkpoint=true"], None),
    ("ppo_cartpole", ["env.max_frame=600", "meta.log_frequency=200"], None),
])
def test_a_resume_says_once_which_sessions_cannot_be_exact_and_why(tmp_path, capsys, name, overrides, note):
    spec = load_spec(CARTPOLE, name, [*overrides, "meta.max_session=2"])
    predir = tmp_path / f"{name}_2026_01_01_000000"
    for s in (0, 1):
        commit(predir, spec, s, 250)
    capsys.readouterr()
    plans, done = plan_resume(str(predir), spec, 2, allow_fresh=False)
    assert [p.resume and p.frame >= 250 for p in plans] == [True, True] and done == []
    lines = [line for line in capsys.readouterr().err.splitlines() if "exact" in line]
    assert lines == ([] if note is None else
                     [f"note: this resume cannot equal the uninterrupted run (exact: false): {note}"])


def test_the_manifest_memory_flag_and_train_df_of_a_stored_replay_resume_equal_the_straight_run(tmp_path):
    """The control of the DQN case above: with ``memory.checkpoint`` the same stop and resume is exact."""
    spec = load_spec(CARTPOLE, "dqn_cartpole", [*DQN, "agent.memory.checkpoint=true"])
    straight = uninterrupted(spec, seed=7)
    resumed = interrupted_then_resumed(spec, 7, 333, str(tmp_path / "dqn_cartpole_2026_01_01_000000"))
    pd.testing.assert_frame_equal(COMPARED(straight.train_df), COMPARED(resumed.train_df))
    assert resumed.exact is True and resumed.exact_reason is None


def test_a_search_resume_says_once_which_sessions_cannot_be_exact(tmp_path, capsys):
    """``search@``'s driver-side verification (``verify_trials``) prints the same one line for a search's trials."""
    import json

    from orchestrator.modes import search

    spec = load_spec(CARTPOLE, "dqn_cartpole", [*DQN, "meta.max_session=1"])
    predir = tmp_path / "dqn_cartpole_2026_01_01_000000"
    commit(predir, spec, 0, 250)
    (predir / "t0" / "trial.json").write_text(json.dumps({"trial": 0, "values": {}, "status": "running"}))
    capsys.readouterr()
    search.verify_trials(str(predir), spec)
    lines = [line for line in capsys.readouterr().err.splitlines() if "exact" in line]
    assert lines == [f"note: this resume cannot equal the uninterrupted run (exact: false): t0_s0: {REPLAY_NOT_STORED}"]
