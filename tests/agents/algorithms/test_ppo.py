"""PPO: minibatching uses every sample of a rollout; value-target and advantage normalizers, the clipped
value loss and symlog against hand-computed values; their state survives a resume."""

import numpy as np
import pytest
import torch

from agents.returns import PercentileNormalizer, ReturnNormalizer, symlog
from envs.clock import Clock
from tests.agents.algorithms.helpers import assert_resume_exact, drive, make_algo, run_slm_dev


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


def test_slm_lab_spec_runs_unmodified(tmp_path):
    """SLM-Lab's ppo_cartpole (separate actor/critic optimizers, clip_val_loss: false, an inert key).

    T 256 x N 4 = 1024 frames per rollout."""
    df = run_slm_dev(tmp_path, "benchmark/ppo/ppo_cartpole.json", "ppo_cartpole", max_frame=1100)
    assert df.opt_step.iloc[-1] > 0 and not df.clip_frac.isna().all()


def test_return_normalizer_hand_computed():
    """[1, 3] then [10]: running mean 14/3 and population variance 44.667/3 = 14.889 (Chan's merge equals
    the variance of all three); normalize divides by sqrt(14.889) = 3.8586, clips at 10, never scales up."""
    norm = ReturnNormalizer()
    norm.update(torch.tensor([1.0, 3.0]))
    assert (norm.mean, norm.var, norm.count) == (2.0, 1.0, 2)
    norm.update(torch.tensor([10.0]))
    assert norm.mean == pytest.approx(14 / 3) and norm.var == pytest.approx(np.var([1, 3, 10]))
    out = norm.normalize(torch.tensor([7.7172, 100.0, -1.0]))
    expected = torch.tensor([2.0, 10.0, -1 / np.sqrt(np.var([1, 3, 10]))], dtype=torch.float32)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=0)
    small = ReturnNormalizer()
    small.update(torch.tensor([0.1, 0.2]))
    torch.testing.assert_close(small.normalize(torch.tensor([0.5])), torch.tensor([0.5]))  # std < 1: unscaled


def test_percentile_normalizer_hand_computed():
    """0..100: 5th percentile 5, 95th 95; decay 0.5 from 0 gives 2.5 and 47.5, scale 45."""
    norm = PercentileNormalizer(decay=0.5)
    norm.update(torch.arange(101, dtype=torch.float32))
    assert (norm.p5, norm.p95) == pytest.approx((2.5, 47.5))
    torch.testing.assert_close(norm.normalize(torch.tensor([90.0])), torch.tensor([2.0]))


def test_clipped_value_loss_and_symlog_hand_computed():
    """clip_vloss, eps 0.2: V = [1, 0], V_old = [0, 0], G = [2, -1]: clipped V = [0.2, 0], squared errors
    unclipped [1, 1], clipped [3.24, 1]; 0.5 * mean(max) = 1.06. symlog(e - 1) = 1."""
    algo = make_algo("ppo_cartpole", ["agent.algorithm.clip_vloss=true",
                                      'agent.algorithm.clip_eps_spec={"name": "no_decay", "start_val": 0.2}'])
    mb = {"v_target": torch.tensor([2.0, -1.0]), "old_value": torch.zeros(2)}
    assert float(algo.val_loss(torch.tensor([1.0, 0.0]), mb, Clock(100, 1))) == pytest.approx(1.06)
    sym = make_algo("ppo_cartpole", ["agent.algorithm.symlog=true", 'agent.net.loss_spec={"name": "MSELoss"}'])
    e1 = float(np.e - 1)
    loss = sym.val_loss(torch.tensor([e1, 0.0]), {"v_target": torch.tensor([0.0, -e1]), "old_value": torch.zeros(2)},
                        Clock(100, 1))
    assert float(loss) == pytest.approx(1.0)  # (1 - 0)^2 and (0 - -1)^2
    torch.testing.assert_close(symlog(torch.tensor([-e1, 0.0])), torch.tensor([-1.0, 0.0]))


def test_resume_is_exact_with_normalizer_state(tmp_path):
    """normalize_v_targets + percentile advantages: both running statistics are saved, so a resume at an
    arbitrary frame equals the uninterrupted run."""
    straight = assert_resume_exact(tmp_path, "ppo_cartpole", [
        "env.max_frame=1536", "meta.log_frequency=512", "agent.algorithm.time_horizon=64", "env.num_envs=2",
        "agent.algorithm.normalize_v_targets=true", "agent.algorithm.normalize_advantages=percentile",
        "agent.algorithm.clip_vloss=false"], 700)
    norms = straight.algorithm.normalizers()
    assert norms["return_normalizer"].count > 0 and norms["percentile_normalizer"].p95 != 0.0


def test_slm_lab_pendulum_spec_with_normalized_targets_runs_unmodified(tmp_path):
    """SLM-Lab's a2c_gae_pendulum (normalize_v_targets: true; one update per 2048 x 4 frames) runs as written."""
    df = run_slm_dev(tmp_path, "benchmark/a2c/a2c_gae_pendulum.json", "a2c_gae_pendulum", max_frame=8192)
    assert df.opt_step.iloc[-1] > 0 and not df.val_loss.isna().all()


def test_episodic_rollouts_with_on_policy_replay():
    """PPO with OnPolicyReplay (SLM-Lab's own PPO refuses it): one update per training_frequency completed
    episodes, every stored step in each epoch's minibatches: 3 episodes of 4, 5, 6 steps = 15 samples,
    minibatch 8 -> 2 steps per epoch, 2 epochs."""
    algo = make_algo("ppo_cartpole", ["agent.memory.name=OnPolicyReplay", "agent.algorithm.training_frequency=3",
                                      "agent.algorithm.minibatch_size=8", "agent.algorithm.training_epoch=2",
                                      "agent.net.hid_layers=[8]"])
    obs, clock = np.zeros((1, 4), np.float32), Clock(100, 1)
    for length in (4, 5, 6):
        for t in range(length):
            done = np.array([t == length - 1])
            assert not algo.train_ready(clock)
            algo.memory.add(obs, np.array([t % 2]), np.ones(1, np.float32), obs, done, np.zeros(1, bool))
            clock.tick(done)
    assert algo.train_ready(clock)
    sizes = []
    orig = algo.minibatch_loss
    algo.minibatch_loss = lambda mb, *a: sizes.append(len(mb["adv"])) or orig(mb, *a)
    algo.update(clock)
    assert sizes == [8, 7, 8, 7] and clock.opt_step == 4 and not algo.train_ready(clock)
