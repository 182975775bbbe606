"""RecurrentNet (agents.nets) and the observation windows it reads (envs.wrappers.ObsWindow)."""

import dataclasses

import gymnasium as gym
import numpy as np
import pytest
import torch

from agents.nets import NetSpec, RecurrentNet, make_net, seq_len_of
from envs.make import EnvSpec, make_env, sub_env_seeds
from orchestrator.errors import SpecError
from orchestrator.spec.load import load_spec
from tests.envs.state_copy import state_copy

RNN_SPEC = NetSpec(type="RecurrentNet", cell_type="GRU", rnn_hidden_size=8, seq_len=3, fc_hid_layers=[5])


@pytest.mark.parametrize("cell_type", ["GRU", "LSTM", "RNN"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_forward_shapes_heads_and_extras(cell_type, bidirectional):
    torch.manual_seed(0)
    spec = dataclasses.replace(RNN_SPEC, cell_type=cell_type, bidirectional=bidirectional, rnn_num_layers=2,
                               init_fn="orthogonal_")
    space = gym.spaces.Box(-1, 1, (3, 4), np.float32)
    net = make_net(spec, space, [2, 1], head_gains=[0.01, 1.0], extra_in_dim=2)
    assert isinstance(net.rnn, {"GRU": torch.nn.GRU, "LSTM": torch.nn.LSTM, "RNN": torch.nn.RNN}[cell_type])
    assert (net.rnn.input_size, net.rnn.hidden_size, net.rnn.num_layers) == (5, 8, 2)
    x, extra = torch.randn(6, 3, 4), torch.randn(6, 2)
    logits, value = net(x, extra)
    assert logits.shape == (6, 2) and value.shape == (6, 1)
    single = make_net(spec, space, 2)
    assert single(x).shape == (6, 2)
    # every step of the window reaches the output; rows are independent
    changed = x.clone()
    changed[0, 0] += 1.0
    out, out_changed = single(x), single(changed)
    assert not torch.allclose(out[0], out_changed[0]) and torch.equal(out[1:], out_changed[1:])
    assert all(p.grad is None for p in net.parameters())
    sum(t.sum() for t in net(x, extra)).backward()
    assert all(p.grad is not None for p in net.rnn.parameters())


def test_output_is_the_last_layer_final_hidden_state_through_the_head():
    torch.manual_seed(1)
    net = RecurrentNet((3, 4), 2, "GRU", 8, fc_hid_layers=[])
    x = torch.randn(5, 3, 4)
    h = torch.zeros(1, 5, 8)
    for t in range(3):  # GRU step by step: the same last hidden state as the batch-first sequence
        _, h = net.rnn(x[:, t:t + 1], h)
    head = net.heads[0][0]
    torch.testing.assert_close(net(x), h[-1] @ head.weight.T + head.bias)


def test_init_fn_applies_to_cell_weights_and_zeroes_biases():
    net = make_net(dataclasses.replace(RNN_SPEC, init_fn="orthogonal_"), gym.spaces.Box(-1, 1, (3, 4)), 2)
    w = net.rnn.weight_hh_l0.detach()  # (3H, H), orthogonal columns
    torch.testing.assert_close(w.T @ w, torch.eye(8), atol=1e-5, rtol=0)
    assert all(torch.count_nonzero(b) == 0 for n, b in net.rnn.named_parameters() if n.startswith("bias"))


def test_from_spec_refuses_plain_observations_and_missing_keys():
    with pytest.raises(ValueError, match=r"seq_len=3"):
        make_net(RNN_SPEC, gym.spaces.Box(-1, 1, (4,), np.float32), 2)
    with pytest.raises(ValueError, match=r"agent.net.rnn_hidden_size"):
        make_net(dataclasses.replace(RNN_SPEC, rnn_hidden_size=None), gym.spaces.Box(-1, 1, (3, 4)), 2)
    with pytest.raises(ValueError, match=r"unknown cell_type 'TCN'"):
        RecurrentNet((3, 4), 2, "TCN", 8)
    assert seq_len_of(RNN_SPEC) == 3 and seq_len_of(NetSpec(seq_len=3)) is None


def test_spec_validation_names_missing_recurrent_keys(tmp_path):
    import json
    spec = {"s": {"agent": {"name": "PPO", "algorithm": {"name": "PPO"}, "memory": {"name": "OnPolicyBatchReplay"},
                            "net": {"type": "RecurrentNet", "cell_type": "GRU", "fc_hid_layers": []}},
                  "env": {"name": "CartPole-v1", "max_frame": 100}, "meta": {}}}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(spec))
    with pytest.raises(SpecError) as err:
        load_spec(str(path), "s")
    assert "agent.net.rnn_hidden_size: net.type RecurrentNet needs it" in str(err.value)
    assert "agent.net.seq_len: net.type RecurrentNet needs it" in str(err.value)
    spec["s"]["agent"]["net"]["cell_type"] = "GRUU"
    path.write_text(json.dumps(spec))
    with pytest.raises(SpecError, match=r"agent.net.cell_type: expected one of \['GRU', 'LSTM', 'RNN'\]"):
        load_spec(str(path), "s")


# ---------------------------------------------------------------- observation windows

def _envs(seq_len, normalize=False):
    spec = EnvSpec("CartPole-v1", 10_000, num_envs=2, normalize_state=normalize)
    return make_env(spec, 0, seq_len=seq_len), make_env(spec, 0)


def test_windows_shift_and_reset_at_episode_ends_value_by_value():
    """Windows against the raw observations of an identical env: shifted by one each step, and on a done
    row the final window ends in the true final observation while the new one is zeros + first obs."""
    windowed, raw = _envs(3)
    assert windowed.single_observation_space.shape == (3, 4)
    seeds = sub_env_seeds(0, 2)
    w, _ = windowed.reset(seed=seeds)
    o, _ = raw.reset(seed=seeds)
    expected = np.zeros((2, 3, 4), np.float32)
    expected[:, -1] = o
    np.testing.assert_array_equal(w, expected)
    ends = 0
    for step in range(60):
        act = np.array([step % 2, 0])  # sub-env 1 always pushes left: short episodes
        w, _, term, trunc, info = windowed.step(act)
        o, _, r_term, r_trunc, r_info = raw.step(act)
        np.testing.assert_array_equal(term, r_term)
        done = term | trunc
        for i in range(2):
            shifted = np.concatenate([expected[i, 1:], (r_info["final_obs"][i] if done[i] else o[i])[None]])
            if done[i]:
                np.testing.assert_array_equal(info["final_obs"][i], shifted)
                expected[i] = 0
                expected[i, -1] = o[i]
                ends += 1
            else:
                expected[i] = shifted
        np.testing.assert_array_equal(w, expected)
    assert ends >= 3  # several episode ends were checked, in both sub-envs' windows


def test_windows_saved_mid_episode_and_continue_identically():
    env, _ = _envs(4)
    env.reset(seed=sub_env_seeds(0, 2))
    for _ in range(2):
        env.step(np.array([1, 1]))
    copy, _ = _envs(4)
    copy.reset(seed=sub_env_seeds(1, 2))
    state_copy(env, copy)
    np.testing.assert_array_equal(copy.window, env.window)
    assert np.count_nonzero(env.window[:, 0]) == 0 and np.count_nonzero(env.window[:, 1]) > 0  # padded
    for step in range(30):
        a, b = env.step(np.array([step % 2, 0])), copy.step(np.array([step % 2, 0]))
        np.testing.assert_array_equal(a[0], b[0])


def test_windows_hold_normalized_observations_and_forward_the_statistics():
    env, _ = _envs(2, normalize=True)
    w, _ = env.reset(seed=sub_env_seeds(0, 2))
    np.testing.assert_array_equal(w[:, 0], 0)  # zero padding, not a normalized zero observation
    w, *_ = env.step(np.array([0, 1]))
    inner = env.env  # NormalizeObservation
    assert env.obs_rms is inner.obs_rms
    env.update_running_mean = False
    assert inner.update_running_mean is False
    np.testing.assert_array_less(np.abs(w), 10.0 + 1e-6)


def test_preflight_counts_replay_of_windows():
    from pathlib import Path

    from orchestrator.spec.preflight import check_env, memory_needs, replay_bytes
    specs = str(Path(__file__).resolve().parents[3] / "specs" / "recurrent.json")
    spec = load_spec(specs, "drqn_cartpole")
    shape = check_env(spec["env"])
    needs = {key: size for key, size, _ in memory_needs(spec, shape)}
    assert needs["agent.memory.max_size"] == replay_bytes(100_000, (4, 4), (), shape.act_dtype)
    assert needs["agent.memory.max_size"] > replay_bytes(100_000, (4,), (), shape.act_dtype)
