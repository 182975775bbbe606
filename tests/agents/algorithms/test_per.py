"""Prioritized replay (Schaul et al. 2016) for the DQN family: sum tree, sampling probabilities, importance
weights, priority updates from TD errors against hand-computed values; exact resume with the sum tree in the
checkpoint; the refill gate after a resume without the replay; SLM-Lab's PER specs."""

import numpy as np
import pytest
import torch

from agents.memory import PrioritizedReplay, SumTree
from envs.clock import Clock
from tests.agents.algorithms.helpers import assert_resume_exact, make_algo, run_slm_dev, stop_then_resume
from tests.orchestrator.session.test_resume_exact import load_spec

SPECS = "specs/benchmark/cartpole.json"


def per(max_size=4, batch_size=6, **kw):
    return PrioritizedReplay(max_size, (1,), (), np.int64, batch_size, **kw)


def fill(memory, n):
    for i in range(n):
        row = np.full((1, 1), i, np.float32)
        memory.add(row, np.array([i]), np.array([float(i)], np.float32), row, np.zeros(1, bool), np.zeros(1, bool))


def test_sum_tree_prefix_sums():
    """Leaves 1, 2, 3, 4 (total 10): prefix intervals [0, 1), [1, 3), [3, 6), [6, 10); 5 leaves pad to 8."""
    tree = SumTree(4)
    tree.set(np.arange(4), np.array([1.0, 2.0, 3.0, 4.0]))
    assert tree.total == 10.0
    np.testing.assert_array_equal(tree.find(np.array([0, 0.99, 1, 2.99, 3, 5.99, 6, 9.99])), [0, 0, 1, 1, 2, 2, 3, 3])
    tree.set(np.array([3, 3]), np.array([9.0, 0.0]))  # the last write wins
    assert tree.total == 6.0 and SumTree(5).tree.shape == (16,) and SumTree(1).leaves == 1


def test_sampling_probabilities_and_importance_weights_hand_computed():
    """alpha 0.5, epsilon 0: |delta| = 4, 0, 9, 1 -> p = 2, 0, 3, 1 (total 6), P = 1/3, 0, 1/2, 1/6. A stratified
    batch of 6 (one value per unit slice) must be rows 0, 0, 2, 2, 2, 3 whatever the RNG. At frame 0 beta = 0.4:
    w = (4 P) ** -0.4 / max = (2/3 / P) ** 0.4... i.e. 2 ** -0.4 = 0.75786, 3 ** -0.4 = 0.64439 and 1."""
    memory = per(alpha=0.5, epsilon=0.0, beta_start=0.4, beta_end_step=1000)
    fill(memory, 4)
    memory.update_priorities(np.arange(4), np.array([4.0, 0.0, -9.0, 1.0]))
    np.testing.assert_allclose(memory.sum_tree.get(np.arange(4)), [2, 0, 3, 1])
    for seed in range(3):
        batch = memory.sample(np.random.default_rng(seed), frame=0)
        np.testing.assert_array_equal(batch["idx"], [0, 0, 2, 2, 2, 3])
        np.testing.assert_array_equal(batch["reward"], [0, 0, 2, 2, 2, 3])  # rows follow idx
        np.testing.assert_allclose(batch["weight"], [2 ** -0.4] * 2 + [3 ** -0.4] * 3 + [1.0], rtol=1e-6)
    assert memory.beta(500) == pytest.approx(0.7) and memory.beta(1000) == memory.beta(5000) == 1.0


def test_new_rows_get_the_max_priority_and_overwrites_replace_it():
    """The paper's variant (``beta_start`` set): a new row enters at the largest priority seen so far."""
    memory = per(max_size=3, batch_size=2, alpha=1.0, epsilon=0.5, beta_start=0.4)
    fill(memory, 2)
    np.testing.assert_array_equal(memory.sum_tree.get(np.arange(2)), [1, 1])  # max priority starts at 1
    memory.update_priorities(np.array([0, 1]), np.array([2.5, 0.0]))  # p = 3, 0.5
    assert memory.max_priority == 3.0
    fill(memory, 2)  # row 2, then row 0 overwritten (ring of 3)
    np.testing.assert_array_equal(memory.sum_tree.get(np.arange(3)), [3, 0.5, 3])
    assert memory.sum_tree.total == 6.5


def test_slm_lab_variant_new_rows_at_error_1e5_and_no_importance_weights():
    """``beta_start`` unset (SLM-Lab v5.3's PrioritizedReplay, as its spec files run): alpha 0.5, epsilon 0.25: a new
    row's priority is (1e5 + 0.25) ** 0.5 = 316.228..., whatever priorities were set before; after priorities
    2, 0.5 (|delta| 3.75, 0) two new rows keep 316.23 and a sample's weights are all 1 (plain mean loss)."""
    memory = per(max_size=4, batch_size=4, alpha=0.5, epsilon=0.25)
    fill(memory, 2)
    np.testing.assert_allclose(memory.sum_tree.get(np.arange(2)), [(1e5 + 0.25) ** 0.5] * 2)
    memory.update_priorities(np.array([0, 1]), np.array([3.75, 0.0]))
    fill(memory, 2)
    np.testing.assert_allclose(memory.sum_tree.get(np.arange(4)), [2.0, 0.5, 316.2281686, 316.2281686])
    batch = memory.sample(np.random.default_rng(0), frame=0)
    np.testing.assert_array_equal(batch["weight"], np.ones(4, np.float32))
    assert memory.beta(0) == memory.beta(10**6) == 0.0
    assert sorted(batch["idx"].tolist()) == [2, 2, 3, 3]  # each new row holds ~half of the total


def test_double_dqn_per_weighted_loss_and_priority_update_hand_computed():
    """Zero Q-net (Q = 0, so y = r on terminal rows), rows r = 1, 3 with priorities 1, 3 (total 4), batch 4:
    the stratified sample is rows 0, 1, 1, 1; P = 1/4, 3/4; beta 0.4: w = 1, 3 ** -0.4 (0.64439, x3).
    MSE loss = (1 * 1 + 3 * 0.64439 * 9) / 4 = 4.59963. alpha 1, epsilon 0.5: priorities become
    |y - Q| + 0.5 = 1.5, 3.5 (from the Q before the step)."""
    algo = make_algo("ddqn_per_cartpole", ["agent.net.hid_layers=[2]", "agent.algorithm.training_start_step=1",
                                           "agent.memory.batch_size=4", "agent.memory.alpha=1.0",
                                           "agent.memory.epsilon=0.5", "agent.memory.beta_end_step=1000000000",
                                           'agent.net.loss_spec={"name": "MSELoss"}'])
    with torch.no_grad():
        for net in ("net", "target_net"):
            for p in algo.nets[net].parameters():
                p.zero_()
    obs, yes, no = np.zeros((1, 4), np.float32), np.ones(1, bool), np.zeros(1, bool)
    for r in (1.0, 3.0):
        algo.memory.add(obs, np.array([0]), np.array([r], np.float32), obs, yes, no)
    algo.memory.sum_tree.set(np.arange(2), np.array([1.0, 3.0]))
    clock = Clock(100, 1)
    clock.frame = 1
    assert algo.train_ready(clock)
    stats = algo.update(clock)
    assert stats.loss == pytest.approx((1 + 3 * 3 ** -0.4 * 9) / 4, rel=1e-5)
    np.testing.assert_allclose(algo.memory.sum_tree.get(np.arange(2)), [1.5, 3.5])
    assert algo.memory.max_priority == 3.5 and clock.opt_step == 1


RESUME = ["env.max_frame=1500", "meta.log_frequency=250", "agent.algorithm.training_start_step=200",
          "agent.net.hid_layers=[32]", "agent.memory.batch_size=32"]


def test_resume_is_exact_with_the_sum_tree(tmp_path):
    straight = assert_resume_exact(tmp_path, "ddqn_per_cartpole", [*RESUME, "env.max_frame=1000",
                                                                   "agent.memory.checkpoint=true"], 733)
    tree = straight.algorithm.memory.sum_tree
    assert straight.clock.opt_step > 0 and len(np.unique(tree.get(np.arange(200)))) > 100  # priorities differ


def test_refill_gate_after_resume_without_the_replay(tmp_path):
    """No memory.checkpoint: the resumed run refills training_start_step rows (priority 1 each, a fresh
    sum tree) with no gradient step in between."""
    spec = load_spec(SPECS, "ddqn_per_cartpole", RESUME)
    predir = str(tmp_path / "ddqn_per_cartpole_2026_01_01_000000")
    opt_step_at_stop, df = stop_then_resume(spec, predir, 700)
    after = df[df.frame > 700]
    refill = after[after.refill]
    assert len(refill) > 0 and refill.frame.max() <= 700 + 200
    assert (refill.opt_step == opt_step_at_stop).all()
    assert after.opt_step.iloc[-1] > opt_step_at_stop


@pytest.mark.parametrize("rel_file, name", [
    ("benchmark/dqn/dqn_cartpole.json", "ddqn_per_boltzmann_cartpole"),
    ("benchmark/dqn/ddqn_per_acrobot.json", "ddqn_per_acrobot"),
])
def test_slm_lab_spec_runs_unmodified(tmp_path, rel_file, name):
    df = run_slm_dev(tmp_path, rel_file, name)
    assert df.opt_step.iloc[-1] > 0
