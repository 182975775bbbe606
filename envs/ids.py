"""Gymnasium env ids: registering ale-py's ids on first use, mapping the ids gymnasium no longer runs to their
successors, telling Atari ids apart, and an Atari id's sticky-action probability. Shared by ``envs.make`` (the
gymnasium vector envs) and ``envs.envpool_vec`` (EnvPool, whose ids are mapped from these); ``envs.make``
re-exports every name."""

from __future__ import annotations

import difflib
import importlib
import os
import warnings
from typing import Any

import gymnasium as gym

_ale_registered = False  # ale-py's ids are registered with gymnasium in this process


def ensure_registered(env_id: str) -> None:
    """Register ale-py's ids (``ALE/*``, ``*NoFrameskip-v4``, ``Pong-v4``, ...) with gymnasium the first time an id
    gymnasium does not know is looked up, so that only processes that make or check an Atari env import ale-py
    (~15 MB, ~0.3 s); without ale-py installed nothing is registered (the id stays unknown)."""
    global _ale_registered
    if _ale_registered or env_id.split(":")[-1] in gym.registry:
        return
    try:
        import ale_py
    except ImportError:
        return
    gym.register_envs(ale_py)
    _ale_registered = True


def _ale_missing(name: str) -> bool:
    """True when ``name`` looks like an ale-py id (``ALE/...``, ``...NoFrameskip-v4``) and ale-py cannot be imported."""
    if not (name.startswith("ALE/") or "NoFrameskip" in name):
        return False
    try:
        import ale_py  # noqa: F401
    except ImportError:
        return True
    return False


# SLM-Lab / old gym ids that gymnasium no longer runs -> their successors: ids it no longer registers, and
# the MuJoCo v2/v3 ids it registers only as stubs that raise (they needed mujoco-py). Ids that still run are
# kept as they are: ale-py's ``PongNoFrameskip-v4`` / ``BreakoutNoFrameskip-v4`` (v4 semantics: no sticky
# actions, all frames; the Atari preprocessing of ``make_sub_env`` applies) and the MuJoCo v4 ids
# (gymnasium warns that they are deprecated).
_MUJOCO_STUBS = {"Reacher": ("v2",), "Pusher": ("v2",), "InvertedPendulum": ("v2",),
                 "InvertedDoublePendulum": ("v2",), "HumanoidStandup": ("v2",), "HalfCheetah": ("v2", "v3"),
                 "Hopper": ("v2", "v3"), "Swimmer": ("v2", "v3"), "Walker2d": ("v2", "v3"), "Ant": ("v2", "v3"),
                 "Humanoid": ("v2", "v3")}
OLD_ENV_IDS: dict[str, str] = {
    "LunarLander-v2": "LunarLander-v3",
    "LunarLanderContinuous-v2": "LunarLanderContinuous-v3",
    "BipedalWalker-v2": "BipedalWalker-v3",
    "BipedalWalkerHardcore-v2": "BipedalWalkerHardcore-v3",
    "CarRacing-v0": "CarRacing-v3",
    "Pendulum-v0": "Pendulum-v1",
    "Acrobot-v0": "Acrobot-v1",
    **{f"{name}-{v}": f"{name}-v5" for name, versions in _MUJOCO_STUBS.items() for v in versions},
}


def _runs(env_id: str) -> bool:
    """Registered with a real entry point (gymnasium's mujoco-py stubs have a function that raises)."""
    ensure_registered(env_id)
    return env_id in gym.registry and isinstance(gym.registry[env_id].entry_point, str)


def is_atari(env_id: str) -> bool:
    """True for an id registered by ale-py (``ALE/*``, ``*NoFrameskip-v4``, ...).

    Raises:
        KeyError: ``env_id`` is not registered.
    """
    ensure_registered(env_id)
    entry = gym.registry[env_id.split(":")[-1]].entry_point
    return isinstance(entry, str) and entry.startswith("ale_py")


def resolve_env_id(name: str) -> str:
    """Map an id gymnasium no longer registers to its successor, with a warning.

    Ids gymnasium still runs (e.g. ``CartPole-v0``, ``PongNoFrameskip-v4``, ``HalfCheetah-v4``) are returned
    as they are; ``OLD_ENV_IDS`` maps the others (``LunarLander-v2``, ``HalfCheetah-v3``, ...). A custom env may be
    given as ``"module:EnvId-v0"`` (gymnasium's syntax): the module is imported to register it.

    Raises:
        ValueError: if neither ``name`` nor its mapped successor is registered, or the module of a
            ``module:EnvId`` name cannot be imported.
    """
    if ":" in name:
        module, env_id = name.split(":", 1)
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise ValueError(f"env '{name}': cannot import module '{module}': {err} (the lab imports it from the "
                             f"directory the lab command runs in, {os.getcwd()}, or from the installed packages: "
                             f"see docs/own-env.md)") from None
        if env_id not in gym.registry:
            raise ValueError(f"unknown env id '{env_id}': module '{module}' does not register it")
        return name
    ensure_registered(name)
    new = OLD_ENV_IDS.get(name)
    if name in gym.registry and (new is None or _runs(name)):
        return name
    if new is not None and _runs(new):
        warnings.warn(f"env '{name}' is not in gymnasium; using its successor '{new}'", stacklevel=2)
        return new
    if _ale_missing(name):
        raise ValueError(f"env '{name}' needs ale-py, which is not installed: pip install ale-py")
    close = difflib.get_close_matches(name, list(gym.registry), n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    raise ValueError(f"unknown env id '{name}': gymnasium has no such environment registered{hint}")


def sticky_probability(env_id: str, spec: Any) -> float:
    """Sticky-action probability of an Atari sub-env: the spec's, else the id's registered one (0.25 for
    ``ALE/*-v5``, 0 for ``*-v4``).

    Applied by gymnasium's ``StickyAction`` rather than inside ALE: ALE's own sticky actions repeat an
    emulator-side previous action that ``ALEState`` does not save, so a restored ALE would continue
    differently (measured: 1 of 6 Pong states); the wrapper keeps it in Python, drawn from the env's
    ``np_random``, and so is saved exactly with the env state. The one difference: the first step after a reset
    is never sticky.
    """
    if spec.repeat_action_probability is not None:
        return float(spec.repeat_action_probability)
    ensure_registered(env_id)
    return float(gym.registry[env_id.split(":")[-1]].kwargs.get("repeat_action_probability", 0.25))
