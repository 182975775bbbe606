"""RecurrentNet under every algorithm family SLM-Lab's specs use it with (specs/recurrent.json): exact resume
(obs windows and all) on vector envs, and a dev run (SLM-Lab's own recurrent specs: tests/orchestrator/
test_slm_lab_specs.py)."""

from pathlib import Path

import pytest
import torch

from tests.agents.algorithms.helpers import assert_resume_exact

RNN_SPECS = str(Path(__file__).resolve().parents[3] / "specs" / "recurrent.json")


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


@pytest.mark.parametrize("name, overrides, stop_frame", [
    ("ppo_rnn_cartpole", ["env.max_frame=512", "meta.log_frequency=128", "agent.algorithm.training_epoch=2"], 264),
    ("ppo_rnn_shared_cartpole", ["env.max_frame=512", "meta.log_frequency=128", "agent.algorithm.training_epoch=2"],
     344),
    ("a2c_gae_rnn_cartpole", ["env.max_frame=512", "meta.log_frequency=128"], 296),
    ("reinforce_rnn_cartpole", ["env.max_frame=480", "meta.log_frequency=80"], 260),
    ("drqn_cartpole", ["env.max_frame=320", "meta.log_frequency=80", "agent.algorithm.training_start_step=64",
                       "agent.memory.batch_size=32", "agent.memory.checkpoint=true",
                       "agent.net.update_frequency=40"], 164),
])
def test_resume_is_exact_with_windows(tmp_path, name, overrides, stop_frame):
    straight = assert_resume_exact(tmp_path, name, overrides, stop_frame, spec_file=RNN_SPECS)
    assert straight.clock.opt_step > 0
    assert straight.env.single_observation_space.shape == (4, 4)  # seq_len 4 windows of CartPole's 4 features


def test_dev_run_of_the_lab_recurrent_spec(tmp_path):
    from orchestrator import cli
    code = cli.main([RNN_SPECS, "ppo_rnn_cartpole", "dev", "-s", "env.max_frame=512", "-s", "meta.log_frequency=256",
                     "--data-dir", str(tmp_path / "data"), "--quiet"])
    assert code == 0
    assert len(list((tmp_path / "data").glob("*/t0/s0/train_df.parquet"))) == 1
