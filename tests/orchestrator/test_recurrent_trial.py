"""A RecurrentNet trial (specs/recurrent.json) survives a SIGKILL of its driver: ``train@latest`` continues both
sessions from their checkpoints (observation windows in the env pickle) to the train_df an uninterrupted session
gives. The driver runs as a subprocess with a Ray of its own, whose leftover processes the test kills by PID."""

import os

import pandas as pd
import torch
from lab_helpers import REPO, assert_continuous, kill_driver_when, only_predir, overrides, run_cli, start_driver

from orchestrator.session.loop import Session
from orchestrator.spec.load import load_spec
from orchestrator.store import storage
from orchestrator.store.predir import session_seed

RNN_SPECS = str(REPO / "specs" / "recurrent.json")
ITEMS = ["meta.max_session=2", "meta.log_frequency=256", "meta.checkpoint_frequency=256", "meta.random_seed=5",
         "env.max_frame=2048"]


def test_recurrent_train_sigkill_driver_then_resume_latest(ray_local, tmp_path):
    driver = start_driver([RNN_SPECS, "ppo_rnn_cartpole", "train", *overrides(ITEMS)], tmp_path)
    kill_driver_when(driver, lambda: {m.parents[2].name for m in tmp_path.glob("data/*/t0/s*/ckpt/0*/MANIFEST.json")}
                     == {"s0", "s1"}, 180, "a committed checkpoint in both sessions")
    predir = only_predir(tmp_path / "data")
    killed_at = {s: max(int(p.name) for p in (predir / f"t0/s{s}/ckpt").glob("0*")) for s in (0, 1)}
    assert min(killed_at.values()) < 2048, "the driver was killed after the run finished"

    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert run_cli(RNN_SPECS, "ppo_rnn_cartpole", "train@latest", *overrides(ITEMS)) == 0
    finally:
        os.chdir(cwd)
    run = storage.read_json(str(predir / "run.json"))
    (resume,) = run["resumes"]  # a session that finished before the kill is not resumed
    assert resume["from_frames"] == {f"t0_s{s}": killed_at[s] for s in (0, 1) if killed_at[s] < 2048}
    torch.set_num_threads(1)
    spec = load_spec(RNN_SPECS, "ppo_rnn_cartpole", ITEMS)
    for s in (0, 1):
        assert run["sessions"][f"t0_s{s}"]["status"] == "done"
        resumed = pd.read_parquet(predir / f"t0/s{s}/train_df.parquet")
        assert_continuous(resumed, 256, 2048)
        straight = Session(spec, session_seed(5, 0, s))
        straight.run_rl()
        pd.testing.assert_frame_equal(resumed.drop(columns=["wall_t", "fps"]),
                                      straight.train_df.drop(columns=["wall_t", "fps"]))
        manifest = storage.read_json(str(max((predir / f"t0/s{s}/ckpt").glob("0*")) / "MANIFEST.json"))["meta"]
        assert manifest["weights_sha256"] == straight.weights_sha256() and manifest["exact"] is True
