"""The command line, run as users run it (``python run_lab.py ...`` in a subprocess): exit codes,
one-paragraph errors without tracebacks, and the predir files of a dev run."""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[2]
RUN_LAB = str(REPO / "run_lab.py")
DEMO = str(REPO / "specs" / "demo.json")
DESIGN_COLUMNS = ["frame", "epi", "t", "opt_step", "wall_t", "fps", "total_reward", "total_reward_ma", "loss",
                  "lr", "explore_var", "entropy_coef", "entropy", "grad_norm"]


def lab(cwd, *args, timeout=300):
    """Run ``python run_lab.py ARGS`` in ``cwd`` with one torch thread."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.run([sys.executable, RUN_LAB, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


# Every command of this module, keyed by test; each runs in its own empty directory. They start
# together (most time is the interpreter importing torch), and each test checks its own result.
COMMANDS = {
    "unknown_algorithm": [DEMO, "dqn_cartpole", "dev", "-s", "agent.algorithm.name=DQNN"],
    "name_not_in_file": [DEMO, "dqn_cartpol", "dev"],
    "missing_name_arg": [DEMO, "dqn_cartpole"],
    "spec_file_alone": [DEMO],
    "spec_file_typo": [str(REPO / "specs" / "dmeo.json"), "dqn_cartpole", "dev"],
    "mode_typo": [DEMO, "dqn_cartpole", "trian", "-s", "env.max_frame=100"],
    "env_typo": [DEMO, "dqn_cartpole", "dev", "-s", "env.name=CartPole-v2"],
    "bad_env_id": [DEMO, "dqn_cartpole", "dev", "-s", "env.name=CartPole-v99"],
    "non_json": ["notes.json", "x", "dev"],
    "algo_env_mismatch": [DEMO, "dqn_cartpole", "dev", "-s", "env.name=Pendulum-v1"],
    "dev": [DEMO, "dqn_cartpole", "dev", "-s", "env.max_frame=600", "-s", "meta.log_frequency=200",
            "--quiet"],
    "dev_data_dir": [DEMO, "dqn_cartpole", "dev", "-s", "env.max_frame=600", "--data-dir", "elsewhere/runs",
                     "--quiet"],
    "data_dir_is_file": [DEMO, "dqn_cartpole", "dev", "-s", "env.max_frame=100", "--data-dir", "file-not-dir",
                         "--quiet"],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``{key: (cwd, CompletedProcess)}`` for every command in ``COMMANDS``."""
    cwds = {key: tmp_path_factory.mktemp(key) for key in COMMANDS}
    (cwds["non_json"] / "notes.json").write_text("agent: PPO\n")
    (cwds["data_dir_is_file"] / "file-not-dir").write_text("")
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {key: pool.submit(lab, cwds[key], *args) for key, args in COMMANDS.items()}
        return {key: (cwds[key], f.result()) for key, f in futures.items()}


def assert_usage_error(result, *needles):
    """Exit 2, no traceback, and an ``error:`` message naming the problem."""
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    assert result.stderr.startswith("error: "), result.stderr
    assert "\n\n" not in result.stderr.strip()  # one paragraph
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr)


def test_unknown_algorithm(runs):
    cwd, result = runs["unknown_algorithm"]
    assert_usage_error(result, "agent.algorithm.name: unknown name 'DQNN'", "'DoubleDQN'", "'PPO'")
    assert not (cwd / "data").exists()  # nothing written


def test_spec_name_not_in_file(runs):
    assert_usage_error(runs["name_not_in_file"][1], "spec name 'dqn_cartpol' is not in",
                       "Did you mean 'dqn_cartpole'?")


def test_missing_spec_name_argument(runs):
    result = runs["missing_name_arg"][1]
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "the following arguments are required: mode" in result.stderr


def test_spec_file_alone_lists_its_spec_names(runs):
    result = runs["spec_file_alone"][1]
    names = list(json.loads(Path(DEMO).read_text()))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"specs in {DEMO}:", *(f"  {n}" for n in names),
                                          f"run one: lab {DEMO} SPEC_NAME MODE (e.g. dev, train; lab --help "
                                          "lists the modes)"]


def test_typos_get_a_suggestion(runs):
    assert_usage_error(runs["spec_file_typo"][1], f"spec file '{REPO}/specs/dmeo.json' does not exist. "
                       f"Did you mean '{DEMO}'?")
    assert_usage_error(runs["mode_typo"][1], "unknown mode 'trian'", "; did you mean 'train'?")
    assert_usage_error(runs["env_typo"][1], "unknown env id 'CartPole-v2'", "did you mean 'CartPole-v1'?")


def test_bad_env_id(runs):
    assert_usage_error(runs["bad_env_id"][1], "env.name: unknown env id 'CartPole-v99'")


def test_non_json_file(runs):
    assert_usage_error(runs["non_json"][1], "spec file 'notes.json' is not valid JSON", "line 1, column 1")


def test_algorithm_env_mismatch_is_a_usage_error(runs):
    cwd, result = runs["algo_env_mismatch"]
    assert_usage_error(result, "needs a Discrete action space")
    assert not (cwd / "data").exists()


def test_data_dir_that_is_a_file_is_a_usage_error(runs):
    assert_usage_error(runs["data_dir_is_file"][1], "file-not-dir")


def check_predir(predir: Path, name: str, max_frame: int, log_frequency: int) -> pd.DataFrame:
    files = sorted(str(p.relative_to(predir)) for p in predir.rglob("*") if p.is_file())
    for expected in (f"{name}_spec.json", f"{name}_t0_spec.json", f"{name}_t0_s0_spec.json",
                     "t0/s0/train_df.parquet", "t0/s0/log.txt"):
        assert expected in files, files
    spec = json.loads((predir / f"{name}_spec.json").read_text())
    assert spec["env"]["max_frame"] == max_frame and spec["meta"]["max_session"] == 1
    assert isinstance(spec["meta"]["random_seed"], int)  # drawn once and saved, so the run replays
    session_spec = json.loads((predir / f"{name}_t0_s0_spec.json").read_text())
    assert session_spec["meta"]["session_seed"] == spec["meta"]["random_seed"]
    assert session_spec["meta"]["session_dir"] == "t0/s0"
    df = pd.read_parquet(predir / "t0" / "s0" / "train_df.parquet")
    assert set(DESIGN_COLUMNS) <= set(df.columns)
    assert df.frame.tolist() == list(range(log_frequency, max_frame + 1, log_frequency))
    log = (predir / "t0" / "s0" / "log.txt").read_text().splitlines()
    assert len(log) == len(df) and log[-1].startswith(f"frame={max_frame} ")
    return df


def test_dev_run_writes_predir(runs):
    cwd, result = runs["dev"]
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    predirs = [p for p in (cwd / "data").iterdir() if not p.name.startswith(".")]  # .assets: graphs' js
    assert len(predirs) == 1 and predirs[0].name.startswith("dqn_cartpole_20")
    assert str(Path("data") / predirs[0].name) in result.stdout and "frame=600" in result.stdout
    check_predir(predirs[0], "dqn_cartpole", 600, 200)


def test_dev_run_honours_data_dir(runs):
    cwd, result = runs["dev_data_dir"]
    assert result.returncode == 0, result.stderr
    assert not (cwd / "data").exists()
    (predir,) = [p for p in (cwd / "elsewhere" / "runs").iterdir() if not p.name.startswith(".")]
    df = check_predir(predir, "dqn_cartpole", 600, 600)  # log_frequency 1000 > max_frame: one row at the end
    assert len(df) == 1
