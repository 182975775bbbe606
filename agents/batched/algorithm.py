"""K seeds of one actor-critic spec (A2C, PPO) trained as one batched program, each seed still its own algorithm.

``BatchedActorCritic`` / ``BatchedPPO`` (``batched_algorithm``) hold K member algorithms, the lab's own
``ActorCritic`` / ``PPO`` built with seeds ``seeds[k]`` exactly as K separate sessions build them (same net init,
same ``torch.Generator`` and ``np.random.Generator`` streams), and run them in lockstep:

* nets: each member net becomes a view of its slice of a ``SeedMLP`` (weights (K, out, in)) or, for a ``ConvNet`` or
  a shared net (``net.shared``: one body, a policy and a value head), a ``SeedNet`` (``agents.batched.nets.seed_net``),
  so one batched forward per step serves the K seeds, and every member's nets, ``state_dict`` and ``weights_sha256``
  stay its own;
* acting: one forward for the K x N observations of a vector env of K x N sub-envs (seed k's N are the k-th
  block), then each seed's actions drawn from its own generator (``agents.policy.sample``), as its separate
  session draws them;
* learning: the lab's loss code (``ActorCritic.prepare``, ``minibatch_loss``, ``PPO.policy_loss`` / ``val_loss``,
  ``advantages``) on tensors with a leading seed dim, whose reductions are over the sample dim, so each seed gets
  its own loss, advantage normalization and metrics; the K losses are summed (seed k's parameters get exactly
  the gradient of its own loss; a shared net's policy and value losses in one backward, as the lab's); gradients
  are clipped per seed (``clip_grads_per_seed``, over each param group: a shared net's body and both heads
  together, as the lab clips one net); one optimizer steps the
  stacks (elementwise optimizers only: K separate optimizers, ``agents.batched.optim``). PPO shuffles each seed's
  rollout with that seed's generator, so seed k's minibatches hold the samples its separate run would take.
* per-seed state: ``seed_state_dict(k)`` gives seed k's state in the format of its own algorithm's
  ``state_dict`` (nets, optimizer slice, LR scheduler, RNG, counters, its columns of the rollout), and
  ``load_seed_state_dicts`` restores the group from K of them (or from K separate sessions' states).

The values differ from separate runs only by float rounding of the batched kernels (``tests/agents/
batched/test_batched.py`` bounds it after an update); over a run the differences grow as any two float orders' do.

Supported (``BATCHED_LAB``): the lab's ``ActorCritic``, ``PPO`` and ``REINFORCE`` (``agents.batched.reinforce``)
with ``OnPolicyBatchReplay``, the DQN family with its replays (``agents.batched.dqn``) and ``SoftActorCritic`` on
Box actions (``agents.batched.sac``); plain ``MLPNet``s (``BATCHED_NETS``), for all but SAC also ``ConvNet``s
(``CONV_NET_ALGORITHMS``), for the actor-critics shared nets (``SHARED_NET_ALGORITHMS``), no layer or batch norm, no
``log_std_init``; Discrete actions (SAC: Box), an elementwise optimizer (``ELEMENTWISE_OPTIMIZERS``), and none of
the stateful normalizers (``normalize_v_targets``, ``normalize_advantages: percentile``), whose running statistics
are per session; ``batch_problem`` names what a spec asks beyond that.
"""

from __future__ import annotations

from typing import Any, ClassVar, Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from agents import policy
from agents.algorithms import ALGORITHMS, AgentSpec, Algorithm, LossStats
from agents.algorithms.actor_critic import ActorCritic
from agents.algorithms.double_dqn import DoubleDQN
from agents.algorithms.dqn import DQN
from agents.algorithms.ppo import PPO
from agents.algorithms.reinforce import Reinforce
from agents.algorithms.sac import SoftActorCritic
from agents.algorithms.vanilla_dqn import VanillaDQN
from agents.batched.memory import join_seed_memories, seed_memory
from agents.batched.nets import seed_net
from agents.batched.optim import (
    ELEMENTWISE_OPTIMIZERS,
    Slot,
    clip_grads_per_seed,
    load_seed_optim_state,
    seed_optim_state,
)
from agents.nets import LOSSES, make_optim
from agents.schedules import FrameLR
from envs.clock import Clock

# agent.algorithm.name -> the lab class that runs batched (``agents.batched.registry`` has their batched classes)
BATCHED_LAB: dict[str, type[Algorithm]] = {"ActorCritic": ActorCritic, "PPO": PPO, "REINFORCE": Reinforce,
                                           "Reinforce": Reinforce, "DQN": DQN, "DoubleDQN": DoubleDQN,
                                           "VanillaDQN": VanillaDQN, "SoftActorCritic": SoftActorCritic}
BATCHED_ALGORITHMS = tuple(BATCHED_LAB)  # agent.algorithm.name values that run batched
ON_POLICY = ("ActorCritic", "PPO", "REINFORCE", "Reinforce")  # batched with one group rollout (OnPolicyBatchReplay)
BATCHED_NETS = ("MLPNet", "ConvNet")  # agent.net.type values that run batched (agents.batched.nets.seed_net)
SHARED_NET_ALGORITHMS = ("ActorCritic", "PPO")  # the algorithms whose nets may also be shared (net.shared)
CONV_NET_ALGORITHMS = (*SHARED_NET_ALGORITHMS, "REINFORCE", "DQN", "DoubleDQN", "VanillaDQN")  # ... may be ConvNets


def batch_problem(spec: AgentSpec) -> str | None:
    """Why the agent spec cannot run with seeds batched (a sentence naming the key), None when it can."""
    name = spec.algorithm.name
    if name not in BATCHED_LAB or ALGORITHMS.get(name) is not BATCHED_LAB[name]:
        return (f"agent.algorithm.name '{name}' does not run with seeds batched (meta.session_batch > 1); "
                f"batched algorithms: {list(BATCHED_ALGORITHMS)}")
    if name in ON_POLICY and spec.memory.name != "OnPolicyBatchReplay":
        return (f"agent.memory.name '{spec.memory.name}' does not run batched (the seeds would end their episodes, "
                f"and so update, at different steps); use OnPolicyBatchReplay")
    problem = _net_problem(spec)
    if problem is not None:
        return problem
    critic = spec.critic_net
    optim_specs = [s for s in (spec.net.optim_spec, spec.net.actor_optim_spec, spec.net.critic_optim_spec,
                               critic.optim_spec if critic else None,
                               getattr(spec.algorithm, "alpha_optim_spec", None)) if s]
    for optim_spec in optim_specs:
        if optim_spec.get("name") not in ELEMENTWISE_OPTIMIZERS:
            return (f"agent.net optimizer '{optim_spec.get('name')}' does not run batched; use one of "
                    f"{list(ELEMENTWISE_OPTIMIZERS)}")
    if getattr(spec.algorithm, "normalize_v_targets", False):
        return "agent.algorithm.normalize_v_targets does not run batched (its running scale is per session)"
    if getattr(spec.algorithm, "normalize_advantages", "standardize") == "percentile":
        return "agent.algorithm.normalize_advantages: percentile does not run batched (its EMAs are per session)"
    return None


def _net_problem(spec: AgentSpec) -> str | None:
    """Why ``agent.net`` (and SAC's critics) cannot run batched, None when it can: an ``MLPNet``, or for all but
    SAC also a ``ConvNet`` (``CONV_NET_ALGORITHMS``), for the actor-critics a shared net (``net.shared``,
    ``SHARED_NET_ALGORITHMS``); no layer or batch norm, no ``log_std_init``."""
    net, critic, name = spec.net, spec.critic_net, spec.algorithm.name
    if net.type not in BATCHED_NETS:
        return (f"agent.net.type '{net.type}' does not run batched: {' and '.join(BATCHED_NETS)} do (dueling, "
                f"recurrent and arc nets are not batched)")
    if net.layer_norm or net.batch_norm:
        return f"agent.net.layer_norm / batch_norm do not run batched (agent.net.type '{net.type}')"
    if net.type != "MLPNet" and name not in CONV_NET_ALGORITHMS:
        return (f"agent.net.type '{net.type}' runs batched only for {list(CONV_NET_ALGORITHMS)}, not "
                f"agent.algorithm.name '{name}'")
    if net.shared and name not in SHARED_NET_ALGORITHMS:
        return (f"agent.net.type '{net.type}' with shared: true runs batched only for {list(SHARED_NET_ALGORITHMS)}, "
                f"not agent.algorithm.name '{name}'")
    if net.log_std_init is not None:
        return "agent.net.log_std_init does not run batched"
    if name != "SoftActorCritic":
        return None
    if critic is not None and (critic.type != "MLPNet" or critic.layer_norm or critic.batch_norm):
        return (f"agent.critic_net.type '{critic.type}' does not run batched: it must be an MLPNet without "
                f"layer_norm/batch_norm")
    if (critic or net).clip_grad_val is not None:
        return ("the critics' clip_grad_val (agent.critic_net, else agent.net) does not run batched for "
                "SoftActorCritic (its twin critics are then separate nets with an optimizer each)")
    return None


class SeedMeanLoss(nn.Module):
    """A ``LOSSES`` loss reduced per seed: elementwise (``reduction='none'``), then the mean over the last dim;
    (K, B) predictions and targets -> (K,), (B,) -> a scalar."""

    def __init__(self, loss: nn.Module) -> None:
        super().__init__()
        self.loss = type(loss)(**{**{k: getattr(loss, k) for k in ("beta", "delta") if hasattr(loss, k)},
                                  "reduction": "none"})

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Per-row mean of the elementwise loss of ``pred`` against ``target``, same shapes (..., B) -> (...)."""
        return self.loss(pred, target).mean(-1)


class SeedBatch:
    """The seed-batched form of a lab algorithm class, mixed in before it (``BatchedPPO(SeedBatch, PPO)``).

    Args:
        spec: the agent section (every seed's: one spec per group).
        obs_space, action_space: single-env spaces.
        num_envs: N, sub-envs per seed; the group acts on vectors of K x N.
        seeds: the K session seeds; member k is the lab algorithm built with ``seeds[k]``.
        members: the K member algorithms when already built (e.g. by the K sessions, so that their nets, RNG
            streams and state stay the sessions' own): instances of the spec's lab class built with ``seeds``,
            for this spec and ``num_envs``; None builds them.

    The group instance itself is the lab class built for K x N envs (its memory holds the group's rollout, or
    hands each seed's transitions to that seed's own replay: ``members_own_memory``) with its nets and optimizers
    replaced by the stacks; ``members`` are the K lab algorithms.

    Raises:
        ValueError: ``batch_problem`` of the spec, no seeds, an action space other than ``action_space_kind``
            (Discrete; SAC: Box), or members that are not K instances of the spec's lab class.
    """

    members: list[Algorithm]
    policy_net: ClassVar[str] = "actor"  # the net that acts
    # True: each member keeps its own memory (a replay, with its own sampling RNG) and ``self.memory`` hands the
    # group's transitions to them (``SeedReplays``); False: one group rollout of K x N columns (``seed_memory``)
    members_own_memory: ClassVar[bool] = False
    action_space_kind: ClassVar[type[gym.Space]] = gym.spaces.Discrete  # the action spaces it runs on

    def __init__(self, spec: AgentSpec, obs_space: gym.Space, action_space: gym.Space, num_envs: int,
                 seeds: Sequence[int], members: Sequence[Algorithm] | None = None) -> None:
        problem = batch_problem(spec)
        if problem is not None:
            raise ValueError(problem)
        if not seeds:
            raise ValueError("a seed batch needs at least one seed")
        if not isinstance(action_space, self.action_space_kind):
            raise ValueError(f"batched {spec.algorithm.name} needs a {self.action_space_kind.__name__} action space, "
                             f"got {action_space}")
        lab_cls = ALGORITHMS[spec.algorithm.name]
        self.k, self.n = len(seeds), num_envs
        if members is not None and (len(members) != len(seeds) or any(type(m) is not lab_cls for m in members)):
            raise ValueError(f"a seed batch of {len(seeds)} seeds needs {len(seeds)} {lab_cls.__name__} members")
        self.members = list(members) if members is not None else \
            [lab_cls(spec, obs_space, action_space, num_envs, int(s)) for s in seeds]
        super().__init__(spec, obs_space, action_space, num_envs * self.k, int(seeds[0]))  # type: ignore[call-arg]
        self._stack_members()
        self._seed_obs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # see seed_obs

    # ---- construction ----
    def _stack_members(self) -> None:
        """Replace this instance's nets and optimizers by stacks of the members' (see class docstring)."""
        first = self.members[0]
        # each member optimizer parameter as (net name, parameter name), before stacking replaces the parameters
        names = {id(p): (net, pname) for net, m in first.nets.items() for pname, p in m.named_parameters()}
        layout = {oname: [[names[id(p)] for p in g["params"]] for g in optim.param_groups]
                  for oname, optim in first.optims.items()}
        self.nets = {net: seed_net([m.nets[net] for m in self.members]) for net in first.nets}
        stacks = {net: stack.stack_of() for net, stack in self.nets.items()}
        self.slots: dict[str, list[Slot]] = {o: [stacks[net][p] for g in groups for net, p in g]
                                             for o, groups in layout.items()}
        for oname, groups in layout.items():
            params = [{"params": list(dict.fromkeys(stacks[net][p][0] for net, p in g))} for g in groups]
            self.optims[oname] = make_optim(params, self.optim_specs[oname])
            self.lr_scheds[oname] = FrameLR(self.optims[oname], self.lr_scheds[oname].factor)
        if isinstance(getattr(self, "value_loss", None), tuple(LOSSES.values())):
            self.value_loss = SeedMeanLoss(self.value_loss)

    # ---- layouts: vector rows (M*K*N, ...) in (m, k, n) order <-> per seed (K, M*N, ...) ----
    def to_seeds(self, x: torch.Tensor) -> torch.Tensor:
        """Rows of the group's vector env (M*K*N, ...), ordered (step, seed, env), -> per seed (K, M*N, ...);
        (C, H, W) frames for conv nets (``obs_channels_last``) with each seed's in channels-last memory, as
        ``SeedNet`` takes them (one copy)."""
        rest = x.shape[1:]
        x = x.reshape(-1, self.k, self.n, *rest).transpose(0, 1)
        if self.obs_channels_last and len(rest) == 3:
            return x.permute(0, 1, 2, 4, 5, 3).reshape(self.k, -1, *rest[1:], rest[0]).permute(0, 1, 4, 2, 3)
        return x.reshape(self.k, -1, *rest)

    def from_seeds(self, x: torch.Tensor) -> torch.Tensor:
        """Inverse of ``to_seeds``: (K, M*N, ...) -> (M*K*N, ...)."""
        rest = x.shape[2:]
        return x.reshape(self.k, -1, self.n, *rest).transpose(0, 1).reshape(-1, *rest)

    def seed_obs(self, obs: torch.Tensor) -> torch.Tensor:
        """``to_seeds`` of a rollout's observation rows, computed once per update: ``prepare`` lays them out for its
        forward, ``update`` takes the same tensor (a copy of every frame of the rollout saved)."""
        cached = self._seed_obs.get(id(obs))
        if cached is None or cached[0] is not obs:
            cached = self._seed_obs[id(obs)] = (obs, self.to_seeds(obs))
        return cached[1]

    def rollout_obs(self, obs: np.ndarray) -> torch.Tensor:
        """A rollout's observations (B, *O) as ``obs_tensor`` (``to_seeds`` lays them out per seed)."""
        return self.obs_tensor(obs)

    def pdparam_value(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Policy parameters and values of per-seed observations (K, B, *O) -> (K, B, pd), (K, B), or of vector
        rows (M*K*N, *O) -> (M*K*N, pd), (M*K*N,) (how ``ActorCritic.prepare`` passes a rollout)."""
        if obs.dim() == len(self.obs_space.shape) + 2:
            return super().pdparam_value(obs)  # type: ignore[misc]
        pdparam, value = super().pdparam_value(self.seed_obs(obs))  # type: ignore[misc]
        return self.from_seeds(pdparam), self.from_seeds(value)

    # ---- acting ----
    @torch.no_grad()
    def act(self, obs_NO: np.ndarray, clock: Clock, deterministic: bool = False) -> np.ndarray:
        """Actions (K*N,) for the group's observations (K*N, *O), seed k's N drawn from member k's generator."""
        obs = self.obs_tensor(obs_NO).reshape(self.k, self.n, *self.obs_space.shape)
        out = self.nets["net" if self.net_spec.shared else self.policy_net](obs)
        pdparam = out[0] if isinstance(out, list) else out  # a shared net's heads: [policy, value]
        return torch.cat([policy.sample(pdparam[k], self.discrete, m.gen, deterministic)
                          for k, m in enumerate(self.members)]).cpu().numpy()

    # ---- learning ----
    def clip_grads(self, optim_names: tuple[str, ...]) -> torch.Tensor:
        """Per seed, as ``Algorithm.clip_grads`` per separate session: each param group of each named optimizer
        clipped to each seed's own norm; returns each seed's joint norm over them (K,)."""
        sq = torch.zeros(self.k, device=self.device)
        for name in optim_names:
            for group in self.optims[name].param_groups:
                norms = clip_grads_per_seed(group["params"], self.clip_grad_vals[name], self.k)
                if norms is not None:
                    sq = sq + norms.square()
        return sq.sqrt()

    def minibatches(self, size: int) -> list[torch.Tensor | None]:
        """Sample indices (K, b) of each gradient step of one update over ``size`` samples per seed; None: all of
        them in order (A2C's one step)."""
        return [None]

    def update(self, clock: Clock) -> list[LossStats]:  # type: ignore[override]
        """One update of every seed (the lab class's steps, see ``minibatches``); per seed its ``LossStats``."""
        prepared = self.prepare(self.memory.pop())
        data = {key: self.seed_obs(v) if key == "obs" else self.to_seeds(v) for key, v in prepared.items()}
        self._seed_obs.clear()
        optim_names = tuple(self.optims)
        losses, entropies, grad_norms = [], [], []
        metrics: dict[str, list[Any]] = {name: [] for name in self.metric_names}
        for idx in self.minibatches(data["adv"].shape[1]):
            mb = data if idx is None else {key: seed_rows(v, idx) for key, v in data.items()}
            loss, entropy, _ = self.minibatch_loss(mb, clock, metrics)
            grad_norms.append(self.optim_step_tensor(loss.sum(), optim_names, clock))
            losses.append(loss.detach())
            entropies.append(entropy)
        loss_k, ent_k, norm_k = (torch.stack(x).mean(0).tolist() for x in (losses, entropies, grad_norms))
        metric_k = {name: torch.stack(v).mean(0).tolist() for name, v in metrics.items()}
        for m in self.members:  # the members' clocks-driven state the session reads (lr)
            for name in optim_names:
                m.lr_scheds[name].step_to(clock.frame)
        return [LossStats(loss_k[k], ent_k[k], norm_k[k], {n: v[k] for n, v in metric_k.items()})
                for k in range(self.k)]

    # ---- per-seed state ----
    def seed_state_dict(self, k: int, with_memory: bool = False) -> dict[str, Any]:
        """Seed k's training state in the format of its own algorithm's ``state_dict`` (``Algorithm.state_dict``):
        its nets (copies of its slices), its optimizer slices, the LR schedulers, its RNG states, its counters.

        Args:
            with_memory: include seed k's part of the group's partial rollout (its ``OnPolicyBatchReplay``).
        """
        member = self.members[k]
        state = member.state_dict()
        state["nets"] = {name: {key: v.clone() for key, v in sd.items()} for name, sd in state["nets"].items()}
        state["optims"] = {name: seed_optim_state(self.optims[name], member.optims[name], self.slots[name], k)
                           for name in self.optims}
        state["lr_scheds"] = {name: sched.state_dict() for name, sched in self.lr_scheds.items()}
        state["extra"] = self.extra_state()
        if with_memory:
            state["memory"] = member.memory.state_dict() if self.members_own_memory else \
                seed_memory(self.memory.state_dict(), k, self.n)
        return state

    def sync_members(self) -> None:
        """Give every member algorithm its seed's optimizer slice, LR scheduler state and rollout columns, so its
        own ``state_dict`` (what its session checkpoints) is its seed's state (the nets are views already), and the
        group's counters (``extra_state``: they are every seed's, the seeds step in lockstep)."""
        memory = None if self.members_own_memory else self.memory.state_dict()
        for k, member in enumerate(self.members):
            for name in self.optims:
                member.optims[name].load_state_dict(
                    seed_optim_state(self.optims[name], member.optims[name], self.slots[name], k))
                member.lr_scheds[name].load_state_dict(self.lr_scheds[name].state_dict())
            member.load_extra_state(self.extra_state())
            if memory is not None:
                member.memory.load_state_dict(seed_memory(memory, k, self.n))

    def pull_members(self) -> list[bool]:
        """Take the group's state from its members (after each was restored on its own, e.g. by its session's
        ``from_checkpoint``): ``load_seed_state_dicts`` of their ``state_dict``s with their rollouts (members that own
        their memory keep it as restored)."""
        return self.load_seed_state_dicts([m.state_dict(with_memory=not self.members_own_memory)
                                           for m in self.members])

    def load_seed_state_dicts(self, states: Sequence[dict[str, Any]]) -> list[bool]:
        """Restore every seed from ``seed_state_dict(k)`` outputs (or separate sessions' algorithm states of this
        spec), ``states[k]`` for seed k; the LR schedulers take seed 0's state (they are shared: the seeds step in
        lockstep); the rollout is restored when the states hold one (``with_memory``).

        Returns:
            Per seed, True when restored exactly (see ``Algorithm.load_state_dict``).

        Raises:
            KeyError / ValueError: a state that does not fit (names the part), or seeds whose optimizer steps or
                rollout lengths differ.
        """
        if len(states) != self.k:
            raise ValueError(f"{len(states)} seed states for a group of {self.k} seeds")
        exact = [m.load_state_dict(state) for m, state in zip(self.members, states)]  # nets: into the stacks
        for k, state in enumerate(states):
            for name in self.optims:
                load_seed_optim_state(self.optims[name], self.slots[name], k, state["optims"][name])
        for name, sched in self.lr_scheds.items():
            sched.load_state_dict(states[0]["lr_scheds"][name])
        if any(state["extra"] != states[0]["extra"] for state in states):
            raise ValueError(f"batched seeds' algorithm counters differ ({[s['extra'] for s in states]}): batched "
                             f"seeds must have stepped alike")
        self.load_extra_state(states[0]["extra"])
        if self.members_own_memory:  # each member restored its own memory (Algorithm.load_state_dict)
            return exact
        if all("memory" in state for state in states):
            self.memory.load_state_dict(join_seed_memories([state["memory"] for state in states]))
        return exact


def seed_rows(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Per seed rows: ``x[k][idx[k]]`` of ``x`` (K, S, ...) and ``idx`` (K, b) int64 -> (K, b, ...), one
    ``index_select`` of whole rows (as ``take_rows``; an elementwise ``gather`` took 10x longer on Atari frames);
    frames (K, S, C, H, W) with each seed's in channels-last memory (``SeedBatch.to_seeds``) give rows so laid out."""
    k, s = x.shape[:2]
    flat = (idx + torch.arange(k, device=idx.device).unsqueeze(1) * s).reshape(-1)
    if x.dim() == 5 and not x.is_contiguous() and x.permute(0, 1, 3, 4, 2).is_contiguous():
        rows = x.permute(0, 1, 3, 4, 2)
        return rows.flatten(0, 1).index_select(0, flat).view(k, -1, *rows.shape[2:]).permute(0, 1, 4, 2, 3)
    return x.flatten(0, 1).index_select(0, flat).view(k, -1, *x.shape[2:])


class BatchedActorCritic(SeedBatch, ActorCritic):
    """K seeds of the lab's ``ActorCritic`` (A2C) as one batched program; see the module docstring."""


class BatchedPPO(SeedBatch, PPO):
    """K seeds of the lab's ``PPO`` as one batched program; see the module docstring. Each epoch shuffles each
    seed's samples with that seed's generator (``torch.randperm``, as ``PPO.update``)."""

    def minibatches(self, size: int) -> list[torch.Tensor | None]:
        """``training_epoch`` epochs of per-seed permutations cut in ``minibatch_size`` slices (the last one
        holds the remainder), as ``PPO.update`` per seed: a list of (K, b) index tensors."""
        mb = min(self.algo_spec.minibatch_size, size)
        out: list[torch.Tensor | None] = []
        for _ in range(self.algo_spec.training_epoch):
            perm = torch.stack([torch.randperm(size, generator=m.gen, device=self.device) for m in self.members])
            out += [perm[:, start:start + mb] for start in range(0, size, mb)]
        return out

