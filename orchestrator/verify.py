"""The driver-side checks of a session's committed checkpoints before it runs: the newest valid checkpoint is the
truth (corrupt ones set aside, user copies of train_df/eval_df re-exported from it, finished sessions found)."""

from __future__ import annotations

import sys

from orchestrator.errors import UsageError
from orchestrator.store import predir as predir_mod
from orchestrator.store import storage
from orchestrator.store.checkpoint import CheckpointError, CheckpointStore, Selection
from orchestrator.store.record import SessionPlan, now_iso


def check_session(predir: str, plan: SessionPlan) -> Selection:
    """Verify a session's checkpoints in the driver before it runs: the newest valid one is the truth.

    Collects debris of killed writers, sets aside newer checkpoints that fail verification (one
    warning on stderr and in the session's log.txt naming each, why, and the checkpoint used) and
    records them in ``plan.set_aside``. Call only while no actor writes this session (planning, or
    after its actor died).

    Returns:
        The selection (``frame`` None when no checkpoint verifies).

    Raises:
        CheckpointError: the store cannot be read, or a checkpoint of a newer format.
    """
    sdir = predir_mod.session_dir(predir, plan.trial, plan.session)
    store = CheckpointStore(sdir)
    store.collect_garbage()
    selection = store.select_latest()
    if selection.rejected:
        plan.set_aside += [r.to_json() for r in selection.rejected]
        text = f"warning: session {plan.key}: {selection.describe()}"
        print(text, file=sys.stderr)
        try:
            storage.append_text(storage.join(sdir, "log.txt"), f"[{now_iso()}] {text}\n")
        except (storage.StorageError, OSError):
            pass
    return selection


def inexact_note(selections: list[tuple[str, Selection]]) -> str | None:
    """One line saying which sessions a resume restores from ``exact: false`` checkpoints and why (grouped by
    ``exact_reason``), or None when every restored checkpoint is exact. ``selections``: (session key, its
    selection) of the sessions being resumed; one with no checkpoint is left out."""
    by_reason: dict[str, list[str]] = {}
    for key, selection in selections:
        meta = selection.manifest.meta if selection.manifest is not None else {}
        if meta.get("exact") is False:
            by_reason.setdefault(meta.get("exact_reason") or "not exact", []).append(key)
    if not by_reason:
        return None
    parts = "; ".join(f"{', '.join(keys)}: {reason}" for reason, keys in by_reason.items())
    return f"note: this resume cannot equal the uninterrupted run (exact: false): {parts}"


def export_committed(predir: str, plan: SessionPlan, selection: Selection) -> list[str]:
    """Make a session's user copies (train_df/eval_df parquet) equal to its checkpoint's.

    A driver killed between a session's last commit and its exports leaves older copies; the
    committed checkpoint is authoritative. Only files that differ are rewritten.

    Returns:
        Names of the files rewritten.

    Raises:
        storage.StorageError: a write failed.
    """
    store = CheckpointStore(predir_mod.session_dir(predir, plan.trial, plan.session))
    written = store.export(selection.files, changed_only=True)
    if written:
        print(f"session {plan.key}: {', '.join(written)} rewritten from its committed checkpoint at frame "
              f"{selection.frame}", file=sys.stderr)
    return written


def session_done(predir: str, plan: SessionPlan, max_frame: int) -> tuple[bool, Selection]:
    """Verify a session (``check_session``) and, if its newest valid checkpoint is at ``max_frame``
    (frames), mark ``plan`` done at that frame (the caller then re-exports with ``export_committed``).

    Returns:
        (done, selection).

    Raises:
        UsageError: its checkpoints cannot be read (names the session).
    """
    try:
        selection = check_session(predir, plan)
    except CheckpointError as err:
        raise UsageError(f"session {plan.key}: {err}") from None
    if selection.frame is None or selection.frame < max_frame:
        return False, selection
    plan.status, plan.frame = "done", selection.frame
    return True, selection






