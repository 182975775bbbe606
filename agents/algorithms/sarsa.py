"""SARSA with a Q-network (Rummery & Niranjan 1994, "On-line Q-learning using connectionist systems";
Sutton & Barto 2018, section 6.4): on-policy TD control.

Acting: epsilon-greedy or Boltzmann on Q-values with ``explore_var_spec`` as epsilon / temperature
(frames). Learning: per rollout one gradient step (one ``opt_step``) of ``net.loss_spec`` between
``Q(s_t, a_t)`` and the no-grad target

    y_t = r_t + gamma * (1 - terminated_t) * Q(s'_t, a_{t+1})

where ``a_{t+1}`` is the action the policy actually took in ``s'_t``. Rollouts: ``OnPolicyBatchReplay``
of ``training_frequency`` vector steps (T x N frames) or ``OnPolicyReplay`` of ``training_frequency``
completed episodes. With ``OnPolicyBatchReplay`` the next action of a rollout's last step is only known
one step later, so that step is held back (``pending``, part of the saved state) and trained on as the
first step of the next rollout: every transition is used once, with its true next action (SLM-Lab
instead pads it with action 0). Where an episode was truncated (time limit), ``a_{t+1}`` was never
taken in ``s'_t``; the target then bootstraps with the greedy ``max_a Q(s'_t, a)``.

train_df columns of its own: ``q_mean`` (mean Q(s_t, a_t)) and ``td_error`` (mean |y_t - Q(s_t, a_t)|).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from agents import policy
from agents.algorithms.base import Algorithm, AlgorithmSpec, LossStats
from agents.memory import EPISODIC, OnPolicyBatchReplay, OnPolicyReplay, episodic_memory
from agents.nets import make_loss
from agents.schedules import SCHEDULE_PERTURBABLE
from envs.clock import Clock


@dataclass(frozen=True)
class SARSASpec(AlgorithmSpec):
    """SARSA keys (SLM-Lab names).

    Fields:
        action_policy: ``epsilon_greedy`` or ``boltzmann`` on the Q-values.
        explore_var_spec: schedule of epsilon / temperature (frames), see ``VarSchedule``.
        training_frequency: vector steps (``OnPolicyBatchReplay``) or completed episodes (``OnPolicyReplay``)
            per update.
    """

    action_policy: str = field(default="epsilon_greedy", metadata={"choices": ("epsilon_greedy", "boltzmann")})
    explore_var_spec: dict = field(default_factory=lambda: {
        "name": "linear_decay", "start_val": 1.0, "end_val": 0.05, "start_step": 0, "end_step": 10000},
        metadata={"perturbable": SCHEDULE_PERTURBABLE})


class SARSA(Algorithm):
    """On-policy TD control with a Q-net; see module docstring. Net: ``net`` (B, *O) -> (B, A).

    Raises:
        ValueError: a non-Discrete action space.
    """

    spec_cls = SARSASpec
    memory_names = ("OnPolicyBatchReplay", "OnPolicyReplay", "OnPolicyCrossEntropy")
    metric_names = ("q_mean", "td_error")

    def init_nets(self) -> None:
        """Q-net, its optimizer and the regression loss."""
        if not self.discrete:
            raise ValueError(f"SARSA needs a Discrete action space, got {self.action_space}")
        self.nets["net"] = self.make_net(int(self.action_space.n))
        self.add_optim("net", self.nets["net"].parameters(), self.net_spec.optim_spec)
        self.loss_fn = make_loss(self.net_spec.loss_spec)
        self.pending: dict[str, np.ndarray] = {}  # the held-back last step (1, N, ...) of the previous rollout

    def init_memory(self) -> OnPolicyBatchReplay | OnPolicyReplay:
        """``training_frequency`` vector steps, or episodes with ``OnPolicyReplay``."""
        if self.spec.memory.name in EPISODIC:
            return episodic_memory(self.spec.memory, self.algo_spec.training_frequency, self.num_envs)
        return OnPolicyBatchReplay(self.algo_spec.training_frequency)

    @torch.no_grad()
    def act(self, obs_NO: np.ndarray, clock: Clock, deterministic: bool = False) -> np.ndarray:
        """Epsilon-greedy or Boltzmann actions (N,) from Q-values; argmax when ``deterministic``."""
        q = self.nets["net"](self.obs_tensor(obs_NO))
        return policy.q_act(q, self.algo_spec.action_policy, self.explore_var(clock.frame), self.rng, self.gen,
                            deterministic)

    def train_ready(self, clock: Clock) -> bool:
        """A full rollout (or ``training_frequency`` episodes) is stored."""
        return self.memory.ready()

    def rollout(self) -> dict[str, np.ndarray]:
        """The stored rollout, time-major (L, N, ...), with ``next_act`` (L, N) and ``has_next`` (L, N).

        ``OnPolicyBatchReplay``: the pending step, then the new T steps; the last of them becomes the
        new pending step (L = T on the first update, T after). ``OnPolicyReplay``: whole episodes (N = 1).
        """
        batch = {k: v for k, v in self.memory.pop().items() if k != "next_shared"}  # Q(s') is computed anyway
        if batch["reward"].ndim == 1:  # OnPolicyReplay: concatenated episodes, the last step ends one
            batch = {k: v[:, None] for k, v in batch.items()}
            following = np.zeros_like(batch["act"][:1])  # after an episode's end: never used
        else:
            full = {k: np.concatenate([self.pending[k], v]) if self.pending else v for k, v in batch.items()}
            self.pending = {k: v[-1:] for k, v in full.items()}
            batch = {k: v[:-1] for k, v in full.items()}
            following = self.pending["act"]
        next_act = np.concatenate([batch["act"][1:], following])[:len(batch["act"])]
        done = np.logical_or(batch["terminated"], batch["truncated"])
        return {**batch, "next_act": next_act, "has_next": ~done}

    @torch.no_grad()
    def q_target(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """``r + gamma * (1 - terminated) * Q(s', a')`` (B,), a' the next action taken, or greedy where the
        episode ended (truncation)."""
        next_q = self.nets["net"](batch["next_obs"])
        taken = next_q.gather(-1, batch["next_act"].unsqueeze(-1)).squeeze(-1)
        next_val = torch.where(batch["has_next"], taken, next_q.max(dim=-1).values)
        return batch["reward"] + self.algo_spec.gamma * (1.0 - batch["terminated"]) * next_val

    def update(self, clock: Clock) -> LossStats:
        """One TD regression step on the rollout's B = L*N transitions (no step if L = 0)."""
        data = self.rollout()
        if len(data["reward"]) == 0:  # a first rollout of one step: it is all pending
            return LossStats()
        dtypes = {"act": torch.int64, "next_act": torch.int64, "has_next": torch.bool, "obs": self.obs_dtype,
                  "next_obs": self.obs_dtype}
        batch = {k: self.to_tensor(v, dtypes.get(k, torch.float32)).reshape(-1, *v.shape[2:]) for k, v in data.items()}
        target = self.q_target(batch)
        q = self.nets["net"](batch["obs"]).gather(-1, batch["act"].unsqueeze(-1)).squeeze(-1)
        loss = self.loss_fn(q, target)
        grad_norm = self.optim_step(loss, ("net",), clock)
        q = q.detach()
        return LossStats(float(loss.detach()), float("nan"), grad_norm,
                         {"q_mean": float(q.mean()), "td_error": float((target - q).abs().mean())})

    def extra_state(self) -> dict[str, Any]:
        """The held-back step (arrays (1, N, ...)); empty before the first update."""
        return {"pending": dict(self.pending)}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Restore ``extra_state`` (tensors from a checkpoint become numpy arrays again)."""
        self.pending = {k: np.asarray(v.numpy() if isinstance(v, torch.Tensor) else v)
                        for k, v in state["pending"].items()}
