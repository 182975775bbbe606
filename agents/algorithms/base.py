"""The algorithm base: acting, the optimizer-step helper and the whole training state.

Subclasses add their networks and losses only. The session loop calls, per vector step:

    act_NA = algorithm.act(obs_NO, clock)           # no grad; only side effect: RNG draws
    algorithm.memory.add(...)                        # store the transition
    if algorithm.train_ready(clock):                 # the algorithm decides, from clock + memory
        stats = algorithm.update(clock)              # learn; returns LossStats

``state_dict()`` is an explicit allow-list (nets, optimizers, frame-driven LR schedulers, RNG
states, algorithm counters, optionally the memory) of tensors, arrays and numbers, so a checkpoint
needs no pickled classes and a resumed session continues exactly.

Extension points: a subclass declares, as class attributes, what the rest of the lab reads
(``orchestrator.spec`` validates from them, the session logs from them; none of them names an
algorithm):

* ``spec_cls``: its ``agent.algorithm`` keys (a frozen ``AlgorithmSpec`` subclass, SLM-Lab names);
* ``memory_names``: the memories it accepts (the first is the default);
* ``optim_keys``: the optimizer specs it reads, dotted paths under ``agent`` (e.g. ``net.optim_spec``,
  ``net.actor_optim_spec``, or an ``algorithm.*_optim_spec`` field of its own spec): each is checked
  as ``{"name": one of OPTIMIZERS, "lr": float >= 0, ...}``; an optimizer spec of ``agent.net`` that
  it does not read is an error when set;
* ``schedule_keys``: the fields of its spec that are variable schedules (``VarSchedule`` blocks);
* ``metric_names``: the train_df columns it adds after the common ones, filled from
  ``LossStats.metrics`` of the latest ``update`` (NaN before the first one);
* ``role_arcs``: it builds its actor and critic from ``net.actor_arc`` / ``net.critic_arc`` when given
  (``agents.nets.role_spec``); other algorithms do not read those keys;
* ``reads_loss``: it builds ``net.loss_spec`` (one of ``agents.nets.LOSSES``); false: the key is unread and any
  torch.nn loss name is accepted, as SLM-Lab builds it unused (REINFORCE, Random);
* trainable tensors outside nets (e.g. SAC's ``log_alpha``): ``add_tensor`` in ``init_nets``, once;
  the tensor is then saved with the nets, part of ``weights_sha256`` and, unless
  ``transfer=False``, of ``agent.net.init_from`` transfer.

``opt_step`` counts gradient updates of the main loss: one per ``optim_step`` call, however many
optimizers that call steps (actor and critic stepped on one loss count once). An algorithm with
several losses per update (e.g. SAC's critic, actor and temperature) counts the critic's steps only.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from agents import policy, torch_optim
from agents.memory import MEMORIES, MemorySpec
from agents.nets import ConvNet, NetSpec, make_net, make_optim
from agents.schedules import SCHEDULE_PERTURBABLE, FrameLR, VarSchedule, make_lr_scheduler
from envs.clock import Clock

# optimizer spec keys that live in torch param groups and are re-applied from the spec after a restore (lr is the
# LR scheduler's base lr)
SPEC_GROUP_KEYS = ("weight_decay", "eps", "momentum")


def take_rows(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``x[idx]``: rows ``idx`` (B,) int64 of ``x`` (N, ...) -> (B, ...), the same values, copied with
    ``index_select`` (a row copy: for 256 of 1,024 Atari frames 0.5 ms on this CPU, against 4.5 ms for advanced
    indexing), and a channels-last (N, C, H, W) ``x`` gives channels-last rows (``Algorithm.rollout_obs``)."""
    if x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
        return x.permute(0, 2, 3, 1).index_select(0, idx).permute(0, 3, 1, 2)
    return x.index_select(0, idx)


@dataclass(frozen=True)
class AlgorithmSpec:
    """Keys shared by every ``agent.algorithm`` section (SLM-Lab names).

    Fields:
        name: key of ``agents.algorithms.ALGORITHMS``.
        action_pdtype: SLM-Lab's action distribution name; ``default`` picks Categorical for
            Discrete and Normal for Box spaces (kept for spec compatibility).
        action_policy: ``default`` (sample the policy), ``epsilon_greedy`` or ``boltzmann``.
        gamma: discount factor in [0, 1].
        explore_var_spec: schedule of epsilon / temperature (frames), see ``VarSchedule``.
        entropy_coef_spec: schedule of the entropy bonus coefficient (frames).
        training_frequency: algorithm-specific cadence (see each subclass).
    """

    name: str = ""
    action_pdtype: str = field(default="default",
                               metadata={"choices": ("default", "Categorical", "Argmax", "Normal")})
    action_policy: str = field(default="default",
                               metadata={"choices": ("default", "epsilon_greedy", "boltzmann")})
    gamma: float = field(default=0.99, metadata={"ge": 0, "le": 1, "perturbable": True})
    explore_var_spec: dict | None = field(default=None, metadata={"perturbable": SCHEDULE_PERTURBABLE})
    entropy_coef_spec: dict | None = field(default=None, metadata={"perturbable": SCHEDULE_PERTURBABLE})
    training_frequency: int = field(default=1, metadata={"gt": 0})


@dataclass(frozen=True)
class AgentSpec:
    """The validated ``agent`` section: algorithm, memory and net specs, and SLM-Lab's separate critic net spec
    ``agent.critic_net`` (read by algorithms with ``reads_critic_net``: SAC, CrossQ), None when not given."""

    algorithm: AlgorithmSpec
    memory: MemorySpec
    net: NetSpec
    critic_net: NetSpec | None = None


@dataclass
class LossStats:
    """Means over the optimizer steps of one ``update`` (NaN where not applicable).

    ``metrics`` holds the algorithm's own values, keyed by its ``metric_names`` (train_df columns). Each value
    is a float or a scalar tensor (an algorithm that updates every frame, e.g. SAC, hands back tensors so
    that nothing is read per step); readers take ``resolved()``.
    """

    loss: float | torch.Tensor = math.nan
    entropy: float | torch.Tensor = math.nan
    grad_norm: float | torch.Tensor = math.nan
    metrics: dict[str, float | torch.Tensor] = field(default_factory=dict)

    def resolved(self) -> LossStats:
        """These stats with every value a float (tensors read here, once); self when they already are."""
        values = (self.loss, self.entropy, self.grad_norm, *self.metrics.values())
        if not any(isinstance(v, torch.Tensor) for v in values):
            return self
        return LossStats(float(self.loss), float(self.entropy), float(self.grad_norm),
                         {k: float(v) for k, v in self.metrics.items()})


def mean_metrics(values: dict[str, list[Any]]) -> dict[str, float]:
    """Per-name float mean of lists of scalars (tensors or floats), e.g. over one update's minibatches."""
    return {k: float(torch.stack([torch.as_tensor(x, dtype=torch.float32) for x in v]).mean()) if v else math.nan
            for k, v in values.items()}


class TensorHolder(nn.Module):
    """One trainable tensor outside nets (e.g. SAC's ``log_alpha``), held as the parameter ``value`` so it
    is saved, hashed and transferred exactly as a net is (see ``Algorithm.add_tensor``)."""

    def __init__(self, value: torch.Tensor) -> None:
        super().__init__()
        self.value = nn.Parameter(value.detach().clone())


def pick_device(gpu: bool | str) -> torch.device:
    """``cuda`` when ``gpu`` is true or ``"auto"`` and CUDA is visible, else ``cpu``."""
    return torch.device("cuda" if gpu in (True, "auto") and torch.cuda.is_available() else "cpu")


class ReplayCadence:
    """Training cadence of replay-based algorithms (DQN family, SAC), mixed in before ``Algorithm``.

    Needs ``self.algo_spec.training_start_step`` (transitions), ``self.algo_spec.training_frequency`` (frames),
    ``self.memory`` and an int ``self.last_train_frame`` (frame of the last update, in ``extra_state``).
    Once the replay holds ``training_start_step`` transitions, a vector step that crosses a multiple of
    ``training_frequency`` frames (since ``last_train_frame``) trains one round, however many multiples it
    crosses: SLM-Lab v5.3's ``Replay.add_experience`` sets ``to_train`` when any of the step's N transitions
    lands on a multiple, and ``train`` runs once per step. So ``training_frequency >= N`` is one round per
    ``training_frequency`` frames whatever N is, and ``training_frequency < N`` is one round per vector step
    (SLM-Lab's specs scale ``training_iter`` with N for that). Frames that pass while the replay is short earn
    nothing, so a resume that refills its replay makes no catch-up burst (the refill gate).
    """

    def train_ready(self, clock: Clock) -> bool:
        """Replay holds ``training_start_step`` transitions and this vector step crossed a multiple of
        ``training_frequency`` frames since ``last_train_frame`` (one round is due, whatever the count)."""
        if len(self.memory) < self.algo_spec.training_start_step:
            self.last_train_frame = clock.frame
            return False
        tf = self.algo_spec.training_frequency
        return clock.frame // tf > self.last_train_frame // tf


class GradExchange(Protocol):
    """What ``Algorithm.optim_step`` calls instead of stepping its optimizers when set as ``grad_exchange``
    (SLM-Lab's ``meta.distributed``: the gradients go to one global optimizer shared by a trial's sessions).

    Args:
        optim_names: the optimizers of this step (names of ``Algorithm.optims``).
        lrs: their current learning rates (the session's frame-driven schedules), one per name.
        grads: the gradient (after clipping) of each of their parameters, in param-group order (None where a
            parameter got none).

    Returns:
        The new value of each of those parameters, same order and shapes (CPU tensors).
    """

    def __call__(self, optim_names: tuple[str, ...], lrs: list[float],
                 grads: list[torch.Tensor | None]) -> list[torch.Tensor]:
        """Apply one update of the shared optimizers; Args and Returns as in the class docstring."""
        ...


class Algorithm:
    """Base of every algorithm.

    Args:
        spec: the agent section.
        obs_space: single-env observation space (O = its shape).
        action_space: single-env action space.
        num_envs: N, sub-envs per vector step.
        seed: seeds net init (in a forked torch RNG, so the global RNG is untouched), the
            algorithm's ``torch.Generator`` and its ``np.random.Generator``.

    Raises:
        ValueError: memory not allowed for the algorithm, or a bad net/optimizer spec.
    """

    spec_cls: ClassVar[type[AlgorithmSpec]] = AlgorithmSpec
    memory_names: ClassVar[tuple[str, ...]] = tuple(MEMORIES)
    optim_keys: ClassVar[tuple[str, ...]] = ("net.optim_spec",)
    schedule_keys: ClassVar[tuple[str, ...]] = ("explore_var_spec", "entropy_coef_spec")
    metric_names: ClassVar[tuple[str, ...]] = ()
    reads_critic_net: ClassVar[bool] = False  # builds its critics from agent.critic_net when given
    role_arcs: ClassVar[bool] = False  # builds its actor and critic from net.actor_arc / net.critic_arc when given
    reads_loss: ClassVar[bool] = True  # builds net.loss_spec (else any torch.nn loss is accepted unread, as SLM-Lab)

    def __init__(self, spec: AgentSpec, obs_space: gym.Space, action_space: gym.Space,
                 num_envs: int, seed: int) -> None:
        self.spec, self.algo_spec, self.net_spec = spec, spec.algorithm, spec.net
        if spec.memory.name not in self.memory_names:
            raise ValueError(f"{type(self).__name__} needs agent.memory.name in {list(self.memory_names)}, "
                             f"got '{spec.memory.name}'")
        self.obs_space, self.action_space, self.num_envs = obs_space, action_space, num_envs
        self.obs_dim = int(np.prod(obs_space.shape))
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        self.device = pick_device(spec.net.gpu)
        self.gen = torch.Generator(device=self.device).manual_seed(seed)
        self.rng = np.random.default_rng(seed)
        self.explore_var = VarSchedule.from_spec(self.algo_spec.explore_var_spec, default=math.nan)
        self.entropy_coef = VarSchedule.from_spec(self.algo_spec.entropy_coef_spec, default=0.0)
        self.nets: dict[str, nn.Module] = {}
        self.no_transfer: set[str] = set()  # names in self.nets that init_from leaves as built
        self.optims: dict[str, torch.optim.Optimizer] = {}
        self.lr_scheds: dict[str, FrameLR] = {}
        self.optim_specs: dict[str, dict[str, Any]] = {}  # per optimizer: its spec (re-applied after a restore)
        self.clip_grad_vals: dict[str, float | None] = {}  # per optimizer: its net spec's clip_grad_val
        # Set from outside (orchestrator/global_params.py, meta.distributed): replaces the local optimizer step
        self.grad_exchange: GradExchange | None = None
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.init_nets()
        # uint8 frames stay uint8 on their way to nets that all scale them inside (conv nets): a quarter of the
        # bytes to gather, copy and move to the device; the nets compute on the same float values
        nets = [m for m in self.nets.values() if not isinstance(m, TensorHolder)]
        self.obs_dtype = torch.uint8 if obs_space.dtype == np.uint8 and nets and all(
            isinstance(m, ConvNet) for m in nets) else torch.float32
        # those nets compute in channels-last (N, H, W, C) memory: a rollout of (C, H, W) frames is put in that
        # layout once (``rollout_obs``), and minibatches taken from it (``take_rows``) reach the convs as they are
        self.obs_channels_last = self.obs_dtype == torch.uint8 and all(m.layout == "chw" for m in nets)
        self.memory = self.init_memory()

    # ---- construction (subclasses) ----
    def init_nets(self) -> None:
        """Create ``self.nets`` and, via ``add_optim``, their optimizers."""
        raise NotImplementedError

    def init_memory(self) -> Any:
        """Create the memory named in the spec."""
        raise NotImplementedError

    def make_net(self, out_dims: int | list[int], head_gains: list[float] | None = None,
                 extra_in_dim: int = 0, net_spec: NetSpec | None = None) -> nn.Module:
        """Net of ``net_spec``'s type (default ``agent.net``) built from the observation space, on ``self.device``.

        Maps (B, *O) observations (plus extra inputs (B, E), ``extra_in_dim`` = E) to ``out_dims``;
        ``head_gains`` are the orthogonal-init gains per head (``nets.POLICY_GAIN`` / ``VALUE_GAIN``).

        Raises:
            ValueError: unknown net type or an observation space the nets do not take.
        """
        return make_net(net_spec or self.net_spec, self.obs_space, out_dims, head_gains, extra_in_dim).to(self.device)

    def add_tensor(self, name: str, value: torch.Tensor, transfer: bool = True) -> nn.Parameter:
        """Declare a trainable tensor outside nets; returns it as a parameter on ``self.device``.

        It lives in ``self.nets[name]`` (a ``TensorHolder``), so ``state_dict``, ``weights_sha256`` and
        transfer treat it as a net; ``transfer=False`` leaves it as built under ``agent.net.init_from``.
        Give it an optimizer with ``add_optim(name, [param], spec)``.

        Raises:
            ValueError: ``name`` is already a net.
        """
        if name in self.nets:
            raise ValueError(f"'{name}' is already one of the nets {sorted(self.nets)}")
        self.nets[name] = TensorHolder(value).to(self.device)
        if not transfer:
            self.no_transfer.add(name)
        return self.nets[name].value

    def transfer_nets(self) -> dict[str, nn.Module]:
        """The nets (and tensors) that ``agent.net.init_from`` loads: all but those declared ``transfer=False``."""
        return {k: v for k, v in self.nets.items() if k not in self.no_transfer}

    def weights_sha256(self) -> dict[str, str]:
        """Per net (and tensor): sha256 over its tensors' raw bytes in ``state_dict`` order (docs/ARCHITECTURE.md 7)."""
        out = {}
        for name, net in self.nets.items():
            h = hashlib.sha256()
            for tensor in net.state_dict().values():
                h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
            out[name] = h.hexdigest()
        return out

    def add_optim(self, name: str, params: Any, optim_spec: dict[str, Any], net_spec: NetSpec | None = None) -> None:
        """Register optimizer ``name`` and its frame-driven LR scheduler, with ``lr_scheduler_spec`` and
        ``clip_grad_val`` of ``net_spec`` (default ``agent.net``; e.g. ``agent.critic_net`` for SAC's critics)."""
        ns = net_spec or self.net_spec
        self.optim_specs[name] = dict(optim_spec)
        self.optims[name] = make_optim(params, optim_spec)
        self.lr_scheds[name] = make_lr_scheduler(self.optims[name], ns.lr_scheduler_spec)
        self.clip_grad_vals[name] = ns.clip_grad_val

    # ---- policy heads (policy-gradient algorithms) ----
    @property
    def std_param(self) -> bool:
        """True when a Box policy uses a state-independent log-std (``net.log_std_init`` set)."""
        return not self.discrete and self.net_spec.log_std_init is not None

    def policy_out_dim(self) -> int:
        """Width of the policy head: ``policy.pdparam_dim`` (A logits, or 2A mean and log-std), or A
        (mean only) when ``std_param``.

        Raises:
            ValueError: an action space other than Discrete and 1-D Box.
        """
        dim = policy.pdparam_dim(self.action_space)
        return dim // 2 if self.std_param else dim

    def add_log_std(self) -> list[nn.Parameter]:
        """With ``std_param``: declare the tensor ``log_std`` (A,) = ``net.log_std_init`` (nats, transferred
        with the policy) and return ``[it]`` to add to the actor's optimizer; else ``[]``."""
        if not self.std_param:
            return []
        a = self.action_space.shape[0]
        return [self.add_tensor("log_std", torch.full((a,), float(self.net_spec.log_std_init)))]

    def pdparam(self, head: torch.Tensor) -> torch.Tensor:
        """Policy parameters from the policy head's output: (B, A) means -> (B, 2A) ``[mean, log_std]``
        when ``std_param`` (gradients reach ``log_std``); otherwise ``head`` as is."""
        if not self.std_param:
            return head
        return torch.cat([head, self.nets["log_std"].value.expand_as(head)], dim=-1)

    def env_action(self, act: np.ndarray) -> np.ndarray:
        """What the env is sent: Box actions (N, A) clipped to the space's bounds; others unchanged.

        The unclipped sample is what memory stores and the losses train on (its log-prob is the
        policy's); only the env sees the clipped one.
        """
        if isinstance(self.action_space, gym.spaces.Box):
            return np.clip(act, self.action_space.low, self.action_space.high)
        return act

    # ---- acting and learning (subclasses) ----
    def act(self, obs_NO: np.ndarray, clock: Clock, deterministic: bool = False) -> np.ndarray:
        """Actions for a vector of observations (N, *O) -> (N,) int or (N, A) float, no grad."""
        raise NotImplementedError

    def train_ready(self, clock: Clock) -> bool:
        """True when ``update`` should run now (memory filled, cadence reached)."""
        raise NotImplementedError

    def update(self, clock: Clock) -> LossStats:
        """Learn from memory; advances ``clock.opt_step`` once per gradient update of the main loss.

        Returns ``LossStats`` whose ``metrics`` has a value for each of ``metric_names``.
        """
        raise NotImplementedError

    def reseed(self, seed: int) -> None:
        """Restart the acting RNG streams (``self.gen``, ``self.rng``) at ``seed``; nets untouched.

        Used by evaluation runs (enjoy) so a given seed replays the same actions.
        """
        self.gen.manual_seed(seed)
        self.rng = np.random.default_rng(seed)

    # ---- shared helpers ----
    def to_tensor(self, x: np.ndarray, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """numpy -> tensor on the algorithm's device (no copy on CPU when dtypes match)."""
        return torch.as_tensor(x, dtype=dtype, device=self.device)

    def obs_tensor(self, obs: np.ndarray) -> torch.Tensor:
        """Observations (any leading dims, *O) -> tensor on the device in ``obs_dtype``: uint8 when the space is
        uint8 and every net is a conv net (they scale frames inside), else float32."""
        return torch.as_tensor(obs, dtype=self.obs_dtype, device=self.device)

    def rollout_obs(self, obs: np.ndarray) -> torch.Tensor:
        """A rollout's observations (B, *O) as ``obs_tensor``, in channels-last memory when every net is a conv net
        on (C, H, W) frames (``obs_channels_last``; the same values: the nets would make that copy per forward)."""
        x = self.obs_tensor(obs)
        return x.contiguous(memory_format=torch.channels_last) if self.obs_channels_last and x.dim() == 4 else x

    def clip_grads(self, optim_names: tuple[str, ...]) -> torch.Tensor:
        """Clip the gradients of each param group of the named optimizers to its own L2 norm at the optimizer's
        ``clip_grad_val`` (None: no clipping), as ``nn.utils.clip_grad_norm_`` per net (SLM-Lab's
        ``Net.train_step``); return the joint L2 norm (scalar tensor) of all those gradients before clipping."""
        sq_norms = []
        for name in optim_names:
            max_norm = self.clip_grad_vals[name]
            for group in self.optims[name].param_groups:
                # nn.utils.clip_grad_norm_ op for op (its foreach path), without its per-call Python wrappers
                grads = [p.grad for p in group["params"] if p.grad is not None]
                if not grads:
                    continue
                norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
                sq_norms.append(norm.square())
                if max_norm is not None:
                    torch._foreach_mul_(grads, (max_norm / (norm + 1e-6)).clamp(max=1.0))
        return torch.stack(sq_norms).sum().sqrt() if sq_norms else torch.tensor(0.0)

    def optim_step(self, loss: torch.Tensor, optim_names: tuple[str, ...], clock: Clock,
                   count: bool = True) -> float:
        """One optimizer step (``optim_step_tensor``); returns its grad norm as a float."""
        return float(self.optim_step_tensor(loss, optim_names, clock, count))

    def optim_step_tensor(self, loss: torch.Tensor, optim_names: tuple[str, ...], clock: Clock,
                          count: bool = True, norm: bool = True) -> torch.Tensor | None:
        """One optimizer step: zero-grad, backward, clip, step, count ``opt_step`` (unless ``count`` is false: the
        secondary losses of a multi-loss update, e.g. SAC's actor and temperature).

        Clipping is per net, as SLM-Lab's ``Net.train_step`` does (``clip_grad_norm_(net.parameters(),
        clip_grad_val)`` for each net it steps): every param group of every stepped optimizer is clipped to
        its own L2 norm at its optimizer's ``clip_grad_val``, so an actor and a critic stepped together on one
        loss (two optimizers, or one optimizer with a param group per net) are clipped as SLM-Lab's two
        separate steps clip them, not over their joint norm.

        Sets each optimizer's lr for ``clock.frame`` first (frame-driven schedules). With ``grad_exchange`` set
        (``meta.distributed``), the clipped gradients go to it instead of the local optimizers, and the parameters
        take the values it returns (see ``GradExchange``).

        Args:
            loss: scalar loss.
            optim_names: optimizers stepped together (e.g. actor and critic of one loss).
            clock: the session clock.
            count: advance ``clock.opt_step``.
            norm: compute the grad norm; false skips it (and returns None) when none of the optimizers clips
                (a step whose norm nobody reads, e.g. SAC's actor and temperature steps).

        Returns:
            Global grad norm (L2, before clipping) over the stepped parameters, a scalar tensor (read it once,
            e.g. per update, not per step), or None (``norm`` false and no clipping).
        """
        optims = [self.optims[n] for n in optim_names]
        params = [p for optim in optims for g in optim.param_groups for p in g["params"]]
        for name in optim_names:
            self.lr_scheds[name].step_to(clock.frame)
        for p in params:  # what optim.zero_grad(set_to_none=True) does, without its per-call wrappers
            p.grad = None
        loss.backward()
        clips = norm or any(self.clip_grad_vals[name] is not None for name in optim_names)
        grad_norm = self.clip_grads(optim_names) if clips else None
        if self.grad_exchange is not None:
            values = self.grad_exchange(optim_names, [optim.param_groups[0]["lr"] for optim in optims],
                                        [p.grad for p in params])
            with torch.no_grad():
                for p, v in zip(params, values):
                    p.copy_(v)
        else:
            for optim in optims:
                torch_optim.step(optim)
        if count:
            clock.tick_opt_step()
        return grad_norm if norm else None

    def current_lr(self) -> float:
        """Learning rate of the first optimizer's first param group (NaN without optimizers)."""
        if not self.optims:
            return math.nan
        return float(next(iter(self.optims.values())).param_groups[0]["lr"])

    # ---- training state ----
    def refill_size(self) -> int:
        """Replay transitions a session restored without its replay (no ``memory.checkpoint``) collects before
        its replay-based training resumes, the refill gate (docs/ARCHITECTURE.md 5): ``training_start_step``
        where the algorithm has one, else 0."""
        return int(getattr(self.algo_spec, "training_start_step", 0))

    def extra_state(self) -> dict[str, Any]:
        """Algorithm counters beyond nets/optimizers (subclasses extend)."""
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Restore ``extra_state``."""

    def state_dict(self, with_memory: bool = False) -> dict[str, Any]:
        """The whole training state as plain containers of tensors, arrays and numbers.

        Args:
            with_memory: include the memory (replay buffer or partial rollout).
        """
        state: dict[str, Any] = {
            "nets": {k: v.state_dict() for k, v in self.nets.items()},
            "optims": {k: v.state_dict() for k, v in self.optims.items()},
            "lr_scheds": {k: v.state_dict() for k, v in self.lr_scheds.items()},
            "rng": {"torch": self.gen.get_state(), "numpy": self.rng.bit_generator.state},
            "extra": self.extra_state(),
        }
        if with_memory:
            state["memory"] = self.memory.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Restore what ``state_dict`` saved, from a state tree on any device (load it on the CPU).

        Net and optimizer tensors are copied onto the devices of the existing parameters
        (``self.device``); RNG states and the memory stay host-side. A torch RNG state saved by a
        generator of another device kind (CUDA Philox, 16 bytes, vs CPU Mersenne Twister, 5056
        bytes) cannot be set: ``self.gen`` is then reseeded from a sha256 of the saved state, so
        the resume is deterministic but not exact.

        Returns:
            True when restored exactly; False when the torch RNG state was re-derived as above.

        Raises:
            KeyError: naming a missing or unexpected net/optimizer/scheduler key.
        """
        for group, objs in (("nets", self.nets), ("optims", self.optims), ("lr_scheds", self.lr_scheds)):
            if set(state[group]) != set(objs):
                raise KeyError(f"state '{group}' has {sorted(state[group])}, expected {sorted(objs)}")
            for name, obj in objs.items():
                obj.load_state_dict(state[group][name])  # optimizers cast their state to the params' device
        self.apply_optim_specs()
        exact = self.load_torch_rng(state["rng"]["torch"])
        self.rng.bit_generator.state = state["rng"]["numpy"]
        self.load_extra_state(state["extra"])
        if "memory" in state:
            self.memory.load_state_dict(state["memory"])
        return exact

    def apply_optim_specs(self) -> None:
        """Set each optimizer's spec values over the ones a restored state brought: the LR scheduler's base lr
        (then the lr of the restored frame) and ``SPEC_GROUP_KEYS`` in every param group. A plain resume sets
        the values it restored (the spec cannot change them); after a PBT exploit the explored values win over
        the donor's (``orchestrator.spec.pbt``), where torch's ``load_state_dict`` alone would keep the donor's."""
        for name, optim in self.optims.items():
            spec = self.optim_specs.get(name, {})
            for group in optim.param_groups:
                for key in SPEC_GROUP_KEYS:
                    if key in spec and key in group:
                        group[key] = spec[key]
            sched = self.lr_scheds[name]
            if "lr" in spec:
                sched.base_lrs = [float(spec["lr"])] * len(optim.param_groups)
                frame = sched.last_epoch
                sched.last_epoch = frame - 1
                sched.step_to(frame)

    def load_torch_rng(self, rng_state: torch.Tensor) -> bool:
        """Set ``self.gen`` to a saved state (uint8 (S,), any device); see ``load_state_dict``.

        Returns:
            True if set exactly, False if the state came from another device kind and was hashed
            into a seed instead.
        """
        rng_state = rng_state.detach().to("cpu", torch.uint8)
        if rng_state.numel() == self.gen.get_state().numel():
            self.gen.set_state(rng_state)
            return True
        digest = hashlib.sha256(rng_state.numpy().tobytes()).digest()
        self.gen.manual_seed(int.from_bytes(digest[:8], "little") >> 1)
        return False
