"""Pixel replay: observations stored in the space's dtype (uint8 Atari frames), bytes per transition, and
FrameOnceReplay (each observation once, next by index) sampling exactly what Replay samples, through
episode ends, ring wrap-around, env resets under a restored buffer and state round trips."""

import gymnasium as gym
import numpy as np
import pytest

from agents.memory import FrameOnceReplay, MemorySpec, Replay, make_replay, storage_dtype
from envs.make import EnvSpec, final_obs, make_env, sub_env_seeds

ATARI = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)


def test_bytes_per_transition():
    """(4, 84, 84) uint8: 28,224 bytes per observation. Replay keeps obs and next_obs (+ 16 bytes of act,
    reward, terminated): 56,464 bytes; FrameOnceReplay 28,240; the float32 storage before this: 225,808."""
    size = 1000
    per = {name: cls(size, ATARI.shape, (), np.int64, 32, obs_dtype=dtype).nbytes / size
           for name, cls, dtype in (("float32", Replay, np.float32), ("uint8", Replay, np.uint8),
                                    ("frame_once", FrameOnceReplay, np.uint8))}
    assert per == {"float32": 225_808, "uint8": 56_464, "frame_once": 28_240}
    assert storage_dtype(np.float64) == np.float32 and storage_dtype(np.uint8) == np.uint8
    spec = MemorySpec(max_size=size, optimize_memory_usage=True)
    assert isinstance(make_replay(spec, ATARI, (), np.int64), FrameOnceReplay)
    plain = MemorySpec(max_size=size, optimize_memory_usage=False)
    assert type(make_replay(plain, ATARI, (), np.int64)) is Replay
    assert make_replay(plain, ATARI, (), np.int64).data["obs"].dtype == np.uint8


def fill(memories, steps, seed=0, reset_at=None):
    """Feed the same CartPole rollout (3 sub-envs, 6-step episodes) into every memory, as the session does;
    ``reset_at``: reset the env at that step (a restore without env state), so next obs do not follow."""
    env = make_env(EnvSpec("CartPole-v1", max_frame=1000, num_envs=3, max_t=6), seed=seed)
    obs, _ = env.reset(seed=sub_env_seeds(seed, 3))
    rng = np.random.default_rng(seed)
    for t in range(steps):
        if t == reset_at:
            obs, _ = env.reset(seed=sub_env_seeds(seed, 3, index=1))
        act = rng.integers(0, 2, 3)
        next_obs, reward, term, trunc, info = env.step(act)
        for mem in memories:
            mem.add(obs, act, reward, final_obs(next_obs, term | trunc, info), term, trunc)
        obs = next_obs
    env.close()


def assert_same_samples(a, b, draws=40, seed=1, every_row=False):
    """``draws`` samples of ``a`` and ``b`` from equal RNGs hold the same arrays; ``every_row``: so do their gathers
    of every stored row."""
    ra, rb = np.random.default_rng(seed), np.random.default_rng(seed)
    for _ in range(draws):
        x, y = a.sample(ra), b.sample(rb)
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k], err_msg=k)
    if every_row:
        rows = np.arange(len(a))
        x, y = a.gather(rows), b.gather(rows)
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k], err_msg=k)


@pytest.mark.parametrize("max_size, steps, use_cer", [(100, 20, False), (31, 50, True), (30, 50, False)])
def test_frame_once_samples_what_replay_samples(max_size, steps, use_cer):
    """Episode ends every 6 steps, the ring wraps (31: N = 3 does not divide it), CER on and off."""
    plain = Replay(max_size, (4,), (), np.int64, 16, use_cer)
    once = FrameOnceReplay(max_size, (4,), (), np.int64, 16, use_cer)
    fill([plain, once], steps)
    assert len(plain) == len(once) and once.final  # episode ends kept their true final observations
    assert_same_samples(plain, once)
    rows = np.arange(len(once))
    np.testing.assert_array_equal(once.next_obs(rows), plain.data["next_obs"][rows])


def test_frame_once_env_reset_and_state_round_trip():
    """An env reset mid-stream (no successor relation across it) and a state_dict round trip keep the
    samples equal to Replay's, also after more adds."""
    plain = Replay(40, (4,), (), np.int64, 16)
    once = FrameOnceReplay(40, (4,), (), np.int64, 16)
    fill([plain, once], 9, reset_at=5)
    assert_same_samples(plain, once)
    clone = FrameOnceReplay(40, (4,), (), np.int64, 16)
    clone.load_state_dict(once.state_dict())
    assert_same_samples(once, clone)
    fill([plain, once, clone], 7, seed=2)
    assert_same_samples(plain, clone)
    converted = FrameOnceReplay(40, (4,), (), np.int64, 16, num_envs=3)  # a Replay state (N known): same samples
    converted.load_state_dict(plain.state_dict())
    assert_same_samples(plain, converted)
    assert sorted(converted.final) == sorted(clone.final)
    fill([plain, converted], 5, seed=4)
    assert_same_samples(plain, converted)
    with pytest.raises(ValueError, match="loads a Replay state only with num_envs known"):
        FrameOnceReplay(40, (4,), (), np.int64, 16).load_state_dict(plain.state_dict())
    with pytest.raises(ValueError, match="not a FrameOnceReplay or Replay state"):
        converted.load_state_dict(Replay(40, (4,), (), np.int64, 16, store_next_obs=False).state_dict())


def zero_rows(n):
    """n all-zero transitions of 2-feature observations."""
    return np.zeros((n, 2)), np.zeros(n, np.int64), np.zeros(n), np.zeros((n, 2)), np.zeros(n, bool), np.zeros(n, bool)


def test_frame_once_errors():
    with pytest.raises(ValueError, match="max_size >= 2"):
        FrameOnceReplay(4, (2,), (), np.int64, 2).add(*zero_rows(3))
    mem = FrameOnceReplay(10, (2,), (), np.int64, 2)
    mem.add(*zero_rows(2))
    with pytest.raises(ValueError, match="takes 2 rows per add"):
        mem.add(*zero_rows(1))


@pytest.mark.parametrize("frame_once", [False, True])
def test_float16_obs_storage_rounds_as_slm_lab_replay(frame_once):
    """``memory.obs_dtype: float16`` (SLM-Lab's Replay): float observations stored as float16, half the bytes
    (CartPole (4,): 2 x 8 bytes of obs + 16 of act, reward, terminated = 32 per transition against 48), each
    sampled value the float16 rounding of the true one; uint8 frames unchanged. With ``optimize_memory_usage``
    only episode-end rows keep a final observation (a next obs is compared after rounding), and the samples are
    the plain float16 replay's."""
    space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    half = MemorySpec(max_size=200, batch_size=16, obs_dtype="float16")
    memory = make_replay(half, space, (), np.int64)
    assert memory.data["obs"].dtype == np.float16 and memory.nbytes == 200 * 32
    assert make_replay(MemorySpec(max_size=200), space, (), np.int64).nbytes == 200 * 48
    assert make_replay(half, ATARI, (), np.int64).data["frame"].dtype == np.uint8  # frames stay uint8
    assert storage_dtype(np.float64, np.float16) == np.float16 and storage_dtype(np.float16) == np.float16
    full = Replay(200, (4,), (), np.int64, 16)
    fill([memory, full], 30)  # 90 rows, 3 sub-envs, episodes of 6 steps
    np.testing.assert_array_equal(memory.data["obs"], full.data["obs"].astype(np.float16))
    np.testing.assert_array_equal(memory.data["next_obs"], full.data["next_obs"].astype(np.float16))
    assert not np.array_equal(memory.data["obs"][:90].astype(np.float32), full.data["obs"][:90])  # really rounded
    if frame_once:
        once = make_replay(MemorySpec(max_size=200, batch_size=16, obs_dtype="float16",
                                       optimize_memory_usage=True), space, (), np.int64)
        once32 = FrameOnceReplay(200, (4,), (), np.int64, 16)
        fill([once, once32], 30)
        assert once.data["obs"].dtype == np.float16
        assert 0 < len(once.final) == len(once32.final) < 30  # the episode ends only, not every row
        assert_same_samples(memory, once)
