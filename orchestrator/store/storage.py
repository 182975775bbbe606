"""The only module that touches files: a small URI layer over ``pyarrow.fs``.

A location is a URI string: a plain path, ``file://``, ``s3://`` or ``gs://``. Only these strings
cross process boundaries; each process builds its own filesystem object from the URI, and
credentials/endpoints come from the environment (``AWS_*``, ``AWS_ENDPOINT_URL``; GCS: Google's default
credentials, or ``STORAGE_EMULATOR_HOST`` for a GCS emulator).

Rules kept here: bytes are fully serialized before a stream opens; every stream is closed by a
``with`` block; object stores get no renames (a local write is atomic via temp file + rename, an
object-store put is atomic by itself).

Faults: errors are ``StorageError``s classified by ``orchestrator.store.faults`` (transient object-store errors
are retried there, with back-off and a logged line per retry; persistent faults carry a ``hint``).
"""

from __future__ import annotations

import functools
import io
import json
import os
import posixpath
import uuid
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from orchestrator.store import faults
from orchestrator.store.faults import StorageError, fault_of, retried, set_retry_listener, storage_error

# re-exported: callers name storage.StorageError
__all__ = ["StorageError", "fault_of", "set_retry_listener", "storage_error"]

if TYPE_CHECKING:  # pandas is imported where used: it doubles the import time of this module
    import pandas as pd


def is_remote(uri: str) -> bool:
    """True for object-store URIs (``s3://``, ``gs://``, ``gcs://``)."""
    return urlparse(uri).scheme in ("s3", "gs", "gcs")


def _s3_filesystem(bucket_uri: str) -> pafs.FileSystem:
    """An S3 filesystem that honours ``AWS_ENDPOINT_URL`` (e.g. a local test server); one per bucket,
    endpoint and credentials per process (``_cached_s3``), so a bucket's region is looked up once.

    ``allow_delayed_open``: an object smaller than one upload part is written with a single PutObject
    instead of a three-request multipart upload (measured by ``bench/checkpoint_traffic.py``: 18.5 instead of
    33 requests per PPO checkpoint); a write error then surfaces when the stream is closed, which
    ``write_bytes`` does inside its own error handling.
    """
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
    return _cached_s3(urlparse(bucket_uri).netloc, endpoint, os.environ.get("AWS_REGION", ""),
                      os.environ.get("AWS_DEFAULT_REGION", ""), os.environ.get("AWS_ACCESS_KEY_ID", ""))


@functools.lru_cache(maxsize=32)
def _cached_s3(bucket: str, endpoint: str, region: str, default_region: str, key_id: str) -> pafs.FileSystem:
    """The filesystem of ``_s3_filesystem`` (arguments are its cache key)."""
    if not endpoint:
        return pafs.S3FileSystem(region=region or pafs.resolve_s3_region(bucket), allow_delayed_open=True,
                                 retry_strategy=pafs.AwsStandardS3RetryStrategy(1))
    parsed = urlparse(endpoint)
    return pafs.S3FileSystem(endpoint_override=parsed.netloc or parsed.path, scheme=parsed.scheme or "http",
                             region=region or default_region or "us-east-1", connect_timeout=5, request_timeout=10,
                             retry_strategy=pafs.AwsStandardS3RetryStrategy(1), allow_delayed_open=True)


# seconds google-cloud-cpp may retry inside pyarrow, unlogged (then ``retried`` retries): 5 first back-off waits
GCS_RETRY_LIMIT_S = 1.0


def _gcs_filesystem() -> pafs.FileSystem:
    """A GCS filesystem: Google's default credentials, or with ``STORAGE_EMULATOR_HOST`` (``http://host:port``, as
    Google's own clients read it) that emulator, anonymously. Its own retries are limited to ``GCS_RETRY_LIMIT_S``
    (scaled with ``LAB_STORAGE_RETRY_WAIT_S``) so that transient errors reach ``retried``, where each retry is
    logged."""
    return _cached_gcs(os.environ.get("STORAGE_EMULATOR_HOST", ""),
                       GCS_RETRY_LIMIT_S * faults.retry_first_wait_s() / faults.RETRY_FIRST_WAIT_S)


@functools.lru_cache(maxsize=4)
def _cached_gcs(emulator: str, retry_limit_s: float) -> pafs.FileSystem:
    """The filesystem of ``_gcs_filesystem`` (the arguments are its cache key)."""
    import datetime

    limit = datetime.timedelta(seconds=retry_limit_s)
    if not emulator:
        return pafs.GcsFileSystem(retry_time_limit=limit)
    parsed = urlparse(emulator if "://" in emulator else f"http://{emulator}")
    return pafs.GcsFileSystem(anonymous=True, scheme=parsed.scheme, endpoint_override=parsed.netloc,
                              retry_time_limit=limit)


def resolve(uri: str) -> tuple[pafs.FileSystem, str]:
    """Filesystem and in-filesystem path of a URI (plain paths become absolute local paths).

    Raises:
        StorageError: unsupported scheme or a URI pyarrow cannot open.
    """
    scheme = urlparse(uri).scheme
    if scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt"):
        path = uri[len("file://"):] if scheme == "file" else uri
        return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(path))
    try:
        parsed = urlparse(uri)
        if scheme == "s3":
            return _s3_filesystem(f"s3://{parsed.netloc}"), f"{parsed.netloc}{parsed.path}".rstrip("/")
        if scheme in ("gs", "gcs"):
            return _gcs_filesystem(), f"{parsed.netloc}{parsed.path}".rstrip("/")
        fs, path = pafs.FileSystem.from_uri(uri)
        return fs, path.rstrip("/")
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as err:
        raise StorageError(f"cannot open storage URI '{uri}': {err}") from None


def join(uri: str, *parts: str) -> str:
    """Join path parts onto a URI with '/' (keeps the scheme)."""
    if not is_remote(uri) and not uri.startswith("file://"):
        return os.path.join(uri, *parts)
    return posixpath.join(uri.rstrip("/"), *parts)


def basename(uri: str) -> str:
    """Last path component of a URI."""
    return posixpath.basename(uri.rstrip("/")) if is_remote(uri) else os.path.basename(uri.rstrip("/"))


def dirname(uri: str) -> str:
    """Parent location of a URI."""
    return posixpath.dirname(uri.rstrip("/")) if is_remote(uri) else os.path.dirname(uri.rstrip("/"))


def _check_bucket(uri: str) -> None:
    """Raise if the bucket of an object-store URI does not exist (no-op for local paths).

    Called only after a "not found" answer, so a missing file costs one extra request and a missing
    bucket (a typo, a deleted bucket) is an error instead of an empty result.

    Raises:
        StorageError: the bucket does not exist or cannot be reached.
    """
    if not is_remote(uri):
        return
    bucket = urlparse(uri).netloc
    fs, _ = resolve(uri)
    try:
        missing = fs.get_file_info(bucket).type == pafs.FileType.NotFound
    except OSError as err:
        raise storage_error(f"cannot reach bucket '{bucket}' of '{uri}': {err}", uri, err) from None
    if missing:
        raise StorageError(f"bucket '{bucket}' of '{uri}' does not exist")


@retried
def exists(uri: str) -> bool:
    """True if a file or directory exists at ``uri``.

    Raises:
        StorageError: the store cannot be reached, or the URI's bucket does not exist.
    """
    fs, path = resolve(uri)
    try:
        found = fs.get_file_info(path).type != pafs.FileType.NotFound
    except OSError as err:
        raise storage_error(f"cannot reach '{uri}': {err}", uri, err) from None
    if not found:
        _check_bucket(uri)
    return found


@retried
def is_dir(uri: str) -> bool:
    """True if ``uri`` is a directory (object stores: a prefix).

    Raises:
        StorageError: the store cannot be reached.
    """
    fs, path = resolve(uri)
    try:
        return fs.get_file_info(path).type == pafs.FileType.Directory
    except OSError as err:
        raise storage_error(f"cannot reach '{uri}': {err}", uri, err) from None


@retried
def makedirs(uri: str) -> None:
    """Create a directory and its parents (a no-op prefix on object stores)."""
    fs, path = resolve(uri)
    try:
        fs.create_dir(path, recursive=True)
    except OSError as err:
        raise storage_error(f"cannot create directory '{uri}': {err}", uri, err) from None


@retried
def listdir(uri: str) -> list[str]:
    """Names (not paths) of the direct children of a directory; [] if it does not exist.

    On GCS the children come from a recursive listing: pyarrow lists a GCS directory's subdirectories only where
    a directory marker object (``name/``) exists, and objects written by path (as here, or by other tools) have
    none.

    Raises:
        StorageError: the store cannot be reached, or the URI's bucket does not exist.
    """
    fs, path = resolve(uri)
    gcs = urlparse(uri).scheme in ("gs", "gcs")
    try:
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True, recursive=gcs))
    except OSError as err:
        raise storage_error(f"cannot list '{uri}': {err}", uri, err) from None
    if not infos:
        _check_bucket(uri)
    if gcs:
        root = path.rstrip("/") + "/"
        return sorted({i.path[len(root):].split("/", 1)[0] for i in infos if i.path.startswith(root)} - {""})
    return sorted(posixpath.basename(i.path.rstrip("/")) for i in infos)


@retried
def list_files(uri: str) -> list[str]:
    """Paths, relative to ``uri`` and '/'-separated, of every file below a directory; [] if none.

    Raises:
        StorageError: the store cannot be reached, or the URI's bucket does not exist.
    """
    fs, path = resolve(uri)
    try:
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True, recursive=True))
    except OSError as err:
        raise storage_error(f"cannot list '{uri}': {err}", uri, err) from None
    if not infos:
        _check_bucket(uri)
    root = path.replace(os.sep, "/").rstrip("/") + "/"
    return sorted(i.path.replace(os.sep, "/")[len(root):] for i in infos if i.type == pafs.FileType.File)


@retried
def read_bytes(uri: str) -> bytes:
    """Whole content of a file.

    An object is fetched with one GET after its size is known (``open_input_file``): pyarrow's input stream fetches
    an object in 256 KiB ranges, so a retry of a 12 MiB read under 10% failed requests (48 GETs) almost never
    succeeded.

    Raises:
        FileNotFoundError: no file at ``uri``.
        StorageError: any other read failure, including a bucket that does not exist.
    """
    fs, path = resolve(uri)
    try:
        with fs.open_input_file(path) as f:
            return f.read()
    except ValueError as err:  # pyarrow's GCS file whose download failed reads as closed: a failed request
        if not is_remote(uri):
            raise
        raise StorageError(f"cannot read '{uri}': {err}", uri, transient=True) from None
    except FileNotFoundError:
        _check_bucket(uri)
        raise FileNotFoundError(f"no such file: {uri}") from None
    except OSError as err:
        if "not found" in str(err).lower() or "does not exist" in str(err).lower():
            _check_bucket(uri)
            raise FileNotFoundError(f"no such file: {uri}") from None
        raise storage_error(f"cannot read '{uri}': {err}", uri, err) from None


@retried
def write_bytes(uri: str, data: bytes) -> None:
    """Write a whole file atomically: temp file + rename locally, one put on object stores.

    Raises:
        StorageError: the write failed (the previous content, if any, is intact).
    """
    fs, path = resolve(uri)
    try:
        if is_remote(uri):
            with fs.open_output_stream(path) as f:
                f.write(data)
            return
        parent = os.path.dirname(path)
        fs.create_dir(parent, recursive=True)
        tmp = os.path.join(parent, f".tmp-{uuid.uuid4().hex}-{os.path.basename(path)}")
        try:
            with fs.open_output_stream(tmp) as f:
                f.write(data)
            fs.move(tmp, path)
        except OSError:
            try:  # nothing half-written stays behind (a full disk gets its space back)
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except OSError as err:
        raise storage_error(f"cannot write '{uri}': {err}", uri, err) from None


def read_text(uri: str) -> str:
    """File content decoded as UTF-8."""
    return read_bytes(uri).decode("utf-8")


def write_text(uri: str, text: str) -> None:
    """Write UTF-8 text atomically."""
    write_bytes(uri, text.encode("utf-8"))


def read_json(uri: str) -> Any:
    """Parse a JSON file.

    Raises:
        FileNotFoundError: no such file; ValueError / UnicodeDecodeError: not valid JSON (damaged).
    """
    return json.loads(read_text(uri))


def read_json_or_none(uri: str, what: str = "") -> Any:
    """Parse a JSON file for a reader that can do without it: None when it is missing, and None with a
    warning on stderr naming ``uri`` when it is damaged (truncated, not UTF-8, not JSON)."""
    import sys

    try:
        return read_json(uri)
    except FileNotFoundError:
        return None
    except (ValueError, UnicodeDecodeError) as err:
        print(f"warning: {uri} is damaged ({type(err).__name__}: {err}); {what or 'ignored'}", file=sys.stderr)
        return None


def write_json(uri: str, obj: Any) -> None:
    """Write ``obj`` as indented JSON atomically."""
    write_text(uri, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def df_to_parquet_bytes(df: pd.DataFrame) -> bytes:
    """Serialize a DataFrame to Parquet bytes (index dropped)."""
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return buf.getvalue()


def write_parquet(uri: str, df: pd.DataFrame) -> None:
    """Write a DataFrame as Parquet atomically."""
    write_bytes(uri, df_to_parquet_bytes(df))


def read_parquet(uri: str) -> pd.DataFrame:
    """Read a Parquet file into a DataFrame."""
    return pq.read_table(pa.BufferReader(read_bytes(uri))).to_pandas()


@retried
def delete(uri: str) -> None:
    """Delete a file or a directory tree; missing is fine, also when another process deletes it concurrently
    (an object store lists a directory and then deletes its objects one by one: a concurrent delete of the same
    tree makes pyarrow report "path does not exist").

    Raises:
        StorageError: the delete failed, or the URI's bucket does not exist.
    """
    fs, path = resolve(uri)
    kind = pafs.FileType.NotFound  # stays so when the lookup itself fails and the path then turns out missing
    try:
        kind = fs.get_file_info(path).type
        if kind == pafs.FileType.Directory:
            fs.delete_dir(path)
        elif kind == pafs.FileType.File:
            fs.delete_file(path)
    except OSError as err:
        # gone meanwhile (another process deleted it between the lookup and the delete): missing is fine
        try:
            gone = fs.get_file_info(path).type == pafs.FileType.NotFound
        except OSError:
            gone = False
        if not gone:
            raise storage_error(f"cannot delete '{uri}': {err}", uri, err) from None
    if kind == pafs.FileType.NotFound:
        _check_bucket(uri)


def move(src: str, dst: str) -> None:
    """Rename a local file or directory to a path that does not exist yet (atomic on POSIX).

    Object stores have no rename; use ``copy_tree`` then ``delete`` there.

    Raises:
        StorageError: ``src`` is remote, ``dst`` exists, or the rename failed.
    """
    if is_remote(src) or is_remote(dst):
        raise StorageError(f"cannot move '{src}' to '{dst}': object stores have no rename")
    fs, src_path = resolve(src)
    _, dst_path = resolve(dst)
    if os.path.lexists(dst_path):
        raise StorageError(f"cannot move '{src}' to '{dst}': the destination exists")
    try:
        fs.move(src_path, dst_path)
    except OSError as err:
        raise storage_error(f"cannot move '{src}' to '{dst}': {err}", dst, err) from None


@retried
def copy_tree(src: str, dst: str, last: str | None = None) -> list[str]:
    """Copy every file below ``src`` to the same relative path below ``dst`` (server-side on S3/GCS).

    Args:
        src: directory (object-store prefix) to copy.
        dst: destination directory; existing files of the same name are overwritten.
        last: relative path copied after all others (e.g. a manifest that commits the copy).

    Returns:
        The relative paths copied, in copy order.

    Raises:
        StorageError: ``src`` and ``dst`` are on different kinds of store, or a copy failed (files
            copied before it stay).
    """
    kinds = {urlparse(u).scheme if is_remote(u) else "local" for u in (src, dst)}
    if len(kinds) != 1:
        raise StorageError(f"cannot copy '{src}' to '{dst}': not on the same kind of store")
    names = list_files(src)
    ordered = [n for n in names if n != last] + [n for n in names if n == last]
    fs, src_path = resolve(src)
    _, dst_path = resolve(dst)
    sep_join = posixpath.join if is_remote(src) else os.path.join
    try:
        for name in ordered:
            target = sep_join(dst_path, name)
            if not is_remote(dst):
                fs.create_dir(os.path.dirname(target), recursive=True)
            fs.copy_file(sep_join(src_path, name), target)
    except OSError as err:
        raise storage_error(f"cannot copy '{src}' to '{dst}': {err}", dst, err) from None
    return ordered


def sync_tree(uri: str, recursive: bool = True) -> None:
    """Flush a local directory to disk (``fsync``): its files and subdirectories, then its own entries.

    Syncing a directory before renaming it (and its parent after) makes the rename durable across
    power loss, not only process death. ``recursive=False`` syncs only the directory's entries (use it
    on the parent after a rename). A no-op on object stores, whose puts are durable when they return.

    Raises:
        StorageError: a file could not be opened or synced.
    """
    if is_remote(uri):
        return
    _, root = resolve(uri)
    dir_flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
    try:
        if recursive:
            for dirpath, _dirs, files in os.walk(root, topdown=False):
                for name in files:
                    _fsync_path(os.path.join(dirpath, name), os.O_RDONLY)
                if dirpath != root:
                    _fsync_path(dirpath, dir_flags)
        _fsync_path(root, dir_flags)
    except OSError as err:
        raise storage_error(f"cannot sync '{uri}': {err}", uri, err) from None


def _fsync_path(path: str, flags: int) -> None:
    """``fsync`` one file or directory by path."""
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def append_text(uri: str, text: str) -> None:
    """Append to a local log file; on object stores rewrite the whole object (logs are small).

    Raises:
        StorageError: the write failed.
    """
    fs, path = resolve(uri)
    if is_remote(uri):
        old = read_bytes(uri) if exists(uri) else b""
        write_bytes(uri, old + text.encode("utf-8"))
        return
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write(text)
    except OSError as err:
        raise storage_error(f"cannot append to '{uri}': {err}", uri, err) from None


def absolute(uri: str) -> str:
    """A URI that means the same from any working directory (plain local paths made absolute)."""
    if urlparse(uri).scheme in ("", "file") and not uri.startswith("file://"):
        return os.path.abspath(os.path.expanduser(uri))
    return uri
