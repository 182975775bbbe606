"""Shared pytest fixtures. Importable without ray or moto (each fixture imports what it needs)."""

import os
import uuid

import pytest

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


@pytest.fixture
def s3_bucket(s3_server):
    """``s3://{bucket}`` of a fresh, empty bucket on the moto server (one per test).

    A hang (e.g. an S3 output stream left open) is ended by pytest-timeout (pyproject.toml's ``timeout``), which
    prints every thread's stack on the terminal and exits.
    """
    import boto3

    bucket = f"lab-test-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1").create_bucket(Bucket=bucket)
    yield f"s3://{bucket}"


# ---------------------------------------------------------------- Ray
@pytest.fixture(scope="session")
def ray_local(s3_server):
    """One embedded local Ray for the whole test session (``address="local"``, never ``ray stop``).

    Depends on ``s3_server`` so the AWS_* variables exist before Ray's workers are spawned: workers
    inherit the environment of the process that started Ray.
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
