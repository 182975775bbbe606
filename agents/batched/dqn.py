"""K seeds of the lab's DQN family (``DQN``, ``DoubleDQN``, ``VanillaDQN``) trained as one batched program.

The group is a ``SeedBatch`` (``agents.batched.algorithm``) whose members keep their own replays
(``members_own_memory``): the group's memory (``SeedReplays``) hands seed k its N columns of each vector step, and
each update draws seed k's samples from seed k's replay with seed k's own ``np.random.Generator`` (``sample_batches``
/ ``sample_batch`` of the member, the same draws its separate session makes), so per-seed sampling is independent
across seeds and equal to the seed's alone. Per vector step: one forward of the online ``SeedMLP`` for the K x N
observations, each seed's epsilon-greedy or Boltzmann actions drawn from its own generators at its own
``explore_var`` of the frame. Per update (``ReplayCadence``: ``training_start_step``, ``training_frequency``,
``training_iter`` x ``training_batch_iter``, as the lab's DQN; the seeds' replays fill alike, so they train at the
same steps): the K seeds' samples stacked (K, B, ...), their TD targets from the stacked target (or online) net by
the lab's own ``q_target`` (one forward for a whole group of samples where the lab's DQN does it), one forward
and one backward of the stacked online net per gradient step, each seed's loss its own mean (``SeedMeanLoss``;
``PrioritizedReplay``: its importance-weighted mean, and each seed's sampled rows' priorities set from its own TD
errors before its next sample), its gradients clipped to its own norm, its own slice of the optimizer state; then
the target updates due (replace or polyak) on the stacks, which update each seed's target from its own net only.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import numpy as np
import torch

from agents import policy
from agents.algorithms import LossStats
from agents.algorithms.double_dqn import DoubleDQN
from agents.algorithms.dqn import DQN, GATHER_BYTES, batch_tensors
from agents.algorithms.vanilla_dqn import VanillaDQN
from agents.batched.algorithm import SeedBatch, SeedMeanLoss
from agents.batched.memory import SeedReplays
from agents.batched.nets import SeedMLP
from agents.memory import PrioritizedReplay
from envs.clock import Clock


class SeedRows:
    """A ``SeedMLP`` called on rows ordered seed-major, (K*M, *O) -> (K*M, out): how the lab's ``DQN.q_target``
    passes a batch with leading dims (K, ...) flattened."""

    def __init__(self, net: SeedMLP, k: int) -> None:
        self.net, self.k = net, k

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Rows (K*M, *O), seed k's M rows the k-th block -> (K*M, out)."""
        return self.net(x.reshape(self.k, -1, *x.shape[1:])).reshape(x.shape[0], -1)


def stack_seeds(algo: DQN, parts: Sequence[dict[str, np.ndarray]]) -> dict[str, Any]:
    """K seeds' raw replay samples (``Replay.sample`` / ``sample_many`` arrays) as one batch of tensors with a
    leading seed dim (``batch_tensors``: one conversion per field for the K seeds); a ``PrioritizedReplay``
    sample's ``idx`` stays a numpy array (K, B)."""
    return batch_tensors(algo, {key: np.stack([p[key] for p in parts]) for key in parts[0]})


class SeedDQN(SeedBatch):
    """The seed-batched DQN family, mixed in before the lab class (``BatchedDQN(SeedDQN, DQN)``); see the module
    docstring."""

    policy_net = "net"
    members_own_memory = True

    def init_memory(self) -> SeedReplays:  # type: ignore[override]
        """The members' replays as the group's memory (no replay of the group's own)."""
        return SeedReplays([m.memory for m in self.members], self.n)

    def _stack_members(self) -> None:
        """``SeedBatch._stack_members``, then the per-seed loss and a target stack without gradients."""
        super()._stack_members()
        self.seed_loss = SeedMeanLoss(self.loss_fn)
        if "target_net" in self.nets:
            self.nets["target_net"].requires_grad_(False)

    @property
    def target_net(self) -> SeedRows:  # type: ignore[override]
        """The stacked net that evaluates bootstrap targets (``DQN.target_net``), taking seed-major rows."""
        return SeedRows(self.nets["target_net" if self.use_target_net else "net"], self.k)

    @torch.no_grad()
    def act(self, obs_NO: np.ndarray, clock: Clock, deterministic: bool = False) -> np.ndarray:
        """Actions (K*N,) for the group's observations (K*N, *O): one forward, then seed k's N drawn as ``DQN.act``
        of its session draws them, with member k's ``explore_var``, ``rng`` and ``gen``: ``policy.q_act``, or for
        epsilon-greedy ``policy.epsilon_greedy``'s draws (2N numbers of the seed's ``rng``) on the greedy actions
        of all K taken at once."""
        q = self.nets["net"](self.obs_tensor(obs_NO).reshape(self.k, self.n, *self.obs_space.shape))
        frame, members = clock.frame, self.members
        if deterministic or self.algo_spec.action_policy != "epsilon_greedy":
            return np.concatenate([policy.q_act(q[k], self.algo_spec.action_policy, m.explore_var(frame), m.rng,
                                                m.gen, deterministic) for k, m in enumerate(members)])
        greedy, (n, a) = q.argmax(dim=-1).cpu().numpy(), q.shape[1:]
        return np.concatenate([np.where(m.rng.random(n) < m.explore_var(frame), m.rng.integers(0, a, size=n),
                                        greedy[k]) for k, m in enumerate(members)])

    def batches(self, clock: Clock, n: int) -> Iterator[tuple[dict[str, Any], torch.Tensor]]:
        """The update's ``n`` samples of every seed, stacked (K, B, ...), with their TD targets (K, B): each seed
        drawn from its own replay with its own RNG, as ``DQN.batches`` of its session draws them (in groups for
        uniform replays, one target forward per group with ``fixed_targets``; one at a time for prioritized)."""
        members = self.members
        if isinstance(members[0].memory, PrioritizedReplay):
            for _ in range(n):
                batch = stack_seeds(self, [m.memory.sample(m.rng, clock.frame) for m in members])
                yield batch, self.q_target(batch)
            return
        memory = members[0].memory  # a group of G samples draws each seed's G x B rows at once: the same stream
        size = max(1, min(n, GATHER_BYTES // max(1, 2 * memory.batch_size * memory.obs_nbytes * self.k)))
        for start in range(0, n, size):
            group = stack_seeds(self, [m.memory.sample_many(m.rng, min(size, n - start)) for m in members])
            targets = self.q_target(group) if self.fixed_targets else None
            for i in range(group["reward"].shape[1]):
                batch = {key: v[:, i] for key, v in group.items()}
                yield batch, targets[:, i] if targets is not None else self.q_target(batch)

    def update(self, clock: Clock) -> list[LossStats]:  # type: ignore[override]
        """One training round of every seed (``DQN.update`` per seed, see the module docstring); per seed its
        ``LossStats`` (loss, grad norm, ``q_mean`` and ``td_error``: means over the round's gradient steps)."""
        self.last_train_frame = clock.frame
        net, batch_iter = self.nets["net"], self.algo_spec.training_batch_iter
        losses, grad_norms, qs, targets = [], [], [], []
        for batch, target in self.batches(clock, self.algo_spec.training_iter):
            for _ in range(batch_iter):
                q = net(batch["obs"]).gather(-1, batch["act"].unsqueeze(-1)).squeeze(-1)  # (K, B)
                if "weight" in batch:
                    loss = (batch["weight"] * self.elem_loss_fn(q, target)).mean(-1)
                    td = (target - q.detach()).cpu().numpy()
                    for m, idx, td_k in zip(self.members, batch["idx"], td):  # each seed's rows, its TD errors
                        m.memory.update_priorities(idx, td_k)
                else:
                    loss = self.seed_loss(q, target)
                grad_norms.append(self.optim_step_tensor(loss.sum(), ("net",), clock))
                losses.append(loss.detach())
                qs.append(q.detach())
                targets.append(target)
        self.update_target(clock)
        for m in self.members:
            m.lr_scheds["net"].step_to(clock.frame)
        q, target = torch.stack(qs, 1), torch.stack(targets, 1)  # (K, steps, B)
        q_mean = q.mean(-1).mean(-1).tolist()
        td_error = (target - q).abs().mean(-1).mean(-1).tolist()
        loss_k = torch.stack(losses, 1).mean(-1).tolist()
        norm_k = torch.stack(grad_norms, 1).double().mean(-1).tolist()
        return [LossStats(loss_k[k], float("nan"), norm_k[k], {"q_mean": q_mean[k], "td_error": td_error[k]})
                for k in range(self.k)]


class BatchedDQN(SeedDQN, DQN):
    """K seeds of the lab's ``DQN``; see the module docstring."""


class BatchedDoubleDQN(SeedDQN, DoubleDQN):
    """K seeds of the lab's ``DoubleDQN`` (its ``q_target`` on the stacked nets); see the module docstring."""


class BatchedVanillaDQN(SeedDQN, VanillaDQN):
    """K seeds of the lab's ``VanillaDQN`` (no target net); see the module docstring."""
