"""The checkpoint store of one session directory (docs/ARCHITECTURE.md section 4).

Layout under ``{session_dir}/ckpt/``::

    {frame:012d}/             one committed checkpoint: the caller's files + MANIFEST.json
    .staging-{frame}-{uuid}/  a local checkpoint being written (renamed to {frame:012d}/ when complete)
    .replaced-{frame}-{uuid}/ the previous checkpoint of the same frame while it is being replaced
    .corrupt-{frame}-{uuid}/  a checkpoint that failed verification, set aside (never deleted)

A checkpoint exists only if its ``MANIFEST.json`` exists, and it is used only if every file's size and
sha256 match the manifest and no file's content is refused (``check_content``: an ``env.pkl`` naming anything
outside the restricted unpickler's allowlist is refused, never run). Commit: every file is written first and
the manifest last. On a local
(POSIX) filesystem all of it goes to a staging directory that is synced and then renamed into place in
one atomic step; on an object store (no renames) the files go straight to ``{frame:012d}/`` and the
manifest, one atomic put written last, is the commit. Names starting with '.' never match the
checkpoint pattern, so debris of a killed writer is never taken for a checkpoint.

All file access goes through ``orchestrator.store.storage``. One writer per session directory at a time.

Format version history (``FORMAT_VERSION``, stored in every manifest):
    1: flat files + MANIFEST.json {"format_version", "frame", "created" (ISO 8601 UTC),
       "files": {name: {"size": bytes, "sha256": hex}}, "meta": {..., "versions": {...}}}.

Kept whole: one protocol (stage, verify, commit, select, collect debris) whose invariants read together.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import platform
import re
import uuid
import warnings
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from orchestrator.store import safe_pickle, storage

# least training seconds between checkpoints without meta.checkpoint_frequency (docs/BENCHMARKS.md "Checkpoint cost")
DEFAULT_CHECKPOINT_INTERVAL_S = 1.0

FORMAT_VERSION = 1
MANIFEST_NAME = "MANIFEST.json"
EXPORTED_FILES = ("train_df.parquet", "eval_df.parquet")  # checkpoint files with a user copy in the session dir
STAGING_PREFIX = ".staging-"
REPLACED_PREFIX = ".replaced-"
CORRUPT_PREFIX = ".corrupt-"
_FRAME_DIR_RE = re.compile(r"^\d{12}$")
_ASIDE_RE = re.compile(r"^\.(?:staging|replaced|corrupt)-(\d+)-[0-9a-f]+$")
_VERSIONED_PACKAGES = ("torch", "gymnasium", "numpy")


class CheckpointError(Exception):
    """A checkpoint cannot be written, found or verified (names its URI or frame and the cause)."""


class CheckpointCorruptError(CheckpointError):
    """A committed checkpoint failed verification: bad manifest, missing file, size or sha256 mismatch."""


class CheckpointFallbackWarning(UserWarning):
    """The newest checkpoint failed verification and an older one is used instead."""


@dataclass(frozen=True)
class Manifest:
    """Content of ``MANIFEST.json``: what a checkpoint holds and how to verify it.

    Attributes:
        format_version: ``FORMAT_VERSION`` of the writer.
        frame: the session clock's frame (env frames summed over vector envs) at the checkpoint.
        created: commit time, ISO 8601 in UTC.
        files: file name -> {"size": bytes, "sha256": hex digest}.
        meta: the caller's JSON metadata (clock, spec_hash, weights_sha256, exact, total_reward_ma, ...),
            plus ``versions`` (python, torch, gymnasium, numpy) added by the store where absent.
    """

    format_version: int
    frame: int
    created: str
    files: dict[str, dict] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        """Plain JSON-able dict (the content of ``MANIFEST.json``)."""
        return {"format_version": self.format_version, "frame": self.frame, "created": self.created,
                "files": {name: dict(entry) for name, entry in self.files.items()}, "meta": self.meta}

    @classmethod
    def from_json(cls, d: Any) -> Manifest:
        """Parse and type-check a manifest dict.

        Raises:
            ValueError: a key is missing or has the wrong type (names the key).
        """
        if not isinstance(d, dict):
            raise ValueError(f"manifest is a {type(d).__name__}, not an object")
        for key, kind in (("format_version", int), ("frame", int), ("created", str), ("files", dict),
                          ("meta", dict)):
            if not isinstance(d.get(key), kind) or isinstance(d.get(key), bool):
                raise ValueError(f"manifest key '{key}' is missing or not a {kind.__name__}: {d.get(key)!r}")
        for name, entry in d["files"].items():
            if not (isinstance(entry, dict) and isinstance(entry.get("size"), int)
                    and isinstance(entry.get("sha256"), str)):
                raise ValueError(f"manifest entry of file '{name}' lacks an int 'size' and a str 'sha256'")
        return cls(d["format_version"], d["frame"], d["created"], d["files"], d["meta"])


@dataclass(frozen=True)
class Rejected:
    """A checkpoint that failed verification and was set aside.

    Attributes:
        frame: its frame (env frames).
        reason: why, e.g. "file 'state.pt' is missing", "file 'state.pt' fails its sha256 check",
            "bad MANIFEST.json: ...".
        moved_to: URI of the ``.corrupt-{frame}-{uuid}/`` dir it now lives in.
    """

    frame: int
    reason: str
    moved_to: str

    @property
    def moved_to_name(self) -> str:
        """Basename of ``moved_to`` (``.corrupt-{frame}-{uuid}``)."""
        return storage.basename(self.moved_to)

    def to_json(self) -> dict:
        """``{"frame", "reason", "moved_to"}`` with ``moved_to`` relative to the session dir (``ckpt/...``)."""
        return {"frame": self.frame, "reason": self.reason, "moved_to": f"ckpt/{self.moved_to_name}"}


@dataclass(frozen=True)
class Selection:
    """Result of ``CheckpointStore.select_latest``: the checkpoint a resume uses and what was set aside.

    Attributes:
        ckpt_dir: URI of the ``ckpt/`` dir.
        manifest: manifest of the newest valid checkpoint; None if none verifies.
        files: its files (name -> bytes); {} when ``manifest`` is None.
        rejected: checkpoints set aside by this call, newest first.
        earlier_corrupt: names of ``.corrupt-*`` dirs set aside before (only filled when none verifies).
    """

    ckpt_dir: str
    manifest: Manifest | None
    files: dict[str, bytes]
    rejected: list[Rejected]
    earlier_corrupt: list[str]

    @property
    def frame(self) -> int | None:
        """Frame of the checkpoint used (env frames), None if none verifies."""
        return None if self.manifest is None else self.manifest.frame

    def describe(self) -> str:
        """One sentence: each checkpoint set aside, why, where to, and the checkpoint used instead."""
        parts = [f"checkpoint {storage.join(self.ckpt_dir, f'{r.frame:012d}')} failed verification "
                 f"({r.reason}); set aside as {r.moved_to}" for r in self.rejected]
        if self.manifest is not None:
            used = f"resuming from checkpoint {storage.join(self.ckpt_dir, f'{self.manifest.frame:012d}')}"
            return "; ".join(parts + [used + (" instead" if parts else "")])
        if self.earlier_corrupt:
            parts.append(f"earlier set aside: {', '.join(self.earlier_corrupt)}")
        return (f"no valid checkpoint in {self.ckpt_dir}: {'; '.join(parts) or 'none committed'}. To start "
                f"this session from frame 0, move the .corrupt-* directories out of {self.ckpt_dir}")


def _reason(err: CheckpointCorruptError, uri: str) -> str:
    """The cause part of a verification error, without the ``checkpoint {uri}: `` it starts with."""
    text, prefix = str(err), f"checkpoint {uri}: "
    return text[len(prefix):] if text.startswith(prefix) else text


def sha256_hex(data: bytes) -> str:
    """Hex sha256 digest of ``data``."""
    return hashlib.sha256(data).hexdigest()


def runtime_versions() -> dict[str, str]:
    """Versions of python, torch, gymnasium and numpy (read from package metadata; torch is not imported)."""
    versions = {"python": platform.python_version()}
    for package in _VERSIONED_PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return versions


def check_content(uri: str, name: str, data: bytes) -> None:
    """Parse a checkpoint file by its suffix without running anything it holds: ``.pkl`` (``env.pkl`` of older
    checkpoints) through the restricted unpickler (``safe_pickle.restricted_loads``), ``.json`` as JSON. Other files
    are parsed by their readers, none of which runs code (``state.pt``: ``torch.load(weights_only=True)``; Parquet;
    ``env_state.bin``: raw numbers). A refused file is corruption: the checkpoint is set aside and an older one used.

    Raises:
        CheckpointCorruptError: the file is refused (names the checkpoint, the file and why).
    """
    try:
        if name.endswith(".pkl"):
            safe_pickle.restricted_loads(data)
        elif name.endswith(".json"):
            json.loads(data)
    except Exception as err:  # whatever a hostile or damaged file raises is a refusal  # noqa: BLE001
        raise CheckpointCorruptError(f"checkpoint {uri}: file '{name}' is refused: {type(err).__name__}: "
                                     f"{err}") from None


def _check_commit_args(frame: int, files: dict[str, bytes]) -> None:
    """Guard ``commit``'s inputs.

    Raises:
        ValueError: negative frame, no files, or a file name that is empty, nested, hidden or reserved.
        TypeError: a non-int frame or a file content that is not bytes.
    """
    if not isinstance(frame, int) or isinstance(frame, bool):
        raise TypeError(f"checkpoint frame must be an int, got {frame!r}")
    if frame < 0:
        raise ValueError(f"checkpoint frame must be >= 0, got {frame}")
    if not files:
        raise ValueError(f"checkpoint at frame {frame} has no files")
    for name, data in files.items():
        if not name or name.startswith(".") or "/" in name or "\\" in name or name == MANIFEST_NAME:
            raise ValueError(f"bad checkpoint file name {name!r}: flat, not hidden, not '{MANIFEST_NAME}'")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"checkpoint file '{name}' must be bytes, got {type(data).__name__}")


class CheckpointStore:
    """Commits, verifies, falls back over and prunes the checkpoints of one session directory.

    Args:
        session_dir: URI of the session directory (local path, ``file://``, ``s3://``, ``gs://``);
            checkpoints live under ``{session_dir}/ckpt/``.
        keep: number of newest committed checkpoints ``prune`` keeps (``meta.keep_checkpoints``).

    Raises:
        ValueError: ``keep`` < 1.
    """

    def __init__(self, session_dir: str, keep: int = 3):
        if keep < 1:
            raise ValueError(f"keep must be >= 1 (checkpoints retained), got {keep}")
        self.session_dir = session_dir
        self.keep = keep
        self.ckpt_dir = storage.join(session_dir, "ckpt")
        self._remote = storage.is_remote(session_dir)
        self._versions: dict[str, str] | None = None

    # ---------------------------------------------------------------- names
    def frame_uri(self, frame: int) -> str:
        """URI of the committed checkpoint directory of ``frame``."""
        return storage.join(self.ckpt_dir, f"{frame:012d}")

    def _aside_uri(self, prefix: str, frame: int) -> str:
        """A fresh URI under ``ckpt/`` that can never match the checkpoint pattern."""
        return storage.join(self.ckpt_dir, f"{prefix}{frame}-{uuid.uuid4().hex[:12]}")

    def _has_manifest(self, uri: str) -> bool:
        """True if the directory ``uri`` holds a manifest (is committed)."""
        return storage.exists(storage.join(uri, MANIFEST_NAME))

    # ---------------------------------------------------------------- commit
    def commit(self, frame: int, files: dict[str, bytes], meta: dict) -> Manifest:
        """Write checkpoint ``frame`` atomically: every file, then ``MANIFEST.json`` as the commit.

        A checkpoint already committed at ``frame`` is replaced; it is set aside first and restored
        by ``latest_valid``/``collect_garbage`` if the writer dies before the new one is committed.

        Args:
            frame: session clock frame (env frames), >= 0.
            files: flat file name -> content; every content is fully serialized bytes.
            meta: plain JSON metadata (no NaN, no numpy ints) stored in the manifest; ``versions``
                gets python, torch, gymnasium and numpy versions for keys the caller did not set.

        Returns:
            The committed manifest.

        Raises:
            ValueError / TypeError: bad frame, file names or contents (nothing written).
            CheckpointError: ``meta`` is not JSON-serializable (nothing written), or a write failed
                (the previously committed checkpoints stay valid).
        """
        _check_commit_args(frame, files)
        contents = {name: bytes(data) for name, data in files.items()}
        manifest = self._build_manifest(frame, contents, meta)
        try:
            manifest_bytes = (json.dumps(manifest.to_json(), indent=2, allow_nan=False) + "\n").encode()
        except (TypeError, ValueError) as err:
            raise CheckpointError(f"checkpoint meta of frame {frame} is not plain JSON: {err}") from None
        try:
            if self._remote:
                self._commit_object_store(frame, contents, manifest_bytes)
            else:
                self._commit_posix(frame, contents, manifest_bytes)
        except storage.StorageError as err:
            raise CheckpointError(f"cannot commit checkpoint {self.frame_uri(frame)}: {err}") from err
        return manifest

    def _build_manifest(self, frame: int, contents: dict[str, bytes], meta: dict) -> Manifest:
        """Manifest of ``contents`` with the runtime versions merged into ``meta['versions']``."""
        if self._versions is None:
            self._versions = runtime_versions()
        meta = dict(meta)
        meta["versions"] = {**self._versions, **meta.get("versions", {})}
        entries = {name: {"size": len(data), "sha256": sha256_hex(data)} for name, data in contents.items()}
        created = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
        return Manifest(FORMAT_VERSION, frame, created, entries, meta)

    def _commit_posix(self, frame: int, contents: dict[str, bytes], manifest_bytes: bytes) -> None:
        """Stage, sync, then rename the staging directory to ``{frame:012d}/`` (one atomic step)."""
        staging = self._aside_uri(STAGING_PREFIX, frame)
        try:
            for name, data in contents.items():
                storage.write_bytes(storage.join(staging, name), data)
            storage.write_bytes(storage.join(staging, MANIFEST_NAME), manifest_bytes)
            storage.sync_tree(staging)
        except storage.StorageError:
            self._discard(staging)  # a full disk gets its space back; nothing half-written stays
            raise
        target = self.frame_uri(frame)
        replaced = self._set_aside(frame, REPLACED_PREFIX) if storage.exists(target) else None
        storage.move(staging, target)
        storage.sync_tree(self.ckpt_dir, recursive=False)
        if replaced is not None:
            storage.delete(replaced)

    def _commit_object_store(self, frame: int, contents: dict[str, bytes], manifest_bytes: bytes) -> None:
        """Write the files under ``{frame:012d}/``, then the manifest (the commit); no renames."""
        target = self.frame_uri(frame)
        replaced = self._set_aside(frame, REPLACED_PREFIX) if self._has_manifest(target) else None
        storage.delete(target)  # an uncommitted leftover of a killed writer
        try:
            for name, data in contents.items():
                storage.write_bytes(storage.join(target, name), data)
        except storage.StorageError:
            self._discard(target)  # no manifest written: uncommitted, and removed when the store lets it
            raise
        storage.write_bytes(storage.join(target, MANIFEST_NAME), manifest_bytes)
        if replaced is not None:
            storage.delete(replaced)

    # ---------------------------------------------------------------- moving and deleting
    def _set_aside(self, frame: int, prefix: str) -> str:
        """Move checkpoint ``frame`` to a fresh ``ckpt/{prefix}{frame}-{uuid}/`` and return its URI.

        Local: one rename. Object store: copy every object (manifest last), then delete the original
        (manifest first), so at every moment one complete copy is committed somewhere.
        """
        aside = self._aside_uri(prefix, frame)
        source = self.frame_uri(frame)
        if self._remote:
            storage.copy_tree(source, aside, last=MANIFEST_NAME)
            self._delete_dir(source)
        else:
            storage.move(source, aside)
        return aside

    @staticmethod
    def _discard(uri: str) -> None:
        """Delete an uncommitted checkpoint directory after a failed write, best effort (the store may be failing:
        ``collect_garbage`` removes what is left at the next resume)."""
        try:
            storage.delete(uri)
        except storage.StorageError:
            pass

    def _delete_dir(self, uri: str) -> None:
        """Delete a checkpoint directory, manifest first, so a partial delete is never 'committed'."""
        storage.delete(storage.join(uri, MANIFEST_NAME))
        storage.delete(uri)

    def delete_all(self) -> None:
        """Delete every checkpoint of the session, newest first and each manifest first (``_delete_dir``), then the
        rest of ``ckpt/``: a delete cut short at any point leaves only committed checkpoints and uncommitted debris
        (``collect_garbage``), never a checkpoint that reads as corrupt.

        Raises:
            CheckpointError: the store cannot be listed or a delete failed.
        """
        try:
            for frame in reversed(self.frames()):
                self._delete_dir(self.frame_uri(frame))
            storage.delete(self.ckpt_dir)
        except storage.StorageError as err:
            raise CheckpointError(f"cannot delete the checkpoints in {self.ckpt_dir}: {err}") from err

    def export(self, files: dict[str, bytes], changed_only: bool = False, drop_missing: bool = False) -> list[str]:
        """Write the session directory's user copies (``EXPORTED_FILES``: train_df/eval_df parquet) from a
        checkpoint's ``files``: the committed checkpoint is authoritative.

        Args:
            changed_only: rewrite only copies whose bytes differ (one read each).
            drop_missing: delete a user copy that ``files`` does not hold.

        Returns:
            Names of the files written (or deleted).

        Raises:
            storage.StorageError: a read, write or delete failed.
        """
        written = []
        for name in EXPORTED_FILES:
            uri = storage.join(self.session_dir, name)
            if name not in files:
                if drop_missing and storage.exists(uri):
                    storage.delete(uri)
                    written.append(name)
                continue
            if changed_only and storage.exists(uri) and storage.read_bytes(uri) == files[name]:
                continue
            storage.write_bytes(uri, files[name])
            written.append(name)
        return written

    def copy_to(self, target: CheckpointStore, frame: int) -> None:
        """Make ``target`` (another session) hold this session's state at ``frame``: its checkpoints deleted manifest
        first (``delete_all``), this session's committed checkpoints up to ``frame`` copied manifest last, and its
        user copies written from the checkpoint at ``frame``. Idempotent: a copy cut short is done again whole.

        Raises:
            CheckpointError: no valid checkpoint at ``frame``, or the store failed.
        """
        target.delete_all()
        try:
            for f in (f for f in self.frames() if f <= frame):
                storage.copy_tree(self.frame_uri(f), target.frame_uri(f), last=MANIFEST_NAME)
            held = self.manifest(frame).files
            target.export({name: self.read_file(frame, name) for name in EXPORTED_FILES if name in held},
                          drop_missing=True)
        except storage.StorageError as err:
            raise CheckpointError(f"cannot copy {self.ckpt_dir} up to frame {frame} to {target.ckpt_dir}: {err}") \
                from err

    def _restore_replaced(self) -> None:
        """Finish or roll back replacements of a writer killed in the middle of ``commit``.

        A set-aside copy whose frame has a committed checkpoint again is deleted; one whose frame has
        none is moved back (it is the only complete copy). An incomplete copy (no manifest) is deleted.
        """
        for name in storage.listdir(self.ckpt_dir):
            match = _ASIDE_RE.match(name)
            if not name.startswith(REPLACED_PREFIX) or match is None:
                continue
            aside = storage.join(self.ckpt_dir, name)
            target = self.frame_uri(int(match.group(1)))
            if self._has_manifest(aside) and not self._has_manifest(target):
                storage.delete(target)
                if self._remote:
                    storage.copy_tree(aside, target, last=MANIFEST_NAME)
                else:
                    storage.move(aside, target)
            storage.delete(aside)

    # ---------------------------------------------------------------- reading
    def frames(self) -> list[int]:
        """Frames of the committed checkpoints (manifest present, not yet verified), ascending.

        Raises:
            storage.StorageError: the store cannot be listed (e.g. the bucket does not exist).
        """
        names = [n for n in storage.listdir(self.ckpt_dir) if _FRAME_DIR_RE.match(n)]
        return sorted(int(n) for n in names if self._has_manifest(storage.join(self.ckpt_dir, n)))

    def load(self, frame: int) -> tuple[Manifest, dict[str, bytes]]:
        """Read and verify checkpoint ``frame``.

        Returns:
            The manifest and every file it lists (name -> bytes).

        Raises:
            CheckpointCorruptError: no or unreadable manifest, a missing file, a size/sha256
                mismatch, or a file whose content is refused (``check_content``; names the checkpoint URI
                and the file).
            CheckpointError: a manifest of a newer format, or the store cannot be read (neither is
                evidence of corruption).
        """
        uri = self.frame_uri(frame)
        try:
            manifest = self._read_manifest(uri, frame)
            files = {name: self._read_verified(uri, name, entry) for name, entry in manifest.files.items()}
        except storage.StorageError as err:
            raise CheckpointError(f"cannot read checkpoint {uri}: {err}") from err
        for name, data in files.items():
            check_content(uri, name, data)
        return manifest, files

    def manifest(self, frame: int) -> Manifest:
        """Manifest of checkpoint ``frame`` alone (one small read; the files are not verified).

        Raises:
            CheckpointCorruptError: no or unreadable manifest.
            CheckpointError: a manifest of a newer format, or the store cannot be read.
        """
        uri = self.frame_uri(frame)
        try:
            return self._read_manifest(uri, frame)
        except storage.StorageError as err:
            raise CheckpointError(f"cannot read checkpoint {uri}: {err}") from err

    def _read_manifest(self, uri: str, frame: int) -> Manifest:
        """Parse and check the manifest of the checkpoint directory ``uri`` (expected ``frame``)."""
        try:
            manifest = Manifest.from_json(json.loads(storage.read_bytes(storage.join(uri, MANIFEST_NAME))))
        except FileNotFoundError:
            raise CheckpointCorruptError(f"checkpoint {uri}: {MANIFEST_NAME} is missing (not committed)") from None
        except (ValueError, UnicodeDecodeError) as err:
            raise CheckpointCorruptError(f"checkpoint {uri}: bad {MANIFEST_NAME}: {err}") from None
        if manifest.format_version > FORMAT_VERSION:  # not corrupt: must not be set aside
            raise CheckpointError(f"checkpoint {uri} has format {manifest.format_version}; this lab "
                                         f"reads up to {FORMAT_VERSION}: upgrade the lab to resume it")
        if manifest.frame != frame:
            raise CheckpointCorruptError(f"checkpoint {uri}: bad {MANIFEST_NAME}: it is of frame {manifest.frame}")
        return manifest

    def _read_verified(self, uri: str, name: str, entry: dict) -> bytes:
        """Content of file ``name`` of checkpoint ``uri``, checked against its manifest ``entry``."""
        try:
            data = storage.read_bytes(storage.join(uri, name))
        except FileNotFoundError:
            raise CheckpointCorruptError(f"checkpoint {uri}: file '{name}' is missing") from None
        if len(data) != entry["size"]:
            raise CheckpointCorruptError(f"checkpoint {uri}: file '{name}' has a size mismatch: "
                                         f"{len(data)} bytes, {MANIFEST_NAME} says {entry['size']}")
        if sha256_hex(data) != entry["sha256"]:
            raise CheckpointCorruptError(f"checkpoint {uri}: file '{name}' fails its sha256 check")
        return data

    def read_file(self, frame: int, name: str) -> bytes:
        """One file of checkpoint ``frame``, verified against its manifest (size and sha256).

        Reads only the manifest and that file (e.g. ``train_df.parquet`` without the nets).

        Raises:
            CheckpointCorruptError: no manifest, the file is not listed or missing, or it fails its check.
            CheckpointError: the store cannot be read.
        """
        uri = self.frame_uri(frame)
        manifest = self.manifest(frame)
        if name not in manifest.files:
            raise CheckpointCorruptError(f"checkpoint {uri}: {MANIFEST_NAME} does not list file '{name}'")
        try:
            return self._read_verified(uri, name, manifest.files[name])
        except storage.StorageError as err:
            raise CheckpointError(f"cannot read checkpoint {uri}: {err}") from err

    def ranked(self, which: str) -> list[int]:
        """Committed frames in the order a reader should try them, without verifying any.

        Args:
            which: ``"latest"`` (newest first) or ``"best"`` (highest ``total_reward_ma`` in the
                manifest meta first, newer first on ties; checkpoints without a score follow,
                newest first).

        Raises:
            ValueError: ``which`` is neither ``"best"`` nor ``"latest"``.
            storage.StorageError: the store cannot be listed.
        """
        if which not in ("best", "latest"):
            raise ValueError(f"which must be 'best' or 'latest', got {which!r}")
        frames = sorted(self.frames(), reverse=True)
        if which == "latest":
            return frames
        scores = {}
        for frame in frames:
            try:
                scores[frame] = self.manifest(frame).meta.get("total_reward_ma")
            except CheckpointError:
                scores[frame] = None
        scored = sorted((f for f in frames if scores[f] is not None), key=lambda f: (scores[f], f),
                        reverse=True)
        return scored + [f for f in frames if scores[f] is None]

    def load_readonly(self, which: str) -> tuple[Manifest, dict[str, bytes]] | None:
        """The best or latest checkpoint that verifies, for readers that must not change the run.

        Unlike ``latest_valid`` nothing is moved: a checkpoint that fails verification is skipped
        with a ``CheckpointFallbackWarning`` naming it and the one used instead (enjoy, transfer).

        Args:
            which: ``"best"`` or ``"latest"`` (see ``ranked``).

        Returns:
            (manifest, files), or None if no checkpoint was ever committed here.

        Raises:
            CheckpointError: checkpoints exist but none verifies, or the store cannot be read.
        """
        try:
            frames = self.ranked(which)
        except storage.StorageError as err:
            raise CheckpointError(f"cannot list checkpoints in {self.ckpt_dir}: {err}") from err
        skipped: list[str] = []
        for frame in frames:
            try:
                manifest, files = self.load(frame)
            except CheckpointCorruptError as err:
                skipped.append(str(err))
                continue
            if skipped:
                warnings.warn(f"{'; '.join(skipped)}; using checkpoint {self.frame_uri(frame)} instead",
                              CheckpointFallbackWarning, stacklevel=2)
            return manifest, files
        if skipped:
            raise CheckpointError(f"no valid checkpoint in {self.ckpt_dir}: {'; '.join(skipped)}")
        return None

    def select_latest(self) -> Selection:
        """Newest checkpoint that verifies, setting aside newer ones that do not; reports what it did.

        A corrupt checkpoint (bad or unreadable manifest, missing file, size or sha256 mismatch) is
        moved to ``ckpt/.corrupt-{frame}-{uuid}/`` (never deleted). Also rolls back a replacement
        interrupted by a killed writer (see ``commit``). Nothing is printed or warned: the caller
        reports ``Selection.rejected`` (see ``Selection.describe``).

        Returns:
            The selection: manifest and files of the checkpoint used (None if none verifies), the
            checkpoints set aside now, and the names of ``.corrupt-*`` dirs set aside earlier.

        Raises:
            CheckpointError: the store cannot be read, a corrupt checkpoint cannot be moved, or a
                manifest has a newer format (not corruption: nothing is moved).
        """
        try:
            self._restore_replaced()
            frames = self.frames()
        except storage.StorageError as err:
            raise CheckpointError(f"cannot list checkpoints in {self.ckpt_dir}: {err}") from err
        rejected: list[Rejected] = []
        for frame in reversed(frames):
            try:
                manifest, files = self.load(frame)
            except CheckpointCorruptError as err:
                rejected.append(Rejected(frame, _reason(err, self.frame_uri(frame)),
                                         self._set_aside_corrupt(frame, err)))
                continue
            return Selection(self.ckpt_dir, manifest, files, rejected, [])
        try:
            earlier = [n for n in storage.listdir(self.ckpt_dir) if n.startswith(CORRUPT_PREFIX)]
        except storage.StorageError as err:
            raise CheckpointError(f"cannot list checkpoints in {self.ckpt_dir}: {err}") from err
        return Selection(self.ckpt_dir, None, {}, rejected, [n for n in earlier
                                                             if n not in {r.moved_to_name for r in rejected}])

    def latest_valid(self) -> tuple[Manifest, dict[str, bytes]] | None:
        """Newest checkpoint that verifies, setting aside newer ones that do not (see ``select_latest``).

        A ``CheckpointFallbackWarning`` names each checkpoint set aside, why, and the one used instead.

        Returns:
            (manifest, files) of the newest valid checkpoint; None only if no checkpoint was ever
            committed here (no committed and no set-aside corrupt checkpoint).

        Raises:
            CheckpointError: checkpoints exist but none verifies (all are now set aside), or the
                store cannot be read.
        """
        selection = self.select_latest()
        if selection.manifest is not None:
            if selection.rejected:
                warnings.warn(selection.describe(), CheckpointFallbackWarning, stacklevel=2)
            return selection.manifest, selection.files
        if selection.rejected or selection.earlier_corrupt:
            raise CheckpointError(selection.describe())
        return None

    def _set_aside_corrupt(self, frame: int, err: CheckpointError) -> str:
        """Move a corrupt checkpoint to ``.corrupt-*``; returns the URI it was moved to."""
        try:
            return self._set_aside(frame, CORRUPT_PREFIX)
        except storage.StorageError as move_err:
            raise CheckpointError(f"{err}; and it cannot be set aside: {move_err}") from move_err

    # ---------------------------------------------------------------- retention and cleanup
    def prune(self, best_frame: int | None = None, protect: set[int] = frozenset()) -> list[int]:
        """Delete committed checkpoints outside the retention set; call after a successful commit.

        Kept: the newest ``keep`` committed checkpoints, ``best_frame`` (best ``total_reward_ma``) and
        every frame in ``protect`` (e.g. the checkpoint this session resumed from).

        Returns:
            The deleted frames, ascending.

        Raises:
            CheckpointError: a delete failed (names the checkpoint; kept ones are untouched).
        """
        frames = self.frames()
        kept = set(frames[-self.keep:]) | set(protect) | ({best_frame} if best_frame is not None else set())
        deleted = [frame for frame in frames if frame not in kept]
        for frame in deleted:
            try:
                self._delete_dir(self.frame_uri(frame))
            except storage.StorageError as err:
                raise CheckpointError(f"cannot delete checkpoint {self.frame_uri(frame)}: {err}") from err
        return deleted

    def collect_garbage(self) -> None:
        """Delete what killed writers left: ``.staging-*`` dirs and uncommitted ``{frame:012d}/`` dirs.

        Also rolls back interrupted replacements (see ``commit``). ``.corrupt-*`` dirs are kept.
        Call only while no writer is active on this session directory (e.g. before resuming).

        Raises:
            CheckpointError: the store cannot be listed or a delete failed.
        """
        try:
            self._restore_replaced()
            for name in storage.listdir(self.ckpt_dir):
                uri = storage.join(self.ckpt_dir, name)
                uncommitted = _FRAME_DIR_RE.match(name) is not None and not self._has_manifest(uri)
                if name.startswith(STAGING_PREFIX) or uncommitted:
                    storage.delete(uri)
        except storage.StorageError as err:
            raise CheckpointError(f"cannot collect garbage in {self.ckpt_dir}: {err}") from err
