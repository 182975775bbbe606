"""The replay factory: the replay kind and storage layout a ``MemorySpec`` asks for (``make_replay``), and its
bytes per transition (``transition_bytes``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from agents.memory.frames import FrameOnceReplay, FrameStackReplay
from agents.memory.prioritized import PrioritizedFrameStackReplay, PrioritizedReplay, SumTree
from agents.memory.replay import Replay
from agents.memory.spec import MemorySpec, storage_dtype


def make_replay(spec: MemorySpec, obs_space: Any, act_shape: tuple[int, ...], act_dtype: Any,
                name: str | None = None, store_next_obs: bool = True, num_envs: int = 0) -> Replay:
    """The replay ``spec`` asks for, for ``obs_space`` (a gymnasium space with ``shape`` and ``dtype``:
    observations stored in its dtype, floating ones in ``spec.obs_dtype``, see ``storage_dtype``): a
    ``PrioritizedReplay`` when ``name`` (default ``spec.name``) says so, else a ``Replay``; with
    ``spec.optimize_memory_usage`` (see ``MemorySpec``) their frame-once kinds: ``FrameStackReplay`` /
    ``PrioritizedFrameStackReplay`` for (K, H, W) frame stacks, ``FrameOnceReplay`` for other observations.
    ``store_next_obs`` false: no next observations (then ``optimize_memory_usage`` has nothing to save).
    ``num_envs``: N, rows per ``add`` (0: taken from the first add); a frame-once kind needs it to load a
    ``Replay`` state (a checkpoint written without ``optimize_memory_usage``).

    Raises:
        ValueError: as the constructors; ``optimize_memory_usage: true`` with ``PrioritizedReplay`` on
            observations that are not (K, H, W) stacks.
    """
    obs_dtype = storage_dtype(obs_space.dtype, spec.obs_dtype)
    args = (spec.max_size, obs_space.shape, act_shape, act_dtype, spec.batch_size, spec.use_cer, obs_dtype)
    stacks = len(obs_space.shape) == 3
    optimize = store_next_obs and (stacks if spec.optimize_memory_usage is None else spec.optimize_memory_usage)
    if (name or spec.name) == "PrioritizedReplay":
        per = {"alpha": spec.alpha, "epsilon": spec.epsilon, "beta_start": spec.beta_start,
               "beta_end_step": spec.beta_end_step}
        if not optimize:
            return PrioritizedReplay(*args, **per, store_next_obs=store_next_obs)
        if not stacks:
            raise ValueError("agent.memory.optimize_memory_usage: true is available with PrioritizedReplay "
                             f"only for (K, H, W) frame stacks, not observations of shape {obs_space.shape}")
        return PrioritizedFrameStackReplay(*args, **per, num_envs=num_envs)
    if not optimize:
        return Replay(*args, store_next_obs=store_next_obs)
    return (FrameStackReplay if stacks else FrameOnceReplay)(*args, num_envs=num_envs)


def transition_bytes(spec: MemorySpec, obs_space: Any, act_shape: tuple[int, ...], act_dtype: Any,
                     name: str | None = None, store_next_obs: bool = True) -> float:
    """Bytes per transition of the replay ``make_replay`` builds for these arguments: its preallocated arrays
    (and a ``PrioritizedReplay``'s sum tree) over ``spec.max_size`` rows, without what a stream adds beside them
    (whole stacks at episode ends and starts: about 49 KB per Atari episode). Builds the replay at 1,024 rows
    (its arrays are zero pages until written), so it costs no memory.

    Raises:
        ValueError: as ``make_replay``.
    """
    rows = min(1024, spec.max_size)
    memory = make_replay(dataclasses.replace(spec, max_size=rows), obs_space, act_shape, act_dtype, name,
                         store_next_obs)
    if not isinstance(memory, PrioritizedReplay):
        return memory.nbytes / rows
    tree = SumTree(spec.max_size).tree.nbytes  # (2P,) for the power of two P >= max_size: not linear in rows
    return (memory.nbytes - memory.sum_tree.tree.nbytes) / rows + tree / spec.max_size
