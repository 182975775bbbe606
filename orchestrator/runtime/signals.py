"""The one stop handler of the lab's processes: what SIGTERM, SIGINT and SIGUSR1 do, from the first line of
``orchestrator.cli.main`` to the last, in every mode (``train``, ``search`` with Tune or PBT, ``dev``).

The contract (summarized with the exit codes at the top of docs/reference/cli.md):

- **A stop request.** The first of SIGTERM, SIGINT or SIGUSR1 (SLURM's ``--signal=B:USR1@N``) asks the driver to
  stop. While work that commits is running (a ``Trial``'s sessions, a PBT population, a Tune ``fit``), the stop is
  handed to that work's **target** (``STOP.target``): its sessions commit a final checkpoint within
  ``meta.shutdown_grace_s`` and the mode returns ``EXIT_RESUMABLE`` (75), or 0 when the work was already complete
  (the signal came during the final analysis, or once the work had returned: ``work_ended``). Anywhere else
  (spec check, Ray start, lease wait, checkpoint verification) nothing is being trained, so there is nothing to
  commit: the handler raises ``Stopped`` in the main thread, which unwinds (leases released, the spec-check child
  ended by ``end_children``) to
  ``orchestrator.cli.main``, which prints one line and returns 75. Short writes that must be all or nothing run
  under ``STOP.deferred()``: a stop that arrives inside raises ``Stopped`` at its end.
- **The same request again.** SLURM and Kubernetes signal every process of a job, a batch script's trap may add
  its own: a repeated SIGTERM or SIGUSR1 (or any signal after the first, but SIGINT) is the same request and
  changes nothing.
- **Leave at once.** Only a second SIGINT (Ctrl-C pressed again at a terminal) leaves at once: the children the
  driver started are ended, and the process exits 75 at once (the committed checkpoints are resumable; a
  session's final checkpoint under way is not committed, manifest-last, and is ignored by the resume).
- **dev** (``install(leave_code=130)``): one in-process session without checkpoints: the first signal raises
  ``KeyboardInterrupt`` in the main thread (exit 130, as documented), the dev run keeps what it wrote.

Ray's ``ray.init`` installs its own SIGTERM handler (``sys.exit(15)``); ``ray_init_guard`` keeps the lab's in
force during and after it (a stop during the start is acted on once Ray is up, so the exit shuts down what
started). Tune's ``fit`` installs its own SIGUSR1 (and SIGINT) handler; its stop is reached through the target of
``orchestrator.search.tune.StopSignalRelay``.

Test hook: ``pause_point(phase)`` (env ``LAB_TEST_PAUSE_AT=<phase>``) makes the process that reaches ``phase``
write ``<phase> <pid>`` to the file ``$LAB_TEST_PAUSE_FILE`` (when set) and sleep (up to ``LAB_TEST_PAUSE_S``, 600 s
by default), so a test can signal it in that phase; without the variable it does nothing. Phases:
``spec_check`` (the driver waits for its spec check; the spec-check child holds too), ``ray_start`` (Ray just
started), ``verify`` (a resumed train is about to verify a session's checkpoints), ``analysis`` (the final analysis
of a train or search is next).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from orchestrator.errors import EXIT_RESUMABLE

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


class Stopped(BaseException):
    """Raised in the main thread by the stop handler where nothing needs committing; ``orchestrator.cli.main``
    turns it into exit 75. A ``BaseException`` (like ``KeyboardInterrupt``) so ``except Exception`` lets it
    through."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal_name(signum))


def signal_name(signum: int) -> str:
    """``SIGTERM`` for 15 (the number as text for a signal Python does not name)."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


class StopHandler:
    """The process's stop state and its signal handler (one instance: ``STOP``).

    Attributes:
        signum: the first stop signal received (None: no stop asked).
        leave_code: exit code of a "leave at once" (75; dev: 130).
        resume_command: the command that resumes the run, as the user typed it (``--name`` runs); None: the
            mode prints its own (``train@PREDIR``).
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self.leave_code = EXIT_RESUMABLE
        self.resume_command: str | None = None
        self.installed = False
        self.dev = False
        self.targets: list[Callable[[int], str]] = []
        self.deferring = 0
        self.children: list[subprocess.Popen] = []
        self.work_ended = False  # the outermost target's work returned: what follows only finishes (0 or 75)

    # ---------------------------------------------------------------- installing
    def install(self, leave_code: int = EXIT_RESUMABLE, dev: bool = False) -> None:
        """Install the handler for SIGINT, SIGTERM and SIGUSR1 (main thread only; elsewhere a no-op: Python allows
        handlers only there). ``dev``: a first signal raises ``KeyboardInterrupt`` (exit ``leave_code``, 130)."""
        if threading.current_thread() is not threading.main_thread():
            return
        self.leave_code, self.dev, self.installed = leave_code, dev, True
        self.reinstall()

    def reinstall(self) -> None:
        """Put the handler back (after a library replaced it: ``ray.init``, Tune); a no-op unless installed."""
        if self.installed and threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                signal.signal(sig, self.handle)

    @contextmanager
    def command(self, keep: bool = False) -> Iterator[None]:
        """``install`` for one command. ``keep`` (the ``lab`` command, which exits next): the handler stays, and a
        stop signal from the end on changes nothing (``closing``). Else (the lab called in-process: a test, a
        notebook) the handlers in place before come back at the end and the stop state is forgotten."""
        in_main = threading.current_thread() is threading.main_thread()
        previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} if in_main else {}
        self.install()
        try:
            yield
        finally:
            if keep:
                self.closing()
            else:
                for sig, handler in previous.items():
                    signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
                self.__init__()  # type: ignore[misc]

    def closing(self) -> None:
        """The command has ended and the process is exiting (``orchestrator.cli.entry``: Ray's shutdown): a stop
        signal changes nothing now (a second Ctrl-C still leaves at once)."""
        self.dev, self.deferring = False, 0
        self.targets = [lambda signum: "the command has ended; exiting"]
        self.reinstall()

    # ---------------------------------------------------------------- the handler
    @property
    def requested(self) -> bool:
        """Whether a stop was asked."""
        return self.signum is not None

    def handle(self, signum: int, frame: Any) -> None:
        """The signal handler (runs in the main thread between two bytecodes). See the module docstring."""
        name = signal_name(signum)
        if self.signum is not None:
            if signum == signal.SIGINT:
                self.leave_at_once(name)
            say(f"{name}: already stopping (the same stop request; Ctrl-C twice leaves at once)")
            return
        self.signum = signum
        if self.dev:
            raise KeyboardInterrupt
        if self.targets:
            lines = [stop(signum) for stop in list(self.targets)]  # outermost first (a population, then its trial)
            say(f"\n{name}: {lines[-1]}")
            return
        if self.deferring or self.work_ended:
            say(f"\n{name}: " + ("the work has ended; finishing" if self.work_ended else "stopping")
                + " (Ctrl-C twice leaves at once)")
            return
        raise Stopped(signum)

    def leave_at_once(self, name: str) -> None:
        """A second Ctrl-C: SIGKILL every process below this one (the spec check, a local Ray's processes and its
        session actors: none is left behind), print why, exit ``leave_code`` now (``os._exit``, no cleanup)."""
        kill_descendants()
        self.children = []
        say(f"{name} again: leaving at once; every committed checkpoint stays resumable"
            + (f": {self.resume_command}" if self.resume_command else " (run the same command again)"))
        os._exit(self.leave_code)

    def check(self) -> None:
        """Raise ``Stopped`` when a stop was asked and no target takes it (a phase boundary)."""
        if self.signum is not None and not self.targets and not self.deferring and not self.work_ended:
            raise Stopped(self.signum)

    # ---------------------------------------------------------------- phases
    @contextmanager
    def target(self, stop: Callable[[int], str]) -> Iterator[None]:
        """While the block runs, a stop request goes to ``stop(signum)`` (it asks the work to stop and returns the
        line to print, e.g. ``committing final checkpoints (up to 30 s)``) instead of raising ``Stopped``. A stop
        asked before the block (within ``deferred``) is handed over at once. Nests: every target gets the stop,
        outermost first; the innermost's line is printed. Once the outermost block has returned, the work is done
        and a first stop only lets the command finish (its summary, the release of its lease)."""
        self.targets.append(stop)
        try:
            if self.signum is not None:
                stop(self.signum)
            yield
            self.work_ended = self.work_ended or len(self.targets) == 1
        finally:
            self.targets.remove(stop)

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """A short section that must not be cut (files written together): a stop asked inside raises ``Stopped``
        at its end instead."""
        self.deferring += 1
        try:
            yield
        finally:
            self.deferring -= 1
        self.check()

    # ---------------------------------------------------------------- children
    def adopt(self, child: subprocess.Popen) -> None:
        """A child process the driver started (the spec check): ended by ``end_children`` on a stop."""
        self.children = [c for c in self.children if c.poll() is None] + [child]

    def end_children(self, grace_s: float = 5.0) -> None:
        """SIGTERM each adopted child still running, wait up to ``grace_s`` seconds, then SIGKILL what is left."""
        alive = [c for c in self.children if c.poll() is None]
        for child in alive:
            try:
                child.terminate()
            except OSError:
                pass
        deadline = time.monotonic() + grace_s
        for child in alive:
            try:
                child.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        self.children = []


STOP = StopHandler()


def kill_descendants() -> None:
    """SIGKILL every process below this one (read from ``/proc``; elsewhere only the adopted children)."""
    children: dict[int, list[int]] = {}
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        STOP.end_children(grace_s=0.0)
        return
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    todo, below = [os.getpid()], []
    while todo:
        for child in children.get(todo.pop(), []):
            below.append(child)
            todo.append(child)
    for pid in below:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def say(line: str) -> None:
    """Print a line on stderr from a signal handler (a closed stderr is ignored)."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


@contextmanager
def ray_init_guard() -> Iterator[None]:
    """Around ``ray.init``: Ray's SIGTERM handler (``sys.exit(15)``, set at the start of ``ray.init``) is not
    installed, so the lab's stays in force during the start, and it is put back after it."""
    import ray._private.utils as ray_utils

    original = ray_utils.set_sigterm_handler
    if STOP.installed:
        ray_utils.set_sigterm_handler = lambda handler: None
    try:
        with STOP.deferred():  # a stop during the start is acted on once Ray is up (and shut down by the exit)
            yield
    finally:
        ray_utils.set_sigterm_handler = original
        STOP.reinstall()


def quiet_child() -> None:
    """In a child process of a driver (the spec check, started in a session of its own): SIGINT, SIGTERM and SIGUSR1
    end it at once and quietly (exit 128 + signal; SLURM signals every process of the job; the driver ends the child
    itself, ``StopHandler.end_children``), and so does its parent's end."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda signum, frame: os._exit(128 + signum))
    if sys.platform.startswith("linux"):  # ended with its parent, even a parent killed by SIGKILL
        try:
            import ctypes
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def pause_point(phase: str, marker: bool = True) -> None:
    """Test hook (module docstring): with ``LAB_TEST_PAUSE_AT=phase``, write the marker (``marker``) and sleep.

    Args:
        phase: the phase name (``spec_check``, ``ray_start``, ``verify``, ``analysis``).
        marker: write ``phase pid`` to ``$LAB_TEST_PAUSE_FILE`` (the driver; a child holding too writes none).
    """
    if os.environ.get("LAB_TEST_PAUSE_AT") != phase:
        return
    path = os.environ.get("LAB_TEST_PAUSE_FILE")
    if marker and path:
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write(f"{phase} {os.getpid()}\n")
        os.replace(path + ".tmp", path)
    deadline = time.monotonic() + float(os.environ.get("LAB_TEST_PAUSE_S", "600"))
    while time.monotonic() < deadline and STOP.signum is None:  # a stop taken by a target ends the pause
        time.sleep(0.05)
