"""The seed-batched class of each algorithm that runs batched (``batched_algorithm``)."""

from __future__ import annotations

from agents.batched.algorithm import BATCHED_ALGORITHMS, BatchedActorCritic, BatchedPPO, SeedBatch
from agents.batched.dqn import BatchedDoubleDQN, BatchedDQN, BatchedVanillaDQN
from agents.batched.reinforce import BatchedReinforce
from agents.batched.sac import BatchedSAC

BATCHED_CLASSES: dict[str, type[SeedBatch]] = {
    "ActorCritic": BatchedActorCritic, "PPO": BatchedPPO, "REINFORCE": BatchedReinforce,
    "Reinforce": BatchedReinforce, "DQN": BatchedDQN, "DoubleDQN": BatchedDoubleDQN,
    "VanillaDQN": BatchedVanillaDQN, "SoftActorCritic": BatchedSAC}
assert tuple(BATCHED_CLASSES) == BATCHED_ALGORITHMS


def batched_algorithm(name: str) -> type[SeedBatch]:
    """The seed-batched class of ``agent.algorithm.name`` (``BATCHED_ALGORITHMS``).

    Raises:
        ValueError: an algorithm that does not run batched (names it and the ones that do).
    """
    if name not in BATCHED_CLASSES:
        raise ValueError(f"agent.algorithm.name '{name}' does not run with seeds batched; batched algorithms: "
                         f"{list(BATCHED_CLASSES)}")
    return BATCHED_CLASSES[name]
