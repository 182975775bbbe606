"""The tests' download of SLM-Lab's spec files (``tests/slm_lab_fetch.py``), against a local HTTP server and a
``file://`` URL serving archives laid out as GitHub's (``SLM-Lab-<commit>/slm_lab/spec/...``): the listed files
land in the cache checked, a tampered file is refused by name, and with no network the session ends with one
line naming ``SLM_LAB_SPECS``."""

from __future__ import annotations

import hashlib
import http.server
import io
import os
import socket
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest

from tests import slm_lab_fetch

REPO = Path(__file__).resolve().parents[1]
COMMIT = slm_lab_fetch.VERSIONS["v5.3.0"]
FILES = {"demo.json": b'{"a": 1}\n', "benchmark/ppo/ppo_cartpole.json": b'{"b": 2}\n',
         "benchmark_arc/dqn/dqn.yaml": b"c: 3\n"}


def archive(files: dict[str, bytes], top: str = f"SLM-Lab-{COMMIT}") -> bytes:
    """A tar.gz as GitHub's archive of SLM-Lab lays it out, with ``files`` under ``slm_lab/spec/`` and the
    repository's other files (left out by the download) beside them."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        entries = {"README.md": b"# SLM-Lab\n", "slm_lab/spec/spec_util.py": b"x = 1\n",
                   "slm_lab/spec/__init__.py": b"", **{f"slm_lab/spec/{rel}": data for rel, data in files.items()}}
        for path, data in entries.items():
            info = tarfile.TarInfo(f"{top}/{path}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@pytest.fixture
def listing(tmp_path, monkeypatch):
    """A sha256 list of ``FILES`` (as v5.3.0) in place of the repository's."""
    path = tmp_path / "slm_lab_specs.sha256"
    path.write_text("".join(f"{hashlib.sha256(data).hexdigest()}  v5.3.0/{rel}\n" for rel, data in FILES.items()))
    monkeypatch.setattr(slm_lab_fetch, "SHA256_LIST", path)
    monkeypatch.delenv("SLM_LAB_SPECS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return path


@pytest.fixture
def server(monkeypatch):
    """A local HTTP server answering ``GET /tar.gz/<commit>`` with ``served["body"]``; ``SLM_LAB_SPECS_URL``
    points at it. Yields ``served`` (``body``, and ``paths``: every path asked for)."""
    served = {"body": archive(FILES), "paths": []}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            served["paths"].append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", str(len(served["body"])))
            self.end_headers()
            self.wfile.write(served["body"])

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("SLM_LAB_SPECS_URL", f"http://127.0.0.1:{httpd.server_port}/tar.gz/{{commit}}")
    try:
        yield served
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


def tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_download_keeps_the_listed_files_checked_and_reuses_the_cache(listing, server, tmp_path):
    root = slm_lab_fetch.ensure()
    assert root == tmp_path / "cache" / "rl-trial-lab" / "slm_lab_specs"
    assert tree(root) == {f"v5.3.0/{rel}": data for rel, data in FILES.items()}  # no .py, no partial folder
    assert server["paths"] == [f"/tar.gz/{COMMIT}"]
    assert slm_lab_fetch.ensure() == root and len(server["paths"]) == 1  # cached: no second download
    (root / "v5.3.0" / "demo.json").write_text("edited")
    slm_lab_fetch.ensure()  # a cached file that no longer matches the list: downloaded again
    assert len(server["paths"]) == 2 and tree(root / "v5.3.0") == FILES


def test_file_url_and_any_top_folder_name(listing, monkeypatch, tmp_path):
    path = tmp_path / "SLM-Lab.tar.gz"
    path.write_bytes(archive(FILES, top="SLM-Lab-96be393"))
    monkeypatch.setenv("SLM_LAB_SPECS_URL", path.as_uri())
    assert tree(slm_lab_fetch.ensure() / "v5.3.0") == FILES


def test_a_tampered_file_is_refused_by_name(listing, server, tmp_path):
    server["body"] = archive({**FILES, "benchmark/ppo/ppo_cartpole.json": b'{"b": 666}\n'})
    with pytest.raises(slm_lab_fetch.SpecsUnavailable) as err:
        slm_lab_fetch.ensure()
    message = str(err.value)
    assert "v5.3.0/benchmark/ppo/ppo_cartpole.json" in message and "refused" in message
    assert "SLM_LAB_SPECS" in message and "\n" not in message
    assert not (tmp_path / "cache" / "rl-trial-lab" / "slm_lab_specs" / "v5.3.0").exists()
    assert list((tmp_path / "cache" / "rl-trial-lab" / "slm_lab_specs").iterdir()) == []  # no partial folder


def test_a_listed_file_missing_from_the_archive_is_refused(listing, server):
    server["body"] = archive({k: v for k, v in FILES.items() if k != "demo.json"})
    with pytest.raises(slm_lab_fetch.SpecsUnavailable, match="lacks 1 listed .*slm_lab/spec/demo.json"):
        slm_lab_fetch.ensure()


def test_a_set_variable_must_hold_the_version_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("SLM_LAB_SPECS", str(tmp_path))
    with pytest.raises(slm_lab_fetch.SpecsUnavailable, match=f"SLM_LAB_SPECS={tmp_path} holds no v5.3.0/"):
        slm_lab_fetch.ensure()
    (tmp_path / "v5.3.0").mkdir()
    assert slm_lab_fetch.ensure() == tmp_path


def test_the_repository_list_names_both_pinned_versions():
    assert len(slm_lab_fetch.expected("v5.3.0")) == 162 and len(slm_lab_fetch.expected("v4.2.4")) == 108
    assert all(len(digest) == 64 for digest in slm_lab_fetch.expected("v5.3.0").values())


def test_without_network_or_variable_the_session_ends_in_one_line_naming_slm_lab_specs(tmp_path):
    """A test that reads SLM-Lab's files, no ``SLM_LAB_SPECS`` and an archive URL nothing answers: pytest ends
    the session at once with one line naming ``SLM_LAB_SPECS``, no traceback."""
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "SLM_LAB_SPECS"}
    env.update(XDG_CACHE_HOME=str(tmp_path / "cache"), SLM_LAB_SPECS_URL=f"http://127.0.0.1:{port}/{{commit}}")
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                          "tests/orchestrator/spec/test_slm_lab_specs.py::test_slm_lab_spec_files_are_there"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    output = run.stdout + run.stderr
    assert run.returncode == 1, output
    lines = [line for line in output.splitlines() if "SLM_LAB_SPECS" in line]
    assert len(lines) == 1 and "could not be downloaded" in lines[0], output
    assert "Traceback" not in output and "passed" not in output, output
