"""Warm session actors kept by the process that owns them, to host the next trial's sessions (search)."""

from __future__ import annotations

import math
from typing import Any

import ray

from orchestrator.session_actor import SessionActor
from orchestrator.spec.meta import MetaSpec


class SessionHosts:
    """Session actors whose session ended ``done``, kept warm in the process that owns them, to host the
    sessions of the next trial that process runs (``SessionActor.run(session=...)``).

    A new session actor is a new Python process that imports torch and the lab before its session starts
    (seconds, most of a short search trial's fixed cost: docs/search.md "Scheduling and sampling"). A search's
    Tune trial actor is reused for the next trial Tune starts with the same resources (``reuse_actors``),
    within the same placement group, so the session actors it started stay in that placement group's
    bundles and host the next trial's sessions. An actor is reused only after its session ended ``done``
    and only for the same resources (``key``); any other ending (failure, death, stop) ends the actor.
    Owned by the process, hosts end with it (Tune ending its trial actor, or the driver exiting).
    """

    def __init__(self) -> None:
        self.idle: list[tuple[tuple[Any, ...], Any]] = []
        # session key (``t{T}_s{S}``) -> (resources key, frame, actor): actors still holding their session live
        # (population-based training: ended ``done`` at a generation's end, to continue it with ``run(extend=...)``)
        self.live: dict[str, tuple[tuple[Any, ...], int, Any]] = {}

    def take(self, key: tuple[Any, ...], avoid: set[str] = frozenset()) -> Any | None:
        """An idle actor for sessions of resources ``key`` (None when there is none); idle actors of other
        resources are ended (they hold resources of the placement group the new sessions need). Without an idle
        one, an actor holding a live session is taken (its session dropped: its checkpoint holds it), preferring
        those whose session key is not in ``avoid`` (sessions about to continue in their own)."""
        self.keep_only(key)
        if self.idle:
            return self.idle.pop()[1]
        for session_key in sorted(self.live, key=lambda k: (k in avoid, k)):
            if self.live[session_key][0] == key:
                return self.live.pop(session_key)[2]
        return None

    def put_live(self, key: tuple[Any, ...], session_key: str, frame: int, actor: Any) -> None:
        """Keep an actor whose session ``session_key`` ended ``done`` at ``frame`` with its session live."""
        self.live[session_key] = (key, frame, actor)

    def take_live(self, key: tuple[Any, ...], session_key: str, frame: int) -> Any | None:
        """The actor holding session ``session_key`` live at ``frame`` with resources ``key`` (None when there is
        none; a live actor of that session at another frame is kept as a plain host)."""
        held = self.live.pop(session_key, None)
        if held is None:
            return None
        if held[0] == key and held[1] == frame:
            return held[2]
        self.idle.append((held[0], held[2]))
        return None

    def forget_live(self, session_keys: set[str] | None = None) -> None:
        """Make the live actors of ``session_keys`` (all when None) plain hosts: their sessions must not continue
        (an exploit replaced their state)."""
        for k in [k for k in self.live if session_keys is None or k in session_keys]:
            key, _, actor = self.live.pop(k)
            self.idle.append((key, actor))

    def keep_only(self, key: tuple[Any, ...]) -> None:
        """End the idle and live actors of resources other than ``key``."""
        for _, actor in [item for item in self.idle if item[0] != key]:
            ray.kill(actor)
        self.idle = [item for item in self.idle if item[0] == key]
        for session_key in [k for k, held in self.live.items() if held[0] != key]:
            ray.kill(self.live.pop(session_key)[2])

    def warm_up(self, key: tuple[float, float], count: int) -> list[Any]:
        """Start empty session actors (``SessionActor()``) of resources ``key`` = (num_cpus, num_gpus) until
        ``count`` are idle, in the caller's placement group: their processes start (a worker, torch, the lab)
        while the caller checks its spec and plans; ``take`` hands them to its sessions.

        Returns:
            The idle actors of ``key`` (at least ``count``).
        """
        self.keep_only(key)
        while len(self.idle) < count:
            self.idle.append((key, empty_session_actor(key)))
        return [actor for _, actor in self.idle]

    def put(self, key: tuple[Any, ...], actor: Any) -> None:
        """Keep an actor whose session ended ``done`` for the next session of resources ``key``."""
        self.idle.append((key, actor))

    def clear(self) -> None:
        """End every idle and live actor."""
        for _, actor in self.idle:
            ray.kill(actor)
        for _, _, actor in self.live.values():
            ray.kill(actor)
        self.idle, self.live = [], {}


def empty_session_actor(key: tuple[float, float]) -> Any:
    """A new ``SessionActor`` with no session, holding ``key`` = (num_cpus, num_gpus) (``host_key``); its
    ``run(session=...)`` builds the session."""
    num_cpus, num_gpus = key
    return SessionActor.options(num_cpus=num_cpus, num_gpus=num_gpus).remote()


def capacity(key: tuple[float, float]) -> int:
    """How many session actors of resources ``key`` = (num_cpus, num_gpus) the Ray cluster's resources hold at once
    (its CPUs and GPUs now, whether in use or not; at least 1)."""
    total = ray.cluster_resources()
    fits = [math.floor(total.get(name, 0.0) / need + 1e-9) for name, need in zip(("CPU", "GPU"), key) if need > 0]
    return max(1, min(fits, default=1))


def host_key(meta: MetaSpec) -> tuple[float, float]:
    """What a session actor is created with besides its session: (num_cpus, num_gpus) of ``meta.resources``."""
    res = meta.resources
    return float(res.get("num_cpus", 1) or 0), float(res.get("num_gpus", 0) or 0)


HOSTS = SessionHosts()  # this process's warm session actors (used by search trials: orchestrator.search)


