"""Self-imitation learning (SIL, PPOSIL; Oh et al. 2018): the SIL losses and the Monte-Carlo returns of the SIL
replay against hand-computed values, the SIL steps per update and their gate, prioritized replay priorities
from max(R - V, 0), exact resume with the replay in the checkpoint, the refill gate without it, and SLM-Lab's
SIL spec files run unmodified."""

import math

import numpy as np
import pytest
import torch

from agents.algorithms.sil import sil_losses
from agents.memory import OnPolicyBatchReplay, PrioritizedReplay, Replay, SILReplay
from envs.clock import Clock
from orchestrator.session.loop import load_state
from tests.agents.algorithms.helpers import assert_resume_exact, drive, make_algo, run_slm_dev, stop_then_resume
from tests.orchestrator.session.test_resume_exact import load_spec

SIL_SPECS = "specs/sil.json"
TINY = ["agent.net.hid_layers=[8]"]


def test_sil_losses_hand_computed():
    """logp -0.5, -1, -2; V 1, 3, 0.5; R 2, 2, 2.5 -> A = max(R - V, 0) = 1, 0, 2.
    policy loss = -mean(logp * A) = (0.5 + 0 + 4) / 3 = 1.5; value loss = mean(0.5 A^2) = 0.5 (1 + 4) / 3.
    Gradients: d policy / d logp = -A / 3, d policy / d V = 0 (A not differentiated), d value / d V = -A / 3.
    With weights 1, 1, 0.5: policy (0.5 + 0.5 * 4) / 3, value 0.5 (1 + 0.5 * 4) / 3."""
    logp = torch.tensor([-0.5, -1.0, -2.0], requires_grad=True)
    value = torch.tensor([1.0, 3.0, 0.5], requires_grad=True)
    ret = torch.tensor([2.0, 2.0, 2.5])
    policy_loss, val_loss, clipped = sil_losses(logp, value, ret)
    torch.testing.assert_close(clipped, torch.tensor([1.0, 0.0, 2.0]))
    assert policy_loss.item() == pytest.approx(1.5)
    assert val_loss.item() == pytest.approx(5 / 6)
    policy_loss.backward(retain_graph=True)
    torch.testing.assert_close(logp.grad, torch.tensor([-1 / 3, 0.0, -2 / 3]))
    assert value.grad is None or torch.all(value.grad == 0)
    val_loss.backward()
    torch.testing.assert_close(value.grad, torch.tensor([-1 / 3, 0.0, -2 / 3]))
    policy_w, val_w, _ = sil_losses(logp, value, ret, torch.tensor([1.0, 1.0, 0.5]))
    assert policy_w.item() == pytest.approx(2.5 / 3) and val_w.item() == pytest.approx(0.5)


def sil_memory(gamma=0.5, max_size=10, prioritized=False):
    cls = PrioritizedReplay if prioritized else Replay
    replay = cls(max_size, (1,), (), np.int64, 4, store_next_obs=False)
    return SILReplay(OnPolicyBatchReplay(100), replay, gamma, 2)


def add_step(memory, step, rewards, terminated=(False, False), truncated=(False, False)):
    obs = np.array([[10 * step], [10 * step + 1]], np.float32)
    memory.add(obs, np.array([step, step]), np.array(rewards, np.float32), obs,
               np.array(terminated), np.array(truncated))


def fill_two_episodes(memory):
    """Sub-env 0: rewards 1, 2, 3, terminated at step 2; sub-env 1: rewards 4, 5, truncated at step 1, then 6
    (unfinished)."""
    add_step(memory, 0, [1, 4])
    add_step(memory, 1, [2, 5], truncated=(False, True))
    add_step(memory, 2, [3, 6], terminated=(True, False))


def test_sil_replay_stores_discounted_monte_carlo_returns():
    """gamma 0.5: sub-env 1's episode (ends first) R = 4 + 0.5 * 5 = 6.5, 5 (a time-limit cut bootstraps 0);
    sub-env 0's R = 1 + 0.5 * 3.5 = 2.75, 2 + 0.5 * 3 = 3.5, 3. The unfinished step (reward 6) is not in the
    replay yet; the on-policy memory has all 3 vector steps."""
    memory = sil_memory()
    fill_two_episodes(memory)
    assert len(memory) == 5 and len(memory.onpolicy) == 3 and "next_obs" not in memory.replay.data
    np.testing.assert_allclose(memory.replay.data["reward"][:5], [6.5, 5.0, 2.75, 3.5, 3.0])
    np.testing.assert_array_equal(memory.replay.data["obs"][:5, 0], [1, 11, 0, 10, 20])
    np.testing.assert_array_equal(memory.replay.data["act"][:5], [0, 1, 0, 1, 2])
    assert [r for _, _, r in memory.current[1]] == [6.0] and memory.current[0] == []
    batch = memory.sample(np.random.default_rng(0))
    assert set(batch) == {"obs", "act", "ret"}
    stored = dict(zip(memory.replay.data["obs"][:5, 0].tolist(), memory.replay.data["reward"][:5].tolist()))
    assert len(batch["ret"]) == 4  # each sampled return is its row's stored one
    assert [stored[o] for o in batch["obs"][:, 0].tolist()] == batch["ret"].tolist()


def test_sil_replay_state_with_and_without_the_replay():
    """``state_dict(with_replay=False)`` keeps the rollout and unfinished episodes but not the replay; a
    restored memory then finishes sub-env 1's episode with the saved step: R = 6 + 0.5 * 7 = 9.5, 7."""
    memory = sil_memory()
    fill_two_episodes(memory)
    full, light = sil_memory(), sil_memory()
    full.load_state_dict(memory.state_dict())
    light.load_state_dict(memory.state_dict(with_replay=False))
    assert len(full) == 5 and len(light) == 0 and len(light.onpolicy) == 3
    np.testing.assert_array_equal(full.replay.data["reward"], memory.replay.data["reward"])
    add_step(light, 3, [0, 7], terminated=(False, True))
    np.testing.assert_allclose(light.replay.data["reward"][:2], [9.5, 7.0])
    light.cut_episodes()
    assert light.current == [[], []] and light.onpolicy.rows[-1][-1].tolist() == [True, False]


def test_ppo_sil_update_takes_training_iter_x_batch_iter_sil_steps_after_ppo():
    """Rollout 8 x 2 = 16 samples, 1 epoch of minibatch 16: 1 PPO step, then 2 x 3 SIL steps (every step ends an
    episode, so the replay is filled); with training_start_step 100 the SIL steps wait: 1 step, SIL NaN."""
    over = [*TINY, "agent.algorithm.time_horizon=8", "agent.algorithm.minibatch_size=16",
            "agent.algorithm.training_epoch=1", "agent.algorithm.training_iter=2",
            "agent.algorithm.training_batch_iter=3"]
    algo = make_algo("ppo_sil_cartpole", over, num_envs=2, spec_file=SIL_SPECS)
    clock = Clock(1000, 2)
    assert drive(algo, clock, 8, done_prob=1.0) == 1
    assert clock.opt_step == 7 and len(algo.memory) == 16
    gated = make_algo("ppo_sil_cartpole", [*over, "agent.algorithm.training_start_step=100"], num_envs=2,
                      spec_file=SIL_SPECS)
    clock = Clock(1000, 2)
    for _ in range(7):
        drive(gated, clock, 1, done_prob=1.0)
    gated.memory.add(*[np.zeros((2, 4), np.float32), np.zeros(2, np.int64), np.ones(2, np.float32),
                       np.zeros((2, 4), np.float32), np.ones(2, bool), np.zeros(2, bool)])
    stats = gated.update(clock)
    assert clock.opt_step == 1 and math.isnan(stats.metrics["sil_policy_loss"])
    assert not math.isnan(stats.metrics["clip_frac"])


def test_prioritized_sil_replay_priorities_are_the_clipped_advantages():
    """Zero nets (V = 0, uniform policy) and lr 0: one SIL step on a batch sets each sampled row's priority to
    (max(R - 0, 0) + epsilon) ** alpha = (R + 0.5) ** 1; rows never sampled keep priority 1. The episode's
    rewards 1, -3, 2 give R = 1 - 3 + 2 = 0 (gamma 1), -1, 2."""
    algo = make_algo("sil_cartpole", [*TINY, "agent.memory.sil_replay_name=PrioritizedReplay",
                                      "agent.memory.alpha=1.0", "agent.memory.epsilon=0.5",
                                      "agent.memory.batch_size=2", "agent.algorithm.gamma=1.0",
                                      "agent.algorithm.training_iter=1", "agent.algorithm.training_batch_iter=1",
                                      'agent.net.actor_optim_spec={"name": "AdamW", "lr": 0.0}'],
                     spec_file=SIL_SPECS)
    with torch.no_grad():
        for p in algo.nets["net"].parameters():
            p.zero_()
    obs, no = np.zeros((1, 4), np.float32), np.zeros(1, bool)
    for r, end in ((1.0, False), (-3.0, False), (2.0, True)):
        algo.memory.add(obs, np.array([0]), np.array([r], np.float32), obs, np.array([end]), no)
    assert isinstance(algo.memory.replay, PrioritizedReplay)
    np.testing.assert_allclose(algo.memory.replay.data["reward"][:3], [0.0, -1.0, 2.0])
    rng_copy = np.random.default_rng()
    rng_copy.bit_generator.state = algo.rng.bit_generator.state
    sampled = algo.memory.sample(rng_copy)["idx"]
    metrics = algo.sil_update(Clock(100, 1))
    expected = {0: 0.5, 1: 0.5, 2: 2.5}  # R = 0, -1 clip to A = 0
    tree = algo.memory.replay.sum_tree
    for row in range(3):
        new = (1e5 + 0.5) ** 1.0  # an unsampled row keeps a new row's priority (SLM-Lab's variant: error 1e5)
        assert tree.get(np.array([row]))[0] == pytest.approx(expected[row] if row in sampled else new)
    # V = 0 and a uniform policy over 2 actions: policy loss = mean(log 2 * A), value loss = mean(A^2 / 2)
    adv = np.array([max(algo.memory.replay.data["reward"][i], 0) for i in sampled])
    assert metrics["sil_policy_loss"] == pytest.approx(np.mean(math.log(2) * adv), rel=1e-5)
    assert metrics["sil_val_loss"] == pytest.approx(np.mean(adv ** 2 / 2), rel=1e-5)


FEW_SIL = ["agent.algorithm.training_iter=2", "agent.algorithm.training_batch_iter=2", "env.max_frame=800",
           "meta.log_frequency=200"]
SHORT_PPO = ["agent.algorithm.time_horizon=32", "agent.algorithm.minibatch_size=64", "agent.algorithm.training_epoch=2"]


@pytest.mark.parametrize("name, overrides, stop_frame", [
    ("sil_cartpole", [*TINY, *FEW_SIL], 437),
    ("ppo_sil_cartpole", [*TINY, *FEW_SIL, *SHORT_PPO], 468),  # 4 sub-envs: a multiple of 4 frames
    ("ppo_sil_per_cartpole", [*TINY, *FEW_SIL, *SHORT_PPO], 332),
])
def test_resume_is_exact_with_the_replay_in_the_checkpoint(tmp_path, name, overrides, stop_frame):
    straight = assert_resume_exact(tmp_path, name, [*overrides, "agent.memory.checkpoint=true"], stop_frame,
                                   spec_file=SIL_SPECS)
    df = straight.train_df
    assert df.sil_policy_loss.notna().sum() >= 3 and df.sil_val_loss.notna().sum() >= 3


def test_refill_gate_after_resume_without_the_replay(tmp_path):
    """No memory.checkpoint: the checkpoint has the rollout but not the replay; after the resume the on-policy
    updates go on while the SIL steps wait for training_start_step replay transitions (rows marked refill,
    their SIL columns NaN once an update ran), then SIL steps resume."""
    start, stop = 200, 800
    spec = load_spec(SIL_SPECS, "sil_cartpole", [*TINY, *FEW_SIL, "env.max_frame=1600", "meta.log_frequency=50",
                                                 "meta.checkpoint_frequency=400",
                                                 f"agent.algorithm.training_start_step={start}"])
    predir = tmp_path / "sil_cartpole_2026_01_01_000000"
    opt_step_at_stop, df = stop_then_resume(spec, str(predir), stop)
    newest = sorted(p for p in (predir / "t0/s0/ckpt").iterdir() if not p.name.startswith("."))[-1]
    memory_state = load_state((newest / "state.pt").read_bytes())["algorithm"]["memory"]
    assert "replay" not in memory_state and "onpolicy" in memory_state and len(memory_state["current"]) == 1
    before, after = df[df.frame <= stop], df[df.frame > stop]
    assert before.sil_policy_loss.notna().any() and not before.refill.any()
    refill = after[after.refill]
    assert len(refill) > 0 and refill.frame.max() <= stop + start
    updated = refill[refill.opt_step.diff().fillna(refill.opt_step.iloc[0] - opt_step_at_stop) > 0]
    assert len(updated) > 0 and updated.sil_policy_loss.isna().all()  # on-policy steps, no SIL step
    trained = after[~after.refill]
    assert trained.sil_policy_loss.notna().all() and trained.opt_step.iloc[-1] > refill.opt_step.iloc[-1]


@pytest.mark.parametrize("rel, name, max_frame", [
    ("experimental/sil/sil_cartpole.json", "sil_separate_cartpole", 300),
    ("benchmark/sil/ppo_sil_cartpole.json", "ppo_sil_cartpole", 1100),
])
def test_slm_lab_sil_specs_run_unmodified(tmp_path, rel, name, max_frame):
    """SLM-Lab's own SIL files (separate actor and critic optimizers; PPOSIL's rollout 256 x 4 = 1024 frames)."""
    df = run_slm_dev(tmp_path, rel, name, max_frame=max_frame)
    assert df.sil_policy_loss.notna().any() and df.sil_val_loss.notna().any() and df.opt_step.iloc[-1] > 0


def test_bad_sil_keys_are_spec_errors_naming_the_key():
    from orchestrator.errors import SpecError
    from orchestrator.spec.load import build

    with pytest.raises(SpecError) as err:
        build(load_spec(SIL_SPECS, "ppo_sil_cartpole", ['agent.memory.sil_replay_name="SeqReplay"',
                                                        "agent.algorithm.sil_val_loss_coef=-1",
                                                        "agent.algorithm.training_iter=0"]))
    message = str(err.value)
    assert "agent.memory.sil_replay_name: expected one of ['Replay', 'PrioritizedReplay'], got 'SeqReplay'" in message
    assert "agent.algorithm.sil_val_loss_coef: must be >= 0" in message
    assert "agent.algorithm.training_iter: must be > 0" in message


def test_sil_training_start_step_must_fit_in_the_replay():
    from orchestrator.errors import SpecError
    from orchestrator.spec.load import build

    with pytest.raises(SpecError, match="agent.algorithm.training_start_step: 2000 transitions can never be stored"):
        build(load_spec(SIL_SPECS, "sil_cartpole", ["agent.algorithm.training_start_step=2000",
                                                    "agent.memory.max_size=1000"]))
