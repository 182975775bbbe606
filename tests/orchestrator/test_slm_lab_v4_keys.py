"""SLM-Lab v4's keys with their v4 meaning: optimizers RAdam / Lookahead, ``batch_norm``, ``env.image_downsize``,
``meta.train_mode`` and ``agent.algorithm.normalize_state`` (unread in v4), ``spec_params`` (one combination per
command), v4 placeholders, a broken ``search`` section outside search mode; and SLM-Lab v5.3's ``actor_arc`` /
``critic_arc`` and ``LinearToMin``."""

import json

import pytest
import torch
from torch import nn

from agents.lookahead import Lookahead
from agents.nets import TorchArcNet
from envs.make import EnvSpec, make_sub_env
from orchestrator.errors import SpecError
from orchestrator.spec.load import load_spec
from tests.agents.algorithms.helpers import SLM_SPECS, make_algo
from tests.orchestrator.test_slm_lab_compat import PPO, problems, with_, write

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
