"""The session clock: frame/epi/t counting with vector envs, cadence, state round trip, errors."""

import time

import numpy as np
import pytest

from envs.clock import Clock

NONE = np.zeros(3, bool)


def done(*idx, n=3):
    out = np.zeros(n, bool)
    out[list(idx)] = True
    return out


def test_tick_counts_frames_over_vector_envs():
    clock = Clock(max_frame=30, num_envs=3)
    for _ in range(4):
        clock.tick(NONE)
    assert (clock.frame, clock.t, clock.epi, clock.opt_step) == (12, 4, 0, 0)
    assert not clock.done()


def test_epi_counts_every_sub_env_episode():
    clock = Clock(100, num_envs=3)
    clock.tick(done(1))
    clock.tick(done(0, 2))
    clock.tick(done(0, 1, 2))
    assert clock.epi == 6


def test_t_follows_sub_env_zero_and_resets_on_its_done():
    clock = Clock(100, num_envs=3)
    ts = []
    for d in (NONE, NONE, done(1, 2), done(0), NONE, done(0, 1)):
        clock.tick(d)
        ts.append(clock.t)
    assert ts == [1, 2, 3, 0, 1, 0]  # other sub-envs' dones do not reset t


def test_done_at_max_frame_even_if_overshooting():
    clock = Clock(max_frame=10, num_envs=4)
    clock.tick(done(n=4))
    clock.tick(done(n=4))
    assert not clock.done()
    clock.tick(done(n=4))
    assert clock.frame == 12 and clock.done()


def test_tick_opt_step():
    clock = Clock(10)
    clock.tick_opt_step()
    clock.tick_opt_step(5)
    assert clock.opt_step == 6


def test_crossed_with_vector_steps():
    clock = Clock(1000, num_envs=3)
    hits = []
    while clock.frame < 1000:
        prev = clock.frame
        clock.tick(NONE)
        if clock.crossed(prev, 100):
            hits.append(clock.frame)
    # first frame (a multiple of 3) at or past each multiple of 100, none skipped or repeated
    assert hits == [102, 201, 300, 402, 501, 600, 702, 801, 900, 1002]


def test_crossed_exact_and_nonpositive_frequency():
    clock = Clock(100, num_envs=4)
    clock.frame = 8
    assert clock.crossed(4, 8) and not clock.crossed(8, 8)
    assert not clock.crossed(4, 0) and not clock.crossed(4, -1)
    clock.frame = 40
    assert clock.crossed(0, 16)  # two boundaries in one jump count once


def test_wall_t_starts_on_start_timer():
    clock = Clock(10)
    assert clock.wall_t == 0.0
    clock.start_timer()
    time.sleep(0.01)
    assert clock.wall_t >= 0.01


def test_state_dict_round_trip():
    clock = Clock(max_frame=100, num_envs=2)
    clock.start_timer()
    for d in (done(n=2), done(1, n=2), done(0, n=2), done(n=2)):
        clock.tick(d)
    clock.tick_opt_step(7)
    clock.resume_count = 2
    state = clock.state_dict()
    assert {k: state[k] for k in ("frame", "t", "epi", "opt_step", "resume_count", "num_envs")} == \
        {"frame": 8, "t": 1, "epi": 2, "opt_step": 7, "resume_count": 2, "num_envs": 2}
    assert all(isinstance(v, (int, float)) for v in state.values())

    restored = Clock(max_frame=500, num_envs=2)  # a resume may raise max_frame
    restored.load_state_dict({**state, "wall_t": 12.5})
    counters = (restored.frame, restored.t, restored.epi, restored.opt_step, restored.resume_count)
    assert counters == (8, 1, 2, 7, 2)
    assert restored.max_frame == 500
    assert restored.wall_t == 12.5  # stopped until the loop restarts the timer
    restored.start_timer()
    time.sleep(0.01)
    assert restored.wall_t >= 12.51
    restored.tick(done(n=2))
    assert (restored.frame, restored.t) == (10, 2)


def test_errors():
    with pytest.raises(ValueError, match="max_frame"):
        Clock(0)
    with pytest.raises(ValueError, match="max_frame"):
        Clock(-5)
    with pytest.raises(ValueError, match="num_envs"):
        Clock(10, num_envs=0)
    state = Clock(10, num_envs=2).state_dict()
    with pytest.raises(ValueError, match="num_envs 2 != 4"):
        Clock(10, num_envs=4).load_state_dict(state)
    del state["epi"]
    with pytest.raises(KeyError, match="epi"):
        Clock(10, num_envs=2).load_state_dict(state)
