"""The ``meta.tracking`` section's checks: a backend that is installed, and options its API takes."""

from __future__ import annotations

import importlib.util
from typing import Any


def tracking_problems(meta: Any) -> list[str]:
    """Spec problems of ``meta.tracking`` / ``meta.tracking_options`` (dotted path first).

    Args:
        meta: the defaults-filled ``meta`` section (anything else, or an unknown backend, is left to
            the section checks of ``orchestrator.spec``).

    Returns:
        Problems, [] if fine: a backend whose package is not installed (with the extra that installs
        it), MLflow options other than ``MLFLOW_OPTIONS``.
    """
    if not isinstance(meta, dict) or meta.get("tracking") not in BACKENDS:
        return []
    backend, options = meta["tracking"], meta.get("tracking_options") or {}
    problems = []
    if backend != "none" and importlib.util.find_spec(BACKEND_PACKAGES[backend]) is None:
        problems.append(f"meta.tracking: '{backend}' is not installed; pip install -e \".[{backend}]\"")
    if isinstance(options, dict) and backend == "mlflow":
        problems += [f"meta.tracking_options.{k}: unknown MLflow option (expected one of {list(MLFLOW_OPTIONS)})"
                     for k in options if k not in MLFLOW_OPTIONS]
    elif isinstance(options, dict) and backend == "wandb" and not problems:
        problems += wandb_option_problems(options)
    return problems


WANDB_SET_BY_LAB = ("id", "resume", "name", "group", "config", "dir", "reinit")


def wandb_option_problems(options: dict[str, Any]) -> list[str]:
    """Problems of W&B options: keys ``wandb.init`` does not take, or that the lab sets itself."""
    import inspect

    import wandb

    accepted = inspect.signature(wandb.init).parameters
    out = []
    for key in options:
        if key in WANDB_SET_BY_LAB:
            out.append(f"meta.tracking_options.{key}: set by the lab (one run per session, resumed by id)")
        elif key not in accepted:
            out.append(f"meta.tracking_options.{key}: not an argument of wandb.init")
    return out




BACKENDS = ("none", "wandb", "mlflow")


BACKEND_PACKAGES = {"wandb": "wandb", "mlflow": "mlflow"}


MLFLOW_OPTIONS = ("tracking_uri", "experiment")


