"""The house rules of docs/ARCHITECTURE.md, checked: the import contracts (layers, no cycles, a Ray-free core) hold
and catch a violation, no module imports another's private names, modules stay short unless they say why, every
private-API patch still applies to the pinned library, and a new algorithm is one file plus a registry line."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("orchestrator", "agents", "envs")
MAX_LINES = 500
KEPT_WHOLE = "Kept whole:"  # a module docstring line saying why a long module is one concept


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` with the contracts of ``root``/pyproject.toml, on the packages under ``root``."""
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})


def test_import_contracts_hold():
    out = lint_imports(REPO)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


@pytest.mark.parametrize("module, line, broken", [
    ("orchestrator/store/storage.py", "from orchestrator import cli  # noqa", "Layers"),  # a layer importing up
    ("envs/clock.py", "import agents.memory  # noqa", "Layers"),
    ("orchestrator/report/stats.py", "from orchestrator.report import analysis  # noqa", "No import cycles"),
    ("orchestrator/session/loop.py", "import ray  # noqa", "without Ray"),
    ("agents/schedules.py", "from orchestrator.errors import SpecError  # noqa", "never import the orchestrator"),
])
def test_import_contracts_catch_a_violation(tmp_path, module, line, broken):
    for name in PACKAGES:
        shutil.copytree(REPO / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / module
    target.write_text(target.read_text() + f"\n{line}\n")
    out = lint_imports(tmp_path)
    assert out.returncode == 1, out.stdout[-3000:]
    broken_names = [x for x in out.stdout.splitlines() if x.endswith(" BROKEN")]
    assert any(broken in x for x in broken_names), out.stdout[-3000:]


def modules() -> list[Path]:
    return sorted(p for name in PACKAGES for p in (REPO / name).rglob("*.py"))


def test_no_module_imports_another_modules_private_names():
    found = []
    for path in modules():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES:
                found += [f"{path.relative_to(REPO)}: from {node.module} import {a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    assert found == []


def test_orchestrator_modules_are_short_or_say_why_they_are_kept_whole():
    long = []
    for path in sorted((REPO / "orchestrator").rglob("*.py")):
        text = path.read_text()
        if text.count("\n") > MAX_LINES and KEPT_WHOLE not in (ast.get_docstring(ast.parse(text)) or ""):
            long.append(f"{path.relative_to(REPO)}: {text.count(chr(10))} lines")
    assert long == []


def test_every_private_api_patch_applies_to_the_pinned_library():
    """Each patch in orchestrator/runtime/ and agents/torch_optim.py recognizes the library it was checked on; a new
    torch or Ray that changes the patched names fails here (the patch then falls back to the public API: re-measure,
    re-check or remove)."""
    from agents import torch_optim
    from orchestrator.runtime import ray_drain, ray_params

    assert ray_params.applies(), f"Ray changed under orchestrator/runtime/ray_params.py ({ray_params.CHECKED_ON})"
    assert ray_drain.applies(), f"Ray changed under orchestrator/runtime/ray_drain.py ({ray_drain.CHECKED_ON})"
    assert torch_optim.applies(), f"torch changed under agents/torch_optim.py ({torch_optim.CHECKED_ON})"


def test_pyarrow_still_probes_pandas_and_the_patch_stops_it():
    """pyarrow's first conversion imports pandas (what the patch exists for) and, after ``skip_pandas_probe``,
    does not; Parquet bytes are the same either way."""
    child = textwrap.dedent("""
        import sys, io, json, os
        import pyarrow as pa, pyarrow.parquet as pq
        patched = sys.argv[1] == "1"
        if patched:
            from orchestrator.runtime.pyarrow_probe import skip_pandas_probe
            skip_pandas_probe()
        buf = io.BytesIO()
        pq.write_table(pa.Table.from_pylist([{"frame": 1, "total_reward": 2.5}]), buf)
        rows = pq.read_table(io.BytesIO(buf.getvalue())).to_pylist()
        print(json.dumps({"pandas": "pandas" in sys.modules, "rows": rows}), flush=True)
        os._exit(0)  # the subject is the imports above, not the interpreter's teardown of pyarrow's threads
    """)
    results = {}
    for patched in ("0", "1"):
        out = subprocess.run([sys.executable, "-c", child, patched], cwd=REPO, capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        results[patched] = out.stdout.strip().splitlines()[-1]
    import json
    plain, patched = json.loads(results["0"]), json.loads(results["1"])
    assert plain["pandas"] is True, "pyarrow no longer imports pandas on its probe: remove runtime/pyarrow_probe.py"
    assert patched["pandas"] is False
    assert plain["rows"] == patched["rows"] == [{"frame": 1, "total_reward": 2.5}]


TRIVIAL_ALGORITHM = '''
"""Constant: always the first action, never trains (a test's one-file algorithm)."""
import numpy as np

from agents.algorithms.random import Random


class Constant(Random):
    """Acts ``action_space.start`` for every sub-env."""

    def act(self, obs_NO, clock, deterministic=False):
        return np.full(len(obs_NO), self.action_space.start, dtype=np.int64)
'''


def test_a_new_algorithm_is_one_file_plus_a_registry_line(tmp_path, monkeypatch):
    """An algorithm in a new file, registered by one line, runs ``dev`` through the CLI: no other file touched."""
    from agents.algorithms import ALGORITHMS
    from orchestrator import cli

    (tmp_path / "constant_algo.py").write_text(TRIVIAL_ALGORITHM)
    monkeypatch.syspath_prepend(str(tmp_path))
    from constant_algo import Constant

    monkeypatch.setitem(ALGORITHMS, "Constant", Constant)  # the registry line
    data = tmp_path / "data"
    argv = [str(REPO / "specs/benchmark/cartpole.json"), "random_cartpole", "dev", "--quiet", "--data-dir", str(data),
            "-s", "agent.algorithm.name=Constant", "-s", "env.max_frame=600", "-s", "meta.log_frequency=200"]
    assert cli.main(argv) == 0
    (predir,) = data.glob("random_cartpole_*")
    import pandas as pd

    df = pd.read_parquet(next(predir.rglob("train_df.parquet")))
    assert list(df["frame"]) == [200, 400, 600] and (df["opt_step"] == 0).all()
    # always pushing left ends CartPole-v1 episodes within 8-10 steps
    assert df["total_reward"].between(8, 11).all(), df["total_reward"].tolist()
