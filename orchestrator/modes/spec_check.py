"""The driver's spec check for ``train`` and ``train@``, out of the driver's process, while the driver starts Ray.

Checking a spec needs torch (optimizer, scheduler and net arguments are validated on torch objects,
``agents`` defines the sections' dataclasses) and gymnasium (``orchestrator.spec.preflight`` builds the env
once): about 220 MB of RSS and 2-4 s of imports (docs/BENCHMARKS.md "Process memory", "Start-up and
exit"). A ``train`` driver only plans sessions and watches them, so ``start`` runs the whole check
(``load_spec``, ``preflight.check_spec``, ``transfer.check_init_from``; for ``train@`` the merge into the
run's saved spec, ``spec.resume_spec``, instead of ``check_init_from``) in a short child process
(``python -c ... orchestrator.modes.spec_check``) and returns at once; the driver starts Ray meanwhile and
then takes the result. The child prints the checked spec (JSON) or the problem (``SpecError``,
``UsageError``, ``storage.StorageError``, raised again in the driver with the same message: exit 2, or 75 for a
storage fault of the machine, which keeps its hint; no traceback, before any run directory exists or a resumed run
is changed). Its other output goes to the
driver's stderr.

Where torch is already imported (the lab called in-process, e.g. by tests, or ``dev``), the check runs in
the calling process at once: nothing is saved by a child there, and the caller's ``sys.modules`` (a
package hidden by a test) is what the check sees.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

from orchestrator.commandline import Command
from orchestrator.errors import SpecError, UsageError
from orchestrator.runtime.console import install_warning_format
from orchestrator.runtime.signals import STOP, pause_point, quiet_child
from orchestrator.store import storage

ROOT = str(Path(__file__).resolve().parents[1])  # the directory holding the orchestrator package
RESULT_PREFIX = "SPEC_CHECK_RESULT "


def request_of(cmd: Command, overrides: list[str] | None = None, resume: str | None = None) -> dict[str, Any]:
    """The check's input for the command ``cmd`` (``orchestrator.cli.parse``); ``overrides``: the ``-s`` overrides
    to apply (default: ``cmd``'s; a resume's saved ones come first); ``resume``: the predir a ``train@`` resumes
    (resolved by the driver)."""
    return {"spec_file": cmd.spec_file, "spec_name": cmd.spec_name,
            "overrides": list(cmd.overrides if overrides is None else overrides), "mode": cmd.mode,
            "address": cmd.address, "max_concurrent_trials": cmd.max_concurrent_trials, "resume": resume}


def check_request(request: dict[str, Any]) -> dict[str, Any]:
    """Load, check and preflight the spec of ``request`` (see ``request_of``) in this process; for a resume,
    merge it into the run's saved spec (``orchestrator.spec.resume_spec``). ``agent.net.init_from`` is checked
    for a fresh ``train`` only (a resume never loads it again).

    Returns:
        ``{"spec": the checked flat spec}`` (a resume: the merged one, plus ``"applied"``: its edits as
        "key: old -> new", and ``"saved_sessions"``: the saved spec's ``meta.max_session``), as JSON would give
        it back (lists, not tuples).

    Raises:
        SpecError / UsageError / storage.StorageError: bad input, as ``orchestrator.cli`` reports it.
    """
    from orchestrator.session.transfer import check_init_from
    from orchestrator.spec.load import load_spec
    from orchestrator.spec.meta import MetaSpec
    from orchestrator.spec.preflight import check_spec
    from orchestrator.spec.resume import resume_spec

    spec = load_spec(request["spec_file"], request["spec_name"], request["overrides"],
                     search=request["mode"] == "search")
    mode = "dev" if request["address"] is not None else request["mode"]  # a cluster: one session here
    check_spec(spec, mode, request["max_concurrent_trials"])
    if request.get("resume") is None:
        check_init_from(spec)
        return json.loads(json.dumps({"spec": spec}))
    merged, applied, saved = resume_spec(request["resume"], spec)
    return json.loads(json.dumps({"spec": merged, "applied": applied,
                                  "saved_sessions": MetaSpec.of(saved).max_session}))


def start(request: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    """Start checking ``request``; returns the function that waits for ``check_request``'s answer.

    In a child process unless torch is already imported here (then at once: a bad spec raises now).

    Raises:
        SpecError / UsageError / storage.StorageError: from the returned function (from this one when the
            check runs here); RuntimeError: the child failed otherwise (its traceback is on stderr).
    """
    if "torch" in sys.modules:
        answer = check_request(request)
        return lambda: answer
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])}
    # its own session: a Ctrl-C at the terminal (or a signal to the driver's process group) reaches the driver only,
    # never this child's interpreter while it starts (where Python turns SIGINT into a fatal error with a traceback);
    # a stop of the driver ends it (orchestrator.runtime.signals), and it ends with its parent (quiet_child)
    proc = subprocess.Popen([sys.executable, "-c", "from orchestrator.modes.spec_check import main; main()",
                             json.dumps(request)], stdout=subprocess.PIPE, env=env, text=True, start_new_session=True)
    STOP.adopt(proc)
    pause_point("spec_check")

    def result() -> dict[str, Any]:
        out, _ = proc.communicate()
        line = next((x for x in reversed(out.splitlines()) if x.startswith(RESULT_PREFIX)), None)
        if line is None:
            STOP.check()  # the child ended by the signal that stops the driver (a terminal's Ctrl-C reaches both)
            raise RuntimeError(f"the spec check exited {proc.returncode} without a result (see its output above)")
        return decode(json.loads(line[len(RESULT_PREFIX):]))
    return result


def decode(answer: dict[str, Any]) -> dict[str, Any]:
    """A child's answer (``check_request``'s), or the child's error raised again."""
    kind = answer.get("error")
    if kind == "spec":
        raise SpecError(answer["problems"])
    if kind == "usage":
        raise UsageError(answer["message"])
    if kind == "storage":  # a fault of the machine keeps its hint (exit 75), bad input has none (exit 2)
        raise storage.StorageError(answer["message"], answer.get("uri", ""), hint=answer.get("hint"),
                                   transient=bool(answer.get("transient")))
    return answer


def main() -> None:
    """Child entry: ``sys.argv[1]`` is the request (JSON); prints one ``RESULT_PREFIX`` line on stdout.

    A stop signal ends it at once and quietly (``signals.quiet_child``), and so does a driver gone before the
    answer (no ``BrokenPipeError`` traceback)."""
    quiet_child()
    out, sys.stdout = sys.stdout, sys.stderr  # whatever the check prints goes to stderr
    pause_point("spec_check", marker=False)  # test hook: the child holds while its driver waits
    import warnings
    warnings.filterwarnings("ignore", category=DeprecationWarning)  # as orchestrator.cli.main
    install_warning_format()
    try:
        answer: dict[str, Any] = check_request(json.loads(sys.argv[1]))
    except SpecError as err:
        answer = {"error": "spec", "problems": err.problems}
    except UsageError as err:
        answer = {"error": "usage", "message": str(err)}
    except storage.StorageError as err:
        answer = {"error": "storage", "message": str(err), "uri": err.uri, "hint": err.hint,
                  "transient": err.transient}
    try:
        out.write(RESULT_PREFIX + json.dumps(answer) + "\n")
        out.flush()
    except BrokenPipeError:  # the driver is gone: nobody needs the answer
        os._exit(1)
