"""SLM-Lab v4's keys with their v4 meaning: optimizers RAdam / Lookahead, ``batch_norm``, ``env.image_downsize``,
``meta.train_mode`` and ``agent.algorithm.normalize_state`` (unread in v4), ``spec_params`` (one combination per
command), v4 placeholders, a broken ``search`` section outside search mode, a fractional ``update_frequency``,
``OnPolicyCrossEntropy``, a ``batch_size`` above ``max_size``, ``env.unity``; and SLM-Lab v5.3's ``actor_arc`` /
``critic_arc`` and ``LinearToMin``."""

import json

import numpy as np
import pytest
import torch
from torch import nn

from agents.lookahead import Lookahead
from agents.nets import TorchArcNet
from envs.clock import Clock
from envs.make import EnvSpec, make_sub_env
from orchestrator.errors import SpecError
from orchestrator.spec.load import load_spec
from tests.agents.algorithms.helpers import SLM_SPECS, drive, make_algo, run_slm_dev
from tests.orchestrator.spec.test_slm_lab_compat import PPO, problems, with_, write

READERS = ['ActorCritic', 'PPO', 'PPOSIL', 'SIL']
PLAYGROUND = SLM_SPECS / "benchmark_arc" / "ppo" / "ppo_playground.yaml"


def v4(spec):
    """``spec`` in SLM-Lab v4's shape: one-element agent and env lists, a body section."""
    return {**spec, "agent": [spec["agent"]], "env": [spec["env"]], "body": {"product": "outer", "num": 1}}


def arc_of(width):
    return {"modules": {"body": {"Sequential": [{"LazyLinear": {"out_features": width}}, {"SiLU": None}]}},
            "graph": {"input": "x", "modules": {"body": ["x"]}, "output": "body"}}


# ---------------------------------------------------------------- optimizers, batch norm, LinearToMin

def test_v4_optimizers_batch_norm_and_linear_to_min_load_and_build(tmp_path):
    """SLM-Lab v4's sac_pong optimizer spec ``{"name": "Lookahead", "optimizer": "RAdam", "lr": 2.5e-4}`` (its
    trailing comma included), ``batch_norm: true`` and a LinearToMin schedule give those objects."""
    spec = with_(with_(v4(PPO), "agent", [with_(PPO["agent"], "net.batch_norm", True)]), "meta.max_session", 1)
    spec["agent"][0]["net"]["lr_scheduler_spec"] = {"name": "LinearToMin", "frame": 1000, "min_factor": 0.033}
    text = json.dumps({"s": spec}).replace('"optim_spec": {"name": "Adam", "lr": 0.001}',
                                           '"optim_spec": {"name": "Lookahead", "optimizer": "RAdam", "lr": 2.5e-4,}')
    path = tmp_path / "v4.json"
    path.write_text(text)
    algo = make_algo("s", [], spec_file=str(path))
    optim = algo.optims["net"]
    assert isinstance(optim, Lookahead) and type(optim.inner) is torch.optim.RAdam and optim.defaults["lr"] == 2.5e-4
    assert any(isinstance(m, nn.BatchNorm1d) for m in algo.nets["actor"].body)
    algo.lr_scheds["net"].step_to(500)
    assert optim.inner.param_groups[0]["lr"] == pytest.approx(2.5e-4 * (1 - 500 * 0.967 / 1000))
    assert problems(tmp_path, with_(PPO, "agent.net.optim_spec", {"name": "Lookahead", "k": 0, "lr": 0.001})) == [
        "agent.net.optim_spec: cannot build from {'name': 'Lookahead', 'k': 0, 'lr': 0.001}: Lookahead k must be an "
        "int >= 1, got 0"]


# ---------------------------------------------------------------- env.image_downsize

def test_image_downsize_sets_the_atari_frame_size_width_then_height():
    """[64, 48] (v4's cv2 order: width, height) gives (4, 48, 64) stacked frames; null gives 84x84."""
    env = make_sub_env("ALE/Pong-v5", EnvSpec("ALE/Pong-v5", 100, image_downsize=[64, 48]))
    assert env.observation_space.shape == (4, 48, 64)
    assert env.reset(seed=0)[0].shape == (4, 48, 64)
    assert make_sub_env("ALE/Pong-v5", EnvSpec("ALE/Pong-v5", 100)).observation_space.shape == (4, 84, 84)


def test_image_downsize_is_checked_and_refused_on_non_atari_images(tmp_path):
    assert problems(tmp_path, with_(PPO, "env.image_downsize", [64])) == [
        "env.image_downsize: expected [width, height], two ints in [1, 1024] (SLM-Lab v4's Atari frame size), got [64]"]
    assert load_spec(write(tmp_path, with_(PPO, "env.image_downsize", [84, 84])), "s")["env"]["image_downsize"] == \
        [84, 84]  # CartPole's vector observations: not read, as in SLM-Lab v4
    with pytest.raises(ValueError, match="env.image_downsize: SLM-Lab v4 grayscales and resizes the image"):
        make_sub_env("CarRacing-v3", EnvSpec("CarRacing-v3", 100, image_downsize=[64, 64]))


# ---------------------------------------------------------------- keys v4 reads nowhere, spec_params, placeholders

def test_train_mode_and_algorithm_normalize_state_load_unread(tmp_path):
    spec = with_(with_(PPO, "meta.train_mode", True), "agent.algorithm.normalize_state", True)
    loaded = load_spec(write(tmp_path, v4(spec)), "s")
    assert loaded["meta"]["train_mode"] is True and loaded["env"]["normalize_state"] is False


def test_spec_params_variables_are_filled_one_combination_per_command(tmp_path):
    """v4's a2c_gae_atari shape: ``${env}`` with ``spec_params: {env: [...]}``; unfilled, one line naming
    spec_params and its values; filled with -s, the spec runs with spec_params dropped."""
    spec = {**v4(with_(PPO, "env.name", "${env}")), "spec_params": {"env": ["CartPole-v1", "Acrobot-v1"]}}
    assert problems(tmp_path, spec) == [
        "env[0].name: '${env}' is a variable of spec_params (SLM-Lab v4's parametrized spec, one trial per "
        "combination of env in ['CartPole-v1', 'Acrobot-v1']), which this lab does not expand: run one combination "
        "per command with -s env=CartPole-v1"]
    loaded = load_spec(write(tmp_path, spec), "s", ["env=Acrobot-v1"])
    assert loaded["env"]["name"] == "Acrobot-v1" and "spec_params" not in loaded


def test_a_v4_placeholder_is_not_called_an_slm_lab_v5_template(tmp_path):
    assert problems(tmp_path, v4(with_(PPO, "env.name", "${env}"))) == [
        "env[0].name: '${env}' is a placeholder of this SLM-Lab v4 spec (v4 fills it from the entry's spec_params, "
        "which it does not have); fill it on the command line with -s env=VALUE"]


# ---------------------------------------------------------------- a broken search section outside search mode

BAD_SEARCH = {"agent.net.optim_spec.lr_uniform": [0.001, 0.01], "agent.algorithm.gamma__choice": [0.9, 0.99]}


def test_broken_search_section_is_one_warning_in_dev_and_train_and_refused_in_search(tmp_path, capsys):
    from orchestrator.modes.spec_check import check_request
    path = write(tmp_path, with_(PPO, "search", BAD_SEARCH))
    problem = ("search.agent.net.optim_spec.lr_uniform: expected '{spec.path}__{type}', type one of ['grid_search', "
               "'choice'")
    with pytest.raises(SpecError) as err:
        load_spec(path, "s")  # search mode
    assert err.value.problems[0].startswith(problem)
    assert load_spec(path, "s", search=False)["search"] == {}
    request = {"spec_file": path, "spec_name": "s", "overrides": [], "mode": "train", "address": None,
               "max_concurrent_trials": None, "resume": None}
    assert check_request(request)["spec"]["search"] == {}
    err_lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(err_lines) == 1 and err_lines[0].startswith(
        "warning: the search section, which this mode does not read, has problems and is ignored: " + problem)


# ---------------------------------------------------------------- actor_arc / critic_arc

def arc_spec(tmp_path, **net):
    spec = with_(with_(PPO, "agent.net", {"type": "TorchArcNet", "shared": False, **net}), "env.name", "Pendulum-v1")
    return write(tmp_path, with_(spec, "agent.algorithm.action_pdtype", "Normal"))


def test_actor_and_critic_arcs_build_separate_bodies(tmp_path):
    """actor_arc 3 -> 8, critic_arc 3 -> 32: each net has its own body (SLM-Lab v5.3's ActorCritic)."""
    import gymnasium as gym
    import numpy as np
    box3, box1 = gym.spaces.Box(-8, 8, (3,), np.float32), gym.spaces.Box(-2, 2, (1,), np.float32)
    algo = make_algo("s", [], spec_file=arc_spec(tmp_path, actor_arc=arc_of(8), critic_arc=arc_of(32)),
                     obs_space=box3, action_space=box1)
    actor, critic = algo.nets["actor"], algo.nets["critic"]
    assert isinstance(actor, TorchArcNet) and isinstance(critic, TorchArcNet)
    assert [m.weight.shape for m in actor.body.modules() if isinstance(m, nn.Linear)] == [(8, 3)]
    assert [m.weight.shape for m in critic.body.modules() if isinstance(m, nn.Linear)] == [(32, 3)]
    assert actor.heads[0][0].weight.shape == (2, 8) and critic.heads[0][0].weight.shape == (1, 32)


def test_arc_keys_are_checked_by_role(tmp_path):
    """A missing body names the role; actor_arc on an algorithm that does not read it is refused; use_same_optim
    gives the critic the actor's body, as SLM-Lab's critic spec is then the actor's."""
    found = problems(tmp_path, json.loads(open(arc_spec(tmp_path, actor_arc=arc_of(8))).read())["s"])
    assert found == ["agent.net.arc: net.type TorchArcNet needs a torcharc spec {modules, graph}, or critic_arc"]
    bad = problems(tmp_path, json.loads(open(arc_spec(tmp_path, actor_arc=arc_of(8), critic_arc={
        "modules": {"body": {"NoSuchLayer": None}}, "graph": {"input": "x", "modules": {"body": ["x"]},
                                                               "output": "body"}})).read())["s"])
    assert len(bad) == 1 and bad[0].startswith("agent.net.critic_arc: torcharc cannot build it")
    sac = with_(with_(PPO, "agent.algorithm", {"name": "SoftActorCritic"}), "agent.memory", {"name": "Replay"})
    found = problems(tmp_path, with_(sac, "agent.net", {"type": "TorchArcNet", "arc": arc_of(8),
                                                        "actor_arc": arc_of(8)}))
    assert found == [f"agent.net.actor_arc: read only by the actor-critic algorithms {READERS} (the actor's "
                     "TorchArcNet body, as SLM-Lab's ActorCritic); expected no actor_arc here"]
    same = load_spec(arc_spec(tmp_path, actor_arc=arc_of(8), critic_arc=arc_of(32), use_same_optim=True), "s")
    assert same["agent"]["net"]["critic_arc"] == arc_of(8)


@pytest.mark.slm_lab_specs
def test_slm_lab_ppo_playground_entry_runs_in_dev(tmp_path):
    """SLM-Lab's ppo_playground (actor_arc 2x64 SiLU, critic_arc 3x256 SiLU, LinearToMin) on Pendulum-v1 for
    600 frames (num_envs and minibatch scaled down from 2048 sub-envs)."""
    import pandas as pd

    from orchestrator import cli
    data = tmp_path / "data"
    argv = [str(PLAYGROUND), "ppo_playground", "dev", "-s", "env=Pendulum-v1", "-s", "max_frame=600", "-s",
            "env.num_envs=4", "-s", "agent.algorithm.minibatch_size=60", "-s", "agent.algorithm.training_epoch=2",
            "--data-dir", str(data), "--quiet"]
    assert cli.main(argv) == 0
    (df_file,) = data.glob("*/t0/s0/train_df.parquet")
    df = pd.read_parquet(df_file)
    assert df.frame.iloc[-1] == 600 and df.opt_step.iloc[-1] == 5 * 2 * 2  # 5 rollouts of 30 x 4, 2 epochs of 2
    assert df.lr.iloc[-1] == pytest.approx(1e-3 * 0.033)  # the last update at frame 600: LinearToMin's floor


# ---------------------------------------------------------------- fractional update_frequency, OnPolicyCrossEntropy,
# a sample larger than the replay, an unread loss

@pytest.mark.parametrize("update_frequency", [0.9, 1, 2.5, 6])
def test_target_updates_per_frame_follow_slm_lab_v4_frame_mod(update_frequency):
    """With one sub-env, the target updates due at each frame are SLM-Lab v4's ``frame % f < num_envs``
    (``util.frame_mod``): every frame for 0.9 and 1, 2 in 5 frames for 2.5, 1 in 6 for 6."""
    from agents.nets import target_updates_due
    due = [target_updates_due(frame, frame - 1, update_frequency) for frame in range(1, 31)]
    assert due == [int(frame % update_frequency < 1) for frame in range(1, 31)]
    assert target_updates_due(30, 0, update_frequency) == sum(due) == {0.9: 30, 1: 30, 2.5: 12, 6: 5}[update_frequency]


def test_fractional_update_frequency_loads_and_updates_the_dqn_target_every_frame(monkeypatch):
    """ddqn_concat_lunar's ``update_frequency: 0.9`` loads as 0.9 and gives one polyak update per frame."""
    algo = make_algo("ddqn_cartpole", ["agent.net.update_frequency=0.9", "agent.net.update_type=polyak",
                                       "agent.algorithm.training_frequency=4", "agent.algorithm.training_start_step=1",
                                       "agent.memory.batch_size=4", "agent.net.hid_layers=[8]"])
    assert algo.net_spec.update_frequency == 0.9
    counts = []
    orig = algo.update_target
    monkeypatch.setattr(algo, "update_target", lambda clock: counts.append(orig(clock)) or counts[-1])
    clock = Clock(120, 1)
    drive(algo, clock, 120)
    assert counts == [4] * 30  # a training round every 4 frames, each with the 4 frames' updates


def episodes_memory(cross_entropy, returns):
    """An ``OnPolicyCrossEntropy`` (one sub-env) holding one completed episode per return, each of two steps
    with rewards (ret - 1, 1), observation = episode index."""
    from agents.memory import OnPolicyCrossEntropy
    memory = OnPolicyCrossEntropy(len(returns), 1, cross_entropy)
    for i, ret in enumerate(returns):
        for t, reward in enumerate((ret - 1.0, 1.0)):
            obs = np.full((1, 2), i, np.float32)
            memory.add(obs, np.zeros(1, np.int64), np.array([reward], np.float32), obs, np.array([t == 1]),
                       np.zeros(1, bool))
    return memory


@pytest.mark.parametrize("cross_entropy, returns, kept", [
    (0.5, [1, 3, 2, 5], [1, 3]),  # median 2.5: the better half, in stored order
    (0.75, [1, 3, 2, 5], [3]),  # 75th percentile 3.5 (linear interpolation)
    (0.5, [2, 2, 1], [0, 1]),  # ties at the bound all kept
    (0.0, [1, 3, 2], [0, 1, 2]),  # the minimum: every episode
    (1.0, [1, 3, 2], [0, 1, 2]),  # 1: no filter (SLM-Lab filters only below 1)
])
def test_cross_entropy_memory_keeps_episodes_at_or_above_the_return_quantile(cross_entropy, returns, kept):
    memory = episodes_memory(cross_entropy, returns)
    assert memory.ready()
    batch = memory.pop()
    assert batch["obs"][:, 0].tolist() == [float(i) for i in kept for _ in range(2)]
    assert batch["reward"].reshape(-1, 2).sum(axis=1).tolist() == [float(returns[i]) for i in kept]
    assert batch["terminated"].tolist() == [False, True] * len(kept)
    assert len(memory) == 0 and not memory.ready()


def test_v4_reinforce_cross_entropy_entry_loads_and_builds_its_memory(tmp_path):
    """reinforce_cross_entropy_cartpole's memory and its unread ``CrossEntropyLoss``; an unread loss must still be
    a torch.nn loss, and an algorithm that reads the loss still refuses it by feature."""
    from agents.memory import OnPolicyCrossEntropy
    spec = with_(with_(PPO, "agent.algorithm", {"name": "Reinforce", "training_frequency": 16}), "agent.memory",
                 {"name": "OnPolicyCrossEntropy", "cross_entropy": 0.5})
    spec = with_(spec, "agent.net.loss_spec", {"name": "CrossEntropyLoss"})
    algo = make_algo("s", [], spec_file=write(tmp_path, v4(spec)))
    assert type(algo.memory) is OnPolicyCrossEntropy
    assert (algo.memory.cross_entropy, algo.memory.num_episodes) == (0.5, 16)
    assert problems(tmp_path, with_(spec, "agent.net.loss_spec", {"name": "Cross"})) == [
        "agent.net.loss_spec.name: expected a torch.nn loss class name (unread by Reinforce), got 'Cross'"]
    assert problems(tmp_path, with_(spec, "agent.memory.cross_entropy", 1.5)) == [
        "agent.memory.cross_entropy: must be <= 1, got 1.5"]
    assert problems(tmp_path, with_(spec, "agent.algorithm.name", "PPO"))[0].startswith(
        "agent.net.loss_spec.name: 'CrossEntropyLoss' (a classification loss")


@pytest.mark.parametrize("rel_file, name", [
    ("experimental/reinforce/reinforce_cartpole.json", "reinforce_cross_entropy_cartpole"),
    ("experimental/dqn/ddqn_lunar_search.json", "ddqn_concat_lunar"),
])
@pytest.mark.slm_lab_specs
def test_slm_lab_entries_of_these_features_run_in_dev(tmp_path, rel_file, name):
    df = run_slm_dev(tmp_path, rel_file, name, max_frame=500)  # REINFORCE: 16 CartPole episodes per update
    assert df.opt_step.iloc[-1] > 0


def test_sample_larger_than_the_replay_warns_and_repeats_transitions(tmp_path):
    """SLM-Lab v4's base_memory (batch_size 32, max_size 5) loads with one warning naming both keys; a sample
    draws 32 of the 5 stored rows uniformly with replacement."""
    from agents.memory import Replay
    spec = with_(with_(PPO, "agent.algorithm", {"name": "DQN", "training_start_step": 1}), "agent.memory",
                 {"name": "Replay", "batch_size": 32, "max_size": 5})
    with pytest.warns(UserWarning) as record:
        loaded = load_spec(write(tmp_path, spec), "s")
    assert loaded["agent"]["memory"]["batch_size"] == 32
    assert [str(w.message) for w in record] == [
        "agent.memory.batch_size: 32 transitions per sample exceed the replay's capacity agent.memory.max_size=5, so "
        "every sample repeats transitions (drawn uniformly with replacement, as SLM-Lab's Replay)"]
    replay = Replay(5, (1,), (), np.int64, 32)
    for i in range(7):  # the ring wraps: rows hold observations 5, 6, 2, 3, 4
        replay.add(np.full((1, 1), i, np.float32), np.zeros(1, np.int64), np.zeros(1, np.float32),
                   np.zeros((1, 1), np.float32), np.zeros(1, bool), np.zeros(1, bool))
    rng = np.random.default_rng(0)
    obs = replay.sample(rng)["obs"][:, 0]
    idx = np.random.default_rng(0).integers(0, 5, size=32)
    assert obs.tolist() == [[5, 6, 2, 3, 4][i] for i in idx]
    assert len(set(obs.tolist())) <= 5 and len(obs) == 32


def test_unity_env_settings_are_refused_by_feature(tmp_path):
    assert problems(tmp_path, with_(PPO, "env.unity", {"gridSize": 6}))[0] == (
        "env.unity: SLM-Lab key not supported here: SLM-Lab v4's Unity ML-Agents env settings (Unity envs are not "
        "installed here); allowed only as null, got {'gridSize': 6}")
