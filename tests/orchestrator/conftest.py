"""Fixtures shared by the orchestrator tests (the session-wide ``ray_local`` lives in tests/conftest.py)."""

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CARTPOLE_SPECS = str(REPO / "specs/benchmark/cartpole.json")
TRAINED_PPO = ["env.max_frame=16000", "meta.max_session=1", "meta.log_frequency=2000", "meta.checkpoint_frequency=2000",
               "meta.random_seed=5"]


@pytest.fixture(scope="session")
def trained_ppo_run(ray_local, tmp_path_factory) -> Path:
    """Predir of a finished ``lab train`` of PPO on CartPole-v1: 1 session, 16000 frames (~10 s).

    Its returns end well above the random policy's (~22). Tests only read it; enjoy writes under its
    ``enjoy/`` folder, which nothing else reads.
    """
    from orchestrator import cli

    data = tmp_path_factory.mktemp("trained_ppo") / "data"
    argv = [CARTPOLE_SPECS, "ppo_cartpole", "train", "--quiet", "--data-dir", str(data)]
    assert cli.main(argv + [x for item in TRAINED_PPO for x in ("-s", item)]) == 0
    (predir,) = data.glob("ppo_cartpole_*")
    return predir
