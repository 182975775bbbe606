"""CrossQ (Bhatt et al. 2024, "CrossQ: Batch Normalization in Deep Reinforcement Learning for Greater Sample
Efficiency and Simplicity", ICLR, arXiv:1902.05605; SLM-Lab v5.2).

A ``SoftActorCritic`` (same actor, temperature, losses and keys; see ``sac.py``) without target critics: each
critic is an MLP with batch renormalization (Ioffe 2017, arXiv:1702.03275) after every hidden linear layer,
and one forward in train mode over the concatenated batch ``[(s, a); (s', a')]`` (2B rows) gives Q(s, a)
and, detached, the bootstrap Q(s', a'), so both halves share the normalization statistics:

    y = r + gamma * (1 - terminated) * V'(s')   with V' from the detached second half (``soft_value``)

The actor and temperature losses evaluate the critics in eval mode (running statistics). ``net.update_type``
and ``polyak_coef`` are not read (no targets). Critics: ``agent.critic_net`` when given (SLM-Lab's CrossQ specs:
a TorchArcNet whose arc has ``LazyBatchRenorm1d`` layers), else with ``net.batch_norm: true`` nets of ``agent.net``
(MLPNets with a BatchNorm1d after every hidden linear layer, as SLM-Lab v5.3's CrossQ builds them), else
``BRNCritic`` on ``net.hid_layers`` with ``agents.batch_renorm.BatchRenorm1d`` (SLM-Lab v5.3's batch renorm:
limits ramped over ``BRN_WARMUP`` training forwards, momentum ``BRN_MOMENTUM``, eps ``BRN_EPS``); statistics and
step counters are module buffers, so they are in the checkpoint and in ``weights_sha256``.

train_df columns: as SAC (``q_loss``, ``policy_loss``, ``alpha_loss``, ``alpha``, ``td_error``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from agents.algorithms.sac import SoftActorCritic
from agents.batch_renorm import BatchRenorm1d
from agents.nets import ACTIVATIONS, obs_in_dim
from envs.clock import Clock

BRN_MOMENTUM, BRN_EPS, BRN_WARMUP = 0.01, 1e-3, 5000  # SLM-Lab v5.3's CrossQ specs


class BRNCritic(nn.Module):
    """Q-net: ``[Linear -> BatchRenorm1d -> activation] x len(hid_layers) -> Linear``.

    Forward: observations (B, *O) and optional extra inputs (B, E) (the action) -> (B, out_dim).
    """

    def __init__(self, in_dim: int, out_dim: int, hid_layers: list[int], activation: str) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for width in hid_layers:
            layers += [nn.Linear(in_dim, width),
                       BatchRenorm1d(width, eps=BRN_EPS, momentum=BRN_MOMENTUM, warmup_steps=BRN_WARMUP),
                       ACTIVATIONS[activation]()]
            in_dim = width
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(in_dim, out_dim)

    def forward(self, x: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor:
        """Q(s, a) (B, out_dim) from observations x (B, *O) and extra inputs (B, *E) (the actions), each
        flattened to (B, -1), cast to float and concatenated before the first layer."""
        h = torch.cat([x.reshape(len(x), -1).float(), *(e.reshape(len(e), -1).float() for e in extra)], dim=-1)
        return self.head(self.body(h))


class CrossQ(SoftActorCritic):
    """SAC without target critics, with batch-renormalized critics and a joint (s, a) / (s', a') forward."""

    stack_critics = False  # batch-renormalized critics, each with its own train/eval mode and statistics

    def init_nets(self) -> None:
        """SAC's nets without target copies; without ``agent.critic_net`` or ``net.batch_norm`` the critics are
        ``BRNCritic``.

        Raises:
            ValueError: an action space other than Discrete and 1-D Box.
        """
        super().init_nets()
        ns = self.net_spec
        act_dim = 0 if self.discrete else self.action_space.shape[0]
        q_out = int(self.action_space.n) if self.discrete else 1
        for k in ("q1_net", "q2_net"):
            del self.nets[f"target_{k}"]
            # else SAC built them from agent.critic_net (its arc's BRN layers) or, with net.batch_norm, from agent.net:
            # MLPNets with BatchNorm1d layers, as SLM-Lab v5.3's CrossQ builds its critics from net_spec
            if self.spec.critic_net is None and not ns.batch_norm:
                self.nets[k] = BRNCritic(obs_in_dim(self.obs_space) + act_dim, q_out, list(ns.hid_layers),
                                         ns.hid_layers_activation).to(self.device)
                self.add_optim(k, self.nets[k].parameters(), self.critic_optim_spec)

    def critic_preds(self, batch: dict[str, torch.Tensor],
                     alpha: torch.Tensor) -> tuple[torch.Tensor, Any, torch.Tensor]:
        """As SAC's, from one train-mode forward per critic over the 2B rows ``[(s, a); (s', a')]``."""
        obs, act, next_obs = batch["obs"], batch["act"], batch["next_obs"]
        next_act, next_logp = self.next_action(next_obs)
        both_obs = torch.cat([obs, next_obs])
        q_cur, q_next = [], []
        for k in ("q1_net", "q2_net"):
            self.nets[k].train()
            if self.discrete:
                q = self.nets[k](both_obs)
            else:
                q = self.nets[k](both_obs, torch.cat([act, next_act])).squeeze(-1)
            q_cur.append(q[: len(obs)])
            q_next.append(q[len(obs):].detach())
        with torch.no_grad():
            y = batch["reward"] + self.algo_spec.gamma * (1.0 - batch["terminated"]) * self.soft_value(
                *q_next, next_logp, alpha)
        q_all = torch.stack(q_cur)
        if not self.discrete:
            return q_all, None, y
        return q_all.gather(-1, act.expand(2, -1).unsqueeze(-1)).squeeze(-1), q_all.detach(), y

    def actor_losses(self, obs: torch.Tensor, alpha: torch.Tensor,
                     q_all: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[torch.Tensor, torch.Tensor]:
        """SAC's actor and temperature losses with the critics in eval mode (running statistics)."""
        for k in ("q1_net", "q2_net"):
            self.nets[k].eval()
        return super().actor_losses(obs, alpha, q_all)

    def polyak_targets(self) -> None:
        """No target critics: nothing to do."""

    def replace_targets(self, clock: Clock) -> None:
        """No target critics: nothing to do."""
