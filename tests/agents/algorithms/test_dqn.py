"""DQN family: training cadence (SLM-Lab's, at most one round per vector step) and target-net cadence in frames."""

import pytest
import torch

from envs.clock import Clock
from tests.agents.algorithms.helpers import assert_resume_exact, drive, make_algo, run_slm_dev

FRAMES = 240  # divisible by 1, 3 and 8


@pytest.mark.parametrize("num_envs, per_frame", [(1, 0.5), (3, 0.5), (8, 0.25)])
def test_gradient_steps_per_frame_follow_slm_lab_cadence(num_envs, per_frame):
    """training_frequency 4, training_iter 2: a vector step that crosses a multiple of 4 frames trains one
    round of 2 steps. N = 1 and 3: 0.5 gradient steps per frame (N = 3 crosses a multiple in 3 steps of 4;
    issue 9a: before its fix 0.333); N = 8 > frequency: one round per vector step, 2 steps per 8 frames, as
    SLM-Lab v5.3 trains at most once per step (``Replay.add_experience`` sets ``to_train``)."""
    algo = make_algo("dqn_cartpole", ["agent.algorithm.training_frequency=4", "agent.algorithm.training_iter=2",
                                      "agent.algorithm.training_start_step=1", "agent.memory.batch_size=4",
                                      "agent.net.hid_layers=[8]"], num_envs)
    clock = Clock(FRAMES, num_envs)
    drive(algo, clock, FRAMES // num_envs)
    assert clock.frame == FRAMES
    assert clock.opt_step == FRAMES * per_frame
    assert clock.opt_step == _slm_lab_rounds(FRAMES, 4, num_envs) * 2


def _slm_lab_rounds(frames: int, training_frequency: int, num_envs: int) -> int:
    """Training rounds SLM-Lab v5.3 runs over ``frames``: one per vector step in which the replay head of
    one of the step's N new transitions is a multiple of ``training_frequency`` (ring buffer not wrapped)."""
    steps = [range(t * num_envs, (t + 1) * num_envs) for t in range(frames // num_envs)]
    return sum(any(head % training_frequency == 0 for head in heads) for heads in steps)


@pytest.mark.parametrize("num_envs", [1, 3, 8])
def test_target_updates_per_frame_do_not_depend_on_num_envs(num_envs, monkeypatch):
    """update_frequency 6 frames: FRAMES / 6 = 40 target updates for every N (k per update call; before the
    fix one per update at most: 40, 26, 15)."""
    algo = make_algo("dqn_cartpole", ["agent.algorithm.training_frequency=1", "agent.algorithm.training_start_step=1",
                                      "agent.net.update_frequency=6", "agent.memory.batch_size=4",
                                      "agent.net.hid_layers=[8]"], num_envs)
    counts = []
    orig = algo.update_target
    monkeypatch.setattr(algo, "update_target", lambda clock: counts.append(orig(clock)) or counts[-1])
    clock = Clock(FRAMES, num_envs)
    drive(algo, clock, FRAMES // num_envs)
    assert sum(counts) == FRAMES // 6 == 40


def test_k_polyak_updates_are_one_lerp():
    """Three polyak updates with polyak_coef 0.5 keep 0.125 of the old target."""
    algo = make_algo("dqn_cartpole", ["agent.net.update_type=polyak", "agent.net.polyak_coef=0.5",
                                      "agent.net.update_frequency=1", "agent.net.hid_layers=[8]"])
    net, target = algo.nets["net"], algo.nets["target_net"]
    with torch.no_grad():
        for p in target.parameters():
            p.zero_()
    clock = Clock(100, 1)
    clock.frame = 3
    assert algo.update_target(clock) == 3
    for p_net, p_target in zip(net.parameters(), target.parameters()):
        torch.testing.assert_close(p_target, 0.875 * p_net)
    assert algo.update_target(clock) == 0


@pytest.mark.parametrize("name", ["dqn_cartpole", "ddqn_cartpole"])
def test_grouped_samples_train_as_one_sample_at_a_time(name, monkeypatch):
    """A round of 8 samples drawn and gathered at once (one target forward for DQN) ends at the weights,
    opt_step and metrics of the same round drawn one sample at a time (GATHER_BYTES 1: groups of one)."""
    from agents.algorithms import dqn

    def trained(gather_bytes):
        monkeypatch.setattr(dqn, "GATHER_BYTES", gather_bytes)
        algo = make_algo(name, ["agent.algorithm.training_frequency=16", "agent.algorithm.training_iter=8",
                                "agent.algorithm.training_start_step=16", "agent.memory.batch_size=4",
                                "agent.net.hid_layers=[8]"], seed=3)
        clock = Clock(64, 1)
        drive(algo, clock, 64)
        return algo, clock

    (a, ca), (b, cb) = trained(1), trained(dqn.GATHER_BYTES)
    assert ca.opt_step == cb.opt_step == 4 * 8  # rounds at frames 16, 32, 48, 64
    assert a.weights_sha256() == b.weights_sha256()
    assert a.rng.random() == b.rng.random()


def test_vanilla_dqn_bootstraps_from_the_online_net():
    """No target net: Q = (1, 3) everywhere, r = 1, gamma 0.5: y = 1 + 0.5 * 3 = 2.5, or 1 when terminal."""
    algo = make_algo("vanilla_dqn_cartpole", ["agent.algorithm.gamma=0.5", "agent.net.hid_layers=[2]"])
    assert set(algo.nets) == {"net"} and algo.target_net is algo.nets["net"]
    with torch.no_grad():
        for p in algo.nets["net"].parameters():
            p.zero_()
        algo.nets["net"].heads[0][0].bias.copy_(torch.tensor([1.0, 3.0]))
    batch = {"next_obs": torch.zeros(2, 4), "reward": torch.ones(2), "terminated": torch.tensor([0.0, 1.0])}
    torch.testing.assert_close(algo.q_target(batch), torch.tensor([2.5, 1.0]))
    clock = Clock(100, 1)
    clock.frame = 500
    assert algo.update_target(clock) == 500 and set(algo.nets) == {"net"}  # due updates: nothing to update


def test_dueling_net_in_dqn():
    algo = make_algo("dueling_dqn_cartpole", [])
    assert type(algo.nets["net"]).__name__ == "DuelingMLPNet" and type(algo.nets["target_net"]).__name__ == \
        "DuelingMLPNet"
    assert algo.nets["net"](torch.zeros(5, 4)).shape == (5, 2)


RESUME = ["env.max_frame=2000", "meta.log_frequency=250", "agent.algorithm.training_start_step=200",
          "agent.memory.checkpoint=true"]


@pytest.mark.parametrize("name", ["vanilla_dqn_cartpole", "dueling_dqn_cartpole"])
def test_resume_is_exact(tmp_path, name):
    straight = assert_resume_exact(tmp_path, name, RESUME, 911)
    assert straight.clock.opt_step > 0 and not straight.train_df.td_error.isna().all()


@pytest.mark.parametrize("rel_file, name", [
    ("benchmark/dqn/dqn_cartpole.json", "vanilla_dqn_boltzmann_cartpole"),
    ("experimental/dqn/dqn_cartpole.json", "vanilla_dqn_cartpole"),
    ("experimental/dqn/dueling_dqn_cartpole.json", "dueling_dqn_boltzmann_cartpole"),
    ("experimental/dqn/dueling_dqn_cartpole.json", "dueling_dqn_epsilon_greedy_cartpole"),
])
def test_slm_lab_spec_runs_unmodified(tmp_path, rel_file, name):
    df = run_slm_dev(tmp_path, rel_file, name)
    assert df.opt_step.iloc[-1] > 0
