"""Shared pytest fixtures. Importable without ray, moto or gcp-storage-emulator (each fixture imports what it needs)."""

import os
import uuid

import pytest


# ---------------------------------------------------------------- SLM-Lab's spec files
def pytest_configure(config):
    config.addinivalue_line("markers", "slm_lab_specs: reads SLM-Lab's own spec files (tests/slm_lab_fetch.py)")


@pytest.hookimpl(trylast=True)  # after -k / -m deselection: only the tests that will run count
def pytest_collection_modifyitems(session, config, items):
    """When a selected test reads SLM-Lab's spec files, make sure they are there once for the whole session
    (``$SLM_LAB_SPECS``, else the checked download into the cache); if they cannot be had, end the session
    with one line naming ``SLM_LAB_SPECS`` instead of failing each such test."""
    if config.option.collectonly or not any(item.get_closest_marker("slm_lab_specs") for item in items):
        return
    from tests.slm_lab_fetch import SpecsUnavailable, ensure

    try:
        ensure()
    except SpecsUnavailable as err:
        pytest.exit(f"error: {err}", returncode=pytest.ExitCode.TESTS_FAILED)

# ---------------------------------------------------------------- S3 (moto server) fixtures
# A local S3-compatible server for storage/checkpoint tests. pyarrow's S3 client is C++, so moto's
# in-process mocks do not reach it: the server listens on 127.0.0.1 and the AWS_* variables point
# every S3 client of this process (and of subprocesses it starts) at it.
_S3_ENV_CLEARED = ("AWS_SESSION_TOKEN", "AWS_PROFILE")


@pytest.fixture(scope="session")
def s3_server():
    """Endpoint URL (``http://127.0.0.1:PORT``) of a moto S3 server running for the whole test session.

    Sets AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_DEFAULT_REGION / AWS_ENDPOINT_URL(_S3) for
    the session and restores the previous values at the end. Skips if moto is not installed.
    """
    moto_server = pytest.importorskip("moto.server")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    new_env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint,
               "AWS_ENDPOINT_URL_S3": endpoint}
    saved = {k: os.environ.get(k) for k in [*new_env, *_S3_ENV_CLEARED]}
    for k in _S3_ENV_CLEARED:
        os.environ.pop(k, None)
    os.environ.update(new_env)
    try:
        yield endpoint
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


@pytest.fixture(scope="session")
def new_s3_bucket(s3_server):
    """A function that creates a fresh, empty bucket on the moto server and returns its ``s3://{bucket}`` (for
    fixtures that outlive one test)."""
    import boto3

    client = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1")

    def create() -> str:
        bucket = f"lab-test-{uuid.uuid4().hex[:12]}"
        client.create_bucket(Bucket=bucket)
        return f"s3://{bucket}"

    return create


@pytest.fixture
def s3_bucket(new_s3_bucket):
    """``s3://{bucket}`` of a fresh, empty bucket on the moto server (one per test).

    A hang (e.g. an S3 output stream left open) is ended by pytest-timeout (pyproject.toml's ``timeout``), which
    prints every thread's stack on the terminal and exits.
    """
    yield new_s3_bucket()


# ---------------------------------------------------------------- GCS (gcp-storage-emulator) fixtures
# A local GCS emulator for the gs:// tests, reached through STORAGE_EMULATOR_HOST (orchestrator.store.storage).
@pytest.fixture(scope="session")
def gcs_endpoint():
    """``http://127.0.0.1:PORT`` where ``gcs_server`` listens, set as STORAGE_EMULATOR_HOST for the session (and
    restored at the end). Chosen before Ray starts, so that Ray's workers inherit it; starts nothing."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{sock.getsockname()[1]}"
    saved = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ["STORAGE_EMULATOR_HOST"] = endpoint
    try:
        yield endpoint
    finally:
        if saved is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = saved


@pytest.fixture(scope="session")
def gcs_server(gcs_endpoint):
    """``gcs_endpoint`` served by a gcp-storage-emulator process (in memory) for the whole test session, stopped
    by its PID at the end. Skips if gcp-storage-emulator is not installed."""
    import socket
    import subprocess
    import sys
    import time
    from urllib.parse import urlparse

    pytest.importorskip("gcp_storage_emulator")
    url = urlparse(gcs_endpoint)
    server = subprocess.Popen([sys.executable, "-m", "gcp_storage_emulator", "start", "--host", url.hostname,
                               "--port", str(url.port), "--in-memory", "--quiet"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection((url.hostname, url.port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "the GCS emulator did not start"
                time.sleep(0.1)
        yield gcs_endpoint
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.fixture(scope="session")
def new_gcs_bucket(gcs_server):
    """A function that creates a fresh, empty bucket on the GCS emulator and returns its ``gs://{bucket}`` (for
    fixtures that outlive one test)."""
    import json
    import urllib.request

    def create() -> str:
        bucket = f"lab-test-{uuid.uuid4().hex[:12]}"
        request = urllib.request.Request(f"{gcs_server}/storage/v1/b?project=test", method="POST",
                                         data=json.dumps({"name": bucket}).encode(),
                                         headers={"Content-Type": "application/json"})
        urllib.request.urlopen(request, timeout=10).close()  # GCS's JSON API: buckets.insert
        return f"gs://{bucket}"

    return create


@pytest.fixture
def gcs_bucket(new_gcs_bucket):
    """``gs://{bucket}`` of a fresh, empty bucket on the GCS emulator (one per test)."""
    yield new_gcs_bucket()


# ---------------------------------------------------------------- Ray
@pytest.fixture(scope="session")
def ray_local(s3_server, gcs_endpoint):
    """One embedded local Ray for the whole test session (``address="local"``, never ``ray stop``).

    Depends on ``s3_server`` and ``gcs_endpoint`` so the AWS_* and STORAGE_EMULATOR_HOST variables exist before
    Ray's workers are spawned: workers inherit the environment of the process that started Ray.
    """
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")
    try:
        yield ray
    finally:
        ray.shutdown()
