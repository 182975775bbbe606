"""One key for advantage normalization, ``normalize_advantages`` (SLM-Lab v5.3's PPO key and values, plus the lab's
``none``): the lab's earlier boolean ``normalize_advantage`` is read as its alias, value for value, with one warning
naming both keys, and a run's saved spec files carry the kept key alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from envs.clock import Clock
from orchestrator.spec.aliases import KeyAliasWarning
from orchestrator.spec.load import load_spec
from tests.agents.algorithms.helpers import SPECS, drive, make_algo

REPO = Path(__file__).resolve().parents[3]
SMALL = ["agent.algorithm.time_horizon=16", "agent.algorithm.minibatch_size=16", "agent.algorithm.training_epoch=2",
         "agent.net.hid_layers=[8]"]


def _advantages_and_loss(overrides: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[list[torch.Tensor], float]:
    """PPO on a 2-env random rollout of 16 steps (one update, 2 epochs of 2 minibatches): the advantages each
    minibatch's policy loss saw (after normalization) and the update's total loss."""
    algo = make_algo("ppo_cartpole", SMALL + overrides, num_envs=2, seed=3)
    seen: list[torch.Tensor] = []
    policy_loss = algo.policy_loss
    monkeypatch.setattr(algo, "policy_loss", lambda logp, mb, adv, *a: seen.append(adv.detach().clone())
                        or policy_loss(logp, mb, adv, *a))
    losses = []
    update = algo.update
    monkeypatch.setattr(algo, "update", lambda clock: losses.append(update(clock)) or losses[-1])
    assert drive(algo, Clock(32, 2), 16, seed=5) == 1
    return seen, losses[0].loss


@pytest.mark.parametrize(("alias", "kept"), [("false", "none"), ("true", "standardize")])
def test_alias_gives_the_kept_keys_advantages_and_loss(alias, kept, monkeypatch):
    """``normalize_advantage: false`` is ``normalize_advantages: none`` and ``true`` is ``standardize``, tensor for
    tensor (same seed, same rollout); and the two settings really differ (standardized minibatches have mean 0)."""
    with pytest.warns(KeyAliasWarning):
        via_alias, loss_alias = _advantages_and_loss([f"agent.algorithm.normalize_advantage={alias}"], monkeypatch)
    via_kept, loss_kept = _advantages_and_loss([f"agent.algorithm.normalize_advantages={kept}"], monkeypatch)
    assert len(via_alias) == len(via_kept) == 4
    for a, b in zip(via_alias, via_kept, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert loss_alias == loss_kept
    means = [float(adv.mean()) for adv in via_kept]
    if kept == "standardize":
        assert all(abs(m) < 1e-5 for m in means)
    else:
        assert any(abs(m) > 1e-3 for m in means)


@pytest.mark.parametrize(("overrides", "expected"), [
    (["agent.algorithm.normalize_advantage=false"], "none"),
    (["agent.algorithm.normalize_advantage=true"], "standardize"),
    (["agent.algorithm.normalize_advantage=false", "agent.algorithm.normalize_advantages=standardize"], "none"),
    (["agent.algorithm.normalize_advantage=false", "agent.algorithm.normalize_advantages=percentile"], "percentile"),
    (["agent.algorithm.normalize_advantage=true", "agent.algorithm.normalize_advantages=none"], "none"),
])
def test_alias_maps_onto_one_key(overrides, expected):
    """The loaded spec (what a run saves) has ``normalize_advantages`` alone; a spec written before the rename,
    which carried both keys, keeps its meaning (false switched standardization off, never percentile scaling)."""
    with pytest.warns(KeyAliasWarning, match="normalize_advantage is the earlier name of "
                                             "agent.algorithm.normalize_advantages"):
        algo = load_spec(SPECS, "ppo_cartpole", overrides)["agent"]["algorithm"]
    assert algo["normalize_advantages"] == expected and "normalize_advantage" not in algo


def test_kept_key_alone_no_warning_and_other_algorithms():
    """Without the alias nothing is warned and the default is SLM-Lab's ``standardize``; A2C and REINFORCE take
    the same key; a DQN spec, which has neither, still refuses the alias as an unknown key."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", KeyAliasWarning)
        ppo = load_spec(SPECS, "ppo_cartpole")["agent"]["algorithm"]
    assert ppo["normalize_advantages"] == "standardize" and "normalize_advantage" not in ppo
    with pytest.warns(KeyAliasWarning):
        a2c = load_spec(SPECS, "a2c_gae_cartpole", ["agent.algorithm.normalize_advantage=false"])
    assert a2c["agent"]["algorithm"]["normalize_advantages"] == "none"
    from orchestrator.errors import SpecError
    with pytest.raises(SpecError, match="agent.algorithm.normalize_advantage: unknown key"):
        load_spec(str(REPO / "specs" / "demo.json"), "dqn_cartpole", ["agent.algorithm.normalize_advantage=false"])


def test_search_over_the_alias_is_renamed():
    """``normalize_advantage__choice: [true, false]`` is searched as ``normalize_advantages__choice:
    ['standardize', 'none']``."""
    with pytest.warns(KeyAliasWarning, match="searched as normalize_advantages__choice"):
        spec = load_spec(SPECS, "ppo_cartpole", ['search={"agent": {"algorithm": {"normalize_advantage__choice": '
                                                 '[true, false]}}}'])
    assert spec["search"]["agent"]["algorithm"] == {"normalize_advantages__choice": ["standardize", "none"]}


def test_dev_run_warns_once_and_saves_one_key(tmp_path):
    """``lab dev`` with the alias: one ``warning:`` line naming both keys on stderr, and every spec file of the
    run (run, trial, session) has ``normalize_advantages: 'none'`` and no ``normalize_advantage``."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "run_lab.py", "specs/demo.json", "ppo_cartpole", "dev",
                          "-s", "env.max_frame=300", "-s", "agent.algorithm.normalize_advantage=false",
                          "--data-dir", str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = [line for line in out.stderr.splitlines() if "normalize_advantage " in line]
    assert lines == ["warning: agent.algorithm.normalize_advantage is the earlier name of "
                     "agent.algorithm.normalize_advantages: normalize_advantage: false is read as "
                     "normalize_advantages: 'none'; write normalize_advantages (the run's saved spec has it alone)"]
    files = sorted(tmp_path.glob("ppo_cartpole_*/ppo_cartpole*_spec.json"))
    assert len(files) == 3
    for path in files:
        algo = json.loads(path.read_text())["agent"]["algorithm"]
        assert algo["normalize_advantages"] == "none" and "normalize_advantage" not in algo, path


def test_a_run_saved_before_the_rename_resumes():
    """A run saved with both keys (as every run before the rename was) resumes: the merge reads its alias silently,
    so the same command finds no contradiction, and a command that changes the setting is refused naming the kept
    key with both values."""
    import copy

    from orchestrator.spec.load import check
    from orchestrator.spec.resume import resume_edits

    new = load_spec(SPECS, "ppo_cartpole")
    saved = copy.deepcopy(new)
    saved["agent"]["algorithm"]["normalize_advantage"] = True
    with warnings.catch_warnings():
        warnings.simplefilter("error", KeyAliasWarning)
        merged, applied, conflicts = resume_edits(saved, new)
        assert (applied, conflicts) == ([], [])
        assert check(merged)["agent"]["algorithm"]["normalize_advantages"] == "standardize"
        assert "normalize_advantage" not in check(merged)["agent"]["algorithm"]
    saved_off = copy.deepcopy(saved)
    saved_off["agent"]["algorithm"]["normalize_advantage"] = False
    with pytest.warns(KeyAliasWarning):
        same_command = load_spec(SPECS, "ppo_cartpole", ["agent.algorithm.normalize_advantage=false"])
    assert resume_edits(saved_off, same_command)[2] == []
    assert resume_edits(saved_off, new)[2] == [
        "agent.algorithm.normalize_advantages: the run was saved with 'none', the spec gives 'standardize'"]
