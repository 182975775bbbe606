"""Seed-batched training: the K seeds (sessions) of one spec as one program with a leading seed dimension.

``nets`` (``SeedMLP``, ``seed_linear``: stacked weights (K, out, in), one ``torch.baddbmm`` per layer; ``SeedNet``:
conv and shared nets, ``seed_net``), ``optim``
(per-seed gradient clipping, per-seed slices of an elementwise optimizer's state), ``memory`` (per-seed parts of a
group rollout; the members' own replays), ``algorithm`` (``SeedBatch``, ``BatchedActorCritic``, ``BatchedPPO``: K
lab algorithms in lockstep, the lab's own loss code on per-seed tensors), ``reinforce`` (``BatchedReinforce``),
``dqn`` (``BatchedDQN``, ``BatchedDoubleDQN``, ``BatchedVanillaDQN``: per-seed replays and sampling), ``sac``
(``BatchedSAC``: stacked actor, twin critics and temperatures) and ``registry`` (``batched_algorithm``). Each seed
keeps the state of its own session (nets, optimizer, RNG streams, replay), in the format of a separate session's
algorithm.
"""

from agents.batched.algorithm import (
    BATCHED_ALGORITHMS,
    BatchedActorCritic,
    BatchedPPO,
    SeedBatch,
    batch_problem,
)
from agents.batched.dqn import BatchedDoubleDQN, BatchedDQN, BatchedVanillaDQN
from agents.batched.nets import SeedMLP, SeedNet, seed_linear, seed_net
from agents.batched.optim import clip_grads_per_seed, seed_grad_norms
from agents.batched.registry import batched_algorithm
from agents.batched.reinforce import BatchedReinforce
from agents.batched.sac import BatchedSAC

__all__ = ["BATCHED_ALGORITHMS", "BatchedActorCritic", "BatchedDQN", "BatchedDoubleDQN", "BatchedPPO",
           "BatchedReinforce", "BatchedSAC", "BatchedVanillaDQN", "SeedBatch", "SeedMLP", "SeedNet", "batch_problem",
           "batched_algorithm", "clip_grads_per_seed", "seed_grad_norms", "seed_linear", "seed_net"]
