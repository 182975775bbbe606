"""Object-store traffic of one session's checkpoints: filesystem calls and bytes per checkpoint on ``s3://``.

One session of a benchmark spec trains in-process (``SessionRunner``, as in a session actor: checkpoints,
retention, the exported train_df copy, log.txt, TensorBoard uploads) with its run directory on a local S3
server (moto), and every call the lab makes on pyarrow's S3 filesystem is counted by method. Request
mapping (pyarrow 2x S3 client): ``open_output_stream`` one PUT (objects above pyarrow's 10 MB part size:
a multipart upload, 2 + parts requests), ``open_input_stream`` one GET, ``get_file_info`` one HEAD (or a
LIST for a selector), ``delete_file`` one DELETE, ``delete_dir`` a LIST plus one batched DELETE per 1,000
keys, ``move`` a COPY plus a DELETE, ``create_dir`` one PUT of a marker. ``docs/SCALING.md`` turns the
counts into request rates for 1,000 sessions.

Usage:
    python bench/checkpoint_traffic.py [--frames 20480] [--out bench/results/checkpoint_traffic.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import re
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# A checkpoint at every log row (2,048 / 1,000 frames), pinned with meta.checkpoint_frequency: the per-checkpoint
# traffic does not depend on the cadence, and a fixed frame cadence gives the same count on every machine (the
# default time gate, about one per second, would make the count depend on the machine's speed).
CASES = [("specs/benchmark/cartpole.json", "ppo_cartpole", ["meta.checkpoint_frequency=2048"]),
         ("specs/benchmark/cartpole.json", "dqn_cartpole", ["meta.checkpoint_frequency=1000"]),
         ("specs/benchmark/cartpole.json", "dqn_cartpole", ["meta.checkpoint_frequency=1000",
                                                            "agent.memory.checkpoint=true"])]


class RequestLog(logging.Handler):
    """Counts the S3 server's HTTP requests (werkzeug's access log lines) by method and query kind."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter = collections.Counter()

    def emit(self, record: logging.LogRecord) -> None:
        """Count one request line of the S3 server's access log by method."""
        m = re.search(r'"(GET|PUT|POST|HEAD|DELETE) (\S+) HTTP', record.getMessage())
        if not m:
            return
        method, target = m.groups()
        query = target.split("?", 1)[1] if "?" in target else ""
        kind = ("upload part" if "partNumber=" in query else "create multipart" if query.startswith("uploads")
                else "complete multipart" if "uploadId=" in query else "list" if "list-type" in query or
                (method == "GET" and target.count("/") <= 1) else "delete batch" if "delete" in query else "")
        self.counts[f"{method} {kind}".strip()] += 1


class CountingFS:
    """A pyarrow filesystem proxy that counts method calls and bytes written through output streams."""

    def __init__(self, fs: Any, counts: collections.Counter) -> None:
        self._fs, self._counts = fs, counts

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._fs, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            key = name + ("(selector)" if name == "get_file_info" and args and not isinstance(args[0], str) else "")
            self._counts[key] += 1
            out = attr(*args, **kwargs)
            if name == "open_output_stream":
                return CountingStream(out, self._counts)
            return out
        return call


class CountingStream:
    """An output stream that adds the bytes written to ``counts['bytes_written']``."""

    def __init__(self, stream: Any, counts: collections.Counter) -> None:
        self._stream, self._counts = stream, counts

    def write(self, data: Any) -> Any:
        """Write ``data`` through, counting its bytes."""
        self._counts["bytes_written"] += len(data)
        return self._stream.write(data)

    def __enter__(self) -> "CountingStream":
        self._stream.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._stream.__exit__(*exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def measure(spec_file: str, name: str, overrides: list[str], frames: int, bucket: str,
            requests: RequestLog) -> dict[str, Any]:
    """Train one session of ``name`` for ``frames`` frames on ``s3://{bucket}``; counts per checkpoint."""
    from orchestrator.session.runner import SessionRunner
    from orchestrator.spec.load import load_spec
    from orchestrator.store import storage

    counts: collections.Counter = collections.Counter()
    real = storage.resolve

    def counting_resolve(uri: str):
        fs, path = real(uri)
        return (CountingFS(fs, counts) if storage.is_remote(uri) else fs), path

    storage.resolve = counting_resolve
    try:
        spec = load_spec(str(ROOT / spec_file), name, [f"env.max_frame={frames}", *overrides])
        predir = f"s3://{bucket}/runs/{name}_2026_01_01_000000"
        requests.counts.clear()
        t0 = time.perf_counter()
        runner = SessionRunner(spec, predir, 0, 0, 1, resume=False)
        kinds = collections.Counter(event.kind for event in runner.events())
        wall = time.perf_counter() - t0
    finally:
        storage.resolve = real
    n = kinds["checkpoint"]
    calls = {k: v for k, v in sorted(counts.items()) if k != "bytes_written"}
    http = dict(sorted(requests.counts.items()))
    return {"spec": name, "overrides": overrides, "frames": frames, "log_frequency": spec["meta"]["log_frequency"],
            "checkpoint_frequency": spec["meta"].get("checkpoint_frequency"),
            "checkpoints": n, "wall_s": round(wall, 1), "calls": calls,
            "calls_per_checkpoint": {k: round(v / n, 2) for k, v in calls.items()},
            "bytes_per_checkpoint": round(counts["bytes_written"] / n),
            "http_requests": http, "http_requests_per_checkpoint": {k: round(v / n, 2) for k, v in http.items()},
            "http_requests_per_checkpoint_total": round(sum(http.values()) / n, 1)}


def main(argv: list[str] | None = None) -> int:
    """The command line (usage in the module docstring): runs the benchmark, writes its results; returns 0."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=20480)
    ap.add_argument("--out", default=str(ROOT / "bench/results/checkpoint_traffic.json"))
    args = ap.parse_args(argv)
    import boto3
    import torch
    from moto.server import ThreadedMotoServer

    torch.set_num_threads(1)
    requests = RequestLog()
    werkzeug = logging.getLogger("werkzeug")
    werkzeug.addHandler(requests)
    werkzeug.setLevel(logging.INFO)
    werkzeug.propagate = False  # count the access log, do not print it
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint,
                       "AWS_ENDPOINT_URL_S3": endpoint})
    results = []
    try:
        for spec_file, name, overrides in CASES:
            bucket = f"traffic-{uuid.uuid4().hex[:8]}"
            boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
            rec = measure(spec_file, name, overrides, args.frames, bucket, requests)
            results.append(rec)
            print(f"{name} {' '.join(overrides)}: {rec['checkpoints']} checkpoints, "
                  f"{rec['bytes_per_checkpoint']:,} bytes each, HTTP requests per checkpoint "
                  f"{rec['http_requests_per_checkpoint_total']} {rec['http_requests_per_checkpoint']}",
                  flush=True)
    finally:
        server.stop()
    from orchestrator.store import storage  # atomic: a kill mid-write leaves the old file
    storage.write_text(str(args.out), json.dumps({"created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                                  "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
