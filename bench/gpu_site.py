"""Pack the lab's runtime packages that a bare, offline CUDA host lacks into one ``site.tar.xz``.

A GPU machine with PyTorch but no package index (no network) cannot ``pip install`` the lab. This script
downloads, on a machine that has an index, the wheels of the packages named below for the host's Python and
platform, unpacks them into one site folder (a wheel is a zip of an installed package), leaves out the parts
of Ray that a local ``train`` never loads (its Java jars, the dashboard's web client, RLlib, Serve, LLM: 35 of
Ray's 79 MB of wheel), and writes the folder as one xz tarball. On the host:

    mkdir -p /tmp/site && tar -xJf site.tar.xz -C /tmp/site && export PYTHONPATH=/tmp/site:$PWD
    python bench/gpu_check.py --mode gpu --workload atari

Packages: Ray, gymnasium with ale-py (Atari and its ROMs), and what they import that a CUDA image
usually lacks (jsonschema and its helpers, pydantic, tensorboardX, Farama-Notifications, plotly for the trial
graphs: without it a run ends with an analysis warning). ``--mujoco`` adds MuJoCo (without its Studio web app
and docs: 23 of its 53 MB) and Stable-Baselines3 with cloudpickle, for ``bench/throughput.py --device cuda``'s SAC
rows; Box2D is left out (``--with`` adds other names).
The versions are the lab's pins (pyproject.toml) and the versions its CPU venv resolves.

Usage:

    python bench/gpu_site.py --python-version 3.12 --out .whl/site.tar.xz

Exit codes: 0 written; 1 a download or unpack failed (pip's message is printed).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

PACKAGES = ["ray==2.60.0", "gymnasium==1.4.0", "ale-py==0.12.1", "farama-notifications==0.0.6",
            "jsonschema==4.26.0", "jsonschema-specifications==2025.9.1", "referencing==0.37.0",
            "rpds-py==2026.9.1", "pydantic==2.14.4", "pydantic-core==2.50.5", "annotated-types==0.8.0",
            "typing-inspection==0.4.5", "tensorboardx==2.6.5", "plotly==7.1.0"]
# MuJoCo envs and SB3 (the GPU throughput comparison): glfw is imported by mujoco, PyOpenGL is not
MUJOCO = ["mujoco==4.0.1", "mujoco-core==4.0.1", "glfw==2.11.0", "stable-baselines3==2.9.2", "cloudpickle==3.1.3"]
# parts of the wheels a local train / train@ / enjoy@ / throughput run never imports or executes
DROP = ("ray/jars/", "ray/dashboard/client/build/", "ray/rllib/", "ray/serve/", "ray/llm/", "mujoco/studio/",
        "mujoco/doc/")
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64"]


def download(names: list[str], python_version: str, dest: Path) -> list[Path]:
    """``pip download --no-deps`` binary wheels of ``names`` for CPython ``python_version`` on x86-64 Linux.

    Raises:
        subprocess.CalledProcessError: pip failed (no such version or platform).
    """
    plats = [x for p in PLATFORMS for x in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", python_version, "--implementation", "cp", *plats, "-d", str(dest), *names],
                   check=True)
    return sorted(dest.glob("*.whl"))


def unpack(wheel: Path, site: Path) -> int:
    """Unpack one wheel into ``site`` (executable bits kept), skipping ``DROP``; returns bytes written."""
    written = 0
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            if info.filename.startswith(DROP) or ".data/scripts/" in info.filename:
                continue
            path = Path(zf.extract(info, site))
            mode = info.external_attr >> 16
            if mode and not info.is_dir():
                path.chmod(mode & 0o777)
            written += info.file_size
    return written


def main(argv: list[str] | None = None) -> int:
    """Download, unpack and pack; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python-version", default="3.12", help="the GPU host's CPython, e.g. 3.12")
    parser.add_argument("--out", default=".whl/site.tar.xz", help="the tarball to write")
    parser.add_argument("--mujoco", action="store_true", help="also MuJoCo and Stable-Baselines3 (see above)")
    parser.add_argument("--with", dest="extra", action="append", default=[], help="another requirement to add")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        wheels, site = Path(tmp) / "wheels", Path(tmp) / "site"
        try:
            found = download(PACKAGES + (MUJOCO if args.mujoco else []) + args.extra, args.python_version, wheels)
        except subprocess.CalledProcessError as err:
            print(f"pip download failed (exit {err.returncode})", file=sys.stderr)
            return 1
        total = sum(unpack(w, site) for w in found)
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp_out = out.with_name(out.name + ".tmp")
        with tarfile.open(tmp_out, "w:xz", preset=6) as tar:
            for child in sorted(site.iterdir()):
                tar.add(child, arcname=child.name)
        shutil.move(tmp_out, out)
    print(f"{out}: {len(found)} wheels, {total / 1e6:.0f} MB unpacked, {out.stat().st_size / 1e6:.1f} MB packed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
