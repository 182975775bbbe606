"""PPO with the clipped surrogate objective (Schulman et al. 2017, arXiv:1707.06347).

An ``ActorCritic`` (same nets, optimizers, GAE advantages and value loss; see ``actor_critic.py``) whose
update runs, per rollout of ``time_horizon`` vector steps (T x N frames), ``training_epoch`` epochs of
shuffled minibatches of ``minibatch_size`` samples (the last one of an epoch holds the remainder, so
every sample is used), each one gradient step (one ``opt_step``) on

    loss = policy_loss_coef * -min(ratio * adv, clip(ratio, 1 - eps, 1 + eps) * adv).mean()
           + val_loss_coef * L(V, v_target) - entropy_coef * H

with ``eps`` from ``clip_eps_spec`` and ``entropy_coef`` from ``entropy_coef_spec`` (schedules of frames)
and advantages normalized per minibatch (``normalize_advantages``).

train_df columns of its own (means over the update's minibatches): ``policy_loss`` (the negated clipped
surrogate), ``val_loss``, ``clip_frac`` (fraction of samples whose ratio was clipped) and ``approx_kl``
(``mean(old_logp - logp)``, nats).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from agents.algorithms.actor_critic import ActorCritic, ActorCriticSpec
from agents.algorithms.base import LossStats, mean_metrics, take_rows
from agents.memory import EPISODIC, OnPolicyBatchReplay, OnPolicyReplay, episodic_memory
from agents.returns import ADV_NORMS, PercentileNormalizer, symlog
from agents.schedules import SCHEDULE_PERTURBABLE, VarSchedule
from envs.clock import Clock


@dataclass(frozen=True)
class PPOSpec(ActorCriticSpec):
    """PPO keys (SLM-Lab names), beyond ``ActorCriticSpec``.

    Fields:
        lam: GAE lambda, required here.
        num_step_returns: must stay null (PPO uses GAE).
        clip_eps_spec: clip range schedule (frames), see ``VarSchedule``.
        val_loss_coef: weight of the value loss.
        time_horizon: vector steps per rollout.
        minibatch_size: samples per gradient step.
        training_epoch: epochs per rollout.
        normalize_advantages: per minibatch, ``standardize`` the advantages or scale them by ``percentile``
            (``agents.returns.PercentileNormalizer``), SLM-Lab v5.3's key and values; ``none`` (the lab's value)
            leaves them as they are. The lab's earlier boolean ``normalize_advantage`` is read as an alias
            (``orchestrator.spec.aliases``): false is ``none`` unless this key says ``percentile``.
        clip_vloss: CleanRL's clipped value loss ``0.5 * max((V - G)^2, (V_old + clip(V - V_old, -eps, eps) -
            G)^2)``, with ``eps`` the policy clip range; it replaces ``normalize_v_targets`` when both are set, as in
            SLM-Lab.
        symlog: value loss on ``symlog`` of predictions and targets (SLM-Lab v5.3).
    """

    lam: float = field(default=0.95, metadata={"ge": 0, "le": 1, "perturbable": True})
    num_step_returns: int | None = field(default=None, metadata={"choices": (None,)})
    clip_eps_spec: dict = field(default_factory=lambda: {"name": "no_decay", "start_val": 0.2},
                                metadata={"perturbable": SCHEDULE_PERTURBABLE})
    val_loss_coef: float = field(default=0.5, metadata={"ge": 0, "perturbable": True})
    time_horizon: int = field(default=128, metadata={"gt": 0})
    minibatch_size: int = field(default=64, metadata={"gt": 0})
    training_epoch: int = field(default=4, metadata={"gt": 0, "perturbable": True})
    normalize_advantages: str = field(default="standardize", metadata={"choices": (*ADV_NORMS, "percentile")})
    clip_vloss: bool = False
    symlog: bool = False


class PPO(ActorCritic):
    """Proximal policy optimization; see module docstring."""

    spec_cls = PPOSpec
    memory_names = ("OnPolicyBatchReplay", "OnPolicyReplay", "OnPolicyCrossEntropy")
    schedule_keys = ("explore_var_spec", "entropy_coef_spec", "clip_eps_spec")
    metric_names = ("policy_loss", "val_loss", "clip_frac", "approx_kl")

    def init_nets(self) -> None:
        """``ActorCritic`` nets and optimizers, plus the clip range schedule."""
        super().init_nets()
        self.clip_eps = VarSchedule.from_spec(self.algo_spec.clip_eps_spec, default=0.2)
        self.percentile_normalizer = PercentileNormalizer() if self.algo_spec.normalize_advantages == "percentile" \
            else None

    def normalizers(self) -> dict[str, Any]:
        """The return normalizer and, with ``normalize_advantages: percentile``, the percentile one."""
        norms = super().normalizers()
        if self.percentile_normalizer is not None:
            norms["percentile_normalizer"] = self.percentile_normalizer
        return norms

    def normalize_adv(self, adv: torch.Tensor) -> torch.Tensor:
        """Per minibatch: scaled by the percentile EMAs (updated first) with ``normalize_advantages:
        percentile``, else as ``ActorCritic.normalize_adv`` (standardized, or unchanged with ``none``)."""
        if self.percentile_normalizer is None:
            return super().normalize_adv(adv)
        self.percentile_normalizer.update(adv)
        return self.percentile_normalizer.normalize(adv)

    def val_loss(self, value: torch.Tensor, mb: dict[str, torch.Tensor], clock: Clock) -> torch.Tensor:
        """Value loss (before ``val_loss_coef``) of values (B,) (a scalar) or (K, B) (one per seed): with ``symlog``
        on symlog-ed values, targets (and old values); with ``clip_vloss`` the clipped form of the class docstring
        (``clip_eps`` at ``clock.frame``), else ``ActorCritic.val_loss``."""
        v_target, old_value = mb["v_target"], mb["old_value"]
        if self.algo_spec.symlog:
            value, v_target, old_value = symlog(value), symlog(v_target), symlog(old_value)
        if not self.algo_spec.clip_vloss:
            return super().val_loss(value, {**mb, "v_target": v_target}, clock)
        eps = self.clip_eps(clock.frame)
        clipped = old_value + (value - old_value).clamp(-eps, eps)
        return 0.5 * torch.max((value - v_target) ** 2, (clipped - v_target) ** 2).mean(-1)

    def horizon(self) -> int:
        """``time_horizon`` vector steps per rollout."""
        return self.algo_spec.time_horizon

    def init_memory(self) -> OnPolicyBatchReplay | OnPolicyReplay:
        """An ``OnPolicyBatchReplay`` of ``time_horizon`` vector steps, or an ``OnPolicyReplay`` of
        ``training_frequency`` completed episodes (SLM-Lab's PPO refuses it; here its epochs and minibatches
        run over the episodes' steps)."""
        if self.spec.memory.name in EPISODIC:
            return episodic_memory(self.spec.memory, self.algo_spec.training_frequency, self.num_envs)
        return OnPolicyBatchReplay(self.horizon())

    def update(self, clock: Clock) -> LossStats:
        """``training_epoch`` epochs of minibatch steps on the clipped surrogate + value + entropy.

        Each epoch shuffles the B = T*N samples and steps once per ``minibatch_size`` slice,
        ``ceil(B / minibatch_size)`` optimizer steps per epoch; the last slice holds the remainder.
        """
        data = self.prepare(self.memory.pop())
        size, mb = len(data["adv"]), min(self.algo_spec.minibatch_size, len(data["adv"]))
        optim_names = tuple(self.optims)
        losses, entropies, grad_norms = [], [], []
        metrics: dict[str, list[Any]] = {name: [] for name in self.metric_names}
        for _ in range(self.algo_spec.training_epoch):
            perm = torch.randperm(size, generator=self.gen, device=self.device)
            for start in range(0, size, mb):  # the last minibatch may be smaller: every sample is used (as SB3)
                idx = perm[start:start + mb]
                loss, entropy, _ = self.minibatch_loss({k: take_rows(v, idx) for k, v in data.items()}, clock, metrics)
                grad_norms.append(self.optim_step(loss, optim_names, clock))
                losses.append(loss.detach())
                entropies.append(entropy)
        return LossStats(float(torch.stack(losses).mean()), float(torch.stack(entropies).mean()),
                         float(np.mean(grad_norms)), mean_metrics(metrics))

    def policy_loss(self, logp: torch.Tensor, mb: dict[str, torch.Tensor], adv: torch.Tensor,
                    clock: Clock, metrics: dict[str, list[Any]]) -> torch.Tensor:
        """Negated clipped surrogate of log-probs against ``mb["old_logp"]``, means over the last (sample) dim:
        a scalar for (B,), one per seed for (K, B) (``agents.batched``); so are the metrics appended."""
        clip_eps = self.clip_eps(clock.frame)
        log_ratio = (logp - mb["old_logp"]).clamp(-20.0, 20.0)  # as SLM-Lab: no exp overflow
        ratio = torch.exp(log_ratio)
        surrogate = torch.min(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv)
        with torch.no_grad():
            metrics["clip_frac"].append(((ratio - 1).abs() > clip_eps).float().mean(-1))
            metrics["approx_kl"].append(-log_ratio.mean(-1))
        return -surrogate.mean(-1)
