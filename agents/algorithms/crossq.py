"""CrossQ (Bhatt et al. 2024, "CrossQ: Batch Normalization in Deep Reinforcement Learning for Greater Sample
Efficiency and Simplicity", ICLR, arXiv:1902.05605; SLM-Lab v5.2).

A ``SoftActorCritic`` (same actor, temperature, losses and keys; see ``sac.py``) without target critics: each
critic is an MLP with batch renormalization (Ioffe 2017, arXiv:1702.03275) after every hidden linear layer,
and one forward in train mode over the concatenated batch ``[(s, a); (s', a')]`` (2B rows) gives Q(s, a)
and, detached, the bootstrap Q(s', a'), so both halves share the normalization statistics:

    y = r + gamma * (1 - terminated) * V'(s')   with V' from the detached second half (``soft_value``)

The actor and temperature losses evaluate the critics in eval mode (running statistics). ``net.update_type``
and ``polyak_coef`` are not read (no targets). Batch renorm: ``x_hat = (x - mu_B) / sigma_B * r + d`` with
``r = clip(sigma_B / sigma, 1 / R_MAX, R_MAX)``, ``d = clip((mu_B - mu) / sigma, -D_MAX, D_MAX)`` (both
detached), plain batch norm (r = 1, d = 0) for the first ``BRN_WARMUP`` training forwards, running mean and
std updated with momentum ``BRN_MOMENTUM``; all counters and statistics are module buffers, so they are in
the checkpoint and in ``weights_sha256``.

train_df columns: as SAC (``q_loss``, ``policy_loss``, ``alpha_loss``, ``alpha``, ``td_error``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from agents.algorithms.sac import SoftActorCritic
from agents.nets import ACTIVATIONS, obs_in_dim
from envs.clock import Clock

BRN_MOMENTUM, BRN_EPS, BRN_WARMUP, R_MAX, D_MAX = 0.01, 1e-3, 5000, 3.0, 5.0


class BatchRenorm1d(nn.Module):
    """Batch renormalization over (B, F) inputs (Ioffe 2017); see module docstring for the maths.

    Args:
        features: F.
        momentum: running-statistics update rate.
        eps: added to variances.
        warmup: training forwards of plain batch norm before r, d are used.
    """

    def __init__(self, features: int, momentum: float = BRN_MOMENTUM, eps: float = BRN_EPS,
                 warmup: int = BRN_WARMUP) -> None:
        super().__init__()
        self.momentum, self.eps, self.warmup = momentum, eps, warmup
        self.weight = nn.Parameter(torch.ones(features))
        self.bias = nn.Parameter(torch.zeros(features))
        self.register_buffer("running_mean", torch.zeros(features))
        self.register_buffer("running_std", torch.ones(features))
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, F) -> (B, F); batch statistics (and a running-statistics update) in train mode only."""
        if not self.training:
            x_hat = (x - self.running_mean) / self.running_std
            return x_hat * self.weight + self.bias
        mean = x.mean(0)
        std = (x.var(0, unbiased=False) + self.eps).sqrt()
        x_hat = (x - mean) / std
        if int(self.steps) >= self.warmup:
            with torch.no_grad():
                r = (std / self.running_std).clamp(1.0 / R_MAX, R_MAX)
                d = ((mean - self.running_mean) / self.running_std).clamp(-D_MAX, D_MAX)
            x_hat = x_hat * r + d
        with torch.no_grad():
            self.running_mean.lerp_(mean.detach(), self.momentum)
            self.running_std.lerp_(std.detach(), self.momentum)
            self.steps += 1
        return x_hat * self.weight + self.bias


class BRNCritic(nn.Module):
    """Q-net: ``[Linear -> BatchRenorm1d -> activation] x len(hid_layers) -> Linear``.

    Forward: observations (B, *O) and optional extra inputs (B, E) (the action) -> (B, out_dim).
    """

    def __init__(self, in_dim: int, out_dim: int, hid_layers: list[int], activation: str) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for width in hid_layers:
            layers += [nn.Linear(in_dim, width), BatchRenorm1d(width), ACTIVATIONS[activation]()]
            in_dim = width
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(in_dim, out_dim)

    def forward(self, x: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor:
        h = torch.cat([x.reshape(len(x), -1).float(), *(e.reshape(len(e), -1).float() for e in extra)], dim=-1)
        return self.head(self.body(h))


class CrossQ(SoftActorCritic):
    """SAC without target critics, with batch-renormalized critics and a joint (s, a) / (s', a') forward."""

    def init_nets(self) -> None:
        """SAC's nets with the critics replaced by ``BRNCritic`` and no target copies.

        Raises:
            ValueError: an action space other than Discrete and 1-D Box.
        """
        super().init_nets()
        ns = self.net_spec
        act_dim = 0 if self.discrete else self.action_space.shape[0]
        q_out = int(self.action_space.n) if self.discrete else 1
        for k in ("q1_net", "q2_net"):
            del self.nets[f"target_{k}"]
            self.nets[k] = BRNCritic(obs_in_dim(self.obs_space) + act_dim, q_out, list(ns.hid_layers),
                                     ns.hid_layers_activation).to(self.device)
            self.add_optim(k, self.nets[k].parameters(), ns.critic_optim_spec or ns.optim_spec)

    def critic_preds(self, batch: dict[str, torch.Tensor],
                     alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Any, torch.Tensor]:
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
            y = batch["reward"] + self.algo.gamma * (1.0 - batch["terminated"]) * self.soft_value(*q_next, next_logp,
                                                                                                  alpha)
        if not self.discrete:
            return q_cur[0], q_cur[1], None, y
        q1, q2 = (q.gather(-1, act.unsqueeze(-1)).squeeze(-1) for q in q_cur)
        return q1, q2, (q_cur[0].detach(), q_cur[1].detach()), y

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
