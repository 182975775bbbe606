"""Regenerate the graphs shown in the docs, from real runs on tiny budgets (CPU, a few minutes):

* ``docs/images/pbt_lineage.png`` and ``docs/images/pbt_experiment_graph.png``: a 4-trial PBT search of PPO on
  CartPole-v1 over ``agent.net.optim_spec.lr`` and ``agent.algorithm.gamma`` (docs/search.md);
* ``docs/images/compare.png``: ``lab compare`` of two train runs, PPO and A2C on CartPole-v1, 2 sessions each
  (docs/tracking.md).

Usage: ``python tools/docs_images.py [--work DIR] [--keep]``. The runs go to a temporary data dir (``--work``: that
dir, kept with ``--keep``); only the PNGs are copied into ``docs/images/``. Each PNG is checked to stay under
``MAX_BYTES``.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
IMAGES = REPO / "docs" / "images"
MAX_BYTES = 200_000
SPECS = "specs/benchmark/cartpole.json"
COMMON = ["meta.random_seed=7", "meta.log_frequency=1000", 'meta.resources={"num_cpus": 0.5, "num_gpus": 0}']
PBT = [*COMMON, "meta.max_trial=4", "meta.max_session=1", "env.max_frame=24000", "meta.checkpoint_frequency=4000",
       'search={"agent.net.optim_spec.lr__loguniform": [1e-4, 1e-2], "agent.algorithm.gamma__uniform": [0.9, 0.999]}',
       'meta.search_scheduler={"name": "PBT", "perturbation_interval": 4000}']
TRAIN = [*COMMON, "meta.max_session=2", "env.max_frame=20000"]
RUNS = [("ppo_cartpole", "search", "pbt", PBT), ("ppo_cartpole", "train", "ppo", TRAIN),
        ("a2c_gae_cartpole", "train", "a2c", TRAIN)]


def lab(data: Path, spec: str, mode: str, name: str, overrides: list[str]) -> Path:
    """Run ``lab SPECS spec mode --name name`` in ``data``; returns the run directory.

    Raises:
        SystemExit: the run failed (its exit code).
    """
    argv = [sys.executable, str(REPO / "run_lab.py"), SPECS, spec, mode, "--name", name, "--data-dir", str(data),
            "--quiet"]
    for item in overrides:
        argv += ["-s", item]
    print("$", " ".join(argv[1:]), flush=True)
    code = subprocess.call(argv, cwd=REPO)
    if code != 0:
        raise SystemExit(f"docs_images: {spec} {mode} exited {code}")
    return data / name


def copy(src: Path, name: str) -> Path:
    """Copy one PNG into ``docs/images/name``.

    Raises:
        SystemExit: the PNG is missing or over ``MAX_BYTES``.
    """
    if not src.exists():
        raise SystemExit(f"docs_images: {src} was not written")
    if src.stat().st_size > MAX_BYTES:
        raise SystemExit(f"docs_images: {src} is {src.stat().st_size} bytes, over {MAX_BYTES}")
    IMAGES.mkdir(parents=True, exist_ok=True)
    dst = IMAGES / name
    shutil.copyfile(src, dst)
    print(f"wrote {dst.relative_to(REPO)} ({dst.stat().st_size // 1000} kB)")
    return dst


def main(argv: list[str] | None = None) -> int:
    """Run the searches and trains, draw ``lab compare``, copy the PNGs; returns 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=None, help="data dir of the runs (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the runs (with --work)")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="docs_images_"))
    try:
        dirs = {name: lab(work, spec, mode, name, overrides) for spec, mode, name, overrides in RUNS}
        copy(dirs["pbt"] / "graph/ppo_cartpole_pbt_lineage.png", "pbt_lineage.png")
        copy(dirs["pbt"] / "graph/ppo_cartpole_experiment_graph.png", "pbt_experiment_graph.png")
        out = work / "compare" / "ppo_vs_a2c.png"
        code = subprocess.call([sys.executable, str(REPO / "run_lab.py"), "compare", str(dirs["ppo"]),
                                str(dirs["a2c"]), "--out", str(out)], cwd=REPO)
        if code != 0:
            raise SystemExit(f"docs_images: lab compare exited {code}")
        copy(out, "compare.png")
    finally:
        if not (args.work and args.keep):
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
