"""REINFORCE (Williams 1992, "Simple statistical gradient-following algorithms...").

Policy gradient with Monte-Carlo returns, optional return centering (a constant baseline), the returns
standardized over each update's batch (SLM-Lab v5.3's ``Reinforce.calc_policy_loss`` always does;
``normalize_advantages: none`` turns it off) and an entropy bonus:

    loss = policy_loss_coef * -(logp * G').mean() - entropy_coef * H

where G' are the (centred, standardized) returns. Memory: ``OnPolicyReplay`` (``training_frequency`` =
completed episodes per update) or ``OnPolicyBatchReplay`` (``training_frequency`` = vector steps per update).

train_df column of its own: ``policy_loss`` (``-(logp * G').mean()``, before ``policy_loss_coef``, without the
entropy term).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from agents import policy
from agents.algorithms.base import Algorithm, AlgorithmSpec, LossStats
from agents.memory import EPISODIC, OnPolicyBatchReplay, OnPolicyReplay, episodic_memory
from agents.nets import POLICY_GAIN
from agents.returns import ADV_NORMS, calc_returns, standardize
from envs.clock import Clock


@dataclass(frozen=True)
class ReinforceSpec(AlgorithmSpec):
    """REINFORCE keys (SLM-Lab names and defaults).

    Fields:
        center_return: subtract the batch mean return (default false, as SLM-Lab).
        policy_loss_coef: scales the policy loss.
        normalize_advantages: ``standardize`` the returns over the batch, as SLM-Lab v5.3 always does, or
            ``none`` (the lab's value to turn it off; the lab's earlier boolean ``normalize_advantage`` is read as
            an alias, ``orchestrator.spec.aliases``).
        training_frequency: vector steps per update with ``OnPolicyBatchReplay``, completed episodes with
            ``OnPolicyReplay``.
    """

    center_return: bool = False
    policy_loss_coef: float = field(default=1.0, metadata={"ge": 0, "perturbable": True})
    normalize_advantages: str = field(default="standardize", metadata={"choices": ADV_NORMS, "origin": "lab"})


class Reinforce(Algorithm):
    """Vanilla policy gradient; see module docstring. Net: one policy head (``pdparam_dim``)."""

    spec_cls = ReinforceSpec
    memory_names = ("OnPolicyReplay", "OnPolicyBatchReplay", "OnPolicyCrossEntropy")
    metric_names = ("policy_loss",)
    reads_loss = False  # SLM-Lab's Reinforce builds net.loss_spec and never calls it

    def init_nets(self) -> None:
        """Policy net (B, *O) -> (B, ``policy_out_dim()``), the ``log_std`` tensor when
        ``net.log_std_init`` is set (Box actions), and one optimizer over both."""
        self.nets["net"] = self.make_net(self.policy_out_dim(), [POLICY_GAIN])
        self.add_optim("net", [*self.nets["net"].parameters(), *self.add_log_std()], self.net_spec.optim_spec)

    def init_memory(self) -> OnPolicyReplay | OnPolicyBatchReplay:
        """``OnPolicyReplay`` (episodes) or ``OnPolicyBatchReplay`` (vector steps), per the spec."""
        if self.spec.memory.name in EPISODIC:
            return episodic_memory(self.spec.memory, self.algo_spec.training_frequency, self.num_envs)
        return OnPolicyBatchReplay(self.algo_spec.training_frequency)

    @torch.no_grad()
    def act(self, obs_NO: np.ndarray, clock: Clock, deterministic: bool = False) -> np.ndarray:
        """Sample actions (N,) or (N, A) from the policy; its mode when ``deterministic``."""
        pdparam = self.pdparam(self.nets["net"](self.obs_tensor(obs_NO)))
        return policy.sample(pdparam, self.discrete, self.gen, deterministic).cpu().numpy()

    def train_ready(self, clock: Clock) -> bool:
        """``training_frequency`` episodes (or steps) are stored."""
        return self.memory.ready()

    def update(self, clock: Clock) -> LossStats:
        """One gradient step on the stored episodes/rollout (module docstring's loss)."""
        batch = self.memory.pop()
        reward = self.to_tensor(batch["reward"])
        done = self.to_tensor(np.logical_or(batch["terminated"], batch["truncated"]))
        ret = calc_returns(reward, done, self.algo_spec.gamma).reshape(-1)
        if self.algo_spec.center_return:
            ret = ret - ret.mean()
        if self.algo_spec.normalize_advantages == "standardize":
            ret = standardize(ret)
        obs = self.obs_tensor(batch["obs"]).reshape(-1, *self.obs_space.shape)
        act_dtype = torch.int64 if self.discrete else torch.float32
        act = self.to_tensor(batch["act"], act_dtype).reshape(len(obs), *self.action_space.shape)
        logp, entropy = policy.log_prob_entropy(self.pdparam(self.nets["net"](obs)), act, self.discrete)
        policy_loss = -(logp * ret).mean()
        loss = self.algo_spec.policy_loss_coef * policy_loss - self.entropy_coef(clock.frame) * entropy.mean()
        grad_norm = self.optim_step(loss, ("net",), clock)
        return LossStats(float(loss.detach()), float(entropy.detach().mean()), grad_norm,
                         {"policy_loss": float(policy_loss.detach())})
