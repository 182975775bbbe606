"""``SessionRunner`` with checkpoints off (what ``dev`` runs): the same rows as with checkpoints, none taken, and
train_df, log.txt and the trackers written as the rows come, an interrupt included."""

import pandas as pd
import pytest
from lab_helpers import SPECS

from orchestrator.session import events as ev
from orchestrator.session.runner import SessionRunner
from orchestrator.spec.load import load_spec
from orchestrator.store import storage

OVERRIDES = ["env.max_frame=1024", "meta.log_frequency=256", "meta.checkpoint_frequency=512",
             "meta.random_seed=3", "meta.tensorboard=true"]


def rows_of(train_df: pd.DataFrame) -> pd.DataFrame:
    return train_df.drop(columns=["wall_t", "fps"]).reset_index(drop=True)


def test_unsaved_runner_logs_every_row_and_equals_the_checkpointed_run(tmp_path):
    spec = load_spec(SPECS, "ppo_cartpole", OVERRIDES)
    saved = SessionRunner(spec, str(tmp_path / "a_2026_01_01_000000"), 0, 0, 3, resume=False)
    list(saved.events())
    unsaved = SessionRunner(spec, str(tmp_path / "b_2026_01_01_000000"), 0, 0, 3, resume=False, checkpoints=False)
    events = list(unsaved.events())
    assert [(e.kind, e.row["frame"] if isinstance(e, ev.Log) else getattr(e, "frame", None)) for e in events] == [
        ("started", None), ("log", 256), ("log", 512), ("log", 768), ("log", 1024), ("done", 1024)]
    assert events[-1].checkpoint is False
    sdir = tmp_path / "b_2026_01_01_000000" / "t0" / "s0"
    assert not (sdir / "ckpt").exists()
    want = rows_of(pd.read_parquet(tmp_path / "a_2026_01_01_000000" / "t0" / "s0" / "train_df.parquet"))
    pd.testing.assert_frame_equal(rows_of(pd.read_parquet(sdir / "train_df.parquet")), want)
    log = (sdir / "log.txt").read_text().splitlines()
    assert [line.split()[0] for line in log] == ["frame=256", "frame=512", "frame=768", "frame=1024"]
    assert list((sdir / "tb").iterdir())  # TensorBoard events written


def test_an_interrupt_mid_run_still_writes_the_rows_so_far(tmp_path, monkeypatch):
    """A KeyboardInterrupt (dev's stop) raised halfway through the third chunk: the rows logged before it reach
    train_df and log.txt, the envs are closed, and the interrupt propagates."""
    spec = load_spec(SPECS, "ppo_cartpole", OVERRIDES)
    runner = SessionRunner(spec, str(tmp_path / "c_2026_01_01_000000"), 0, 0, 3, resume=False, checkpoints=False)
    session, closed = runner.session, []
    real_run, real_close = session.run_rl, session.close

    def run_rl(until_frame, on_log):
        if until_frame > 512:
            real_run(until_frame=until_frame - 128, on_log=on_log)  # half the chunk, then the interrupt
            raise KeyboardInterrupt
        real_run(until_frame=until_frame, on_log=on_log)

    monkeypatch.setattr(session, "run_rl", run_rl)
    monkeypatch.setattr(session, "close", lambda: closed.append(True) or real_close())
    seen = []
    with pytest.raises(KeyboardInterrupt):
        for event in runner.events():
            seen.append(event.kind)
    assert seen == ["started", "log", "log"]
    sdir = storage.join(str(tmp_path / "c_2026_01_01_000000"), "t0", "s0")
    assert list(pd.read_parquet(f"{sdir}/train_df.parquet")["frame"]) == [256, 512]
    assert [line.split()[0] for line in open(f"{sdir}/log.txt").read().splitlines()] == [
        "frame=256", "frame=512"]
    assert session.clock.frame == 640
    assert closed == [True]
