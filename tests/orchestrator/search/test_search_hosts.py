"""Warm session actors (``orchestrator.trial.SessionHosts``), as a search's reused Tune trial actor keeps them:
the next trial's sessions run in the actors of the previous trial's finished sessions, and train exactly as in
fresh actors (train_df but wall_t/fps, and weights, equal)."""

import pandas as pd
from lab_helpers import SPECS

from orchestrator.session_hosts import SessionHosts
from orchestrator.spec.load import load_spec
from orchestrator.store import predir as predir_mod
from orchestrator.store import storage
from orchestrator.store.checkpoint import CheckpointStore
from orchestrator.store.predir import session_seed
from orchestrator.store.record import RunRecord, SessionPlan
from orchestrator.trial import Trial

ITEMS = ["meta.max_session=1", "env.max_frame=800", "meta.log_frequency=400", "meta.random_seed=21",
         'meta.resources={"num_cpus": 0.5, "num_gpus": 0}']


def run_trial(spec: dict, predir: str, t: int, hosts: SessionHosts | None) -> dict:
    """Run trial ``t`` of ``spec`` (its fresh sessions) in ``predir``; returns its run.json sessions."""
    plans = [SessionPlan(t, s, session_seed(spec["meta"]["random_seed"], t, s), resume=False)
             for s in range(int(spec["meta"]["max_session"]))]
    tdir = storage.join(predir, f"t{t}")
    record = RunRecord.load_or_new(tdir, spec["name"])
    assert Trial(spec, predir, plans, record, quiet=True, analyze=False, hosts=hosts).run() == 0
    return storage.read_json(storage.join(tdir, "run.json"))["sessions"]


def outcome(predir: str, t: int, s: int) -> tuple[pd.DataFrame, dict]:
    """(train_df without wall_t/fps, weights_sha256 of the newest checkpoint) of one session."""
    sdir = predir_mod.session_dir(predir, t, s)
    store = CheckpointStore(sdir)
    df = storage.read_parquet(storage.join(sdir, "train_df.parquet")).drop(columns=["wall_t", "fps"])
    return df, store.manifest(store.frames()[-1]).meta["weights_sha256"]


def test_warm_actors_host_the_next_trial_exactly_as_fresh_ones(ray_local, tmp_path):
    first = load_spec(SPECS, "ppo_cartpole", ITEMS + ["agent.net.optim_spec.lr=0.01"])
    second = load_spec(SPECS, "ppo_cartpole", ITEMS + ["agent.net.optim_spec.lr=0.001"])
    warm_dir = predir_mod.new_predir(str(tmp_path / "warm"), "ppo_cartpole")
    fresh_dir = predir_mod.new_predir(str(tmp_path / "fresh"), "ppo_cartpole")
    hosts = SessionHosts()
    try:
        t0 = run_trial(first, warm_dir, 0, hosts)
        assert len(hosts.idle) == 1  # the session ended done: its actor waits for the next trial
        t1 = run_trial(second, warm_dir, 1, hosts)
        assert {e["pid"] for e in t1.values()} == {e["pid"] for e in t0.values()}  # the same processes
        assert all(e["status"] == "done" and e["frame"] == 800 for e in t1.values())
        fresh = run_trial(second, fresh_dir, 1, None)
        assert not {e["pid"] for e in fresh.values()} & {e["pid"] for e in t0.values()}
    finally:
        hosts.clear()
    warm_df, warm_sha = outcome(warm_dir, 1, 0)
    fresh_df, fresh_sha = outcome(fresh_dir, 1, 0)
    assert warm_df["frame"].tolist() == [400, 800]
    pd.testing.assert_frame_equal(warm_df, fresh_df)
    assert warm_sha == fresh_sha
    assert outcome(warm_dir, 0, 0)[1] != outcome(warm_dir, 1, 0)[1]  # the first trial's lr was another
