"""Spec fuzz in CI: 40 seeded single-leaf mutations of the benchmark specs, each run as ``lab ... dev``
in-process for 300 frames. Every case exits 0 or 2 (one ``error:`` message, no traceback, no predir).

The generator and runner are ``bench/spec_fuzz.py`` (run it for hundreds of cases: ``--cases N``).
"""

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
N_CASES = 40
SEED = 0


def load_fuzz():
    spec = importlib.util.spec_from_file_location("spec_fuzz", REPO / "bench/spec_fuzz.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fuzz = load_fuzz()
SPECS = fuzz.load_specs(sorted(map(str, (REPO / "specs/benchmark").glob("*.json"))))
CASES = fuzz.all_cases(SPECS, SEED, fuzz.BASE_KINDS)[:N_CASES]


def test_cases_cover_every_spec_and_kind():
    assert {c.spec_name for c in CASES} == set(SPECS)
    assert {c.kind for c in CASES} == set(fuzz.BASE_KINDS)
    assert fuzz.all_cases(SPECS, SEED, fuzz.BASE_KINDS)[:N_CASES] == CASES  # seeded: the same every run


@pytest.mark.parametrize("case", CASES, ids=[c.label.replace(" ", ":") for c in CASES])
def test_mutated_spec_exits_0_or_2_without_traceback(case, tmp_path):
    outcome, stderr = fuzz.run_case(SPECS[case.spec_name], case, tmp_path, timeout_s=30)
    assert outcome in ("ok", "exit2"), (outcome, stderr[-2000:])


@pytest.mark.parametrize("kind, value, expected", [
    ("huge", 7, (True, 10**12)), ("huge", 0.5, (True, 1e30)), ("negative", 0, (True, -1)),
    ("zero", 3, (True, 0)), ("empty", "relu", (True, "")), ("empty", [64], (True, [])),
    ("null", None, (False, None)), ("wrong_type", "relu", (True, 7)), ("wrong_type", True, (True, "x")),
    ("negative", "relu", (False, None)), ("fraction", 3, (True, 2.5)),
])
def test_mutations_of_one_value(kind, value, expected):
    assert fuzz.mutate(value, kind) == expected
