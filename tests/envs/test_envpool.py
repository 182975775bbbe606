"""``env.vectorization: envpool`` (envs/envpool_vec.py): SLM-Lab's Atari settings become EnvPool options with the
gymnasium path's values, the vector env keeps the session's contract (same_step autoreset with true final
observations, whole-game true returns, clipped training rewards, life loss without a game reset), its state is
refused (``envs.state``), and SLM-Lab's ``playground/...`` ids map to EnvPool's tasks or are refused naming the id."""

import warnings

import gymnasium as gym
import numpy as np
import pytest

from envs import envpool_vec
from envs.envpool_vec import atari_options, resolve_envpool_id
from envs.make import EnvSpec, episode_returns, eval_spec, final_obs, make_env, make_sub_env, sub_env_seeds
from envs.state import EnvStateError, capture
from orchestrator.errors import SpecError
from orchestrator.spec.load import load_spec

SPECS = "specs/benchmark/cartpole.json"


def gym_chain(env: gym.Env) -> dict[str, gym.Env]:
    """Wrapper class name -> wrapper, from the outermost down to the base env."""
    out = {}
    while True:
        out[type(env).__name__] = env
        if not hasattr(env, "env"):
            return out
        env = env.env


@pytest.mark.parametrize("name, keys", [
    ("ALE/Pong-v5", {}),
    ("PongNoFrameskip-v4", {}),
    ("ALE/Breakout-v5", {"repeat_action_probability": 0.1, "noop_max": 7, "frame_skip": 3, "frame_op_len": 2,
                         "max_t": 500}),
])
def test_atari_options_match_the_gymnasium_wrappers(name, keys):
    """Each EnvPool option against the value the gymnasium path's wrappers (make_sub_env, make_env) use."""
    spec = EnvSpec(name, max_frame=100, num_envs=2, **keys)
    chain = gym_chain(make_sub_env(name, spec))
    opts = atari_options(spec, name)
    sticky = chain["StickyAction"].repeat_action_probability if "StickyAction" in chain else 0.0
    assert opts["repeat_action_probability"] == sticky == keys.get("repeat_action_probability",
                                                                    0.0 if "v4" in name else 0.25)
    pre = chain["AtariPreprocessing"]
    assert opts["noop_max"] == pre.noop_max == keys.get("noop_max", 30)
    assert opts["frame_skip"] == pre.frame_skip == keys.get("frame_skip", 4)
    assert (opts["img_height"], opts["img_width"]) == pre.screen_size == (84, 84)
    assert opts["gray_scale"] is pre.grayscale_obs is True
    assert opts["stack_num"] == chain["FrameStackObservation"].stack_size == keys.get("frame_op_len", 4)
    assert opts["use_fire_reset"] is False and opts["use_inter_area_resize"] is True  # AtariPreprocessing: INTER_AREA
    ale_frames = chain["AtariEnv"].ale.getInt("max_num_frames_per_episode")
    limit = chain["TimeLimit"]._max_episode_steps if "TimeLimit" in chain else ale_frames // pre.frame_skip
    assert opts["max_episode_steps"] == limit == keys.get("max_t", 27000)
    # training: life loss ends the episode and rewards are sign-clipped, as LifeLossTermination / TransformReward
    venv = make_env(spec, 0)
    assert opts["episodic_life"] is True and "LifeLossTermination" in repr(venv)
    assert opts["reward_clip"] is True and "TransformReward" in repr(venv)
    evaluation = atari_options(eval_spec(spec, 1), name)
    assert evaluation["episodic_life"] is False and evaluation["reward_clip"] is False
    assert atari_options(EnvSpec(name, max_frame=1, reward_scale=1, life_loss_info=False), name)["reward_clip"] is False
    pool = make_env(EnvSpec(name, max_frame=100, num_envs=2, vectorization="envpool", **keys), 0)
    obs, _ = pool.reset(seed=sub_env_seeds(0, 2))
    assert obs.shape == (2, *venv.single_observation_space.shape) and obs.dtype == np.uint8
    assert pool.single_action_space == venv.single_action_space
    config = pool.unwrapped._pool.config
    for key, value in opts.items():
        assert config[key] == pytest.approx(value), key
    pool.close()
    venv.close()


def run_random(env, n, seed):
    """n random vector steps: (rewards (n, N), raw episode returns, per-step done (n, N), final obs per done row)."""
    env.action_space.seed(seed)
    rewards, returns, dones = [], [], []
    for _ in range(n):
        obs, reward, term, trunc, info = env.step(env.action_space.sample())
        done = term | trunc
        nxt = final_obs(obs, done, info)
        assert nxt.shape == obs.shape
        rewards.append(reward)
        returns += episode_returns(info).tolist()
        dones.append(done)
    return np.array(rewards), returns, np.array(dones)


def test_cartpole_same_step_returns_and_final_obs():
    """same_step: a done row's returned observation is a new episode's first (|x| small), the final one is in
    info; each reported return is the sum of that episode's rewards (CartPole: its length)."""
    env = make_env(EnvSpec("CartPole-v1", max_frame=1, num_envs=3, vectorization="envpool"), 0)
    env.reset(seed=sub_env_seeds(0, 3))
    ret = np.zeros(3)
    seen = 0
    for _ in range(200):
        obs, reward, term, trunc, info = env.step(env.action_space.sample())
        ret += reward
        done = term | trunc
        if done.any():
            np.testing.assert_array_equal(info["_final_obs"], done)
            for i in np.flatnonzero(done):
                assert np.all(np.abs(obs[i]) <= 0.05)  # CartPole's reset state: uniform in [-0.05, 0.05]
                assert np.abs(info["final_obs"][i][2]) > 0.2 or np.abs(info["final_obs"][i][0]) > 2.4
            np.testing.assert_array_equal(episode_returns(info), ret[done])
            seen += int(done.sum())
            ret[done] = 0
    assert seen >= 10
    with pytest.raises(EnvStateError, match="EnvPool cannot save"):
        capture(env)
    env.close()


def test_atari_life_loss_clipped_rewards_true_game_returns():
    """Breakout training env: a lost life is terminated without a game reset (lives keep falling), rewards are
    clipped to {0, 1}, and only game overs report a return, the unclipped game score."""
    env = make_env(EnvSpec("ALE/Breakout-v5", max_frame=1, num_envs=2, vectorization="envpool",
                           repeat_action_probability=0.0), 3)
    env.reset(seed=sub_env_seeds(3, 2))
    lives_at_done, game_scores, raw = [], [], np.zeros(2)
    for _ in range(1500):
        obs, reward, term, trunc, info = env.step(env.action_space.sample())
        assert set(np.unique(reward)) <= {0.0, 1.0}
        raw += info["reward"]
        if term.any():
            lives_at_done += info["lives"][term].tolist()
        if "episode" in info:
            game_scores += episode_returns(info).tolist()
            np.testing.assert_array_equal(episode_returns(info), raw[info["_episode"]])
            raw[info["_episode"]] = 0
    assert 4 in lives_at_done and 0 in lives_at_done  # life losses, then game overs
    assert game_scores and len(game_scores) < len(lives_at_done)
    env.close()


def test_next_step_autoreset_returns_first_obs_with_zero_reward():
    """next_step (SLM-Lab's mode): the done step returns the final observation, the step after it the next
    episode's first observation with reward 0, not done."""
    env = make_env(EnvSpec("CartPole-v1", max_frame=1, num_envs=2, vectorization="envpool", autoreset="next_step"), 1)
    env.reset(seed=sub_env_seeds(1, 2))
    pending = np.zeros(2, bool)
    checked = 0
    for _ in range(150):
        obs, reward, term, trunc, info = env.step(env.action_space.sample())
        for i in np.flatnonzero(pending):
            assert reward[i] == 0 and not term[i] and not trunc[i] and np.all(np.abs(obs[i]) <= 0.05)
            checked += 1
        assert "final_obs" not in info
        pending = term | trunc
    assert checked >= 5
    env.close()


@pytest.mark.parametrize("name, task, shape", [
    ("playground/CartpoleBalance", "CartpoleBalance-v1", (5,)),  # DM Control Suite task: position (3) + velocity (2)
    ("playground/Go1Getup", "MuJoCoPlayground/Go1Getup-v1", (133,)),  # state (42) + privileged_state (91)
])
def test_playground_ids_map_with_a_warning(name, task, shape, monkeypatch):
    monkeypatch.setattr(envpool_vec, "_announced", set())  # once per process: this test must see it
    with pytest.warns(UserWarning, match=f"'{name}'.*'{task}'"):
        assert resolve_envpool_id(name) == task
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = make_env(EnvSpec(name, max_frame=1, num_envs=2, vectorization="envpool"), 0)
    obs, _ = env.reset(seed=sub_env_seeds(0, 2))
    assert obs.shape == (2, *shape) and obs.dtype == np.float32
    assert env.single_observation_space.shape == shape
    env.close()


def test_playground_spec_defaults_to_envpool_and_refuses_unknown_ids():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec = load_spec(SPECS, "ppo_cartpole", ["env.name=playground/CartpoleBalance"])
    assert spec["env"]["vectorization"] == "envpool"
    with pytest.raises(SpecError, match="'playground/BallInCup': EnvPool has no MuJoCo Playground task 'BallInCup'"):
        load_spec(SPECS, "ppo_cartpole", ["env.name=playground/BallInCup"])
    with pytest.raises(SpecError, match="env.vectorization: .*runs only through EnvPool; expected 'envpool'"):
        load_spec(SPECS, "ppo_cartpole", ["env.name=playground/CartpoleBalance", "env.vectorization=sync"])
    with pytest.raises(SpecError, match="env.name: env 'Taxi-v4' has no EnvPool version"):
        load_spec(SPECS, "ppo_cartpole", ["env.name=Taxi-v4", "env.vectorization=envpool"])


def test_mujoco_hopper_steps_as_gymnasium_with_reset_noise_off():
    """Hopper-v5 with ``reset_noise_scale=0`` and the same actions: EnvPool's MuJoCo build and gymnasium's (another
    MuJoCo version) give the same observations, rewards (EnvPool's are float32), termination step and same-step
    reset, through two episodes."""
    actions = np.random.default_rng(0).uniform(-1, 1, (70, 1, 3))
    pool = envpool_vec.EnvPoolVectorEnv("Hopper-v5", 1, 1, {"reset_noise_scale": 0.0})
    ref = gym.make_vec("Hopper-v5", num_envs=1, vectorization_mode="sync", reset_noise_scale=0.0,
                       vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
    obs, _ = pool.reset(seed=[0])
    ref_obs, _ = ref.reset(seed=0)
    np.testing.assert_array_equal(obs, ref_obs)
    first, ends = obs.copy(), []
    for t, action in enumerate(actions):
        obs, reward, term, trunc, info = pool.step(action)
        ref_obs, ref_reward, ref_term, ref_trunc, ref_info = ref.step(action)
        np.testing.assert_allclose(obs, ref_obs, rtol=0, atol=1e-9)
        np.testing.assert_allclose(reward, ref_reward, rtol=1e-6)
        np.testing.assert_array_equal(term, ref_term)
        np.testing.assert_array_equal(trunc, ref_trunc)
        if term[0]:
            ends.append(t)
            np.testing.assert_allclose(info["final_obs"][0], ref_info["final_obs"][0], rtol=0, atol=1e-9)
            np.testing.assert_array_equal(obs, first)  # no reset noise: every episode starts at init_qpos
    assert ends[:2] == [26, 54] and reward.dtype == np.float32
    pool.close()
    ref.close()
