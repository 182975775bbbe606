"""Conditional writes of one small object: read it with its version, create it only if absent, replace it only if
unchanged. The lease (``orchestrator.store.lease``) is built on them so that two live drivers can never both hold
a run.

A *version* is an opaque string: S3's ETag, GCS's object generation, and on local disk the sha256 of the content.

- S3 (boto3, which reads the same ``AWS_*`` variables as the lab's pyarrow client): create is a ``PutObject`` with
  ``If-None-Match: *``, replace a ``PutObject`` with ``If-Match: <etag>``; S3 answers ``412 PreconditionFailed``
  when the condition fails (``409 ConditionalRequestConflict`` for a concurrent write: retried).
- GCS (its JSON API at ``https://storage.googleapis.com``, or ``STORAGE_EMULATOR_HOST`` anonymously, with Google's
  default credentials through google-auth otherwise): create is an upload with ``ifGenerationMatch=0``, replace one
  with ``ifGenerationMatch=<generation>``; 412 when the condition fails.
- Local disk: create is a hard link of a complete temp file (fails if the name exists); replace holds an exclusive
  ``flock`` on the object's own file (its inode, checked to be still the one at the path) while it compares the
  content's sha256 and renames a complete temp file over the object (POSIX locks also hold on NFSv4); a delete
  holds the same lock.

Every call is retried on transient errors (``faults.retried``); a conditional write whose answer was lost and that
is then retried may report a failed condition although its first try succeeded: the caller re-reads and recognises
its own content.

A store that ignores the preconditions (some emulators: gcp-storage-emulator does) is detected by
``ignores_preconditions``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple
from urllib.parse import quote, urlparse

from orchestrator.store import storage
from orchestrator.store.faults import CREDENTIAL_MARKERS, TRANSIENT_MARKERS, StorageError, retried, storage_error

REQUEST_TIMEOUT_S = 10.0  # seconds one request of this module may take (connect and read)


class Versioned(NamedTuple):
    """An object's content and version (S3 ETag, GCS generation, local sha256)."""

    data: bytes
    version: str


def _error(what: str, uri: str, text: str, status: int | None = None) -> StorageError:
    """A ``StorageError`` classified as ``faults.storage_error`` does (credentials: a hint; 5xx, throttling,
    timeouts, lost connections: transient)."""
    message = f"cannot {what} '{uri}': {text}"
    if status in (401, 403) or any(m in text for m in CREDENTIAL_MARKERS):
        return StorageError(message, uri, hint="renew the credentials or restore access to the bucket")
    transient = (status is not None and (status >= 500 or status in (408, 409, 429))) or status is None or any(
        m in text for m in TRANSIENT_MARKERS)
    return StorageError(message, uri, transient=transient)


def _bucket_key(uri: str) -> tuple[str, str]:
    """(bucket, object name) of an object-store URI."""
    parsed = urlparse(uri)
    return parsed.netloc, parsed.path.lstrip("/")


# ---------------------------------------------------------------- S3
@functools.lru_cache(maxsize=8)
def _s3_client(endpoint: str, region: str, key_id: str) -> Any:
    """A boto3 S3 client (one attempt per call: ``retried`` retries, logged) for an endpoint, region and key."""
    import boto3
    from botocore.config import Config

    config = Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=REQUEST_TIMEOUT_S,
                    read_timeout=REQUEST_TIMEOUT_S)
    return boto3.client("s3", endpoint_url=endpoint or None, region_name=region, config=config)


def _s3(uri: str) -> Any:
    """The S3 client for ``uri``'s bucket (endpoint and region as ``storage`` chooses them)."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or ""
    if not region:
        import pyarrow.fs as pafs

        region = "us-east-1" if endpoint else pafs.resolve_s3_region(_bucket_key(uri)[0])
    return _s3_client(endpoint, region, os.environ.get("AWS_ACCESS_KEY_ID", ""))


def _s3_call(what: str, uri: str, fn: str, **kwargs: Any) -> Any:
    """``client.fn(Bucket, Key, **kwargs)``; None when a precondition failed (412) or the object is missing (404).

    Raises:
        StorageError: any other failure, classified.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, key = _bucket_key(uri)
    try:
        return getattr(_s3(uri), fn)(Bucket=bucket, Key=key, **kwargs)
    except ClientError as err:
        status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code = err.response.get("Error", {}).get("Code", "")
        if status in (404, 412) or code in ("PreconditionFailed", "NoSuchKey", "NotFound"):
            return None
        raise _error(what, uri, str(err), status) from None
    except BotoCoreError as err:  # no answer: a lost connection, a timeout
        raise _error(what, uri, f"{type(err).__name__}: {err}") from None


def _s3_read(uri: str) -> Versioned | None:
    got = _s3_call("read", uri, "get_object")
    if got is None:
        return None
    try:
        return Versioned(got["Body"].read(), got["ETag"])
    except Exception as err:  # the body's stream broke
        raise _error("read", uri, f"{type(err).__name__}: {err}") from None


def _s3_put(uri: str, data: bytes, version: str | None) -> str | None:
    condition = {"IfNoneMatch": "*"} if version is None else {"IfMatch": version}
    done = _s3_call("write", uri, "put_object", Body=data, **condition)
    return None if done is None else done["ETag"]


# ---------------------------------------------------------------- GCS
def _gcs_endpoint() -> tuple[str, bool]:
    """(base URL of GCS's JSON API, anonymous?): ``STORAGE_EMULATOR_HOST`` anonymously, else Google's."""
    emulator = os.environ.get("STORAGE_EMULATOR_HOST", "")
    if emulator:
        return (emulator if "://" in emulator else f"http://{emulator}").rstrip("/"), True
    return "https://storage.googleapis.com", False


@functools.lru_cache(maxsize=1)
def _gcs_credentials() -> Any:
    """Google's default credentials (google-auth) with read-write access to storage."""
    import google.auth

    credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/devstorage.read_write"])
    return credentials


def _gcs_request(what: str, uri: str, method: str, url: str, data: bytes | None = None) -> tuple[int, bytes, Any]:
    """One request to GCS's JSON API: (status, body, headers); status 404 and 412 are answers, not errors.

    Raises:
        StorageError: another status, or no answer; classified.
    """
    import urllib.error
    import urllib.request

    base, anonymous = _gcs_endpoint()
    headers = {"Content-Type": "application/octet-stream"} if data is not None else {}
    if not anonymous:
        from google.auth.transport.requests import Request

        credentials = _gcs_credentials()
        if not credentials.valid:
            credentials.refresh(Request())
        headers["Authorization"] = f"Bearer {credentials.token}"
    request = urllib.request.Request(base + url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as answer:
            return answer.status, answer.read(), answer.headers
    except urllib.error.HTTPError as err:
        body = err.read()
        if err.code in (404, 412):
            return err.code, body, err.headers
        raise _error(what, uri, f"HTTP status {err.code}: {body[:300].decode('utf-8', 'replace')}", err.code) from None
    except OSError as err:  # URLError, a reset, a timeout
        raise _error(what, uri, f"{type(err).__name__}: {err}") from None


def _gcs_object(uri: str) -> str:
    bucket, key = _bucket_key(uri)
    return f"/storage/v1/b/{quote(bucket, safe='')}/o/{quote(key, safe='')}"


def _gcs_read(uri: str) -> Versioned | None:
    status, body, headers = _gcs_request("read", uri, "GET", _gcs_object(uri) + "?alt=media")
    if status == 404:
        return None
    generation = headers.get("x-goog-generation")
    if generation is None:  # an emulator that does not send it: the metadata's (a write between the two is seen)
        status, meta, _ = _gcs_request("read", uri, "GET", _gcs_object(uri))
        if status == 404:
            return None
        generation = json.loads(meta)["generation"]
    return Versioned(body, str(generation))


def _gcs_put(uri: str, data: bytes, version: str | None) -> str | None:
    bucket, key = _bucket_key(uri)
    url = (f"/upload/storage/v1/b/{quote(bucket, safe='')}/o?uploadType=media&name={quote(key, safe='')}"
           f"&ifGenerationMatch={0 if version is None else quote(version)}")
    status, body, _ = _gcs_request("write", uri, "POST", url, data)
    return None if status in (404, 412) else str(json.loads(body)["generation"])


# ---------------------------------------------------------------- local disk
def _local_version(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _local_read(path: str) -> Versioned | None:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    return Versioned(data, _local_version(data))


def _local_temp(path: str, data: bytes) -> str:
    """A complete, synced temp file beside ``path`` holding ``data``."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return tmp


@contextmanager
def _locked_object(path: str) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on the object's own file while the block runs (released when it ends); yields
    False, without a lock, when there is no object at ``path`` or it was replaced while this caller waited. The lock
    is on the object's inode, so no lock file is ever left beside it; the file is opened for writing, which an
    exclusive lock needs on NFS (where flock is a POSIX lock), though nothing is written through it."""
    import fcntl

    try:
        held = open(path, "r+b")
    except FileNotFoundError:
        yield False
        return
    with held:
        fcntl.flock(held, fcntl.LOCK_EX)
        try:
            same = os.stat(path).st_ino == os.fstat(held.fileno()).st_ino
        except FileNotFoundError:
            same = False
        yield same


def _local_put(path: str, data: bytes, version: str | None) -> str | None:
    tmp = _local_temp(path, data)
    try:
        if version is None:
            try:
                os.link(tmp, path)  # exclusive: fails if the name exists
            except FileExistsError:
                return None
            return _local_version(data)
        with _locked_object(path) as held:
            current = _local_read(path) if held else None
            if current is None or current.version != version:
                return None
            os.replace(tmp, path)
            return _local_version(data)
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass


# ---------------------------------------------------------------- the interface
def _scheme(uri: str) -> str:
    scheme = urlparse(uri).scheme
    return "gs" if scheme in ("gs", "gcs") else scheme if scheme == "s3" else "local"


@retried
def read(uri: str) -> Versioned | None:
    """The object at ``uri`` and its version; None when there is none.

    Raises:
        StorageError: the store cannot be read (transient errors retried first).
    """
    scheme = _scheme(uri)
    if scheme == "s3":
        return _s3_read(uri)
    if scheme == "gs":
        return _gcs_read(uri)
    _, path = storage.resolve(uri)
    try:
        return _local_read(path)
    except OSError as err:
        raise storage_error(f"cannot read '{uri}': {err}", uri, err) from None


@retried
def write(uri: str, data: bytes, version: str | None) -> str | None:
    """Write ``data`` to ``uri`` if the object is as the caller last saw it: absent (``version=None``) or at
    ``version``. Returns the new version, or None when the condition failed (the object exists, was changed, or is
    gone). Missing parent folders are created on local disk.

    Raises:
        StorageError: the write failed otherwise (transient errors retried first).
    """
    scheme = _scheme(uri)
    if scheme == "s3":
        return _s3_put(uri, data, version)
    if scheme == "gs":
        return _gcs_put(uri, data, version)
    _, path = storage.resolve(uri)
    try:
        return _local_put(path, data, version)
    except OSError as err:
        raise storage_error(f"cannot write '{uri}': {err}", uri, err) from None


def remove(uri: str, version: str) -> bool:
    """Delete the object at ``uri`` if it is still at ``version``; True when deleted. Local disk: under the lock on
    the object's own file; object stores: a read, then a delete (a write between the two is lost).

    Raises:
        StorageError: the store failed.
    """
    if _scheme(uri) != "local":
        current = read(uri)
        if current is None or current.version != version:
            return False
        storage.delete(uri)
        return True
    _, path = storage.resolve(uri)
    try:
        with _locked_object(path) as held:
            current = _local_read(path) if held else None
            if current is None or current.version != version:
                return False
            os.unlink(path)
            return True
    except OSError as err:
        raise storage_error(f"cannot delete '{uri}': {err}", uri, err) from None


def ignores_preconditions(uri: str, current: Versioned) -> str | None:
    """Whether the store at ``uri`` ignores a create-if-absent on the existing object ``current`` (written by this
    caller): returns the object's new version when it was overwritten (the store ignores preconditions; the content
    is unchanged), None when the store refused as it should.

    Raises:
        StorageError: the store failed otherwise.
    """
    if _scheme(uri) == "local":
        return None
    return write(uri, current.data, None)
