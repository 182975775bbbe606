"""DQN (Mnih et al. 2015, "Human-level control through deep reinforcement learning").

Q-learning with a replay buffer and a target net updated every ``net.update_frequency`` frames by
replacement or polyak averaging (``net.polyak_coef`` = weight kept of the old target, SLM-Lab
semantics). Acting: epsilon-greedy or Boltzmann with ``explore_var_spec`` as epsilon/temperature.
Training (``ReplayCadence``, SLM-Lab v5.3's cadence): once the replay holds ``training_start_step``
transitions, a vector step that crosses a multiple of ``training_frequency`` frames runs one round of
``training_iter`` samples x ``training_batch_iter`` gradient steps. With ``training_frequency >= num_envs``
that is ``training_iter * training_batch_iter / training_frequency`` gradient steps per frame whatever
``num_envs`` is (with N = 3 and frequency 4 a step crosses a multiple 3 times in 4); with
``training_frequency < num_envs`` it is one round per vector step, as SLM-Lab trains at most once per step
(its CartPole specs: frequency 1, N = 4, 2 x 2 steps per round = one gradient step per frame). The target
net gets one update per multiple of ``net.update_frequency`` frames crossed (k polyak updates in one
closed-form lerp; a replace is the same for any k). Frames that pass while the replay holds fewer than
``training_start_step`` transitions earn nothing, so a resumed session that refills its replay makes no
gradient step until the buffer is full again, and then makes no catch-up burst.

Memory: ``Replay``, or ``PrioritizedReplay`` (Schaul et al. 2016): each sample then carries importance
weights ``w`` (B,), the loss is ``mean(w * L(Q, target))`` elementwise, and each gradient step sets the
sampled rows' priorities from its |TD error|.

train_df columns of its own (means over the update's gradient steps): ``q_mean`` (mean Q(s, a) of the
sampled actions) and ``td_error`` (mean |Q target - Q(s, a)|).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator

import numpy as np
import torch

from agents import policy
from agents.algorithms.base import Algorithm, AlgorithmSpec, LossStats, ReplayCadence
from agents.memory import PrioritizedReplay, Replay, make_replay
from agents.nets import make_loss, polyak_update, target_updates_due
from agents.schedules import SCHEDULE_PERTURBABLE
from envs.clock import Clock


@dataclass(frozen=True)
class DQNSpec(AlgorithmSpec):
    """DQN keys (SLM-Lab names).

    Fields:
        action_policy: ``epsilon_greedy`` or ``boltzmann`` on the Q-values.
        explore_var_spec: schedule of epsilon / temperature (frames), see ``VarSchedule``.
        training_frequency: frames between training rounds (at most one round per vector step).
        training_start_step: frames before the first training round.
        training_iter: replay batches per training round.
        training_batch_iter: gradient steps per replay batch.
    """

    action_policy: str = field(default="epsilon_greedy",
                               metadata={"choices": ("epsilon_greedy", "boltzmann")})
    explore_var_spec: dict = field(default_factory=lambda: {
        "name": "linear_decay", "start_val": 1.0, "end_val": 0.05, "start_step": 0, "end_step": 10000},
        metadata={"perturbable": SCHEDULE_PERTURBABLE})
    training_start_step: int = field(default=32, metadata={"gt": 0})
    training_iter: int = field(default=1, metadata={"gt": 0, "perturbable": True})
    training_batch_iter: int = field(default=1, metadata={"gt": 0})


GATHER_BYTES = 16 * 2**20  # at most this many bytes of observations per ``sample_batches`` gather


def batch_tensors(algo: Algorithm, raw: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """Replay arrays as tensors on ``algo.device``: act int64 for Discrete (else float32), obs and next_obs in
    ``algo.obs_dtype`` (uint8 frames for conv nets), the rest float32;
    ``idx`` (a ``PrioritizedReplay`` sample's rows) stays a numpy array (for ``update_priorities``)."""
    act_dtype = torch.int64 if algo.discrete else torch.float32
    dtypes = {"act": act_dtype, "obs": algo.obs_dtype, "next_obs": algo.obs_dtype}
    batch = {k: algo.to_tensor(v, dtypes.get(k, torch.float32)) for k, v in raw.items() if k != "idx"}
    if "idx" in raw:
        batch["idx"] = raw["idx"]
    return batch


def sample_batch(algo: Algorithm, clock: Clock) -> dict[str, torch.Tensor]:
    """One replay sample as tensors (``batch_tensors``); a ``PrioritizedReplay`` sample (beta at
    ``clock.frame``) adds ``weight`` (B,) and ``idx`` (B,)."""
    memory = algo.memory
    raw = memory.sample(algo.rng, clock.frame) if isinstance(memory, PrioritizedReplay) else memory.sample(algo.rng)
    return batch_tensors(algo, raw)


def sample_batches(algo: Algorithm, n: int) -> Iterator[dict[str, torch.Tensor]]:
    """``n`` uniform replay samples, the same as ``n`` ``sample_batch`` calls (same RNG draws, same rows), drawn
    and converted in groups of up to ``GATHER_BYTES`` of observations: each yielded value is a dict of
    tensors with leading dims (G, B), G <= n, the groups' G summing to n."""
    memory = algo.memory
    group = max(1, min(n, GATHER_BYTES // max(1, 2 * memory.batch_size * memory.obs_nbytes)))
    for start in range(0, n, group):
        yield batch_tensors(algo, memory.sample_many(algo.rng, min(group, n - start)))


class DQN(ReplayCadence, Algorithm):
    """Deep Q-network; see module docstring. Nets: ``net`` (online) and ``target_net``. Cadence
    (``train_ready``): ``ReplayCadence``."""

    spec_cls = DQNSpec
    memory_names = ("Replay", "PrioritizedReplay")
    metric_names = ("q_mean", "td_error")
    use_target_net: ClassVar[bool] = True  # False: bootstrap from the online net (VanillaDQN)

    def init_nets(self) -> None:
        """Online Q-net (B, *O) -> (B, A) Q-values, a frozen target copy (if ``use_target_net``), one optimizer."""
        if not self.discrete:
            raise ValueError(f"{type(self).__name__} needs a Discrete action space, got {self.action_space}")
        self.nets["net"] = self.make_net(int(self.action_space.n))
        if self.use_target_net:
            self.nets["target_net"] = copy.deepcopy(self.nets["net"]).requires_grad_(False)
        self.add_optim("net", self.nets["net"].parameters(), self.net_spec.optim_spec)
        self.loss_fn = make_loss(self.net_spec.loss_spec)
        self.elem_loss_fn = make_loss({**self.net_spec.loss_spec, "reduction": "none"})  # PER: weighted per sample
        self.last_train_frame = 0
        self.last_target_frame = 0

    def init_memory(self) -> Replay:
        """A ``Replay`` or ``PrioritizedReplay`` (in the layout ``make_replay`` picks: each frame once on
        Atari) of ``memory.max_size`` transitions."""
        return make_replay(self.spec.memory, self.obs_space, (), np.int64, num_envs=self.num_envs)

    @torch.no_grad()
    def act(self, obs_NO: np.ndarray, clock: Clock, deterministic: bool = False) -> np.ndarray:
        """Epsilon-greedy or Boltzmann actions (N,) from Q-values; argmax when ``deterministic``."""
        q = self.nets["net"](self.obs_tensor(obs_NO))
        return policy.q_act(q, self.algo_spec.action_policy, self.explore_var(clock.frame), self.rng, self.gen,
                            deterministic)

    @torch.no_grad()
    def q_target(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """``r + gamma * (1 - terminated) * max_a Q_target(s', a)``, (*S,) for a batch of leading dims S (B, or
        (G, B) for a group of samples) (Q_target = Q without a target net)."""
        next_obs = batch["next_obs"]
        lead = batch["reward"].shape
        next_q = self.target_net(next_obs.reshape(-1, *next_obs.shape[len(lead):])).max(dim=-1).values
        return batch["reward"] + self.algo_spec.gamma * (1.0 - batch["terminated"]) * next_q.reshape(lead)

    @property
    def fixed_targets(self) -> bool:
        """True when ``q_target`` reads only the target net, which no gradient step of an update changes: the
        targets of a whole group of samples are then computed in one forward (the same values, row by row)."""
        return self.use_target_net and type(self).q_target is DQN.q_target

    def batches(self, clock: Clock, n: int) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        """The update's ``n`` replay samples with their TD targets (B,), in order. Uniform replays draw them in
        groups (``sample_batches``: one gather, and with ``fixed_targets`` one target forward, per group);
        a ``PrioritizedReplay`` draws each after the previous step set its priorities."""
        if isinstance(self.memory, PrioritizedReplay):
            for _ in range(n):
                batch = sample_batch(self, clock)
                yield batch, self.q_target(batch)
            return
        for group in sample_batches(self, n):
            targets = self.q_target(group) if self.fixed_targets else None
            for i in range(len(group["reward"])):
                batch = {k: v[i] for k, v in group.items()}
                yield batch, targets[i] if targets is not None else self.q_target(batch)

    def update(self, clock: Clock) -> LossStats:
        """One training round (``ReplayCadence``) of replay-sampled TD regression steps, then the target-net
        updates due.

        Runs ``training_iter`` replay samples (``batches``), each with
        ``training_batch_iter`` gradient steps (one ``opt_step`` each), then ``k`` target updates where ``k`` is
        the number of multiples of ``net.update_frequency`` frames crossed since the last one. The metrics are
        kept as tensors and read once at the end.
        """
        self.last_train_frame = clock.frame
        net, loss_fn, batch_iter = self.nets["net"], self.loss_fn, self.algo_spec.training_batch_iter
        losses, grad_norms, qs, targets = [], [], [], []
        for batch, target in self.batches(clock, self.algo_spec.training_iter):
            for _ in range(batch_iter):
                q = net(batch["obs"]).gather(-1, batch["act"].unsqueeze(-1)).squeeze(-1)
                if "weight" in batch:
                    loss = (batch["weight"] * self.elem_loss_fn(q, target)).mean()
                    self.memory.update_priorities(batch["idx"], (target - q.detach()).cpu().numpy())
                else:
                    loss = loss_fn(q, target)
                grad_norms.append(self.optim_step(loss, ("net",), clock))
                losses.append(loss.detach())
                qs.append(q.detach())
                targets.append(target)
        self.update_target(clock)
        q, target = torch.stack(qs), torch.stack(targets)  # (steps, B)
        metrics = {"q_mean": float(q.mean(dim=1).mean()), "td_error": float((target - q).abs().mean(dim=1).mean())}
        return LossStats(float(torch.stack(losses).mean()), float("nan"), float(np.mean(grad_norms)), metrics)

    @property
    def target_net(self) -> torch.nn.Module:
        """The net that evaluates bootstrap targets: ``target_net``, or ``net`` when ``use_target_net`` is off."""
        return self.nets["target_net" if self.use_target_net else "net"]

    def update_target(self, clock: Clock) -> int:
        """Apply the target-net updates due at ``clock.frame``; returns how many (k).

        k = multiples of ``net.update_frequency`` frames crossed since the last target update. A
        replace copies the online net; k polyak updates (old-target weight ``polyak_coef`` each) are
        one lerp with coefficient ``1 - polyak_coef ** k``.
        """
        k = target_updates_due(clock.frame, self.last_target_frame, self.net_spec.update_frequency)
        if k > 0 and self.use_target_net:
            self.last_target_frame = clock.frame
            coef = 1.0 if self.net_spec.update_type == "replace" else 1.0 - self.net_spec.polyak_coef ** k
            polyak_update(self.nets["net"], self.nets["target_net"], coef)
        return k

    def extra_state(self) -> dict[str, Any]:
        """Frames of the last update and of the last target-net update."""
        return {"last_train_frame": self.last_train_frame, "last_target_frame": self.last_target_frame}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Restore ``extra_state``."""
        self.last_train_frame = int(state["last_train_frame"])
        self.last_target_frame = int(state["last_target_frame"])
