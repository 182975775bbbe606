"""The lab commands the lab prints for the user to run next (resume, train the best spec), as the user started
the lab."""

from __future__ import annotations

import os
import shlex
import sys

from orchestrator.store import storage


def entry_command(argv0: str | None = None) -> str:
    """How the user started the lab, for the commands it prints (resume, train the best spec).

    Args:
        argv0: ``sys.argv[0]`` (default: the running process's).

    Returns:
        ``lab`` when run as the ``lab`` console script (or from an unknown entry), else
        ``python /abs/path/run_lab.py`` (any ``*.py`` entry, with an absolute path), or
        ``python -m orchestrator.cli``.
    """
    argv0 = sys.argv[0] if argv0 is None else argv0
    base = os.path.basename(argv0)
    if base == "cli.py" and os.path.basename(os.path.dirname(os.path.abspath(argv0))) == "orchestrator":
        return "python -m orchestrator.cli"
    if base.endswith(".py") and base != "__main__.py":
        return f"python {shlex.quote(os.path.abspath(argv0))}"
    return "lab"


def lab_command(spec_file: str, spec_name: str, mode: str, *extra: str) -> str:
    """The full command line ``{entry} SPEC_FILE SPEC_NAME MODE [EXTRA...]`` (local paths absolute).

    Returns:
        The command, shell-quoted.
    """
    spec_file = storage.absolute(spec_file)
    if "@" in mode and not storage.is_remote(mode.split("@", 1)[1]) and mode.split("@", 1)[1] != "latest":
        head, target = mode.split("@", 1)
        mode = f"{head}@{storage.absolute(target)}"
    words = [spec_file, spec_name, mode, *extra]
    return " ".join([entry_command(), *(shlex.quote(w) for w in words)])




def mode_header(mode: str, predir: str) -> str:
    """The first line's label of a run, naming the run dir once: ``train: PREDIR`` (a new run),
    ``train@latest: PREDIR`` (the run ``latest`` found), ``train@PREDIR`` (the run the user named)."""
    head, _, target = mode.partition("@")
    if target and target != "latest":
        return f"{head}@{predir}"
    return f"{mode}: {predir}"


def typed_options(overrides: list[str], data_dir: str | None = None) -> list[str]:
    """The words of the ``-s KEY.PATH=VALUE`` overrides the user typed, in order, and ``--data-dir DIR``
    when ``data_dir`` is given and is not the default (``data`` in the working directory), for a printed
    command that keeps what the user typed."""
    words = [w for item in overrides for w in ("-s", item)]
    if data_dir is not None and storage.absolute(data_dir) != storage.absolute("data"):
        words += ["--data-dir", storage.absolute(data_dir)]
    return words
