"""Preflight checks: byte counts equal what the code allocates; messages give key, bytes needed and available."""

import numpy as np
import pytest
from lab_helpers import SPECS

from agents.memory import Replay
from orchestrator.errors import SpecError
from orchestrator.spec import preflight
from orchestrator.spec.load import load_spec


@pytest.mark.parametrize("obs_shape, act_shape, act_dtype", [((4,), (), np.int64), ((3, 8, 8), (2,), np.float32)])
def test_replay_bytes_equal_what_replay_allocates(obs_shape, act_shape, act_dtype):
    replay = Replay(100, obs_shape, act_shape, act_dtype, 8)
    assert preflight.replay_bytes(100, obs_shape, act_shape, act_dtype) == sum(v.nbytes for v in replay.data.values())


def test_net_bytes_count_weights_grads_and_adam_moments():
    import torch
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    assert preflight.net_bytes(4, [8], 2) == 4 * 4 * sum(p.numel() for p in net.parameters())


def test_cartpole_shape():
    shape = preflight.check_env({"name": "CartPole-v1", "max_t": None, "normalize_state": False, "reward_scale": None})
    assert (shape.obs_shape, shape.act_shape, shape.act_dtype, shape.n_actions) == ((4,), (), np.int64, 2)
    assert shape.env_bytes >= 4096


def test_install_hints_per_family():
    assert preflight.install_hint("LunarLander-v3").endswith('pip install "gymnasium[box2d]"')
    assert preflight.install_hint("HalfCheetah-v5") == 'pip install "gymnasium[mujoco]"'
    assert preflight.install_hint("ALE/Pong-v5") == "pip install ale-py"


SHAPE = preflight.EnvShape((4,), (), np.dtype(np.int64), 2, 10_000)


def test_memory_message_gives_key_bytes_needed_and_available():
    spec = load_spec(SPECS, "dqn_cartpole", ["agent.memory.max_size=1000000"])
    with pytest.raises(SpecError) as err:
        preflight.check_memory(spec, SHAPE, sessions=1, available=40_000_000)
    assert err.value.problems == [
        "agent.memory.max_size: replay of 1000000 transitions x 48 bytes needs 48000000 bytes (45.8 MiB), "
        "but only 40000000 bytes (38.1 MiB) are available"]


def test_memory_shared_by_sessions_and_the_total():
    spec = load_spec(SPECS, "dqn_cartpole", ["agent.memory.max_size=1000000"])
    preflight.check_memory(spec, SHAPE, sessions=1, available=60_000_000)  # fits alone
    with pytest.raises(SpecError) as err:
        preflight.check_memory(spec, SHAPE, sessions=2, available=60_000_000)
    assert err.value.problems == [
        "agent.memory.max_size: replay of 1000000 transitions x 48 bytes needs 48000000 bytes (45.8 MiB), "
        "but a session can use 30000000 bytes (28.6 MiB) (60000000 bytes (57.2 MiB) available, shared by "
        "2 sessions)"]
    keys = "env.num_envs, agent.memory.max_size, agent.memory.batch_size, agent.net.hid_layers"
    with pytest.raises(SpecError, match=f"{keys}: together need"):
        preflight.check_memory(spec, SHAPE, sessions=1, available=48_000_000)


def test_a_sample_larger_than_the_replay_is_counted():
    """A batch_size above max_size is allowed (with a warning): the sample's rows are counted, and refused when they
    cannot be held."""
    with pytest.warns(UserWarning, match="agent.memory.batch_size: 1000000 transitions per sample exceed"):
        spec = load_spec(SPECS, "dqn_cartpole", ["agent.memory.batch_size=1000000", "agent.memory.max_size=1000"])
    needs = {key: (need, what) for key, need, what in preflight.memory_needs(spec, SHAPE)}
    assert needs["agent.memory.batch_size"] == (48_000_000, "sample of 1000000 transitions x 48 bytes")
    with pytest.raises(SpecError) as err:
        preflight.check_memory(spec, SHAPE, sessions=1, available=40_000_000)
    assert err.value.problems[0].startswith("agent.memory.batch_size: sample of 1000000 transitions x 48 bytes needs "
                                            "48000000 bytes (45.8 MiB), but only 40000000 bytes")


def test_concurrent_sessions_per_mode():
    spec = load_spec(SPECS, "dqn_cartpole", ["meta.max_session=4", 'meta.resources={"num_cpus": 0}'])
    assert preflight.concurrent_sessions(spec, "dev") == 1 and preflight.concurrent_sessions(spec, "enjoy") == 1
    assert preflight.concurrent_sessions(spec, "train") == 4
    spec["meta"]["max_trial"] = 3
    assert preflight.concurrent_sessions(spec, "search") == 12 and preflight.concurrent_sessions(spec, "search", 2) == 8


def test_fmt_bytes():
    assert preflight.fmt_bytes(0) == "0 bytes" and preflight.fmt_bytes(1023) == "1023 bytes"
    assert preflight.fmt_bytes(16 * 2**40) == "17592186044416 bytes (16.0 TiB)"


def test_env_kwargs_reach_gym_make_and_a_wrong_one_is_refused():
    """env.continuous is LunarLander's own kwarg (Box(2,) actions); CartPole has none: a SpecError naming it."""
    lunar = load_spec(SPECS, "ppo_cartpole", ["env.name=LunarLander-v3", "env.continuous=true"])
    shape = preflight.check_env(lunar["env"])
    assert shape.act_shape == (2,) and shape.act_dtype == np.float32
    with pytest.raises(SpecError, match="unexpected keyword argument 'continuous'"):
        preflight.check_env(load_spec(SPECS, "ppo_cartpole", ["env.continuous=true"])["env"])


def test_sil_replay_is_counted_beside_the_rollout():
    """SIL's replay keeps obs, act, R and a flag, no next_obs: CartPole 16 + 8 + 4 + 4 = 32 bytes a transition,
    equal to what the ``SILReplay``'s replay allocates."""
    from tests.agents.algorithms.helpers import make_algo

    spec = load_spec("specs/sil.json", "ppo_sil_cartpole", ["agent.memory.max_size=1000"])
    needs = {what: need for key, need, what in preflight.memory_needs(spec, SHAPE) if key == "agent.memory.max_size"}
    assert needs == {"SIL replay of 1000 transitions x 32 bytes": 32_000}
    algo = make_algo("ppo_sil_cartpole", ["agent.memory.max_size=1000", "agent.net.hid_layers=[4]"],
                     spec_file="specs/sil.json")
    assert algo.memory.nbytes == 32_000


@pytest.mark.parametrize("items, per_transition", [
    ([], 7_073),  # each 84x84 frame once (FrameStackReplay)
    (["agent.memory.name=PrioritizedReplay"], 7_073 + 21),  # + the sum tree: 2 x 262,144 float64 over 200,000 rows
    (["agent.memory.optimize_memory_usage=false"], 56_464),  # uint8 obs and next_obs
])
def test_atari_replay_bytes_are_the_replay_kinds_own(items, per_transition):
    """The Atari DQN spec's replay of 200,000 transitions is counted as the replay the session builds (uint8 frames,
    each once unless ``optimize_memory_usage`` is false; preflight once counted float32 obs and next_obs, 225,808
    bytes a transition, 45 GB, and refused the spec on a 24 GB machine)."""
    atari = preflight.EnvShape((4, 84, 84), (), np.dtype(np.int64), 6, 10_000, np.dtype(np.uint8))
    spec = load_spec("specs/benchmark/atari.json", "dqn_atari", items)
    needs = {key: (need, what) for key, need, what in preflight.memory_needs(spec, atari)}
    assert needs["agent.memory.max_size"] == (
        200_000 * per_transition, f"replay of 200000 transitions x {per_transition} bytes")
    if per_transition < 10_000:  # 4 sessions of 1.4 GB fit a 24 GB machine; of 11.3 GB they do not
        preflight.check_memory(spec, atari, sessions=4, available=24 * 2**30)
    else:
        with pytest.raises(SpecError, match="agent.memory.max_size: replay of 200000 transitions x 56464 bytes"):
            preflight.check_memory(spec, atari, sessions=4, available=24 * 2**30)
