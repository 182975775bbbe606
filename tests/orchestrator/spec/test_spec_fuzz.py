"""Spec fuzz in CI: 60 seeded single-leaf mutations of the benchmark specs, each run as ``lab ... dev``
in-process for 300 frames. Every case exits 0 or 2 (one ``error:`` message, no traceback, no predir).

The generator and runner are ``bench/spec_fuzz.py`` (run it for hundreds of cases: ``--cases N``).
"""

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
N_CASES = 60
SEED = 0


def load_fuzz():
    spec = importlib.util.spec_from_file_location("spec_fuzz", REPO / "bench/spec_fuzz.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
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


# Every crash and hang the fuzz found (bench/spec_fuzz.py, all 1709 cases), now exit 2 naming the path.
FOUND = [
    ("dqn_cartpole", ("meta", "random_seed"), "negative", -1),  # gymnasium: Seed must be >= 0
    ("ppo_cartpole", ("agent", "net", "optim_spec", "lr"), "huge", 1e30),  # NaN weights: probability tensor
    ("dqn_cartpole", ("agent", "net", "loss_spec", "name_zz"), "unknown_key", 1),  # TypeError in make_loss
    ("dqn_cartpole", ("agent", "memory", "batch_size"), "huge", 10**12),  # MemoryError in Replay.sample
    ("dqn_cartpole", ("agent", "algorithm", "training_iter"), "huge", 10**12),  # hang
    ("ddqn_cartpole", ("agent", "algorithm", "training_batch_iter"), "huge", 10**12),  # hang
    ("ppo_cartpole", ("agent", "algorithm", "training_epoch"), "huge", 10**12),  # hang
    ("ppo_cartpole", ("agent", "algorithm", "entropy_coef_spec", "start_val"), "nan", float("nan")),  # NaN
    ("reinforce_cartpole", ("agent", "algorithm", "entropy_coef_spec", "end_val"), "inf", float("inf")),
    ("ppo_cartpole", ("agent", "algorithm", "val_loss_coef"), "inf", float("inf")),
    ("ppo_cartpole", ("agent", "net", "clip_grad_val"), "nan", float("nan")),
    ("dqn_cartpole", ("meta", "resources", "num_cpus"), "null", None),  # int(None) in dev
    ("ppo_cartpole", ("meta", "resources", "num_cpus"), "huge", 10**12),  # torch.set_num_threads overflow
]


@pytest.mark.parametrize("name, path, kind, value", FOUND, ids=[".".join(f[1]) + f":{f[2]}" for f in FOUND])
def test_fuzz_findings_exit_2_naming_the_path(name, path, kind, value, tmp_path):
    outcome, stderr = fuzz.run_case(SPECS[name], fuzz.Case(name, path, kind, value), tmp_path, timeout_s=10)
    assert outcome == "exit2", (outcome, stderr[-2000:])
    assert f"  {'.'.join(path[:-1]) if kind == 'unknown_key' else '.'.join(path)}" in stderr, stderr


@pytest.mark.parametrize("name, path", [("ddqn_atari", ("agent", "net", "conv_hid_layers", 2, 0)),
                                        ("dueling_ddqn_atari", ("agent", "net", "fc_hid_layers", 0))],
                         ids=["conv channels", "fc width"])
def test_a_huge_conv_net_exits_2_naming_its_layers(name, path, tmp_path):
    """Found by the fuzz (all 1709 cases): a conv net of 10**12 channels or fc units reached torch's allocator."""
    outcome, stderr = fuzz.run_case(SPECS[name], fuzz.Case(name, path, "huge", 10**12), tmp_path, timeout_s=60)
    assert outcome == "exit2", (outcome, stderr[-2000:])
    assert "  agent.net.conv_hid_layers: conv net" in stderr and "bytes" in stderr, stderr
