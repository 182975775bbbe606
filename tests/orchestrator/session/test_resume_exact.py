"""Exact resume without Ray: a session interrupted at an arbitrary frame, checkpointed through the
checkpoint store and resumed, gives the same train_df (all columns but wall_t, fps) and the same
weights as the uninterrupted run (docs/ARCHITECTURE.md section 5; issue: exactness)."""

import io
import math

import numpy as np
import pandas as pd
import pytest
import torch

from envs.state import STATE_FILES
from orchestrator.session.events import Interrupted
from orchestrator.session.loop import Session
from orchestrator.session.runner import SessionRunner
from orchestrator.spec.load import load_spec
from tests.agents.algorithms.helpers import stop_then_resume

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
        if event.kind == "started":
            first.session.run_rl(until_frame=stop_frame)  # reach an arbitrary mid-chunk frame
            first.session.stop_requested = True
    assert event.kind == "interrupted" and event.frame == stop_frame
    second = SessionRunner(spec, predir, 0, 0, seed, resume=True)
    kinds = [e.kind for e in second.events()]
    assert kinds[-1] == "done"
    assert second.restored_frame == stop_frame
    return second.session


@pytest.mark.parametrize("name, overrides, stop_frame", [
    ("reinforce_cartpole", ["env.max_frame=3000", "meta.log_frequency=500"], 1236),
    ("ppo_cartpole", ["env.max_frame=3200", "meta.log_frequency=400"], 1304),
    ("dqn_cartpole", ["env.max_frame=2000", "meta.log_frequency=250", "agent.algorithm.training_start_step=200",
                      "agent.memory.checkpoint=true"], 911),
    ("dqn_cartpole", ["env.max_frame=1200", "meta.log_frequency=200", "agent.algorithm.training_start_step=200",
                      "env.autoreset=next_step", "env.max_t=25", "agent.memory.checkpoint=true"], 630),  # reset pending
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
    opt_step_at_stop, df = stop_then_resume(spec, predir, 1500)
    assert opt_step_at_stop > 0
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


# ---------------------------------------------------------------- in-process restores (Session.to/from_checkpoint)
def restored(spec, seed, files, device=None):
    """A new session restored from checkpoint ``files``; ``device`` (e.g. ``meta``) stands in for the
    algorithm's device during the restore only, as a GPU would (nets stay on the CPU)."""
    session = Session(spec, seed, fresh=False)
    cpu, session.algorithm.device = session.algorithm.device, device or session.algorithm.device
    session.from_checkpoint(files)
    session.algorithm.device = cpu
    return session


@pytest.mark.parametrize("name, overrides, stop_frame", [
    ("ppo_cartpole", ["env.max_frame=768", "meta.log_frequency=256", "agent.algorithm.training_epoch=2"], 296),
    ("dqn_cartpole", ["env.max_frame=600", "meta.log_frequency=200", "agent.algorithm.training_start_step=100",
                      "agent.memory.checkpoint=true"], 333),
])
def test_checkpoint_loads_on_cpu_whatever_the_algorithm_device(name, overrides, stop_frame):
    """With the algorithm's device set to ``meta`` (which fails like CUDA would if RNG states, memory
    and obs went there), the restore still gives CPU-side state equal to the saved one and the run
    continues exactly."""
    spec = load_spec(SPECS, name, overrides)
    straight = uninterrupted(spec, seed=4)
    first = Session(spec, 4)
    first.run_rl(until_frame=stop_frame)
    files, meta = first.to_checkpoint()
    second = restored(spec, 4, files, device=torch.device("meta"))
    assert second.exact and meta["exact"]
    assert torch.equal(second.algorithm.gen.get_state(), first.algorithm.gen.get_state())
    assert second.obs.dtype == first.obs.dtype and (second.obs == first.obs).all()
    saved, loaded = first.algorithm.memory.state_dict(), second.algorithm.memory.state_dict()
    for k, v in saved["data"].items():
        assert (loaded["data"][k] == v).all(), k
    assert len(second.algorithm.memory) == len(first.algorithm.memory) > 0
    second.run_rl()
    pd.testing.assert_frame_equal(COMPARED(straight.train_df), COMPARED(second.train_df))
    assert straight.weights_sha256() == second.weights_sha256()


def test_torch_rng_state_of_another_device_kind_resumes_deterministically():
    """A checkpoint whose torch RNG state is a 16-byte CUDA (Philox) state restores on a CPU generator:
    reseeded from the state's hash, the same way every time, and marked not exact."""
    spec = load_spec(SPECS, "ppo_cartpole", ["env.max_frame=512", "meta.log_frequency=256",
                                             "agent.algorithm.training_epoch=1"])
    first = Session(spec, 4)
    first.run_rl(until_frame=256)
    files, _ = first.to_checkpoint()
    state = torch.load(io.BytesIO(files["state.pt"]), weights_only=True)
    state["algorithm"]["rng"]["torch"] = torch.arange(16, dtype=torch.uint8)  # seed and offset, 8 bytes each
    buf = io.BytesIO()
    torch.save(state, buf)
    files = {**files, "state.pt": buf.getvalue()}
    a, b = restored(spec, 4, files), restored(spec, 4, files)
    assert not a.exact and not b.exact
    assert torch.equal(a.algorithm.gen.get_state(), b.algorithm.gen.get_state())
    assert not torch.equal(a.algorithm.gen.get_state(), first.algorithm.gen.get_state())
    a.run_rl()
    b.run_rl()
    pd.testing.assert_frame_equal(COMPARED(a.train_df), COMPARED(b.train_df))
    assert a.clock.frame == 512


def test_ppo_rollout_cut_when_env_not_restored():
    """No env state: the env is reset, so the restored rollout's last step (5 of 32 stored) becomes
    truncated on every sub-env not already terminated; earlier steps and all other fields are kept."""
    spec = load_spec(SPECS, "ppo_cartpole", ["env.max_frame=768", "meta.log_frequency=256",
                                             "agent.algorithm.training_epoch=1"])
    first = Session(spec, 6)
    first.run_rl(until_frame=256 + 5 * 8)
    files, _ = first.to_checkpoint()
    files = {k: v for k, v in files.items() if k not in STATE_FILES}
    second = restored(spec, 6, files)
    saved, cut = first.algorithm.memory.rows, second.algorithm.memory.rows
    assert len(saved) == len(cut) == 5
    for t in range(5):  # rows: obs, act, reward, terminated, truncated
        for k, (x, y) in enumerate(zip(saved[t], cut[t])):
            expected = np.logical_or(x, ~saved[t][3]) if (t, k) == (4, 4) else x
            np.testing.assert_array_equal(y, expected, err_msg=f"step {t} field {k}")
        x, y = first.algorithm.memory.next_obs[t], second.algorithm.memory.next_obs[t]
        assert (x is None) == (y is None) and (x is None or np.array_equal(x, y)), f"step {t} next_obs"
    assert first.algorithm.memory.next_obs[4] is not None  # the cut step keeps its own next obs
    assert (cut[4][4] & ~saved[4][4]).any()  # some sub-env was mid-episode, now truncated
    assert not second.exact and second.clock.t == 0 and second.clock.resume_count == 1
    assert not np.array_equal(second.obs, first.obs)  # the env was reset
    second.run_rl(until_frame=256 * 2)
    assert len(second.algorithm.memory) == 0 and second.clock.opt_step > first.clock.opt_step


def test_reinforce_partial_episodes_dropped_when_env_not_restored():
    """No env state: REINFORCE keeps its completed episodes and drops the unfinished ones, so each
    sub-env's next stored episode starts at the reset observation."""
    spec = load_spec(SPECS, "reinforce_cartpole", ["env.max_frame=600", "meta.log_frequency=200"])
    first = Session(spec, 6)
    first.run_rl(until_frame=130)
    files, _ = first.to_checkpoint()
    files = {k: v for k, v in files.items() if k not in STATE_FILES}
    second = restored(spec, 6, files)
    saved, restored_mem = first.algorithm.memory, second.algorithm.memory
    assert sum(map(len, saved.current)) > 0  # there were unfinished episodes to drop
    assert [len(ep) for ep in restored_mem.current] == [0, 0, 0, 0]
    assert len(restored_mem.done_episodes) == len(saved.done_episodes)
    for ep_saved, ep_restored in zip(saved.done_episodes, restored_mem.done_episodes):
        np.testing.assert_array_equal([s[2] for s in ep_restored], [s[2] for s in ep_saved])
    reset_obs = second.obs.copy()
    second.run_rl(until_frame=130 + 4 * 3)  # 3 vector steps: shorter than any CartPole episode
    assert [len(ep) for ep in restored_mem.current] == [3, 3, 3, 3]
    np.testing.assert_array_equal(np.stack([ep[0][0] for ep in restored_mem.current]), reset_obs)


# ---------------------------------------------------------------- the checkpoint time gate (meta.checkpoint_interval_s)
GATED = ["env.max_frame=2000", "meta.log_frequency=200"]  # reinforce_cartpole: 4 sub-envs, a log row per 200 frames


def frame_timer(runner_box):
    """A fake ``timer`` for ``SessionRunner``: 0.25 s of "training time" per 200 frames trained (exact in binary), so
    the gate's decisions depend on frames only (a checkpoint itself takes no time)."""
    return lambda: runner_box[0].session.clock.frame / 800 if runner_box else 0.0


def gated_runner(spec, predir, resume=False):
    box = []
    runner = SessionRunner(spec, predir, 0, 0, 7, resume=resume, timer=frame_timer(box))
    box.append(runner)
    return runner


@pytest.mark.parametrize("overrides, frames", [
    (["meta.checkpoint_interval_s=0.6"], [600, 1200, 1800, 2000]),  # 0.75 s >= 0.6 s at every 3rd row; the last
    (["meta.checkpoint_interval_s=0.5"], [400, 800, 1200, 1600, 2000]),  # exactly the interval counts
    (["meta.checkpoint_interval_s=0"], list(range(200, 2001, 200))),  # every log row (free checkpoints)
    (["meta.checkpoint_interval_s=5"], [2000]),  # only max_frame
    (["meta.checkpoint_interval_s=0.6", "meta.checkpoint_frequency=400"], [400, 800, 1200, 1600, 2000]),  # frames
])
def test_time_gate_picks_log_rows(tmp_path, overrides, frames):
    """Without ``checkpoint_frequency`` a log row is checkpointed once ``checkpoint_interval_s`` of training time
    passed since the previous checkpoint; every log row still reaches the driver."""
    spec = load_spec(SPECS, "reinforce_cartpole", GATED + overrides)
    runner = gated_runner(spec, str(tmp_path / "reinforce_cartpole_2026_01_01_000000"))
    events = list(runner.events())
    assert [e.frame for e in events if e.kind == "checkpoint"] == frames
    assert runner.store.frames() == frames[-3:]  # keep_checkpoints=3
    rows = [e.row["frame"] for e in events if e.kind == "log"]
    assert rows == list(range(200, 2001, 200)) and events[-1].kind == "done"


def test_time_gate_waits_199x_the_previous_checkpoints_cost(tmp_path):
    """The fake timer advances by ``cost`` during each ``snapshot`` (the training thread's time on a checkpoint);
    rows come every 0.25 s, interval 0.3 s. Free checkpoints: every 2nd row. 3 ms each: the next waits
    max(0.3, 199 * 0.003 = 0.597) s, every 3rd row. 5 ms: 0.995 s, every 4th. The first only waits the interval."""
    spec = load_spec(SPECS, "reinforce_cartpole", GATED + ["meta.checkpoint_interval_s=0.3"])
    for cost, frames in ((0.0, [400, 800, 1200, 1600, 2000]), (0.003, [400, 1000, 1600, 2000]),
                         (0.005, [400, 1200, 2000])):
        box, spent = [], [0.0]
        predir = str(tmp_path / f"c{cost}" / "reinforce_cartpole_2026_01_01_000000")
        runner = SessionRunner(spec, predir, 0, 0, 7, resume=False,
                               timer=lambda: (box[0].session.clock.frame / 800 if box else 0.0) + spent[0])
        box.append(runner)
        snapshot = runner.snapshot

        def costly_snapshot():
            spent[0] += cost
            return snapshot()

        runner.snapshot = costly_snapshot
        assert [e.frame for e in runner.events() if e.kind == "checkpoint"] == frames, cost


def test_time_gate_stop_checkpoints_and_default_interval(tmp_path):
    """A stop between gated checkpoints (SIGTERM at frame 1100, mid-chunk) still commits a final one; with no key
    the default interval (1 s) is used: 0.25 s per log row, so the first gated checkpoint is at frame 800."""
    spec = load_spec(SPECS, "reinforce_cartpole", GATED)
    assert spec["meta"]["checkpoint_interval_s"] == 1.0
    runner = gated_runner(spec, str(tmp_path / "reinforce_cartpole_2026_01_01_000000"))
    train = runner.session.run_rl

    def run_until_sigterm(until_frame=None, on_log=None):
        train(until_frame=min(until_frame, 1100), on_log=on_log)
        runner.session.stop_requested = runner.session.clock.frame == 1100

    runner.session.run_rl = run_until_sigterm
    events = list(runner.events())
    assert [e.frame for e in events if e.kind == "checkpoint"] == [800, 1100]
    assert runner.store.frames() == [800, 1100]
    assert events[-1] == Interrupted(frame=1100, total_reward_ma=events[-1].total_reward_ma, checkpoint=True)


def test_resume_from_time_gated_checkpoint_is_exact(tmp_path):
    """A run killed after its time-gated checkpoint at frame 1200 (no final checkpoint) resumes from it and ends
    equal to the uninterrupted run."""
    spec = load_spec(SPECS, "reinforce_cartpole", GATED + ["meta.checkpoint_interval_s=0.6"])
    predir = str(tmp_path / "reinforce_cartpole_2026_01_01_000000")
    straight = uninterrupted(spec, seed=7)
    first = gated_runner(spec, predir)
    events = first.events()
    for event in events:
        if event.kind == "checkpoint" and event.frame == 1200:
            break
    events.close()  # as a SIGKILL: the snapshot of 1800 taken since is never written
    assert first.store.frames() == [600, 1200]
    second = gated_runner(spec, predir, resume=True)
    assert [e.frame for e in second.events() if e.kind == "checkpoint"] == [1800, 2000]
    assert second.restored_frame == 1200
    pd.testing.assert_frame_equal(COMPARED(straight.train_df), COMPARED(second.session.train_df))
    assert straight.weights_sha256() == second.session.weights_sha256()


# ---------------------------------------------------------------- the checkpoint's encoding
def test_parquet_rows_encode_incrementally_as_one_shot():
    """``ParquetRows`` converts only new rows, and its bytes equal a one-shot pyarrow encoding at every step, also
    when a new row widens a column's type (int -> float, null -> float: the whole table is converted again)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from orchestrator.session.loop import ParquetRows, _read_parquet

    columns = ["frame", "loss", "refill", "x"]
    values = [None, None, 1, 2, 2.5, math.nan, 3.0]  # x: null, then int, then float
    enc, rows = ParquetRows(columns), []
    assert _read_parquet(enc.encode(rows)) == [] and pq.read_table(pa.BufferReader(enc.encode(rows))).column_names \
        == columns
    for i, x in enumerate(values):
        rows.append({"frame": 100 * i, "loss": math.nan if i < 2 else 0.5 * i, "refill": i == 0, "x": x})
        out = pa.BufferOutputStream()
        pq.write_table(pa.Table.from_pylist(rows).select(columns), out)
        assert enc.encode(rows) == out.getvalue().to_pybytes(), i
    back = _read_parquet(enc.encode(rows))
    assert [r["frame"] for r in back] == [0, 100, 200, 300, 400, 500, 600]
    assert back[-1] == {"frame": 600, "loss": 3.0, "refill": False, "x": 3.0} and math.isnan(back[1]["loss"])
    assert back[0]["x"] is None and math.isnan(back[5]["x"])
    assert enc.encode(list(rows)) == enc.encode(rows)  # another list of the same rows: encoded afresh, same bytes


def test_checkpoint_with_the_older_rng_encoding_restores():
    """``state.pt`` from before the tensor encoding (python/numpy RNG states as lists of ints) still restores the
    global RNGs exactly."""
    import random

    spec = load_spec(SPECS, "reinforce_cartpole", ["env.max_frame=400", "meta.log_frequency=200"])
    first = Session(spec, 3)
    first.run_rl(until_frame=200)
    files, _ = first.to_checkpoint()
    expected = (random.random(), np.random.random(), torch.rand(1).item())
    state = torch.load(io.BytesIO(files["state.pt"]), weights_only=True)
    version, internal, gauss = state["global_rng"]["python"]
    assert isinstance(internal, torch.Tensor) and internal.dtype == torch.int64 and internal.numel() == 625
    state["global_rng"]["python"] = (version, tuple(internal.tolist()), gauss)
    state["global_rng"]["numpy"][1] = state["global_rng"]["numpy"][1].tolist()
    buf = io.BytesIO()
    torch.save(state, buf)
    for data in (files["state.pt"], buf.getvalue()):
        second = restored(spec, 3, {**files, "state.pt": data})
        assert (random.random(), np.random.random(), torch.rand(1).item()) == expected
        second.close()
