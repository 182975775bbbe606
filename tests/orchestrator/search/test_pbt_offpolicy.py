"""Population-based training of an off-policy algorithm (DQN, replay checkpointed) and the population's state
machinery: kept trials train on with their live state (train_df equal to a plain train's), every generation
trains (optimizer steps per generation equal a plain train's, though the interval is shorter than
``training_start_step``), a SIGKILL of the driver resumes to the same ``pbt.jsonl``, a Ctrl-C and a SIGTERM in two
generations exit 75 and the resumed search ends as the uninterrupted one, ``--pbt-replay`` reproduces
an exploited trial bit for bit; a failed trial is replaced by an exploit; the score of a generation, the reseed,
the exploit's manifest-first delete, the discount reaching the env, the lineage graph of an unfinished generation,
the lineage's values and the experiment graph of a real population, and the summary's replay command.
"""

import io
import json
import math
import re
import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lab_helpers import REPO, kill_driver_when, only_predir, overrides, run_cli, start_driver, uninterrupted_df

from orchestrator.errors import SpecError
from orchestrator.search import pbt
from orchestrator.search.pbt_policy import reseed
from orchestrator.spec.load import load_spec

DEMO = str(REPO / "specs/demo.json")
LR = "agent.net.optim_spec.lr"
# interval 200 < training_start_step 500: an empty replay at every generation would never train
DQN = ["meta.max_trial=4", "meta.max_session=1", "env.max_frame=1000", "meta.log_frequency=100",
       "meta.checkpoint_frequency=100", "meta.random_seed=5", 'meta.resources={"num_cpus": 0.5, "num_gpus": 0}',
       "agent.memory.checkpoint=true", 'search={"agent.net.optim_spec.lr__loguniform": [1e-4, 1e-2]}',
       'meta.search_scheduler={"name": "PBT", "perturbation_interval": 200}']


def records_of(predir) -> list[dict]:
    return [json.loads(line) for line in (predir / "pbt.jsonl").read_text().splitlines()]


def train_dfs(predir) -> dict[int, pd.DataFrame]:
    return {t: pd.read_parquet(predir / f"t{t}/s0/train_df.parquet").drop(columns=["wall_t", "fps"]) for t in range(4)}


@pytest.fixture(scope="module")
def dqn_search(ray_local, tmp_path_factory):
    data = tmp_path_factory.mktemp("pbt_dqn") / "data"
    assert run_cli(DEMO, "dqn_cartpole", "search", "--data-dir", str(data), *overrides(DQN)) == 0
    return only_predir(data)


def test_a_replay_pbt_search_without_the_replay_in_its_checkpoints_is_refused_by_name(tmp_path, capsys):
    with pytest.raises(SpecError) as err:
        load_spec(DEMO, "dqn_cartpole", [item for item in DQN if "memory.checkpoint" not in item])
    assert "agent.memory.checkpoint: a PBT search of Replay" in str(err.value)
    assert "-s agent.memory.checkpoint=true" in str(err.value)
    code = run_cli(DEMO, "dqn_cartpole", "search", "--data-dir", str(tmp_path / "data"),
                   *overrides([item for item in DQN if "memory.checkpoint" not in item]))
    assert code == 2 and "Traceback" not in capsys.readouterr().err and not (tmp_path / "data").exists()
    load_spec(DEMO, "dqn_cartpole", DQN)  # with it: valid


def test_every_generation_trains_and_kept_trials_equal_a_plain_train(dqn_search):
    records = records_of(dqn_search)
    assert [r["frame"] for r in records[::4]] == [200, 400, 600, 800]
    dfs = train_dfs(dqn_search)
    spec = json.loads((dqn_search / "dqn_cartpole_spec.json").read_text())
    initial = pbt.Population(str(dqn_search), spec, None, True, lambda s: s).initial
    kept = [t for t in range(4) if all(r["donor"] is None for r in records if r["trial"] == t)]
    assert kept and len(kept) < 4, records  # some trials never exploited, some exploited
    plain = {}
    for t in kept:  # a kept trial's curve is a plain train's with its seed and values: no restore in between
        plain[t] = uninterrupted_df([*DQN[:-2], "meta.max_trial=1", f"meta.random_seed={5 + 1000 * t}",
                                     f"{LR}={initial[t][LR]}"], 0, DEMO, "dqn_cartpole").drop(columns=["wall_t", "fps"])
        pd.testing.assert_frame_equal(dfs[t], plain[t], check_exact=True)
    want = plain[kept[0]].set_index("frame")["opt_step"]
    steps = want.loc[[200, 400, 600, 800, 1000]].diff().dropna().tolist()
    assert steps[-2:] == [100, 100]  # 200 frames / training_frequency 4 * training_iter 2, once the replay is full
    for t in range(4):  # every trial, exploited or not, makes a plain train's optimizer steps in every generation
        got = dfs[t].set_index("frame")["opt_step"]
        assert got.loc[[200, 400, 600, 800, 1000]].diff().dropna().tolist() == steps, t
        assert not dfs[t]["refill"].any()


def test_sigkill_then_resume_gives_the_same_decisions_and_replay_is_bit_for_bit(dqn_search, ray_local, tmp_path,
                                                                              capsys):
    data = tmp_path / "data"
    driver = start_driver([DEMO, "dqn_cartpole", "search", "--data-dir", str(data), *overrides(DQN)], tmp_path)

    def mid_generation() -> bool:  # decision 2 applied, generation 3 under way
        state = list(data.glob("*/pbt.json"))
        return bool(state) and json.loads(state[0].read_text() or "{}").get("applied") == 2 and \
            bool(list(data.glob("*/t*/s0/ckpt/000000000500")))

    kill_driver_when(driver, mid_generation, 240, "generation 3 checkpointed")
    predir = only_predir(data)
    from orchestrator.search.report import analyze

    spec = json.loads((predir / "dqn_cartpole_spec.json").read_text())
    analyze(str(predir), spec, merge=False)  # what a signalled driver does before it exits: metrics at frame 500
    capsys.readouterr()
    assert run_cli(DEMO, "dqn_cartpole", "search@latest", "--data-dir", str(data), *overrides(DQN)) == 0
    assert (predir / "pbt.jsonl").read_text() == (dqn_search / "pbt.jsonl").read_text()
    for t, df in train_dfs(predir).items():
        pd.testing.assert_frame_equal(df, train_dfs(dqn_search)[t], check_exact=True)
    # the resumed search's analysis covers every trial's full curve, as the uninterrupted one's
    for t in range(4):
        got, want = (json.loads((p / f"info/t{t}_trial_metrics.json").read_text()) for p in (predir, dqn_search))
        assert [got[k] for k in ("strength", "final_return_ma", "total_reward_ma")] == \
            [want[k] for k in ("strength", "final_return_ma", "total_reward_ma")], t
    assert "t0" in capsys.readouterr().out
    records = records_of(dqn_search)
    last = next(r for r in reversed(records) if r["donor"] is not None)
    assert isinstance(last["reseed"], int) and last["reseed"] == reseed(5, last["trial"], last["generation"])
    assert f"acting RNG streams reseeded with {pbt.session_reseed(last['reseed'], 0)} at frame {last['frame']}" in \
        (dqn_search / f"t{last['trial']}/s0/log.txt").read_text()
    capsys.readouterr()
    assert run_cli(str(dqn_search / "dqn_cartpole_spec.json"), "dqn_cartpole", "train", "--data-dir",
                   str(tmp_path / "replay"), "--pbt-replay", str(dqn_search), "--trial", str(last["trial"])) == 0
    assert "equal the original's" in capsys.readouterr().out


def test_stops_at_two_generations_exit_75_and_the_resumed_search_equals_the_uninterrupted(dqn_search, ray_local,
                                                                                         tmp_path):
    """Ctrl-C in generation 2, then SIGTERM to the resumed driver in generation 4: each exits 75 with no traceback
    (its lineage graph drawn from the decisions committed, no KeyError) and prints its resume command. The driver's own
    analysis after each stop (at the stop frame) is redone by the last resume: its decisions, train_dfs, trial
    metrics, summary table and graphs equal the uninterrupted search's."""
    import signal

    from lab_helpers import descendants, kill_pids

    data = tmp_path / "data"
    command = [DEMO, "dqn_cartpole", "search", "--data-dir", str(data), *overrides(DQN)]
    for sig, frame, argv in ((signal.SIGINT, 300, command), (signal.SIGTERM, 700, [*command[:2], "search@latest",
                                                                                  *command[3:]])):
        driver = start_driver(argv, tmp_path, capture=True)
        tree = []
        try:
            deadline = time.time() + 240
            while not list(data.glob(f"*/t*/s0/ckpt/{frame:012d}")):
                assert driver.poll() is None and time.time() < deadline, f"frame {frame} not reached"
                time.sleep(0.1)
            tree = descendants(driver.pid)
            driver.send_signal(sig)
            out, err = driver.communicate(timeout=180)
        finally:
            kill_pids(descendants(driver.pid) + tree)
        assert driver.returncode == 75, f"{sig.name}: {err[-2000:]}"
        assert "Traceback" not in err and "resume with" in out, f"{sig.name}: {err[-2000:]}"
    predir = only_predir(data)
    assert run_cli(*command[:2], "search@latest", *command[3:]) == 0
    assert (predir / "pbt.jsonl").read_text() == (dqn_search / "pbt.jsonl").read_text()
    for t, df in train_dfs(predir).items():
        pd.testing.assert_frame_equal(df, train_dfs(dqn_search)[t], check_exact=True)
    for t in range(4):
        got, want = (json.loads((p / f"info/t{t}_trial_metrics.json").read_text()) for p in (predir, dqn_search))
        assert [got[k] for k in ("strength", "final_return_ma", "total_reward_ma")] == \
            [want[k] for k in ("strength", "final_return_ma", "total_reward_ma")], t
    got, want = (pd.read_parquet(p / "info/experiment_df.parquet") for p in (predir, dqn_search))
    pd.testing.assert_frame_equal(got, want, check_exact=True)  # the summary's table
    graphs = [sorted(p.name for p in (run / "graph").iterdir()) for run in (predir, dqn_search)]
    assert graphs[0] == graphs[1]


def test_the_summary_recommends_the_replay_command(dqn_search, capsys):
    from orchestrator.search.report import analyze, report_summary

    spec = json.loads((dqn_search / "dqn_cartpole_spec.json").read_text())
    df = analyze(str(dqn_search), spec, merge=False)
    capsys.readouterr()
    report_summary(str(dqn_search), spec, df)
    out = capsys.readouterr().out
    assert f"train --pbt-replay {dqn_search} --trial {int(df['trial'].iloc[0])}" in out
    assert "best_spec.json" not in out


def test_the_lineage_and_experiment_graph_of_a_real_population(dqn_search):
    """Each trial's lr over frames is its initial value then its decisions' values; the experiment graph of the PBT
    search is its final scores beside the score lineage (``orchestrator.report.experiment_graph``)."""
    from orchestrator.report.experiment_graph import experiment_figure
    from orchestrator.report.pbt_graph import steps
    from orchestrator.spec.search_space import parse_search

    spec = json.loads((dqn_search / "dqn_cartpole_spec.json").read_text())
    lin = pbt.lineage_of(str(dqn_search), spec)
    records = records_of(dqn_search)
    initial = pbt.Population(str(dqn_search), spec, None, True, lambda s: s).initial
    assert lin.keys == [LR] and lin.end_frame == 1000 and len(lin.points) == 4 * 5  # 4 decisions and the final
    for t in range(4):
        frames, values = steps(lin, LR)[t]
        mine = [r for r in records if r["trial"] == t]
        assert frames == [0] + [r["frame"] for r in mine] + [1000]
        assert values == [initial[t][LR]] + [r["config"][LR] for r in mine] + [mine[-1]["config"][LR]]
    df = pd.read_parquet(dqn_search / "info/experiment_df.parquet")
    fig = experiment_figure(df, parse_search(spec)[0], "t", lin)
    bars, scores = fig.axes
    assert sorted(p.get_width() for p in bars.patches) == sorted(df["total_reward_ma"].fillna(0.0))
    assert scores.get_xlabel() == "frame" and (dqn_search / "graph/dqn_cartpole_experiment_graph.png").stat().st_size


# ---------------------------------------------------------------- a failed trial
FAILING = ["meta.max_trial=4", "meta.max_session=1", "env.max_frame=1200", "env.num_envs=1",
           "env.name=tests.fault_envs:FailingCartPole-v0", "meta.log_frequency=200", "meta.checkpoint_frequency=200",
           "meta.random_seed=10", 'meta.resources={"num_cpus": 0.5, "num_gpus": 0}',
           'search={"agent.net.optim_spec.lr__loguniform": [1e-4, 1e-2]}',
           'meta.search_scheduler={"name": "PBT", "perturbation_interval": 400}']


def test_a_failed_trial_is_replaced_by_an_exploit_and_the_population_goes_on(ray_local, tmp_path):
    """Seed 10: session t0_s0 (seed 10) raises after 300 env steps, in generation 1; the others never fail."""
    from lab_helpers import SPECS

    data = tmp_path / "data"
    assert run_cli(SPECS, "ppo_cartpole", "search", "--data-dir", str(data), *overrides(FAILING)) == 0
    predir = only_predir(data)
    first = [r for r in records_of(predir) if r["generation"] == 1]
    assert first[0]["failed"] is True and first[0]["donor"] in (1, 2, 3) and first[0]["score"] is None
    assert all(r["donor"] != 0 for r in records_of(predir))
    assert json.loads((predir / "pbt.json").read_text()) == {"applied": 2, "frame": 800, "failed": {}}
    df = pd.read_parquet(predir / "t0/s0/train_df.parquet")
    assert df["frame"].tolist() == [200, 400, 600, 800, 1000, 1200]
    log = (predir / "t0/s0/log.txt").read_text()
    assert "injected failure" in log and log.count("session failed") == 1  # once, never trained again


# ---------------------------------------------------------------- units (no Ray)
def parquet(rows: list[dict]) -> bytes:
    out = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), out)
    return out.getvalue()


def test_the_score_is_the_mean_return_of_the_generations_episodes():
    rows = [{"frame": 100, "epi": 4, "total_reward": 10.0}, {"frame": 200, "epi": 6, "total_reward": 30.0},
            {"frame": 300, "epi": 6, "total_reward": 30.0},  # none ended: the last known return, skipped
            {"frame": 400, "epi": 7, "total_reward": 60.0}]
    assert pbt.generation_score(parquet(rows), None, 200, 400) == 60.0
    assert pbt.generation_score(parquet(rows), None, 0, 400) == pytest.approx((10 * 4 + 30 * 2 + 60) / 7)
    assert pbt.generation_score(parquet(rows[:3]), None, 200, 300) is None
    evals = parquet([{"frame": 200, "total_reward": 5.0}, {"frame": 400, "total_reward": 9.0}])
    assert pbt.generation_score(parquet(rows), evals, 200, 400) == 9.0


def test_session_reseeds_are_deterministic_and_distinct():
    a = reseed(5, 1, 2)
    assert pbt.session_reseed(a, 0) == pbt.session_reseed(a, 0) != pbt.session_reseed(a, 1)
    assert 0 <= pbt.session_reseed(a, 1) < 2**31


def test_a_restored_env_discounts_with_the_specs_gamma():
    from lab_helpers import SPECS

    from orchestrator.session.loop import Session
    from orchestrator.spec.load import load_spec as load

    spec = load(SPECS, "ppo_cartpole", ["env.normalize_reward=true", "env.max_frame=64", "meta.log_frequency=32"])
    a = Session(spec, 1)
    a.run_rl()
    files, _ = a.to_checkpoint()
    spec["agent"]["algorithm"]["gamma"] = 0.9
    b = Session(spec, 1, fresh=False)
    b.from_checkpoint(files)
    layer, found = b.env, []
    while layer is not None:
        if type(layer).__name__ == "NormalizeReward":
            found.append(layer.gamma)
        layer = getattr(layer, "env", None) if hasattr(layer, "num_envs") else None
    assert found == [0.9]


def test_the_exploit_deletes_manifests_first(tmp_path, monkeypatch):
    from orchestrator.store import storage
    from orchestrator.store.checkpoint import CheckpointStore

    store = CheckpointStore(str(tmp_path / "s0"))
    for frame in (100, 200):
        store.commit(frame, {"state.pt": b"x" * 10}, {"total_reward_ma": 1.0})
    deleted = []
    real = storage.delete
    monkeypatch.setattr(storage, "delete", lambda uri: deleted.append(uri) or real(uri))
    store.delete_all()
    assert [d.rsplit("ckpt/", 1)[1] for d in deleted[:4]] == [
        "000000000200/MANIFEST.json", "000000000200", "000000000100/MANIFEST.json", "000000000100"]
    assert not (tmp_path / "s0/ckpt").exists()
    # the exploit's copy (CheckpointStore.copy_to, pbt.py) deletes the recipient's checkpoints the same way first
    donor = CheckpointStore(str(tmp_path / "s1"))
    for frame in (100, 200, 300):
        donor.commit(frame, {"state.pt": bytes([frame // 100]) * 10}, {"total_reward_ma": 2.0})
    for frame in (100, 400):
        store.commit(frame, {"state.pt": b"y" * 10}, {"total_reward_ma": 1.0})
    deleted.clear()
    donor.copy_to(store, 200)
    assert [d.rsplit("s0/ckpt/", 1)[1] for d in deleted[:4]] == [
        "000000000400/MANIFEST.json", "000000000400", "000000000100/MANIFEST.json", "000000000100"]
    assert store.frames() == [100, 200] and store.read_file(200, "state.pt") == bytes([2]) * 10


def test_the_lineage_graph_of_an_unfinished_generation_draws_what_is_committed(tmp_path):
    spec = load_spec(DEMO, "dqn_cartpole", DQN)
    (tmp_path / "pbt.jsonl").write_text("".join(json.dumps(
        {"generation": g, "frame": 200 * g, "trial": t, "donor": 0 if (t == 3 and g == 2) else None,
         "score": float(t + g), "donor_score": None, "config": {LR: 1e-3}}) + "\n"
        for g in (1, 2, 3) for t in range(4)))
    files = pbt.lineage_graph(str(tmp_path), spec)  # generation 4 under way: (4, t) has no point
    assert len(files) == 2 and all((tmp_path / "graph" / f.rsplit("/", 1)[1]).stat().st_size > 1000 for f in files)


def test_a_summary_without_decisions_offers_no_replay(tmp_path, capsys):
    from orchestrator.search.report import report_summary

    spec = load_spec(DEMO, "dqn_cartpole", DQN)
    df = pd.DataFrame([{"trial": 1, LR: 1e-3, "status": "done", "strength": 1.0, "total_reward_ma": 2.0,
                        "frame": 1000}])
    report_summary(str(tmp_path), spec, df)
    out = capsys.readouterr().out
    assert "--pbt-replay" not in out and "no PBT decision" in out and "best_spec.json dqn_cartpole train" in out
    assert math.isfinite(np.float64(df["strength"].iloc[0]))


def test_a_summary_where_no_trial_logged_a_return_names_no_best_trial(tmp_path, capsys):
    """A search stopped before any trial logged a return: its table, then one line saying so, no "best trial"."""
    from orchestrator.search.report import report_summary

    spec = load_spec(DEMO, "dqn_cartpole", DQN)
    df = pd.DataFrame([{"trial": t, LR: 1e-3, "status": "running", "strength": np.nan, "total_reward_ma": np.nan,
                        "frame": 0} for t in (0, 1)])
    report_summary(str(tmp_path), spec, df)
    out = capsys.readouterr().out
    assert f"search interrupted: {tmp_path}" not in out  # interrupted=False here
    assert f"search done: {tmp_path}\n  no trial has logged a return yet (total_reward_ma): no best trial" in out
    assert re.search(r"best trial (so far )?t\d", out) is None and "run it with" not in out
    report_summary(str(tmp_path), spec, df, interrupted=True)
    assert f"search interrupted: {tmp_path}\n  no trial has logged a return yet" in capsys.readouterr().out


def test_a_population_where_every_trial_failed_stops_with_a_clear_message(tmp_path, capsys):
    from orchestrator.spec.load import check

    spec = load_spec(DEMO, "dqn_cartpole", DQN)
    pop = pbt.Population(str(tmp_path), spec, None, True, check)
    assert pop.stop_failed(2, {0, 1, 2, 3}) == 1
    err = capsys.readouterr().err
    assert "error: PBT stopped: every trial failed in generation 2 (frames up to 400)" in err
    assert all(json.loads((tmp_path / f"t{t}/trial.json").read_text())["status"] == "error" for t in range(4))
