"""Population-based training: seeded decisions, the explored lr in the optimizer after an exploit, SIGKILL of the
driver then ``search@latest`` giving the same ``pbt.jsonl`` and train_dfs as an uninterrupted run, the replay of a
trial bit for bit, and keys PBT cannot perturb refused by name.

The uninterrupted search runs in-process on the session-scoped ``ray_local``; the killed one is a subprocess driver
with a Ray of its own, whose leftover processes the test kills by PID.
"""

import json

import numpy as np
import pandas as pd
import pytest
from lab_helpers import SPECS, kill_driver_when, only_predir, overrides, run_cli, start_driver

from orchestrator.errors import SpecError
from orchestrator.spec.load import load_spec
from orchestrator.spec.search_space import SearchVar, apply_values, parse_search

LR = "agent.net.optim_spec.lr"
PBT = ["meta.max_trial=4", "meta.max_session=1", "env.max_frame=2000", "meta.log_frequency=200",
       "meta.checkpoint_frequency=200", "meta.random_seed=11", 'meta.resources={"num_cpus": 0.5, "num_gpus": 0}',
       'search={"agent.net.optim_spec.lr__loguniform": [1e-4, 1e-2]}',
       'meta.search_scheduler={"name": "PBT", "perturbation_interval": 400}']


# ---------------------------------------------------------------- what PBT may change
@pytest.mark.parametrize("search, named", [
    ('{"agent.net.hid_layers__choice": [[32], [64]]}', "search.agent.net.hid_layers__choice"),
    ('{"agent.algorithm.time_horizon__choice": [64, 128]}', "search.agent.algorithm.time_horizon__choice"),
    ('{"agent.net.optim_spec.lr__grid_search": [0.001, 0.01]}', "search.agent.net.optim_spec.lr__grid_search"),
])
def test_a_key_pbt_cannot_perturb_is_refused_by_name(search, named):
    with pytest.raises(SpecError) as err:
        load_spec(SPECS, "ppo_cartpole", [*PBT[:-2], f"search={search}", PBT[-1]])
    assert named in str(err.value)


def test_pbt_settings_are_checked(tmp_path, capsys):
    bad = 'meta.search_scheduler={"name": "PBT", "perturbation_interval": 300, "quantile_fraction": 0.7}'
    code = run_cli(SPECS, "ppo_cartpole", "search", "--data-dir", str(tmp_path / "data"),
                   *overrides([*PBT[:-1], bad]))
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "perturbation_interval: 300 is not a multiple of meta.log_frequency=200" in err
    assert "quantile_fraction: expected a number in (0, 0.5], got 0.7" in err
    assert not (tmp_path / "data").exists()


# ---------------------------------------------------------------- runs
def read_run(predir) -> tuple[str, dict[int, pd.DataFrame]]:
    """pbt.jsonl's text and every trial's train_df (without wall_t, fps)."""
    dfs = {t: pd.read_parquet(predir / f"t{t}/s0/train_df.parquet").drop(columns=["wall_t", "fps"]) for t in range(4)}
    return (predir / "pbt.jsonl").read_text(), dfs


@pytest.fixture(scope="module")
def uninterrupted(ray_local, tmp_path_factory):
    data = tmp_path_factory.mktemp("pbt") / "data"
    assert run_cli(SPECS, "ppo_cartpole", "search", "--data-dir", str(data), *overrides(PBT)) == 0
    return only_predir(data)


def test_exploit_restores_the_donor_state_with_the_explored_lr(uninterrupted):
    from orchestrator.session.loop import Session
    from orchestrator.store.checkpoint import CheckpointStore

    records = [json.loads(line) for line in (uninterrupted / "pbt.jsonl").read_text().splitlines()]
    assert [r["generation"] for r in records] == [g for g in (1, 2, 3, 4) for _ in range(4)]
    assert [r["frame"] for r in records[::4]] == [400, 800, 1200, 1600]
    exploit = next(r for r in records if r["donor"] is not None and r["generation"] == 4)
    t, donor, frame = exploit["trial"], exploit["donor"], exploit["frame"]
    spec = json.loads((uninterrupted / "ppo_cartpole_spec.json").read_text())
    recipient = CheckpointStore(str(uninterrupted / f"t{t}/s0"))
    assert frame in recipient.frames()
    manifest, files = recipient.load(frame)
    donor_manifest = CheckpointStore(str(uninterrupted / f"t{donor}/s0")).manifest(frame)
    assert manifest.meta["weights_sha256"] == donor_manifest.meta["weights_sha256"]
    session = Session(apply_values(spec, exploit["config"]), seed=0)
    session.from_checkpoint(files)
    sched = session.algorithm.lr_scheds["net"]  # LinearToZero: the lr of the last update's frame
    assert frame - 200 < sched.last_epoch <= frame
    assert set(sched.base_lrs) == {exploit["config"][LR]}  # every param group (actor and critic)
    lr = session.algorithm.optims["net"].param_groups[0]["lr"]
    assert lr == exploit["config"][LR] * sched.factor(sched.last_epoch)
    donor_lr = [r for r in records if r["trial"] == donor and r["generation"] == 3][0]["config"][LR]
    assert exploit["config"][LR] != donor_lr
    # the recipient's train_df continues the donor's rows up to the exploit, then logs the explored lr
    df = pd.read_parquet(uninterrupted / f"t{t}/s0/train_df.parquet")
    assert df[df["frame"] <= frame]["lr"].tolist() == \
        pd.read_parquet(uninterrupted / f"t{donor}/s0/train_df.parquet")["lr"].tolist()[:len(df[df["frame"] <= frame])]
    after = df[df["frame"] == frame + 200]["lr"].item()
    assert after == pytest.approx(exploit["config"][LR] * sched.factor(frame + 200), rel=1e-2)


def test_sigkill_then_search_latest_writes_the_same_decisions_and_train_dfs(uninterrupted, tmp_path):
    data = tmp_path / "data"
    driver = start_driver([SPECS, "ppo_cartpole", "search", "--data-dir", str(data), *overrides(PBT)], tmp_path)

    def mid_generation() -> bool:  # decision 2 applied, generation 3 under way
        state = list(data.glob("*/pbt.json"))
        return bool(state) and json.loads(state[0].read_text() or "{}").get("applied") == 2 and \
            bool(list(data.glob("*/t*/s0/ckpt/000000001000")))

    kill_driver_when(driver, mid_generation, 240, "generation 3 checkpointed")
    predir = only_predir(data)
    assert not list(predir.glob("t*/s0/ckpt/000000002000/MANIFEST.json"))
    assert run_cli(SPECS, "ppo_cartpole", "search@latest", "--data-dir", str(data), *overrides(PBT)) == 0
    text, dfs = read_run(predir)
    want_text, want = read_run(uninterrupted)
    assert text == want_text
    for t in range(4):
        pd.testing.assert_frame_equal(dfs[t], want[t], check_exact=True)


def test_two_searches_with_the_same_seed_decide_the_same(uninterrupted, ray_local, tmp_path, monkeypatch):
    """... and the session processes survive the generations: one actor per session for the whole search."""
    from orchestrator.trial import Trial

    started = []
    new_actor = Trial.new_actor
    monkeypatch.setattr(Trial, "new_actor", lambda self, plan: started.append(plan.key) or new_actor(self, plan))
    data = tmp_path / "data"
    items = [*PBT[:2], "env.max_frame=1200", *PBT[3:]]
    assert run_cli(SPECS, "ppo_cartpole", "search", "--data-dir", str(data), *overrides(items)) == 0
    assert len(started) == 4, started  # 3 generations of 4 sessions
    first = [json.loads(line) for line in (uninterrupted / "pbt.jsonl").read_text().splitlines()][:8]
    assert [json.loads(line) for line in (only_predir(data) / "pbt.jsonl").read_text().splitlines()] == first


def test_replay_reproduces_a_trial_bit_for_bit(uninterrupted, tmp_path, capsys):
    from orchestrator.store.checkpoint import CheckpointStore

    records = [json.loads(line) for line in (uninterrupted / "pbt.jsonl").read_text().splitlines()]
    t = next(r["trial"] for r in reversed(records) if r["donor"] is not None)  # a trial with an exploit in its past
    data = tmp_path / "data"
    capsys.readouterr()
    assert run_cli(str(uninterrupted / "ppo_cartpole_spec.json"), "ppo_cartpole", "train", "--data-dir", str(data),
                   "--pbt-replay", str(uninterrupted), "--trial", str(t)) == 0
    assert "equal the original's" in capsys.readouterr().out
    replayed = only_predir(data)
    a = pd.read_parquet(replayed / "t0/s0/train_df.parquet").drop(columns=["wall_t", "fps"])
    b = pd.read_parquet(uninterrupted / f"t{t}/s0/train_df.parquet").drop(columns=["wall_t", "fps"])
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    ma, mb = (CheckpointStore(str(p)).manifest(2000) for p in (replayed / "t0/s0", uninterrupted / f"t{t}/s0"))
    assert ma.meta["weights_sha256"] == mb.meta["weights_sha256"]
    assert (uninterrupted / "graph/ppo_cartpole_pbt_lineage.png").stat().st_size > 10_000
    variables = parse_search(load_spec(SPECS, "ppo_cartpole", PBT))[0]
    assert [v.path for v in variables] == [LR]


# ---------------------------------------------------------------- PB2
def test_replay_of_a_trial_that_does_not_exist_leaves_no_run_dir(uninterrupted, tmp_path, capsys):
    data = tmp_path / "r"
    data.mkdir()
    (data / "mine.txt").write_text("a user's file")
    capsys.readouterr()
    assert run_cli(str(uninterrupted / "ppo_cartpole_spec.json"), "ppo_cartpole", "train", "--data-dir", str(data),
                   "--pbt-replay", str(uninterrupted), "--trial", "7") == 2
    err = capsys.readouterr().err
    assert f"error: --trial 7: the PBT run {uninterrupted} has trials 0..3" in err and "Traceback" not in err, err
    assert [p.name for p in data.iterdir()] == ["mine.txt"] and (data / "mine.txt").read_text() == "a user's file"


def test_pb2_picks_the_region_where_the_score_improved_most():
    from orchestrator.search import pb2

    var = SearchVar(LR, "loguniform", [1e-4, 1e-2])
    rng = np.random.default_rng(0)
    data = []  # improvement peaks at lr = 1e-3 (the middle of the log box), at every time
    for k in range(2, 6):
        for u in np.linspace(0, 1, 9):
            data.append((k / 6, {LR: pb2.from_unit(var, u)}, -((u - 0.5) ** 2)))
    (pick,) = pb2.select([var], data, 1.0, [{LR: 1e-4}], rng)
    assert abs(pb2.to_unit(var, pick[LR]) - 0.5) < 0.15
    first = pb2.select([var], [], 0.5, [{LR: 1e-4}, {LR: 1e-2}], np.random.default_rng(1))
    assert len(first) == 2 and all(1e-4 <= p[LR] <= 1e-2 for p in first)  # no data: uniform in the box
    ints = SearchVar("agent.algorithm.training_epoch", "randint", [1, 20])
    assert pb2.from_unit(ints, 1.0) == 20
    assert pb2.to_unit(ints, pb2.from_unit(ints, 0.25)) == pytest.approx(0.25, abs=0.03)


def test_pb2_observations_are_score_changes_from_the_state_each_trial_started_from():
    from orchestrator.search import pb2
    from orchestrator.search.decision import Decision

    history = [Decision(generation=1, frame=400, trial=0, donor=None, score=10.0, donor_score=None, config={"x": 1}),
               Decision(generation=1, frame=400, trial=1, donor=0, score=2.0, donor_score=10.0, config={"x": 3})]
    got = pb2.observations(history, {0: 15.0, 1: 11.0}, 2, 4)
    assert got == [(0.5, {"x": 1}, 5.0), (0.5, {"x": 3}, 1.0)]


def test_pb2_search_runs_and_replays(ray_local, tmp_path, capsys):
    items = [*PBT[:2], "env.max_frame=1200", *PBT[3:7],
             'search={"agent.net.optim_spec.lr__loguniform": [1e-4, 1e-2], '
             '"agent.algorithm.gamma__uniform": [0.9, 0.999]}',
             'meta.search_scheduler={"name": "PB2", "perturbation_interval": 400}']
    data = tmp_path / "data"
    assert run_cli(SPECS, "ppo_cartpole", "search", "--data-dir", str(data), *overrides(items)) == 0
    predir = only_predir(data)
    records = [json.loads(line) for line in (predir / "pbt.jsonl").read_text().splitlines()]
    assert len(records) == 8 and sum(r["donor"] is not None for r in records) == 2
    for r in records:
        assert 1e-4 <= r["config"][LR] <= 1e-2 and 0.9 <= r["config"]["agent.algorithm.gamma"] <= 0.999
    t = records[-1]["trial"] if records[-1]["donor"] is not None else records[-2]["trial"]
    capsys.readouterr()
    assert run_cli(str(predir / "ppo_cartpole_spec.json"), "ppo_cartpole", "train", "--data-dir", str(tmp_path / "r"),
                   "--pbt-replay", str(predir), "--trial", str(t)) == 0
    assert "equal the original's" in capsys.readouterr().out
    with pytest.raises(SpecError) as err:  # PB2 needs a bounded box
        load_spec(SPECS, "ppo_cartpole", [*items[:-2], 'search={"agent.algorithm.gamma__choice": [0.9, 0.99]}',
                                          items[-1]])
    assert "search.agent.algorithm.gamma__choice: PB2 searches the box" in str(err.value)


def test_a_complete_named_search_run_again_changes_nothing(ray_local, tmp_path, capsys):
    from lab_helpers import files_digest

    items = [*PBT[:2], "env.max_frame=800", *PBT[3:]]
    argv = [SPECS, "ppo_cartpole", "search", "--name", "job", "--data-dir", str(tmp_path / "data"), *overrides(items)]
    assert run_cli(*argv) == 0
    before = files_digest(tmp_path / "data")
    capsys.readouterr()
    assert run_cli(*argv) == 0
    out = capsys.readouterr().out
    assert f"search --name job: the search {tmp_path / 'data' / 'job'} is already complete at its max_frame 800; " \
           "nothing to do" in out
    assert files_digest(tmp_path / "data") == before


@pytest.mark.timeout(180)
def test_a_population_larger_than_the_cluster_runs_as_many_sessions_as_fit(ray_local, tmp_path, monkeypatch):
    """8 sessions of 1 CPU on the 4-CPU ``ray_local``: 4 run at a time, the others start in the actors of the
    sessions that end (kept actors used to hold every CPU while the rest waited for one: the search hung)."""
    from orchestrator.trial import Trial

    started = []
    new_actor = Trial.new_actor
    monkeypatch.setattr(Trial, "new_actor", lambda self, plan: started.append(plan.key) or new_actor(self, plan))
    data = tmp_path / "data"
    items = ["meta.max_trial=4", "meta.max_session=2", "env.max_frame=800", *PBT[3:6],
             'meta.resources={"num_cpus": 1, "num_gpus": 0}', *PBT[7:]]
    assert run_cli(SPECS, "ppo_cartpole", "search", "--data-dir", str(data), *overrides(items)) == 0
    assert ray_local.cluster_resources()["CPU"] == 4 and len(started) == 4, started
    predir = only_predir(data)
    for t in range(4):
        for s in range(2):
            assert pd.read_parquet(predir / f"t{t}/s{s}/train_df.parquet")["frame"].tolist() == [200, 400, 600, 800]
    records = [json.loads(line) for line in (predir / "pbt.jsonl").read_text().splitlines()]
    assert [(r["generation"], r["trial"]) for r in records] == [(1, t) for t in range(4)]


def test_killed_mid_exploit_reapplies_the_recorded_decision(uninterrupted, ray_local, tmp_path):
    """Decision 4 recorded, its exploit half done (the recipient's ``ckpt/`` gone), ``pbt.json`` still at 3:
    ``search@`` trains nothing before applying decision 4 again, and ends with the uninterrupted run's train_dfs."""
    import shutil

    predir = tmp_path / "data" / uninterrupted.name
    shutil.copytree(uninterrupted, predir)
    (predir / "pbt.json").write_text(json.dumps({"applied": 3, "frame": 1200}))
    records = [json.loads(line) for line in (predir / "pbt.jsonl").read_text().splitlines()]
    recipient = next(r["trial"] for r in records if r["generation"] == 4 and r["donor"] is not None)
    shutil.rmtree(predir / f"t{recipient}/s0/ckpt")
    assert run_cli(SPECS, "ppo_cartpole", "search@latest", "--data-dir", str(tmp_path / "data"), *overrides(PBT)) == 0
    text, dfs = read_run(predir)
    want_text, want = read_run(uninterrupted)
    assert text == want_text
    for t in range(4):
        pd.testing.assert_frame_equal(dfs[t], want[t], check_exact=True)
