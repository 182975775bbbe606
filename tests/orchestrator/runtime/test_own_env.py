"""A user's own gymnasium env, a module in the working directory named as ``env.name=myenvs:MyCart-v0``, in every
mode: ``dev``, ``train --name`` (its own local Ray, whose workers share the driver's filesystem),
``search --name`` joining the tests' shared Ray with ``--address`` (whose workers never saw the directory: it reaches
them as Ray's ``runtime_env`` ``working_dir``), ``enjoy@`` of the train's session and ``lab analyze``. Each runs as
the ``lab`` command does (``run_lab.py`` in a subprocess) with the temp directory as its working directory and
without PYTHONPATH pointing at it (docs/own-env.md). The env is registered with a string entry point and imports a
sibling module, so the whole directory must be importable, not only the named module.

Also the rule's pieces in-process: what a cluster is sent, and a directory that would hide the lab's own package.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from lab_helpers import DRIVER_ENV, REPO, SPECS, overrides

from orchestrator.errors import UsageError
from orchestrator.runtime import workdir

CORE = '''"""Constants of MyCart (a sibling module: the whole working directory must be importable)."""
EPISODE_STEPS = 10
'''
MODULE = '''"""MyCart: a 2-action env whose episodes end after 10 steps; action 1 earns 1."""
import os

import gymnasium as gym
import numpy as np

from mycart_core import EPISODE_STEPS

with open(IMPORTS, "a") as log:  # where each process imported this module from
    log.write(os.path.dirname(os.path.abspath(__file__)) + "\\n")


class MyCart(gym.Env):
    observation_space = gym.spaces.Box(0.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, render_mode=None):
        self.render_mode = render_mode
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        obs = np.array([self.t / EPISODE_STEPS, float(action)], np.float32)
        return obs, float(action), False, self.t >= EPISODE_STEPS, {}


gym.register("MyCart-v0", entry_point="myenvs:MyCart", max_episode_steps=EPISODE_STEPS)
'''
ITEMS = ["env.name=myenvs:MyCart-v0", "env.num_envs=2", "env.max_frame=256", "meta.log_frequency=64",
         "meta.checkpoint_frequency=128", "meta.eval_frequency=128", "meta.max_session=1", "meta.max_trial=1",
         "agent.algorithm.training_epoch=1", "agent.algorithm.time_horizon=16", "agent.algorithm.minibatch_size=32",
         'meta.resources={"num_cpus": 1, "num_gpus": 0}']
GRID = 'search={"agent.algorithm.gamma__grid_search": [0.9, 0.99]}'  # 2 trials


@pytest.fixture(scope="module")
def address(ray_local) -> str:
    """The GCS address of the tests' shared Ray (its workers were started before the temp directory existed)."""
    return ray_local.get_runtime_context().gcs_address


def lab(cwd: Path, *argv: str) -> subprocess.CompletedProcess:
    """``lab *argv`` (``run_lab.py``) in ``cwd``, with a PYTHONPATH that does not hold ``cwd``."""
    env = {**os.environ, **DRIVER_ENV}
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != cwd.resolve()]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return subprocess.run([sys.executable, str(REPO / "run_lab.py"), *argv], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=300)


def ok(proc: subprocess.CompletedProcess) -> str:
    """The run's stdout, once it exited 0 (else the test fails with its output)."""
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc.stdout


def test_own_env_every_mode(tmp_path: Path, address: str) -> None:
    """dev, train --name, search --name --address, enjoy@ and analyze of myenvs:MyCart-v0 each exit 0 with their
    outputs; every episode of the env lasts 10 steps with 1 per action 1, so returns lie in [0, 10]."""
    imports = tmp_path.parent / "imports.txt"
    (tmp_path / "myenvs.py").write_text(f"IMPORTS = {str(imports)!r}\n" + MODULE)
    (tmp_path / "mycart_core.py").write_text(CORE)
    spec = [SPECS, "ppo_cartpole"]

    ok(lab(tmp_path, *spec, "dev", "--data-dir", "dev", *overrides(ITEMS), "--quiet"))
    (dev_run,) = (tmp_path / "dev").glob("ppo_cartpole_*")
    assert list((dev_run / "graph").glob("*_session_graph.png"))

    ok(lab(tmp_path, *spec, "train", "--name", "tr", *overrides(ITEMS), "--quiet"))
    run = tmp_path / "data" / "tr"
    status = json.loads((run / "run.json").read_text())["sessions"]
    assert [s["status"] for s in status.values()] == ["done"]
    df = pd.read_parquet(run / "t0" / "s0" / "train_df.parquet")
    assert df["frame"].iloc[-1] == 256 and df["total_reward_ma"].dropna().between(0, 10).all()

    out = ok(lab(tmp_path, *spec, "search", "--name", "se", "--address", address, *overrides(ITEMS), "-s", GRID,
                 "--quiet"))
    search = tmp_path / "data" / "se"
    for t in ("t0", "t1"):
        assert list((search / "graph").glob(f"*_{t}_trial_graph.png")), (t, out)
    # the shared Ray's session actors imported the env from the copy Ray unpacked (runtime_env working_dir), as a
    # node without the driver's directory does; the driver and its local runs from the directory itself
    where = set(imports.read_text().split())
    assert str(tmp_path) in where and any("working_dir_files" in w for w in where), where

    ok(lab(tmp_path, *spec, f"enjoy@{run / 'ppo_cartpole_t0_s0_spec.json'}", "--episodes", "2",
           "--quiet"))
    (returns,) = (run / "enjoy").glob("*/returns.parquet")
    episodes = pd.read_parquet(returns)
    assert len(episodes) == 2 and episodes["t"].tolist() == [10, 10]
    assert episodes["total_reward"].between(0, 10).all()

    for graph in (run / "graph").iterdir():
        graph.unlink()
    ok(lab(tmp_path, "analyze", str(run)))
    assert list((run / "graph").glob("*_t0_trial_graph.png")) and list((run / "graph").glob("*_session_graph.png"))


def test_cluster_upload(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a joined cluster is sent: the directory with data/ and .venv/ left out; nothing inside a Ray job (its
    own working_dir decides) or past the size limit (with a warning)."""
    (tmp_path / "myenvs.py").write_text("")
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    env = workdir.runtime_env(str(tmp_path))
    assert env["working_dir"] == str(tmp_path) and {"data/", ".venv/"} <= set(env["excludes"])
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")
    assert workdir.runtime_env(str(tmp_path)) is None
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "big.bin").write_bytes(b"\0" * 4096)  # left out: not counted
    monkeypatch.setattr(workdir, "MAX_SEND_BYTES", 2048)
    assert workdir.directory_size(str(tmp_path))[1] == 1
    # a Ray temp dir in it (``ray start --temp-dir=./ray``) is neither counted nor sent: Ray's zip of the directory
    # is written inside it and would zip itself without end
    (tmp_path / "ray" / "head" / "session_1").mkdir(parents=True)
    (tmp_path / "ray" / "head" / "session_latest").symlink_to(tmp_path / "ray" / "head" / "session_1")
    (tmp_path / "ray" / "head" / "session_1" / "log.bin").write_bytes(b"\0" * 4096)
    assert workdir.directory_size(str(tmp_path)) == (0, 1, ["ray/head"])
    assert "/ray/head/" in workdir.runtime_env(str(tmp_path))["excludes"]
    (tmp_path / "weights.bin").write_bytes(b"\0" * 4096)
    assert workdir.runtime_env(str(tmp_path)) is None


def test_directory_hiding_the_lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A working directory with its own ``envs`` package is refused (it would hide the lab's); a plain one is put
    first on sys.path and last on PYTHONPATH, once."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    assert workdir.make_importable(str(tmp_path)) == str(tmp_path)
    workdir.make_importable(str(tmp_path))
    assert sys.path[0] == str(tmp_path) and sys.path.count(str(tmp_path)) == 1
    assert os.environ["PYTHONPATH"] == os.pathsep.join(["/elsewhere", str(tmp_path)])
    (tmp_path / "envs").mkdir()
    (tmp_path / "envs" / "__init__.py").write_text("")
    with pytest.raises(UsageError, match="hide the lab's own package 'envs'"):
        workdir.make_importable(str(tmp_path))
