"""The ``dev`` mode: one session in-process with live progress; its outputs in a new predir that is never resumable."""

from __future__ import annotations

from typing import Any

from orchestrator.commandline import Command
from orchestrator.errors import SpecError, UsageError
from orchestrator.modes.common import draw_seed
from orchestrator.spec.meta import MetaSpec, set_meta
from orchestrator.store import storage
from orchestrator.store.predir import session_seed


def run_dev(cmd: Command) -> int:
    """``dev``: load ``cmd``'s spec and run it as one session in-process (``run_session``); returns the exit code.

    Raises:
        SpecError / UsageError: see ``run_session``; a spec that does not load.
    """
    from orchestrator.spec.load import load_spec

    spec = load_spec(cmd.spec_file, cmd.spec_name, list(cmd.overrides), search=False)
    return run_session(spec, cmd.data_dir, cmd.quiet)


def run_session(spec: dict[str, Any], data_dir: str, quiet: bool) -> int:
    """Run one session in-process through ``SessionRunner`` with checkpoints off; write specs, train_df/eval_df,
    log.txt, a ``run.json`` with ``"mode": "dev"`` (the marker that refuses ``train@``), metrics and graphs into a
    new predir, and print a summary.

    Returns:
        0 (a session that raises propagates its exception).

    Raises:
        SpecError: the env/agent combination is not supported (before the predir exists).
        UsageError: the tracker (``meta.tracking``) did not start; the new predir is removed.
    """
    import torch

    from orchestrator.report.progress import SessionProgress
    from orchestrator.session import events as ev
    from orchestrator.session.loop import Session
    from orchestrator.session.runner import SessionRunner
    from orchestrator.store import predir as predir_mod

    base = draw_seed(spec)  # drawn once if unset, so the saved spec replays the run
    set_meta(spec, max_session=1)
    meta = MetaSpec.of(spec)
    torch.set_num_threads(max(1, int(meta.resources.get("num_cpus", 1))))
    seed = session_seed(base, 0, 0)
    try:  # before the predir exists, so a bad combination leaves nothing behind
        session = Session(spec, seed)
    except ValueError as err:  # an env/agent combination the algorithm does not support
        raise SpecError(str(err)) from None
    predir = predir_mod.new_predir(data_dir, spec["name"])
    predir_mod.save_specs(predir, spec, 0, [seed])
    runner = SessionRunner(spec, predir, 0, 0, seed, resume=False, checkpoints=False, prebuilt=session)
    try:  # TensorBoard, W&B, MLflow: every row as it is logged
        runner.start_tracking()
    except Exception as err:  # e.g. no W&B login, an MLflow store it refuses  # noqa: BLE001
        if runner.tracker.tb is not None:
            runner.tracker.tb.close()
        session.close()
        storage.delete(predir)  # this command's own new run directory, nothing trained in it yet
        cause = (str(err).strip().splitlines() or [""])[-1]
        raise UsageError(f"meta.tracking={meta.tracking}: the tracker did not start "
                         f"({type(err).__name__}: {cause})") from None
    status = "failed"
    with SessionProgress(disable=quiet) as progress:
        try:
            for event in runner.events():
                if isinstance(event, ev.Log):
                    progress.update("t0_s0", event.row, session.clock.max_frame)
            status = "done"
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        finally:
            write_dev_record(predir, spec["name"], seed, status, session.clock.frame)
    return finish_dev(predir, session)


def write_dev_record(predir: str, spec_name: str, seed: int, status: str, frame: int) -> None:
    """``run.json`` of a dev run: ``"mode": "dev"``, its one session's status and frame, no resumes."""
    from datetime import datetime, timezone

    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    storage.write_json(storage.join(predir, "run.json"), {
        "spec_name": spec_name, "created": created, "mode": "dev", "resumes": [],
        "sessions": {"t0_s0": {"status": status, "frame": frame, "seed": seed, "restarts": [], "error": None}}})


def finish_dev(predir: str, session: Any) -> int:
    """Analyze a finished dev run and print its summary; returns 0."""
    from orchestrator.report.analysis import analyze_after_run, summary_lines

    out = analyze_after_run(predir)
    print(f"dev run done: {predir}\n  frame={session.clock.frame} epi={session.clock.epi}")
    print("\n".join(summary_lines(predir, out) if out else []))
    return 0
