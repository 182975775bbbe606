"""The ``agent.memory`` spec section (``MemorySpec``), the transition field names and the storage dtype of
observations, shared by every memory."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

Batch = dict[str, np.ndarray]


@dataclass(frozen=True)
class MemorySpec:
    """The spec ``agent.memory`` section (SLM-Lab key names).

    Fields:
        name: key of ``MEMORIES`` (default: the algorithm's first memory).
        batch_size: transitions per replay sample.
        max_size: replay capacity in transitions.
        use_cer: combined experience replay (the newest transition joins every sample).
        checkpoint: store the replay buffer in checkpoints so a resume continues training at once.
        optimize_memory_usage: SB3's key name; the sampled batches are the same either way. null stores each frame
            of (K, H, W) frame stacks once (``FrameStackReplay``; ``PrioritizedFrameStackReplay`` under
            ``PrioritizedReplay``) and other observations as they are; true does the same and also stores other
            observations once, the next one found by index (``FrameOnceReplay``; not with ``PrioritizedReplay``);
            false stores every observation and next observation (``Replay``, SLM-Lab's layout).
        obs_dtype: storage dtype of floating observations, ``float32`` or ``float16``, SLM-Lab's ``Replay`` (it
            stores every non-uint8 observation as float16: half the bytes, values rounded to about 3 significant
            digits; the nets still compute in float32); integer observations (uint8 frames) are stored as they
            are either way. SLM-Lab has no switch.
        alpha: ``PrioritizedReplay``: priority exponent.
        epsilon: ``PrioritizedReplay``: added to |TD error|.
        beta_start: ``PrioritizedReplay``: None: SLM-Lab's variant, no importance weights; a number: the paper's,
            importance-weight exponent at frame 0.
        beta_end_step: ``PrioritizedReplay``: frame at which beta reaches 1.
        cross_entropy: ``OnPolicyCrossEntropy`` only: q in [0, 1], the quantile of episode returns an episode must
            reach to be trained on (SLM-Lab v4's key; 1 keeps every episode).
        sil_replay_name: SIL / PPOSIL only: the kind of the self-imitation replay beside the on-policy memory
            ``name`` (``Replay`` or ``PrioritizedReplay``; null means ``Replay``; see ``SILReplay``).
    """

    name: str = "Replay"
    batch_size: int = field(default=32, metadata={"gt": 0})
    max_size: int = field(default=10000, metadata={"gt": 0})
    use_cer: bool = False
    checkpoint: bool = field(default=False, metadata={"origin": "lab"})
    optimize_memory_usage: bool | None = field(default=None, metadata={"origin": "SB3"})
    obs_dtype: str = field(default="float32", metadata={"origin": "lab", "choices": ("float32", "float16")})
    alpha: float = field(default=0.6, metadata={"ge": 0})
    epsilon: float = field(default=1e-4, metadata={"ge": 0})
    beta_start: float | None = field(default=None, metadata={"origin": "lab", "ge": 0, "le": 1})
    beta_end_step: int = field(default=100000, metadata={"origin": "lab", "gt": 0})
    cross_entropy: float = field(default=1.0, metadata={"ge": 0, "le": 1})
    sil_replay_name: str | None = field(default=None,
                                        metadata={"origin": "lab", "choices": ("Replay", "PrioritizedReplay")})


FIELDS = ("obs", "act", "reward", "next_obs", "terminated", "truncated")
ROLLOUT_FIELDS = ("obs", "act", "reward", "terminated", "truncated")  # an OnPolicyBatchReplay row (next obs apart)


def storage_dtype(obs_dtype: Any, float_dtype: Any = np.float32) -> np.dtype:
    """Replay storage dtype of observations: integer and bool dtypes as they are, float16 as it is, other
    floating ones ``float_dtype`` (float32, or float16 for ``MemorySpec.obs_dtype: float16``).

    Raises:
        TypeError: not a numpy dtype (or something ``np.dtype`` accepts).
    """
    dtype = np.dtype(obs_dtype)
    if not np.issubdtype(dtype, np.floating) or dtype == np.float16:
        return dtype
    return np.dtype(float_dtype)
