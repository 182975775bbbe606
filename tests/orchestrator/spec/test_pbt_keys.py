"""Which spec keys PBT may perturb, read from the field metadata ``perturbable`` next to each key: every key PBT's
documented list names (the glob patterns below: learning rates and optimizer arguments, loss coefficients, gamma,
lam, schedule values and frames, training_epoch/iter, target_entropy, clip_grad_val, the LR scheduler's arguments)
is perturbable by its metadata and no other key is, value by value over every key of every section dataclass; one
name means the same in every algorithm; a key without the metadata is refused by name; the key reference marks
them."""

import dataclasses
import fnmatch
from pathlib import Path

import pytest

from agents.algorithms import ALGORITHMS, AlgorithmSpec
from agents.memory import MemorySpec
from agents.nets import NetSpec
from agents.nets.spec import OPTIM_PERTURBABLE
from agents.schedules import SCHEDULE_PERTURBABLE
from envs.make import EnvSpec
from orchestrator.spec.meta import MetaSpec
from orchestrator.spec.pbt import perturbable, perturbable_keys, population_problems
from orchestrator.spec.search_space import SearchVar

REPO = Path(__file__).resolve().parents[3]
# the keys the PBT docs (docs/search.md "Population-based training") name, as fnmatch patterns (``*`` matches dots)
DOCUMENTED = (
    "agent.*optim_spec.lr", "agent.*optim_spec.weight_decay", "agent.*optim_spec.eps", "agent.*optim_spec.momentum",
    "agent.algorithm.alpha_lr", "agent.algorithm.gamma", "agent.algorithm.lam", "agent.algorithm.*_coef",
    "agent.algorithm.*_spec.start_val", "agent.algorithm.*_spec.end_val",
    "agent.algorithm.*_spec.start_step", "agent.algorithm.*_spec.end_step",
    "agent.algorithm.training_epoch", "agent.algorithm.training_iter", "agent.algorithm.target_entropy",
    "agent.*net.clip_grad_val", "agent.*lr_scheduler_spec.*",
)
NEVER = ("agent.*lr_scheduler_spec.name", "agent.*optim_spec.name", "agent.algorithm.*_spec.name")
SECTIONS = {"agent.algorithm": [AlgorithmSpec, *{a.spec_cls for a in ALGORITHMS.values()}],
            "agent.net": [NetSpec], "agent.critic_net": [NetSpec], "agent.memory": [MemorySpec], "env": [EnvSpec],
            "meta": [MetaSpec]}
LR_SCHEDULER_KEYS = ("name", "step_size", "gamma", "milestones", "frame", "T_max")


def documented(path: str) -> bool:
    return any(fnmatch.fnmatchcase(path, p) for p in DOCUMENTED) and \
        not any(fnmatch.fnmatchcase(path, p) for p in NEVER)


def every_key() -> list[str]:
    """Every key of every section dataclass, and inside a dict-valued one the keys it may hold: an optimizer's
    (name, its arguments), a schedule's (name, values, frames), an LR scheduler's."""
    out = []
    for prefix, classes in SECTIONS.items():
        for cls in classes:
            for f in dataclasses.fields(cls):
                path = f"{prefix}.{f.name}"
                out.append(path)
                if f.name.endswith("optim_spec"):
                    out += [f"{path}.{k}" for k in ("name", *OPTIM_PERTURBABLE, "betas", "foreach")]
                elif f.name == "lr_scheduler_spec":
                    out += [f"{path}.{k}" for k in LR_SCHEDULER_KEYS]
                elif f.name.endswith("_spec"):
                    out += [f"{path}.{k}" for k in ("name", *SCHEDULE_PERTURBABLE)]
    return sorted(set(out))


def test_every_documented_key_is_perturbable_by_its_metadata_and_no_other():
    keys = every_key()
    assert len(keys) > 150
    wrong = [(k, documented(k), perturbable(k)) for k in keys if documented(k) != perturbable(k)]
    assert wrong == []
    assert sum(map(perturbable, keys)) >= 40  # the documented list reaches real keys: a vacuous match fails


@pytest.mark.parametrize("path", ["agent.net.optim_spec.lr", "agent.critic_net.actor_optim_spec.eps",
                                  "agent.algorithm.alpha_optim_spec.lr", "agent.algorithm.gamma",
                                  "agent.algorithm.lam", "agent.algorithm.sil_val_loss_coef",
                                  "agent.algorithm.clip_eps_spec.end_step",
                                  "agent.algorithm.explore_var_spec.start_val",
                                  "agent.net.lr_scheduler_spec.step_size", "agent.net.clip_grad_val"])
def test_a_key_loses_its_perturbability_with_its_metadata(path, monkeypatch):
    """Removing one key's metadata makes PBT refuse it: the metadata alone decides."""
    assert perturbable(path)
    prefix, key = next((p, path[len(p) + 1:].split(".")[0]) for p in SECTIONS if path.startswith(p + "."))
    marks = {p: dict(m) for p, m in perturbable_keys().items()}
    del marks[prefix][key]
    monkeypatch.setattr("orchestrator.spec.pbt.perturbable_keys", lambda: marks)
    assert not perturbable(path)


def test_one_key_name_is_perturbable_alike_in_every_algorithm():
    marks: dict[str, set] = {}
    for cls in SECTIONS["agent.algorithm"]:
        for f in dataclasses.fields(cls):
            marks.setdefault(f.name, set()).add(repr(f.metadata.get("perturbable")))
    assert {name: m for name, m in marks.items() if len(m) > 1} == {}


def test_a_key_without_the_metadata_is_refused_by_name():
    variables = [SearchVar("agent.net.hid_layers", "choice", [[64], [32]]),
                 SearchVar("agent.algorithm.gamma", "uniform", [0.9, 0.99]),
                 SearchVar("agent.net.optim_spec.name", "choice", ["Adam", "SGD"])]
    problems = population_problems({"max_trial": 4}, variables)
    assert problems == [f"search.{v.path}__choice: PBT cannot change '{v.path}' mid-run (it would contradict the "
                        "checkpointed state); it may perturb learning rates, optimizer hyperparameters, loss "
                        "coefficients, gamma, lam, schedule values and frames, clip_grad_val and lr_scheduler_spec "
                        "arguments" for v in (variables[0], variables[2])]


def test_the_key_reference_marks_the_perturbable_keys():
    page = (REPO / "docs/reference/spec-keys.md").read_text()
    rows = {line.split("|")[1].strip(" `"): line for line in page.splitlines() if line.startswith("| `")}
    assert "PBT may perturb" in rows["gamma"] and "PBT may perturb" not in rows["max_frame"]
    assert "PBT may perturb `lr`, `weight_decay`, `eps`, `momentum`" in rows["optim_spec"]
