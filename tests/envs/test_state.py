"""Env state as data (``envs.state``) and the restricted unpickler of older ``env.pkl`` files
(``orchestrator.store.safe_pickle``): pickles written before the change continue bit-identically in a fresh env, the
state files hold no pickle, a state that does not fit is refused before anything is written, and a hostile pickle
never runs."""

import gzip
import io
import json
import pickle
import pickletools
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from envs import state
from envs.make import EnvSpec, make_env, sub_env_seeds
from orchestrator.store.safe_pickle import PickleRefused, StandIn, restricted_loads
from tests.envs.state_copy import state_copy

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "legacy_env"
# the specs the fixtures' env.pkl files were written with (by the code before env state became data)
LEGACY = {
    "cartpole": (EnvSpec("CartPole-v1", max_frame=100, num_envs=2, normalize_obs=True, normalize_reward=True,
                         reward_scale=2.0, max_t=20), {"seq_len": 3}),
    "acrobot": (EnvSpec("Acrobot-v1", max_frame=100, num_envs=2, frame_op="stack", frame_op_len=3, max_t=30), {}),
    "hopper": (EnvSpec("Hopper-v5", max_frame=100, num_envs=2, normalize_obs=True), {}),
    "pong": (EnvSpec("ALE/Pong-v5", max_frame=100, num_envs=2), {}),
}


def fresh(name, seed=9):
    spec, kwargs = LEGACY[name]
    env = make_env(spec, seed=seed, **kwargs)
    env.reset(seed=sub_env_seeds(seed, spec.num_envs))
    return env


def legacy_bytes(name):
    return gzip.decompress((FIXTURES / f"{name}.pkl.gz").read_bytes())


@pytest.mark.parametrize("name", list(LEGACY))
def test_legacy_env_pkl_continues_exactly_in_a_fresh_env(name):
    """Observations, rewards, dones and episode returns of the next 30-40 steps equal those the unpickled env gave
    when the fixture was written (classic control + normalizers + windows, frame stack, MuJoCo, ALE)."""
    env = fresh(name)
    state.restore(env, *state.legacy_tree(restricted_loads(legacy_bytes(name))))
    ref = np.load(FIXTURES / f"{name}_next.npz")
    for t, action in enumerate(ref["actions"]):
        obs, reward, terminated, truncated, info = env.step(action)
        for key, value in (("obs", obs), ("reward", reward), ("terminated", terminated), ("truncated", truncated)):
            np.testing.assert_array_equal(value, ref[key][t], err_msg=f"{name} step {t} {key}")
        mask = info.get("_episode", np.zeros(env.num_envs, bool))
        returns = np.where(mask, info["episode"]["r"], np.nan) if "episode" in info else np.full(env.num_envs, np.nan)
        np.testing.assert_array_equal(returns, ref["episode_r"][t], err_msg=f"{name} step {t} episode returns")
    env.close()


def test_state_files_are_json_and_arrays_without_pickle():
    env = fresh("cartpole")
    env.step(np.array([0, 1]))
    files = state.to_files(env)
    assert set(files) == set(state.STATE_FILES)
    tree = json.loads(files[state.JSON_FILE])
    assert tree["format"] == state.FORMAT and len(tree["sub_envs"]) == 2
    end = max(e["offset"] + np.dtype(e["dtype"]).itemsize * int(np.prod(e["shape"])) for e in tree["arrays"].values())
    assert end == len(files[state.ARRAYS_FILE])  # the arrays' bytes, nothing else
    for bad in ("|O", "[('a', '<f8')]"):
        index = {**tree["arrays"], "a0": {**tree["arrays"]["a0"], "dtype": bad}}
        with pytest.raises(state.EnvStateError, match="do not parse"):
            state.read_files({**files, state.JSON_FILE: json.dumps({**tree, "arrays": index}).encode()})
    layers = [layer["class"] for layer in tree["vector"]]
    assert layers[0] == "envs.wrappers.ObsWindow" and layers[-1].endswith("SyncVectorEnv")
    rms = tree["vector"][1]["fields"]["obs_rms"]
    assert rms["$t"] == "object" and rms["class"].endswith("RunningMeanStd")
    assert tree["sub_envs"][0][-1]["fields"]["_np_random"]["$t"] == "rng"
    env.close()


def test_a_state_that_does_not_fit_is_refused_before_anything_is_written():
    env = fresh("cartpole")
    for _ in range(5):
        env.step(np.array([1, 0]))
    tree, arrays = state.capture(env)
    other = make_env(EnvSpec("CartPole-v1", max_frame=100, num_envs=3, normalize_obs=True), seed=1, seq_len=3)
    with pytest.raises(state.EnvStateError, match="3 sub-envs, the saved state 2"):
        state.restore(other, tree, arrays)
    target = fresh("cartpole", seed=4)
    before = state.capture(target)
    bad = json.loads(json.dumps(tree))
    bad["sub_envs"][1][-1]["fields"]["_np_random"] = {"$t": "array", "k": next(iter(arrays))}
    with pytest.raises(state.EnvStateError, match="sub-env 1 CartPoleEnv._np_random: expected a Generator, got array"):
        state.restore(target, bad, arrays)
    bad = json.loads(json.dumps(tree))
    bad["vector"][0]["class"] = "os.system"
    with pytest.raises(state.EnvStateError, match="layers are"):
        state.restore(target, bad, arrays)
    after = state.capture(target)
    assert json.dumps(before[0]) == json.dumps(after[0])  # nothing was written
    for key in before[1]:
        np.testing.assert_array_equal(before[1][key], after[1][key])
    env.close()


def test_async_env_state_is_refused_with_reason():
    env = make_env(EnvSpec("CartPole-v1", max_frame=100, num_envs=2, vectorization="async"), seed=0)
    try:
        with pytest.raises(state.EnvStateError, match="AsyncVectorEnv runs its sub-envs outside this process"):
            state.capture(env)
    finally:
        env.close()


class _Creates:
    """Unpickled by a plain ``pickle.loads``, creates the file ``path``."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return open, (self.path, "w")


def test_a_hostile_pickle_is_refused_without_running(tmp_path):
    marker = tmp_path / "pwned"
    data = pickle.dumps({"env": _Creates(str(marker))})
    with pytest.raises(PickleRefused, match="'io.open'"):
        restricted_loads(data)
    assert not marker.exists()
    with pytest.raises(PickleRefused, match="persistent id"):
        restricted_loads(b"Px\n.")  # PERSID x


def test_allowlisted_callables_are_inert_stand_ins(tmp_path):
    """A pickle calling an allowlisted function that would write a directory (gymnasium's save_video) gets a
    stand-in that records the call; nothing runs."""
    target = tmp_path / "videos"
    data = (b"\x80\x04" + b"cgymnasium.utils.save_video\nsave_video\n" + pickle.dumps(([np.zeros((1, 2, 2, 3))],
            str(target)), protocol=4)[2:-1] + b"R.")
    pickletools.dis(data, out=io.StringIO())  # a well-formed pickle
    out = restricted_loads(data)
    assert isinstance(out, StandIn) and out.__pickled_class__ == "gymnasium.utils.save_video.save_video"
    assert out.pickled_args[1] == str(target) and not target.exists()
    with pytest.raises(state.EnvStateError, match="not a pickled SyncVectorEnv"):
        state.legacy_tree(out)


class _Counter:
    """State the generic protocol would not save (an object of its own)."""

    def __init__(self):
        self.steps = 0


class _CountingWrapper(gym.vector.VectorWrapper):
    """A layer that saves its state through the ``env_state`` / ``load_env_state`` hooks."""

    def __init__(self, env):
        super().__init__(env)
        self.counter = _Counter()

    def step(self, actions):
        self.counter.steps += 1
        return self.env.step(actions)

    def env_state(self):
        return {"steps": self.counter.steps}

    def load_env_state(self, fields):
        self.counter.steps = int(fields["steps"])


def test_a_layer_may_save_its_state_through_hooks():
    env = _CountingWrapper(fresh("acrobot"))
    for _ in range(4):
        env.step(np.array([0, 2]))
    copy = _CountingWrapper(fresh("acrobot", seed=3))
    assert state_copy(env, copy).counter.steps == 4
