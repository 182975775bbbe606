"""FrameStackReplay (each frame of a (K, H, W) stack once): the samples are exactly Replay's through episode
ends, life losses without a reset, truncations, ring wrap-around (N not dividing max_size), env resets under a
restored buffer, state round trips, and FrameOnceReplay and Replay states written before it; its prioritized kind
samples what PrioritizedReplay samples; bytes per transition and the kind make_replay picks."""

import gymnasium as gym
import numpy as np
import pytest

from agents.memory import (
    FrameOnceReplay,
    FrameStackReplay,
    MemorySpec,
    PrioritizedFrameStackReplay,
    PrioritizedReplay,
    Replay,
    make_replay,
    transition_bytes,
)
from tests.agents.memory.test_replay_pixels import assert_same_samples as same_samples

K, HW = 4, (3, 2)  # small stacks: 4 frames of 3x2


def stream(memories, steps, n=3, seed=0, reset_at=None, state=None):
    """Feed the same stacked-frame rollout of ``n`` sub-envs into every memory, as a session does: stacks
    zero-padded at resets, frames random uint8 (few values, so equal frames occur), episodes of 3-9 steps that
    end terminated (a reset follows), truncated (a reset follows) or by a life loss (terminated, no reset).
    ``reset_at``: reset every sub-env at that step (a restored buffer under a fresh env). Returns the stream
    state to continue with (``state``)."""
    rng = np.random.default_rng(seed)
    if state is None:
        stacks = np.zeros((n, K, *HW), np.uint8)
        stacks[:, -1] = rng.integers(0, 3, (n, *HW))
        left = rng.integers(3, 10, n)
    else:
        stacks, left = state
    for t in range(steps):
        if t == reset_at:
            stacks = np.zeros_like(stacks)
            stacks[:, -1] = rng.integers(0, 3, (n, *HW))
        nxt = np.concatenate([stacks[:, 1:], rng.integers(0, 3, (n, 1, *HW)).astype(np.uint8)], axis=1)
        left -= 1
        end = left == 0
        kind = rng.integers(0, 3, n)  # 0 terminated, 1 truncated, 2 life lost
        term, trunc = end & (kind != 1), end & (kind == 1)
        act = rng.integers(0, 6, n)
        for mem in memories:
            mem.add(stacks, act, np.full(n, t, np.float32), nxt, term, trunc)
        reset = end & (kind != 2)
        stacks = nxt.copy()
        stacks[reset] = 0
        stacks[reset, -1] = rng.integers(0, 3, (int(reset.sum()), *HW))
        left[end] = rng.integers(3, 10, int(end.sum()))
    return stacks, left


def assert_same_samples(a, b, draws=30, seed=1):
    """30 equal samples and equal gathers of every row (``test_replay_pixels.assert_same_samples``)."""
    same_samples(a, b, draws, seed, every_row=True)


def pair(max_size, use_cer=False):
    return (Replay(max_size, (K, *HW), (), np.int64, 8, use_cer, np.uint8),
            FrameStackReplay(max_size, (K, *HW), (), np.int64, 8, use_cer, np.uint8))


@pytest.mark.parametrize("max_size, steps, use_cer", [(300, 40, False), (31, 60, True), (30, 61, False),
                                                      (6, 25, False), (7, 30, True)])
def test_samples_what_replay_samples(max_size, steps, use_cer):
    """Not full, full and wrapped many times (31, 7: N = 3 does not divide max_size; 6 = 2N, the least)."""
    plain, frames = pair(max_size, use_cer)
    stream([plain, frames], steps)
    assert len(plain) == len(frames) == min(max_size, 3 * steps)
    assert_same_samples(plain, frames)
    k = len(frames.heads)
    assert frames.is_head.sum() == k and k < len(frames)  # most rows rebuild from their predecessors
    for row, older in frames.heads.items():
        assert older.shape == (K - 1, *HW) and frames.is_head[row]


def test_heads_are_episode_starts_and_each_streams_oldest_row():
    """Before the ring wraps the heads are exactly the first add's rows and the steps after a reset; a life lost
    without a reset keeps the stack continuing (no head, no final observation)."""
    frames = FrameStackReplay(300, (K, *HW), (), np.int64, 8, obs_dtype=np.uint8)
    plain = Replay(300, (K, *HW), (), np.int64, 8, obs_dtype=np.uint8)
    stream([plain, frames], 50)
    obs, nxt = plain.data["obs"][:150], plain.data["next_obs"][:150]
    done = plain.data["terminated"][:150] > 0
    starts = {0, 1, 2} | {r + 3 for r in range(147) if not np.array_equal(nxt[r], obs[r + 3])}
    assert set(frames.heads) == starts
    assert set(frames.final) == {r for r in range(147) if not np.array_equal(nxt[r], obs[r + 3])}
    lives_lost = [r for r in range(147) if done[r] and np.array_equal(nxt[r], obs[r + 3])]
    assert lives_lost and not set(lives_lost) & set(frames.final)


def test_env_reset_state_round_trip_and_frame_once_states():
    """A reset of every sub-env mid-stream, a state round trip, more adds after it (the ring wrapping), and a
    FrameOnceReplay state (a checkpoint written before FrameStackReplay) loading into the same samples."""
    plain, frames = pair(40)
    once = FrameOnceReplay(40, (K, *HW), (), np.int64, 8, obs_dtype=np.uint8)
    state = stream([plain, frames, once], 9, reset_at=5)
    assert_same_samples(plain, frames)
    clone, converted = pair(40)[1], pair(40)[1]
    clone.load_state_dict(frames.state_dict())
    converted.load_state_dict(once.state_dict())
    assert set(converted.heads) == set(frames.heads) and converted.head == frames.head
    for m in (clone, converted):
        assert_same_samples(frames, m)
    stream([plain, frames, clone, converted, once], 30, seed=2, state=state)  # wraps: 117 rows into 40
    for m in (frames, clone, converted):
        assert_same_samples(plain, m)
    full = pair(40)[1]  # a full, wrapped FrameOnceReplay state: its oldest rows become heads
    full.load_state_dict(once.state_dict())
    assert_same_samples(plain, full)
    stream([plain, full], 20, seed=3)
    assert_same_samples(plain, full)
    from_plain = FrameStackReplay(40, (K, *HW), (), np.int64, 8, obs_dtype=np.uint8, num_envs=3)
    from_plain.load_state_dict(plain.state_dict())  # a Replay state (optimize_memory_usage false before)
    assert set(from_plain.heads) == set(full.heads) and set(from_plain.final) == set(full.final)
    assert_same_samples(plain, from_plain)
    stream([plain, from_plain], 10, seed=4)
    assert_same_samples(plain, from_plain)
    with pytest.raises(ValueError, match="loads a Replay state only with num_envs known"):
        pair(40)[1].load_state_dict(plain.state_dict())
    with pytest.raises(ValueError, match=r"shape \(4, 3, 3\) != \(4, 3, 2\)"):
        full.load_state_dict(FrameOnceReplay(40, (K, 3, 3), (), np.int64, 8).state_dict() | {"num_envs": 3})
    three = FrameStackReplay(40, (3, *HW), (), np.int64, 8, obs_dtype=np.uint8)  # stacks of 3 frames, not 4
    with pytest.raises(ValueError, match=r"heads hold \(3, 3, 2\) older frames, expected \(2, 3, 2\)"):
        three.load_state_dict(frames.state_dict())


@pytest.mark.parametrize("beta_start, max_size", [(None, 300), (0.4, 31)])
def test_prioritized_frame_stacks_sample_what_prioritized_replay_samples(beta_start, max_size):
    """The same transitions and TD errors: the same rows, weights and arrays as PrioritizedReplay (SLM-Lab's
    variant and the paper's), the ring wrapped or not; a PrioritizedReplay state loads into it."""
    args = (max_size, (K, *HW), (), np.int64, 8, False, np.uint8)
    per = PrioritizedReplay(*args, beta_start=beta_start)
    frames = PrioritizedFrameStackReplay(*args, beta_start=beta_start, num_envs=3)
    rng, ra, rb = np.random.default_rng(5), np.random.default_rng(1), np.random.default_rng(1)
    state = None
    for t in range(6):
        state = stream([per, frames], 10, seed=t, state=state)
        for _ in range(5):
            x, y = per.sample(ra, frame=30 * t), frames.sample(rb, frame=30 * t)
            assert x.keys() == y.keys()
            for k in x:
                np.testing.assert_array_equal(x[k], y[k], err_msg=k)
            td = rng.standard_normal(8)
            per.update_priorities(x["idx"], td)
            frames.update_priorities(y["idx"], td)
    loaded = PrioritizedFrameStackReplay(*args, beta_start=beta_start, num_envs=3)
    loaded.load_state_dict(per.state_dict())
    assert_same_samples(per, loaded, draws=0)
    a, b = np.random.default_rng(2), np.random.default_rng(2)
    for _ in range(5):
        x, y = per.sample(a), loaded.sample(b)
        for k in x:
            np.testing.assert_array_equal(x[k], y[k], err_msg=k)


def test_bytes_per_transition_and_selection():
    """(4, 84, 84) uint8: one 84x84 frame (7,056 bytes) + act, reward, terminated (16) + the head flag (1) per
    row: 7,073 bytes at max_size, against 28,240 (FrameOnceReplay) and 56,464 (Replay). make_replay picks the
    frame-stack kinds for (K, H, W) spaces unless optimize_memory_usage is false (null, the default, included;
    PrioritizedReplay too: + its sum tree), FrameOnceReplay for other shapes only when it is true."""
    atari = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    vec = gym.spaces.Box(-1, 1, (4,), np.float32)
    for optimize in (None, True):
        spec = MemorySpec(max_size=1000, optimize_memory_usage=optimize)
        mem = make_replay(spec, atari, (), np.int64, num_envs=4)
        assert type(mem) is FrameStackReplay and mem.num_envs == 4
        assert mem.nbytes == 1000 * 7_073 == transition_bytes(spec, atari, (), np.int64) * 1000
        assert mem.obs_nbytes == 28_224
        per = make_replay(spec, atari, (), np.int64, name="PrioritizedReplay")
        assert type(per) is PrioritizedFrameStackReplay and per.nbytes == 1000 * 7_073 + 2 * 1024 * 8
    assert type(make_replay(MemorySpec(optimize_memory_usage=True), vec, (), np.int64)) is FrameOnceReplay
    assert type(make_replay(MemorySpec(), vec, (), np.int64)) is Replay
    assert type(make_replay(MemorySpec(name="PrioritizedReplay"), vec, (), np.int64)) is PrioritizedReplay
    off = MemorySpec(max_size=1000, optimize_memory_usage=False)
    assert type(make_replay(off, atari, (), np.int64)) is Replay
    assert transition_bytes(off, atari, (), np.int64) == 56_464
    assert transition_bytes(MemorySpec(max_size=1_000_000), atari, (), np.int64, "PrioritizedReplay") == \
        7_073 + 2 * 2**20 * 8 / 1_000_000
    with pytest.raises(ValueError, match=r"PrioritizedReplay only for \(K, H, W\) frame stacks, not .* \(4,\)"):
        make_replay(MemorySpec(name="PrioritizedReplay", optimize_memory_usage=True), vec, (), np.int64)
    with pytest.raises(ValueError, match=r"needs \(K, H, W\) observations, got shape \(4,\)"):
        FrameStackReplay(10, (4,), (), np.int64, 2)
    with pytest.raises(ValueError, match="needs max_size >= 2 \\* num_envs, got 7 < 2 \\* 4"):
        FrameStackReplay(7, (4, 2, 2), (), np.int64, 2, num_envs=4)
