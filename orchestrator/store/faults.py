"""Storage faults: the ``StorageError`` of ``orchestrator.store.storage``, which errors are persistent faults of
the machine or the store (and what to do about each), and the retry of transient object-store errors.

A transient object-store error (HTTP 500/503, SlowDown, throttling, a timeout, a reset connection), and a
transient error of a local disk or a network file system (``LOCAL_TRANSIENT``: EIO, ESTALE, ETIMEDOUT, a lost
connection), is retried with exponential back-off (``LAB_STORAGE_RETRY_WAIT_S``, default ``RETRY_FIRST_WAIT_S``
= 0.2 s, doubled each time) up to ``LAB_STORAGE_ATTEMPTS`` attempts (default ``STORAGE_ATTEMPTS``: 12.6 s of
waits; ``check_settings`` rejects a bad value of either before a run starts), each retry reported to the
process's retry listener (``set_retry_listener``; stderr by default, a session's log.txt and the driver's terminal
in a session actor). pyarrow's S3 retry strategies (``AwsStandardS3RetryStrategy``, ``AwsDefaultS3RetryStrategy``)
retry inside the C++ client, where no retry can be seen or logged, and offer only an attempt count: the lab sets
them to one attempt and retries here. A persistent fault (disk full, permission denied, a read-only file system,
rejected or expired credentials, a store or file system still failing after every attempt) raises a
``StorageError`` whose ``hint`` says what to do; a trial stops cleanly on it (``orchestrator.trial``).
"""

from __future__ import annotations

import errno
import functools
import os
import sys
import time
from typing import Any, Callable, TypeVar
from urllib.parse import urlparse

from orchestrator.errors import UsageError


class StorageError(Exception):
    """A location cannot be read or written (names the URI and the cause).

    Attributes:
        uri: the location.
        hint: what the user can do, for a persistent fault of the machine or the store (``fault_of``); None
            for any other error (a bad path, a missing bucket).
        transient: an error worth retrying (an object store's or a network file system's, ``retried``).
    """

    def __init__(self, message: str, uri: str = "", hint: str | None = None, transient: bool = False) -> None:
        super().__init__(message)
        self.uri, self.hint, self.transient = uri, hint, transient


# errno of a persistent local fault -> what to do about it
LOCAL_FAULTS = {errno.ENOSPC: "free space", errno.EDQUOT: "free space or raise the disk quota",
                errno.EROFS: "make the file system writable again", errno.EACCES: "restore write permission",
                errno.EPERM: "restore write permission"}
# errno of a transient fault of a local disk or a network file system (NFS, Lustre, a FUSE mount): retried like a
# transient object-store error, then a persistent fault with this hint
LOCAL_TRANSIENT = {errno.EIO, errno.ESTALE, errno.ETIMEDOUT, errno.ENETDOWN, errno.ENETUNREACH, errno.ENETRESET,
                   errno.ECONNRESET, errno.ECONNABORTED, errno.ECONNREFUSED, errno.EHOSTDOWN, errno.EHOSTUNREACH,
                   errno.ENOTCONN, errno.ENOLCK, errno.EREMOTEIO, errno.ECOMM}
LOCAL_TRANSIENT_HINT = "check the disk, or the network file system's mount and server"
OBJECT_STORE_HINT = "check the object store and the network"
# pieces of the AWS SDK's (pyarrow's) and GCS client's error texts
TRANSIENT_MARKERS = ("SLOW_DOWN", "SlowDown", "SERVICE_UNAVAILABLE", "INTERNAL_FAILURE", "THROTTL",
                     "NETWORK_CONNECTION", "REQUEST_TIMEOUT", "HTTP status 5", "status code: 5", "timed out",
                     "Timeout", "timeout", "onnection reset", "reset by peer", "Couldn't connect", "curlCode",
                     "Unavailable", "UNAVAILABLE", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED")
CREDENTIAL_MARKERS = ("ACCESS_DENIED", "AccessDenied", "EXPIRED_TOKEN", "ExpiredToken", "INVALID_ACCESS_KEY_ID",
                      "InvalidAccessKeyId", "SIGNATURE_DOES_NOT_MATCH", "SignatureDoesNotMatch", "HTTP status 401",
                      "HTTP status 403", "Unauthenticated", "PermissionDenied", "Forbidden",
                      "UNAUTHENTICATED", "PERMISSION_DENIED")
STORAGE_ATTEMPTS = 7  # attempts of an object-store call with transient errors: waits 0.2, 0.4, ... 6.4 s (12.6 s)
RETRY_FIRST_WAIT_S = 0.2


def storage_error(message: str, uri: str, err: OSError) -> StorageError:
    """A ``StorageError`` for ``err`` raised while accessing ``uri``, classified (``hint``, ``transient``)."""
    if urlparse(uri).scheme in ("s3", "gs", "gcs"):
        text = str(err)
        if any(m in text for m in CREDENTIAL_MARKERS):
            return StorageError(message, uri, hint="renew the credentials or restore access to the bucket")
        return StorageError(message, uri, transient=any(m in text for m in TRANSIENT_MARKERS))
    code = getattr(err, "errno", None) or 0
    if code in LOCAL_TRANSIENT:
        return StorageError(message, uri, hint=LOCAL_TRANSIENT_HINT, transient=True)
    return StorageError(message, uri, hint=LOCAL_FAULTS.get(code))


def fault_of(err: BaseException) -> str | None:
    """What to do about ``err`` when it is a persistent storage fault (disk full, permission denied, read-only file
    system, credentials, an object store failing after every retry), else None. Looks through ``__cause__``."""
    while err is not None:
        if isinstance(err, StorageError) and err.hint:
            return err.hint
        if isinstance(err, OSError) and not isinstance(err, FileNotFoundError):
            hint = LOCAL_FAULTS.get(err.errno or 0) or (LOCAL_TRANSIENT_HINT if err.errno in LOCAL_TRANSIENT else None)
            if hint:
                return hint
        err = err.__cause__  # type: ignore[assignment]
    return None


def _print_retry(line: str) -> None:
    """The default retry listener: a warning on stderr."""
    print(f"warning: {line}", file=sys.stderr, flush=True)


_retry_listener: list[Callable[[str], None]] = [_print_retry]


def set_retry_listener(listener: Callable[[str], None] | None) -> None:
    """Where this process reports a retried object-store call (one line each); None restores the default (stderr)."""
    _retry_listener[0] = listener or _print_retry


def storage_attempts() -> int:
    """Attempts of an object-store call with transient errors: ``LAB_STORAGE_ATTEMPTS`` or ``STORAGE_ATTEMPTS``."""
    try:
        return max(1, int(os.environ.get("LAB_STORAGE_ATTEMPTS", STORAGE_ATTEMPTS)))
    except ValueError:
        return STORAGE_ATTEMPTS


def retry_first_wait_s() -> float:
    """Seconds before the first retry of a transient storage error, doubled for each next one:
    ``LAB_STORAGE_RETRY_WAIT_S`` or ``RETRY_FIRST_WAIT_S``."""
    try:
        wait = float(os.environ.get("LAB_STORAGE_RETRY_WAIT_S", RETRY_FIRST_WAIT_S))
    except ValueError:
        return RETRY_FIRST_WAIT_S
    return wait if 0 < wait < float("inf") else RETRY_FIRST_WAIT_S


def check_settings() -> None:
    """Check the retry settings of the environment before a run starts (the readers above, called in every actor,
    fall back to the defaults instead of failing mid-run).

    Raises:
        UsageError: ``LAB_STORAGE_ATTEMPTS`` is not a whole number >= 1, or ``LAB_STORAGE_RETRY_WAIT_S`` not a
            positive number of seconds.
    """
    attempts = os.environ.get("LAB_STORAGE_ATTEMPTS")
    if attempts is not None and not (attempts.strip().isdigit() and int(attempts) >= 1):
        raise UsageError(f"LAB_STORAGE_ATTEMPTS={attempts!r}: expected a whole number of attempts >= 1")
    wait = os.environ.get("LAB_STORAGE_RETRY_WAIT_S")
    if wait is not None:
        try:
            ok = 0 < float(wait) < float("inf")
        except ValueError:
            ok = False
        if not ok:
            raise UsageError(f"LAB_STORAGE_RETRY_WAIT_S={wait!r}: expected a positive number of seconds")


F = TypeVar("F", bound=Callable[..., Any])


def retried(fn: F) -> F:
    """Retry ``fn(uri, ...)`` on a transient object-store ``StorageError``: exponential back-off
    (``retry_first_wait_s()``, 0.2 s by default, doubled each time) up to ``storage_attempts()`` attempts, each
    retry reported to the retry listener; the last failure raises with a ``hint`` (the store kept failing: a
    persistent fault). Every wrapped call is idempotent (whole objects are written from bytes serialized before;
    reads, lists and deletes repeat safely)."""

    @functools.wraps(fn)
    def wrapper(uri: str, *args: Any, **kwargs: Any) -> Any:
        attempts, wait = storage_attempts(), retry_first_wait_s()
        for attempt in range(1, attempts + 1):
            try:
                return fn(uri, *args, **kwargs)
            except StorageError as err:
                if not err.transient:
                    raise
                if attempt == attempts:
                    raise StorageError(f"{err} (failed {attempts} times)", err.uri,
                                       hint=err.hint or OBJECT_STORE_HINT) from None
                _retry_listener[0](f"{fn.__name__} {err.uri or uri}: {err}; retry {attempt} of {attempts - 1} "
                                   f"in {wait:g} s")
                time.sleep(wait)
                wait *= 2
        raise AssertionError("unreachable")

    return wrapper  # type: ignore[return-value]
