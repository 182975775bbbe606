"""SLM-Lab's own spec files (v5.3.0, unmodified): every entry validates or is refused naming a feature, none
crashes; a sample of classic-control entries runs in ``dev`` for 300 frames.

The files live outside the repository (``$SLM_LAB_SPECS``, default ``/work/shared/slm_lab_specs``); the tests
skip when they are absent. ``bench/slm_lab_specs.py`` runs the same sweep with counts (and ``--dev`` for all).
"""

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import slm_lab_specs as bench  # noqa: E402

ROOT = bench.DEFAULT_ROOT
FILES = bench.spec_files(ROOT)
pytestmark = pytest.mark.skipif(not FILES, reason=f"SLM-Lab spec files not found under {ROOT}")

# Words a refusal must contain to name what is missing (a feature, a key path with its expectation).
NAMING = ("SLM-Lab", "not supported", "not available", "expected", "must be", "needs", "unknown env id",
          "template variable", "does not exist in the spec", "does not read it")

# Classic-control entries that validate: each runs in dev (300 frames) in CI, one per algorithm family.
DEV_SAMPLE = [
    ("v5.3.0/benchmark/ppo/ppo_cartpole.json", "ppo_cartpole"),
    ("v5.3.0/benchmark/a2c/a2c_gae_cartpole.json", "a2c_gae_cartpole"),
    ("v5.3.0/benchmark/dqn/dqn_cartpole.json", "dqn_boltzmann_cartpole"),
    ("v5.3.0/benchmark/reinforce/reinforce_cartpole.json", "reinforce_cartpole"),
    ("v5.3.0/benchmark/sarsa/sarsa_cartpole.json", "sarsa_epsilon_greedy_cartpole"),
    ("v5.3.0/experimental/misc/random.json", "random_cartpole"),
]


def _entries():
    for version, path in FILES:
        names = bench.entry_names(path)
        for name in ([None] if isinstance(names, str) else names):
            yield pytest.param(path, name, id=f"{path.relative_to(ROOT)}::{name}")


@pytest.mark.parametrize("path, name", list(_entries()))
def test_every_v5_entry_validates_or_is_refused_by_name(path, name):
    assert name is not None, f"{path}: {bench.entry_names(path)}"
    outcome, message = bench.validate_entry(path, name, bench.template_fills(path))
    assert outcome in ("ok", "refused"), message
    if outcome == "refused":
        assert "Traceback" not in message
        for line in message.splitlines():
            assert ":" in line and any(word in line for word in NAMING), line
            assert "unknown key" not in line or "SLM-Lab" in line, f"an SLM-Lab key reported as unknown: {line}"


def test_sweep_counts_do_not_regress():
    """At least the entries that validated when this test was written still validate (81 of 389)."""
    result = bench.sweep(ROOT, [], 0, None, False)
    assert result["outcomes"].get("ok", 0) >= 81, result["reasons"][:5]
    assert not [r for r in result["records"] if r["outcome"].startswith("crash")]


@pytest.mark.parametrize("rel, name", DEV_SAMPLE)
def test_dev_runs_sample_of_classic_entries(rel, name):
    path = ROOT / rel
    if not path.exists():
        pytest.skip(f"{path} not found")
    assert bench.dev_entry(path, name, bench.template_fills(path), 300) == 0
