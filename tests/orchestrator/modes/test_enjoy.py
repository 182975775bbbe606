"""enjoy@{session_spec_file}: same seed -> same returns, best/latest checkpoint, outputs only under
enjoy/, training files untouched, clear exit-2 errors; exploration at its final schedule values."""

import hashlib
import importlib.util
import json
import math
from pathlib import Path

import pandas as pd
import pytest

from agents.schedules import VarSchedule
from orchestrator import cli
from orchestrator.commandline import split_mode
from orchestrator.errors import UsageError
from orchestrator.modes.enjoy import FAR_FRAME
from orchestrator.spec.session_spec import parse_target
from orchestrator.store.checkpoint import CheckpointStore

SPEC_NAME = "ppo_cartpole"
SPECS = str(Path(__file__).resolve().parents[3] / "specs/benchmark/cartpole.json")


def run_cli(*argv: str) -> int:
    try:
        return cli.main(list(argv))
    except SystemExit as exc:
        return int(exc.code)


def training_files(predir) -> dict[str, str]:
    """sha256 of every file of the run outside enjoy/."""
    return {str(p.relative_to(predir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(predir.rglob("*")) if p.is_file() and p.relative_to(predir).parts[0] != "enjoy"}


def enjoy_dirs(predir) -> set:
    return set((predir / "enjoy").iterdir()) if (predir / "enjoy").exists() else set()


def enjoy(predir, *extra: str) -> tuple[int, dict | None, pd.DataFrame | None]:
    """Run enjoy on session t0_s0; returns (exit code, summary, returns) of the new output folder."""
    before = enjoy_dirs(predir)
    code = run_cli("unused.json", SPEC_NAME, f"enjoy@{predir / f'{SPEC_NAME}_t0_s0_spec.json'}", *extra)
    new = enjoy_dirs(predir) - before
    if not new:
        return code, None, None
    (out,) = new
    return code, json.loads((out / "summary.json").read_text()), pd.read_parquet(out / "returns.parquet")


def test_same_seed_same_returns_and_training_files_untouched(trained_ppo_run, capsys):
    predir = trained_ppo_run
    before = training_files(predir)
    code1, first, returns1 = enjoy(predir, "--episodes", "4", "--seed", "7")
    code2, second, returns2 = enjoy(predir, "--episodes", "4", "--seed", "7")
    assert code1 == code2 == 0
    assert first["mean"] == second["mean"]
    pd.testing.assert_frame_equal(returns1, returns2)
    assert training_files(predir) == before, "enjoy changed a training file"
    assert len(enjoy_dirs(predir)) >= 2 and all(p.parent.name == "enjoy" for p in enjoy_dirs(predir))

    assert list(returns1.columns) == ["episode", "total_reward", "t"] and len(returns1) == 4
    assert first["mean"] == pytest.approx(returns1["total_reward"].mean())
    assert first["std"] == pytest.approx(returns1["total_reward"].std(ddof=0))
    assert (first["min"], first["max"]) == (returns1["total_reward"].min(), returns1["total_reward"].max())
    assert first["mean"] > 3 * 22, "a trained CartPole policy should be far above random (~22)"
    assert first["seed"] == 7 and first["explore_var"] is None  # PPO samples its policy
    out = capsys.readouterr().out
    assert f"mean={first['mean']:.2f}" in out and "min=" in out and "max=" in out


def test_best_checkpoint_by_default_latest_on_request(trained_ppo_run):
    predir = trained_ppo_run
    store = CheckpointStore(str(predir / "t0/s0"))
    scores = {f: store.manifest(f).meta["total_reward_ma"] for f in store.frames()}
    best = max(scores, key=lambda f: (scores[f], f))

    code, summary, _ = enjoy(predir, "--episodes", "1")
    assert code == 0
    assert summary["checkpoint"] == {"which": "best", "frame": best, "total_reward_ma": scores[best]}
    session_spec = json.loads((predir / f"{SPEC_NAME}_t0_s0_spec.json").read_text())
    assert summary["seed"] == session_spec["meta"]["session_seed"]
    code, summary, _ = enjoy(predir, "--episodes", "1", "--ckpt", "latest")
    assert code == 0 and summary["checkpoint"] == {"which": "latest", "frame": max(store.frames()),
                                                   "total_reward_ma": scores[max(store.frames())]}
    target = f"enjoy@{predir / f'{SPEC_NAME}_t0_s0_spec.json'}@latest"
    before = enjoy_dirs(predir)
    assert run_cli("x", SPEC_NAME, target, "--episodes", "1") == 0
    (out,) = enjoy_dirs(predir) - before
    assert json.loads((out / "summary.json").read_text())["checkpoint"]["which"] == "latest"


def target_of(word: str, ckpt: str | None) -> tuple[str, str]:
    """``parse_target`` of the target of the mode word ``word`` (``enjoy@{file}[@latest|@best]``)."""
    return parse_target(split_mode(word)[1], ckpt)


def test_target_parsing():
    assert target_of("enjoy@/r/x_t0_s0_spec.json", None) == ("/r/x_t0_s0_spec.json", "best")
    assert target_of("enjoy@/r/x_t0_s0_spec.json@latest", None) == ("/r/x_t0_s0_spec.json", "latest")
    assert target_of("enjoy@s3://b/x_t0_s0_spec.json", "latest") == ("s3://b/x_t0_s0_spec.json", "latest")
    with pytest.raises(UsageError, match="contradicts"):
        target_of("enjoy@/r/x_t0_s0_spec.json@latest", "best")
    with pytest.raises(UsageError, match="session spec file"):
        target_of("enjoy", None)


@pytest.mark.skipif(importlib.util.find_spec("moviepy") is not None, reason="moviepy is installed")
def test_record_without_moviepy_exits_2_and_writes_nothing(trained_ppo_run, capsys):
    before = enjoy_dirs(trained_ppo_run)
    code, summary, _ = enjoy(trained_ppo_run, "--episodes", "1", "--record")
    assert code == 2 and summary is None and enjoy_dirs(trained_ppo_run) == before
    err = capsys.readouterr().err
    assert "moviepy" in err and "Traceback" not in err


def test_bad_targets_exit_2(trained_ppo_run, tmp_path, capsys):
    assert run_cli("x", SPEC_NAME, f"enjoy@{tmp_path / 'missing_t0_s0_spec.json'}") == 2
    assert "does not exist" in capsys.readouterr().err
    assert run_cli("x", SPEC_NAME, f"enjoy@{trained_ppo_run / f'{SPEC_NAME}_spec.json'}") == 2
    assert "not a session spec file" in capsys.readouterr().err
    assert run_cli("x", "other_name", f"enjoy@{trained_ppo_run / f'{SPEC_NAME}_t0_s0_spec.json'}") == 2
    assert "not of 'other_name'" in capsys.readouterr().err


@pytest.mark.parametrize("spec", [
    {"name": "linear_decay", "start_val": 1.0, "end_val": 0.02, "start_step": 0, "end_step": 10000},
    {"name": "rate_decay", "start_val": 1.0, "end_val": 0.05, "start_step": 100, "end_step": 5000},
    {"name": "periodic_decay", "start_val": 1.0, "end_val": 0.1, "start_step": 0, "end_step": 8000},
    {"name": "no_decay", "start_val": 0.3},
])
def test_enjoy_clock_puts_every_schedule_at_its_final_value(spec):
    schedule = VarSchedule.from_spec(spec)
    assert schedule(FAR_FRAME) == schedule.final_val
    assert not math.isnan(schedule.final_val)


def test_enjoy_a_run_on_object_storage(trained_ppo_run, s3_bucket, capsys):
    """A run copied into a bucket: enjoy@s3://... reads it there and writes its results there."""
    from orchestrator.store import storage

    target = f"{s3_bucket}/runs/{trained_ppo_run.name}"
    for path in trained_ppo_run.rglob("*"):
        rel = path.relative_to(trained_ppo_run)
        if path.is_file() and rel.parts[0] not in ("enjoy", "graph"):
            storage.write_bytes(f"{target}/{rel.as_posix()}", path.read_bytes())
    local = enjoy(trained_ppo_run, "--episodes", "2", "--seed", "3")[1]
    spec_uri = f"{target}/{SPEC_NAME}_t0_s0_spec.json"
    assert run_cli("x", SPEC_NAME, f"enjoy@{spec_uri}", "--episodes", "2", "--seed", "3") == 0
    (stamp,) = storage.listdir(f"{target}/enjoy")
    remote = storage.read_json(f"{target}/enjoy/{stamp}/summary.json")
    assert remote["mean"] == local["mean"] and remote["session_spec"] == spec_uri
    returns = storage.read_parquet(f"{target}/enjoy/{stamp}/returns.parquet")
    assert returns["total_reward"].mean() == local["mean"]


def test_enjoy_of_a_dev_run_says_dev_runs_never_checkpoint(tmp_path, capsys):
    data = tmp_path / "data"
    assert run_cli(SPECS, SPEC_NAME, "dev", "--data-dir", str(data), "-s", "env.max_frame=200", "--quiet") == 0
    (predir,) = data.glob(f"{SPEC_NAME}_*")
    capsys.readouterr()
    assert run_cli("unused.json", SPEC_NAME, f"enjoy@{predir / f'{SPEC_NAME}_t0_s0_spec.json'}") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: enjoy: no committed checkpoint in {predir / 't0/s0'}: '{predir}' is a dev run, "
                          "and dev runs never checkpoint; train the spec with a train run"), err
    assert f"{predir / f'{SPEC_NAME}_spec.json'} {SPEC_NAME} train --data-dir {data}" in err, err
    assert not (predir / "enjoy").exists()
