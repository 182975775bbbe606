"""Algorithm registry: the spec's ``agent.algorithm.name`` -> class (checked by ``orchestrator.spec``)."""

from agents.algorithms.actor_critic import ActorCritic
from agents.algorithms.base import AgentSpec, Algorithm, AlgorithmSpec, LossStats
from agents.algorithms.crossq import CrossQ
from agents.algorithms.double_dqn import DoubleDQN
from agents.algorithms.dqn import DQN
from agents.algorithms.ppo import PPO
from agents.algorithms.ppo_sil import PPOSIL
from agents.algorithms.random import Random
from agents.algorithms.reinforce import Reinforce
from agents.algorithms.sac import SoftActorCritic
from agents.algorithms.sarsa import SARSA
from agents.algorithms.sil import SIL
from agents.algorithms.vanilla_dqn import VanillaDQN

ALGORITHMS: dict[str, type[Algorithm]] = {
    "REINFORCE": Reinforce,
    "Reinforce": Reinforce,
    "DQN": DQN,
    "VanillaDQN": VanillaDQN,
    "DoubleDQN": DoubleDQN,
    "PPO": PPO,
    "ActorCritic": ActorCritic,
    "Random": Random,
    "SARSA": SARSA,
    "SoftActorCritic": SoftActorCritic,
    "CrossQ": CrossQ,
    "SIL": SIL,
    "PPOSIL": PPOSIL,
}

__all__ = ["ALGORITHMS", "AgentSpec", "Algorithm", "AlgorithmSpec", "LossStats"]
