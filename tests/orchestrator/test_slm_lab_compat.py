"""SLM-Lab spec-file conventions: ``${var}`` templates filled by ``-s``, YAML ``_name`` anchor entries,
integral floats in int keys, SLM-Lab keys refused by name (never "unknown key"), SLM-Lab search syntax."""

import json

import pytest

from orchestrator.spec import SpecError, load_spec, spec_names

PPO = {
    "agent": {"name": "PPO",
              "algorithm": {"name": "PPO", "gamma": 0.99, "lam": 0.95, "time_horizon": 32, "training_epoch": 4},
              "memory": {"name": "OnPolicyBatchReplay"},
              "net": {"type": "MLPNet", "hid_layers": [32], "optim_spec": {"name": "Adam", "lr": 0.001}}},
    "env": {"name": "CartPole-v1", "num_envs": 2, "max_frame": 5000},
    "meta": {"max_session": 1, "log_frequency": 500, "random_seed": 3},
}


def write(tmp_path, spec, name="s", fname="spec.json"):
    path = tmp_path / fname
    path.write_text(json.dumps({name: spec}))
    return str(path)


def with_(spec, path, value):
    """A copy of ``spec`` with the leaf at dotted ``path`` set."""
    out = json.loads(json.dumps(spec))
    *parents, leaf = path.split(".")
    node = out
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return out


def problems(tmp_path, spec, overrides=None):
    with pytest.raises(SpecError) as err:
        load_spec(write(tmp_path, spec), "s", overrides or [])
    return err.value.problems


# ---------------------------------------------------------------- templates, anchors, floats

def test_templates_filled_from_set_as_slm_lab_does(tmp_path):
    text = json.dumps({"s": with_(with_(PPO, "env.name", "${env}"), "env.max_frame", "${max_frame}")})
    path = tmp_path / "t.json"
    path.write_text(text)
    spec = load_spec(str(path), "s", ["env=Acrobot-v1", "max_frame=3e3", "meta.log_frequency=100"])
    assert spec["env"]["name"] == "Acrobot-v1"
    assert spec["env"]["max_frame"] == 3000 and isinstance(spec["env"]["max_frame"], int)
    assert spec["meta"]["log_frequency"] == 100


def test_unfilled_template_is_refused_naming_the_variable(tmp_path):
    found = problems(tmp_path, with_(PPO, "env.name", "${env}"))
    assert found == ["env.name: '${env}' is a template variable of the spec file (SLM-Lab v5); fill it on the "
                     "command line with -s env=VALUE"]


def test_yaml_anchor_entries_are_not_specs(tmp_path):
    path = tmp_path / "a.yaml"
    path.write_text("""
_meta: &meta
  max_session: 1
  log_frequency: 500
  random_seed: 3
_hid: &hid [32]
ppo_a:
  agent:
    name: PPO
    algorithm: {name: PPO, gamma: 0.99, lam: 0.95, time_horizon: 32, training_epoch: 4}
    memory: {name: OnPolicyBatchReplay}
    net: {type: MLPNet, hid_layers: *hid, optim_spec: {name: Adam, lr: 0.001}}
  env: {name: CartPole-v1, num_envs: 2, max_frame: 5000}
  meta: *meta
""")
    assert spec_names(str(path)) == ["ppo_a"]
    assert load_spec(str(path), "ppo_a")["meta"]["random_seed"] == 3
    with pytest.raises(SpecError, match="only hold anchors"):
        load_spec(str(path), "_meta")


def test_integral_float_in_int_key_is_cast_fractional_refused(tmp_path):
    assert load_spec(write(tmp_path, with_(PPO, "env.max_frame", 5e3)), "s")["env"]["max_frame"] == 5000
    assert problems(tmp_path, with_(PPO, "env.max_frame", 5000.5)) == ["env.max_frame: expected int, got 5000.5"]
