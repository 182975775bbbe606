"""Env families installed by ``pip install -e .``: Box2D, MuJoCo, Atari (ALE) build as vector envs with the
expected spaces; their sync vector envs' state (``envs.state``) holds the simulator state (ALE, MuJoCo) or is
refused (Box2D), never silently restarting; the Atari pipeline matches SLM-Lab v5 (sticky actions, frame skip 4,
84x84 uint8 grayscale, frame_op, life-loss terminations, clipped rewards, true game returns)."""

import gymnasium as gym
import numpy as np
import pytest

from envs.make import EnvSpec, episode_returns, eval_spec, final_obs, is_atari, make_env, resolve_vec, sub_env_seeds
from envs.state import EnvStateError, capture
from tests.envs.state_copy import state_copy


def steps(env, n, seed):
    """n fixed-seed random vector steps; returns the stacked observations and rewards."""
    rng = np.random.default_rng(seed)
    space = env.single_action_space
    out = []
    for _ in range(n):
        if isinstance(space, gym.spaces.Discrete):
            act = rng.integers(0, space.n, env.num_envs)
        else:
            act = rng.uniform(space.low, space.high, (env.num_envs, *space.shape)).astype(space.dtype)
        obs, reward, term, trunc, _ = env.step(act)
        out.append((obs.copy(), reward.copy(), term.copy(), trunc.copy()))
    return out


def assert_same(a, b):
    for x, y in zip(a, b):
        for u, v in zip(x, y):
            np.testing.assert_array_equal(u, v)


@pytest.mark.parametrize("name, obs_shape, obs_dtype, act", [
    ("LunarLander-v3", (8,), np.float32, "Discrete(4)"),
    ("BipedalWalker-v3", (24,), np.float32, "Box(-1.0, 1.0, (4,), float32)"),
    ("Hopper-v5", (11,), np.float64, "Box(-1.0, 1.0, (3,), float32)"),
    ("ALE/Pong-v5", (4, 84, 84), np.uint8, "Discrete(6)"),
])
def test_family_builds_with_spaces(name, obs_shape, obs_dtype, act):
    env = make_env(EnvSpec(name, max_frame=100, num_envs=2), seed=0)
    obs, _ = env.reset(seed=sub_env_seeds(0, 2))
    assert obs.shape == (2, *obs_shape) and obs.dtype == obs_dtype
    assert env.single_observation_space.shape == obs_shape and str(env.single_action_space) == act
    steps(env, 3, 0)
    env.close()


@pytest.mark.parametrize("name, n_before, n_after", [("Hopper-v5", 20, 60), ("ALE/Pong-v5", 30, 40),
                                                     ("ALE/Pong-v5", 51, 40)])
def test_simulator_state_survives_a_state_copy(name, n_before, n_after):
    """A fresh env given the state continues bit-identically: MuJoCo integration state / ALE emulator + sticky-action
    RNG, np_random, frame stacks."""
    env = make_env(EnvSpec(name, max_frame=100, num_envs=2), seed=1)
    env.reset(seed=sub_env_seeds(1, 2))
    steps(env, n_before, 1)
    clone = make_env(EnvSpec(name, max_frame=100, num_envs=2), seed=5)
    clone.reset(seed=sub_env_seeds(5, 2))
    state_copy(env, clone)
    assert_same(steps(env, n_after, 2), steps(clone, n_after, 2))
    env.close()
    clone.close()


def test_box2d_state_is_refused_with_reason():
    env = make_env(EnvSpec("LunarLander-v3", max_frame=100, num_envs=1), seed=0)
    env.reset(seed=0)
    with pytest.raises(EnvStateError, match="LunarLander.*EzPickle"):
        capture(env)
    env.close()


def test_atari_pipeline_life_loss_clipping_and_true_returns():
    """Breakout (5 lives, rewards 1/4/7): a life loss is terminated without a reset (final_obs is the
    game's next frame), rewards are sign-clipped, and episode returns count whole games, unclipped."""
    spec = EnvSpec("ALE/Breakout-v5", max_frame=100, num_envs=1, max_t=None)
    env = make_env(spec, seed=0)
    obs, info = env.reset(seed=3)
    assert info["lives"][0] == 5
    assert obs.shape == (1, 4, 84, 84) and (obs[0, :3] == 0).all()  # zero-padded stack at reset
    lives_lost, clipped, games, raw = 0, set(), [], 0.0
    rng = np.random.default_rng(0)
    for _ in range(4000):
        next_obs, reward, term, trunc, info = env.step(rng.integers(0, 4, 1))
        clipped.update(np.unique(reward).tolist())
        done = term | trunc
        if done[0] and len(episode_returns(info)) == 0:  # a life lost, the game goes on
            lives_lost += 1
            np.testing.assert_array_equal(final_obs(next_obs, done, info), next_obs)
        games += episode_returns(info).tolist()
        obs = next_obs
        if games:
            break
    assert lives_lost == 4 and len(games) == 1 and clipped <= {0.0, 1.0}
    evaluation = make_env(eval_spec(spec, 1), seed=0)
    evaluation.reset(seed=3)
    for _ in range(4000):  # the same game without life-loss terminations: one episode, same score
        _, reward, term, trunc, info = evaluation.step(rng.integers(0, 4, 1))
        if (term | trunc)[0]:
            raw = episode_returns(info)[0]
            break
    assert raw >= 0 and games[0] >= 0
    env.close()
    evaluation.close()


def test_frame_op_concat_and_stack_on_vector_obs():
    concat = make_env(EnvSpec("CartPole-v1", max_frame=10, frame_op="concat", frame_op_len=3), seed=0)
    stack = make_env(EnvSpec("CartPole-v1", max_frame=10, frame_op="stack", frame_op_len=3), seed=0)
    assert concat.single_observation_space.shape == (12,) and stack.single_observation_space.shape == (3, 4)
    a, b = concat.reset(seed=0)[0], stack.reset(seed=0)[0]
    np.testing.assert_array_equal(a.reshape(1, 3, 4), b)
    assert (b[0, :2] == 0).all() and (b[0, 2] != 0).any()


def test_sticky_actions_in_gymnasium_wrapper_and_atari_only_keys():
    """Sticky actions: gymnasium's StickyAction with the id's probability (0.25 for v5, 0 for NoFrameskip-v4)
    or the spec's; ALE's own is 0 (its previous action is not in ALEState)."""
    def sticky(env):
        sub = env.unwrapped.envs[0]
        assert sub.unwrapped.ale.getFloat("repeat_action_probability") == 0.0
        while not isinstance(sub, gym.wrappers.StickyAction):
            if not hasattr(sub, "env"):
                return 0.0
            sub = sub.env
        return sub.repeat_action_probability
    assert sticky(make_env(EnvSpec("ALE/Pong-v5", max_frame=10), seed=0)) == 0.25
    assert sticky(make_env(EnvSpec("ALE/Pong-v5", max_frame=10, repeat_action_probability=0.0), seed=0)) == 0.0
    assert sticky(make_env(EnvSpec("PongNoFrameskip-v4", max_frame=10), seed=0)) == 0.0
    assert is_atari("ALE/Pong-v5") and is_atari("PongNoFrameskip-v4") and not is_atari("Hopper-v5")
    with pytest.raises(ValueError, match="Atari envs only"):
        make_env(EnvSpec("CartPole-v1", max_frame=10, life_loss_info=True), seed=0)


def test_auto_vectorization_follows_cpus():
    spec = EnvSpec("CartPole-v1", max_frame=10, num_envs=4, vectorization="auto")
    assert resolve_vec(spec, 2).vectorization == "async" and resolve_vec(spec, 1).vectorization == "sync"
    assert resolve_vec(EnvSpec("CartPole-v1", max_frame=10, vectorization="auto"), 4).vectorization == "sync"
