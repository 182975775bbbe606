"""Advantage actor-critic, A2C (Mnih et al. 2016, arXiv:1602.01783, synchronous form), and the actor-critic
base that PPO extends.

Rollouts: ``OnPolicyBatchReplay`` of T vector steps (T = ``num_step_returns`` when it is set, else
``training_frequency``), or ``OnPolicyReplay`` of ``training_frequency`` completed episodes. Advantages:
GAE (Schulman et al. 2016, arXiv:1506.02438) when ``lam`` is set; else n-step returns
(``agents.returns.calc_nstep_returns``) when ``num_step_returns`` is set; else Monte-Carlo returns minus
V (SLM-Lab's three modes). Value targets are ``adv + V`` (GAE) or the returns. One gradient step per
rollout on

    loss = policy_loss_coef * -(logp * adv).mean() + val_loss_coef * L(V, v_target) - entropy_coef * H

where ``L`` is ``net.loss_spec`` and ``entropy_coef`` comes from ``entropy_coef_spec`` (frames). Actor
and critic are one net with two heads (``net.shared``; optimizer ``net.actor_optim_spec`` if given, else
``net.optim_spec``, as SLM-Lab) or two nets stepped together on that one loss:
by one optimizer over both (``net.optim_spec``), or by two when ``net.actor_optim_spec`` /
``net.critic_optim_spec`` are given (the other falls back to ``optim_spec``). For disjoint nets the
combined loss gives each net exactly the gradient of its own term, as SLM-Lab's two separate steps do;
clipping (``clip_grad_val``) is per net, as SLM-Lab's. Either way it is one ``opt_step``. A TorchArcNet actor
and critic take their bodies from ``net.actor_arc`` / ``net.critic_arc`` when given (``agents.nets.role_spec``;
a shared net the actor's).

train_df columns of its own: ``policy_loss`` (``-(logp * adv).mean()`` for A2C, the negated clipped
surrogate for PPO) and ``val_loss`` (``L(V, v_target)``, before ``val_loss_coef``), means over the
update's gradient steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from agents import policy
from agents.algorithms.base import Algorithm, AlgorithmSpec, LossStats, mean_metrics
from agents.memory import EPISODIC, OnPolicyBatchReplay, OnPolicyReplay, episodic_memory
from agents.nets import POLICY_GAIN, VALUE_GAIN, make_loss, role_spec
from agents.returns import ADV_NORMS, ReturnNormalizer, calc_gaes, calc_nstep_returns, calc_returns, standardize
from envs.clock import Clock


@dataclass(frozen=True)
class ActorCriticSpec(AlgorithmSpec):
    """ActorCritic keys (SLM-Lab names).

    Fields:
        lam: GAE lambda in [0, 1], or None (n-step returns).
        num_step_returns: n of n-step returns, used when ``lam`` is None; it is also the rollout length in vector
            steps.
        policy_loss_coef: weight of the policy loss.
        val_loss_coef: weight of the value loss.
        normalize_advantages: ``standardize`` the advantages over each gradient step's batch, as SLM-Lab v5.3's
            ``Reinforce.calc_policy_loss``, which A2C inherits, always does, or ``none`` (the lab's value to turn it
            off; the lab's earlier boolean ``normalize_advantage`` is read as an alias, ``orchestrator.spec.aliases``).
        normalize_v_targets: value predictions and targets divided by a running scale of the targets before the
            value loss (``agents.returns.ReturnNormalizer``, updated at every value loss, as SLM-Lab v5.3 does).
        training_frequency: vector steps per rollout with ``OnPolicyBatchReplay``, completed episodes with
            ``OnPolicyReplay``.
    """

    lam: float | None = field(default=0.95, metadata={"ge": 0, "le": 1, "perturbable": True})
    num_step_returns: int | None = field(default=None, metadata={"gt": 0})
    policy_loss_coef: float = field(default=1.0, metadata={"ge": 0, "perturbable": True})
    val_loss_coef: float = field(default=1.0, metadata={"ge": 0, "perturbable": True})
    # SLM-Lab v5.3 standardizes A2C's advantages in every policy loss
    normalize_advantages: str = field(default="standardize", metadata={"choices": ADV_NORMS, "origin": "lab"})
    normalize_v_targets: bool = False


class ActorCritic(Algorithm):
    """Synchronous advantage actor-critic; see module docstring. Nets: ``net`` (shared, heads
    ``[pd_dim, 1]``) or ``actor`` (B, *O) -> (B, pd_dim) and ``critic`` -> (B, 1); pd_dim is
    ``policy_out_dim()``. With ``net.log_std_init`` (Box actions) the tensor ``log_std`` (A,) joins the
    actor's optimizer (``Algorithm.add_log_std``)."""

    spec_cls = ActorCriticSpec
    memory_names = ("OnPolicyBatchReplay", "OnPolicyReplay", "OnPolicyCrossEntropy")
    optim_keys = ("net.optim_spec", "net.actor_optim_spec", "net.critic_optim_spec")
    metric_names = ("policy_loss", "val_loss")
    role_arcs = True  # net.actor_arc / net.critic_arc

    def init_nets(self) -> None:
        """Actor and critic, shared or separate, and their optimizers (see module docstring)."""
        pd_dim = self.policy_out_dim()
        ns = self.net_spec
        if ns.shared:
            self.nets["net"] = self.make_net([pd_dim, 1], [POLICY_GAIN, VALUE_GAIN], net_spec=role_spec(ns, "actor"))
            # SLM-Lab builds a shared net from the actor's keys: actor_optim_spec when given
            self.add_optim("net", [*self.nets["net"].parameters(), *self.add_log_std()],
                           ns.actor_optim_spec or ns.optim_spec)
        else:
            self.nets["actor"] = self.make_net(pd_dim, [POLICY_GAIN], net_spec=role_spec(ns, "actor"))
            self.nets["critic"] = self.make_net(1, [VALUE_GAIN], net_spec=role_spec(ns, "critic"))
            log_std = self.add_log_std()
            if ns.actor_optim_spec is None and ns.critic_optim_spec is None:
                # One optimizer over both nets (as SB3 does): the same per-parameter updates as two
                # optimizers of one spec, in one step call instead of two; a param group per net, so
                # each net's gradient is clipped on its own (``optim_step``), as SLM-Lab's two steps do.
                self.add_optim("net", [{"params": [*self.nets["actor"].parameters(), *log_std]},
                                       {"params": list(self.nets["critic"].parameters())}], ns.optim_spec)
            else:
                self.add_optim("actor", [*self.nets["actor"].parameters(), *log_std],
                               ns.actor_optim_spec or ns.optim_spec)
                self.add_optim("critic", self.nets["critic"].parameters(),
                               ns.critic_optim_spec or ns.optim_spec)
        self.value_loss = make_loss(ns.loss_spec)
        self.return_normalizer = ReturnNormalizer() if self.algo_spec.normalize_v_targets else None

    def horizon(self) -> int:
        """Vector steps per ``OnPolicyBatchReplay`` rollout: ``num_step_returns`` if set, else
        ``training_frequency``."""
        return self.algo_spec.num_step_returns or self.algo_spec.training_frequency

    def init_memory(self) -> OnPolicyBatchReplay | OnPolicyReplay:
        """A rollout of ``horizon()`` vector steps, or ``training_frequency`` episodes (``OnPolicyReplay``)."""
        if self.spec.memory.name in EPISODIC:
            return episodic_memory(self.spec.memory, self.algo_spec.training_frequency, self.num_envs)
        return OnPolicyBatchReplay(self.horizon())

    def pdparam_value(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Policy parameters (B, pd_dim) and state values (B,) of observations (B, *O)."""
        if self.net_spec.shared:
            pdparam, value = self.nets["net"](obs)
        else:
            pdparam, value = self.nets["actor"](obs), self.nets["critic"](obs)
        return self.pdparam(pdparam), value.squeeze(-1)

    @torch.no_grad()
    def act(self, obs_NO: np.ndarray, clock: Clock, deterministic: bool = False) -> np.ndarray:
        """Sample actions (N,) or (N, A) from the policy; its mode when ``deterministic``."""
        obs = self.obs_tensor(obs_NO)
        pdparam = self.pdparam(self.nets["net"](obs)[0] if self.net_spec.shared else self.nets["actor"](obs))
        return policy.sample(pdparam, self.discrete, self.gen, deterministic).cpu().numpy()

    def train_ready(self, clock: Clock) -> bool:
        """A full rollout (``horizon()`` vector steps, or ``training_frequency`` episodes) is stored."""
        return self.memory.ready()

    def advantages(self, batch: dict[str, torch.Tensor], value: torch.Tensor,
                   next_value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Advantages and value targets, both (T, N), of a time-major rollout (GAE, n-step or MC)."""
        algo_spec = self.algo_spec
        reward, terminated, done = batch["reward"], batch["terminated"], batch["done"]
        if algo_spec.lam is not None:
            adv = calc_gaes(reward, value, next_value, terminated, done, algo_spec.gamma, algo_spec.lam)
            return adv, adv + value
        if algo_spec.num_step_returns is not None:
            ret = calc_nstep_returns(reward, next_value, terminated, done, algo_spec.gamma)
        else:
            ret = calc_returns(reward, done, algo_spec.gamma)
        return ret - value, ret

    @torch.no_grad()
    def prepare(self, batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """Flatten a (T, N) rollout (or (T,) episodes) to B = T*N samples: obs (B, *O), act (B, *A),
        old_logp, old_value (V before the update), adv, v_target (B,).

        V(next_obs) is computed only for the steps whose next obs is not the next step's obs (``next_shared``
        of ``OnPolicyBatchReplay.pop``: done steps and the last one); the others take V of the next step's obs
        from the obs forward, which saves a forward over the whole rollout."""
        if batch["reward"].ndim == 1:  # OnPolicyReplay: one time axis of concatenated episodes
            batch = {k: v[:, None] for k, v in batch.items()}
        t, n = batch["reward"].shape
        obs = self.rollout_obs(batch["obs"].reshape(t * n, *self.obs_space.shape))
        act_dtype = torch.int64 if self.discrete else torch.float32
        act = self.to_tensor(batch["act"], act_dtype).reshape(t * n, *self.action_space.shape)
        pdparam, value = self.pdparam_value(obs)
        shared = batch["next_shared"] if "next_shared" in batch else np.zeros(t, bool)  # (T,)
        own = np.flatnonzero(~shared)
        next_value = torch.empty(t, n, dtype=value.dtype, device=value.device)
        next_value[:-1] = value.reshape(t, n)[1:]
        next_obs = self.obs_tensor(batch["next_obs"][own]).reshape(len(own) * n, *self.obs_space.shape)
        next_value[torch.as_tensor(own, device=value.device)] = self.pdparam_value(next_obs)[1].reshape(len(own), n)
        old_logp = policy.log_prob_entropy(pdparam, act, self.discrete)[0]
        flags = {"reward": self.to_tensor(batch["reward"]), "terminated": self.to_tensor(batch["terminated"]),
                 "done": self.to_tensor(np.logical_or(batch["terminated"], batch["truncated"]))}
        adv, v_target = self.advantages(flags, value.reshape(t, n), next_value)
        return {"obs": obs, "act": act, "old_logp": old_logp, "old_value": value, "adv": adv.reshape(-1),
                "v_target": v_target.reshape(-1)}

    def update(self, clock: Clock) -> LossStats:
        """One gradient step on the whole rollout (``minibatch_loss`` of all B samples)."""
        data = self.prepare(self.memory.pop())
        loss, entropy, metrics = self.minibatch_loss(data, clock)
        grad_norm = self.optim_step(loss, tuple(self.optims), clock)
        return LossStats(float(loss.detach()), float(entropy), grad_norm, mean_metrics(metrics))

    def policy_loss(self, logp: torch.Tensor, mb: dict[str, torch.Tensor], adv: torch.Tensor,
                    clock: Clock, metrics: dict[str, list[Any]]) -> torch.Tensor:
        """Policy loss ``-(logp * adv).mean(-1)`` from log-probs and advantages (..., B): a scalar for (B,), one
        loss per seed for the (K, B) of ``agents.batched``."""
        return -(logp * adv).mean(-1)

    def normalize_adv(self, adv: torch.Tensor) -> torch.Tensor:
        """Advantages (..., B) standardized over the batch (the last dim) with ``normalize_advantages: standardize``
        (and B > 1), unchanged with ``none``."""
        return standardize(adv) if self.algo_spec.normalize_advantages == "standardize" else adv

    def val_loss(self, value: torch.Tensor, mb: dict[str, torch.Tensor], clock: Clock) -> torch.Tensor:
        """Scalar value loss ``L(V, v_target)`` of values (B,) against ``mb["v_target"]`` (B,), before
        ``val_loss_coef``; with ``normalize_v_targets`` the running scale is first updated with the
        targets and both sides are divided by it."""
        v_target = mb["v_target"]
        if self.return_normalizer is not None:
            self.return_normalizer.update(v_target)
            value, v_target = self.return_normalizer.normalize(value), self.return_normalizer.normalize(v_target)
        return self.value_loss(value, v_target)

    def extra_state(self) -> dict[str, Any]:
        """The running normalizers' statistics (plain numbers), when the spec turns them on."""
        return {name: norm.state_dict() for name, norm in self.normalizers().items()}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Restore ``extra_state``."""
        for name, norm in self.normalizers().items():
            norm.load_state_dict(state[name])

    def normalizers(self) -> dict[str, Any]:
        """The stateful normalizers in use, by name (subclasses add theirs)."""
        return {"return_normalizer": self.return_normalizer} if self.return_normalizer is not None else {}

    def minibatch_loss(self, mb: dict[str, torch.Tensor], clock: Clock,
                       metrics: dict[str, list[Any]] | None = None) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """Loss, mean entropy and the metric lists (appended to ``metrics``) of one batch of B samples: scalars
        for a batch of (B, ...) tensors; with a leading seed dim (``agents.batched``: (K, B, ...)), every
        reduction is over the last (sample) dim, so each is (K,), one value per seed."""
        metrics = {name: [] for name in self.metric_names} if metrics is None else metrics
        pdparam, value = self.pdparam_value(mb["obs"])
        logp, entropy = policy.log_prob_entropy(pdparam, mb["act"], self.discrete)
        adv = self.normalize_adv(mb["adv"])
        policy_loss = self.policy_loss(logp, mb, adv, clock, metrics)
        val_loss = self.val_loss(value, mb, clock)
        entropy = entropy.mean(-1)
        loss = self.algo_spec.policy_loss_coef * policy_loss + self.algo_spec.val_loss_coef * val_loss
        ent_coef = self.entropy_coef(clock.frame)
        if ent_coef:  # a zero bonus is left out of the graph: same loss and grads, less backward work
            loss = loss - ent_coef * entropy
        metrics["policy_loss"].append(policy_loss.detach())
        metrics["val_loss"].append(val_loss.detach())
        return loss, entropy.detach(), metrics
