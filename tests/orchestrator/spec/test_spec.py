"""Spec loading and validation: one test per kind of bad field, every problem reported at once, v4 and
v5 shapes, YAML, overrides, old env ids, defaults."""

import copy
import json
import warnings
from pathlib import Path

import pytest

from agents.algorithms import ALGORITHMS
from agents.nets import NETS
from orchestrator.errors import SpecError
from orchestrator.spec.load import apply_overrides, build, check, load_spec, parse_value, spec_hash
from orchestrator.spec.meta import MetaSpec
from orchestrator.store.predir import session_seed

REPO = Path(__file__).resolve().parents[3]
CARTPOLE = str(REPO / "specs" / "benchmark" / "cartpole.json")

FLAT = {
    "agent": {
        "name": "PPO",
        "algorithm": {"name": "PPO", "gamma": 0.99, "lam": 0.95, "time_horizon": 32, "training_epoch": 4},
        "memory": {"name": "OnPolicyBatchReplay"},
        "net": {"type": "MLPNet", "hid_layers": [32], "optim_spec": {"name": "Adam", "lr": 0.001}},
    },
    "env": {"name": "CartPole-v1", "num_envs": 2, "max_frame": 5000},
    "meta": {"max_session": 2, "log_frequency": 500, "random_seed": 3},
}

# The same spec in SLM-Lab v4 shape: one-element agent/env lists, a body key, trailing commas.
V4_TEXT = """{
  "ppo_v4": {
    "agent": [{
      "name": "PPO",
      "algorithm": {"name": "PPO", "gamma": 0.99, "lam": 0.95, "time_horizon": 32, "training_epoch": 4,},
      "memory": {"name": "OnPolicyBatchReplay",},
      "net": {"type": "MLPNet", "hid_layers": [32,], "optim_spec": {"name": "Adam", "lr": 0.001,},},
    }],
    "env": [{"name": "CartPole-v1", "num_envs": 2, "max_frame": 5000,}],
    "body": {"product": "outer", "num": 1},
    "meta": {"max_session": 2, "log_frequency": 500, "random_seed": 3,},
  },
}
"""

YAML_TEXT = """
ppo_yaml:
  agent:
    name: PPO
    algorithm: {name: PPO, gamma: 0.99, lam: 0.95, time_horizon: 32, training_epoch: 4}
    memory: {name: OnPolicyBatchReplay}
    net:
      type: MLPNet
      hid_layers: [32]
      optim_spec: {name: Adam, lr: 0.001}
  env: {name: CartPole-v1, num_envs: 2, max_frame: 5000}
  meta: {max_session: 2, log_frequency: 500, random_seed: 3}
"""


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def flat_file(tmp_path, spec=None, name="spec"):
    return write(tmp_path, "flat.json", json.dumps({name: spec if spec is not None else FLAT}))


def problems_of(overrides, spec=None):
    """The SpecError problems of FLAT (or ``spec``) with ``overrides``; fails if it validates."""
    raw = apply_overrides(copy.deepcopy(spec or FLAT), overrides)
    raw["name"] = "spec"
    with pytest.raises(SpecError) as err:
        check(raw)
    return err.value.problems


def only(problems):
    assert len(problems) == 1, problems
    return problems[0]


# ---------------------------------------------------------------- valid specs

def test_flat_spec_loads_and_fills_defaults(tmp_path):
    spec = load_spec(flat_file(tmp_path), "spec")
    assert spec["name"] == "spec"
    assert spec["agent"]["algorithm"]["lam"] == 0.95          # given
    assert spec["agent"]["algorithm"]["minibatch_size"] == 64  # PPOSpec default
    assert spec["agent"]["algorithm"]["clip_eps_spec"] == {"name": "no_decay", "start_val": 0.2}
    assert spec["agent"]["net"]["hid_layers_activation"] == "relu"
    assert spec["agent"]["net"]["clip_grad_val"] is None
    assert spec["env"]["max_t"] is None and spec["env"]["vectorization"] == "sync"
    assert spec["meta"]["log_frequency"] == 500
    assert spec["meta"]["eval_frequency"] == MetaSpec.eval_frequency == 10000
    assert spec["meta"]["keep_checkpoints"] == 3
    assert spec["meta"]["resources"] == {"num_cpus": 1, "num_gpus": 0}
    assert spec["search"] == {}
    run = build(spec)
    assert run.agent.algorithm.time_horizon == 32 and run.env.num_envs == 2 and run.meta.max_session == 2


@pytest.mark.parametrize("algo, memory", [("PPO", "OnPolicyBatchReplay"), ("REINFORCE", "OnPolicyReplay"),
                                          ("DQN", "Replay")])
def test_memory_defaults_to_the_algorithms_own(algo, memory):
    spec = check({"name": "x", "agent": {"algorithm": {"name": algo}},
                  "env": {"name": "CartPole-v1", "max_frame": 100}})
    assert spec["agent"]["memory"]["name"] == memory
    assert memory in ALGORITHMS[algo].memory_names


def test_benchmark_specs_all_validate():
    names = json.loads(Path(CARTPOLE).read_text())
    for name in names:
        spec = load_spec(CARTPOLE, name)
        assert spec["env"]["name"] == "CartPole-v1", name


def test_v4_shape_loads_equal_to_flat(tmp_path):
    v4 = load_spec(write(tmp_path, "v4.json", V4_TEXT), "ppo_v4")
    flat = load_spec(flat_file(tmp_path, name="ppo_v4"), "ppo_v4")
    assert v4 == flat
    assert "body" not in v4 and isinstance(v4["agent"], dict) and isinstance(v4["env"], dict)


def test_yaml_spec_loads_equal_to_json(tmp_path):
    for ext in ("yml", "yaml"):
        spec = load_spec(write(tmp_path, f"spec.{ext}", YAML_TEXT), "ppo_yaml")
        assert spec == load_spec(flat_file(tmp_path, name="ppo_yaml"), "ppo_yaml")


def test_overrides_apply_to_flat_and_v4_files(tmp_path):
    overrides = ["env.max_frame=777", "agent.algorithm.gamma=0.9", "agent.net.hid_layers=[16,16]",
                 "meta.random_seed=null", "agent.net.optim_spec.lr=3e-4", "env.name=CartPole-v0"]
    for path, name in ((write(tmp_path, "v4.json", V4_TEXT), "ppo_v4"), (flat_file(tmp_path), "spec")):
        spec = load_spec(path, name, overrides)
        assert spec["env"]["max_frame"] == 777
        assert spec["agent"]["algorithm"]["gamma"] == 0.9
        assert spec["agent"]["net"]["hid_layers"] == [16, 16]
        assert spec["meta"]["random_seed"] is None
        assert spec["agent"]["net"]["optim_spec"] == {"name": "Adam", "lr": 3e-4}
        assert spec["env"]["name"] == "CartPole-v0"  # still registered: kept as it is


def test_override_creates_missing_sections_and_parses_values():
    spec = apply_overrides({"env": {}}, ["agent.net.lr_scheduler_spec.name=StepLR", "meta.x=true"])
    assert spec == {"env": {}, "agent": {"net": {"lr_scheduler_spec": {"name": "StepLR"}}},
                    "meta": {"x": True}}
    assert parse_value("5") == 5 and parse_value("0.5") == 0.5 and parse_value("false") is False
    assert parse_value("null") is None and parse_value('{"a": 1}') == {"a": 1}
    assert parse_value("CartPole-v1") == "CartPole-v1" and parse_value("a=b") == "a=b"


def test_override_errors():
    with pytest.raises(SpecError, match="expected key.path=value"):
        apply_overrides(FLAT, ["env.max_frame"])
    with pytest.raises(SpecError, match="'max_frame' is not a section"):
        apply_overrides(FLAT, ["env.max_frame.x=1"])
    for item in ("=5", "env..max_frame=1", "env.=1", " =1"):
        with pytest.raises(SpecError, match=r"empty key in '.*', expected key.path=value"):
            apply_overrides(FLAT, [item])


def test_override_makes_an_invalid_spec_fail(tmp_path):
    with pytest.raises(SpecError, match="env.max_frame: must be > 0, got 0"):
        load_spec(write(tmp_path, "v4.json", V4_TEXT), "ppo_v4", ["env.max_frame=0"])


# ---------------------------------------------------------------- old env ids

def test_old_env_id_maps_with_warning(tmp_path):
    msg = "'Pendulum-v0' is not in gymnasium; using its successor 'Pendulum-v1'"
    with pytest.warns(UserWarning, match=msg):
        spec = load_spec(flat_file(tmp_path), "spec", ["env.name=Pendulum-v0"])
    assert spec["env"]["name"] == "Pendulum-v0"  # resolved again when the env is made


def test_lunar_lander_v2_maps_to_v3(tmp_path):
    from envs.make import EnvSpec, make_env

    with pytest.warns(UserWarning, match="using its successor 'LunarLander-v3'"):
        load_spec(flat_file(tmp_path), "spec", ["env.name=LunarLander-v2"])
    with pytest.warns(UserWarning):
        env = make_env(EnvSpec("LunarLander-v2", max_frame=10), seed=0)
    assert env.single_observation_space.shape == (8,)
    env.close()


def test_registered_old_version_runs_without_warning(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spec = load_spec(flat_file(tmp_path), "spec", ["env.name=CartPole-v0"])
    assert spec["env"]["name"] == "CartPole-v0"


# ---------------------------------------------------------------- one test per kind of bad field

def test_unknown_key_suggests_nearest():
    assert only(problems_of(["agent.algorithm.gama=0.9"])) == \
        "agent.algorithm.gama: unknown key; did you mean 'gamma'?"
    assert only(problems_of(["env.max_frames=10"])) == \
        "env.max_frames: unknown key; did you mean 'max_frame'?"
    assert only(problems_of(["metta.x=1"])) == "metta: unknown top-level key; did you mean 'meta'?"
    assert only(problems_of(["agent.nett.x=1"])) == "agent.nett: unknown key; did you mean 'net'?"


def test_unknown_key_without_close_match_lists_valid_keys():
    problem = only(problems_of(["meta.zzzz=1"]))
    assert problem.startswith("meta.zzzz: unknown key; valid keys: [") and "'log_frequency'" in problem


def test_wrong_type():
    assert only(problems_of(['agent.algorithm.gamma="high"'])) == \
        "agent.algorithm.gamma: expected float, got 'high'"
    assert only(problems_of(["env.num_envs=1.5"])) == "env.num_envs: expected int, got 1.5"
    assert only(problems_of(["env.num_envs=true"])) == "env.num_envs: expected int, got True"  # not a bool


def test_section_of_wrong_type():
    assert only(problems_of(["meta=3"])) == "meta: expected an object, got int"
    assert "agent.net: expected an object, got list" in problems_of(["agent.net=[]"])


def test_out_of_range():
    assert only(problems_of(["agent.algorithm.gamma=1.5"])) == "agent.algorithm.gamma: must be <= 1, got 1.5"
    assert only(problems_of(["agent.algorithm.lam=-0.1"])) == "agent.algorithm.lam: must be >= 0, got -0.1"
    assert only(problems_of(["meta.log_frequency=0"])) == "meta.log_frequency: must be > 0, got 0"
    assert only(problems_of(['env.vectorization="threads"'])) == \
        "env.vectorization: expected one of ['sync', 'async', 'auto', 'envpool'], got 'threads'"
    assert only(problems_of(['agent.memory.obs_dtype="float64"'])) == \
        "agent.memory.obs_dtype: expected one of ['float32', 'float16'], got 'float64'"
    assert only(problems_of(['env.autoreset="next"'])) == \
        "env.autoreset: expected one of ['same_step', 'next_step'], got 'next'"
    recurrent = ['agent.net.type="RecurrentNet"', "agent.net.rnn_hidden_size=8", "agent.net.seq_len=4"]
    assert only(problems_of(['env.autoreset="next_step"', *recurrent])) == \
        "env.autoreset: 'next_step' does not work with agent.net.type RecurrentNet (its observation windows " \
        "assume 'same_step'); expected env.autoreset: same_step"
    assert only(problems_of(["meta.distributed=true"])) == \
        "meta.distributed: expected false, 'synced' or 'shared', got True"


@pytest.mark.parametrize("value", [0, -5])
def test_nonpositive_max_frame(value):
    assert only(problems_of([f"env.max_frame={value}"])) == f"env.max_frame: must be > 0, got {value}"


def test_unknown_algorithm_lists_valid_names():
    problem = only(problems_of(["agent.algorithm.name=PPO2"]))
    assert problem.startswith("agent.algorithm.name: unknown name 'PPO2'; did you mean 'PPO'? (expected one of")
    for name in ALGORITHMS:
        assert f"'{name}'" in problem


def test_unknown_net_type():
    assert only(problems_of(["agent.net.type=ConvNett"])) == \
        f"agent.net.type: unknown name 'ConvNett'; did you mean 'ConvNet'? (expected one of {sorted(NETS)})"


def test_unknown_memory():
    assert only(problems_of(["agent.memory.name=FancyReplay"])) == (
        "agent.memory.name: unknown name 'FancyReplay'; did you mean 'OnPolicyReplay'? "
        "(expected one of ['OnPolicyBatchReplay', 'OnPolicyCrossEntropy', 'OnPolicyReplay', 'PrioritizedReplay', "
        "'Replay'])")


def test_memory_not_allowed_for_algorithm():
    assert only(problems_of(["agent.memory.name=Replay"])) == \
        "agent.memory.name: PPO needs one of ['OnPolicyBatchReplay', 'OnPolicyReplay', 'OnPolicyCrossEntropy'], " \
        "got 'Replay'"


@pytest.mark.parametrize("override, hint", [
    ('agent.optim_spec={"name":"Adam","lr":0.01}',
     "agent.optim_spec: unknown key; did you mean 'agent.net.optim_spec'?"),
    ("agent.algorithm.name=PPo", "agent.algorithm.name: unknown name 'PPo'; did you mean 'PPO'?"),
    ("agent.net.optim_spec.name=adam", "agent.net.optim_spec.name: unknown name 'adam'; did you mean 'Adam'?"),
    ("env.name=playground/CartPoleBalance", "did you mean 'playground/CartpoleBalance'?"),
    ('search={"agent.net.optim_spec.lr__logunform": [0.001, 0.01]}',
     "search.agent.net.optim_spec.lr__logunform: unknown space type 'logunform'; did you mean 'loguniform'?"),
])
def test_typos_get_the_closest_valid_word(override, hint):
    assert hint in only(problems_of([override]))


def test_unknown_optimizer_loss_and_lr_scheduler():
    assert only(problems_of(["agent.net.optim_spec.name=Adamm"])) == (
        "agent.net.optim_spec.name: unknown name 'Adamm'; did you mean 'Adam'? (expected one of ['Adam', 'AdamW', "
        "'GlobalAdam', 'GlobalRMSprop', 'Lookahead', 'RAdam', 'RMSprop', 'SGD'])")
    assert "agent.net.loss_spec.name: unknown name 'L1'" in \
        only(problems_of(['agent.net.loss_spec={"name":"L1"}']))
    assert "agent.net.lr_scheduler_spec.name: unknown name 'Exp'" in \
        only(problems_of(['agent.net.lr_scheduler_spec={"name":"Exp"}']))
    assert "agent.algorithm.clip_eps_spec.name: unknown name 'cos'" in \
        only(problems_of(['agent.algorithm.clip_eps_spec={"name":"cos"}']))


def test_bad_optimizer_and_schedule_arguments():
    assert "bad arguments for optimizer 'Adam'" in \
        only(problems_of(['agent.net.optim_spec={"name":"Adam","lr":0.001,"betaz":[0.9,0.9]}']))
    assert only(problems_of(['agent.net.optim_spec.lr="fast"'])) == \
        "agent.net.optim_spec.lr: expected a number >= 0, got 'fast'"
    assert "bad arguments for lr_scheduler 'StepLR'" in \
        only(problems_of(['agent.net.lr_scheduler_spec={"name":"StepLR"}']))
    assert "end_step=10 is before start_step=20" in only(problems_of(
        ['agent.algorithm.clip_eps_spec={"name":"linear_decay","start_val":0.2,"start_step":20,"end_step":10}']))


def test_unknown_activation_init_and_bad_widths():
    assert only(problems_of(["agent.net.hid_layers_activation=relux"])).startswith(
        "agent.net.hid_layers_activation: unknown name 'relux'; did you mean 'relu'? (expected one of ['elu'")
    assert only(problems_of(["agent.net.init_fn=he"])).startswith("agent.net.init_fn: unknown name 'he'")
    assert only(problems_of(['agent.net.hid_layers=[64,"a"]'])) == \
        "agent.net.hid_layers: expected a list of positive ints, got [64, 'a']"


@pytest.mark.parametrize("override, path", [('agent.algorithm.name=["PPO"]', "agent.algorithm.name"),
                                            ('agent.memory.name=["Replay"]', "agent.memory.name"),
                                            ('agent.net.type={"a":1}', "agent.net.type")])
def test_non_string_names_are_reported_not_crashing(override, path):
    assert any(p.startswith(f"{path}: unknown name") for p in problems_of([override]))


def test_unknown_env_id():
    assert only(problems_of(["env.name=CartPole-v99"])) == \
        "env.name: unknown env id 'CartPole-v99': gymnasium has no such environment registered; did you mean " \
        "'CartPole-v1'?"
    assert only(problems_of(["env.name=CartPole-v2"])).endswith("registered; did you mean 'CartPole-v1'?")
    assert only(problems_of(["env.name=NoSuchEnv-v0"])).endswith("no such environment registered")


def test_missing_required_key():
    spec = copy.deepcopy(FLAT)
    del spec["env"]["max_frame"]
    assert only(problems_of([], spec)) == "env.max_frame: required key is missing (int expected)"
    del spec["env"]["name"]
    assert "env.name: required key is missing (str expected)" in problems_of([], spec)


def test_missing_sections():
    with pytest.raises(SpecError, match="agent: expected an object"):
        check({"name": "x", "env": {"name": "CartPole-v1", "max_frame": 10}})
    with pytest.raises(SpecError, match="env: expected an object"):
        check({"name": "x", "agent": FLAT["agent"]})


def test_several_problems_reported_at_once():
    problems = problems_of(["agent.algorithm.gama=0.9", "env.max_frame=0", "agent.net.type=ConvNett",
                            "env.name=NoSuchEnv-v0", "meta.log_frequency=-1", "agent.memory.name=Replay"])
    paths = sorted(p.split(":")[0] for p in problems)
    assert paths == ["agent.algorithm.gama", "agent.memory.name", "agent.net.type", "env.max_frame",
                     "env.name", "meta.log_frequency"]
    with pytest.raises(SpecError) as err:
        check({**apply_overrides(FLAT, ["env.max_frame=0", "agent.net.type=X"]), "name": "s"})
    assert str(err.value).count("\n") == 1  # one line per problem


def test_inert_slm_lab_keys_only_with_neutral_values():
    check({**apply_overrides(FLAT, ["agent.algorithm.spectral_norm=false", "env.frame_op=null"]), "name": "s"})
    assert only(problems_of(["agent.algorithm.spectral_norm=true"])).startswith(
        "agent.algorithm.spectral_norm: SLM-Lab key not supported here")


def test_conv_net_keys_are_checked():
    """ConvNet keys validate at the edge: conv layer lists, fc widths (normalize is ignored by MLP nets); frame ops
    and Atari env keys are fields now."""
    check({**apply_overrides(FLAT, ["agent.net.type=ConvNet", "agent.net.normalize=true", "env.frame_op=concat",
                                    "env.frame_op_len=4"]), "name": "s"})
    assert only(problems_of(["agent.net.conv_hid_layers=[[32,8]]"])).startswith(
        "agent.net.conv_hid_layers[0]: conv layer [32, 8]: expected [out, kernel, stride, padding, dilation]")
    assert only(problems_of(["agent.net.fc_hid_layers=[0]"])) == \
        "agent.net.fc_hid_layers: expected a list of positive ints, got [0]"
    check({**apply_overrides(FLAT, ["agent.net.normalize=true"]), "name": "s"})  # MLPNet ignores it, as SLM-Lab's
    assert only(problems_of(["env.life_loss_info=true"])) == \
        "env.life_loss_info: applies to Atari (ALE) envs only, not 'CartPole-v1'"
    assert only(problems_of(['env.frame_op="glue"'])) == \
        "env.frame_op: expected one of ['concat', 'stack'], got 'glue'"


# ---------------------------------------------------------------- files

def test_json_error_reports_line_and_column(tmp_path):
    path = write(tmp_path, "bad.json", '{\n  "a": {\n    "b": 1\n    "c": 2\n  }\n}\n')
    with pytest.raises(SpecError, match=r"is not valid JSON: Expecting ',' delimiter at line 4, column 5"):
        load_spec(path, "a")


def test_yaml_error_reports_line_number(tmp_path):
    path = write(tmp_path, "bad.yml", "spec:\n  agent:\n    name: [PPO\n  env: {}\n")
    with pytest.raises(SpecError, match=r"is not valid YAML at line 4, column \d+"):
        load_spec(path, "spec")


def test_missing_file_and_wrong_shape(tmp_path):
    with pytest.raises(SpecError, match="does not exist"):
        load_spec(str(tmp_path / "nope.json"), "spec")
    with pytest.raises(SpecError, match="must map spec names to spec objects"):
        load_spec(write(tmp_path, "list.json", "[1, 2]"), "spec")


def test_unknown_spec_name_suggests(tmp_path):
    with pytest.raises(SpecError, match=r"spec name 'sepc' is not in .*it has: spec\. Did you mean 'spec'\?"):
        load_spec(flat_file(tmp_path), "sepc")


def test_trailing_commas_inside_strings_are_kept(tmp_path):
    name = "odd,}name,]"  # a comma before a bracket inside a string is not a trailing comma
    text = json.dumps({name: FLAT}).replace("}}", "},}")
    assert load_spec(write(tmp_path, "s.json", text), name)["name"] == name


# ---------------------------------------------------------------- hash and seeds

def test_spec_hash_is_canonical_and_sensitive():
    a = check({**FLAT, "name": "s"})
    reordered = json.loads(json.dumps(a, sort_keys=True))
    assert spec_hash(a) == spec_hash(reordered) and len(spec_hash(a)) == 16
    assert spec_hash(a) != spec_hash(apply_overrides(a, ["agent.algorithm.gamma=0.98"]))


def test_resume_keeps_a_saved_replay_layout_when_the_spec_leaves_it_unset():
    """A run saved with ``optimize_memory_usage`` true or false (its checkpointed replay is in that layout) resumed
    with a spec that leaves it null (the default: by the observations) keeps the saved value; an explicit other
    value contradicts the past."""
    from orchestrator.spec.resume import resume_edits

    new = check({**FLAT, "name": "s"})
    assert new["agent"]["memory"]["optimize_memory_usage"] is None
    for saved_value in (False, True):
        saved = copy.deepcopy(new)
        saved["agent"]["memory"]["optimize_memory_usage"] = saved_value
        merged, applied, conflicts = resume_edits(saved, new)
        assert conflicts == [] and applied == [] and merged["agent"]["memory"]["optimize_memory_usage"] is saved_value
        other = copy.deepcopy(new)
        other["agent"]["memory"]["optimize_memory_usage"] = not saved_value
        assert resume_edits(saved, other)[2] == [f"agent.memory.optimize_memory_usage: the run was saved with "
                                                 f"{saved_value!r}, the spec gives {not saved_value!r}"]


def test_session_seed():
    assert session_seed(3, 0, 0) == 3 and session_seed(3, 2, 1) == 2004


def test_resume_of_a_run_saved_before_new_fields():
    """A run saved by an older lab lacks fields added since (env.noop_max, agent.net.conv_hid_layers,
    agent.memory.optimize_memory_usage, ...): they take their defaults, so train@ finds no conflict."""
    from orchestrator.spec.resume import resume_edits

    new = check({**FLAT, "name": "s"})
    saved = copy.deepcopy(new)
    for section, key in (("env", "noop_max"), ("env", "frame_skip"), ("env", "frame_op")):
        del saved[section][key]
    for key in ("conv_hid_layers", "fc_hid_layers", "normalize"):
        del saved["agent"]["net"][key]
    del saved["agent"]["memory"]["optimize_memory_usage"]
    merged, applied, conflicts = resume_edits(saved, new)
    assert conflicts == [] and applied == [] and merged == new
    assert resume_edits(saved, {**new, "env": {**new["env"], "noop_max": 5}})[2] == [
        "env.noop_max: the run was saved with 30, the spec gives 5"]
