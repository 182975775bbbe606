"""Memories: store transitions and hand them out; they never decide when to train.

``MEMORIES`` maps the spec's ``agent.memory.name`` to a class. All memories take vector-env
transitions, one row of N sub-envs per ``add``:

    obs_NO (N, *O) in the observation space's dtype (uint8 pixels on Atari), act_NA (N, *A), reward_N (N,),
    next_obs_NO (N, *O) (the true next
    observation, also on done rows), terminated_N (N,) bool, truncated_N (N,) bool.

Each exposes ``state_dict()`` / ``load_state_dict()`` of plain numpy arrays and ints, so a
checkpoint can store it (``memory.checkpoint: true``), and ``cut_episodes()``, called when the env
was reset under a restored memory (a checkpoint without env state) so that no stored episode runs
on into the new one.

One module per family: ``spec`` (``MemorySpec``, field names, storage dtype), ``replay`` (``Replay``),
``frames`` (``FrameOnceReplay``, ``FrameStackReplay``), ``prioritized`` (``SumTree``, ``PrioritizedReplay``,
``PrioritizedFrameStackReplay``), ``onpolicy`` (the on-policy memories), ``sil`` (``SILReplay``) and
``factory`` (``make_replay``, ``transition_bytes``).
"""

from agents.memory.factory import make_replay, transition_bytes
from agents.memory.frames import FrameOnceReplay, FrameStackReplay
from agents.memory.onpolicy import (
    EPISODIC,
    OnPolicyBatchReplay,
    OnPolicyCrossEntropy,
    OnPolicyReplay,
    episodic_memory,
)
from agents.memory.prioritized import PrioritizedFrameStackReplay, PrioritizedReplay, SumTree
from agents.memory.replay import Replay
from agents.memory.sil import SILReplay
from agents.memory.spec import FIELDS, ROLLOUT_FIELDS, Batch, MemorySpec, storage_dtype

__all__ = ["EPISODIC", "FIELDS", "MEMORIES", "ROLLOUT_FIELDS", "Batch", "FrameOnceReplay", "FrameStackReplay",
           "MemorySpec", "OnPolicyBatchReplay", "OnPolicyCrossEntropy", "OnPolicyReplay",
           "PrioritizedFrameStackReplay", "PrioritizedReplay", "Replay", "SILReplay", "SumTree", "episodic_memory",
           "make_replay", "storage_dtype", "transition_bytes"]

MEMORIES = {"Replay": Replay, "PrioritizedReplay": PrioritizedReplay, "OnPolicyReplay": OnPolicyReplay,
            "OnPolicyCrossEntropy": OnPolicyCrossEntropy,
            "OnPolicyBatchReplay": OnPolicyBatchReplay}
