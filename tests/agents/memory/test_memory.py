"""Memories: ring-buffer wrap-around, sample shapes, on-policy rollouts and episodes, state round trips."""

import numpy as np
import pytest
import torch

from agents.memory import MEMORIES, OnPolicyBatchReplay, OnPolicyReplay, Replay

OBS_DIM = 3


def vec_step(start: int, n: int, terminated=None, truncated=None):
    """One vector step of n sub-envs whose rows are tagged by an id: obs = id, reward = id."""
    ids = np.arange(start, start + n)
    obs = np.repeat(ids[:, None], OBS_DIM, axis=1).astype(np.float32)
    return (obs, ids % 2, ids.astype(np.float32), obs + 0.5,
            np.zeros(n, bool) if terminated is None else np.asarray(terminated, bool),
            np.zeros(n, bool) if truncated is None else np.asarray(truncated, bool))


def test_registry_names():
    assert set(MEMORIES) == {"Replay", "PrioritizedReplay", "OnPolicyReplay", "OnPolicyCrossEntropy",
                             "OnPolicyBatchReplay"}


# ---------------------------------------------------------------- Replay

def test_replay_vector_adds_wrap_around():
    mem = Replay(max_size=10, obs_shape=(OBS_DIM,), act_shape=(), act_dtype=np.int64, batch_size=4)
    mem.add(*vec_step(0, 4))
    assert (mem.head, mem.size, len(mem)) == (4, 4, 4)
    mem.add(*vec_step(4, 4))
    assert (mem.head, mem.size) == (8, 8)
    mem.add(*vec_step(8, 4))  # rows 8, 9 fill the end, rows 10, 11 overwrite slots 0, 1
    assert (mem.head, mem.size) == (2, 10)
    np.testing.assert_array_equal(mem.data["reward"], [10, 11, 2, 3, 4, 5, 6, 7, 8, 9])
    np.testing.assert_array_equal(mem.data["obs"][:, 0], [10, 11, 2, 3, 4, 5, 6, 7, 8, 9])
    np.testing.assert_array_equal(mem.data["next_obs"][1], [11.5] * OBS_DIM)
    np.testing.assert_array_equal(mem.data["act"], np.array([10, 11, 2, 3, 4, 5, 6, 7, 8, 9]) % 2)
    mem.add(*vec_step(12, 4))  # slots 2..5 now hold 12..15; the oldest left is row 6
    assert (mem.head, mem.size) == (6, 10)
    np.testing.assert_array_equal(mem.data["reward"], [10, 11, 12, 13, 14, 15, 6, 7, 8, 9])


def test_replay_stores_terminated_not_truncated():
    mem = Replay(10, (OBS_DIM,), (), np.int64, 2)
    mem.add(*vec_step(0, 3, terminated=[False, True, False], truncated=[False, False, True]))
    np.testing.assert_array_equal(mem.data["terminated"][:3], [0.0, 1.0, 0.0])
    assert mem.data["terminated"].dtype == np.float32
    assert "truncated" not in mem.data  # a time-limit cut still bootstraps in Q targets


def test_replay_sample_shapes_and_dtypes():
    mem = Replay(100, (OBS_DIM,), (), np.int64, batch_size=16)
    for i in range(5):
        mem.add(*vec_step(4 * i, 4))
    batch = mem.sample(np.random.default_rng(0))
    assert set(batch) == {"obs", "act", "reward", "next_obs", "terminated"}
    assert batch["obs"].shape == (16, OBS_DIM) and batch["obs"].dtype == np.float32
    assert batch["next_obs"].shape == (16, OBS_DIM) and batch["next_obs"].dtype == np.float32
    assert batch["act"].shape == (16,) and batch["act"].dtype == np.int64
    assert batch["reward"].shape == (16,) and batch["reward"].dtype == np.float32
    assert batch["terminated"].shape == (16,) and batch["terminated"].dtype == np.float32
    assert batch["reward"].max() < 20  # only valid rows are drawn
    np.testing.assert_array_equal(batch["obs"][:, 0], batch["reward"])  # rows stay aligned


def test_replay_continuous_actions_shape():
    mem = Replay(8, (OBS_DIM,), (2,), np.float32, batch_size=5)
    obs, _, rew, nxt, term, trunc = vec_step(0, 2)
    mem.add(obs, np.ones((2, 2), np.float32), rew, nxt, term, trunc)
    assert mem.sample(np.random.default_rng(0))["act"].shape == (5, 2)


def test_replay_use_cer_includes_newest_even_after_wrap():
    mem = Replay(10, (OBS_DIM,), (), np.int64, batch_size=8, use_cer=True)
    for i in range(3):
        mem.add(*vec_step(4 * i, 4))  # newest row 11 sits in slot 1
    rng = np.random.default_rng(1)
    for _ in range(5):
        batch = mem.sample(rng)
        assert batch["reward"][-1] == 11.0


def test_replay_sample_is_seeded():
    mem = Replay(50, (OBS_DIM,), (), np.int64, batch_size=8)
    for i in range(10):
        mem.add(*vec_step(4 * i, 4))
    a = mem.sample(np.random.default_rng(7))["reward"]
    b = mem.sample(np.random.default_rng(7))["reward"]
    np.testing.assert_array_equal(a, b)


def test_replay_errors():
    with pytest.raises(ValueError, match="max_size"):
        Replay(0, (OBS_DIM,), (), np.int64, 4)
    with pytest.raises(ValueError, match="batch_size"):
        Replay(10, (OBS_DIM,), (), np.int64, 0)
    with pytest.raises(ValueError, match="empty"):
        Replay(10, (OBS_DIM,), (), np.int64, 4).sample(np.random.default_rng(0))


@pytest.mark.parametrize("n_adds", [2, 3])  # not full / full after wrap-around
def test_replay_state_dict_round_trip(n_adds, tmp_path):
    mem = Replay(10, (OBS_DIM,), (), np.int64, batch_size=6)
    for i in range(n_adds):
        mem.add(*vec_step(4 * i, 4))
    state = mem.state_dict()
    assert state["size"] == min(4 * n_adds, 10) and state["head"] == (4 * n_adds) % 10
    torch.save({"data": {k: torch.from_numpy(v) for k, v in state["data"].items()},
                "head": state["head"], "size": state["size"]}, tmp_path / "replay.pt")
    loaded = torch.load(tmp_path / "replay.pt", weights_only=True)
    fresh = Replay(10, (OBS_DIM,), (), np.int64, batch_size=6)
    fresh.load_state_dict({**loaded, "data": {k: v.numpy() for k, v in loaded["data"].items()}})
    assert (fresh.head, fresh.size) == (mem.head, mem.size)
    for k in mem.data:
        np.testing.assert_array_equal(fresh.data[k], mem.data[k])
    # the restored buffer samples and keeps writing exactly like the original
    np.testing.assert_array_equal(fresh.sample(np.random.default_rng(3))["reward"],
                                  mem.sample(np.random.default_rng(3))["reward"])
    mem.add(*vec_step(100, 4))
    fresh.add(*vec_step(100, 4))
    np.testing.assert_array_equal(fresh.data["reward"], mem.data["reward"])


def test_replay_load_state_dict_rejects_misfits():
    big = Replay(20, (OBS_DIM,), (), np.int64, 4)
    for i in range(4):
        big.add(*vec_step(4 * i, 4))
    with pytest.raises(ValueError, match="16 rows > max_size 10"):
        Replay(10, (OBS_DIM,), (), np.int64, 4).load_state_dict(big.state_dict())
    with pytest.raises(ValueError, match="shape"):
        Replay(20, (OBS_DIM + 1,), (), np.int64, 4).load_state_dict(big.state_dict())


# ---------------------------------------------------------------- OnPolicyBatchReplay

def test_batch_replay_ready_and_pop_shapes():
    mem = OnPolicyBatchReplay(horizon=3)
    for t in range(2):
        mem.add(*vec_step(10 * t, 4))
        assert not mem.ready()
    mem.add(*vec_step(20, 4, terminated=[0, 1, 0, 0], truncated=[0, 0, 0, 1]))
    assert mem.ready() and len(mem) == 3
    batch = mem.pop()
    assert batch["obs"].shape == (3, 4, OBS_DIM) and batch["next_obs"].shape == (3, 4, OBS_DIM)
    for k in ("act", "reward", "terminated", "truncated"):
        assert batch[k].shape == (3, 4), k
    np.testing.assert_array_equal(batch["reward"][:, 0], [0, 10, 20])   # time-major
    np.testing.assert_array_equal(batch["reward"][2], [20, 21, 22, 23])  # env on the second axis
    np.testing.assert_array_equal(batch["terminated"][2], [False, True, False, False])
    np.testing.assert_array_equal(batch["truncated"][2], [False, False, False, True])
    assert len(mem) == 0 and not mem.ready()


def test_batch_replay_state_dict_round_trip():
    mem = OnPolicyBatchReplay(horizon=4)
    assert mem.state_dict() == {"data": {}}
    mem.add(*vec_step(0, 2))
    mem.add(*vec_step(2, 2, terminated=[1, 0]))
    fresh = OnPolicyBatchReplay(horizon=4)
    fresh.load_state_dict(mem.state_dict())
    assert len(fresh) == 2
    for m in (mem, fresh):
        m.add(*vec_step(4, 2))
        m.add(*vec_step(6, 2))
    a, b = mem.pop(), fresh.pop()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    empty = OnPolicyBatchReplay(4)
    empty.load_state_dict({"data": {}})
    assert len(empty) == 0


def rollout_steps(num_steps: int, n: int = 2, done_at: int = 2):
    """A session loop's steps (obs = next_obs): observation arrays (n, OBS_DIM) valued t; step ``done_at`` ends
    sub-env 0's episode, so its next obs holds the final obs -1 there (a copy, as ``final_obs`` makes)."""
    obs, steps = np.zeros((n, OBS_DIM), np.float32), []
    for t in range(num_steps):
        next_obs = np.full((n, OBS_DIM), t + 1, np.float32)
        terminated = np.arange(n) == 0 if t == done_at else np.zeros(n, bool)
        stored = next_obs
        if terminated.any():
            stored = next_obs.copy()
            stored[0] = -1.0
        steps.append((obs, np.zeros(n, np.int64), np.full(n, t, np.float32), stored, terminated, np.zeros(n, bool)))
        obs = next_obs
    return steps


def test_batch_replay_holds_each_observation_once():
    """4 steps, sub-env 0 done at step 2: the memory keeps next obs only for step 2 (final obs) and step 3
    (the last), in memory and in its state dict, and pop rebuilds every step's next obs."""
    mem = OnPolicyBatchReplay(horizon=4)
    steps = rollout_steps(4)
    for step in steps:
        mem.add(*step)
    assert [n is None for n in mem.next_obs] == [True, True, False, False]
    data = mem.state_dict()["data"]
    assert data["next_obs"].shape == (2, 2, OBS_DIM) and data["next_rows"].tolist() == [2, 3]
    fresh = OnPolicyBatchReplay(horizon=4)
    fresh.load_state_dict(mem.state_dict())
    for m in (mem, fresh):
        batch = m.pop()
        np.testing.assert_array_equal(batch["next_obs"], np.stack([s[3] for s in steps]))
        np.testing.assert_array_equal(batch["next_shared"], [True, True, False, False])
        assert batch["next_obs"][2, 0, 0] == -1.0 and batch["next_obs"][1, 0, 0] == 2.0


def test_batch_replay_resumed_mid_rollout_shares_as_the_run_did():
    """Restored after step 1 and fed copies of the observations (a resumed session's obs is a restored
    array, not the stored one): the same steps are shared as in the uninterrupted memory; a state dict
    with every step's next obs (the format before) loads too."""
    steps = rollout_steps(4)
    straight, resumed = OnPolicyBatchReplay(4), OnPolicyBatchReplay(4)
    for step in steps:
        straight.add(*step)
    for step in steps[:2]:
        resumed.add(*step)
    state = resumed.state_dict()
    resumed = OnPolicyBatchReplay(4)
    resumed.load_state_dict(state)
    for step in steps[2:]:
        resumed.add(*(a.copy() for a in step))
    a, b = straight.pop(), resumed.pop()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    old = OnPolicyBatchReplay(4)
    old_data = {k: np.stack([s[i] for s in steps]) for i, k in enumerate(
        ("obs", "act", "reward", "next_obs", "terminated", "truncated"))}
    old.load_state_dict({"data": old_data})
    np.testing.assert_array_equal(old.pop()["next_obs"], a["next_obs"])


def test_batch_replay_rejects_bad_horizon():
    with pytest.raises(ValueError, match="horizon"):
        OnPolicyBatchReplay(0)


# ---------------------------------------------------------------- OnPolicyReplay

def fill_episodes(mem: OnPolicyReplay) -> None:
    """Two sub-envs: env 0 ends (terminated) at step 1, env 1 ends (truncated) at step 2; env 0's
    and env 1's second episodes are unfinished after step 3. Rewards tag (step, env) as 10 * step + env."""
    dones = [([0, 0], [0, 0]), ([1, 0], [0, 0]), ([0, 0], [0, 1]), ([0, 0], [0, 0])]
    for step, (term, trunc) in enumerate(dones):
        obs, act, _, nxt, t, tr = vec_step(0, 2, term, trunc)
        mem.add(obs, act, np.array([10 * step, 10 * step + 1], np.float32), nxt, t, tr)


def test_onpolicy_replay_episode_boundaries_across_envs():
    mem = OnPolicyReplay(num_episodes=2, num_envs=2)
    fill_episodes(mem)
    assert mem.ready() and len(mem) == 8
    batch = mem.pop()
    # env 0's episode (steps 0, 1) completed first, then env 1's (steps 0, 1, 2)
    np.testing.assert_array_equal(batch["reward"], [0, 10, 1, 11, 21])
    np.testing.assert_array_equal(batch["terminated"], [False, True, False, False, False])
    np.testing.assert_array_equal(batch["truncated"], [False, False, False, False, True])
    assert batch["obs"].shape == (5, OBS_DIM) and batch["act"].shape == (5,)
    # unfinished episodes stay: env 0's steps 2, 3 and env 1's step 3
    assert len(mem) == 3 and not mem.ready()
    mem.add(*vec_step(0, 2, terminated=[1, 1]))
    assert len(mem.done_episodes) == 2
    np.testing.assert_array_equal(mem.pop()["reward"], [20, 30, 0, 31, 1])


def test_onpolicy_replay_ready_counts_episodes_over_envs():
    mem = OnPolicyReplay(num_episodes=3, num_envs=2)
    fill_episodes(mem)
    assert not mem.ready()  # 2 of 3 episodes
    mem.add(*vec_step(0, 2, terminated=[1, 0]))
    assert mem.ready()


def test_onpolicy_replay_state_dict_round_trip():
    mem = OnPolicyReplay(num_episodes=3, num_envs=2)
    fill_episodes(mem)
    state = mem.state_dict()
    np.testing.assert_array_equal(state["done"]["lengths"], [2, 3])
    np.testing.assert_array_equal(state["current"]["lengths"], [2, 1])
    fresh = OnPolicyReplay(num_episodes=3, num_envs=2)
    fresh.load_state_dict(state)
    assert len(fresh) == len(mem) == 8
    for m in (mem, fresh):
        m.add(*vec_step(0, 2, terminated=[1, 1]))
    a, b = mem.pop(), fresh.pop()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    np.testing.assert_array_equal(a["reward"], [0, 10, 1, 11, 21, 20, 30, 0, 31, 1])


def test_onpolicy_replay_empty_state_round_trip():
    mem = OnPolicyReplay(1, 3)
    fresh = OnPolicyReplay(1, 3)
    fresh.load_state_dict(mem.state_dict())
    assert len(fresh) == 0 and len(fresh.current) == 3


def test_onpolicy_replay_rejects_bad_frequency():
    with pytest.raises(ValueError, match="training_frequency"):
        OnPolicyReplay(0, 1)


# ---------------------------------------------------------------- cut_episodes (env reset under a restored memory)

def test_batch_replay_cut_episodes_truncates_last_step_only():
    mem = OnPolicyBatchReplay(horizon=4)
    mem.cut_episodes()  # empty: nothing to cut
    assert len(mem) == 0
    mem.add(*vec_step(0, 3, truncated=[1, 0, 0]))
    mem.add(*vec_step(3, 3, terminated=[0, 1, 0]))
    mem.cut_episodes()
    mem.add(*vec_step(6, 3))
    mem.add(*vec_step(9, 3))
    batch = mem.pop()
    # step 1 ends every sub-env's episode: env 1 stays terminated (not also truncated), envs 0, 2 truncate
    np.testing.assert_array_equal(batch["truncated"], [[1, 0, 0], [1, 0, 1], [0, 0, 0], [0, 0, 0]])
    np.testing.assert_array_equal(batch["terminated"], [[0, 0, 0], [0, 1, 0], [0, 0, 0], [0, 0, 0]])
    assert batch["truncated"].dtype == bool
    np.testing.assert_array_equal(batch["reward"][1], [3, 4, 5])  # the rest of the step is untouched
    np.testing.assert_array_equal(batch["next_obs"][1, :, 0], [3.5, 4.5, 5.5])


def test_onpolicy_replay_cut_episodes_drops_unfinished():
    mem = OnPolicyReplay(num_episodes=3, num_envs=2)
    fill_episodes(mem)  # 2 complete episodes, unfinished: env 0 (2 steps), env 1 (1 step)
    mem.cut_episodes()
    assert len(mem) == 5 and [len(ep) for ep in mem.current] == [0, 0]
    mem.add(*vec_step(0, 2, terminated=[1, 0]))  # env 0's new episode: one step
    batch = mem.pop()
    np.testing.assert_array_equal(batch["reward"], [0, 10, 1, 11, 21, 0])
    np.testing.assert_array_equal(batch["terminated"], [False, True, False, False, False, True])
    assert [len(ep) for ep in mem.current] == [0, 1]


def test_replay_cut_episodes_keeps_rows():
    mem = Replay(max_size=10, obs_shape=(OBS_DIM,), act_shape=(), act_dtype=np.int64, batch_size=4)
    mem.add(*vec_step(0, 4))
    before = {k: v.copy() for k, v in mem.data.items()}
    mem.cut_episodes()
    assert (mem.head, mem.size) == (4, 4)
    for k, v in mem.data.items():
        np.testing.assert_array_equal(v, before[k])


@pytest.mark.parametrize("frame_once", [False, True])
@pytest.mark.parametrize("use_cer", [False, True])
def test_replay_sample_many_is_n_sample_calls(frame_once, use_cer):
    """One draw of n batches gives, row for row, the arrays of n ``sample`` calls from the same RNG state
    (DQN's grouped update relies on it), and leaves the RNG where those calls leave it."""
    from agents.memory import FrameOnceReplay

    cls = FrameOnceReplay if frame_once else Replay
    mem = cls(50, (3,), (), np.int64, batch_size=5, use_cer=use_cer)
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((2, 3)).astype(np.float32)
    for t in range(40):
        nxt = rng.standard_normal((2, 3)).astype(np.float32)
        term = np.array([t % 7 == 6, False])
        mem.add(obs, np.array([t, -t]), np.full(2, t, np.float32), nxt, term, np.zeros(2, bool))
        obs = np.where(term[:, None], rng.standard_normal((2, 3)).astype(np.float32), nxt)
    one, many = np.random.default_rng(3), np.random.default_rng(3)
    singles = [mem.sample(one) for _ in range(4)]
    group = mem.sample_many(many, 4)
    assert set(group) == set(singles[0]) == {"obs", "act", "reward", "next_obs", "terminated"}
    for k, v in group.items():
        assert v.shape == (4, 5, *singles[0][k].shape[1:])
        np.testing.assert_array_equal(v, np.stack([s[k] for s in singles]))
    assert one.random() == many.random()
