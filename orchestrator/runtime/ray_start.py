"""Joining or starting Ray for a mode's driver, and refusing resources a cluster can never fit."""

from __future__ import annotations

import os
from typing import Any

import ray

from orchestrator.errors import UsageError
from orchestrator.runtime.ray_params import lean_head_params
from orchestrator.runtime.signals import pause_point, ray_init_guard
from orchestrator.runtime.workdir import runtime_env


def init_ray(address: str | None, dashboard: bool = False, prestart: bool = True) -> None:
    """Join ``address`` / ``RAY_ADDRESS`` or start a local Ray (no-op if already initialized).

    Args:
        dashboard: start the Ray dashboard with a local Ray (``lab --dashboard``; it needs
            ``ray[default]``, the ``cluster`` extra). Off by default: a lighter start. A cluster's
            dashboard is the head's (``ray start --head --include-dashboard=true``).
        prestart: let a local Ray start one idle worker process per CPU when the driver connects (Ray's
            default; the first session actor of a ``train`` takes one). False for a ``search``: Tune starts its
            trial actors with their own ``runtime_env``, so they and their session actors never take those
            workers, which only cost the start-up CPU time (docs/search.md "Scheduling and sampling").

    Raises:
        UsageError: ``dashboard`` without the dashboard's packages installed.
    """
    if ray.is_initialized():
        return
    with ray_init_guard():  # the lab's stop handler stays in force (orchestrator.runtime.signals)
        start_ray(address, dashboard, prestart)
    pause_point("ray_start")


def start_ray(address: str | None, dashboard: bool, prestart: bool) -> None:
    """``ray.init`` for ``init_ray`` (its arguments); joining a cluster, with the working directory as the job's
    ``runtime_env`` ``working_dir`` (``orchestrator.runtime.workdir.runtime_env``: what is sent and when not)."""
    address = address or os.environ.get("RAY_ADDRESS") or "local"
    local = {} if prestart else {"_system_config": {"prestart_worker_first_driver": False}}
    if dashboard and address == "local":
        from ray._private.utils import get_dashboard_dependency_error
        if get_dashboard_dependency_error() is not None:
            raise UsageError("--dashboard needs the Ray dashboard's packages: pip install 'rl-trial-lab[cluster]' "
                             "(ray[default])")
        context = ray.init(address=address, include_dashboard=True, log_to_driver=False, logging_level="ERROR",
                           **local)
        print(f"Ray dashboard: http://{context.dashboard_url}")
        return
    if address == "local":
        with lean_head_params():
            ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="ERROR", **local)
        return
    # a cluster's workers get the working directory (a user's env module) through Ray's working_dir upload; a local
    # Ray's inherit it through PYTHONPATH (orchestrator.runtime.workdir)
    env = runtime_env(os.getcwd())
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
                 **({} if env is None else {"runtime_env": env}))
    except ValueError as err:  # Ray's package-size limit (the directory's files, zipped) or a bad runtime_env
        if env is None or "working_dir" not in str(err) and "size" not in str(err):
            raise
        raise UsageError(f"cannot send the working directory {os.getcwd()} to the Ray cluster: {err}; run lab from "
                         f"a smaller directory or list what to leave out in a .rayignore there") from None


def check_resources(res: dict[str, Any], sessions: int, together: bool = False) -> None:
    """Refuse resources that can never fit the cluster (instead of waiting forever): one session's (``res``:
    ``meta.resources``), and with ``together`` (a search trial, whose placement group reserves all its ``sessions``
    session actors, ``meta.max_session`` or its seed groups with ``meta.session_batch``, at once) the sum.

    Raises:
        UsageError: naming what was asked and what exists.
    """
    total = ray.cluster_resources()
    for key, name in (("num_cpus", "CPU"), ("num_gpus", "GPU")):
        asked, exists = float(res.get(key, 0) or 0), float(total.get(name, 0))
        if asked > exists:
            raise UsageError(f"meta.resources.{key}={asked} per session can never fit: the Ray cluster has "
                             f"{exists} {name} in total")
        if together and asked * sessions > exists:
            raise UsageError(f"meta.resources.{key}={asked} x {sessions} session actor(s) (meta.max_session, or its "
                             f"seed groups with meta.session_batch): a search trial reserves all its session actors "
                             f"at once, and {asked * sessions:g} {name} can never fit: the Ray cluster has {exists} "
                             f"{name} in total (lower either, or add nodes)")


