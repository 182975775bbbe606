"""K seeds of the lab's soft actor-critic (``agents.algorithms.sac``, Box actions) trained as one batched program.

The group is a ``SeedBatch`` (``agents.batched.algorithm``) whose members keep their own replays and sampling RNGs
(``SeedReplays``, as ``agents.batched.dqn``). Its nets are stacks of the members' (the members' nets become views
of their slices, so each session's nets, ``state_dict`` and ``weights_sha256`` stay its own):

* the actor: a ``SeedMLP`` of the K actors, (K, B, *O) -> (K, B, 2A);
* the twin critics and their targets: one ``SeedMLP`` each of the 2K critics, seed k's Q_1 and Q_2 the rows 2k and
  2k + 1 (a member's own twin stack, ``SoftActorCritic.critics``, is one seed's two rows);
* the temperatures: ``log_alpha`` (K, 1), seed k's row its own (a view in the member's ``log_alpha``).

Acting: random actions from each seed's ``rng`` before ``training_start_step`` (the member's own ``act``), then one
actor forward for the K x N observations and each seed's Gaussian draws from its own generator. Each gradient step
is ``SoftActorCritic.update``'s per seed (``training_iter`` steps per round, ``ReplayCadence``): each seed's sample
from its own replay, its own noise for a' and a~ (``policy.tanh_gaussian_sample`` with the seed's draws), its soft
target with its own alpha (the lab's ``soft_value``), its critic loss (summed over its twins, mean over its batch;
PER: weighted, and its rows' priorities set from its own TD errors), one backward for the K critic losses summed,
each seed's critics clipped to their own norm where clipping applies, the polyak update of the target stacks
(each target row from its own critic), then, on ``policy_delay``, its policy and temperature losses (the critics
frozen), one backward for all, each seed's ``log_alpha`` clamped; the optimizers (actor, critics, temperature) are
K separate optimizers each, one slice per seed (``agents.batched.optim``). Replace-type targets copy on the
frame cadence, as the lab's.

Supported: ``SoftActorCritic`` on Box actions whose critics the lab stacks (plain ``MLPNet`` critics without
``clip_grad_val``) and elementwise optimizers (``batch_problem``); discrete SAC and CrossQ are not batched.
"""

from __future__ import annotations

from typing import ClassVar

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from agents import policy
from agents.algorithms import LossStats
from agents.algorithms.base import TensorHolder
from agents.algorithms.sac import SoftActorCritic, frozen
from agents.batched.algorithm import SeedBatch
from agents.batched.dqn import stack_seeds
from agents.batched.memory import SeedReplays
from agents.batched.nets import SeedMLP
from agents.memory import PrioritizedReplay
from agents.nets import make_optim
from agents.schedules import FrameLR
from envs.clock import Clock

TWINS = 2


class BatchedSAC(SeedBatch, SoftActorCritic):
    """K seeds of the lab's ``SoftActorCritic`` (Box actions); see the module docstring."""

    policy_net = "net"
    members_own_memory = True
    action_space_kind: ClassVar[type[gym.Space]] = gym.spaces.Box

    def init_memory(self) -> SeedReplays:  # type: ignore[override]
        """The members' replays as the group's memory (no replay of the group's own)."""
        return SeedReplays([m.memory for m in self.members], self.n)

    def _stack_members(self) -> None:
        """Stack the members' actors, critics, target critics and temperatures (module docstring), and build the
        group's optimizers over the stacks, with the slot of each member optimizer parameter.

        Raises:
            ValueError: members whose twin critics are not stacked (``SoftActorCritic.stacked_critics``).
        """
        members = self.members
        if any(m.critics is None for m in members):
            raise ValueError("batched SoftActorCritic needs the lab's stacked twin critics (plain MLPNet critics "
                             "without clip_grad_val)")
        first = members[0]  # its actor optimizer's parameters by name, before stacking replaces them by views
        names = {id(p): n for n, p in first.nets["net"].named_parameters()}
        order = [names[id(p)] for g in first.optims["net"].param_groups for p in g["params"]]
        actor = SeedMLP([m.nets["net"] for m in members])
        self.critics = SeedMLP([m.nets[q] for m in members for q in ("q1_net", "q2_net")])
        self.target_critics = SeedMLP([m.nets[q] for m in members for q in ("target_q1_net", "target_q2_net")])
        self.target_critics.requires_grad_(False)
        log_alpha = TensorHolder(torch.stack([m.nets["log_alpha"].value.detach() for m in members]))
        for k, m in enumerate(members):  # each member's temperature: a view of its row
            m.nets["log_alpha"].value = nn.Parameter(log_alpha.value.detach()[k], requires_grad=False)
        self.nets = {"net": actor, "critics": self.critics, "target_critics": self.target_critics,
                     "log_alpha": log_alpha}
        actor_stack = actor.stack_of()
        actor_slots = [actor_stack[name] for name in order]
        # a member's critics optimizer steps its own twin stack (weights then biases, in the member order of
        # q1_net's names), which is rows 2k, 2k + 1 of the group's stack of the same order
        self.slots = {"net": actor_slots,
                      "critics": [(p, TWINS) for p in self.critics.parameters()],
                      "log_alpha": [(log_alpha.value, False)]}
        for name, slots in self.slots.items():
            self.optims[name] = make_optim([{"params": list(dict.fromkeys(p for p, _ in slots))}],
                                           self.optim_specs[name])
            self.lr_scheds[name] = FrameLR(self.optims[name], self.lr_scheds[name].factor)

    @property
    def training_iter(self) -> int:
        """Gradient steps per round: each member's (``num_envs`` of a seed when unset, not the group's K x N)."""
        return self.members[0].training_iter

    @torch.no_grad()
    def act(self, obs_NO: np.ndarray, clock: Clock, deterministic: bool = False) -> np.ndarray:
        """Actions (K*N, A) in [-1, 1] for the group's observations (K*N, *O): before ``training_start_step`` each
        member's own random actions (``SoftActorCritic.act``), then one actor forward and seed k's N drawn from
        member k's generator (the tanh of ``policy.sample``, as the lab's ``act``)."""
        n, members = self.n, self.members
        if not deterministic and clock.frame < self.algo_spec.training_start_step:
            return np.concatenate([m.act(obs_NO[k * n:(k + 1) * n], clock) for k, m in enumerate(members)])
        pdparam = self.nets["net"](self.obs_tensor(obs_NO).reshape(self.k, n, *self.obs_space.shape))
        return torch.cat([torch.tanh(policy.sample(pdparam[k], False, m.gen, deterministic))
                          for k, m in enumerate(members)]).cpu().numpy()

    def seed_noise(self, mean: torch.Tensor) -> torch.Tensor:
        """Standard normal draws (K, B, A) shaped like ``mean``, seed k's (B, A) from member k's generator (the draw
        ``policy.tanh_gaussian_sample`` makes in seed k's separate session)."""
        return torch.stack([torch.randn(mean.shape[1:], generator=m.gen, device=mean.device, dtype=mean.dtype)
                            for m in self.members])

    def tanh_sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """a (K, B, A) and log pi(a) (K, B) of the actor on (K, B, *O), each seed's noise its own."""
        pdparam = self.nets["net"](obs)
        return policy.tanh_gaussian_sample(pdparam, None, eps=self.seed_noise(pdparam[..., :pdparam.shape[-1] // 2]))

    def seed_twin_q(self, obs: torch.Tensor, act: torch.Tensor, target: bool = False) -> torch.Tensor:
        """Q_1, Q_2 (K, 2, B) of each seed's critics (or target critics) on its (obs (K, B, *O), act (K, B, A))."""
        k, b = obs.shape[:2]
        x = torch.cat([obs.flatten(2).float(), act.float()], dim=-1)
        x = x.unsqueeze(1).expand(k, TWINS, b, x.shape[-1]).reshape(k * TWINS, b, x.shape[-1])
        return (self.target_critics if target else self.critics)(x).reshape(k, TWINS, b)

    def update(self, clock: Clock) -> list[LossStats]:  # type: ignore[override]
        """One training round of every seed (``SoftActorCritic.update`` per seed, see the module docstring); per
        seed its ``LossStats`` (means over the round's steps)."""
        self.last_train_frame = clock.frame
        members, spec = self.members, self.algo_spec
        log_alpha = self.nets["log_alpha"].value  # (K, 1)
        prioritized = isinstance(members[0].memory, PrioritizedReplay)
        steps: dict[str, list[torch.Tensor]] = {k: [] for k in ("loss", "grad_norm", *self.metric_names)}
        for _ in range(self.training_iter):
            batch = stack_seeds(self, [m.memory.sample(m.rng, clock.frame) if prioritized else m.memory.sample(m.rng)
                                       for m in members])
            alpha = log_alpha.detach().exp()  # (K, 1)
            with torch.no_grad():
                next_act, next_logp = self.tanh_sample(batch["next_obs"])
                q_next = self.seed_twin_q(batch["next_obs"], next_act, target=True)
                y = batch["reward"] + spec.gamma * (1.0 - batch["terminated"]) * self.soft_value(
                    q_next[:, 0], q_next[:, 1], next_logp, alpha)  # (K, B)
            q = self.seed_twin_q(batch["obs"], batch["act"])
            elem = self.loss_fn(q, y.unsqueeze(1).expand_as(q)).sum(dim=1)  # (K, B)
            q_loss = (batch["weight"] * elem).mean(-1) if "weight" in batch else elem.mean(-1)
            if prioritized:
                td = (y - q.detach().min(dim=1).values).cpu().numpy()
                for m, idx, td_k in zip(members, batch["idx"], td):
                    m.memory.update_priorities(idx, td_k)
            steps["td_error"].append((y - q[:, 0].detach()).abs().mean(-1))
            steps["grad_norm"].append(self.optim_step_tensor(q_loss.sum(), ("critics",), clock))
            self.polyak_targets()
            steps["q_loss"].append(q_loss.detach())
            loss = q_loss.detach()
            if clock.opt_step % spec.policy_delay == 0:
                policy_loss, alpha_loss = self.seed_actor_losses(batch["obs"], alpha)
                self.optim_step_tensor((policy_loss + alpha_loss).sum(), ("net", "log_alpha"), clock, count=False,
                                       norm=False)
                with torch.no_grad():
                    log_alpha.clamp_(spec.log_alpha_min, spec.log_alpha_max)
                loss = loss + (policy_loss + alpha_loss).detach()
                steps["policy_loss"].append(policy_loss.detach())
                steps["alpha_loss"].append(alpha_loss.detach())
            steps["loss"].append(loss)
            steps["alpha"].append(log_alpha.detach().exp().squeeze(-1))
        self.replace_targets(clock)
        for m in members:
            for name in self.optims:
                m.lr_scheds[name].step_to(clock.frame)
        means = {key: torch.stack(v).mean(0).tolist() if v else [float("nan")] * self.k for key, v in steps.items()}
        return [LossStats(means["loss"][k], float("nan"), means["grad_norm"][k],
                          {name: means[name][k] for name in self.metric_names}) for k in range(self.k)]

    def seed_actor_losses(self, obs: torch.Tensor, alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each seed's policy loss ``mean(alpha log pi(a~|s) - min_k Q_k(s, a~))`` and temperature loss
        ``-mean(exp(log_alpha) (log pi + H_target))`` (K,) each, as ``SoftActorCritic.actor_losses`` (Box): the
        critics take no gradient, the actor's reaches them through a~."""
        exp_log_alpha = self.nets["log_alpha"].value.exp()  # (K, 1)
        act, logp = self.tanh_sample(obs)
        with frozen(self.critic_params()):
            q = self.seed_twin_q(obs, act).min(dim=1).values
        policy_loss = (alpha * logp - q).mean(-1)
        return policy_loss, -(exp_log_alpha * (logp.detach() + self.target_entropy)).mean(-1)
