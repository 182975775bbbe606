"""Command line: ``lab SPEC_FILE SPEC_NAME MODE [options]`` (also ``python run_lab.py ...``).

Modes:
  dev                 one session in-process with live progress, outputs (with metrics, graphs and
                      a run.json saying "mode": "dev") in a new predir; never resumable
  train               ``meta.max_session`` sessions as Ray actors, checkpointed
  train --name RUN    the same in ``{data_dir}/RUN``; run again, it resumes that run (a complete run: exit 0,
                      nothing changed), so a scheduler can re-run the same command after any interruption
  train@latest        resume the newest run of SPEC_NAME in ``--data-dir``
  train@{predir}      resume that run (path or URI)
  search              Ray Tune search over the spec's ``search`` section: ``meta.max_trial`` samples,
                      each a trial of ``meta.max_session`` sessions (see orchestrator/modes/search.py)
  search@latest       resume the newest search of SPEC_NAME; search@{predir}: resume that search
  search --name RUN   a search in ``{data_dir}/RUN``, resumed when run again
  enjoy@{session_spec_file}[@latest]
                      replay a session's best (or newest) checkpoint: --episodes, --seed, --ckpt,
                      --render, --record; outputs only under {predir}/enjoy/

Other commands (handled before the SPEC_FILE SPEC_NAME MODE form):
  lab analyze PREDIR          recompute metrics and graphs of a run from its committed data
  lab ls [--data-dir URI]     list runs: status per session, frames, best return, resumable
  lab compare PREDIR_OR_TRIAL ... [--out PATH]
                              one graph (PNG + HTML) of several runs or trials: IQM and 95% CI

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
import warnings
from typing import Any, NoReturn

from orchestrator.commandline import typed_options
from orchestrator.errors import EXIT_RESUMABLE, SpecError, UsageError
from orchestrator.modes.dev import run_dev
from orchestrator.runtime.console import install_warning_format
from orchestrator.runtime.signals import STOP, Stopped, signal_name
from orchestrator.runtime.workdir import make_importable
from orchestrator.store import storage

# orchestrator.spec (and with it torch and gymnasium) is imported only by the modes that check in this
# process: a ``train`` driver checks its spec in a child process (orchestrator/modes/spec_check.py).

MODES = ("dev", "train", "train@latest", "train@{predir}", "search", "search@latest", "search@{predir}",
         "enjoy@{session_spec_file}[@latest]")


COMMANDS_HELP = """modes:
  dev                  one session in-process with live progress, outputs in a new predir
  train                meta.max_session sessions as Ray actors, checkpointed
                       (--name RUN: in DATA_DIR/RUN, resumed by the same command)
  train@latest         resume the newest run of SPEC_NAME in --data-dir
  train@PREDIR         resume that run (path or URI)
  search               Ray Tune search over the spec's search section
  search@latest        resume the newest search of SPEC_NAME (search@PREDIR: that search)
  enjoy@SESSION_SPEC   replay a session's best checkpoint (SESSION_SPEC@latest: its newest)

other commands (no spec):
  lab SPEC_FILE             list the spec names in a spec file
  lab ls [--data-dir URI]   list runs: status per session, frames, best return, resumable
  lab analyze PREDIR        recompute a run's metrics and graphs from its committed data
  lab compare PREDIR_OR_TRIAL ... [--out PATH]
                            one graph of runs/trials: IQM of total_reward_ma and its 95% CI

example:
  lab specs/demo.json ppo_cartpole dev
"""


def package_version() -> str:
    """The installed version of rl-trial-lab ("unknown" when it is not installed)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("rl-trial-lab")
    except PackageNotFoundError:
        return "unknown"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse the command line.

    Returns:
        The parsed arguments. argparse exits 2 on malformed options, 0 after ``--help``/``--version``.
    """
    return build_parser().parse_args(argv)


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``lab SPEC_FILE SPEC_NAME MODE [options]`` (docs/reference/cli.md is generated from it)."""
    parser = argparse.ArgumentParser(
        prog="lab", usage="lab SPEC_FILE SPEC_NAME MODE [options]\n       lab {ls,analyze,compare} ...",
        description="Spec-driven deep RL trials on Ray, checkpointed and resumable.",
        epilog=COMMANDS_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"lab (rl-trial-lab) {package_version()}")
    parser.add_argument("spec_file", help="spec file (JSON or YAML), path or URI")
    parser.add_argument("spec_name", help="name of the spec inside the file")
    parser.add_argument("mode", help=f"one of: {', '.join(MODES)}")
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
    enjoy.add_argument("--episodes", type=int, default=10, help="evaluation episodes (default 10)")
    enjoy.add_argument("--seed", type=int, default=None,
                       help="env and action seed (default: the session seed)")
    enjoy.add_argument("--ckpt", choices=("best", "latest"), default=None,
                       help="checkpoint to load: best total_reward_ma (default) or latest")
    enjoy.add_argument("--render", action="store_true", help="show the env (where a display exists)")
    enjoy.add_argument("--record", action="store_true", help="write an MP4 per episode (needs moviepy)")
    return parser


def run_search_mode(args: argparse.Namespace) -> int:
    """``search`` / ``search@...`` (imports Ray Tune only when needed)."""
    from orchestrator.modes.search import run_search
    return run_search(args)


def run_train_mode(args: argparse.Namespace) -> int:
    """``train`` / ``train@...`` (imports Ray only when needed; ``train`` checks its spec, preflight and
    ``agent.net.init_from`` included, in ``orchestrator.modes.spec_check`` while Ray starts)."""
    if args.pbt_replay is not None or args.trial is not None:
        from orchestrator.modes.pbt_replay import run_replay
        return run_replay(args)
    checked = None
    if args.mode == "train" and not args.name:  # the check's child process starts before this process imports Ray
        from orchestrator.modes import spec_check
        checked = spec_check.start(spec_check.request_of(args))
    from orchestrator.modes.train import run_train
    return run_train(args, checked)


def run_enjoy_mode(args: argparse.Namespace) -> int:
    """``enjoy@{session_spec_file}``: evaluate a trained session (see ``orchestrator.modes.enjoy``)."""
    from orchestrator.modes.enjoy import run_enjoy
    return run_enjoy(args)


def run_dev_mode(args: argparse.Namespace) -> int:
    """``dev``: one in-process session."""
    from orchestrator.spec.load import load_spec
    spec = load_spec(args.spec_file, args.spec_name, args.overrides, search=False)
    return run_dev(spec, storage.absolute(args.data_dir), args.quiet)


# mode (the part before '@') -> handler; each handler parses its own '@' target from args.mode
MODE_HANDLERS = {
    "dev": run_dev_mode,
    "train": run_train_mode,
    "search": run_search_mode,
    "enjoy": run_enjoy_mode,
}


def is_mode_word(word: str) -> bool:
    """True if ``word`` is a mode (``train``, ``train@latest``, ``enjoy@...``) rather than a file or name."""
    return word.split("@", 1)[0] in MODE_HANDLERS


def order_hint(args: argparse.Namespace) -> str:
    """A hint when a mode word was given before the spec file or name ('' otherwise)."""
    words = [args.spec_file, args.spec_name, args.mode]
    if not any(is_mode_word(w) for w in words[:2]):
        return ""
    mode = next(w for w in words if is_mode_word(w))
    rest = [w for w in words if w != mode]
    options = typed_options(args.overrides, args.data_dir)
    return (f"; arguments go in the order SPEC_FILE SPEC_NAME MODE: did you mean "
            f"'{shlex.join(['lab', *rest, mode, *options])}'?")


def mode_hint(mode: str) -> str:
    """``"; did you mean 'train'?"`` for a mistyped mode (``trian``, ``trian@latest``; ``difflib``), else ''."""
    head, at, target = mode.partition("@")
    close = difflib.get_close_matches(head, list(MODE_HANDLERS), n=1)
    return f"; did you mean '{close[0]}{at}{target}'?" if close else ""


def dispatch(args: argparse.Namespace) -> int:
    """Run the mode.

    Returns:
        The mode's exit code.

    Raises:
        SpecError, UsageError, storage.StorageError: bad input.
    """
    if is_mode_word(args.spec_file) and not os.path.exists(args.spec_file):
        raise UsageError(f"'{args.spec_file}' is a mode, not a spec file" + order_hint(args))
    handler = MODE_HANDLERS.get(args.mode.split("@", 1)[0])
    if handler is None or (args.mode == "dev@" or args.mode.startswith("dev@")):
        raise UsageError(f"unknown mode '{args.mode}'; expected one of: {', '.join(MODES)}"
                         + (order_hint(args) or mode_hint(args.mode)))
    if args.name is not None:
        if args.mode not in ("train", "search"):
            raise UsageError(f"--name applies to the modes train and search, not '{args.mode}'")
        from orchestrator.store.predir import named_predir
        named_predir(args.data_dir, args.name)  # a bad name exits 2 before anything starts
    if args.mode.split("@", 1)[0] != "train":  # train, train@: in orchestrator.modes.spec_check, while Ray starts
        from orchestrator.spec.preflight import preflight
        preflight(args)  # env dependencies and memory sizes, before any run dir or actor exists
    return handler(args)


def fail(message: str) -> NoReturn:
    """Print a one-paragraph error and exit with code 2."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def run_analyze(argv: list[str]) -> int:
    """``lab analyze PREDIR``: recompute a run's metrics and graphs from its committed data.

    Returns:
        0. Raises UsageError: not a run directory.
    """
    args = analyze_parser().parse_args(argv)
    from orchestrator.report.analysis import analyze_command
    return analyze_command(args.predir)


def run_ls(argv: list[str]) -> int:
    """``lab ls [--data-dir URI]``: list runs with status, frames, best return and resumability.

    Returns:
        0 (also when the data dir holds no run).
    """
    args = ls_parser().parse_args(argv)
    from orchestrator.report.runs import ls_command
    return ls_command(args.data_dir)


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


def run_compare(argv: list[str]) -> int:
    """``lab compare PREDIR_OR_TRIAL ... [--out PATH]``: one PNG and HTML graph (orchestrator/report/compare.py)."""
    from orchestrator.report.compare import compare_command, parse_compare
    args = parse_compare(argv)
    return compare_command(args.sources, args.out)


# first arguments that are commands of their own, not a SPEC_FILE
SUBCOMMANDS = {"analyze": run_analyze, "ls": run_ls, "compare": run_compare}


def run_subcommand(argv: list[str]) -> int:
    """Run ``lab analyze ...`` / ``lab ls ...``; bad input exits 2 with one message."""
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    install_warning_format()
    try:
        return SUBCOMMANDS[argv[0]](argv[1:])
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
    if argv and argv[0] in SUBCOMMANDS:
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
    args = parse_args(argv)
    if args.mode == "dev" or args.mode.startswith("enjoy@"):  # nothing to resume: Ctrl-C is 130, as in Python
        STOP.install(leave_code=130, dev=True)
    elif args.name:  # a --name run is resumed by the command the user typed
        STOP.resume_command = shlex.join(["lab", *argv])
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    install_warning_format()
    try:
        return dispatch(args)
    except SpecError as err:
        fail(f"invalid spec '{args.spec_name}' in {args.spec_file}:\n  " + "\n  ".join(err.problems))
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


if __name__ == "__main__":
    entry()
