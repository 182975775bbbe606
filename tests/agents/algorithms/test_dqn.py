"""DQN family: training and target-net cadence in frames, whatever the number of sub-envs."""

import pytest
import torch

from envs.clock import Clock
from tests.agents.algorithms.helpers import drive, make_algo

FRAMES = 240  # divisible by 1, 3 and 8


@pytest.mark.parametrize("num_envs", [1, 3, 8])
def test_gradient_steps_per_frame_do_not_depend_on_num_envs(num_envs):
    """training_frequency 4, training_iter 2: 0.5 gradient steps per frame for N = 1, 3, 8 (issue 9a;
    before the fix 0.500, 0.333 and 0.250)."""
    algo = make_algo("dqn_cartpole", ["agent.algorithm.training_frequency=4", "agent.algorithm.training_iter=2",
                                      "agent.algorithm.training_start_step=1", "agent.memory.batch_size=4",
                                      "agent.net.hid_layers=[8]"], num_envs)
    clock = Clock(FRAMES, num_envs)
    drive(algo, clock, FRAMES // num_envs)
    assert clock.frame == FRAMES
    assert clock.opt_step == FRAMES // 2
    assert clock.opt_step / clock.frame == 0.5


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
