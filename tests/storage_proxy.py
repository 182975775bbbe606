"""A fault-injecting HTTP proxy for object-store tests: it forwards every request to a local S3 (or GCS) test
server and, while ``faults`` holds entries, answers the matching requests with a fault instead.

A fault is one of ``"503"`` (S3's ``SlowDown``), ``"500"`` (``InternalError``), ``"403"`` (``ExpiredToken``),
``"reset"`` (the connection is closed without an answer) and ``"timeout"`` (no answer for ``timeout_s``); errors
carry S3's XML body, or GCS's JSON one for a proxy in front of a GCS server (``flavour="gcs"``).

Besides faults injected for matching requests, ``chaos`` answers a seeded random fraction of every request with a
fault (what an object store under load does), and the first (``nth``) request of each kind (``request_kind``:
HEAD, GET, LIST, PUT, PART, DELETE) in any case, so that every kind that occurs is faulted at least once.
"""

from __future__ import annotations

import collections
import http.client
import json
import random
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

ERROR_BODIES = {
    "503": (503, "SlowDown", "Please reduce your request rate."),
    "500": (500, "InternalError", "We encountered an internal error. Please try again."),
    "403": (403, "ExpiredToken", "The provided token has expired."),
}
GCS_REASONS = {"503": "backendError", "500": "backendError", "403": "forbidden"}
KINDS = ("HEAD", "GET", "LIST", "PUT", "PART", "DELETE")


def request_kind(method: str, path: str, flavour: str = "s3") -> str:
    """What an object-store request does: ``HEAD`` (an object's or bucket's metadata), ``GET`` (an object's content),
    ``LIST``, ``PUT`` (a whole object), ``PART`` (a step of a multipart or resumable upload: create, part, complete,
    abort), ``DELETE`` (one object or a batch); S3's REST API or GCS's JSON API (``flavour="gcs"``)."""
    base, _, query = path.partition("?")
    params = set(p.split("=", 1)[0] for p in query.split("&") if p)
    if flavour == "gcs":
        return gcs_kind(method, base, query, params)
    if method == "HEAD":
        return "HEAD"
    if params & {"uploads", "uploadId", "partNumber"}:
        return "PART"
    if method == "DELETE" or (method == "POST" and "delete" in params):
        return "DELETE"
    if method == "GET":
        return "LIST" if base.strip("/").count("/") == 0 else "GET"
    return "PUT"


def gcs_kind(method: str, base: str, query: str, params: set[str]) -> str:
    """``request_kind`` of a request to GCS's JSON API."""
    if method == "DELETE":
        return "DELETE"
    if base.startswith("/upload/"):
        return "PART" if method == "PUT" or "upload_id" in params or "resumable" in query else "PUT"
    if method == "POST" and base.endswith("/batch/storage/v1"):
        return "DELETE"
    if method == "GET" and base.rstrip("/").endswith("/o"):
        return "LIST"
    if method == "GET":
        return "GET" if "media" in query or base.startswith("/download/") else "HEAD"
    return "PUT"  # copy, rewrite, compose, patch


def aws_unchunk(body: bytes) -> bytes:
    """The payload of an ``aws-chunked`` body (``SIZE[;chunk-signature=...]\\r\\nDATA\\r\\n`` ... ``0``, trailers)."""
    out, pos = [], 0
    while True:
        end = body.index(b"\r\n", pos)
        size = int(body[pos:end].split(b";")[0], 16)
        if size == 0:
            return b"".join(out)
        out.append(body[end + 2:end + 2 + size])
        pos = end + 2 + size + 2


class FaultHandler(BaseHTTPRequestHandler):
    """One request to a ``FaultProxy`` (``server.proxy``): answered with its fault, or forwarded upstream."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def read_body(self) -> bytes:
        """The request's body (a chunked one de-chunked)."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def handle_one(self) -> None:
        """Answer the request with the proxy's fault for it, or forward it upstream."""
        proxy = self.server.proxy  # type: ignore[attr-defined]
        body = self.read_body()
        fault = proxy.take(self.command, self.path)
        kind = request_kind(self.command, self.path, proxy.flavour)
        with proxy.lock:
            proxy.served.append((self.command, self.path, fault))
            proxy.kinds.append(kind)
        if fault is None:
            self.forward(proxy, body)
        elif fault == "reset":
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            self.close_connection = True
            self.connection.close()
        elif fault == "timeout":
            threading.Event().wait(proxy.timeout_s)
            self.close_connection = True
        else:
            status, code, message = ERROR_BODIES[fault]
            if proxy.flavour == "gcs":
                error = {"code": status, "message": message,
                         "errors": [{"message": message, "domain": "global", "reason": GCS_REASONS[fault]}]}
                data, content_type = json.dumps({"error": error}).encode(), "application/json; charset=UTF-8"
            else:
                data = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                        f"<Message>{message}</Message></Error>").encode()
                content_type = "application/xml"
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

    def forward(self, proxy: FaultProxy, body: bytes) -> None:
        """Send the request to ``proxy.upstream`` and its answer back (an ``aws-chunked`` body sent on plain)."""
        conn = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items()
                       if k.lower() not in ("connection", "transfer-encoding", "content-length", "expect")}
            if "aws-chunked" in (self.headers.get("Content-Encoding") or ""):
                body = aws_unchunk(body)
                dropped = ("content-encoding", "x-amz-decoded-content-length", "x-amz-trailer")
                headers = {k: v for k, v in headers.items() if k.lower() not in dropped}
                headers["x-amz-content-sha256"] = "UNSIGNED-PAYLOAD"
            headers["Content-Length"] = str(len(body))
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            self.send_response(resp.status, resp.reason)
            for key, value in resp.getheaders():
                if key.lower() not in ("transfer-encoding", "connection", "content-length", "server", "date"):
                    self.send_header(key, value)
            length = resp.getheader("Content-Length") if self.command == "HEAD" else None
            self.send_header("Content-Length", length or str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        finally:
            conn.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = handle_one


class FaultProxy:
    """Proxy on ``127.0.0.1`` in front of ``upstream`` (``http://host:port``); ``endpoint`` is its own URL.

    Attributes:
        faults: list of (method or None for any, path piece or None for any, fault, remove); each request takes
            the first entry it matches (``remove=True``: the entry is consumed; else it stays: a persistent fault).
        served: (method, path, fault or None) of every request, in order; ``kinds`` their ``request_kind``s.
        flavour: ``"s3"`` or ``"gcs"``: the upstream's API (error bodies, request kinds).
    """

    def __init__(self, upstream: str, timeout_s: float = 12.0, flavour: str = "s3") -> None:
        self.upstream = urlparse(upstream)
        self.timeout_s, self.flavour = timeout_s, flavour
        self.kinds: list[str] = []
        self.rate, self.rng, self.nth, self.chaos_fault = 0.0, random.Random(0), 0, "503"
        self.seen: collections.Counter[str] = collections.Counter()
        self.faults: list[tuple[str | None, str | None, str, bool]] = []
        self.served: list[tuple[str, str, str | None]] = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), FaultHandler)
        self.server.proxy = self  # type: ignore[attr-defined]
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def take(self, method: str, path: str) -> str | None:
        """The fault for a request of ``method`` on ``path`` (None: forward it)."""
        with self.lock:
            for i, (want, piece, fault, remove) in enumerate(self.faults):
                if (want is None or want == method) and (piece is None or piece in path):
                    if remove:
                        del self.faults[i]
                    return fault
            if self.rate:
                kind = request_kind(method, path, self.flavour)
                self.seen[kind] += 1
                if self.rng.random() < self.rate or self.seen[kind] == self.nth:
                    return self.chaos_fault
        return None

    def chaos(self, rate: float, seed: int, nth: int = 1, fault: str = "503") -> None:
        """Answer a fraction ``rate`` of all later requests (drawn from a ``random.Random(seed)``), and the ``nth``
        request of each kind in any case, with ``fault``; ``rate=0`` stops."""
        with self.lock:
            self.rate, self.rng, self.nth, self.chaos_fault = rate, random.Random(seed), nth, fault
            self.seen.clear()

    def fault_counts(self) -> tuple[dict[str, int], dict[str, int]]:
        """(requests, faulted requests) per ``request_kind``."""
        total, faulted = collections.Counter(self.kinds), collections.Counter()
        for (_, _, fault), kind in zip(self.served, self.kinds):
            if fault is not None:
                faulted[kind] += 1
        return dict(total), dict(faulted)

    def inject(self, fault: str, method: str | None = None, times: int | None = None, path: str | None = None) -> None:
        """Answer the next ``times`` requests of ``method`` (None: any) whose path holds ``path`` (None: any) with
        ``fault``; ``times=None``: every one until ``clear``."""
        with self.lock:
            if times is None:
                self.faults.append((method, path, fault, False))
            else:
                self.faults.extend([(method, path, fault, True)] * times)

    def clear(self) -> None:
        """Forward every request again."""
        with self.lock:
            self.faults.clear()

    def faulted(self) -> list[tuple[str, str, str | None]]:
        """The requests answered with a fault."""
        return [r for r in self.served if r[2] is not None]

    def __enter__(self) -> FaultProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
