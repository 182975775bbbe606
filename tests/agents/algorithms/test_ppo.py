"""PPO: minibatching uses every sample of a rollout."""

import torch

from envs.clock import Clock
from tests.agents.algorithms.helpers import drive, make_algo


def test_every_sample_is_used_each_epoch(monkeypatch):
    """300 samples (T 75 x N 4), minibatch 64: per epoch 64, 64, 64, 64, 44 and all 300 indices (issue 9b;
    before the fix the 44 remaining samples were never used)."""
    algo = make_algo("ppo_cartpole", ["agent.algorithm.time_horizon=75", "agent.algorithm.minibatch_size=64",
                                      "agent.algorithm.training_epoch=2", "agent.net.hid_layers=[8]"], num_envs=4)
    seen = []
    orig = algo.minibatch_loss
    monkeypatch.setattr(algo, "minibatch_loss", lambda mb, *a: seen.append(mb["adv"].clone()) or orig(mb, *a))
    clock = Clock(300, 4)
    assert drive(algo, clock, 75) == 1
    assert [len(x) for x in seen] == [64, 64, 64, 64, 44] * 2
    assert clock.opt_step == 10
    first = torch.cat(seen[:5]).sort().values
    assert len(first.unique()) == 300  # distinct advantages: each epoch covers all 300 samples once
    torch.testing.assert_close(torch.cat(seen[5:]).sort().values, first)
