"""PPO with the clipped surrogate objective (Schulman et al. 2017, arXiv:1707.06347).

Rollouts of ``time_horizon`` vector steps (T x N frames), GAE advantages (lam), ``training_epoch``
epochs of shuffled minibatches of ``minibatch_size`` samples (the last one of an epoch holds the
remainder, so every sample is used), a clip range from ``clip_eps_spec``
(a schedule of frames), value loss weighted by ``val_loss_coef`` and an entropy bonus from
``entropy_coef_spec``. Actor and critic are one shared net with two heads (``net.shared``) or two
nets stepped together on the one combined loss: by one optimizer over both, or by two when
``actor_optim_spec`` / ``critic_optim_spec`` are given.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from agents import policy
from agents.algorithms.base import Algorithm, AlgorithmSpec, LossStats
from agents.memory import OnPolicyBatchReplay
from agents.nets import POLICY_GAIN, VALUE_GAIN, make_loss
from agents.returns import calc_gaes
from agents.schedules import VarSchedule
from envs.clock import Clock


@dataclass(frozen=True)
class PPOSpec(AlgorithmSpec):
    """PPO keys (SLM-Lab names).

    Fields: ``lam`` (GAE lambda), ``clip_eps_spec`` (clip range schedule), ``val_loss_coef``,
    ``time_horizon`` (vector steps per rollout), ``minibatch_size`` (samples), ``training_epoch``
    (epochs per rollout), ``normalize_advantage`` (per minibatch).
    """

    lam: float = field(default=0.95, metadata={"ge": 0, "le": 1})
    clip_eps_spec: dict = field(default_factory=lambda: {"name": "no_decay", "start_val": 0.2})
    val_loss_coef: float = field(default=0.5, metadata={"ge": 0})
    time_horizon: int = field(default=128, metadata={"gt": 0})
    minibatch_size: int = field(default=64, metadata={"gt": 0})
    training_epoch: int = field(default=4, metadata={"gt": 0})
    normalize_advantage: bool = True


class PPO(Algorithm):
    """Proximal policy optimization; see module docstring."""

    spec_cls = PPOSpec
    memory_names = ("OnPolicyBatchReplay",)

    def init_nets(self) -> None:
        """Actor (B, *O) -> (B, pd_dim) and critic -> (B, 1), shared or separate, and their optimizers."""
        pd_dim = policy.pdparam_dim(self.action_space)
        ns = self.net_spec
        if ns.shared:
            self.nets["net"] = self.make_net([pd_dim, 1], [POLICY_GAIN, VALUE_GAIN])
            self.add_optim("net", self.nets["net"].parameters(), ns.optim_spec)
        else:
            self.nets["actor"] = self.make_net(pd_dim, [POLICY_GAIN])
            self.nets["critic"] = self.make_net(1, [VALUE_GAIN])
            if ns.actor_optim_spec is None and ns.critic_optim_spec is None:
                # One optimizer over both nets (as SB3 does): the same per-parameter updates as two
                # optimizers of one spec, in one step call instead of two.
                self.add_optim("net", [*self.nets["actor"].parameters(), *self.nets["critic"].parameters()],
                               ns.optim_spec)
            else:
                self.add_optim("actor", self.nets["actor"].parameters(), ns.actor_optim_spec or ns.optim_spec)
                self.add_optim("critic", self.nets["critic"].parameters(),
                               ns.critic_optim_spec or ns.optim_spec)
        self.clip_eps = VarSchedule.from_spec(self.algo.clip_eps_spec, default=0.2)
        self.value_loss = make_loss(ns.loss_spec)

    def init_memory(self) -> OnPolicyBatchReplay:
        """An ``OnPolicyBatchReplay`` of ``time_horizon`` vector steps."""
        return OnPolicyBatchReplay(self.algo.time_horizon)

    def pdparam_value(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Policy parameters (B, pd_dim) and state values (B,) of observations (B, *O)."""
        if self.net_spec.shared:
            pdparam, value = self.nets["net"](obs)
        else:
            pdparam, value = self.nets["actor"](obs), self.nets["critic"](obs)
        return pdparam, value.squeeze(-1)

    @torch.no_grad()
    def act(self, obs_NO: np.ndarray, clock: Clock, deterministic: bool = False) -> np.ndarray:
        """Sample actions (N,) or (N, A) from the policy; its mode when ``deterministic``."""
        obs = self.to_tensor(obs_NO)
        pdparam = self.nets["net"](obs)[0] if self.net_spec.shared else self.nets["actor"](obs)
        return policy.sample(pdparam, self.discrete, self.gen, deterministic).cpu().numpy()

    def train_ready(self, clock: Clock) -> bool:
        """A full rollout of ``time_horizon`` vector steps is stored."""
        return self.memory.ready()

    @torch.no_grad()
    def prepare(self, batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """Flatten a (T, N) rollout to B = T*N samples with old log-probs, advantages, value targets."""
        t, n = batch["reward"].shape
        obs = self.to_tensor(batch["obs"]).reshape(t * n, *self.obs_space.shape)
        next_obs = self.to_tensor(batch["next_obs"]).reshape(t * n, *self.obs_space.shape)
        act_dtype = torch.int64 if self.discrete else torch.float32
        act = self.to_tensor(batch["act"], act_dtype).reshape(t * n, *self.action_space.shape)
        pdparam, value = self.pdparam_value(obs)
        next_value = self.pdparam_value(next_obs)[1]
        old_logp = policy.log_prob_entropy(pdparam, act, self.discrete)[0]
        terminated = self.to_tensor(batch["terminated"])
        done = self.to_tensor(np.logical_or(batch["terminated"], batch["truncated"]))
        adv = calc_gaes(self.to_tensor(batch["reward"]), value.reshape(t, n), next_value.reshape(t, n),
                        terminated, done, self.algo.gamma, self.algo.lam).reshape(-1)
        return {"obs": obs, "act": act, "old_logp": old_logp, "adv": adv, "v_target": adv + value}

    def update(self, clock: Clock) -> LossStats:
        """``training_epoch`` epochs of minibatch steps on the clipped surrogate + value + entropy.

        Each epoch shuffles the B = T*N samples and steps once per ``minibatch_size`` slice,
        ``ceil(B / minibatch_size)`` optimizer steps per epoch; the last slice holds the remainder.
        """
        data = self.prepare(self.memory.pop())
        size, mb = len(data["adv"]), min(self.algo.minibatch_size, len(data["adv"]))
        clip_eps, ent_coef = self.clip_eps(clock.frame), self.entropy_coef(clock.frame)
        optim_names = tuple(self.optims)
        losses, entropies, grad_norms = [], [], []
        for _ in range(self.algo.training_epoch):
            perm = torch.randperm(size, generator=self.gen, device=self.device)
            for start in range(0, size, mb):  # the last minibatch may be smaller: every sample is used (as SB3)
                idx = perm[start:start + mb]
                loss, entropy = self.minibatch_loss({k: v[idx] for k, v in data.items()}, clip_eps, ent_coef)
                grad_norms.append(self.optim_step(loss, optim_names, clock))
                losses.append(loss.detach())
                entropies.append(entropy.detach())
        return LossStats(float(torch.stack(losses).mean()), float(torch.stack(entropies).mean()),
                         float(np.mean(grad_norms)))

    def minibatch_loss(self, mb: dict[str, torch.Tensor], clip_eps: float,
                       ent_coef: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Scalar loss and mean entropy of one minibatch."""
        pdparam, value = self.pdparam_value(mb["obs"])
        logp, entropy = policy.log_prob_entropy(pdparam, mb["act"], self.discrete)
        adv = mb["adv"]
        if self.algo.normalize_advantage and len(adv) > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        ratio = torch.exp(logp - mb["old_logp"])
        surrogate = torch.min(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv)
        val_loss = self.value_loss(value, mb["v_target"])
        entropy = entropy.mean()
        loss = -surrogate.mean() + self.algo.val_loss_coef * val_loss
        if ent_coef:  # a zero bonus is left out of the graph: same loss and grads, less backward work
            loss = loss - ent_coef * entropy
        return loss, entropy
