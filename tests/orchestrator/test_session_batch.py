"""``meta.session_batch``: a trial's sessions in seed groups (one actor per group), each still its own session; a
killed driver or a killed group actor resumes equal to the uninterrupted batched run; refusals by name."""

import os
import signal
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from lab_helpers import (
    SPECS,
    descendants,
    files_digest,
    kill_driver_when,
    kill_pids,
    only_predir,
    overrides,
    run_cli,
    start_driver,
)

from orchestrator.errors import EXIT_RESUMABLE, SpecError
from orchestrator.store import storage
from orchestrator.store.checkpoint import CheckpointStore

COMPARED = lambda df: df.drop(columns=["wall_t", "fps"]).reset_index(drop=True)  # noqa: E731
PPO = ["meta.max_session=3", "meta.session_batch=2", "meta.random_seed=10", "env.num_envs=4",
       "meta.log_frequency=256", "meta.checkpoint_frequency=512", "agent.algorithm.time_horizon=32",
       "agent.algorithm.training_epoch=2", "meta.tensorboard=false"]
A2C = ["meta.max_session=2", "meta.session_batch=2", "meta.random_seed=11", "env.num_envs=4", "env.max_frame=2048",
       "meta.log_frequency=256", "meta.checkpoint_frequency=512", "meta.tensorboard=false"]


def reference(name: str, items: list[str]) -> tuple[list[pd.DataFrame], list[dict[str, str]]]:
    """train_df and weights_sha256 of every session of the uninterrupted batched run, in-process: the sessions
    [0, 1] as one ``SessionGroup``, a remainder session 2 alone."""
    import torch

    from orchestrator.session.batched import SessionGroup
    from orchestrator.session.loop import Session
    from orchestrator.spec.load import load_spec
    from orchestrator.store.predir import session_seed

    torch.set_num_threads(1)
    spec = load_spec(SPECS, name, items)
    seeds = [session_seed(spec["meta"]["random_seed"], 0, s) for s in range(spec["meta"]["max_session"])]
    group = SessionGroup(spec, seeds[:2], sessions=[0, 1])
    group.run_rl()
    sessions = list(group.sessions)
    if len(seeds) > 2:
        sessions.append(Session(spec, seeds[2], 0, 2))
        sessions[-1].run_rl()
    return [s.train_df for s in sessions], [s.weights_sha256() for s in sessions]


def assert_equals_reference(predir: Path, ref: tuple[list[pd.DataFrame], list[dict[str, str]]], max_frame: int,
                            batched: list[int | None]) -> None:
    """Every session's train_df (but wall_t, fps) and final weights_sha256 equal the reference's; its manifests say
    whether it ran batched (``batched``: K per session, None alone)."""
    for s, (df, sha) in enumerate(zip(*ref)):
        got = pd.read_parquet(predir / f"t0/s{s}/train_df.parquet")
        pd.testing.assert_frame_equal(COMPARED(df), COMPARED(got))
        manifest, _ = CheckpointStore(str(predir / f"t0/s{s}")).load(max_frame)
        assert manifest.meta["weights_sha256"] == sha, s
        assert manifest.meta.get("batched") == batched[s], s
        if batched[s]:
            assert manifest.meta["batch_sessions"] == [0, 1] and manifest.meta["exact"] is True


def committed(predir_glob, key: str, frame: int) -> bool:
    """Whether a checkpoint at ``frame`` or later is committed for session ``key`` (``t0/s0``)."""
    return any(int(m.parent.name) >= frame for m in predir_glob(f"{key}/ckpt/0*/MANIFEST.json"))


PPO_RUN = [*PPO, "env.max_frame=6144"]


@pytest.fixture(scope="module")
def ppo_reference():
    """The uninterrupted batched run of ``PPO_RUN`` (``reference``)."""
    return reference("ppo_cartpole", PPO_RUN)


def test_seed_groups_pack_consecutive_sessions_with_a_remainder_and_passengers():
    from orchestrator.spec.meta import MetaSpec
    from orchestrator.store.record import SessionPlan
    from orchestrator.trial import seed_groups

    plans = [SessionPlan(0, s, 100 + s, False) for s in range(5)]
    groups = seed_groups(plans, MetaSpec(max_session=5, session_batch=2))
    assert {k: ([p.session for p in members], passengers) for k, (members, passengers) in groups.items()} == \
        {"t0_s0": ([0, 1], []), "t0_s2": ([2, 3], [])}  # session 4: a remainder of one is a plain session
    assert seed_groups(plans, MetaSpec(max_session=5, session_batch=1)) == {}
    assert list(seed_groups(plans, MetaSpec(max_session=5, session_batch=8))) == ["t0_s0"]  # one group of all
    resumed = [plans[0], plans[3], plans[4]]  # sessions 1 and 2 are at max_frame
    groups = seed_groups(resumed, MetaSpec(max_session=5, session_batch=2))
    assert {k: ([p.session for p in members], passengers) for k, (members, passengers) in groups.items()} == \
        {"t0_s0": ([0], [1]), "t0_s3": ([3], [2])}


def test_driver_sigkilled_then_the_same_command_resumes_equal_to_the_uninterrupted_batched_run(ray_local, tmp_path,
                                                                                               ppo_reference):
    items = PPO_RUN
    data = tmp_path / "data"
    argv = [SPECS, "ppo_cartpole", "train", "--name", "grouped", "--data-dir", str(data), *overrides(items)]
    driver = start_driver(argv, tmp_path)
    predir = data / "grouped"
    kill_driver_when(driver, lambda: all(committed(predir.glob, f"t0/s{s}", 2048) for s in range(2)), 300,
                     "the group's sessions at frame 2048")
    frames = {s: max(int(m.parent.name) for m in predir.glob(f"t0/s{s}/ckpt/0*/MANIFEST.json")) for s in range(2)}
    assert all(2048 <= f < 6144 for f in frames.values()), frames  # the group killed mid-run
    assert run_cli(*argv) == 0
    assert_equals_reference(predir, ppo_reference, 6144, [2, 2, None])
    run = storage.read_json(str(predir / "run.json"))
    assert all(run["sessions"][f"t0_s{s}"]["status"] == "done" for s in range(3))
    assert run["sessions"]["t0_s0"]["pid"] == run["sessions"]["t0_s1"]["pid"] != run["sessions"]["t0_s2"]["pid"]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_killed_group_actor_restarts_its_sessions_from_their_common_checkpoint(ray_local, tmp_path, ppo_reference, sig):
    """SIGKILL: the group restarts from its sessions' newest common checkpoint, each counting the restart. SIGTERM
    (a node shutting down): the group commits every session at once and moves (``cause: preempted``)."""
    items = PPO_RUN
    data = tmp_path / "data"
    result = []
    thread = threading.Thread(target=lambda: result.append(run_cli(
        SPECS, "ppo_cartpole", "train", "--data-dir", str(data), *overrides(items))), daemon=True)
    thread.start()
    deadline, pid = time.time() + 300, None
    while time.time() < deadline and pid is None:
        runs = list(data.glob("*/run.json"))
        try:
            entry = storage.read_json(str(runs[0]))["sessions"]["t0_s1"] if runs else {}
        except (ValueError, FileNotFoundError, KeyError):
            entry = {}
        if entry.get("pid") and entry.get("status") == "running" and entry.get("checkpoint", 0) >= 2048:
            pid = entry["pid"]
        time.sleep(0.05)
    assert pid is not None, "the group did not reach frame 2048"
    os.kill(pid, sig)  # the group actor's process (sessions 0 and 1)
    thread.join(timeout=300)
    assert result == [0]
    predir = only_predir(data)
    run = storage.read_json(str(predir / "run.json"))
    s0, s1, s2 = (run["sessions"][f"t0_s{s}"] for s in range(3))
    assert s0["pid"] == s1["pid"] != pid  # one new actor for the group
    for entry in (s0, s1):
        (restart,) = entry["restarts"]
        assert restart["frame_restored"] >= 2048
        if sig == signal.SIGKILL:
            assert restart["reason"] == "ActorDiedError" and "cause" not in restart
        else:
            assert restart["reason"] == "SIGTERM" and restart["cause"] == "preempted" and restart["frames_lost"] == 0
    assert s0["restarts"][0]["frame_restored"] == s1["restarts"][0]["frame_restored"]
    assert s2["restarts"] == [] and s2["status"] == "done"
    assert_equals_reference(predir, ppo_reference, 6144, [2, 2, None])


def test_sigterm_commits_every_session_of_the_group_then_train_at_resumes_equal(ray_local, tmp_path, ppo_reference):
    data = tmp_path / "data"
    driver = start_driver([SPECS, "ppo_cartpole", "train", "--data-dir", str(data), *overrides(PPO_RUN)], tmp_path,
                          capture=True)
    try:
        deadline = time.time() + 300
        while not (all(committed(data.glob, f"*/t0/s{s}", 1024) for s in range(2))
                   and committed(data.glob, "*/t0/s2", 1)):  # the lone session started too (else: not started)
            assert driver.poll() is None and time.time() < deadline, "the group did not reach frame 1024"
            time.sleep(0.05)
        driver.send_signal(signal.SIGTERM)
        out, _ = driver.communicate(timeout=120)
    finally:
        kill_pids([driver.pid, *descendants(driver.pid)])
    assert driver.returncode == EXIT_RESUMABLE
    predir = only_predir(data)
    run = storage.read_json(str(predir / "run.json"))
    s0, s1 = run["sessions"]["t0_s0"], run["sessions"]["t0_s1"]
    assert s0["status"] == s1["status"] == "interrupted" and s0["checkpoint"] == s1["checkpoint"] < 6144
    assert "resume with:" in out
    assert run_cli(SPECS, "ppo_cartpole", f"train@{predir}", "--data-dir", str(data), *overrides(PPO_RUN)) == 0
    assert_equals_reference(predir, ppo_reference, 6144, [2, 2, None])


def test_a2c_runs_batched_a_changed_session_batch_is_refused_and_a_passenger_resume_is_exact(ray_local, tmp_path,
                                                                                              capsys, monkeypatch):
    """``session_batch: auto`` on a cluster that fits one session actor picks 2 for 2 sessions and saves it; a
    resume given ``auto`` keeps it, one given another number is refused; a passenger resume is exact."""
    import orchestrator.session_hosts

    monkeypatch.setattr(orchestrator.session_hosts, "capacity", lambda key: 1)
    data = tmp_path / "data"
    auto = [*A2C, "meta.session_batch=auto"]
    assert run_cli(SPECS, "a2c_gae_cartpole", "train", "--data-dir", str(data), *overrides(auto)) == 0
    assert "meta.session_batch auto: 2 (2 session(s) of 1 trial(s) at once, 1 session actor(s) of 1 CPU fit the " \
           "Ray cluster)" in capsys.readouterr().out
    predir = only_predir(data)
    assert storage.read_json(str(predir / "a2c_gae_cartpole_spec.json"))["meta"]["session_batch"] == 2
    ref = reference("a2c_gae_cartpole", A2C)
    assert_equals_reference(predir, ref, 2048, [2, 2])
    assert run_cli(SPECS, "a2c_gae_cartpole", f"train@{predir}", "--data-dir", str(data),
                   *overrides([*A2C, "meta.session_batch=1", "env.max_frame=4096"])) == 2
    assert "meta.session_batch: the run was saved with 2, the spec gives 1" in capsys.readouterr().err
    # killed between the group's final commits: session 1 resumes from frame 1536 with session 0 as a passenger
    import shutil

    shutil.rmtree(predir / "t0/s1/ckpt/000000002048")
    before = files_digest(predir / "t0/s0/ckpt")
    assert run_cli(SPECS, "a2c_gae_cartpole", f"train@{predir}", "--data-dir", str(data), *overrides(auto)) == 0
    assert_equals_reference(predir, ref, 2048, [2, 2])
    assert files_digest(predir / "t0/s0/ckpt") == before  # the passenger wrote nothing
    run = storage.read_json(str(predir / "run.json"))
    assert run["resumes"][-1]["from_frames"] == {"t0_s1": 1536}


def test_an_algorithm_that_cannot_run_batched_is_refused_by_name_before_any_run_dir(ray_local, tmp_path, capsys):
    data = tmp_path / "data"
    assert run_cli(SPECS, "sarsa_cartpole", "train", "--data-dir", str(data),
                   *overrides(["meta.session_batch=2", "env.max_frame=1000"])) == 2
    err = capsys.readouterr().err
    assert "meta.session_batch: 2 needs an agent that runs with seeds batched" in err and "SARSA" in err
    assert not data.exists() or not [p for p in data.iterdir() if not p.name.startswith(".")]


def test_session_batch_refusals_of_the_spec():
    """Spec-level refusals: an unbatched agent, meta.distributed, and a raised max_session that
    would join a saved remainder group; session_batch 1 and a raise from a multiple of K pass."""
    from orchestrator.spec.load import load_spec
    from orchestrator.spec.pbt import population_problems
    from orchestrator.spec.resume import resume_edits

    with pytest.raises(SpecError, match="meta.session_batch: 2 needs .*agent.algorithm.name 'SARSA'"):
        load_spec(SPECS, "sarsa_cartpole", ["meta.session_batch=2"])
    with pytest.raises(SpecError, match="meta.session_batch: 2 cannot run with meta.distributed"):
        load_spec(SPECS, "a2c_gae_cartpole", ["meta.session_batch=2", "meta.distributed=synced"])
    assert population_problems({"max_trial": 4, "session_batch": 2}, []) == []  # a PBT population runs batched
    saved = load_spec(SPECS, "ppo_cartpole", ["meta.session_batch=2", "meta.max_session=3"])
    _, _, conflicts = resume_edits(saved, load_spec(SPECS, "ppo_cartpole", ["meta.session_batch=2",
                                                                            "meta.max_session=4"]))
    assert conflicts and conflicts[0].startswith("meta.max_session: the run was saved with 3, the spec gives 4")
    saved = load_spec(SPECS, "ppo_cartpole", ["meta.session_batch=2", "meta.max_session=2"])
    _, applied, conflicts = resume_edits(saved, load_spec(SPECS, "ppo_cartpole", ["meta.session_batch=2",
                                                                                  "meta.max_session=4"]))
    assert conflicts == [] and applied == ["meta.max_session: 2 -> 4"]


def test_session_batch_auto_picks_seeds_per_actor_from_the_slots_and_1_where_batching_is_refused(monkeypatch, capsys):
    """``resolve_session_batch``: ceil(sessions x trials / slots), at most max_session (a PBT population too); 1
    where every seed has a slot, for one session and for an agent that cannot run batched; a number is left."""
    import orchestrator.session_hosts
    from orchestrator.modes.common import resolve_session_batch
    from orchestrator.spec.load import load_spec

    slots = {"n": 2}
    monkeypatch.setattr(orchestrator.session_hosts, "capacity", lambda key: slots["n"])

    def picked(name: str, items: list[str], trials: int = 1) -> int:
        spec = load_spec(SPECS, name, ["meta.session_batch=auto", *items])
        assert resolve_session_batch(spec, trials) == spec["meta"]["session_batch"]
        return spec["meta"]["session_batch"]

    assert picked("ppo_cartpole", ["meta.max_session=8"]) == 4
    assert "meta.session_batch auto: 4 (8 session(s) of 1 trial(s) at once, 2 session actor(s) of 1 CPU" \
        in capsys.readouterr().out
    assert picked("ppo_cartpole", ["meta.max_session=3"], trials=3) == 3  # ceil(9 / 2) = 5, at most max_session
    slots["n"] = 4
    assert picked("ppo_cartpole", ["meta.max_session=3"], trials=2) == 2  # ceil(6 / 4)
    assert picked("ppo_cartpole", ["meta.max_session=4"]) == 1  # a slot for every seed
    slots["n"] = 1
    assert picked("ppo_cartpole", ["meta.max_session=1"]) == 1
    assert picked("sarsa_cartpole", ["meta.max_session=4"]) == 1
    assert "auto: 1 (needs an agent that runs with seeds batched: agent.algorithm.name 'SARSA' does not" \
        in capsys.readouterr().out
    pbt = ('meta.search_scheduler={"name": "PBT", "perturbation_interval": 4096}', "meta.max_trial=2",
           'search={"agent": {"net": {"optim_spec": {"lr__uniform": [0.001, 0.01]}}}}', "meta.max_session=2")
    spec = load_spec(SPECS, "ppo_cartpole", ["meta.session_batch=auto", *pbt], search=True)
    assert resolve_session_batch(spec, 2) == 2  # a PBT population's trials run at once: 4 seeds, 1 slot
    assert "auto: 2 (4 session(s) of 2 trial(s) at once" in capsys.readouterr().out
    spec = load_spec(SPECS, "ppo_cartpole", ["meta.session_batch=3", "meta.max_session=4"])
    assert resolve_session_batch(spec) is None and spec["meta"]["session_batch"] == 3
    with pytest.raises(SpecError, match=r"meta.session_batch: expected a number or one of \['auto'\], got 'max'"):
        load_spec(SPECS, "ppo_cartpole", ["meta.session_batch=max"])


def test_a_plain_search_runs_each_trials_sessions_in_seed_groups(ray_local, tmp_path):
    """A search trial packs its sessions as a train run does: its group's sessions equal the uninterrupted group of
    the trial's spec and seeds, and its placement group holds one bundle per session actor (2 here, not 3)."""
    from orchestrator.search.tune import placement
    from orchestrator.spec.meta import MetaSpec

    items = [*A2C, "meta.max_session=3", "env.max_frame=1024", 'meta.resources={"num_cpus": 0.5, "num_gpus": 0}']
    search = 'search={"agent": {"algorithm": {"gamma__grid_search": [0.95]}}}'
    data = tmp_path / "data"
    assert run_cli(SPECS, "a2c_gae_cartpole", "search", "--data-dir", str(data), *overrides([*items, search])) == 0
    ref = reference("a2c_gae_cartpole", [*items, "agent.algorithm.gamma=0.95"])
    assert_equals_reference(only_predir(data), ref, 1024, [2, 2, None])
    assert len(placement(MetaSpec(max_session=3, session_batch=2)).bundles) == 2  # the empty head bundle not listed


DQN = ["meta.max_session=2", "meta.session_batch=2", "meta.random_seed=12", "env.num_envs=2",
       "meta.log_frequency=256", "meta.checkpoint_frequency=512", "agent.memory.checkpoint=true",
       "meta.tensorboard=false"]


def test_dqn_runs_batched_through_the_trial_and_a_raised_max_frame_continues_exactly(ray_local, tmp_path):
    """An off-policy group (DQN, per-seed replays stored in the checkpoints): a ``train`` to 1,024 frames, then
    ``train@`` raised to 2,048, equals the uninterrupted batched run to 2,048 seed by seed."""
    data = tmp_path / "data"
    assert run_cli(SPECS, "dqn_cartpole", "train", "--data-dir", str(data),
                   *overrides([*DQN, "env.max_frame=1024"])) == 0
    predir = only_predir(data)
    assert run_cli(SPECS, "dqn_cartpole", f"train@{predir}", "--data-dir", str(data),
                   *overrides([*DQN, "env.max_frame=2048"])) == 0
    assert_equals_reference(predir, reference("dqn_cartpole", [*DQN, "env.max_frame=2048"]), 2048, [2, 2])
