"""Issue 10 extension points: declared optimizer and schedule keys, named metrics as train_df columns,
trainable tensors outside nets (saved, hashed, transfer rule), one opt_step per gradient update."""

import copy
import math
from dataclasses import dataclass, field

import pytest
import torch

from agents.algorithms import ALGORITHMS
from agents.algorithms.reinforce import Reinforce, ReinforceSpec
from envs.clock import Clock
from orchestrator.errors import SpecError
from orchestrator.session.loop import TRAIN_COLUMNS, Session
from orchestrator.session.transfer import mismatches
from orchestrator.spec.load import load_spec
from tests.agents.algorithms.helpers import SPECS, drive, make_algo


@dataclass(frozen=True)
class AlphaSpec(ReinforceSpec):
    alpha_optim_spec: dict = field(default_factory=lambda: {"name": "Adam", "lr": 0.01})


class AlphaReinforce(Reinforce):
    """REINFORCE plus a trainable temperature-like tensor with its own optimizer (a SAC stand-in)."""

    spec_cls = AlphaSpec
    optim_keys = ("net.optim_spec", "algorithm.alpha_optim_spec")

    def init_nets(self):
        super().init_nets()
        log_alpha = self.add_tensor("log_alpha", torch.tensor([0.5]), transfer=False)
        self.add_optim("log_alpha", [log_alpha], self.algo_spec.alpha_optim_spec)


@pytest.fixture
def alpha_algo(monkeypatch):
    monkeypatch.setitem(ALGORITHMS, "AlphaReinforce", AlphaReinforce)
    return ["agent.algorithm.name=AlphaReinforce"]


def test_declared_optimizer_key_is_checked_and_is_no_schedule(alpha_algo):
    with pytest.raises(SpecError) as err:
        load_spec(SPECS, "reinforce_cartpole", [*alpha_algo, "agent.algorithm.alpha_optim_spec.name=Adamm"])
    assert err.value.problems == ["agent.algorithm.alpha_optim_spec.name: unknown name 'Adamm'; did you mean 'Adam'? "
                                  "(expected one of ['Adam', 'AdamW', 'GlobalAdam', 'GlobalRMSprop', 'Lookahead', "
                                  "'RAdam', 'RMSprop', 'SGD'])"]
    load_spec(SPECS, "reinforce_cartpole", alpha_algo)  # a *_spec that is not a schedule: no decay check


def test_optimizer_spec_the_algorithm_does_not_read_is_an_error():
    with pytest.raises(SpecError) as err:
        load_spec(SPECS, "dqn_cartpole", ['agent.net.actor_optim_spec={"name": "Adam", "lr": 0.1}'])
    assert err.value.problems == ["agent.net.actor_optim_spec: DQN does not read it; it reads ['net.optim_spec']"]
    with pytest.raises(SpecError) as err:  # PPO declares the critic optimizer: it is checked
        load_spec(SPECS, "ppo_cartpole", ['agent.net.critic_optim_spec={"name": "SGD", "lr": -1}'])
    assert err.value.problems == ["agent.net.critic_optim_spec.lr: expected a number >= 0, got -1"]


def test_tensor_outside_nets_is_saved_hashed_and_kept_from_transfer(alpha_algo):
    algo = make_algo("reinforce_cartpole", alpha_algo)
    assert set(algo.nets) == {"net", "log_alpha"} and set(algo.optims) == {"net", "log_alpha"}
    state = copy.deepcopy(algo.state_dict())
    assert state["nets"]["log_alpha"]["value"].tolist() == [0.5]
    sha = algo.weights_sha256()
    with torch.no_grad():
        algo.nets["log_alpha"].value.fill_(2.0)
    assert algo.weights_sha256()["log_alpha"] != sha["log_alpha"] and algo.weights_sha256()["net"] == sha["net"]
    algo.load_state_dict(state)
    assert algo.nets["log_alpha"].value.item() == 0.5 and algo.weights_sha256() == sha
    assert set(algo.transfer_nets()) == {"net"}
    plain = make_algo("reinforce_cartpole", [])  # a checkpoint without log_alpha still transfers its net
    assert mismatches(algo, {"net": plain.nets["net"].state_dict()}, "x") == []


def test_metrics_are_train_df_columns():
    spec = load_spec(SPECS, "ppo_cartpole", ["env.max_frame=512", "meta.log_frequency=256",
                                             "agent.algorithm.time_horizon=16", "agent.algorithm.training_epoch=1"])
    session = Session(spec, seed=1)
    session.run_rl()
    df = session.train_df
    assert list(df.columns) == [*TRAIN_COLUMNS, "policy_loss", "val_loss", "clip_frac", "approx_kl"]
    last = df.iloc[-1]
    assert all(not math.isnan(last[c]) for c in ("policy_loss", "val_loss", "clip_frac", "approx_kl"))
    assert last.val_loss > 0 and 0 <= last.clip_frac <= 1
    # loss = policy_loss + 0.5 * val_loss - 0 * entropy, per minibatch: so also for the means
    assert last.loss == pytest.approx(last.policy_loss + 0.5 * last.val_loss, rel=1e-5)


def test_one_opt_step_per_gradient_update_with_two_optimizers():
    """Actor and critic optimizers stepped on one loss count one opt_step."""
    algo = make_algo("ppo_cartpole", ['agent.net.actor_optim_spec={"name": "Adam", "lr": 0.001}',
                                      "agent.algorithm.time_horizon=8", "agent.algorithm.minibatch_size=8",
                                      "agent.algorithm.training_epoch=3"], num_envs=2)
    assert set(algo.optims) == {"actor", "critic"}
    clock = Clock(16, 2)
    drive(algo, clock, 8)
    assert clock.opt_step == 3 * 2  # 3 epochs x ceil(16 / 8) minibatches
