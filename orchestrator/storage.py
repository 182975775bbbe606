"""The only module that touches files: a small URI layer over ``pyarrow.fs``.

A location is a URI string: a plain path, ``file://``, ``s3://`` or ``gs://``. Only these strings
cross process boundaries; each process builds its own filesystem object from the URI, and
credentials/endpoints come from the environment (``AWS_*``, ``AWS_ENDPOINT_URL``, GCS defaults).

Rules kept here: bytes are fully serialized before a stream opens; every stream is closed by a
``with`` block; object stores get no renames (a local write is atomic via temp file + rename, an
object-store put is atomic by itself).
"""

from __future__ import annotations

import io
import json
import os
import posixpath
import uuid
from typing import Any
from urllib.parse import urlparse

import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq


class StorageError(Exception):
    """A location cannot be read or written (names the URI and the cause)."""


def is_remote(uri: str) -> bool:
    """True for object-store URIs (``s3://``, ``gs://``, ``gcs://``)."""
    return urlparse(uri).scheme in ("s3", "gs", "gcs")


def _s3_filesystem(bucket_uri: str) -> pafs.FileSystem:
    """An S3 filesystem that honours ``AWS_ENDPOINT_URL`` (e.g. a local test server)."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if not endpoint:
        return pafs.FileSystem.from_uri(bucket_uri)[0]
    parsed = urlparse(endpoint)
    return pafs.S3FileSystem(endpoint_override=parsed.netloc or parsed.path, scheme=parsed.scheme or "http",
                             region=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
                             connect_timeout=5, request_timeout=10, retry_strategy=pafs.AwsStandardS3RetryStrategy(2))


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
        if scheme == "s3":
            parsed = urlparse(uri)
            return _s3_filesystem(f"s3://{parsed.netloc}"), f"{parsed.netloc}{parsed.path}".rstrip("/")
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


def exists(uri: str) -> bool:
    """True if a file or directory exists at ``uri``."""
    fs, path = resolve(uri)
    try:
        return fs.get_file_info(path).type != pafs.FileType.NotFound
    except OSError as err:
        raise StorageError(f"cannot reach '{uri}': {err}") from None


def is_dir(uri: str) -> bool:
    """True if ``uri`` is a directory (object stores: a prefix)."""
    fs, path = resolve(uri)
    return fs.get_file_info(path).type == pafs.FileType.Directory


def makedirs(uri: str) -> None:
    """Create a directory and its parents (a no-op prefix on object stores)."""
    fs, path = resolve(uri)
    try:
        fs.create_dir(path, recursive=True)
    except OSError as err:
        raise StorageError(f"cannot create directory '{uri}': {err}") from None


def listdir(uri: str) -> list[str]:
    """Names (not paths) of the direct children of a directory; [] if it does not exist."""
    fs, path = resolve(uri)
    try:
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    except OSError as err:
        raise StorageError(f"cannot list '{uri}': {err}") from None
    return sorted(posixpath.basename(i.path.rstrip("/")) for i in infos)


def read_bytes(uri: str) -> bytes:
    """Whole content of a file.

    Raises:
        FileNotFoundError: no file at ``uri``.
        StorageError: any other read failure.
    """
    fs, path = resolve(uri)
    try:
        with fs.open_input_stream(path) as f:
            return f.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"no such file: {uri}") from None
    except OSError as err:
        if "not found" in str(err).lower() or "does not exist" in str(err).lower():
            raise FileNotFoundError(f"no such file: {uri}") from None
        raise StorageError(f"cannot read '{uri}': {err}") from None


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
        with fs.open_output_stream(tmp) as f:
            f.write(data)
        fs.move(tmp, path)
    except OSError as err:
        raise StorageError(f"cannot write '{uri}': {err}") from None


def read_text(uri: str) -> str:
    """File content decoded as UTF-8."""
    return read_bytes(uri).decode("utf-8")


def write_text(uri: str, text: str) -> None:
    """Write UTF-8 text atomically."""
    write_bytes(uri, text.encode("utf-8"))


def read_json(uri: str) -> Any:
    """Parse a JSON file."""
    return json.loads(read_text(uri))


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


def delete(uri: str) -> None:
    """Delete a file or a directory tree; missing is fine."""
    fs, path = resolve(uri)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.Directory:
        fs.delete_dir(path)
    elif info.type == pafs.FileType.File:
        fs.delete_file(path)


def append_text(uri: str, text: str) -> None:
    """Append to a local log file; on object stores rewrite the whole object (logs are small)."""
    fs, path = resolve(uri)
    if is_remote(uri):
        old = read_bytes(uri) if exists(uri) else b""
        write_bytes(uri, old + text.encode("utf-8"))
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)
