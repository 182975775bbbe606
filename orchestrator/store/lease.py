"""One driver per run: a lease record ``{predir}/lease.json`` held by the live driver.

The record is ``{"driver_id", "host", "pid", "pid_start", "mode", "since", "heartbeat", "heartbeat_unix"}``
(``since``/``heartbeat`` ISO 8601 UTC, ``heartbeat_unix`` seconds since the epoch). A daemon thread of
the holder rewrites it every ``LEASE_HEARTBEAT_S`` seconds. Another driver (``train@``, ``search@``)
that finds a live lease exits 2 naming the holder. A lease is *stale*, and is taken over with a
message, when its heartbeat is older than ``LEASE_STALE_S`` seconds, or at once when its holder ran on
this host and that process is gone (or its PID now belongs to a process started later). A damaged
record counts as stale. The lease is released (the file deleted) when the driver exits normally or
with an error; a SIGKILLed driver leaves it, and the next driver takes it over as above.

Acquisition: read the record; if absent or stale, write ours, wait ``CONFIRM_DELAY_S`` seconds, then
re-read and proceed only if it is still ours. On local disk the first write of an absent record is an
exclusive create (a hard link, which fails if the name exists), so two drivers starting on a run without a
lease can never both win, and that create needs no confirming wait (a fresh local ``train`` starts its
sessions 0.5 s sooner). Race window left (object stores, and a stale takeover locally): two drivers that
both read the record before either writes, and whose writes land more than ``CONFIRM_DELAY_S`` apart, can
both confirm their own write. Each heartbeat re-reads the
record first; a holder that finds another driver's record stops refreshing, prints a warning and sets
``lost`` (the trial then asks its sessions to stop at their next checkpoint), so such an overlap lasts
at most one heartbeat period (``LEASE_HEARTBEAT_S``), not the whole run.

A driver started with ``wait=True`` (``--name``: a scheduler's restart of the same command) that finds a
live-looking lease waits, with a message, until the lease is released or goes stale (at once when its holder
was on this host and is gone; after ``LEASE_STALE_S`` without a heartbeat when it was on another host), at most
``wait_limit_s()``; a holder still heartbeating then is live, and the driver exits 2 as above.

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
from orchestrator.store import storage

LEASE_NAME = "lease.json"
LEASE_STALE_S = 30.0  # seconds without a heartbeat after which a lease may be taken over
LEASE_HEARTBEAT_S = 5.0  # seconds between the holder's refreshes
CONFIRM_DELAY_S = 0.5  # seconds between writing the record and the re-read that confirms ownership


class LeaseHeldError(UsageError):
    """Another live driver holds the run's lease (names its host, pid and since when); exit 2."""


def stale_after_s() -> float:
    """Seconds without a heartbeat after which a lease is stale (``LAB_LEASE_STALE_S`` or ``LEASE_STALE_S``)."""
    return float(os.environ.get("LAB_LEASE_STALE_S", LEASE_STALE_S))


def heartbeat_s() -> float:
    """Seconds between heartbeats (``LAB_LEASE_HEARTBEAT_S`` or ``LEASE_HEARTBEAT_S``)."""
    return float(os.environ.get("LAB_LEASE_HEARTBEAT_S", LEASE_HEARTBEAT_S))


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
        self.lost: dict[str, Any] | None = None  # the other driver's record, once it took the lease
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
        try:
            data = json.loads(storage.read_bytes(self.uri))
        except FileNotFoundError:
            return None
        except (ValueError, UnicodeDecodeError):
            return {}
        return data if isinstance(data, dict) else {}

    def _create_exclusive(self) -> bool:
        """Local disk: create the record only if absent; False if another driver created it first.

        The record is written to a temp file that is then hard-linked to ``lease.json``: the link
        fails if the name exists (atomic, exclusive), and a reader never sees a half-written record.
        """
        _, path = storage.resolve(self.uri)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{self.driver_id}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.record(), f, indent=2)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        return True

    def acquire(self) -> None:
        """Take the lease (see the module docstring) and start the heartbeat thread.

        Raises:
            LeaseHeldError: a live driver holds it, or another driver took it while this one confirmed.
            storage.StorageError: the store cannot be read or written.
        """
        current = self.read()
        local_first = current is None and not storage.is_remote(self.uri)
        if not (local_first and self._create_exclusive()):
            current = self.read() if local_first else current  # another driver created it first
            if current is not None and self.wait:
                current = self._wait_stale(current)
            if current is not None:
                self._check_stale(current)
            storage.write_json(self.uri, self.record())
            time.sleep(CONFIRM_DELAY_S)  # a plain write can be overwritten by a racing driver: re-read it
            confirmed = self.read()
            if not confirmed or confirmed.get("driver_id") != self.driver_id:
                raise LeaseHeldError(self._held_message(confirmed or {}))
        self._thread = threading.Thread(target=self._beat, name="lease-heartbeat", daemon=True)
        self._thread.start()

    def _wait_stale(self, current: dict[str, Any]) -> dict[str, Any] | None:
        """Poll the record until it is released (None), stale, or ``wait_limit_s()`` passed; returns the last read."""
        deadline, told = time.monotonic() + wait_limit_s(), False
        while current is not None and staleness(current, stale_after_s()) is None and time.monotonic() < deadline:
            if not told:
                print(f"waiting up to {wait_limit_s():g} s for the lease of {self.predir}, held by "
                      f"{describe(current)}: taken over once that driver is gone (another host: no heartbeat "
                      f"for {stale_after_s():g} s, LAB_LEASE_STALE_S)", file=sys.stderr, flush=True)
                told = True
            time.sleep(min(1.0, heartbeat_s()))
            current = self.read()
        return current

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
        """Heartbeat loop: re-read, stop if another driver owns the record, else refresh it."""
        while not self._stop.wait(heartbeat_s()):
            try:
                current = self.read()
                if current is not None and current.get("driver_id") != self.driver_id:
                    self.lost = current
                    print(f"warning: the lease of {self.predir} was taken by {describe(current)}; "
                          "stopping at the next checkpoint", file=sys.stderr)
                    return
                storage.write_json(self.uri, self.record())
            except (storage.StorageError, OSError) as err:  # keep trying: the store may come back
                print(f"warning: cannot refresh the lease {self.uri}: {err}", file=sys.stderr)

    def release(self) -> None:
        """Stop the heartbeat and delete the record if it is still this driver's (best effort)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        try:
            current = self.read()
            if current is not None and current.get("driver_id") == self.driver_id:
                storage.delete(self.uri)
        except (storage.StorageError, OSError) as err:
            print(f"warning: cannot release the lease {self.uri}: {err}", file=sys.stderr)

    def __enter__(self) -> Lease:
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()
