"""Patch of Ray's private node start (``ray._private``): a lighter local head.

Checked on: Ray 2.60.0 (``CHECKED_ON``). Fallback: on a Ray whose private names differ (``applies`` is False) the
local Ray starts through the public ``ray.init`` alone. Measured gain (docs/BENCHMARKS.md "Start-up and exit",
"Process memory"): about 100 MB less RSS on the head and 1-2 s less of a ``train``'s start, 2-4% of the
45 s CartPole ``train`` it was timed on. ``tests/test_architecture.py`` fails when a new Ray
changes the names it patches.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from typing import Any, Iterator

CHECKED_ON = "ray==2.60.0"


def applies() -> bool:
    """Whether the installed Ray still has the private names ``lean_head_params`` patches, as on ``CHECKED_ON``."""
    import ray._private.node as node
    import ray._private.parameter as parameter
    import ray._private.services as services
    import ray._private.utils as ray_utils

    start_api_server = getattr(node.Node, "start_api_server", None)
    return ({"no_monitor", "include_log_monitor"} <= set(inspect.signature(parameter.RayParams).parameters)
            and start_api_server is not None
            and "include_dashboard" in inspect.signature(start_api_server).parameters
            and getattr(ray_utils, "get_dashboard_dependency_error", None) is not None
            and getattr(services, "get_node", None) is not None)


@contextlib.contextmanager
def lean_head_params() -> Iterator[None]:
    """While a local Ray starts: no autoscaler monitor, no log monitor, no dashboard API server, and the raylet's
    dashboard agent in its minimal mode (docs/BENCHMARKS.md "Process memory" and "Start-up and exit").

    A one-machine Ray never autoscales; with ``log_to_driver=False`` the log monitor, which only forwards worker
    output to drivers, has nothing to do; the API server, which Ray starts even with ``include_dashboard=False``
    (it serves ``ray list``'s state API and job submission, neither of which the lab uses on its own Ray;
    ``--dashboard`` starts the full one), costs about 100 MB, and ``ray.init`` waits about 0.8 s for it before it
    starts the raylet; and the agent's full mode (metrics export and the dashboard's node reports) costs the
    driver about 0.25 s of imports (aiohttp and the like) to decide on it. ``ray.init`` has no option for any of
    these, so for its duration its node parameters (``RayParams``, Ray 2.60, whose ``no_monitor`` /
    ``include_log_monitor`` fields ``ray start`` sets) get the first two defaults, the node's ``start_api_server``
    records no web UI, as Ray does for a minimal install that starts no server, and Ray's dashboard-dependency
    check answers as it does for a minimal install. Last, the head waits for its raylet to register with Ray's own
    lookup, which here took 1.0 s every time (it looks again about once a second); ``services.get_node`` first
    polls the GCS's node table every 20 ms (0.3-0.9 s less). With a Ray that lacks these, nothing changes.
    """
    import ray._private.node as node
    import ray._private.parameter as parameter
    import ray._private.services as services
    import ray._private.state as ray_state
    import ray._private.utils as ray_utils

    base = parameter.RayParams
    start_api_server = getattr(node.Node, "start_api_server", None)
    dependency_error = getattr(ray_utils, "get_dashboard_dependency_error", None)
    get_node = getattr(services, "get_node", None)
    if not applies():
        yield
        return

    class LeanParams(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("no_monitor", True)
            kwargs.setdefault("include_log_monitor", False)
            super().__init__(*args, **kwargs)

    def no_api_server(self: Any, *, include_dashboard: bool | None, raise_on_failure: bool) -> None:
        self._webui_url = ""  # what Ray records when it starts no server (a minimal install)

    def get_node_when_registered(gcs_address: str, node_id: str) -> Any:
        try:
            table = ray_state.GlobalState()
            table._initialize_global_state(services._get_gcs_client_options(gcs_address))
            try:
                deadline = time.monotonic() + 10  # then Ray's own lookup and its timeout take over
                while time.monotonic() < deadline and all(n["NodeID"] != node_id for n in table.node_table()):
                    time.sleep(0.02)
            finally:
                table.disconnect()
        except Exception:  # noqa: BLE001  (the poll only saves time: Ray's own lookup below decides)
            pass
        return get_node(gcs_address, node_id)

    parameter.RayParams = LeanParams
    node.Node.start_api_server = no_api_server
    ray_utils.get_dashboard_dependency_error = lambda: "the lab's local Ray: dashboard agent in minimal mode"
    services.get_node = get_node_when_registered
    try:
        yield
    finally:
        parameter.RayParams = base
        node.Node.start_api_server = start_api_server
        ray_utils.get_dashboard_dependency_error = dependency_error
        services.get_node = get_node


