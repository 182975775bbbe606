"""One driver per run: a lease record ``{predir}/lease.json`` held by the live driver.

The record is ``{"driver_id", "host", "pid", "pid_start", "mode", "since", "heartbeat", "heartbeat_unix"}``
(``since``/``heartbeat`` ISO 8601 UTC, ``heartbeat_unix`` seconds since the epoch). A daemon thread of
the holder rewrites it every ``LEASE_HEARTBEAT_S`` seconds. Another driver (``train@``, ``search@``)
that finds a live lease exits 2 naming the holder (``LeaseHeldError``). A lease is *stale*, and is taken over with a
message, when its heartbeat is older than ``LEASE_STALE_S`` seconds, or at once when its holder ran on
this host and that process is gone (or its PID now belongs to a process started later). A damaged
record counts as stale. The lease is released (the file deleted) when the driver exits normally or
with an error; a SIGKILLed driver leaves it, and the next driver takes it over as above.

Every write of the record is conditional (``orchestrator.store.conditional``): the first one creates it only if
absent (S3 ``If-None-Match: *``, GCS ``ifGenerationMatch=0``, local disk a hard link), a takeover or a heartbeat
replaces it only if it is still the version this driver read or wrote (S3 ``If-Match: <etag>``, GCS
``ifGenerationMatch=<generation>``, local disk a compare-and-rename under ``flock``). So two live drivers can never
both hold a run: of two racing writes exactly one succeeds, and a holder whose heartbeat finds the record changed
sets ``lost`` (the trial then asks its sessions to stop at their next checkpoint; ``check`` raises
``LeaseLostError`` before a step that must not run twice, such as a PBT exploit). A store that ignores preconditions
(some emulators) is detected at acquisition; there the lease falls back to a confirming re-read after
``CONFIRM_DELAY_S`` and a read before each heartbeat, which leaves a race window (two drivers whose writes land
more than ``CONFIRM_DELAY_S`` apart after both read no record). A driver that does not read back its own record after
writing it lost the race: it exits 2, or with ``wait=True`` waits for the winner as below.

Heartbeat deadline: a heartbeat slowed or failed by storage retries is tried again at once; once no heartbeat was
written for ``fence_s()`` (the stale time less two heartbeats), the holder counts the lease as lost and stops at its
next checkpoint (exit 75), before another driver may take it over.

A driver started with ``wait=True`` (``--name``: a scheduler's restart of the same command) that finds a
live-looking lease waits, with a message, until the lease is released or goes stale (at once when its holder
was on this host and is gone; after ``LEASE_STALE_S`` without a heartbeat when it was on another host), at most
``wait_limit_s()``; a holder still heartbeating then raises ``LeaseBusyError`` (exit 75: run the same command
later; it may be a duplicate of this job that a scheduler started).

Hosts compare ``heartbeat_unix`` with their own clocks: keep them synchronised (NTP) to well under the stale time.

Settings: ``LEASE_STALE_S`` (default 30 s, environment ``LAB_LEASE_STALE_S``), ``LEASE_HEARTBEAT_S``
(default 5 s, environment ``LAB_LEASE_HEARTBEAT_S``); keep the heartbeat well under the stale time.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import uuid
from datetime import datetime, timezone
from typing import Any

from orchestrator.errors import UsageError
from orchestrator.store import conditional, storage
from orchestrator.store.faults import StorageError

LEASE_NAME = "lease.json"
LEASE_STALE_S = 30.0  # seconds without a heartbeat after which a lease may be taken over
LEASE_HEARTBEAT_S = 5.0  # seconds between the holder's refreshes
CONFIRM_DELAY_S = 0.5  # seconds between writing the record and the re-read that confirms ownership


class LeaseHeldError(UsageError):
    """Another live driver holds the run's lease (names its host, pid and since when); exit 2."""


class LeaseBusyError(StorageError):
    """A ``--name`` driver waited ``wait_limit_s()`` and the lease's holder still heartbeats: a scheduler may have
    started this job twice, or the holder's host cannot see this one's; resumable (exit 75: run it again later)."""


class LeaseLostError(StorageError):
    """This driver no longer holds its lease (another driver took it over, or no heartbeat could be written for
    ``fence_s()``); resumable (exit 75). Raised by ``Lease.check``."""


def stale_after_s() -> float:
    """Seconds without a heartbeat after which a lease is stale (``LAB_LEASE_STALE_S`` or ``LEASE_STALE_S``)."""
    return float(os.environ.get("LAB_LEASE_STALE_S", LEASE_STALE_S))


def heartbeat_s() -> float:
    """Seconds between heartbeats (``LAB_LEASE_HEARTBEAT_S`` or ``LEASE_HEARTBEAT_S``)."""
    return float(os.environ.get("LAB_LEASE_HEARTBEAT_S", LEASE_HEARTBEAT_S))


def fence_s() -> float:
    """Seconds without a written heartbeat after which the holder counts its lease as lost and stops at its next
    checkpoint: the stale time less two heartbeats (at least half the stale time), so that it stops before
    another driver may take over."""
    return max(stale_after_s() / 2, stale_after_s() - 2 * heartbeat_s())


def wait_limit_s() -> float:
    """Longest wait of ``Lease(wait=True)`` for a lease to go stale: the stale time plus two heartbeats."""
    return stale_after_s() + 2 * heartbeat_s()


def _proc_start(pid: int) -> str | None:
    """Start time (clock ticks since boot, from /proc) of a local process; None where unknown."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _pid_alive(pid: int, start: str | None) -> bool:
    """True if local process ``pid`` exists and (where known) started at ``start``."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    now_start = _proc_start(pid)
    return start is None or now_start is None or now_start == start


def describe(record: dict[str, Any]) -> str:
    """``host H pid P (mode M, since T, last heartbeat N s ago)`` of a lease record."""
    age = time.time() - float(record.get("heartbeat_unix", 0))
    return (f"host {record.get('host')} pid {record.get('pid')} (mode {record.get('mode')}, since "
            f"{record.get('since')}, last heartbeat {age:.0f} s ago)")


def staleness(record: dict[str, Any], stale_s: float) -> str | None:
    """Why a lease record is stale, or None if its holder is live.

    Args:
        record: a parsed lease record.
        stale_s: seconds without a heartbeat after which it is stale.
    """
    try:
        age = time.time() - float(record["heartbeat_unix"])
        host, pid = record["host"], int(record["pid"])
    except (KeyError, TypeError, ValueError):
        return "the record lacks host, pid or heartbeat"
    if host == socket.gethostname() and not _pid_alive(pid, record.get("pid_start")):
        return f"its process {pid} on this host is gone"
    if age > stale_s:
        return f"no heartbeat for {age:.0f} s (stale after {stale_s:g} s)"
    return None


class Lease:
    """The lease of one run directory for this driver process.

    Args:
        predir: run directory URI (local path, ``file://``, ``s3://``, ``gs://``).
        mode: what the driver runs (``train``, ``train@...``, ``search@...``), shown to a second driver.
        wait: wait (at most ``wait_limit_s()``) for a live-looking lease to be released or go stale, instead of
            exiting 2 at once.
    """

    def __init__(self, predir: str, mode: str, wait: bool = False) -> None:
        self.predir, self.mode, self.wait = predir, mode, wait
        self.uri = storage.join(predir, LEASE_NAME)
        self.driver_id = uuid.uuid4().hex
        self.since = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self._lost: dict[str, Any] | None = None  # see ``lost``
        self._version: str | None = None  # of the record this driver last wrote
        self._last_ok: float | None = None  # time.monotonic() of its last write
        self.unconditional = False  # the store ignores preconditions (``_confirmed``)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def record(self) -> dict[str, Any]:
        """This driver's lease record, heartbeat now."""
        now = time.time()
        return {"driver_id": self.driver_id, "host": socket.gethostname(), "pid": os.getpid(),
                "pid_start": _proc_start(os.getpid()), "mode": self.mode, "since": self.since,
                "heartbeat": datetime.fromtimestamp(now, timezone.utc).isoformat(timespec="seconds"),
                "heartbeat_unix": now}

    def read(self) -> dict[str, Any] | None:
        """The current record; None if there is none; ``{}`` if it is damaged (not JSON, not an object).

        Raises:
            storage.StorageError: the store cannot be read.
        """
        return self._parse(conditional.read(self.uri))

    @staticmethod
    def _parse(current: conditional.Versioned | None) -> dict[str, Any] | None:
        """The record of a read object (see ``read``)."""
        if current is None:
            return None
        try:
            data = json.loads(current.data)
        except (ValueError, UnicodeDecodeError):
            return {}
        return data if isinstance(data, dict) else {}

    def _write(self, version: str | None) -> bool:
        """Write this driver's record if the object is still at ``version`` (None: absent); True when written.
        A conditional write retried after a lost answer reports a failed condition: the record then read back
        is recognised as this driver's."""
        built = time.monotonic()  # the record's heartbeat time: its age counts from here, however long the write takes
        data = json.dumps(self.record(), indent=2).encode()
        new = conditional.write(self.uri, data, version)
        if new is None:
            current = conditional.read(self.uri)
            if not self._mine(current):
                return False
            new = current.version
        self._version, self._last_ok = new, built
        return True

    def acquire(self) -> None:
        """Take the lease (see the module docstring) and start the heartbeat thread.

        Raises:
            LeaseHeldError: a live driver holds it, or another driver took it first (exit 2).
            LeaseBusyError: ``wait=True`` and the holder still heartbeats after ``wait_limit_s()`` (exit 75).
            storage.StorageError: the store cannot be read or written.
        """
        deadline = time.monotonic() + wait_limit_s()
        for _ in range(5):  # lost races (another driver wrote first) are waited for again with wait=True
            current = conditional.read(self.uri)
            if current is not None and self.wait:
                current = self._wait_stale(current, deadline)
            if current is not None:
                self._check_stale(self._parse(current) or {})
            if self._write(None if current is None else current.version) and self._confirmed():
                break
            if not self.wait:  # another driver created it, or took it over, first
                raise LeaseHeldError(self._held_message(self.read() or {}))
        else:
            raise LeaseHeldError(self._held_message(self.read() or {}))
        self._thread = threading.Thread(target=self._beat, name="lease-heartbeat", daemon=True)
        self._thread.start()

    def _mine(self, current: conditional.Versioned | None) -> bool:
        """Whether the read object ``current`` is this driver's record."""
        return current is not None and (self._parse(current) or {}).get("driver_id") == self.driver_id

    def _confirmed(self) -> bool:
        """Whether the record this driver just wrote is still its own when read back: False when another driver's
        write replaced it (two writes at once on a store that does not apply preconditions atomically; some
        emulators), which ``acquire`` treats as a lost race. On a store that ignores preconditions
        (``conditional.ignores_preconditions``, probed once per driver): warn once, wait ``CONFIRM_DELAY_S`` and
        read it back again.

        Raises:
            storage.StorageError: the store cannot be read or written.
        """
        written = conditional.read(self.uri)
        if not self._mine(written):
            return False
        if not self.unconditional:
            new = conditional.ignores_preconditions(self.uri, written)
            if new is None:
                return True
            self.unconditional, self._version = True, new
            print(f"warning: the store of {self.uri} ignores write preconditions: two drivers starting at once may "
                  f"both write the lease; it is confirmed by a re-read after {CONFIRM_DELAY_S:g} s", file=sys.stderr)
        time.sleep(CONFIRM_DELAY_S)
        confirmed = conditional.read(self.uri)
        if not self._mine(confirmed):
            return False
        self._version = confirmed.version
        return True

    def _wait_stale(self, current: conditional.Versioned | None, deadline: float) -> conditional.Versioned | None:
        """Poll the record until it is released (None) or stale; returns the last read.

        Raises:
            LeaseBusyError: the holder still heartbeats at ``deadline`` (``time.monotonic()``).
        """
        told = False
        while current is not None and staleness(self._parse(current) or {}, stale_after_s()) is None:
            if time.monotonic() >= deadline:
                raise LeaseBusyError(self._busy_message(self._parse(current) or {}), self.uri,
                                     hint="if that driver is a duplicate of this job, stop it; otherwise wait for "
                                          "it to finish")
            if not told:
                print(f"waiting up to {wait_limit_s():g} s for the lease of {self.predir}, held by "
                      f"{describe(self._parse(current) or {})}: taken over once that driver is gone (another "
                      f"host: no heartbeat for {stale_after_s():g} s, LAB_LEASE_STALE_S)", file=sys.stderr, flush=True)
                told = True
            time.sleep(min(1.0, heartbeat_s()))
            current = conditional.read(self.uri)
        return current

    def _busy_message(self, holder: dict[str, Any]) -> str:
        """The exit-75 message of a lease wait that timed out."""
        return (f"{self.mode}: the run {self.predir} is held by host {holder.get('host')} pid {holder.get('pid')} "
                f"({describe(holder)}), still heartbeating after a wait of {wait_limit_s():g} s; this driver "
                f"stopped without touching the run: re-run the same command later")

    def _check_stale(self, current: dict[str, Any]) -> None:
        """Raise if ``current`` is a live lease; else say that it is taken over."""
        why = staleness(current, stale_after_s())
        if why is None:
            raise LeaseHeldError(self._held_message(current))
        holder = describe(current) if current else "a damaged lease.json"
        print(f"warning: taking over the lease of {self.predir} from {holder}: {why}", file=sys.stderr)

    def _held_message(self, holder: dict[str, Any]) -> str:
        """The exit-2 message naming the holder and how to proceed."""
        return (f"{self.mode}: the run {self.predir} is in use by another driver: {describe(holder)}. "
                f"Wait for it to finish or stop it; if it is dead its lease ({self.uri}) is taken over "
                f"once it has no heartbeat for {stale_after_s():g} s (LAB_LEASE_STALE_S)")

    def _beat(self) -> None:
        """Heartbeat loop: a conditional rewrite of the record every ``heartbeat_s()``; a record changed by another
        driver sets ``lost``. A write that fails is tried again at once (after the retries of ``conditional``)
        until it succeeds or ``lost`` fences the lease (``fence_s()``)."""
        wait = heartbeat_s()
        while not self._stop.wait(wait):
            try:
                if self.unconditional:  # the store ignores If-Match: look before writing
                    current = self.read()
                    if current is not None and current.get("driver_id") != self.driver_id:
                        self._taken(current)
                        return
                if not self._write(self._version):
                    self._taken(self.read() or {})
                    return
                wait = max(0.0, heartbeat_s() - (time.monotonic() - self._last_ok))
            except (StorageError, OSError) as err:  # keep trying: the store may come back
                print(f"warning: cannot refresh the lease {self.uri}: {err}", file=sys.stderr)
                wait = min(1.0, heartbeat_s())

    def _taken(self, current: dict[str, Any]) -> None:
        """Another driver's record replaced this one's: set ``lost`` and say so."""
        self._lost = current or {"reason": "the lease record was deleted"}
        holder = describe(current) if current else "nobody (it was deleted)"
        print(f"warning: the lease of {self.predir} was taken by {holder}; stopping at the next checkpoint",
              file=sys.stderr)

    @property
    def lost(self) -> dict[str, Any] | None:
        """Why this driver no longer holds the lease (the other driver's record, or ``{"reason": ...}`` once no
        heartbeat was written for ``fence_s()``: another driver may take it over soon); None while it holds it."""
        if self._lost is None and self._last_ok is not None and not self._stop.is_set():
            age = time.monotonic() - self._last_ok
            if age > fence_s():
                self._lost = {"reason": f"no heartbeat could be written for {age:.0f} s (another driver may take "
                                        f"the lease over after {stale_after_s():g} s)"}
                print(f"warning: the lease of {self.predir}: {self._lost['reason']}; stopping at the next checkpoint",
                      file=sys.stderr)
        return self._lost

    def check(self) -> None:
        """Raise if this driver no longer holds the lease (call before a step that must not run twice, e.g. a PBT
        exploit).

        Raises:
            LeaseLostError: see ``lost`` (resumable: exit 75).
        """
        lost = self.lost
        if lost is not None:
            why = lost.get("reason") or f"it was taken over by {describe(lost)}"
            raise LeaseLostError(f"{self.mode}: this driver no longer holds the lease of {self.predir}: {why}",
                                 self.uri, hint="make sure one driver runs it")

    def release(self) -> None:
        """Stop the heartbeat and delete the record if it is still this driver's (best effort)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        try:
            current = conditional.read(self.uri)
            if self._mine(current):
                conditional.remove(self.uri, current.version)
        except (storage.StorageError, OSError) as err:
            print(f"warning: cannot release the lease {self.uri}: {err}", file=sys.stderr)

    def __enter__(self) -> Lease:
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()
