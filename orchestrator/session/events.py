"""The events a session streams to its trial's driver: one small frozen record per kind, yielded by
``orchestrator.session.runner.SessionRunner.events`` (and ``SessionActor.run``) and read by
``orchestrator.trial.Trial``; a seed group's actor tags each with its session (``Grouped``).

Ray-free and picklable (module-level dataclasses of plain values): they cross from the session actor to the driver
as Ray objects. Each class names its kind in ``kind`` (a class attribute, not a field).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Union


@dataclass(frozen=True)
class Started:
    """The session is open (restored from its checkpoint when it resumes) and about to train.

    Fields:
        pid: the process hosting it.
        device: the torch device it trains on (``"cpu"``, ``"cuda:0"``).
        restored_frame: the frame of the checkpoint it restored (None when fresh).
        set_aside: checkpoints it found corrupt and moved away: ``[{"frame", "reason", "moved_to"}]``.
        exact: whether its run is exact (bit-for-bit resumable).
        tracking: its W&B/MLflow run (``SessionTracker.record``), or None.
        node_id, hostname: where it runs (``SessionActor.run`` only; the Ray node id in hex); None in-process.
    """

    kind: ClassVar[str] = "started"
    pid: int
    device: str
    restored_frame: int | None
    set_aside: list[dict[str, Any]] = field(default_factory=list)
    exact: bool = True
    tracking: dict[str, Any] | None = None
    node_id: str | None = None
    hostname: str | None = None


@dataclass(frozen=True)
class Log:
    """A train_df row was logged: ``row`` holds its columns (frame, fps, total_reward_ma, ...)."""

    kind: ClassVar[str] = "log"
    row: dict[str, Any]


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint was committed at ``frame``; training waited ``seconds`` for it (serializing and writing)."""

    kind: ClassVar[str] = "checkpoint"
    frame: int
    seconds: float


@dataclass(frozen=True)
class CheckpointFailed:
    """Every write attempt of the checkpoint at ``frame`` failed (training goes on)."""

    kind: ClassVar[str] = "checkpoint_failed"
    frame: int


@dataclass(frozen=True)
class Done:
    """The session reached ``max_frame``: at ``frame``, with its last ``total_reward_ma`` (None before any row) and
    whether a checkpoint is committed at that frame (``checkpoint``)."""

    kind: ClassVar[str] = "done"
    frame: int
    total_reward_ma: float | None = None
    checkpoint: bool = True


@dataclass(frozen=True)
class Interrupted(Done):
    """The session stopped before ``max_frame`` (a stop request or SIGTERM); fields as ``Done``."""

    kind: ClassVar[str] = "interrupted"


@dataclass(frozen=True)
class StorageFault:
    """A persistent storage fault (``orchestrator.store.faults``) stopped the session; its uncommitted checkpoint was
    removed and the stream ends after this event.

    Fields:
        uri: the object or directory that failed; error: the error's text; hint: what to do about it.
        frame: the newest committed checkpoint's frame (0 if none).
    """

    kind: ClassVar[str] = "storage_fault"
    uri: str
    error: str
    hint: str
    frame: int


@dataclass(frozen=True)
class StorageRetry:
    """Transient object-store errors this process retried since the previous such event, one line each."""

    kind: ClassVar[str] = "storage_retry"
    lines: list[str]


@dataclass(frozen=True)
class Batch:
    """The events of one checkpoint (its commit and the chunk's log rows) as one Ray object, in order
    (``SessionActor.run`` only: the driver's cost is per object, docs/SCALING.md)."""

    kind: ClassVar[str] = "batch"
    events: list[Event]


@dataclass(frozen=True)
class Grouped:
    """The events of the sessions of a seed group (``meta.session_batch``: one actor, several sessions) as one Ray
    object, in order: (session index, event) pairs, each event one of the kinds above but ``Batch``
    (``SessionActor.run(group=...)`` only; the driver handles each as its session's own)."""

    kind: ClassVar[str] = "grouped"
    events: list[tuple[int, Event]]


Event = Union[Started, Log, Checkpoint, CheckpointFailed, Done, Interrupted, StorageFault, StorageRetry, Batch,
              Grouped]
