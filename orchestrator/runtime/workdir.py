"""The working directory of the ``lab`` command as an import root: a module there (``myenvs.py``, named in a spec as
``env.name=myenvs:MyCart-v0``) imports in the driver and in every process the lab starts, as with ``python -m``.

The rule, applied once by ``orchestrator.cli.main`` (``make_importable``): the current working directory goes first
on the driver's ``sys.path`` and last on ``PYTHONPATH`` (after the user's own entries) in the driver's environment,
which the spec-check child (``orchestrator.modes.spec_check``) and an embedded local Ray (its raylet and every
worker it starts) inherit; Ray itself also adds a driver's current directory to the ``sys.path`` of its workers,
which is enough where every worker shares the driver's filesystem. On a Ray cluster joined with ``--address`` the
directory's files are not on the other nodes: ``orchestrator.runtime.ray_start`` sends them with Ray's
``runtime_env`` ``working_dir`` (``runtime_env`` here), which Ray unpacks on every node and puts first on each
worker's ``PYTHONPATH`` (the workers' working directory too).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from orchestrator.errors import UsageError

LAB_PACKAGES = ("orchestrator", "agents", "envs")  # the lab's own top-level packages, which the directory must not hide
# never sent to a cluster: run data, virtual environments, caches (Ray also skips what .gitignore / .rayignore name)
EXCLUDES = ["data/", ".venv/", "venv/", ".git/", "__pycache__/", "*.pyc", ".pytest_cache/", ".mypy_cache/",
            ".ruff_cache/", "site/", "node_modules/"]
MAX_SEND_BYTES = 100 * 1024 * 1024  # above this the directory is not sent (Ray's own limit is 512 MiB, zipped)
MAX_SEND_FILES = 20_000


def make_importable(cwd: str | None = None) -> str:
    """Put ``cwd`` (default: the current working directory) first on ``sys.path`` and last on ``PYTHONPATH``
    (for the processes this one starts); idempotent.

    Returns:
        The absolute directory.

    Raises:
        UsageError: the directory holds a package or module named like one of the lab's own (``LAB_PACKAGES``)
            that is not the lab's: it would hide the lab's in the driver and the workers.
    """
    root = os.path.abspath(cwd or os.getcwd())
    check_no_shadow(root)
    if root not in sys.path:
        sys.path.insert(0, root)
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([*parts, root])
    return root


def check_no_shadow(root: str) -> None:
    """Refuse a working directory whose ``orchestrator``, ``agents`` or ``envs`` (package or ``.py``) is not the
    lab's own (a checkout of the lab itself is fine).

    Raises:
        UsageError: naming the path and what to do.
    """
    lab_root = Path(__file__).resolve().parents[2]
    if Path(root).resolve() == lab_root:
        return
    for name in LAB_PACKAGES:
        for path in (Path(root, name, "__init__.py"), Path(root, f"{name}.py")):
            if path.exists():
                raise UsageError(f"{path} would hide the lab's own package '{name}' (the working directory is "
                                 f"importable, as with python -m): rename it, or run lab from another directory")


def runtime_env(root: str) -> dict[str, Any] | None:
    """Ray's ``runtime_env`` that sends ``root`` to the workers of a cluster joined with ``--address``, or None
    when it is not sent: inside a Ray job (``ray job submit --working-dir``: the job's ``runtime_env`` decides) or
    when the directory, less ``EXCLUDES``, holds more than ``MAX_SEND_BYTES`` or ``MAX_SEND_FILES`` (a warning says
    so; a module of it that a session imports must then be installed on every node).
    """
    if os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR"):
        return None
    size, files, ray_dirs = directory_size(root)
    if size > MAX_SEND_BYTES or files > MAX_SEND_FILES:
        print(f"warning: the working directory {root} is not sent to the Ray cluster's workers (over "
              f"{MAX_SEND_BYTES // 2**20} MiB or {MAX_SEND_FILES} files without {' '.join(EXCLUDES)}): a module of "
              f"it named by env.name must be installed on every node (docs/own-env.md)", file=sys.stderr)
        return None
    # a Ray temp dir inside it (``ray start --temp-dir``) grows while Ray zips the directory, its own zip included
    return {"working_dir": root, "excludes": [*EXCLUDES, *(f"/{d}/" for d in ray_dirs)]}


def is_ray_temp_dir(path: str) -> bool:
    """Whether ``path`` is a Ray temp dir (``--temp-dir``, ``/tmp/ray``): it holds Ray's ``session_latest`` link."""
    return os.path.lexists(os.path.join(path, "session_latest"))


def directory_size(root: str) -> tuple[int, int, list[str]]:
    """(bytes, files, Ray temp dirs) under ``root``, without ``EXCLUDES``' directories, Ray temp dirs (paths
    relative to ``root``, never walked) and ``.pyc`` files; stops counting once past ``MAX_SEND_BYTES`` or
    ``MAX_SEND_FILES`` (a large home directory is not walked to its end)."""
    skip = {e.rstrip("/") for e in EXCLUDES if e.endswith("/")}
    size = files = 0
    ray_dirs: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        kept = []
        for d in dirnames:
            if d in skip:
                continue
            if is_ray_temp_dir(os.path.join(dirpath, d)):
                ray_dirs.append(os.path.relpath(os.path.join(dirpath, d), root).replace(os.sep, "/"))
                continue
            kept.append(d)
        dirnames[:] = kept
        for name in filenames:
            if name.endswith(".pyc"):
                continue
            try:
                size += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
            files += 1
            if size > MAX_SEND_BYTES or files > MAX_SEND_FILES:
                return size, files, ray_dirs
    return size, files, ray_dirs
