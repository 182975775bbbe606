"""Self-imitation learning (Oh et al. 2018, "Self-Imitation Learning", arXiv:1806.05635) on A2C: SLM-Lab's
``SIL``, reimplemented. ``SILMixin`` holds everything SIL adds and is shared with ``PPOSIL`` (``ppo_sil.py``).

An ``ActorCritic`` (same nets, optimizers, rollouts and losses; see ``actor_critic.py``) whose memory is a
``SILReplay`` (``agents/memory/sil.py``): the on-policy memory ``agent.memory.name`` plus a replay
(``agent.memory.sil_replay_name``: ``Replay``, or ``PrioritizedReplay`` as in the paper) of the transitions of
finished episodes with their discounted Monte-Carlo returns R. Each ``update`` is the algorithm's own update,
then ``training_iter`` times: sample ``memory.batch_size`` rows from the replay, and take
``training_batch_iter`` gradient steps on that batch of

    loss = sil_policy_loss_coef * mean(w * -log pi(a|s) * max(R - V(s), 0))      (advantage not differentiated)
         + sil_val_loss_coef * mean(w * 0.5 * max(R - V(s), 0) ** 2)

(``sil_losses``; w = 1, or the importance weights of a ``PrioritizedReplay``, whose priorities become
``(max(R - V, 0) + epsilon) ** alpha`` at each step, paper section 3 and appendix A). So the agent imitates
only its own past actions that did better than it now expects (R > V). The SIL steps start once the replay
holds ``training_start_step`` transitions: after a resume without the replay (no ``memory.checkpoint``),
that is the refill gate (``refill`` rows, ``Algorithm.refill_size``); the on-policy updates go on meanwhile.

Each SIL step is one optimizer step of every optimizer of the algorithm (one ``opt_step``, as SLM-Lab ticks
it). SLM-Lab differences, on purpose: SLM-Lab adds the rollout's transitions to a plain replay and computes
R at sample time over the sampled (unordered) batch, so R mixes unrelated transitions; here R is each
transition's own episode return, stored when the episode ends (the paper's, and SLM-Lab's earlier
SILReplay's, definition). With separate actor and critic nets SLM-Lab steps only the actor's optimizer on
the SIL loss (the critic's SIL gradients are dropped); here the critic is stepped too, as in the paper.

train_df columns of its own, beyond ``ActorCritic``'s: ``sil_policy_loss`` and ``sil_val_loss`` (the two terms
before their coefficients, means over the update's SIL steps; NaN while the replay is short). ``loss``,
``entropy`` and ``grad_norm`` are the on-policy update's. With ``normalize_v_targets`` only the on-policy value
loss is normalized; the SIL terms compare the raw V with the raw R.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from agents import policy
from agents.algorithms.actor_critic import ActorCritic, ActorCriticSpec
from agents.algorithms.base import LossStats, mean_metrics
from agents.memory import SILReplay, make_replay
from envs.clock import Clock

SIL_METRICS = ("sil_policy_loss", "sil_val_loss")


def sil_losses(logp: torch.Tensor, value: torch.Tensor, ret: torch.Tensor,
               weight: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SIL's policy and value losses (Oh et al. 2018, eq. 2-3) of one replay batch of B samples.

    Args:
        logp: log pi(a|s) (B,) of the stored actions, in nats.
        value: V(s) (B,).
        ret: stored discounted returns R (B,).
        weight: importance weights (B,) of a prioritized sample, or None (all 1).

    Returns:
        ``policy_loss = mean(w * -logp * A)`` and ``val_loss = mean(w * 0.5 * A ** 2)`` (scalars), and the clipped
        advantage ``A = max(R - V, 0)`` (B,); the policy loss does not differentiate A, the value loss does (its
        gradient raises V toward R where R > V only).
    """
    clipped = torch.clamp(ret - value, min=0.0)
    w = torch.ones_like(clipped) if weight is None else weight
    policy_loss = -(w * logp * clipped.detach()).mean()
    val_loss = (w * 0.5 * clipped.pow(2)).mean()
    return policy_loss, val_loss, clipped


@dataclass(frozen=True)
class SILFields:
    """The keys SIL adds to its base algorithm's spec (SLM-Lab names, but ``training_start_step``).

    Fields:
        sil_policy_loss_coef: weight of the self-imitation policy loss (>= 0).
        sil_val_loss_coef: weight of the self-imitation value loss (>= 0; the paper's is 0.01).
        training_iter: replay batches per update.
        training_batch_iter: gradient steps per batch.
        training_start_step: replay transitions before the first SIL step; SLM-Lab has no such key and samples
            whatever its replay holds (default 1).
    """

    sil_policy_loss_coef: float = field(default=1.0, metadata={"ge": 0, "perturbable": True})
    sil_val_loss_coef: float = field(default=0.01, metadata={"ge": 0, "perturbable": True})
    training_iter: int = field(default=4, metadata={"gt": 0, "perturbable": True})
    training_batch_iter: int = field(default=4, metadata={"gt": 0})
    training_start_step: int = field(default=1, metadata={"origin": "lab", "gt": 0})


class SILMixin:
    """What SIL adds to an ``ActorCritic`` (mixed in before it): the ``SILReplay`` memory, the SIL steps after
    each on-policy update, the replay in checkpoints only with ``memory.checkpoint``; see module docstring.
    Needs the ``ActorCritic`` interface (``pdparam_value``, ``optim_step``, ``self.optims``, ``self.rng``)."""

    sil_replay = True  # orchestrator.spec.preflight counts the replay's bytes beside the on-policy memory
    def init_memory(self) -> SILReplay:
        """The base algorithm's on-policy memory plus a ``memory.sil_replay_name`` replay of ``memory.max_size``
        transitions (actions (A,) float32 for Box, int64 for Discrete), without next observations."""
        onpolicy = super().init_memory()
        act_shape, act_dtype = ((), np.int64) if self.discrete else (self.action_space.shape, np.float32)
        replay = make_replay(self.spec.memory, self.obs_space, act_shape, act_dtype,
                             name=self.spec.memory.sil_replay_name or "Replay", store_next_obs=False)
        return SILReplay(onpolicy, replay, self.algo_spec.gamma, self.num_envs)

    def refill_size(self) -> int:
        """Replay transitions before SIL steps: ``training_start_step``."""
        return self.algo_spec.training_start_step

    def update(self, clock: Clock) -> LossStats:
        """The base algorithm's update, then the SIL steps (``sil_update``); their metrics join its own."""
        stats = super().update(clock)
        stats.metrics.update(self.sil_update(clock))
        return stats

    def sil_update(self, clock: Clock) -> dict[str, float]:
        """``training_iter`` replay batches x ``training_batch_iter`` steps on ``sil_losses`` (none while the replay
        holds fewer than ``training_start_step`` transitions).

        Returns:
            ``sil_policy_loss`` and ``sil_val_loss``, means over the steps (NaN without steps).
        """
        if len(self.memory) < self.refill_size():
            return {name: math.nan for name in SIL_METRICS}
        algo_spec, optim_names = self.algo_spec, tuple(self.optims)
        metrics: dict[str, list[Any]] = {name: [] for name in SIL_METRICS}
        for _ in range(algo_spec.training_iter):
            batch = self.memory.sample(self.rng, clock.frame)
            obs = self.obs_tensor(batch["obs"])
            act = self.to_tensor(batch["act"], torch.int64 if self.discrete else torch.float32)
            ret = self.to_tensor(batch["ret"])
            weight = self.to_tensor(batch["weight"]) if "weight" in batch else None
            for _ in range(algo_spec.training_batch_iter):
                pdparam, value = self.pdparam_value(obs)
                logp = policy.log_prob_entropy(pdparam, act, self.discrete)[0]
                policy_loss, val_loss, clipped = sil_losses(logp, value, ret, weight)
                if "idx" in batch:
                    self.memory.replay.update_priorities(batch["idx"], clipped.detach().cpu().numpy())
                loss = algo_spec.sil_policy_loss_coef * policy_loss + algo_spec.sil_val_loss_coef * val_loss
                self.optim_step(loss, optim_names, clock)
                metrics["sil_policy_loss"].append(policy_loss.detach())
                metrics["sil_val_loss"].append(val_loss.detach())
        return mean_metrics(metrics)

    def state_dict(self, with_memory: bool = False) -> dict[str, Any]:
        """The base state; the memory always, its replay only ``with_memory`` (``memory.checkpoint``)."""
        state = super().state_dict(with_memory=False)
        state["memory"] = self.memory.state_dict(with_replay=with_memory)
        return state


@dataclass(frozen=True)
class SILSpec(SILFields, ActorCriticSpec):
    """SIL keys (SLM-Lab names): ``ActorCriticSpec``'s plus ``SILFields``."""


class SIL(SILMixin, ActorCritic):
    """Self-imitation learning on A2C (SLM-Lab ``SIL``); see module docstring. Nets and memories as
    ``ActorCritic``, the memory wrapped in a ``SILReplay``."""

    spec_cls = SILSpec
    metric_names = ActorCritic.metric_names + SIL_METRICS
