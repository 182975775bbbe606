"""K seeds of the lab's REINFORCE (``agents.algorithms.reinforce``) trained as one batched program.

The group is a ``SeedBatch`` (``agents.batched.algorithm``): one rollout of K x N columns in an
``OnPolicyBatchReplay`` of ``training_frequency`` vector steps (the seeds fill it at the same steps, so they update
in lockstep), one batched forward to act (each seed's actions drawn from its own generator), and one gradient step
for all K per update with ``Reinforce.update``'s arithmetic per seed: each seed's discounted returns over its own
N columns, centred (``center_return``) and standardized over its own T x N samples, its own policy loss and
entropy mean, the entropy coefficient of the frame, its gradients clipped to its own norm, its own slice of the
optimizer state. Episodic memories (``OnPolicyReplay``: an update per ``training_frequency`` finished episodes)
are refused: the seeds finish episodes at different steps, so their updates would not be in lockstep.
"""

from __future__ import annotations

import numpy as np
import torch

from agents import policy
from agents.algorithms import LossStats
from agents.algorithms.reinforce import Reinforce
from agents.batched.algorithm import SeedBatch
from agents.returns import calc_returns, standardize
from envs.clock import Clock


class BatchedReinforce(SeedBatch, Reinforce):
    """K seeds of the lab's ``Reinforce`` with ``OnPolicyBatchReplay``; see the module docstring."""

    policy_net = "net"

    def update(self, clock: Clock) -> list[LossStats]:  # type: ignore[override]
        """One gradient step of every seed on its part of the group rollout (``Reinforce.update`` per seed: the
        loss ``policy_loss_coef * -(logp * G').mean() - entropy_coef * H``); per seed its ``LossStats``."""
        batch = self.memory.pop()  # (T, K*N, ...)
        t = len(batch["reward"])
        reward = self.to_tensor(batch["reward"])
        done = self.to_tensor(np.logical_or(batch["terminated"], batch["truncated"]))
        ret = self.to_seeds(calc_returns(reward, done, self.algo_spec.gamma).reshape(t * self.k * self.n))  # (K, TN)
        if self.algo_spec.center_return:
            ret = ret - ret.mean(-1, keepdim=True)
        if self.algo_spec.normalize_advantages == "standardize":
            ret = standardize(ret)
        obs = self.to_seeds(self.obs_tensor(batch["obs"]).reshape(-1, *self.obs_space.shape))  # (K, TN, *O)
        act = self.to_seeds(self.to_tensor(batch["act"], torch.int64).reshape(-1))
        logp, entropy = policy.log_prob_entropy(self.nets["net"](obs), act, self.discrete)  # (K, TN) each
        policy_loss = -(logp * ret).mean(-1)
        entropy = entropy.mean(-1)
        loss = self.algo_spec.policy_loss_coef * policy_loss - self.entropy_coef(clock.frame) * entropy
        grad_norm = self.optim_step_tensor(loss.sum(), ("net",), clock)
        for m in self.members:
            m.lr_scheds["net"].step_to(clock.frame)
        loss_k, ent_k, norm_k, pl_k = (x.detach().tolist() for x in (loss, entropy, grad_norm, policy_loss))
        return [LossStats(loss_k[k], ent_k[k], norm_k[k], {"policy_loss": pl_k[k]}) for k in range(self.k)]
