"""The command line: the parsed command (``Command``, built once by ``orchestrator.cli`` and passed to the modes),
the grammar of the mode word (``split_mode``), the options of one mode (``check_mode_options``), and the lab
commands the lab prints for the user to run next (resume, train the best spec), as the user started the lab."""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass

from orchestrator.errors import UsageError
from orchestrator.store import storage


def split_mode(word: str) -> tuple[str, str | None]:
    """The mode and the target of a mode word: ``train@latest`` -> ``("train", "latest")``, ``train`` ->
    ``("train", None)``, ``enjoy@x_spec.json@latest`` -> ``("enjoy", "x_spec.json@latest")`` (split at the first
    ``@``; ``train@`` -> ``("train", "")``)."""
    mode, at, target = word.partition("@")
    return mode, target if at else None


DEFAULT_EPISODES = 10  # enjoy@'s evaluation episodes without --episodes


@dataclass(frozen=True)
class Command:
    """One ``lab SPEC_FILE SPEC_NAME MODE [options]`` command, parsed once (``orchestrator.cli.parse``).

    Fields:
        spec_file: the spec file as typed (path or URI).
        spec_name: the name of the spec in it.
        word: the mode word as typed (``train``, ``train@latest``, ``enjoy@{file}@latest``).
        mode: the mode, the part of ``word`` before its first ``@``.
        target: the part after it (``latest``, a predir, a session spec file with an optional ``@latest`` /
            ``@best``); None when ``word`` has no ``@``.
        overrides: the ``-s KEY.PATH=VALUE`` overrides, in order.
        data_dir: the root of run directories, absolute (a local path) or a URI.
        address: the Ray cluster address (None: ``RAY_ADDRESS`` or a local Ray).
        dashboard: start the Ray dashboard with a local Ray.
        max_concurrent_trials: ``search``: at most this many trials at once (None: as resources allow).
        search_alg: ``search``: ``auto``, ``basic`` or ``optuna``.
        name: ``--name RUN``: the run lives in ``{data_dir}/RUN`` (None: a new timestamped predir).
        allow_fresh: ``train@``: sessions with no committed checkpoint start from frame 0.
        quiet: no live progress display.
        pbt_replay: ``train --pbt-replay PREDIR``: the PBT search whose trial ``trial`` is replayed.
        trial: ``--trial T`` of ``--pbt-replay``.
        episodes: ``enjoy@``: evaluation episodes (None: 10, ``DEFAULT_EPISODES``).
        seed: ``enjoy@``: env and action seed (None: the session seed).
        ckpt: ``enjoy@``: ``best`` or ``latest`` (None: the target's suffix, else best).
        render: ``enjoy@``: show the env.
        record: ``enjoy@``: write an MP4 per episode.
    """

    spec_file: str
    spec_name: str
    word: str
    mode: str
    target: str | None
    overrides: tuple[str, ...] = ()
    data_dir: str = "data"
    address: str | None = None
    dashboard: bool = False
    max_concurrent_trials: int | None = None
    search_alg: str = "auto"
    name: str | None = None
    allow_fresh: bool = False
    quiet: bool = False
    pbt_replay: str | None = None
    trial: int | None = None
    episodes: int | None = None
    seed: int | None = None
    ckpt: str | None = None
    render: bool = False
    record: bool = False


# options that only one mode reads: (flag, Command field, the mode, what the option sets there); given to another mode
# they are refused rather than silently ignored
MODE_OPTIONS: tuple[tuple[str, str, str, str], ...] = (
    ("--episodes", "episodes", "enjoy", "the number of evaluation episodes of a trained session"),
    ("--seed", "seed", "enjoy", "the env and action seed of the evaluation"),
    ("--ckpt", "ckpt", "enjoy", "the checkpoint evaluated"),
    ("--render", "render", "enjoy", "whether the evaluation is shown"),
    ("--record", "record", "enjoy", "whether the evaluation is recorded"),
)


def check_mode_options(cmd: Command) -> None:
    """Refuse an option of ``MODE_OPTIONS`` given to a mode that does not read it (``dev --episodes 3``).

    Raises:
        UsageError: names the option, the mode it belongs to, and for ``dev``/``train``/``search`` what sets the
            length of a run instead (``env.max_frame``).
    """
    for flag, field, mode, what in MODE_OPTIONS:
        if cmd.mode != mode and getattr(cmd, field) not in (None, False):
            length = ("; the length of a dev, train or search run is set by the spec: -s env.max_frame=N (frames)"
                      if field == "episodes" else "")
            raise UsageError(f"{flag} applies to {mode}@ only ({what}), not to '{cmd.word}'; remove it{length}")


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
    head, target = split_mode(mode)
    if target is not None and not storage.is_remote(target) and target != "latest":
        mode = f"{head}@{storage.absolute(target)}"
    words = [spec_file, spec_name, mode, *extra]
    return " ".join([entry_command(), *(shlex.quote(w) for w in words)])


def mode_header(mode: str, predir: str) -> str:
    """The first line's label of a run, naming the run dir once: ``train: PREDIR`` (a new run),
    ``train@latest: PREDIR`` (the run ``latest`` found), ``train@PREDIR`` (the run the user named)."""
    head, target = split_mode(mode)
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
