"""The run's record: ``run.json`` of a predir (status, frames, restarts and resumes of every session), written
atomically; library versions and timestamps it records."""

from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from orchestrator.store import predir as predir_mod
from orchestrator.store import storage
from orchestrator.store.checkpoint import CheckpointStore


def versions() -> dict[str, str]:
    """Versions of the libraries a run depends on (written to run.json), from the installed packages'
    metadata (``importlib.metadata``: importing torch and gymnasium for them would cost the driver ~250 MB);
    "unknown" for one that is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    def of(dist: str) -> str:
        try:
            return version(dist)
        except PackageNotFoundError:
            return "unknown"
    return {"python": sys.version.split()[0], "ray": of("ray"), "torch": of("torch"),
            "gymnasium": of("gymnasium"), "numpy": of("numpy")}


class RunRecord:
    """``run.json`` of a predir (docs/ARCHITECTURE.md section 7), written atomically.

    Status changes (started, restarted, done, failed, interrupted) are written at once (while ``hold`` is
    set, by the driver loop handling a batch of events, once at the end of that batch: ``flush_due``); the
    frequent checkpoint-frame updates are amortized: written at most once per ``CHECKPOINT_WRITE_S`` seconds
    (``flush_due`` from the driver loop, ``save`` at the end), so 1,000 sessions checkpointing every
    second cost one rewrite per second, not 1,000. A driver killed in between leaves checkpoint frames up to
    that old in run.json; a resume reads the checkpoints themselves, never these frames. The file holds one
    line per session (``dumps``): a rewrite with 1,000 sessions costs milliseconds, not an indented dump.
    """

    CHECKPOINT_WRITE_S = 1.0

    def __init__(self, predir: str, data: dict[str, Any]) -> None:
        self.uri, self.data = storage.join(predir, "run.json"), data
        self.dirty, self.last_write = False, 0.0
        self.hold, self.urgent = False, False  # hold: status writes wait for flush_due (end of an event batch)
        self.fault: storage.StorageError | None = None  # the first persistent fault a write met (see ``save``)

    @classmethod
    def load_or_new(cls, predir: str, spec_name: str) -> "RunRecord":
        """Read an existing run.json or start a new record; a damaged one is rebuilt (see ``rebuild``).

        Args:
            predir: the directory holding run.json (a run, or a search's ``t{T}`` dir).

        Raises:
            storage.StorageError: the store cannot be read.
        """
        uri = storage.join(predir, "run.json")
        try:
            data = storage.read_json(uri)
        except FileNotFoundError:
            return cls(predir, cls.new_data(spec_name))
        except (ValueError, UnicodeDecodeError) as err:
            return cls.rebuild(predir, spec_name, f"not valid JSON: {err}")
        if not isinstance(data, dict) or not isinstance(data.get("sessions"), dict) \
                or not isinstance(data.get("resumes"), list):
            return cls.rebuild(predir, spec_name, "not an object with 'sessions' and 'resumes'")
        return cls(predir, data)

    @staticmethod
    def new_data(spec_name: str) -> dict[str, Any]:
        """The content of a new run.json."""
        return {"spec_name": spec_name, "created": now_iso(), "versions": versions(), "sessions": {},
                "resumes": []}

    @classmethod
    def rebuild(cls, predir: str, spec_name: str, why: str) -> "RunRecord":
        """A run.json rebuilt from the run's session spec files and committed checkpoints, with a warning.

        The damaged file is kept as ``run.json.damaged-{ts}``. Per session: ``frame``/``checkpoint`` =
        its newest committed checkpoint (verified later by the resume), ``status`` ``done`` at the
        session spec's ``max_frame``, else ``interrupted``; the seed from its spec file. The resume and
        restart history cannot be recovered and starts empty.

        Returns:
            The rebuilt record (already written).
        """
        uri = storage.join(predir, "run.json")
        kept = f"{uri}.damaged-{now_iso().replace(':', '')}"
        storage.write_bytes(kept, storage.read_bytes(uri))
        record = cls(predir, {**cls.new_data(spec_name), "rebuilt": {"at": now_iso(), "why": why}})
        root = predir_mod_run_root(predir)
        for trial, session in record_sessions(predir):
            spec_uri = predir_mod.spec_file(root, spec_name, trial, session)
            try:
                spec = storage.read_json(spec_uri)
                seed, max_frame = spec["meta"]["session_seed"], int(spec["env"]["max_frame"])
            except (FileNotFoundError, ValueError, KeyError, TypeError):
                seed, max_frame = None, None
            frames = CheckpointStore(predir_mod.session_dir(root, trial, session)).frames()
            frame = frames[-1] if frames else 0
            status = "done" if max_frame is not None and frame >= max_frame else "interrupted"
            record.data["sessions"][f"t{trial}_s{session}"] = {
                "status": status, "frame": frame, "checkpoint": frame if frames else None, "seed": seed,
                "restarts": [], "error": None}
        record.save()
        print(f"warning: {uri} is damaged ({why}); kept as {kept} and rebuilt from the spec files and "
              f"committed checkpoints ({len(record.data['sessions'])} session(s); the resume history is lost)",
              file=sys.stderr)
        return record

    def update(self, plan: SessionPlan, checkpoint: int | None = None, defer: bool = False) -> None:
        """Record a session's status, frame (env frames), restarts and error; write the file (with
        ``defer``, a checkpoint-frame update, only when ``CHECKPOINT_WRITE_S`` passed since the last write).

        Raises:
            storage.StorageError: the write failed.
        """
        entry = self.data["sessions"].setdefault(plan.key, {})
        entry.update({"status": plan.status, "frame": plan.frame, "seed": plan.seed,
                      "restarts": entry.get("restarts", []) + plan.restarts[len(entry.get("restarts", [])):],
                      "error": plan.error})
        if checkpoint is not None:
            entry["checkpoint"] = checkpoint
        self.dirty = True
        if self.hold:  # the driver loop writes once at the end of its batch (flush_due)
            self.urgent = self.urgent or not defer
        elif defer:
            self.flush_due()
        else:
            self.save()

    def flush_due(self) -> None:
        """Write pending updates: status changes held back (``hold``) now, checkpoint frames if
        ``CHECKPOINT_WRITE_S`` passed since the last write."""
        if self.urgent or (self.dirty and time.monotonic() - self.last_write >= self.CHECKPOINT_WRITE_S):
            self.save()

    def save(self) -> None:
        """Write run.json atomically.

        A persistent storage fault (``StorageError.hint``: disk full, read-only, ...) is kept in ``fault`` instead
        of raised (the driver stops the trial on it: ``orchestrator.trial``); the record stays dirty, so a later
        save writes everything once the store takes it.

        Raises:
            storage.StorageError: any other failed write.
        """
        try:
            storage.write_text(self.uri, self.dumps(self.data))
        except storage.StorageError as err:
            if err.hint is None:
                raise
            self.fault = self.fault or err
            self.dirty = True
            return
        self.dirty, self.urgent, self.last_write = False, False, time.monotonic()

    @staticmethod
    def dumps(data: dict[str, Any]) -> str:
        """run.json's text: JSON with one line per top-level key, per session and per resume (the C
        encoder's speed; an indented ``json.dumps`` of 1,000 sessions takes ~40 ms in pure Python)."""
        def block(value: Any) -> str:
            if isinstance(value, dict) and value:
                items = (f"    {json.dumps(k)}: {json.dumps(v, default=str)}" for k, v in value.items())
                return "{\n" + ",\n".join(items) + "\n  }"
            if isinstance(value, list) and value:
                return "[\n" + ",\n".join(f"    {json.dumps(v, default=str)}" for v in value) + "\n  ]"
            return json.dumps(value, default=str)
        return "{\n" + ",\n".join(f"  {json.dumps(k)}: {block(v)}" for k, v in data.items()) + "\n}\n"


def predir_mod_run_root(record_dir: str) -> str:
    """The run directory of a run.json's directory: the predir itself, or the parent of a ``t{T}`` dir."""
    return storage.dirname(record_dir) if re.fullmatch(r"t\d+", storage.basename(record_dir)) else record_dir


def record_sessions(record_dir: str) -> list[tuple[int, int]]:
    """(trial, session) of the session dirs a run.json in ``record_dir`` covers, sorted."""
    name = storage.basename(record_dir)
    if re.fullmatch(r"t\d+", name):
        trials = [(int(name[1:]), record_dir)]
    else:
        trials = [(int(n[1:]), storage.join(record_dir, n)) for n in storage.listdir(record_dir)
                  if re.fullmatch(r"t\d+", n)]
    return sorted((t, int(n[1:])) for t, tdir in trials for n in storage.listdir(tdir) if re.fullmatch(r"s\d+", n))




@dataclass
class SessionPlan:
    """One session to run: indices, seed, whether to restore, and its live status."""

    trial: int
    session: int
    seed: int
    resume: bool
    status: str = "pending"
    frame: int = 0
    restarts: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    set_aside: list[dict[str, Any]] = field(default_factory=list)  # corrupt checkpoints found on planning

    @property
    def key(self) -> str:
        """The session's key in ``run.json`` and file names, ``t{trial}_s{session}``."""
        return f"t{self.trial}_s{self.session}"




def now_iso() -> str:
    """Current UTC time, ISO 8601."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


