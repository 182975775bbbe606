"""make_env: vector shapes, seeding, time limits, true final observations, episode returns, reward
scaling, pickling; resolve_env_id's old-id mapping."""

import dataclasses
import warnings

import gymnasium as gym
import numpy as np
import pytest

from envs.make import (
    EVAL_STREAM,
    OLD_ENV_IDS,
    TRAIN_STREAM,
    EnvSpec,
    episode_returns,
    eval_spec,
    final_obs,
    make_env,
    resolve_env_id,
    sub_env_seeds,
)
from tests.envs.state_copy import state_copy


def rollout(env, steps, seed=0):
    """Fixed action sequence; returns stacked (obs, reward, terminated, truncated)."""
    out = []
    obs, _ = env.reset(seed=seed)
    out.append(obs)
    acts = np.random.default_rng(123).integers(0, 2, size=(steps, env.num_envs))
    for a in acts:
        obs, reward, term, trunc, _ = env.step(a)
        out.append(np.concatenate([obs.ravel(), reward, term, trunc]))
    return out


def test_vector_shapes_and_spaces():
    env = make_env(EnvSpec("CartPole-v1", max_frame=100, num_envs=3), seed=0)
    obs, _ = env.reset(seed=0)
    assert env.num_envs == 3
    assert obs.shape == (3, 4) and obs.dtype == np.float32
    assert env.single_observation_space.shape == (4,)
    assert isinstance(env.single_action_space, gym.spaces.Discrete)
    obs, reward, term, trunc, _ = env.step(np.zeros(3, np.int64))
    assert obs.shape == (3, 4) and reward.shape == term.shape == trunc.shape == (3,)
    assert term.dtype == bool and trunc.dtype == bool
    env.close()


def test_same_seed_same_rollout_different_seed_differs():
    spec = EnvSpec("CartPole-v1", max_frame=100, num_envs=2)
    a, b = make_env(spec, 5), make_env(spec, 5)
    for x, y in zip(rollout(a, 50, seed=5), rollout(b, 50, seed=5)):
        np.testing.assert_array_equal(x, y)
    first_a = rollout(a, 0, seed=5)[0]
    assert not np.array_equal(first_a[0], first_a[1])  # sub-envs get different seeds
    assert not np.array_equal(first_a, rollout(b, 0, seed=6)[0])


def test_max_t_truncates_and_final_obs_and_returns():
    env = make_env(EnvSpec("CartPole-v1", max_frame=100, num_envs=2, max_t=5), seed=0)
    obs, _ = env.reset(seed=0)
    for step in range(5):
        prev = obs
        obs, reward, term, trunc, info = env.step(np.zeros(2, np.int64) + step % 2)
    assert trunc.all() and not term.any()
    done = term | trunc
    true_next = final_obs(obs, done, info)
    # SAME_STEP autoreset: the returned obs is the next episode's first; final_obs is the true one
    np.testing.assert_array_equal(true_next, np.stack(info["final_obs"]))
    assert not np.array_equal(true_next, obs)
    assert np.abs(true_next - prev).max() < 0.5  # one physics step away from the previous obs
    np.testing.assert_array_equal(episode_returns(info), [5.0, 5.0])
    env.close()


def test_final_obs_and_episode_returns_without_done():
    obs = np.ones((2, 4), np.float32)
    assert final_obs(obs, np.zeros(2, bool), {}) is obs
    assert episode_returns({}).shape == (0,)
    info = {"episode": {"r": np.array([3.0, 7.0])}, "_episode": np.array([False, True]),
            "final_obs": np.array([None, np.zeros(4)], dtype=object), "_final_obs": np.array([False, True])}
    np.testing.assert_array_equal(episode_returns(info), [7.0])
    out = final_obs(obs, np.array([False, True]), info)
    np.testing.assert_array_equal(out, [[1, 1, 1, 1], [0, 0, 0, 0]])
    assert obs[1].sum() == 4  # input untouched
    # next_step autoreset: a done row's returned observation is already the final one (no final_obs in info),
    # and on Atari only life-loss rows have one (the mask): a game-over row keeps its returned observation
    assert final_obs(obs, np.array([True, True]), {}) is obs
    life = {"final_obs": np.array([np.full(4, 5.0), None], dtype=object), "_final_obs": np.array([True, False])}
    np.testing.assert_array_equal(final_obs(obs, np.array([True, True]), life), [[5, 5, 5, 5], [1, 1, 1, 1]])


def test_next_step_autoreset_returns_the_final_obs_then_resets_with_reward_0():
    """``autoreset="next_step"``: the done step returns the final observation (as gymnasium's NEXT_STEP mode); the
    following step ignores the action, returns the first observation of a new episode, reward 0, not done; the
    training env of a session and its evaluation env differ only there (eval_spec makes it same_step)."""
    spec = EnvSpec("CartPole-v1", max_frame=100, num_envs=1, max_t=3, autoreset="next_step")
    env = make_env(spec, seed=0)
    env.reset(seed=[11])
    steps = [env.step(np.array([1])) for _ in range(4)]
    assert [bool(s[3][0]) for s in steps] == [False, False, True, False]  # truncated at t=3
    assert [float(s[1][0]) for s in steps] == [1.0, 1.0, 1.0, 0.0]
    assert "final_obs" not in steps[2][4] and np.abs(steps[2][0]).max() > np.abs(steps[3][0]).max()
    same = make_env(dataclasses.replace(spec, autoreset="same_step"), seed=0)
    same.reset(seed=[11])
    ref = [same.step(np.array([1])) for _ in range(3)]
    np.testing.assert_array_equal(steps[2][0][0], ref[2][4]["final_obs"][0])  # the same true final observation
    assert eval_spec(spec, 1).autoreset == "same_step"


@pytest.mark.parametrize("scale, expected", [(None, 1.0), (0.1, 0.1), ("sign", 1.0), (-2.0, -2.0)])
def test_reward_scale_and_episode_return_is_unscaled(scale, expected):
    env = make_env(EnvSpec("CartPole-v1", max_frame=100, num_envs=1, max_t=3, reward_scale=scale), seed=0)
    env.reset(seed=0)
    for _ in range(3):
        _, reward, _, _, info = env.step(np.zeros(1, np.int64))
        assert reward[0] == pytest.approx(expected)
    np.testing.assert_array_equal(episode_returns(info), [3.0])  # true return, before scaling
    env.close()


def test_normalize_state_normalizes_obs_and_final_obs():
    """normalize_state works with SAME_STEP autoreset: returned and final observations share the
    running statistics (gymnasium's own vector wrapper refuses SAME_STEP)."""
    spec = dict(name="CartPole-v1", max_frame=100, num_envs=2, max_t=5)
    raw = make_env(EnvSpec(**spec), seed=0)
    norm = make_env(EnvSpec(**spec, normalize_state=True, reward_scale=0.5), seed=0)
    raw.reset(seed=0)
    norm.reset(seed=0)
    for step in range(5):
        a = np.full(2, step % 2)
        obs_raw, _, _, _, info_raw = raw.step(a)
        obs_norm, reward, term, trunc, info_norm = norm.step(a)
    assert trunc.all() and reward[0] == 0.5
    scale = np.sqrt(norm.obs_rms.var + norm.epsilon)
    np.testing.assert_allclose(obs_norm, (obs_raw - norm.obs_rms.mean) / scale, rtol=1e-5)
    true_next = final_obs(obs_norm, term | trunc, info_norm)
    raw_final = np.stack(info_raw["final_obs"])
    np.testing.assert_allclose(true_next, (raw_final - norm.obs_rms.mean) / scale, rtol=1e-5)
    assert obs_norm.dtype == np.float32 and norm.single_observation_space.shape == (4,)
    # frozen statistics (evaluation) stay put
    norm.update_running_mean = False
    mean = norm.obs_rms.mean.copy()
    norm.step(np.zeros(2, np.int64))
    np.testing.assert_array_equal(norm.obs_rms.mean, mean)
    clone = state_copy(norm, make_env(EnvSpec(**spec, normalize_state=True, reward_scale=0.5), seed=0))
    np.testing.assert_array_equal(clone.obs_rms.var, norm.obs_rms.var)
    assert clone.update_running_mean is False


@pytest.mark.parametrize("frame_op", [None, "concat"])
def test_sync_env_state_copy_continues_identically(frame_op):
    spec = EnvSpec("CartPole-v1", max_frame=100, num_envs=4, frame_op=frame_op, max_t=12)
    env = make_env(spec, seed=1)
    env.reset(seed=1)
    for _ in range(7):
        env.step(np.ones(4, np.int64))
    clone = make_env(spec, seed=2)
    clone.reset(seed=2)
    state_copy(env, clone)
    for step in range(30):
        a = np.full(4, step % 2)
        for x, y in zip(env.step(a)[:4], clone.step(a)[:4]):
            np.testing.assert_array_equal(x, y)


def test_bad_vectorization_and_env_id():
    with pytest.raises(ValueError, match="vectorization"):
        make_env(EnvSpec("CartPole-v1", max_frame=10, vectorization="threads"), seed=0)
    with pytest.raises(ValueError, match="unknown env id 'NoSuchEnv-v0'"):
        make_env(EnvSpec("NoSuchEnv-v0", max_frame=10), seed=0)


# ---------------------------------------------------------------- resolve_env_id

def test_registered_ids_are_kept_without_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_env_id("CartPole-v1") == "CartPole-v1"
        assert resolve_env_id("CartPole-v0") == "CartPole-v0"  # still registered: runs as it is


def test_old_id_maps_to_successor_with_warning():
    msg = "'Pendulum-v0' is not in gymnasium; using its successor 'Pendulum-v1'"
    with pytest.warns(UserWarning, match=msg):
        assert resolve_env_id("Pendulum-v0") == "Pendulum-v1"
    env = make_env(EnvSpec("Pendulum-v1", max_frame=10), seed=0)
    assert env.single_action_space.shape == (1,)
    env.close()


def test_only_ids_that_do_not_run_are_in_the_map():
    """Mapped: ids gymnasium no longer registers, or registers only as mujoco-py stubs; successors run."""
    for old, new in OLD_ENV_IDS.items():
        assert old not in gym.registry or not isinstance(gym.registry[old].entry_point, str), old
        assert isinstance(gym.registry[new].entry_point, str), new


def test_mujoco_stub_ids_map_to_v5_and_v4_ids_are_kept():
    with pytest.warns(UserWarning, match="'HalfCheetah-v3' is not in gymnasium; using its successor 'HalfCheetah-v5'"):
        assert resolve_env_id("HalfCheetah-v3") == "HalfCheetah-v5"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_env_id("HalfCheetah-v4") == "HalfCheetah-v4"  # still runs in gymnasium 1.x
        assert resolve_env_id("PongNoFrameskip-v4") == "PongNoFrameskip-v4"  # registered by ale-py


def test_unknown_id_raises():
    with pytest.raises(ValueError, match="unknown env id 'Pendulum-v9'"):
        resolve_env_id("Pendulum-v9")


def test_sub_env_seeds_no_two_sessions_share_one():
    """Seeds of sessions 0..3 of a trial (base 1: session seeds 1..4), 8 sub-envs, training and eval
    streams: all distinct; with ``seed + i`` sessions 1 and 2 would share 7 of 8."""
    seeds = [sub_env_seeds(s, 8, stream, index) for s in range(1, 5)
             for stream, index in ((TRAIN_STREAM, 0), (TRAIN_STREAM, 1), (EVAL_STREAM, 0), (EVAL_STREAM, 1000))]
    flat = [x for group in seeds for x in group]
    assert len(flat) == 4 * 4 * 8 and len(set(flat)) == len(flat)
    assert all(0 <= x < 2**64 for x in flat)
    assert sub_env_seeds(1, 8) == sub_env_seeds(1, 8, TRAIN_STREAM, 0) == seeds[0]  # deterministic
    assert sub_env_seeds(1, 3) == seeds[0][:3]  # sub-env i's seed does not depend on N


def test_sub_env_seeds_give_distinct_initial_obs_and_reject_bad_args():
    spec = EnvSpec("CartPole-v1", max_frame=100, num_envs=8)
    env = make_env(spec, 1)
    obs_0 = env.reset(seed=sub_env_seeds(1, 8))[0]
    obs_1 = env.reset(seed=sub_env_seeds(2, 8))[0]
    assert not (obs_0[:, None, :] == obs_1[None, :, :]).all(-1).any()  # no initial obs in common
    np.testing.assert_array_equal(env.reset(seed=sub_env_seeds(1, 8))[0], obs_0)
    env.close()
    with pytest.raises(ValueError, match="must be >= 0"):
        sub_env_seeds(-1, 4)
    with pytest.raises(ValueError, match="num_envs"):
        sub_env_seeds(1, 0)
