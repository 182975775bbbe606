"""Every lab command in the README's shell blocks runs: the blocks' ``lab ...`` and ``python run_lab.py ...``
commands, in order, in a fresh directory, with tiny budgets appended (``-s env.max_frame=...``); installs and
other programs (pip, tensorboard, ray) are left out. README sizes are checked too (about 15 KB at most)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
TINY = ["-s", "env.max_frame=1024", "-s", "meta.max_session=2", "-s", "meta.log_frequency=256",
        "-s", "meta.max_trial=2"]
MAX_README_BYTES = 15_500


def readme_commands() -> list[list[str]]:
    """The lab commands of the README's ```bash blocks, continuation lines joined, comments dropped."""
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S)
    commands = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == ["lab"] or words[:2] == ["python", "run_lab.py"]:
                commands.append(words)
    return commands


def as_argv(words: list[str]) -> list[str]:
    """A README command as this interpreter runs it, with ``TINY`` budgets for the modes that train."""
    argv = [sys.executable, "-m", "orchestrator.cli", *words[1:]] if words[0] == "lab" else \
        [sys.executable, str(REPO / "run_lab.py"), *words[2:]]
    mode = words[3] if words[0] == "lab" and len(words) > 3 else (words[4] if len(words) > 4 else "")
    if mode.split("@")[0] in ("dev", "train", "search"):
        argv += TINY
    return argv


def test_readme_is_short():
    assert len(README.read_bytes()) <= MAX_README_BYTES


def test_readme_lab_commands_run_in_order(tmp_path):
    commands = readme_commands()
    assert len(commands) >= 6, commands  # the demo and the tour at least
    (tmp_path / "specs").symlink_to(REPO / "specs")
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
           "PYTHONPATH": str(REPO)}
    for words in commands:
        out = subprocess.run(as_argv(words), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, f"{shlex.join(words)}\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    run = json.loads((tmp_path / "data" / "tour" / "run.json").read_text())
    assert sorted(run["sessions"]) == ["t0_s0", "t0_s1"]
    assert {s["status"] for s in run["sessions"].values()} == {"done"}
    assert run["resumes"] == []  # the second `train --name tour` found the run complete and left it alone
    (enjoy,) = (tmp_path / "data" / "tour" / "enjoy").iterdir()
    assert len(pd.read_parquet(enjoy / "returns.parquet")) == 3  # --episodes 3
    assert len(list(tmp_path.glob("compare_*.png"))) == 1 and len(list(tmp_path.glob("compare_*.html"))) == 1
    search = tmp_path / "data" / "tour-search"
    assert len(pd.read_parquet(search / "info" / "experiment_df.parquet")) == 2  # meta.max_trial=2 (TINY)
    assert [json.loads((search / f"t{t}" / "trial.json").read_text())["status"] for t in (0, 1)] == ["done", "done"]
