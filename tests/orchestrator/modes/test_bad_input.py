"""Bad input: every case exits 2 with one clear message (no traceback) and leaves an existing run
directory byte-identical."""

import shutil
import sys

import pytest
from lab_helpers import SPECS, files_digest, only_predir, overrides, run_cli

ITEMS = ["meta.max_session=2", "meta.log_frequency=400", "meta.random_seed=3", "env.max_frame=800"]
LONGER = ITEMS[:-1] + ["env.max_frame=1600"]


@pytest.fixture(scope="module")
def existing_run(ray_local, tmp_path_factory):
    """A finished 2-session run whose session 1 lost its checkpoints (for the --allow-fresh case)."""
    root = tmp_path_factory.mktemp("bad_input")
    data = root / "data"
    assert run_cli(SPECS, "ppo_cartpole", "train", "--data-dir", str(data), *overrides(ITEMS)) == 0
    predir = only_predir(data)
    shutil.rmtree(predir / "t0/s1/ckpt")
    return root, data, predir


def write(root, name, text):
    path = root / name
    path.write_text(text)
    return str(path)


CASES = [
    # (id, argv builder, expected fragments of the message)
    ("spec file missing", lambda r, d, p: ["nope.json", "x", "train"], ["nope.json", "does not exist"]),
    ("not JSON", lambda r, d, p: [write(r, "bad.json", "{oops"), "x", "train"], ["not valid JSON", "line 1"]),
    ("YAML error", lambda r, d, p: [write(r, "bad.yaml", "a:\n  b: [1, 2\nc: 3\n"), "x", "train"],
     ["not valid YAML", "line"]),
    ("spec name not in file", lambda r, d, p: [SPECS, "ppo_cartpol", "train"],
     ["'ppo_cartpol' is not in", "ppo_cartpole", "dqn_cartpole"]),
    ("unknown key", lambda r, d, p: [SPECS, "ppo_cartpole", "train", "-s", "agent.net.hid_layer=[8]"],
     ["agent.net.hid_layer", "did you mean 'hid_layers'"]),
    ("wrong type", lambda r, d, p: [SPECS, "ppo_cartpole", "train", "-s", "meta.max_session=two"],
     ["meta.max_session", "expected int"]),
    ("out of range", lambda r, d, p: [SPECS, "ppo_cartpole", "train", "-s", "agent.algorithm.gamma=1.5"],
     ["agent.algorithm.gamma", "<= 1"]),
    ("precision on an MLP", lambda r, d, p: [SPECS, "ppo_cartpole", "train", "-s", "agent.net.precision=bfloat16"],
     ["agent.net.precision", "ConvNet", "not 'MLPNet'"]),
    ("train@ missing predir", lambda r, d, p: [SPECS, "ppo_cartpole", f"train@{d}/ppo_cartpole_2020_01_01_000000"],
     ["does not exist"]),
    ("train@ run of another spec", lambda r, d, p: [SPECS, "dqn_cartpole", f"train@{p}"],
     ["is a run of 'ppo_cartpole'", "not of 'dqn_cartpole'"]),
    ("train@ session without checkpoint", lambda r, d, p: [SPECS, "ppo_cartpole", f"train@{p}",
                                                            *overrides(LONGER)],
     ["no committed checkpoint", "t0_s1", "--allow-fresh"]),
    ("data dir not writable", lambda r, d, p: [SPECS, "ppo_cartpole", "train", "--data-dir",
                                               f"{p}/run.json/sub"], ["cannot"]),
    ("resources never fit", lambda r, d, p: [SPECS, "ppo_cartpole", "train", "--data-dir", str(d),
                                             "-s", "meta.resources={\"num_cpus\": 64}"],
     ["num_cpus=64", "can never fit"]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_exits_2_and_changes_nothing(existing_run, case, capsys):
    root, data, predir = existing_run
    _, argv, fragments = case
    before = files_digest(data)
    capsys.readouterr()
    code = run_cli(*argv(root, data, predir))
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and err.startswith("error:")
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    assert files_digest(data) == before


def test_s3_bucket_that_does_not_exist_fails_fast(existing_run, s3_server, capsys):
    import time
    start = time.time()
    code = run_cli(SPECS, "ppo_cartpole", "train", "--data-dir", "s3://no-such-bucket-lab/runs")
    assert code == 2 and time.time() - start < 30
    err = capsys.readouterr().err
    assert "no-such-bucket-lab" in err and "Traceback" not in err


def test_allow_fresh_starts_the_session_without_checkpoint(existing_run):
    root, data, predir = existing_run
    copy = data.parent / "copy" / predir.name
    shutil.copytree(predir, copy)
    assert run_cli(SPECS, "ppo_cartpole", f"train@{copy}", "--allow-fresh",
                   *overrides(LONGER)) == 0
    import pandas as pd
    for s in (0, 1):
        assert pd.read_parquet(copy / f"t0/s{s}/train_df.parquet")["frame"].tolist() == [400, 800, 1200, 1600]


# ---------------------------------------------------------------- preflight (no Ray, no run directory)

def dqn_dev(data, mode, *items):
    """``lab cartpole.json dqn_cartpole MODE --data-dir data -s ...`` in-process."""
    return run_cli(SPECS, "dqn_cartpole", mode, "--data-dir", str(data), *overrides(list(items)))


def session_spec_file(tmp_path, *items):
    """A session spec file (as a run writes it) of dqn_cartpole with ``items`` applied, for enjoy@."""
    import json

    from orchestrator.spec.load import load_spec
    spec = load_spec(SPECS, "dqn_cartpole", list(items))
    spec["meta"].update({"trial": 0, "session": 0, "session_seed": 1, "session_dir": "t0/s0"})
    path = tmp_path / "dqn_cartpole_t0_s0_spec.json"
    path.write_text(json.dumps(spec))
    return str(path)


LUNAR = "env.name=LunarLander-v3"


def hide_package(monkeypatch, package: str, *importers: str) -> None:
    """Make ``import package`` fail for this test, as on a machine without it: the package and the
    modules that import it are dropped from ``sys.modules`` (restored afterwards by monkeypatch)."""
    for name in list(sys.modules):
        if any(name == p or name.startswith(p + ".") for p in (package, *importers)):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, package, None)  # None in sys.modules: the import raises ImportError
SEARCH = 'search={"agent": {"algorithm": {"gamma__choice": [0.9, 0.99]}}}'


@pytest.mark.parametrize("mode", ["dev", "train", "train@latest", "search", "search@latest", "enjoy@"])
def test_missing_env_dependency_exits_2_with_the_pip_command(tmp_path, capsys, monkeypatch, mode):
    """Box2D hidden: every mode names the env and the pip command, creates nothing."""
    hide_package(monkeypatch, "Box2D", "gymnasium.envs.box2d")
    data = tmp_path / "data"
    extra = [SEARCH] if mode.startswith("search") else []
    if mode == "enjoy@":
        mode += session_spec_file(tmp_path, LUNAR)
    capsys.readouterr()
    code = dqn_dev(data, mode, LUNAR, "env.max_frame=200", *extra)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error:") and "Traceback" not in err
    assert "env.name" in err and "LunarLander-v3" in err and 'pip install "gymnasium[box2d]"' in err, err
    assert not data.exists()


def test_unknown_env_id_exits_2_naming_it(tmp_path, capsys):
    code = dqn_dev(tmp_path / "data", "dev", "env.name=NoSuchEnv-v9")
    err = capsys.readouterr().err
    assert code == 2 and "env.name" in err and "'NoSuchEnv-v9'" in err and "Traceback" not in err
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("mode, option", [("dev", ["--episodes", "3"]), ("train", ["--episodes", "10"]),
                                          ("search", ["--seed", "1"]), ("dev", ["--record"])])
def test_an_enjoy_option_given_to_another_mode_is_refused(tmp_path, capsys, mode, option):
    code = run_cli(SPECS, "ppo_cartpole", mode, "--data-dir", str(tmp_path / "data"), *option)
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert err.startswith(f"error: {option[0]} applies to enjoy@ only") and f"not to '{mode}'" in err, err
    assert ("-s env.max_frame=N" in err) == (option[0] == "--episodes")
    assert not (tmp_path / "data").exists()


def test_atari_id_without_ale_names_the_package(tmp_path, capsys, monkeypatch):
    hide_package(monkeypatch, "ale_py")
    assert dqn_dev(tmp_path / "data", "dev", "env.name=ALE/Pong-v5") == 2
    err = capsys.readouterr().err
    assert "'ALE/Pong-v5'" in err and "pip install ale-py" in err


MEMORY_CASES = [
    # (override, key named, fragments that must appear); DQN on CartPole: 48 bytes per transition
    ("agent.memory.max_size=1000000000000", "agent.memory.max_size",
     ["1000000000000 transitions x 48 bytes", "needs 48000000000000 bytes (43.7 TiB)", "available"]),
    ("env.num_envs=1000000000000", "env.num_envs", ["1000000000000 sub-envs", "available"]),
    ("agent.net.hid_layers=[1000000000000]", "agent.net.hid_layers",
     ["net [4, 1000000000000, 2]", "needs 112000000000032 bytes", "available"]),
    ("meta.rigorous_eval=1000000000000", "meta.rigorous_eval", ["1000000000000 eval sub-envs", "available"]),
]


@pytest.mark.parametrize("item, key, fragments", MEMORY_CASES, ids=[c[1] for c in MEMORY_CASES])
def test_sizes_no_machine_can_hold_exit_2_naming_key_and_bytes(tmp_path, capsys, item, key, fragments):
    data = tmp_path / "data"
    capsys.readouterr()
    code = dqn_dev(data, "dev", item, "env.max_frame=2000000000000")
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and f"  {key}: " in err, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    assert not data.exists()


def test_replay_too_big_in_train_names_the_share_of_each_session(tmp_path, capsys):
    """Four sessions that need no CPU share this machine's memory."""
    from orchestrator.spec.preflight import available_bytes
    per_session = available_bytes() // 48 // 2  # too big for half the memory, fits the whole
    code = dqn_dev(tmp_path / "data", "train", f"agent.memory.max_size={per_session}", "meta.max_session=4",
                   'meta.resources={"num_cpus": 0}', "env.max_frame=100")
    err = capsys.readouterr().err
    assert code == 2, err
    assert "agent.memory.max_size" in err and "shared by 4 sessions" in err and "Traceback" not in err
    assert not (tmp_path / "data").exists()


def test_training_start_beyond_replay_names_both_keys(tmp_path, capsys):
    assert dqn_dev(tmp_path / "data", "dev", "agent.algorithm.training_start_step=5000",
                   "agent.memory.max_size=1000", "agent.memory.batch_size=32") == 2
    err = capsys.readouterr().err
    assert "agent.algorithm.training_start_step: 5000 transitions" in err and "agent.memory.max_size=1000" in err


def test_num_envs_beyond_max_frame_names_both_keys(tmp_path, capsys):
    assert dqn_dev(tmp_path / "data", "dev", "env.num_envs=64", "env.max_frame=32") == 2
    err = capsys.readouterr().err
    assert "env.num_envs: one vector step of 64 sub-envs" in err and "env.max_frame=32" in err


def test_search_value_no_machine_can_hold_exits_2_before_the_search(tmp_path, capsys):
    search = 'search={"agent.memory.max_size__choice": [1000, 1000000000000]}'
    assert dqn_dev(tmp_path / "data", "search", search) == 2
    err = capsys.readouterr().err
    assert "search agent.memory.max_size=1000000000000: agent.memory.max_size: replay of 1000000000000" in err
    assert "Traceback" not in err and not (tmp_path / "data").exists()


def test_search_value_that_fails_validation_exits_2(tmp_path, capsys):
    search = 'search={"agent.algorithm.training_start_step__randint": [32, 200000]}'
    assert dqn_dev(tmp_path / "data", "search", search) == 2
    err = capsys.readouterr().err
    assert ("search agent.algorithm.training_start_step=199999: agent.algorithm.training_start_step: 199999 "
            "transitions can never be stored") in err
