"""Command line: ``lab SPEC_FILE SPEC_NAME MODE [options]`` (also ``python run_lab.py ...``).

``parse`` reads the arguments once into a frozen ``orchestrator.commandline.Command`` that goes down to the mode:
nothing below this module sees argparse or splits the mode word. ``MODES`` is the one table of modes and
``SUBCOMMANDS`` the one table of the commands without a spec: they make the parser's mode help, the ``--help`` text,
the lists below and docs/reference/cli.md (``tools/gen_reference.py``).

<MODES>

``train --name RUN`` runs in ``{data_dir}/RUN``; run again, it resumes that run (a complete run: exit 0, nothing
changed), so a scheduler can re-run the same command after any interruption; ``search --name RUN`` likewise. A
``dev`` run writes its outputs (with metrics, graphs and a run.json saying "mode": "dev") in a new predir and is never
resumable; ``search`` runs ``meta.max_trial`` samples of the spec's ``search`` section, each a trial of
``meta.max_session`` sessions (orchestrator/modes/search.py); ``enjoy@`` takes --episodes, --seed, --ckpt, --render,
--record and writes only under ``{predir}/enjoy/``.

Exit codes: 0 success (or nothing left to do); 1 a session failed; 2 bad input (spec, paths, arguments): one clear
message, no traceback, nothing existing is changed; 75 (EX_TEMPFAIL) stopped, resumable: SIGTERM, SIGINT or SIGUSR1
at any moment of a train or search (``orchestrator.runtime.signals``: a repeated SIGTERM/SIGUSR1 is the same stop,
a second Ctrl-C leaves at once), or a storage fault: run the same command again to continue; 130 a dev run stopped.
A resume (``train@``, ``search@``, ``--name``) applies the ``-s`` overrides the run was started with before new
ones.
"""

from __future__ import annotations

import argparse
import difflib
import os
import shlex
import sys
import textwrap
import warnings
from dataclasses import dataclass
from typing import Any, Callable, NoReturn

from orchestrator.commandline import Command, check_mode_options, split_mode, typed_options
from orchestrator.errors import EXIT_RESUMABLE, SpecError, UsageError
from orchestrator.runtime.console import install_warning_format
from orchestrator.runtime.signals import STOP, Stopped, signal_name
from orchestrator.runtime.workdir import make_importable
from orchestrator.store import faults, storage

# orchestrator.spec (and with it torch and gymnasium) is imported only by the modes that check in this
# process: a ``train`` driver checks its spec in a child process (orchestrator/modes/spec_check.py).


def run_dev_mode(cmd: Command) -> int:
    """``dev``: one in-process session (``orchestrator.modes.dev``)."""
    from orchestrator.modes.dev import run_dev
    return run_dev(cmd)


def run_train_mode(cmd: Command) -> int:
    """``train`` / ``train@...`` (imports Ray only when needed; ``train`` checks its spec, preflight and
    ``agent.net.init_from`` included, in ``orchestrator.modes.spec_check`` while Ray starts)."""
    if cmd.pbt_replay is not None or cmd.trial is not None:
        from orchestrator.modes.pbt_replay import run_replay
        return run_replay(cmd)
    checked = None
    if cmd.word == "train" and not cmd.name:  # the check's child process starts before this process imports Ray
        from orchestrator.modes import spec_check
        checked = spec_check.start(spec_check.request_of(cmd))
    from orchestrator.modes.train import run_train
    return run_train(cmd, checked)


def run_search_mode(cmd: Command) -> int:
    """``search`` / ``search@...`` (imports Ray Tune only when needed)."""
    from orchestrator.modes.search import run_search
    return run_search(cmd)


def run_enjoy_mode(cmd: Command) -> int:
    """``enjoy@{session_spec_file}``: evaluate a trained session (see ``orchestrator.modes.enjoy``)."""
    from orchestrator.modes.enjoy import run_enjoy
    return run_enjoy(cmd)


@dataclass(frozen=True)
class Mode:
    """One row of the mode table ``MODES``.

    Fields:
        name: the mode, the mode word before any ``@``.
        takes_target: whether ``{name}@{target}`` is a mode word (``dev@x`` is not).
        forms: ``(word, one-line help)`` of each way to write it, for ``--help`` and the reference.
        run: runs the mode with the parsed command; returns the exit code.
        resumable: a stop leaves it resumable (exit 75); False: Ctrl-C is 130, as in Python.
        named: takes ``--name RUN`` (without a target).
        preflight: the CLI runs ``modes.common.preflight`` before it (False: the mode checks its spec itself).
    """

    name: str
    takes_target: bool
    forms: tuple[tuple[str, str], ...]
    run: Callable[[Command], int]
    resumable: bool = True
    named: bool = False
    preflight: bool = True


MODES: tuple[Mode, ...] = (
    Mode("dev", False, (("dev", "one session in-process with live progress, outputs in a new predir"),),
         run_dev_mode, resumable=False),
    Mode("train", True, (
        ("train", "meta.max_session sessions as Ray actors, checkpointed (--name RUN: in DATA_DIR/RUN, resumed by "
                  "the same command)"),
        ("train@latest", "resume the newest run of SPEC_NAME in --data-dir"),
        ("train@PREDIR", "resume that run (path or URI)")), run_train_mode, named=True, preflight=False),
    Mode("search", True, (
        ("search", "Ray Tune search over the spec's search section (--name RUN: as train)"),
        ("search@latest", "resume the newest search of SPEC_NAME"),
        ("search@PREDIR", "resume that search (path or URI)")), run_search_mode, named=True),
    Mode("enjoy", True, (
        ("enjoy@SESSION_SPEC", "replay a session's best checkpoint (SESSION_SPEC: a run's "
                               "{spec_name}_t{T}_s{S}_spec.json)"),
        ("enjoy@SESSION_SPEC@latest", "the same with its newest checkpoint")), run_enjoy_mode, resumable=False),
)


def mode_of(cmd: Command) -> Mode | None:
    """The row of ``MODES`` for ``cmd``'s mode, or None."""
    return next((row for row in MODES if row.name == cmd.mode), None)


def mode_words() -> list[str]:
    """Every way to write a mode, in table order (``dev``, ``train``, ``train@latest``, ...)."""
    return [word for row in MODES for word, _ in row.forms]


HELP_WIDTH = 100  # columns of --help's lists of modes and commands


def help_rows(rows: list[tuple[str, str]], column: int) -> list[str]:
    """``  WORD  help`` lines, the help from ``column`` on and wrapped at ``HELP_WIDTH`` (a word too long for its
    column on a line of its own)."""
    out = []
    for word, text in rows:
        lines = textwrap.wrap(text, HELP_WIDTH - column)
        out += [f"  {word}"] if len(word) + 3 > column else [f"  {word:<{column - 2}}{lines.pop(0)}"]
        out += [" " * column + line for line in lines]
    return out


def modes_help() -> str:
    """The list of modes (from ``MODES``) and of the other commands (from ``SUBCOMMANDS``) that ``--help`` prints
    after the options."""
    return "\n".join(["modes:", *help_rows([form for row in MODES for form in row.forms], 23), "",
                      "other commands (no spec):",
                      *help_rows([("lab SPEC_FILE", "list the spec names in a spec file"),
                                  *((f"lab {sub.usage}", sub.help) for sub in SUBCOMMANDS)], 28), "",
                      "example:", "  lab specs/demo.json ppo_cartpole dev"]) + "\n"


def package_version() -> str:
    """The installed version of rl-trial-lab ("unknown" when it is not installed)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("rl-trial-lab")
    except PackageNotFoundError:
        return "unknown"


def parse(argv: list[str] | None) -> Command:
    """Parse ``lab SPEC_FILE SPEC_NAME MODE [options]`` once into the command the mode runs (its mode word split at
    its first ``@``, ``commandline.split_mode``; its data dir absolute: actors may run in another working directory).

    Returns:
        The command. argparse exits 2 on malformed options, 0 after ``--help``/``--version``.
    """
    options = vars(build_parser().parse_args(argv))  # one field of Command per option
    word = options.pop("mode")
    mode, target = split_mode(word)
    return Command(**{**options, "word": word, "mode": mode, "target": target,
                      "overrides": tuple(options["overrides"]), "data_dir": storage.absolute(options["data_dir"])})


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``lab SPEC_FILE SPEC_NAME MODE [options]`` (docs/reference/cli.md is generated from it)."""
    commands = ",".join(sub.name for sub in SUBCOMMANDS)
    parser = argparse.ArgumentParser(
        prog="lab", usage=f"lab SPEC_FILE SPEC_NAME MODE [options]\n       lab {{{commands}}} ...",
        description="Spec-driven deep RL trials on Ray, checkpointed and resumable.",
        epilog=modes_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"lab (rl-trial-lab) {package_version()}")
    parser.add_argument("spec_file", help="spec file (JSON or YAML), path or URI")
    parser.add_argument("spec_name", help="name of the spec inside the file")
    parser.add_argument("mode", help=f"one of: {', '.join(mode_words())}")
    parser.add_argument("-s", "--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                        help="override a spec leaf, e.g. -s env.max_frame=20000 (repeatable)")
    parser.add_argument("--data-dir", default="data", help="root of run directories: path, file://, s3:// or gs://")
    parser.add_argument("--address", default=None, help="Ray cluster address (default: RAY_ADDRESS or a local Ray)")
    parser.add_argument("--dashboard", action="store_true",
                        help="with a local Ray: start the Ray dashboard too (needs the cluster extra, ray[default])")
    parser.add_argument("--max-concurrent-trials", type=int, default=None, metavar="N",
                        help="search: at most N trials at once (default: as many as resources allow)")
    parser.add_argument("--search-alg", choices=("auto", "basic", "optuna"), default="auto",
                        help="search: Tune's built-in generator (basic), Optuna, or auto (Optuna when "
                             "installed and the space has no grid_search/normal)")
    parser.add_argument("--name", default=None, metavar="RUN",
                        help="train/search: run in DATA_DIR/RUN; if it holds a run of this spec, resume it "
                             "(a complete run: exit 0, unchanged), so the same command continues after any "
                             "interruption")
    parser.add_argument("--allow-fresh", action="store_true",
                        help="on train@, start sessions that have no committed checkpoint from frame 0")
    parser.add_argument("--quiet", action="store_true", help="no live progress display")
    replay = parser.add_argument_group("train --pbt-replay options")
    replay.add_argument("--pbt-replay", default=None, metavar="PREDIR",
                        help="train: train one trial of a finished PBT search from scratch through its recorded "
                             "schedule and check it against the original (with --trial)")
    replay.add_argument("--trial", type=int, default=None, metavar="T", help="the PBT trial to replay")
    enjoy = parser.add_argument_group("enjoy@ options")
    enjoy.add_argument("--episodes", type=int, default=None, help="evaluation episodes (default 10)")
    enjoy.add_argument("--seed", type=int, default=None,
                       help="env and action seed (default: the session seed)")
    enjoy.add_argument("--ckpt", choices=("best", "latest"), default=None,
                       help="checkpoint to load: best total_reward_ma (default) or latest")
    enjoy.add_argument("--render", action="store_true", help="show the env (where a display exists)")
    enjoy.add_argument("--record", action="store_true", help="write an MP4 per episode (needs moviepy)")
    return parser


def is_mode_word(word: str) -> bool:
    """True if ``word`` is a mode (``train``, ``train@latest``, ``enjoy@...``) rather than a file or name."""
    return split_mode(word)[0] in {row.name for row in MODES}


def order_hint(cmd: Command) -> str:
    """A hint when a mode word was given before the spec file or name ('' otherwise)."""
    words = [cmd.spec_file, cmd.spec_name, cmd.word]
    if not any(is_mode_word(w) for w in words[:2]):
        return ""
    mode = next(w for w in words if is_mode_word(w))
    rest = [w for w in words if w != mode]
    options = typed_options(list(cmd.overrides), cmd.data_dir)
    return (f"; arguments go in the order SPEC_FILE SPEC_NAME MODE: did you mean "
            f"'{shlex.join(['lab', *rest, mode, *options])}'?")


def mode_hint(cmd: Command) -> str:
    """``"; did you mean 'train'?"`` for a mistyped mode (``trian``, ``trian@latest``; ``difflib``), else ''."""
    close = difflib.get_close_matches(cmd.mode, [row.name for row in MODES], n=1)
    at = "" if cmd.target is None else f"@{cmd.target}"
    return f"; did you mean '{close[0]}{at}'?" if close else ""


def dispatch(cmd: Command) -> int:
    """Run the mode of ``cmd`` (its row of ``MODES``), after its preflight check.

    Returns:
        The mode's exit code.

    Raises:
        SpecError, UsageError, storage.StorageError: bad input.
    """
    if is_mode_word(cmd.spec_file) and not os.path.exists(cmd.spec_file):
        raise UsageError(f"'{cmd.spec_file}' is a mode, not a spec file" + order_hint(cmd))
    row = mode_of(cmd)
    if row is None or (cmd.target is not None and not row.takes_target):
        raise UsageError(f"unknown mode '{cmd.word}'; expected one of: {', '.join(mode_words())}"
                         + (order_hint(cmd) or mode_hint(cmd)))
    if cmd.name is not None:
        if not row.named or cmd.target is not None:
            named = " and ".join(r.name for r in MODES if r.named)
            raise UsageError(f"--name applies to the modes {named}, not '{cmd.word}'")
        from orchestrator.store.predir import named_predir
        named_predir(cmd.data_dir, cmd.name)  # a bad name exits 2 before anything starts
    check_mode_options(cmd)
    faults.check_settings()  # LAB_STORAGE_ATTEMPTS, LAB_STORAGE_RETRY_WAIT_S
    if row.preflight:  # train, train@: in orchestrator.modes.spec_check, while Ray starts
        from orchestrator.modes.common import preflight
        preflight(cmd)  # env dependencies and memory sizes, before any run dir or actor exists
    return row.run(cmd)


def fail(message: str) -> NoReturn:
    """Print a one-paragraph error and exit with code 2."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def run_analyze(args: argparse.Namespace) -> int:
    """``lab analyze PREDIR``: recompute a run's metrics and graphs from its committed data.

    Returns:
        0. Raises UsageError: not a run directory.
    """
    from orchestrator.report.analysis import analyze_command
    return analyze_command(args.predir)


def run_ls(args: argparse.Namespace) -> int:
    """``lab ls [--data-dir URI]``: list runs with status, frames, best return and resumability.

    Returns:
        0 (also when the data dir holds no run).
    """
    from orchestrator.report.runs import ls_command
    return ls_command(args.data_dir)


def run_compare(args: argparse.Namespace) -> int:
    """``lab compare PREDIR_OR_TRIAL ... [--out PATH]``: one PNG and HTML graph (orchestrator/report/compare.py)."""
    from orchestrator.report.compare import compare_command
    return compare_command(args.sources, args.out)


def analyze_parser() -> argparse.ArgumentParser:
    """The parser of ``lab analyze PREDIR``."""
    parser = argparse.ArgumentParser(
        prog="lab analyze", description="Recompute a run's metrics and graphs from its committed data, "
        "and print them.")
    parser.add_argument("predir", help="run directory, path or URI")
    return parser


def ls_parser() -> argparse.ArgumentParser:
    """The parser of ``lab ls [--data-dir URI]``."""
    parser = argparse.ArgumentParser(
        prog="lab ls", description="List the runs of a data dir, oldest first: per run its spec, max_frame, "
        "best total_reward_ma and whether train@PREDIR can resume it; per session its status, committed "
        "frame and best score.")
    parser.add_argument("--data-dir", default="data", help="root of run directories: path, file://, s3:// or gs://")
    return parser


def compare_parser() -> argparse.ArgumentParser:
    """The parser of ``lab compare PREDIR_OR_TRIAL ... [--out PATH]``."""
    parser = argparse.ArgumentParser(
        prog="lab compare", description="One graph of several runs or trials: the IQM of total_reward_ma "
        "across sessions vs frames with its 95% bootstrap CI, one colour each, the reward threshold marked.")
    parser.add_argument("sources", nargs="+", metavar="PREDIR_OR_TRIAL",
                        help="run directory (each trial a curve) or {predir}/t{T}; path or URI")
    parser.add_argument("--out", default=None, metavar="PATH",
                        help="output path: PATH.png and PATH.html, or as given when it ends in .png or "
                             ".html (default: compare_{timestamp} here)")
    return parser


@dataclass(frozen=True)
class Subcommand:
    """One row of ``SUBCOMMANDS``: a first argument that is a command of its own, not a SPEC_FILE.

    Fields: ``name``; ``usage`` (after ``lab``) and ``help`` (one line) for ``--help`` and the reference; ``parser``
    (makes its argparse parser); ``run`` (runs it with the parsed arguments, returns the exit code).
    """

    name: str
    usage: str
    help: str
    parser: Callable[[], argparse.ArgumentParser]
    run: Callable[[argparse.Namespace], int]


SUBCOMMANDS: tuple[Subcommand, ...] = (
    Subcommand("ls", "ls [--data-dir URI]", "list runs: status per session, frames, best return, resumable",
               ls_parser, run_ls),
    Subcommand("analyze", "analyze PREDIR", "recompute a run's metrics and graphs from its committed data",
               analyze_parser, run_analyze),
    Subcommand("compare", "compare PREDIR_OR_TRIAL ... [--out PATH]",
               "one graph of runs/trials: IQM of total_reward_ma and its 95% CI", compare_parser, run_compare),
)


def run_subcommand(argv: list[str]) -> int:
    """Run ``lab ls ...`` / ``lab analyze ...`` / ``lab compare ...``; bad input exits 2 with one message."""
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    install_warning_format()
    sub = next(s for s in SUBCOMMANDS if s.name == argv[0])
    try:
        return sub.run(sub.parser().parse_args(argv[1:]))
    except (UsageError, storage.StorageError) as err:
        fail(str(err))


def list_specs(spec_file: str) -> int:
    """``lab SPEC_FILE``: print the spec names in the file, one a line, and how to run one.

    Returns:
        0; a file that cannot be read exits 2 with one message (a near file name suggested).
    """
    from orchestrator.spec.files import spec_names
    try:
        names = spec_names(spec_file)
    except SpecError as err:
        fail("; ".join(err.problems))
    print(f"specs in {spec_file}:")
    print("\n".join(f"  {name}" for name in names))
    print(f"run one: lab {shlex.quote(spec_file)} SPEC_NAME MODE (e.g. dev, train; lab --help lists the modes)")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``lab`` and ``run_lab.py``; returns the exit code.

    A run mode (``SPEC_FILE SPEC_NAME MODE``) runs under the lab's stop handler from its first line to its last
    (``orchestrator.runtime.signals``: SIGTERM, SIGINT, SIGUSR1 end it with exit 75, resumable, or 0 when the work
    was complete; ``dev``: 130). Called in-process (``argv`` given), the handlers in place before come back at the
    end; as the ``lab`` command (``entry``) they stay for the exit. The working directory is made importable first,
    as with ``python -m`` (``orchestrator.runtime.workdir``).
    """
    in_process = argv is not None
    argv = list(sys.argv[1:] if argv is None else argv)
    try:  # a module of the working directory (env.name=myenvs:MyCart-v0) imports here and in every child
        make_importable()
    except UsageError as err:
        fail(str(err))
    if argv and argv[0] in {s.name for s in SUBCOMMANDS}:
        return run_subcommand(argv)
    if len(argv) == 1 and not argv[0].startswith("-"):
        return list_specs(argv[0])
    with STOP.command(keep=not in_process):
        try:
            return run_mode(argv)
        except Stopped as stop:  # a stop where nothing trained: spec check, Ray start, lease wait, verification
            STOP.end_children()
            print(f"{signal_name(stop.signum)}: stopped before any session started; nothing is lost. Resume with:\n  "
                  + (STOP.resume_command or "the same command"), file=sys.stderr, flush=True)
            return EXIT_RESUMABLE


def run_mode(argv: list[str]) -> int:
    """``lab SPEC_FILE SPEC_NAME MODE [options]`` under the stop handler; returns the exit code (see ``main``)."""
    cmd = parse(argv)
    row = mode_of(cmd)
    if row is not None and not row.resumable:  # nothing to resume: Ctrl-C is 130, as in Python
        STOP.install(leave_code=130, dev=True)
    elif cmd.name:  # a --name run is resumed by the command the user typed
        STOP.resume_command = shlex.join(["lab", *argv])
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    install_warning_format()
    try:
        return dispatch(cmd)
    except SpecError as err:
        fail(f"invalid spec '{cmd.spec_name}' in {cmd.spec_file}:\n  " + "\n  ".join(err.problems))
    except UsageError as err:
        fail(str(err))
    except storage.StorageError as err:
        if err.hint is None:
            fail(str(err))
        print(f"error: storage fault: {err}\n  {err.hint}, then run the same command", file=sys.stderr)
        return EXIT_RESUMABLE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def entry() -> NoReturn:
    """The ``lab`` command and ``run_lab.py``: ``main``, ``ray.shutdown`` (when main started or joined a Ray),
    the exit handlers, a flush of stdout/stderr, then ``os._exit`` with main's code.

    This skips only the interpreter's final teardown (finalizing every module: pandas, matplotlib, plotly,
    Ray; ~1 s on 2 busy cores, docs/BENCHMARKS.md "Start-up and exit"); everything the lab writes is written
    before ``main`` returns, and the ``atexit`` handlers (Ray's, tracking libraries') still run. An exception
    other than ``SystemExit`` leaves as usual (traceback and normal exit).
    """
    import atexit

    try:
        code: Any = main()
    except SystemExit as exc:
        code = exc.code
    if code is not None and not isinstance(code, int):  # sys.exit("message"): Python prints it, exits 1
        print(code, file=sys.stderr)
        code = 1
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        import gc

        # actor handles left in reference cycles are freed now, while Ray is up: one collected after the shutdown
        # makes Ray's core worker end the process with exit code 1 (seen after a storage fault's clean stop)
        gc.collect()
        # Ray's exit handler first sleeps 0.5 s so that forwarded worker logs finish printing; the lab's drivers
        # forward none (log_to_driver=False), so it shuts Ray down itself (the handler then has nothing to do)
        ray.shutdown()
        gc.disable()  # nothing is collected between the shutdown and os._exit
    atexit._run_exitfuncs()  # CPython's own exit handlers: what a normal exit runs before the teardown
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


if __doc__:  # the mode and command lists of this docstring come from the tables (absent under python -OO)
    __doc__ = __doc__.replace("<MODES>", modes_help().rstrip())

if __name__ == "__main__":
    entry()
