"""SLM-Lab spec-file conventions: ``${var}`` templates filled by ``-s``, YAML ``_name`` anchor entries,
integral floats in int keys, SLM-Lab keys refused by name (never "unknown key"), SLM-Lab search syntax."""

import json

import pytest

from orchestrator.errors import SpecError
from orchestrator.spec.files import spec_names
from orchestrator.spec.load import load_spec
from orchestrator.spec.slm_lab import ANY, SLM_LAB_KEYS

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


# ---------------------------------------------------------------- SLM-Lab keys and names

def _section_fields(path):
    import dataclasses

    from agents.algorithms import ALGORITHMS
    from agents.memory import MemorySpec
    from agents.nets import NetSpec
    from envs.make import EnvSpec
    from orchestrator.spec.meta import MetaSpec
    classes = {"agent.algorithm": ALGORITHMS["PPO"].spec_cls, "agent.memory": MemorySpec, "agent.net": NetSpec,
               "env": EnvSpec, "meta": MetaSpec, "agent": None}
    cls = classes[path.rpartition(".")[0]]
    return {f.name for f in dataclasses.fields(cls)} if cls else {"name", "algorithm", "memory", "net"}


def test_no_table_row_names_a_built_feature():
    """A row of the SLM-Lab tables is read only for keys that are not fields and names not registered: once the
    feature is built the row is dead and must go (its message would otherwise claim the feature is missing)."""
    import dataclasses

    from agents.algorithms import ALGORITHMS
    from agents.memory import MEMORIES
    from agents.nets import LOSSES, NETS, OPTIMIZERS
    from orchestrator.spec.slm_lab import SLM_LAB_NAMES
    dead = []
    for key in SLM_LAB_KEYS:
        section, _, leaf = key.rpartition(".")
        if section == "agent.algorithm":  # a key some algorithm reads is still refused for the others
            built = all(leaf in {f.name for f in dataclasses.fields(a.spec_cls)} for a in ALGORITHMS.values())
        else:
            built = leaf in _section_fields(key)
        dead += [key] if built else []
    registries = {"agent.algorithm.name": ALGORITHMS, "agent.net.type": NETS, "agent.memory.name": MEMORIES,
                  "optimizer": OPTIMIZERS, "agent.net.loss_spec.name": LOSSES}
    assert set(SLM_LAB_NAMES) == set(registries)
    dead += [f"{path}={name}" for path, table in SLM_LAB_NAMES.items() for name in table if name in registries[path]]
    assert dead == []


def _unimplemented_keys():
    return [k for k in SLM_LAB_KEYS if k.rpartition(".")[2] not in _section_fields(k) and ANY not in SLM_LAB_KEYS[k][0]]


@pytest.mark.parametrize("key", _unimplemented_keys())
def test_every_slm_lab_key_is_refused_by_feature_never_unknown(tmp_path, key):
    found = problems(tmp_path, with_(PPO, key, "not-a-neutral-value"))
    assert found[0].startswith(f"{key}: SLM-Lab key not supported here: {SLM_LAB_KEYS[key][1]}")
    assert not any("unknown key" in p for p in found)


@pytest.mark.parametrize("key", [k for k in _unimplemented_keys() if SLM_LAB_KEYS[k][0]])
def test_slm_lab_keys_load_with_their_neutral_values(tmp_path, key):
    spec = PPO if not key.startswith("agent.net.") else with_(PPO, "agent.net.init_fn", "orthogonal_")
    for value in SLM_LAB_KEYS[key][0]:
        load_spec(write(tmp_path, with_(spec, key, value)), "s")


def test_recurrent_net_keys_are_fields_and_checked(tmp_path):
    net = {"type": "RecurrentNet", "cell_type": "GRU", "rnn_hidden_size": 8, "rnn_num_layers": 1, "seq_len": 4,
           "fc_hid_layers": [], "bidirectional": False}
    load_spec(write(tmp_path, with_(PPO, "agent.net", net)), "s")
    found = problems(tmp_path, with_(PPO, "agent.net", {**net, "cell_type": "TCN", "seq_len": 0}))
    assert "agent.net.cell_type: expected one of ['GRU', 'LSTM', 'RNN'], got 'TCN'" in found
    assert "agent.net.seq_len: must be > 0, got 0" in found


def test_head_init_stds_need_orthogonal_init(tmp_path):
    spec = with_(with_(PPO, "agent.net.actor_init_std", 0.01), "agent.net.critic_init_std", 1.0)
    load_spec(write(tmp_path, with_(spec, "agent.net.init_fn", "orthogonal_")), "s")
    assert problems(tmp_path, with_(spec, "agent.net.init_fn", "xavier_uniform_"))[0].startswith(
        "agent.net.actor_init_std: SLM-Lab's head init std applies only with init_fn 'orthogonal_'")


def test_slm_lab_names_are_refused_by_feature(tmp_path):
    found = problems(tmp_path, with_(PPO, "agent.algorithm.name", "HydraDQN"))
    assert found[0].startswith("agent.algorithm.name: 'HydraDQN' (SLM-Lab's multi-env hydra DQN")
    found = problems(tmp_path, with_(PPO, "agent.net.loss_spec", {"name": "CrossEntropyLoss"}))
    assert found[0].startswith("agent.net.loss_spec.name: 'CrossEntropyLoss' (a classification loss")


@pytest.mark.parametrize("name", ["GlobalAdam", "GlobalRMSprop"])
def test_global_optimizers_need_distributed(tmp_path, name):
    found = problems(tmp_path, with_(PPO, "agent.net.optim_spec.name", name))
    assert found == [f"agent.net.optim_spec.name: {name!r} is SLM-Lab's optimizer of meta.distributed training (one "
                     f"global net per trial); set meta.distributed to 'synced' or 'shared', or use "
                     f"{name.removeprefix('Global')!r}"]
    for mode in ("synced", "shared"):
        spec = load_spec(write(tmp_path, with_(with_(PPO, "agent.net.optim_spec.name", name), "meta.distributed",
                                               mode)), "s")
        assert (spec["meta"]["distributed"], spec["agent"]["net"]["optim_spec"]["name"]) == (mode, name)


# ---------------------------------------------------------------- search syntax

@pytest.mark.parametrize("kind, arg, check", [
    ("quniform", [0.9, 0.99, 0.01], lambda v: 0.9 <= v <= 0.99 and abs(v * 100 - round(v * 100)) < 1e-6),
    ("qloguniform", [0.9, 0.99, 0.01], lambda v: 0.9 <= v <= 0.99),
    ("qrandint", [32, 64, 8], lambda v: v in (32, 40, 48, 56, 64)),
    ("lograndint", [16, 64], lambda v: 16 <= v < 64 and isinstance(v, int)),
    ("qlograndint", [16, 64, 16], lambda v: v in (16, 32, 48, 64)),
    ("randn", [0.95, 0.01], lambda v: isinstance(v, float)),
    ("qrandn", [0.95, 0.01, 0.01], lambda v: isinstance(v, float)),
    ("normal", [0.95, 0.01], lambda v: isinstance(v, float)),
])
def test_tune_search_types_parse_and_sample(kind, arg, check):
    from orchestrator.search.tune import param_space
    from orchestrator.spec.load import check as check_spec
    path = "agent.algorithm.time_horizon" if "int" in kind else "agent.algorithm.gamma"
    spec = check_spec({**with_(PPO, "search", {f"{path}__{kind}": arg}), "name": "s"})
    domain = param_space(spec)[path]
    assert all(check(domain.sample()) for _ in range(20))


def test_bad_quantized_arguments_and_sample_from(tmp_path):
    found = problems(tmp_path, with_(PPO, "search", {"agent.algorithm.time_horizon__qrandint": [32, 64, 0],
                                                     "agent.algorithm.gamma__sample_from": [1],
                                                     "agent.algorithm.lam__quniform": [0.9, 0.99]}))
    assert found == ["search.agent.algorithm.time_horizon__qrandint: qrandint needs a step q > 0, got 0",
                     "search.agent.algorithm.gamma__sample_from: Tune's sample_from takes a Python function, which "
                     "a spec file cannot hold; use one of ['grid_search', 'choice', 'uniform', 'quniform', "
                     "'loguniform', 'qloguniform', 'randint', 'qrandint', 'lograndint', 'qlograndint', 'normal', "
                     "'randn', 'qrandn']",
                     "search.agent.algorithm.lam__quniform: quniform expects a list of 3 numbers, got [0.9, 0.99]"]


def test_search_of_an_slm_lab_key_names_its_feature(tmp_path):
    """A search over a key SLM-Lab reads nowhere is run as SLM-Lab runs it (the key set, unread); one over a key
    with a feature the lab lacks is refused naming it."""
    spec = load_spec(write(tmp_path, with_(PPO, "search", {"agent": {"net": {"lr_decay_frequency__choice": [1, 2]}}})),
                     "s", [])
    assert spec["search"] == {"agent": {"net": {"lr_decay_frequency__choice": [1, 2]}}}
    trial = load_spec(write(tmp_path, with_(PPO, "agent.net.lr_decay_frequency", 2)), "s", [])  # a trial's value
    assert trial["agent"]["net"]["lr_decay_frequency"] == 2
    found = problems(tmp_path, with_(PPO, "search", {"agent": {"algorithm": {"entropy_coef__choice": [0.1, 0.2]}}}))
    assert found == ["search.agent.algorithm.entropy_coef__choice: searches 'agent.algorithm.entropy_coef', an SLM-Lab "
                     "key not supported here: SLM-Lab v4's fixed entropy coefficient (v5 and the lab: "
                     "entropy_coef_spec)"]


def test_v4_list_shaped_search_and_random_search(tmp_path):
    spec = with_(with_(PPO, "meta.search", "RandomSearch"), "search",
                 {"agent": [{"algorithm": {"gamma__grid_search": [0.9, 0.99]}}]})
    loaded = load_spec(write(tmp_path, spec), "s")
    assert loaded["search"] == {"agent": {"algorithm": {"gamma__grid_search": [0.9, 0.99]}}}
    assert problems(tmp_path, with_(spec, "meta.search", "GridSearch"))[0].startswith(
        "meta.search: SLM-Lab v4's search algorithm 'GridSearch' is not supported")
    assert problems(tmp_path, with_(spec, "search", {"agent": [{}, {}]}))[0].startswith(
        "search.agent: SLM-Lab v4's list-shaped search section needs one object")


def test_scheduler_without_a_name_is_asha_with_slm_lab_keys(tmp_path):
    from orchestrator.search.tune import make_scheduler
    spec = with_(with_(PPO, "search", {"agent.algorithm.gamma__uniform": [0.9, 0.99]}),
                 "meta.search_scheduler", {"grace_period": 1000, "reduction_factor": 3})
    sched = make_scheduler(load_spec(write(tmp_path, spec), "s"))
    from ray.tune.schedulers import AsyncHyperBandScheduler
    assert isinstance(sched, AsyncHyperBandScheduler) and sched._time_attr == "frame"
    bad = with_(spec, "meta.search_scheduler", {"grace_period": 1000, "time_attr": "training_iteration"})
    assert problems(tmp_path, bad) == ["meta.search_scheduler.time_attr: the lab's ASHA uses time_attr='frame', "
                                       "got 'training_iteration'"]


def test_search_resources_split_over_sessions(tmp_path):
    spec = with_(with_(PPO, "meta.max_session", 4), "meta.search_resources", {"cpu": 2, "gpu": 0})
    assert load_spec(write(tmp_path, spec), "s")["meta"]["resources"] == {"num_cpus": 0.5, "num_gpus": 0}
    found = problems(tmp_path, with_(spec, "meta.search_resources", {"cpus": 2}))
    assert found == ["meta.search_resources.cpus: unknown key; valid keys: ['cpu', 'gpu']"]


def test_cli_refuses_an_slm_lab_feature_with_exit_2_and_no_traceback(tmp_path, capsys):
    from orchestrator import cli
    path = write(tmp_path, with_(with_(PPO, "agent.algorithm.spectral_norm", True), "env.name", "${env}"))
    with pytest.raises(SystemExit) as exc:
        cli.main([path, "s", "dev", "--data-dir", str(tmp_path / "data"), "-s", "env=CartPole-v1"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "Traceback" not in err
    assert "agent.algorithm.spectral_norm: SLM-Lab key not supported here: spectral normalization of the nets" in err
    assert not (tmp_path / "data").exists()


# ---------------------------------------------------------------- env.normalize_obs / normalize_reward

def test_normalizers_clip_and_save_their_statistics():
    import numpy as np

    from envs.make import EnvSpec, make_env, sub_env_seeds
    from tests.envs.state_copy import state_copy
    spec = EnvSpec("Pendulum-v1", max_frame=100, num_envs=2, normalize_obs=True, normalize_reward=True,
                   clip_obs=0.5, clip_reward=0.1)
    env = make_env(spec, seed=0, gamma=0.9)
    env.reset(seed=sub_env_seeds(0, 2))
    for _ in range(30):
        obs, reward, *_ = env.step(env.action_space.sample())
    assert np.abs(obs).max() <= 0.5 and np.abs(reward).max() <= 0.1
    assert env.obs_rms.count > 30
    copy = state_copy(env, make_env(spec, seed=1, gamma=0.9))
    action = env.action_space.sample()
    for _ in range(5):
        a, b = env.step(action), copy.step(action)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def test_slm_lab_normalizer_keys_load_as_fields(tmp_path):
    spec = load_spec(write(tmp_path, with_(with_(PPO, "env.normalize_obs", True), "env.normalize_reward", True)), "s")
    assert spec["env"]["normalize_obs"] is True and spec["env"]["clip_obs"] == 10.0
    assert problems(tmp_path, with_(PPO, "env.clip_obs", 0)) == ["env.clip_obs: must be > 0, got 0"]


def test_normalizers_resume_exactly(tmp_path):
    from tests.agents.algorithms.helpers import assert_resume_exact
    overrides = ["env.max_frame=600", "env.normalize_obs=true", "env.normalize_reward=true",
                 "meta.log_frequency=100", "env.num_envs=2"]
    assert_resume_exact(tmp_path, "ppo_cartpole", overrides, 300)


def test_use_same_optim_gives_the_critic_the_actors_optimizer(tmp_path):
    actor = {"name": "Adam", "lr": 0.003}
    spec = with_(with_(with_(PPO, "agent.net.use_same_optim", True), "agent.net.actor_optim_spec", actor),
                 "agent.net.critic_optim_spec", {"name": "RMSprop", "lr": 0.01})
    assert load_spec(write(tmp_path, spec), "s")["agent"]["net"]["critic_optim_spec"] == actor
    shared = load_spec(write(tmp_path, with_(spec, "agent.net.shared", True)), "s")
    assert shared["agent"]["net"]["critic_optim_spec"] == {"name": "RMSprop", "lr": 0.01}  # no effect when shared


def test_v3_fixed_value_beside_its_schedule_is_unread(tmp_path):
    """v3's clip_eps written next to a clip_eps_spec (and a search over it) is unread in every SLM-Lab since v4:
    dropped; alone, without its schedule, it is refused naming the v5 key."""
    both = with_(with_(PPO, "agent.algorithm.clip_eps", 0.3), "agent.algorithm.clip_eps_spec",
                 {"name": "no_decay", "start_val": 0.2})
    both["search"] = {"agent": {"algorithm": {"clip_eps__uniform": [0.1, 0.5], "gamma__uniform": [0.9, 0.99]}}}
    spec = load_spec(write(tmp_path, both), "s", [])
    algo = spec["agent"]["algorithm"]
    assert "clip_eps" not in algo and algo["clip_eps_spec"]["start_val"] == 0.2
    assert spec["search"] == {"agent": {"algorithm": {"gamma__uniform": [0.9, 0.99]}}}
    assert problems(tmp_path, with_(PPO, "agent.algorithm.clip_eps", 0.3))[0].startswith(
        "agent.algorithm.clip_eps: SLM-Lab key not supported here")
    lone = with_(PPO, "agent.algorithm.entropy_coef", 0.01)
    lone["agent"]["algorithm"].pop("entropy_coef_spec", None)
    assert problems(tmp_path, lone) == ["agent.algorithm.entropy_coef: SLM-Lab key not supported here: SLM-Lab v4's "
                                        "fixed entropy coefficient (v5 and the lab: entropy_coef_spec); allowed only "
                                        "as null, got 0.01"]
