"""Transfer (``agent.net.init_from``): a new trial starts from a trained CartPole session's nets
(first evaluation far above random), loads exactly the source weights and nothing else, and a
mismatched ``hid_layers`` exits 2 naming each layer and both shapes."""

from pathlib import Path

import pytest
from lab_helpers import overrides, run_cli

from orchestrator.errors import SpecError
from orchestrator.report import analysis
from orchestrator.report import metrics as metrics_mod
from orchestrator.session import transfer
from orchestrator.session.loop import Session
from orchestrator.spec.load import load_spec
from orchestrator.store.checkpoint import CheckpointStore

SPECS = str(Path(__file__).resolve().parents[3] / "specs/benchmark/cartpole.json")
# eval at frame 128, before the first PPO update (8 envs x time_horizon 32 = 256 frames): the
# evaluated policy is exactly the transferred one
FIRST_EVAL = ["meta.max_session=1", "env.max_frame=256", "meta.log_frequency=256", "meta.rigorous_eval=8",
              "meta.eval_frequency=128", "meta.random_seed=9"]


def source_spec_file(predir: Path) -> str:
    return str(predir / "ppo_cartpole_t0_s0_spec.json")


def test_new_trial_from_trained_session_evaluates_far_above_random(trained_ppo_run, tmp_path):
    data = tmp_path / "data"
    items = FIRST_EVAL + [f"agent.net.init_from={source_spec_file(trained_ppo_run)}"]
    assert run_cli(SPECS, "ppo_cartpole", "train", "--quiet", "--data-dir", str(data), *overrides(items)) == 0
    (predir,) = data.glob("ppo_cartpole_*")
    eval_df = analysis.committed_df(str(predir / "t0/s0"), "eval_df.parquet")
    first = eval_df.iloc[0]
    random_return = metrics_mod.random_baseline("CartPole-v1", None, str(tmp_path / "cache"))["mean"]
    assert first["frame"] == 128 and first["opt_step"] == 0
    assert first["total_reward"] > 100 and first["total_reward"] > 4 * random_return


def test_init_from_loads_the_nets_only(trained_ppo_run):
    store = CheckpointStore(str(trained_ppo_run / "t0/s0"))
    best = store.ranked("best")[0]
    expected = store.manifest(best).meta["weights_sha256"]
    for source in (source_spec_file(trained_ppo_run), str(trained_ppo_run / "t0/s0"), store.frame_uri(best)):
        spec = load_spec(SPECS, "ppo_cartpole", FIRST_EVAL + [f"agent.net.init_from={source}"])
        session = Session(spec, 9)
        try:
            assert session.weights_sha256() == expected, source
            assert session.clock.frame == 0 and session.clock.opt_step == 0
            assert all(not optim.state for optim in session.algorithm.optims.values())
        finally:
            session.close()
    resumed = Session(spec, 9, fresh=False)  # restored sessions never read init_from
    assert resumed.weights_sha256() != expected
    resumed.close()


def test_relative_init_from_is_made_absolute(trained_ppo_run, monkeypatch):
    monkeypatch.chdir(trained_ppo_run)
    spec = load_spec(SPECS, "ppo_cartpole", ["agent.net.init_from=t0/s0"])
    assert spec["agent"]["net"]["init_from"] == str(trained_ppo_run / "t0/s0")


def test_mismatched_hid_layers_exits_2_naming_layer_and_shapes(trained_ppo_run, tmp_path, capsys):
    data = tmp_path / "data"
    items = FIRST_EVAL + [f"agent.net.init_from={source_spec_file(trained_ppo_run)}",
                          "agent.net.hid_layers=[32]"]
    for mode in ("train", "dev"):
        code = run_cli(SPECS, "ppo_cartpole", mode, "--quiet", "--data-dir", str(data), *overrides(items))
        assert code == 2
        err = capsys.readouterr().err
        assert "agent.net.init_from: layer 'actor.body.1.weight' has shape (64, 4) in the checkpoint" in err
        assert "but (32, 4) in this spec" in err and "'critic.heads.0.0.weight' has shape (1, 64)" in err
        assert "Traceback" not in err
        assert not data.exists(), f"{mode}: a refused run left a run directory"


def test_bad_init_from_sources(tmp_path):
    for source, message in ((tmp_path / "nowhere", "is not a session spec file, a session directory"),
                            (tmp_path, "is not a session spec file, a session directory")):
        spec = load_spec(SPECS, "ppo_cartpole", [f"agent.net.init_from={source}"])
        with pytest.raises(SpecError, match=message):
            transfer.check_init_from(spec)
    (tmp_path / "s0" / "ckpt").mkdir(parents=True)
    spec = load_spec(SPECS, "ppo_cartpole", [f"agent.net.init_from={tmp_path / 's0'}"])
    with pytest.raises(SpecError, match="no committed checkpoint"):
        transfer.check_init_from(spec)
    dqn = load_spec(SPECS, "dqn_cartpole", [f"agent.net.init_from={tmp_path / 's0'}"])
    assert dqn["agent"]["net"]["init_from"] == str(tmp_path / "s0")
