"""SLM-Lab's own spec files (v5.3.0, unmodified): every entry validates or is refused naming a feature, none
crashes; a sample of classic-control entries runs in ``dev`` for 300 frames, and one entry of each other env
family (Atari, Box2D, MuJoCo) for 500 frames with the full sweep's ``-s`` caps (``bench.DEV_CAPS``).

The files are not part of the repository: ``$SLM_LAB_SPECS``, else a checked download of SLM-Lab at its pinned
commit into a cache (``tests/slm_lab_fetch.py``, fetched once per test session by ``tests/conftest.py``).
``bench/slm_lab_specs.py`` runs the same sweep with counts (and ``--dev-all`` for every entry).
"""

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "bench"))

import slm_lab_specs as bench  # noqa: E402

from orchestrator.spec.load import load_spec  # noqa: E402
from tests.slm_lab_fetch import specs_root  # noqa: E402

pytestmark = pytest.mark.slm_lab_specs
ROOT = specs_root()


def test_slm_lab_spec_files_are_there():
    assert len([f for version, f in bench.spec_files(ROOT) if version == "v5.3.0"]) >= 150, ROOT

# Words a refusal must contain to name what is missing (a feature, a key path with its expectation).
NAMING = ("SLM-Lab", "not supported", "not available", "expected", "must be", "needs", "unknown env id",
          "template variable", "does not exist in the spec", "does not read it")

# Classic-control entries that validate: each runs in dev (300 frames) in CI, one per algorithm family.
DEV_SAMPLE = [
    ("v5.3.0/benchmark/ppo/ppo_cartpole.json", "ppo_cartpole"),
    ("v5.3.0/benchmark/a2c/a2c_gae_cartpole.json", "a2c_gae_cartpole"),
    ("v5.3.0/benchmark/dqn/dqn_cartpole.json", "dqn_boltzmann_cartpole"),
    ("v5.3.0/benchmark/reinforce/reinforce_cartpole.json", "reinforce_cartpole"),
    ("v5.3.0/benchmark/sarsa/sarsa_cartpole.json", "sarsa_epsilon_greedy_cartpole"),
    ("v5.3.0/experimental/misc/random.json", "random_cartpole"),
    ("v5.3.0/experimental/sil/sil_cartpole.json", "sil_shared_cartpole"),
    ("v5.3.0/demo.json", "ppo_cartpole"),  # use_same_optim: true
    ("v5.3.0/experimental/ppo/ppo_cartpole.json", "ppo_rnn_separate_cartpole"),  # RecurrentNet
    ("v5.3.0/experimental/dqn/dqn_cartpole.json", "drqn_boltzmann_cartpole"),  # RecurrentNet under DQN
]


# One validating entry per other env family, run as ``--dev-all`` runs them (500 frames, DEV_CAPS, no analysis).
FAMILY_SAMPLE = [
    ("v5.3.0/benchmark/a2c/a2c_gae_pong.json", "a2c_gae_pong"),  # Atari: ConvNet, 16 -> 4 sub-envs
    ("v5.3.0/benchmark/a2c/a2c_gae_lunar.json", "a2c_gae_lunar_continuous"),  # Box2D, continuous actions
    ("v5.3.0/benchmark/a2c/a2c_nstep_mujoco.json", "a2c_nstep_humanoid"),  # MuJoCo
    ("v5.3.0/benchmark_arc/ppo/ppo_playground.yaml", "ppo_playground"),  # MuJoCo Playground through EnvPool
]


def _naming_problem(record):
    """Why a sweep record is not an ``ok`` or a refusal naming what is missing (None when it is)."""
    where = f"{record['file']}::{record['name']}"
    if record["outcome"] not in ("ok", "refused") or record["name"] is None:
        return f"{where}: {record['outcome']}: {record['message']}"
    for line in record["message"].splitlines() if record["outcome"] == "refused" else []:
        if "Traceback" in line or ":" not in line or not any(word in line for word in NAMING):
            return f"{where}: refusal without a named feature or expectation: {line}"
        if "unknown key" in line and "SLM-Lab" not in line:
            return f"{where}: an SLM-Lab key reported as unknown: {line}"
    return None


def test_every_v5_entry_validates_or_is_refused_by_name():
    """One sweep over every entry (validation only): ok, or exit-2 problems each naming a feature or an
    expectation; no crash, no "unknown key" for an SLM-Lab key; and no fewer ok entries than when written
    (379 of 389, with TorchArcNet, RecurrentNet, agent.critic_net, SIL, meta.distributed, layer_norm, PPO on
    OnPolicyReplay, searches over keys SLM-Lab reads nowhere, v3 fixed values beside their schedules, actor_arc /
    critic_arc, LinearToMin and batch_norm)."""
    result = bench.sweep(ROOT, [], 0, None, False)
    assert [p for p in map(_naming_problem, result["records"]) if p] == []
    assert result["outcomes"].get("ok", 0) >= 379, result["reasons"][:5]


@pytest.mark.parametrize("rel, name", DEV_SAMPLE)
def test_dev_runs_sample_of_classic_entries(rel, name):
    path = ROOT / rel
    assert path.exists(), path
    assert bench.dev_entry(path, name, bench.template_fills(path), 300) == 0


@pytest.mark.parametrize("rel, name", FAMILY_SAMPLE)
def test_dev_runs_one_entry_per_env_family(rel, name):
    path = ROOT / rel
    fills = bench.template_fills(path)
    caps = bench.dev_overrides(load_spec(str(path), name, fills))
    rc, _, message = bench.dev_run(path, name, fills + caps, 500, timeout=120, analysis=False)
    assert (rc, message) == (0, "")


def test_dev_caps_apply_only_where_the_entry_has_a_larger_value():
    spec = {"env": {"num_envs": 16, "max_frame": 10}, "agent": {"memory": {"max_size": 10000}},
            "meta": {"rigorous_eval": 8}}
    assert bench.dev_overrides(spec) == ["env.num_envs=4", "meta.rigorous_eval=1"]
    assert bench.dev_overrides({"env": {"num_envs": 4}, "agent": {"memory": {}}, "meta": {}}) == []
    assert bench.dev_overrides({"env": {}, "agent": {"memory": {"max_size": 1e6}}, "meta": {}}) == [
        "agent.memory.max_size=10000"]
    algorithm = {"training_iter": 4, "training_batch_iter": 1, "training_epoch": 8}
    assert bench.dev_overrides({"agent": {"algorithm": algorithm}}) == ["agent.algorithm.training_iter=1"]


def test_dev_run_past_its_limit_is_recorded_as_a_timeout():
    """A run stopped by its wall-clock limit (SIGALRM in-process) is exit 124, not a crash or a hang."""
    path = ROOT / DEV_SAMPLE[0][0]
    rc, seconds, message = bench.dev_run(path, DEV_SAMPLE[0][1], [], 100_000, timeout=0.5, analysis=False)
    assert (rc, message) == (bench.TIMEOUT_RC, "timed out after 0.5 s")
    assert 0.5 <= seconds < 30


def test_dev_run_names_the_first_problem_of_a_refusal():
    path = ROOT / DEV_SAMPLE[0][0]
    rc, _, message = bench.dev_run(path, DEV_SAMPLE[0][1], ["agent.algorithm.gamma=7"], 100, analysis=False)
    assert rc == 2
    assert message.startswith("agent.algorithm.gamma"), message


@pytest.mark.parametrize("rel, name, kind, per_transition", [
    ("v5.3.0/benchmark/dqn/dqn_atari.json", "dqn_atari", "FrameStackReplay", 7_073),
    ("v5.3.0/benchmark/dqn/ddqn_per_atari.json", "ddqn_per_atari", "PrioritizedFrameStackReplay", 7_073 + 21),
])
def test_atari_dqn_entries_store_each_frame_once(rel, name, kind, per_transition):
    """SLM-Lab's own Atari DQN entries (``Replay`` / ``PrioritizedReplay`` of 200,000, no lab key) get the
    frame-stack replay kinds: 1.4 GB per session instead of 11.3 GB, the same samples (``tests/agents/
    test_replay_frames.py``), and preflight counts that."""
    import dataclasses

    import gymnasium as gym
    import numpy as np

    from agents.memory import make_replay
    from orchestrator.spec import preflight
    from orchestrator.spec.load import build

    path = ROOT / rel
    spec = load_spec(str(path), name, bench.template_fills(path))
    memory_spec = build(spec).agent.memory
    assert memory_spec.optimize_memory_usage is None and memory_spec.max_size == 200_000
    atari = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    small = dataclasses.replace(memory_spec, max_size=1000)
    assert type(make_replay(small, atari, (), np.int64, num_envs=16)).__name__ == kind
    shape = preflight.EnvShape((4, 84, 84), (), np.dtype(np.int64), 6, 10_000, np.dtype(np.uint8))
    needs = {key: what for key, _, what in preflight.memory_needs(spec, shape)}
    assert needs["agent.memory.max_size"] == f"replay of 200000 transitions x {per_transition} bytes"
