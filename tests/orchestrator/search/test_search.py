"""Search mode: search-section parsing, trial-level Tune reports, a 2x2 grid on S3, SIGKILL of the
driver then ``search@latest``, and ASHA stopping a learning rate of 0.

The in-process searches share the session-scoped ``ray_local`` (Tune runs in the test process); the
SIGKILL test runs its driver as a subprocess, which starts a Ray of its own whose leftover processes
the test kills by PID.
"""

import hashlib
import math
import os
import signal
import threading
import time

import pandas as pd
import pytest
from lab_helpers import (
    SPECS,
    assert_continuous,
    files_digest,
    kill_driver_when,
    only_predir,
    overrides,
    pid_alive,
    run_cli,
    start_driver,
)

from orchestrator.errors import EXIT_RESUMABLE, SpecError, UsageError
from orchestrator.search.trials import TrialReporter, trial_index
from orchestrator.search.tune import TrialNamer, param_space, search_alg_name
from orchestrator.spec.load import load_spec
from orchestrator.spec.search_space import apply_values, parse_search
from orchestrator.store import storage
from orchestrator.store.record import SessionPlan

GAMMA_GRID = 'search={"agent": {"algorithm": {"gamma__grid_search": [0.9, 0.99]}}}'
SMALL = ["meta.log_frequency=800", "meta.checkpoint_frequency=800", "meta.random_seed=11",
         'meta.resources={"num_cpus": 0.5, "num_gpus": 0}']


# ---------------------------------------------------------------- search section (no Ray)

def test_nested_and_dotted_search_keys_become_tune_domains():
    spec = load_spec(SPECS, "ppo_cartpole", [
        'search={"agent": {"algorithm": {"gamma__uniform": [0.9, 0.99]}}, '
        '"agent.net.optim_spec.lr__loguniform": [1e-4, 1e-2], '
        '"agent.net.hid_layers__choice": [[32], [64, 64]], '
        '"env.num_envs__grid_search": [4, 8], "agent.algorithm.lam__normal": [0.9, 0.01], '
        '"agent.algorithm.training_epoch__randint": [2, 5]}'])
    variables, problems = parse_search(spec)
    assert problems == []
    assert [(v.path, v.kind) for v in variables] == [
        ("agent.algorithm.gamma", "uniform"), ("agent.net.optim_spec.lr", "loguniform"),
        ("agent.net.hid_layers", "choice"), ("env.num_envs", "grid_search"),
        ("agent.algorithm.lam", "normal"),
        ("agent.algorithm.training_epoch", "randint")]
    space = param_space(spec)
    assert space["env.num_envs"] == {"grid_search": [4, 8]}
    assert (space["agent.algorithm.gamma"].lower, space["agent.algorithm.gamma"].upper) == (0.9, 0.99)
    epochs = space["agent.algorithm.training_epoch"]
    assert (epochs.lower, epochs.upper) == (2, 5)
    applied = apply_values(spec, {"agent.net.optim_spec.lr": 0.003, "agent.net.hid_layers": [32]})
    net = applied["agent"]["net"]
    assert net["optim_spec"]["lr"] == 0.003 and net["hid_layers"] == [32]
    assert applied["search"] == {} and spec["agent"]["net"]["optim_spec"]["lr"] == 0.001


@pytest.mark.parametrize("search, message", [
    ('{"agent.algorithm.gamma__gaussian": [0.9, 0.99]}',
     "search.agent.algorithm.gamma__gaussian: unknown space type"),
    ('{"agent": {"algorithm": {"gama__choice": [0.9]}}}',
     "search.agent.algorithm.gama__choice: 'agent.algorithm.gama' does not exist in the spec"),
    ('{"agent.net.optim_spec.lr__loguniform": [0, 0.1]}', "loguniform needs 0 < low"),
    ('{"agent.algorithm.gamma__uniform": [0.99, 0.9]}', "expected low < high"),
    ('{"agent.algorithm.gamma__grid_search": []}', "expected a non-empty list"),
])
def test_invalid_search_section_names_the_dotted_path(search, message):
    with pytest.raises(SpecError) as err:
        load_spec(SPECS, "ppo_cartpole", [f"search={search}"])
    assert any(message in p for p in err.value.problems), err.value.problems


def test_invalid_scheduler_is_refused():
    with pytest.raises(SpecError) as err:
        load_spec(SPECS, "ppo_cartpole", ['meta.search_scheduler={"name": "HyperBand", "grace_period": 0}'])
    text = "\n".join(err.value.problems)
    assert "meta.search_scheduler.name" in text and "meta.search_scheduler.grace_period" in text
    with pytest.raises(SpecError) as err:  # PBT has keys of its own (orchestrator.spec.pbt)
        load_spec(SPECS, "ppo_cartpole", ['meta.search_scheduler={"name": "PBT", "grace_period": 1}'])
    assert "meta.search_scheduler.grace_period: unknown key for PBT" in str(err.value)


def test_trial_reporter_reports_the_mean_once_every_live_session_logged_a_frame():
    reports = []
    plans = [SessionPlan(3, s, 100 + s, resume=False) for s in range(3)]
    history = {0: {}, 1: {}, 2: {}}
    reporter = TrialReporter(3, plans, history, reports.append)
    reporter(plans[0], {"frame": 800, "total_reward_ma": 10.0})
    reporter(plans[1], {"frame": 800, "total_reward_ma": 20.0})
    reporter(plans[0], {"frame": 1600, "total_reward_ma": 30.0})
    assert reports == []
    reporter(plans[2], {"frame": 800, "total_reward_ma": math.nan, "fps": 90.0})  # no episode ended yet: left out
    assert [{k: v for k, v in r.items() if k != "progress"} for r in reports] == [
        {"total_reward_ma": 15.0, "frame": 800, "trial": 3}]
    plans[2].status = "failed"  # a failed session stops counting
    reporter(plans[1], {"frame": 1600, "total_reward_ma": 50.0})
    assert {k: v for k, v in reports[-1].items() if k != "progress"} == {"total_reward_ma": 40.0, "frame": 1600,
                                                                         "trial": 3}
    assert len(reports) == 2
    # each report carries every session's latest row and status for the driver's console
    assert reports[0]["progress"]["t3_s0"] == {"frame": 1600, "fps": None, "total_reward_ma": 30.0, "status": ""}
    s2 = reports[0]["progress"]["t3_s2"]
    assert s2["fps"] == 90.0 and math.isnan(s2["total_reward_ma"]) and s2["status"] == ""
    assert reports[-1]["progress"]["t3_s2"]["status"] == "failed"
    assert reports[-1]["progress"]["t3_s1"] == {"frame": 1600, "fps": None, "total_reward_ma": 50.0, "status": ""}


def test_trial_names_come_from_the_generation_order():
    class FakeTrial:
        experiment_tag = "7_agent.algorithm.gamma=0.9"
    assert TrialNamer(0)(FakeTrial()) == "t7" and TrialNamer(1)(FakeTrial()) == "t6"
    assert trial_index("t12") == 12
    with pytest.raises(ValueError):
        trial_index("search_trial_abc")


@pytest.mark.parametrize("mode, extra, message", [
    ("search", [], "the spec has no search section"),
    ("search@latest", [GAMMA_GRID], "search@latest: no run of 'ppo_cartpole'"),
    ("search@{predir}", [GAMMA_GRID], "is not a search run"),
])
def test_search_bad_input_exits_2_and_creates_nothing(tmp_path, capsys, mode, extra, message):
    data = tmp_path / "data"
    if "{predir}" in mode:  # a train run (spec file only) is not a search
        predir = data / "ppo_cartpole_2026_01_01_000000"
        storage.write_json(str(predir / "ppo_cartpole_spec.json"), load_spec(SPECS, "ppo_cartpole"))
        mode = mode.format(predir=predir)
    before = sorted(p.name for p in data.rglob("*")) if data.exists() else []
    assert run_cli(SPECS, "ppo_cartpole", mode, "--data-dir", str(data), *overrides(SMALL + extra)) == 2
    assert message in capsys.readouterr().err
    assert (sorted(p.name for p in data.rglob("*")) if data.exists() else []) == before


def test_search_trial_that_can_never_fit_is_refused(ray_local, tmp_path, capsys):
    """A search trial reserves all its sessions at once: 8 sessions of 1 CPU on the 4-CPU test Ray would stay
    PENDING forever; refused up front (exit 2), no run directory created."""
    data = tmp_path / "data"
    items = ['meta.resources={"num_cpus": 1, "num_gpus": 0}', "meta.max_session=8", GAMMA_GRID]
    assert run_cli(SPECS, "ppo_cartpole", "search", "--data-dir", str(data), *overrides(items)) == 2
    err = capsys.readouterr().err
    assert "meta.resources.num_cpus=1.0 x 8 session actor(s)" in err and "8 CPU can never fit" in err
    assert "Traceback" not in err and not data.exists()


def test_optuna_needs_its_extra_and_samplable_variables():
    spec = load_spec(SPECS, "ppo_cartpole", [GAMMA_GRID])
    try:
        import optuna  # noqa: F401
    except ImportError:
        assert search_alg_name(spec, "auto") == "basic"
        with pytest.raises(UsageError, match="optuna is not installed"):
            search_alg_name(spec, "optuna")
        return
    assert search_alg_name(spec, "auto") == "basic"  # a grid: Optuna cannot sample it
    with pytest.raises(UsageError, match="cannot sample search.agent.algorithm.gamma__grid_search"):
        search_alg_name(spec, "optuna")


# ---------------------------------------------------------------- searches on Ray

def test_grid_2x2_on_s3(ray_local, s3_bucket):
    data = f"{s3_bucket}/runs"
    items = SMALL + ["meta.max_session=2", "env.max_frame=1600", GAMMA_GRID]
    assert run_cli(SPECS, "ppo_cartpole", "search", "--data-dir", data, *overrides(items)) == 0
    (name,) = [n for n in storage.listdir(data) if n.startswith("ppo_cartpole_")]
    predir = f"{data}/{name}"
    assert [n for n in storage.listdir(predir) if n.startswith("t") and n[1:].isdigit()] == ["t0", "t1"]
    for t in (0, 1):
        for s in (0, 1):
            df = storage.read_parquet(f"{predir}/t{t}/s{s}/train_df.parquet")
            assert df["frame"].tolist() == [800, 1600]
            session_spec = storage.read_json(f"{predir}/ppo_cartpole_t{t}_s{s}_spec.json")
            assert session_spec["agent"]["algorithm"]["gamma"] == [0.9, 0.99][t]
    exp = storage.read_parquet(f"{predir}/info/experiment_df.parquet")
    assert len(exp) == 2 and sorted(exp["agent.algorithm.gamma"]) == [0.9, 0.99]
    assert set(exp["status"]) == {"done"} and (exp["frame"] == 1600).all()
    assert exp["strength"].is_monotonic_decreasing
    for t in (0, 1):  # the trial's metrics are the mean over its sessions' final rows
        finals = [storage.read_parquet(f"{predir}/t{t}/s{s}/train_df.parquet")["total_reward_ma"].iloc[-1]
                  for s in (0, 1)]
        assert exp.set_index("trial").loc[t, "total_reward_ma"] == pytest.approx(sum(finals) / 2)
    assert storage.read_bytes(f"{predir}/graph/ppo_cartpole_experiment_graph.png")[:4] == b"\x89PNG"
    best_t = int(exp["trial"].iloc[0])
    best = load_spec(f"{predir}/ppo_cartpole_best_spec.json", "ppo_cartpole")
    assert best["search"] == {} and best["agent"]["algorithm"]["gamma"] == [0.9, 0.99][best_t]
    assert best["meta"]["random_seed"] == 11 + 1000 * best_t
    assert storage.exists(f"{predir}/tune/ppo_cartpole/tuner.pkl")


def test_sigkill_driver_then_search_latest(ray_local, tmp_path):
    data = f"file://{tmp_path}/data"
    items = SMALL + ["meta.max_session=2", "env.max_frame=5600", GAMMA_GRID]
    driver = start_driver([SPECS, "ppo_cartpole", "search", "--data-dir", data, "--max-concurrent-trials", "1",
                           *overrides(items)], tmp_path)

    def t0_analyzed_and_t1_checkpointed() -> bool:  # the driver analyzes t0 once it is done
        t0 = list(tmp_path.glob("data/*/info/t0_trial_metrics.json"))
        t1 = {m.parents[2].name for m in tmp_path.glob("data/*/t1/s*/ckpt/0*/MANIFEST.json")}
        return bool(t0) and t1 == {"s0", "s1"}

    kill_driver_when(driver, t0_analyzed_and_t1_checkpointed, 240, "t0 analyzed and t1 checkpointed")
    predir = only_predir(tmp_path / "data")
    killed_at = {s: max(int(p.name) for p in (predir / f"t1/s{s}/ckpt").glob("0*")) for s in (0, 1)}
    assert min(killed_at.values()) < 5600, "the driver was killed after t1 finished"

    def t0_files():
        outside = [*predir.glob("ppo_cartpole_t0*_spec.json"), *predir.glob("graph/ppo_cartpole_t0_*"),
                   predir / "info/t0_trial_metrics.json"]  # t0's analysis, written by the driver when t0 ended
        return {**files_digest(predir / "t0"), **{p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                                                  for p in outside}}

    before = t0_files()
    assert len(before) > 10

    assert run_cli(SPECS, "ppo_cartpole", "search@latest", "--data-dir", data, *overrides(items)) == 0
    assert sorted(p.name for p in predir.glob("t[0-9]*")) == ["t0", "t1"]
    assert "s0/session_metrics.json" in before and "ppo_cartpole_t0_trial_graph.png" in before
    assert t0_files() == before, "search@ changed a file of the finished trial t0"
    exp = pd.read_parquet(predir / "info/experiment_df.parquet")
    assert len(exp) == 2 and set(exp["status"]) == {"done"} and (exp["frame"] == 5600).all()
    run = storage.read_json(str(predir / "t1/run.json"))
    from_frames = run["resumes"][-1]["from_frames"]  # a session that finished before the kill is not resumed
    assert {f"t1_s{s}": killed_at[s] for s in (0, 1) if killed_at[s] < 5600}.items() <= from_frames.items()
    assert all(from_frames[k] == killed_at[int(k[-1])] for k in from_frames)
    for s in (0, 1):
        assert run["sessions"][f"t1_s{s}"]["status"] == "done"
        assert_continuous(pd.read_parquet(predir / f"t1/s{s}/train_df.parquet"), 800, 5600)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGUSR1], ids=["SIGINT", "SIGTERM", "SIGUSR1"])
def test_signal_stops_the_search_and_search_latest_finishes_it(ray_local, tmp_path, capsys, sig):
    """Ctrl-C / SIGTERM / SIGUSR1 (Tune's own stop; SLURM's ``--signal=B:USR1@N``) while t0 trains: the search stops
    (exit 75, the resume command printed), the unfinished trial stays ``running`` (not ``stopped``, which ``search@``
    never resumes), and ``search@latest`` then runs every trial to ``max_frame``."""
    data = str(tmp_path / "data")
    items = SMALL + ["meta.max_session=1", "env.max_frame=4800", GAMMA_GRID]

    def signal_at_first_checkpoint():
        deadline = time.time() + 180
        while time.time() < deadline and not list(tmp_path.glob("data/*/t0/s0/ckpt/0*/MANIFEST.json")):
            time.sleep(0.05)
        os.kill(os.getpid(), sig)

    sender = threading.Thread(target=signal_at_first_checkpoint, daemon=True)
    sender.start()
    code = run_cli(SPECS, "ppo_cartpole", "search", "--data-dir", data, "--max-concurrent-trials", "1",
                   *overrides(items))
    sender.join(timeout=5)
    out, err = capsys.readouterr()
    assert f"{signal.Signals(sig).name}: stopping the search" in err and "Traceback" not in err
    assert code == EXIT_RESUMABLE and "search interrupted:" in out and "search@" in out
    predir = only_predir(tmp_path / "data")
    statuses = {p.parent.name: storage.read_json(str(p))["status"] for p in predir.glob("t*/trial.json")}
    assert "stopped" not in statuses.values() and statuses.get("t0") in ("running", "done"), statuses
    assert "running" in statuses.values() or len(statuses) < 2, f"the search ended before the signal: {statuses}"

    assert run_cli(SPECS, "ppo_cartpole", "search@latest", "--data-dir", data, "--max-concurrent-trials", "1",
                   *overrides(items)) == 0
    exp = pd.read_parquet(predir / "info/experiment_df.parquet")
    assert len(exp) == 2 and set(exp["status"]) == {"done"} and (exp["frame"] == 4800).all()
    for t in (0, 1):
        assert_continuous(pd.read_parquet(predir / f"t{t}/s0/train_df.parquet"), 800, 4800)


def test_asha_stops_a_learning_rate_of_zero(ray_local, tmp_path):
    data = f"file://{tmp_path}/data"
    # one rung at 3200 frames, where lr 0.003 is well past random play (deterministic seeds)
    items = SMALL + ["meta.max_session=1", "env.max_frame=4800",
                     'meta.search_scheduler={"name": "ASHA", "grace_period": 3200, "reduction_factor": 2}',
                     'search={"agent.net.optim_spec.lr__grid_search": [0.003, 0.0]}']
    assert run_cli(SPECS, "ppo_cartpole", "search", "--data-dir", data, "--max-concurrent-trials", "1",
                   *overrides(items)) == 0
    predir = only_predir(tmp_path / "data")
    exp = pd.read_parquet(predir / "info/experiment_df.parquet").set_index("agent.net.optim_spec.lr")
    assert exp.loc[0.003, "status"] == "done" and exp.loc[0.003, "frame"] == 4800
    assert exp.loc[0.0, "status"] == "stopped" and exp.loc[0.0, "frame"] < 4800
    assert exp.loc[0.003, "total_reward_ma"] > exp.loc[0.0, "total_reward_ma"]
    best = load_spec(str(predir / "ppo_cartpole_best_spec.json"), "ppo_cartpole")
    assert best["agent"]["net"]["optim_spec"]["lr"] == 0.003

    # search@ with max_frame raised: a new Tuner regenerates the same t0, t1 (Tune's state is not
    # reused); the done t0 continues from its checkpoint, the stopped t1 stays as it is
    # the stopped trial's session actors, and its Tune trial actor, end asynchronously after Tune stops the trial;
    # on the tests' shared Ray one may still commit, prune or write t1/run.json after `search` returned: take
    # t1's files once its sessions' processes (pids in t1/run.json) have exited and its files settled. A
    # session killed in the middle of a commit leaves `.staging-*` debris, and one killed in the middle of a prune
    # leaves a checkpoint dir whose manifest is already deleted; search@'s garbage collection deletes both
    # (docs/ARCHITECTURE.md section 4): debris is not compared
    pids = [entry["pid"] for entry in storage.read_json(str(predir / "t1/run.json"))["sessions"].values()]
    deadline = time.monotonic() + 60
    while any(pid_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.5)

    def t1_files() -> dict[str, str]:
        digest = files_digest(predir / "t1")
        committed = {k.rsplit("/", 1)[0] for k in digest if k.endswith("/MANIFEST.json")}
        return {k: v for k, v in digest.items()
                if "/.staging-" not in k and ("/ckpt/" not in k or k.rsplit("/", 1)[0] in committed)}

    stopped = t1_files()
    while time.monotonic() < deadline:
        time.sleep(3)
        if (now := t1_files()) == stopped:
            break
        stopped = now
    longer = [i.replace("env.max_frame=4800", "env.max_frame=5600") for i in items]
    assert run_cli(SPECS, "ppo_cartpole", f"search@{predir}", "--data-dir", data, *overrides(longer)) == 0
    assert t1_files() == stopped
    assert sorted(p.name for p in predir.glob("t[0-9]*")) == ["t0", "t1"]
    assert_continuous(pd.read_parquet(predir / "t0/s0/train_df.parquet"), 800, 5600)
    again = pd.read_parquet(predir / "info/experiment_df.parquet").set_index("agent.net.optim_spec.lr")
    assert again["status"].to_dict() == {0.003: "done", 0.0: "stopped"}
    assert again["frame"].to_dict() == {0.003: 5600, 0.0: exp.loc[0.0, "frame"]}
    assert storage.read_json(str(predir / "ppo_cartpole_t0_spec.json"))["env"]["max_frame"] == 5600


def test_trial_actors_import_no_torch(ray_local, tmp_path):
    """A Tune trial actor starts its session actors first and has one of them check its variant
    (``SessionActor.check_spec``), so its own process never maps torch."""
    seen: dict[int, bool] = {}  # Tune trial actor pid -> libtorch mapped in its process
    done = threading.Event()

    def watch_trial_actors():
        while not done.is_set():
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        if b"ImplicitFunc" not in f.read():
                            continue
                    with open(f"/proc/{pid}/maps") as f:
                        seen[int(pid)] = seen.get(int(pid), False) or "libtorch" in f.read()
                except OSError:
                    continue
            time.sleep(0.05)

    watcher = threading.Thread(target=watch_trial_actors, daemon=True)
    watcher.start()
    try:
        code = run_cli(SPECS, "ppo_cartpole", "search", "--data-dir", str(tmp_path / "data"), "--quiet",
                       *overrides(SMALL + ["meta.max_session=1", "env.max_frame=800", GAMMA_GRID]))
    finally:
        done.set()
        watcher.join(5)
    assert code == 0
    predir = only_predir(tmp_path / "data")
    assert [storage.read_json(str(predir / f"t{t}/trial.json"))["status"] for t in (0, 1)] == ["done", "done"]
    assert seen and not any(seen.values()), seen  # trial actors ran, none with torch


def test_an_empty_session_actor_checks_a_spec_as_the_driver_does(ray_local):
    import ray
    from ray.exceptions import RayTaskError

    from orchestrator.session_actor import SessionActor
    from orchestrator.spec.load import check

    spec = load_spec(SPECS, "ppo_cartpole", SMALL)
    bad = {**spec, "agent": {**spec["agent"], "net": {**spec["agent"]["net"], "hid_layers_activation": "nosuch"}}}
    host = SessionActor.options(num_cpus=0.5).remote()
    try:
        assert ray.get(host.check_spec.remote(spec)) == check(spec)
        with pytest.raises(RayTaskError) as err:
            ray.get(host.check_spec.remote(bad))
        assert isinstance(err.value.cause, SpecError)
        assert "agent.net.hid_layers_activation: unknown name 'nosuch'" in str(err.value.cause)
    finally:
        ray.kill(host)
