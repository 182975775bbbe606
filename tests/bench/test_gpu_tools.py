"""The GPU-host helpers: ``bench/gpu_site.py`` unpacks wheels as pip would lay them out (executables stay
executable, Ray's unused parts and wheel scripts left out), and ``bench/gpu_exact.py`` tells equal sessions from
different ones."""

from __future__ import annotations

import importlib.util
import os
import stat
import zipfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]


def load(name: str):
    """The bench script ``bench/{name}.py`` as a module."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / f"bench/{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_unpack_keeps_modes_and_drops_what_a_local_train_never_loads(tmp_path):
    gpu_site = load("gpu_site")
    wheel = tmp_path / "ray-0-py3-none-any.whl"
    files = {"ray/__init__.py": (b"x = 1\n", 0o644), "ray/core/src/ray/raylet/raylet": (b"\x7fELF", 0o755),
             "ray/jars/ray_dist.jar": (b"j" * 100, 0o644), "ray/dashboard/client/build/index.html": (b"<html>", 0o644),
             "ray/rllib/__init__.py": (b"", 0o644), "ray-0.data/scripts/ray": (b"#!", 0o755),
             "ray/dashboard/agent.py": (b"y = 2\n", 0o644)}
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, (data, mode) in files.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFREG | mode) << 16
            zf.writestr(info, data)
    site = tmp_path / "site"
    written = gpu_site.unpack(wheel, site)
    kept = sorted(str(p.relative_to(site)) for p in site.rglob("*") if p.is_file())
    assert kept == ["ray/__init__.py", "ray/core/src/ray/raylet/raylet", "ray/dashboard/agent.py"]
    assert written == 6 + 4 + 6
    assert os.access(site / "ray/core/src/ray/raylet/raylet", os.X_OK)
    assert not os.access(site / "ray/__init__.py", os.X_OK)


def test_gpu_exact_compares_sessions_value_by_value(tmp_path):
    """On the CPU (nets fall back from ``gpu: true``) a session repeats and resumes exactly; a session of
    another seed is told apart, with the loss difference measured."""
    gpu_exact = load("gpu_exact")
    torch.set_num_threads(1)
    items = ["env.max_frame=800", "meta.log_frequency=200"]
    row = gpu_exact.run_case("ppo_cartpole", gpu_exact.CARTPOLE, "ppo_cartpole", items, 440)
    assert row["device"] == "cpu"
    assert row["repeat_equal"] and row["resume_equal"] and row["manifest_exact"]
    assert row["repeat_max_loss_diff"] == 0.0 and row["max_loss_diff"] == 0.0

    from orchestrator.session.loop import Session
    from orchestrator.spec.load import load_spec

    spec = load_spec(gpu_exact.CARTPOLE, "ppo_cartpole", items)
    one, other = Session(spec, 3), Session(spec, 4)
    one.run_rl()
    other.run_rl()
    equal, diff = gpu_exact.compare(one, other)
    assert not equal and diff > 0
