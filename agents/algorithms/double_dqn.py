"""Double DQN (van Hasselt, Guez & Silver 2016, arXiv:1509.06461).

Same as DQN except the bootstrap action is chosen by the online net and evaluated by the target
net, which removes max-operator overestimation.
"""

from __future__ import annotations

import torch

from agents.algorithms.dqn import DQN


class DoubleDQN(DQN):
    """DQN with the double-Q target ``r + gamma * (1 - term) * Q_target(s', argmax_a Q(s', a))``."""

    @torch.no_grad()
    def q_target(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Double-Q bootstrap target (B,): online net picks, target net evaluates."""
        next_act = self.nets["net"](batch["next_obs"]).argmax(dim=-1, keepdim=True)
        next_q = self.nets["target_net"](batch["next_obs"]).gather(-1, next_act).squeeze(-1)
        return batch["reward"] + self.algo_spec.gamma * (1.0 - batch["terminated"]) * next_q
