"""Nodes being drained (a preemption notice), read from Ray's GCS through a private API (``ray._private.state``).

A node is drained by ``ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION --deadline-remaining-seconds N`` (the
GCS call autoscaler v2 and KubeRay make before they take a node away), and by Ray itself when a ``ray start
--block`` process (a KubeRay pod's PID 1) gets SIGTERM: it drains its node for ``RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S``
(default 30 s) before it ends the node's processes. Actors on a draining node get no signal and no event, and
``ray.nodes()`` does not show the drain (docs/SCALING.md "Preempted nodes"); the GCS's list of draining nodes, which
``draining_nodes`` reads with one RPC, is the only place it shows.

Checked on: Ray 2.60.0 (``CHECKED_ON``). Fallback: on a Ray without these private names (``applies`` is False)
``draining_nodes`` returns an empty dict: a preempted node's sessions are then restarted from their newest
checkpoint once the node is gone, as after any node loss. Gain: a session on a drained node loses about one
checkpoint interval instead of the training since its newest checkpoint. ``tests/test_architecture.py`` fails when
a new Ray changes the name used here.
"""

from __future__ import annotations

CHECKED_ON = "ray==2.60.0"


def applies() -> bool:
    """Whether the installed Ray still has ``ray._private.state.state.get_draining_nodes``, as on ``CHECKED_ON``."""
    try:
        from ray._private.state import state
    except ImportError:
        return False
    return callable(getattr(state, "get_draining_nodes", None))


def draining_nodes() -> dict[str, float | None]:
    """The nodes of the connected Ray cluster that are being drained (one GCS RPC; call after ``ray.init``).

    Returns:
        Node id (hex) -> drain deadline in seconds since the epoch (None when the drain has no deadline); empty
        when no node drains, when this Ray lacks the API (``applies``), or when the GCS cannot be asked now.
    """
    if not applies():
        return {}
    from ray._private.state import state

    try:
        nodes = state.get_draining_nodes()
    except Exception:  # noqa: BLE001 - a GCS hiccup: the next poll asks again
        return {}
    return {node: (deadline_ms / 1000.0 if deadline_ms else None) for node, deadline_ms in nodes.items()}
