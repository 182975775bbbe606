"""Neural networks. ``NETS`` maps the spec's ``agent.net.type`` to a class.

Every net is built from the observation space (``make_net``: its shape and dtype) plus optional extra
inputs of E features (e.g. the action of a Q(s, a) critic), and maps a batch ``(B, *O)`` (and extras
``(B, E)``) to one output tensor ``(B, out_dim)`` or, with several heads, a list of them (e.g. actor
logits and critic value of a shared actor-critic). Each class builds itself from the spec with
``from_spec(net_spec, obs_space, out_dims, head_gains, extra_in_dim)``: ``MLPNet`` / ``DuelingMLPNet`` flatten
the observation, ``ConvNet`` / ``DuelingConvNet`` take image observations (C, H, W) (Mnih et al. 2015's
"Nature CNN" by default; uint8 frames are scaled by 1/255 inside the net, so replay and rollouts keep uint8);
``TorchArcNet`` builds its body from a torcharc 2 spec (``agent.net.arc``, SLM-Lab v5's TorchArcNet: the
``torcharc`` package builds the ``torch.fx`` graph; lazy layers are materialized by one dummy forward with the
observation shape; heads as ``MLPNet``; references: SLM-Lab ``slm_lab/agent/net/torcharc_net.py``, torcharc 2);
``RecurrentNet`` takes windows (L, *O) of the last L observations (SLM-Lab's RecurrentNet; the env builds the
windows, see ``seq_len_of``).

Orthogonal init (``init_fn: orthogonal_``) uses the field's gains (Saxe et al. 2014 for the scheme;
gains of OpenAI baselines / SB3 / CleanRL PPO, Huang et al. 2022 "The 37 implementation details of
PPO"): ``HIDDEN_GAIN = sqrt(2)`` on hidden layers, then per head the gain the algorithm asks for:
``POLICY_GAIN = 0.01`` for a policy head (near-uniform initial policy), ``VALUE_GAIN = 1`` for value
and Q heads. Biases start at 0. Xavier init (``xavier_uniform_`` / ``xavier_normal_``) uses SLM-Lab v5.3's gain, that
of ``hid_layers_activation`` (``torch.nn.init.calculate_gain``: sqrt 2 for relu), on every layer, heads included.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.nn.parameter import is_lazy

import agents.batch_renorm  # noqa: F401  (registers BatchRenorm1d / LazyBatchRenorm1d in torch.nn for arcs)
from agents import torch_optim
from agents.lookahead import Lookahead, check_args

HIDDEN_GAIN = math.sqrt(2.0)
POLICY_GAIN = 0.01
VALUE_GAIN = 1.0

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "selu": nn.SELU,
    "elu": nn.ELU,
    "leakyrelu": nn.LeakyReLU,
    "sigmoid": nn.Sigmoid,
    "gelu": nn.GELU,
    "linear": nn.Identity,
}

INIT_FNS = {
    "orthogonal_": nn.init.orthogonal_,
    "xavier_uniform_": nn.init.xavier_uniform_,
    "xavier_normal_": nn.init.xavier_normal_,
    "kaiming_uniform_": nn.init.kaiming_uniform_,
    "kaiming_normal_": nn.init.kaiming_normal_,
}


# Mnih et al. 2015 ("Human-level control through deep reinforcement learning"), Methods: 32 8x8 filters stride 4,
# 64 4x4 stride 2, 64 3x3 stride 1, then 512 units; as SLM-Lab's Atari specs write it.
NATURE_CNN = ((32, 8, 4, 0, 1), (64, 4, 2, 0, 1), (64, 3, 1, 0, 1))


@dataclass(frozen=True)
class NetSpec:
    """The spec ``agent.net`` section (SLM-Lab key names); validated by ``orchestrator.spec``.

    Fields:
        type: key of ``NETS``.
        hid_layers: hidden widths (MLP nets).
        conv_hid_layers: conv nets: ``[[out_channels, kernel, stride, padding, dilation], ...]`` (SLM-Lab
            order; padding and dilation may be left out: 0 and 1); default the Nature CNN
            ``[[32, 8, 4, 0, 1], [64, 4, 2, 0, 1], [64, 3, 1, 0, 1]]``.
        fc_hid_layers: conv nets: widths of the fully connected layers after the convolutions (default [512]);
            ``RecurrentNet``: widths of the per-step layers before the recurrent cell (default [512], may be []).
        normalize: conv nets: scale observations by 1/255 (SLM-Lab's key); None: only when the observation
            space is uint8 (pixels). MLP nets ignore it, as SLM-Lab's MLPNet does (so its MLP specs with
            ``normalize: true`` run unmodified).
        hid_layers_activation / out_layer_activation: keys of ``ACTIVATIONS``.
        init_fn: key of ``INIT_FNS`` or None (torch default init).
        clip_grad_val: max global grad norm per optimizer step, None for no clipping.
        loss_spec: ``{"name": one of LOSSES}`` for value/Q regression.
        optim_spec: ``{"name": one of OPTIMIZERS, "lr": float, **kwargs}``.
        actor_optim_spec / critic_optim_spec: separate optimizers of an unshared actor-critic
            (default: ``optim_spec`` for both).
        lr_scheduler_spec: ``{"name": one of agents.schedules.LR_SCHEDULERS, ...}`` in frames.
        update_type: target-net update, ``"replace"`` or ``"polyak"``.
        update_frequency: frames between target-net updates; a fraction above 1 keeps its rate (2.5: 2 updates in
            5 frames), one below 1 (SLM-Lab v4's ``ddqn_concat_lunar``: 0.9) means one update per frame, as SLM-Lab
            v4 then updates at every step (``target_updates_due``).
        polyak_coef: polyak weight: kept of the old target (DQN family), or of the online critic (SAC, SLM-Lab v5.3's
            ``polyak_update``); docs/algorithms/sac.md "Target critics".
        shared: one body with actor and critic heads (actor-critic algorithms).
        log_std_init: for Box actions, a state-independent log-std parameter (A,) initialized to this
            value (nats), instead of a log-std head; None: the policy head outputs mean and log-std.
        gpu: use CUDA when visible: true, false or ``"auto"``.
        arc: ``TorchArcNet``: the body as a torcharc 2 spec ``{modules: {...}, graph: {input, modules, output}}``
            (SLM-Lab v5's ``arc``; lazy layers such as ``LazyLinear`` get their input sizes from the observation
            space); None for the other nets, which ignore it.
        actor_arc: ``TorchArcNet`` of an actor-critic algorithm (ActorCritic, PPO, SIL, PPOSIL): the actor's body in
            place of ``arc``, also a shared net's (SLM-Lab v5.3's ActorCritic strips the ``actor_`` prefix of net
            keys for its actor; ``role_spec``); refused for other algorithms.
        critic_arc: as ``actor_arc``, the critic's body (asymmetric policy and value nets); not read by a shared
            net; with ``use_same_optim: true`` the actor's.
        layer_norm: ``MLPNet`` / ``DuelingMLPNet``: a LayerNorm after each hidden Linear (SLM-Lab v5.3).
        batch_norm: ``MLPNet`` / ``DuelingMLPNet``: a ``RowBatchNorm1d`` after each hidden Linear, before its
            activation, in place of ``layer_norm`` (SLM-Lab v5.3's MLPNet; v4's MLPNet did not read the key);
            ``ConvNet`` / ``DuelingConvNet``: a BatchNorm2d after the activation of every conv layer but the first
            (SLM-Lab v4 and v5.3's ConvNet). Nets stay in train mode (batch statistics) as in SLM-Lab, except
            where an algorithm switches them (CrossQ's critics); running statistics are buffers, so checkpoints
            hold them.
        init_from: initialize the nets (only: not optimizers, not the clock) of a fresh session from
            another run's checkpoint: a session spec file ``{spec_name}_t{T}_s{S}_spec.json`` (its best
            checkpoint), a session directory, or a checkpoint directory ``ckpt/{frame:012d}``; path or
            URI. Loaded by ``orchestrator.session.transfer`` (agents never read files); None: fresh init.
        cell_type / rnn_hidden_size / rnn_num_layers / bidirectional: ``RecurrentNet``'s torch cell
            (``nn.GRU``, ``nn.LSTM``, ``nn.RNN``), its hidden width H (required), layers and direction.
        seq_len: ``RecurrentNet``: L, observations per input window (required); the env then returns windows
            (L, *O) of each sub-env's last L observations, zero-padded at episode starts (``seq_len_of``).
        precision: conv nets: ``"bfloat16"`` runs the convolutions and fc layers under ``torch.autocast`` in
            bfloat16 (mixed precision: weights, optimizer state, heads and losses stay float32; on CPUs with AMX
            or AVX512-BF16 a Nature-CNN update is ~3x faster); ``"float32"`` (default) does not. Not in SLM-Lab.
    """

    type: str = "MLPNet"
    hid_layers: list = field(default_factory=lambda: [64])
    conv_hid_layers: list = field(default_factory=lambda: [list(layer) for layer in NATURE_CNN])
    fc_hid_layers: list = field(default_factory=lambda: [512])
    normalize: bool | None = None
    hid_layers_activation: str = "relu"
    out_layer_activation: str | None = None
    init_fn: str | None = None
    clip_grad_val: float | None = None
    loss_spec: dict = field(default_factory=lambda: {"name": "MSELoss"})
    optim_spec: dict = field(default_factory=lambda: {"name": "Adam", "lr": 1e-3})
    actor_optim_spec: dict | None = None
    critic_optim_spec: dict | None = None
    lr_scheduler_spec: dict | None = None
    update_type: str = field(default="replace", metadata={"choices": ("replace", "polyak")})
    update_frequency: float = field(default=1, metadata={"gt": 0})
    polyak_coef: float = field(default=0.0, metadata={"ge": 0, "le": 1})
    shared: bool = False
    log_std_init: float | None = None
    gpu: bool | str = field(default=False, metadata={"choices": (True, False, "auto")})
    init_from: str | None = field(default=None, metadata={"origin": "lab"})
    layer_norm: bool = False
    batch_norm: bool = False
    arc: dict | None = None
    actor_arc: dict | None = None
    critic_arc: dict | None = None
    cell_type: str = field(default="GRU", metadata={"choices": ("GRU", "LSTM", "RNN")})
    rnn_hidden_size: int | None = field(default=None, metadata={"gt": 0})
    rnn_num_layers: int = field(default=1, metadata={"gt": 0})
    seq_len: int | None = field(default=None, metadata={"gt": 0})
    bidirectional: bool = False
    precision: str = field(default="float32", metadata={"origin": "lab", "choices": ("float32", "bfloat16")})


def role_spec(net_spec: NetSpec, role: str) -> NetSpec:
    """The net spec of an actor-critic's ``"actor"`` or ``"critic"`` net: ``arc`` replaced by ``actor_arc`` /
    ``critic_arc`` when that is given (SLM-Lab v5.3 ``ActorCritic.init_nets``), else ``net_spec`` itself.

    Raises:
        ValueError: a role other than actor and critic.
    """
    if role not in ("actor", "critic"):
        raise ValueError(f"role must be 'actor' or 'critic', got {role!r}")
    arc = getattr(net_spec, f"{role}_arc")
    return net_spec if arc is None else dataclasses.replace(net_spec, arc=arc)


OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "Adam": torch.optim.Adam,
    "AdamW": torch.optim.AdamW,
    "RMSprop": torch.optim.RMSprop,
    "SGD": torch.optim.SGD,
    "RAdam": torch.optim.RAdam,  # Liu et al. 2020, arXiv:1908.03265 (SLM-Lab v4 shipped its own copy)
    "Lookahead": Lookahead,  # a wrapper: {"name": "Lookahead", "optimizer": inner name, "alpha", "k", **inner kwargs}
    # SLM-Lab's optimizers of meta.distributed training (slm_lab/lib/optimizer.py): Adam / RMSprop (momentum 0, not
    # centered, torch's defaults) whose state SLM-Lab keeps in shared memory; here the trial's global actor
    # (orchestrator/global_params.py) holds every optimizer of such a trial, so they are plain Adam / RMSprop.
    # orchestrator.spec accepts them only with meta.distributed set.
    "GlobalAdam": torch.optim.Adam,
    "GlobalRMSprop": torch.optim.RMSprop,
}
GLOBAL_OPTIMIZERS = ("GlobalAdam", "GlobalRMSprop")  # the names above valid only with meta.distributed

LOSSES: dict[str, type[nn.Module]] = {
    "MSELoss": nn.MSELoss,
    "SmoothL1Loss": nn.SmoothL1Loss,
    "HuberLoss": nn.HuberLoss,
}


# Optimizers built with ``fused=True`` unless the spec sets ``fused`` or ``foreach``: one kernel per
# parameter tensor for the whole Adam update (CPU and CUDA), about 3x faster per step than the
# multi-tensor (foreach) path on CPU for 64-64 and 256-256 MLPs (measured 120 vs 400 us and 170 vs
# 520 us, one thread). Its float rounding differs from foreach's (last bits), deterministically.
# agent.net.precision -> the autocast dtype of a conv net's body (None: no autocast)
PRECISIONS: dict[str, torch.dtype | None] = {"float32": None, "bfloat16": torch.bfloat16}
PRECISION_NETS = ("ConvNet", "DuelingConvNet")  # the net types that read agent.net.precision

FUSED_DEFAULT: tuple[type[torch.optim.Optimizer], ...] = (torch.optim.Adam, torch.optim.AdamW)


def make_optim(params: Any, optim_spec: dict[str, Any]) -> torch.optim.Optimizer:
    """Build ``OPTIMIZERS[optim_spec["name"]](params, **rest)``: ``fused=True`` for ``FUSED_DEFAULT`` optimizers
    unless ``fused``, ``foreach``, ``differentiable`` or ``capturable`` is given, else ``foreach=True`` by default.
    ``Lookahead`` (SLM-Lab v4's spec shape) wraps the optimizer named by its ``optimizer`` key (default ``RAdam``,
    built by this function from the remaining keys) with its ``alpha`` (default 0.5) and ``k`` (default 5).

    Raises:
        ValueError: unknown optimizer name (lists the valid ones) or bad keyword arguments.
    """
    name = optim_spec.get("name")
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer '{name}'; expected one of {sorted(OPTIMIZERS)}")
    kwargs = {k: v for k, v in optim_spec.items() if k != "name"}
    if name == "Lookahead":
        alpha, k, inner = kwargs.pop("alpha", 0.5), kwargs.pop("k", 5), kwargs.pop("optimizer", "RAdam")
        k = int(k) if isinstance(k, float) and k.is_integer() else k  # 5.0 from a YAML or JSON number
        check_args(alpha, k)
        if inner == "Lookahead" or inner not in OPTIMIZERS:
            raise ValueError(f"Lookahead optimizer: unknown inner optimizer {inner!r}; expected one of "
                             f"{sorted(set(OPTIMIZERS) - {'Lookahead'})}")
        return Lookahead(make_optim(params, {"name": inner, **kwargs}), alpha, k)
    torch_optim.defer_dynamo()  # the constructor's add_param_group would import torch._dynamo
    if OPTIMIZERS[name] in FUSED_DEFAULT and not {"fused", "foreach", "differentiable", "capturable"} & set(kwargs):
        kwargs["fused"] = True
    elif not kwargs.get("fused"):
        # The multi-tensor step: the same arithmetic as the per-tensor loop (bit-identical
        # results on CPU), with less Python overhead per step on small nets.
        kwargs.setdefault("foreach", True)
    try:
        return OPTIMIZERS[name](params, **kwargs)
    except TypeError as err:
        raise ValueError(f"bad arguments for optimizer '{name}': {err}") from None


def make_loss(loss_spec: dict[str, Any]) -> nn.Module:
    """Build ``LOSSES[loss_spec["name"]](**rest)``.

    Raises:
        ValueError: unknown loss name (lists the valid ones).
    """
    name = loss_spec.get("name")
    if name not in LOSSES:
        raise ValueError(f"unknown loss '{name}'; expected one of {sorted(LOSSES)}")
    return LOSSES[name](**{k: v for k, v in loss_spec.items() if k != "name"})


def _init_linear(layer: nn.Module, init_fn: str | None, gain: float, activation: str) -> None:
    """Init one Linear/Conv layer's weight with ``INIT_FNS[init_fn]`` and zero its bias (None: torch's default init).

    ``orthogonal_`` takes ``gain`` (the field's per-layer gains, module docstring); ``xavier_*`` take
    ``torch.nn.init.calculate_gain(activation)`` (the net's ``hid_layers_activation``; sqrt 2 for relu, 5/3 for
    tanh, 1 where torch has no gain: elu, gelu) on every layer, heads included, as SLM-Lab v5.3's
    ``net_util.init_layers``; ``kaiming_*`` torch's default gain sqrt 2 (SLM-Lab's, which allows only relu).
    """
    if init_fn is None:
        return
    if init_fn == "orthogonal_":
        nn.init.orthogonal_(layer.weight, gain)
    elif init_fn.startswith("xavier"):
        INIT_FNS[init_fn](layer.weight, gain=activation_gain(activation))
    else:  # kaiming: torch's default gain sqrt 2, what SLM-Lab's nonlinearity=relu / leaky_relu (slope 0) gives
        INIT_FNS[init_fn](layer.weight)
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)


def activation_gain(activation: str) -> float:
    """``torch.nn.init.calculate_gain`` of an ``ACTIVATIONS`` key (``leakyrelu`` as torch's ``leaky_relu``, slope
    0.01 as ``nn.LeakyReLU``'s default); 1 for the activations torch has no gain for (elu, gelu). Raises nothing."""
    try:
        return nn.init.calculate_gain({"leakyrelu": "leaky_relu"}.get(activation, activation))
    except ValueError:
        return 1.0


class RowBatchNorm1d(nn.BatchNorm1d):
    """``nn.BatchNorm1d`` (Ioffe and Szegedy 2015) whose train-mode forward of a single row (B = 1: acting on one
    env, a one-env evaluation) normalizes by the running statistics and leaves them unchanged, where torch's raises
    (one value per feature has no batch variance; SLM-Lab's MLPNet stops there). Every other batch, and eval mode,
    as ``nn.BatchNorm1d``; the same parameters and buffers (state dicts load either way).

    Forward: (B, F) -> (B, F).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Batch norm of (B, F); see the class docstring for B = 1 in train mode."""
        if self.training and x.shape[0] == 1:
            return nn.functional.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                                            training=False, eps=self.eps)
        return super().forward(x)


def hidden_activation(name: str) -> nn.Module:
    """The activation module of ``ACTIVATIONS[name]`` for a hidden layer, that is one applied to the fresh output of
    a ``Linear``, ``Conv2d`` or ``LayerNorm`` (whose backward does not read their output): ReLU in place
    (``inplace=True``), which spares a new activation tensor per layer and forward (with SAC's 256-256 critics at
    batch 256, one 512 KB buffer written per layer: about 4% of a gradient step on this CPU)
    and gives the same values and gradients bit for bit; the other activations as built by default.

    Raises:
        KeyError: a name not in ``ACTIVATIONS`` (callers check it first).
    """
    return nn.ReLU(inplace=True) if name == "relu" else ACTIVATIONS[name]()


class MLPNet(nn.Module):
    """Multi-layer perceptron with one or more linear output heads.

    Args:
        in_dim: input features: the flattened observation size O plus extra inputs E.
        out_dims: size of each head; an int gives a single head.
        hid_layers: hidden layer widths, e.g. ``[64, 64]``.
        hid_layers_activation: key of ``ACTIVATIONS``.
        init_fn: key of ``INIT_FNS`` for hidden/out weights, or None for torch's default init.
            ``orthogonal_`` uses gain ``HIDDEN_GAIN`` (sqrt 2) on hidden layers and ``head_gains`` on heads.
        out_layer_activation: activation applied on every head, or None.
        head_gains: orthogonal gain per head (default ``VALUE_GAIN`` = 1 each); ignored by other inits.
        layer_norm: a ``LayerNorm`` after each hidden Linear, before its activation (SLM-Lab v5.3's
            ``layer_norm``, as in BRO, Nauman et al. 2024).
        batch_norm: a ``RowBatchNorm1d`` there instead (SLM-Lab v5.3's ``batch_norm``, which wins over
            ``layer_norm`` as in its ``build_fc_model``).

    Forward: ``x`` (B, *O) float (any dtype, cast to float32) and optional extras (B, E) ->
    (B, out_dim) if one head else ``list`` of (B, out_dim_k).

    Raises:
        ValueError: unknown activation or init name (lists the valid ones), or a ``head_gains``
            length that differs from the number of heads.
    """

    def __init__(self, in_dim: int, out_dims: int | Sequence[int], hid_layers: Sequence[int],
                 hid_layers_activation: str = "relu", init_fn: str | None = None,
                 out_layer_activation: str | None = None, head_gains: Sequence[float] | None = None,
                 layer_norm: bool = False, batch_norm: bool = False) -> None:
        super().__init__()
        for name in (hid_layers_activation, out_layer_activation):
            if name is not None and name not in ACTIVATIONS:
                raise ValueError(f"unknown activation '{name}'; expected one of {sorted(ACTIVATIONS)}")
        if init_fn is not None and init_fn not in INIT_FNS:
            raise ValueError(f"unknown init_fn '{init_fn}'; expected one of {sorted(INIT_FNS)}")
        self.single_head = isinstance(out_dims, int)
        head_dims = [out_dims] if self.single_head else list(out_dims)
        gains = [VALUE_GAIN] * len(head_dims) if head_gains is None else list(head_gains)
        if len(gains) != len(head_dims):
            raise ValueError(f"head_gains {gains} do not match the {len(head_dims)} heads {head_dims}")
        dims = [in_dim, *hid_layers]
        layers: list[nn.Module] = []
        for d_in, d_out in zip(dims[:-1], dims[1:]):
            norm = [RowBatchNorm1d(d_out)] if batch_norm else [nn.LayerNorm(d_out)] if layer_norm else []
            layers += [nn.Linear(d_in, d_out), *norm, hidden_activation(hid_layers_activation)]
        self.body = nn.Sequential(nn.Flatten(), *layers)
        out_act = ACTIVATIONS[out_layer_activation] if out_layer_activation else nn.Identity
        self.heads = nn.ModuleList(nn.Sequential(nn.Linear(dims[-1], d), out_act()) for d in head_dims)
        for layer in self.body:
            if isinstance(layer, nn.Linear):
                _init_linear(layer, init_fn, HIDDEN_GAIN, hid_layers_activation)
        for head, gain in zip(self.heads, gains):
            _init_linear(head[0], init_fn, gain, hid_layers_activation)

    @classmethod
    def from_spec(cls, net_spec: NetSpec, obs_space: gym.Space, out_dims: int | Sequence[int],
                  head_gains: Sequence[float] | None = None, extra_in_dim: int = 0) -> MLPNet:
        """The net of ``net_spec`` for a flattened ``obs_space`` (O = prod of its shape) plus E extra inputs.

        Raises:
            ValueError: as the constructor, or an unsupported space. ``net_spec.normalize`` is ignored,
                as SLM-Lab's MLPNet ignores it (its conv nets divide pixels by 255).
        """
        return cls(obs_in_dim(obs_space) + extra_in_dim, out_dims, net_spec.hid_layers,
                   net_spec.hid_layers_activation, net_spec.init_fn, net_spec.out_layer_activation, head_gains,
                   net_spec.layer_norm, net_spec.batch_norm)

    def features(self, x: torch.Tensor, extra: Sequence[torch.Tensor]) -> torch.Tensor:
        """Body output (B, hid_layers[-1]) of observations (B, *O) and extra inputs, each (B, E_k)."""
        # Each layer's own forward(), called directly: the same ops as calling the containers, without
        # torch's per-module call dispatch (these nets take no hooks), a large share of a small MLP's time.
        # One iterator over the Sequential's layers: ``self.body[1:]`` would build a new Sequential per call.
        layers = iter(self.body)
        h = next(layers).forward(x if x.is_floating_point() else x.float())
        if extra:
            h = torch.cat([h, *(e.reshape(len(e), -1).float() for e in extra)], dim=-1)
        for layer in layers:
            h = layer.forward(h)
        return h

    def forward(self, x: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor | list[torch.Tensor]:
        """Outputs (B, out_dim) from inputs x (B, *O) (flattened, cast to float) and extra inputs (B, *E)
        concatenated after the first layer; one tensor per head, a list for a multi-head net."""
        h = self.features(x, extra)
        outs = []
        for head in self.heads:
            out = h
            for layer in head:
                out = layer.forward(out)
            outs.append(out)
        return outs[0] if self.single_head else outs


class StackedMLP(nn.Module):
    """K single-head ``MLPNet``s of one architecture evaluated as one ensemble (e.g. SAC's twin critics): each
    layer's K weight matrices are stacked, (K, out, in), and applied with one batched matmul
    (``torch.baddbmm``), so a forward, its backward, an optimizer step or a polyak update costs the kernel
    launches and autograd nodes of one net instead of K (the arithmetic is the same K nets', row for row).

    Built from the member nets (``__init__``), which keep their modules: each member's weights and biases become
    views of its slice of the stack, so the members' ``state_dict``, ``load_state_dict`` (in place), forward,
    ``weights_sha256`` and transfer stay those of K separate nets, and always show the ensemble's current
    values. Train the ensemble's own parameters (``parameters()``: weights (K, out, in), biases (K, 1, out));
    the members' view parameters take no gradients (``requires_grad`` false).

    Args:
        nets: K >= 1 nets with ``stackable`` true and equal layer shapes and activations.

    Forward: observations (B, *O) (cast to float32, flattened) and optional extras (B, E) -> (K, B, out_dim),
    row k what member k's forward gives.

    Raises:
        ValueError: a net that is not ``stackable``, or nets of different shapes or activations.
    """

    def __init__(self, nets: Sequence[MLPNet]) -> None:
        super().__init__()
        if not nets or not all(stackable(net) for net in nets):
            raise ValueError("StackedMLP needs single-head MLPNets without layer_norm or batch_norm")
        plans = [self._plan(net) for net in nets]
        shapes = [[(lin.weight.shape, type(act)) for lin, act in plan] for plan in plans]
        if any(s != shapes[0] for s in shapes):
            raise ValueError(f"StackedMLP needs nets of one architecture, got layers {shapes}")
        self.acts = [act for _, act in plans[0]]  # elementwise activation modules, shared by the members
        names = {id(p): n for n, p in nets[0].named_parameters()}
        # the member parameter each of parameters() stacks, by name (e.g. "body.1.weight"), weights then biases
        self.member_names = [names[id(lin.weight)] for lin, _ in plans[0]] + \
            [names[id(lin.bias)] for lin, _ in plans[0]]
        self.weights = nn.ParameterList(torch.stack([plan[i][0].weight.detach() for plan in plans])
                                        for i in range(len(plans[0])))
        self.biases = nn.ParameterList(torch.stack([plan[i][0].bias.detach() for plan in plans]).unsqueeze(1)
                                       for i in range(len(plans[0])))
        for k, plan in enumerate(plans):  # members alias their slice (views share the stack's storage)
            for i, (lin, _) in enumerate(plan):
                lin.weight = nn.Parameter(self.weights[i].detach()[k], requires_grad=False)
                lin.bias = nn.Parameter(self.biases[i].detach()[k, 0], requires_grad=False)
        # (weight, bias, activation) per layer as a plain tuple: indexing ParameterLists costs ~0.1 ms per SAC
        # update in Python; the Parameter objects stay the same (``to``, ``load_state_dict`` change them in place)
        self.layers = tuple(zip(self.weights, self.biases, self.acts))

    @staticmethod
    def _plan(net: MLPNet) -> list[tuple[nn.Linear, nn.Module]]:
        """(Linear, the activation after it) per layer of ``net``, the head last (Identity if none)."""
        layers = [m for m in net.body if not isinstance(m, nn.Flatten)] + list(net.heads[0])
        plan = []
        for i, m in enumerate(layers):
            if isinstance(m, nn.Linear):
                nxt = layers[i + 1] if i + 1 < len(layers) and not isinstance(layers[i + 1], nn.Linear) else None
                plan.append((m, nxt if nxt is not None else nn.Identity()))
        return plan

    def forward(self, x: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor:
        """All K members on one batch: observations (B, *O) and extras, each (B, E_k) -> (K, B, out_dim)."""
        h = (x if x.is_floating_point() else x.float()).flatten(1)
        if extra:
            h = torch.cat([h, *(e.reshape(len(e), -1).float() for e in extra)], dim=-1)
        h = h.expand(len(self.layers[0][0]), *h.shape)
        for w, b, act in self.layers:
            h = act.forward(torch.baddbmm(b, h, w.transpose(1, 2)))
        return h


def stackable(net: nn.Module) -> bool:
    """True for a net ``StackedMLP`` takes: exactly an ``MLPNet`` (not a subclass) with one head and no
    ``LayerNorm`` or batch norm."""
    return type(net) is MLPNet and net.single_head and not any(isinstance(m, (nn.LayerNorm, nn.BatchNorm1d))
                                                               for m in net.body)


class DuelingMLPNet(MLPNet):
    """Dueling Q-network (Wang et al. 2016, arXiv:1511.06581): an MLP body, a state-value stream V (B, 1)
    and an advantage stream A (B, A), combined as ``Q = V + A - mean_a A`` (B, A).

    Same arguments as ``MLPNet`` with one head (``out_dims`` = number of actions). Both streams are
    ``VALUE_GAIN`` heads.

    Raises:
        ValueError: as ``MLPNet``, or ``out_dims`` that is not one int.
    """

    def __init__(self, in_dim: int, out_dims: int | Sequence[int], hid_layers: Sequence[int],
                 hid_layers_activation: str = "relu", init_fn: str | None = None,
                 out_layer_activation: str | None = None, head_gains: Sequence[float] | None = None,
                 layer_norm: bool = False, batch_norm: bool = False) -> None:
        if not isinstance(out_dims, int):
            raise ValueError(f"DuelingMLPNet has one Q head (int out_dims), got {out_dims}")
        gains = None if head_gains is None else [head_gains[0], head_gains[0]]
        super().__init__(in_dim, [1, out_dims], hid_layers, hid_layers_activation, init_fn, out_layer_activation,
                         gains, layer_norm, batch_norm)
        self.single_head = True

    def forward(self, x: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor:
        """Q-values (B, A) from inputs x (B, *O) through ``dueling_q``."""
        return dueling_q(self.heads, self.features(x, extra))


def dueling_q(heads: nn.ModuleList, h: torch.Tensor) -> torch.Tensor:
    """``Q = V + A - mean_a A`` (B, A) from features h (B, F) and the two heads [V (F -> 1), A (F -> A)]."""
    value, adv = (head[1].forward(head[0].forward(h)) for head in heads)
    return value + adv - adv.mean(dim=-1, keepdim=True)


def conv_layer_args(layer: Sequence[int]) -> tuple[int, int, int, int, int]:
    """SLM-Lab's ``[out, kernel, stride, padding, dilation]`` (last two optional: 0, 1) as a 5-tuple of ints.

    Raises:
        ValueError: not 3 to 5 ints, or a non-positive out/kernel/stride/dilation or a negative padding.
    """
    layer = list(layer)
    if not 3 <= len(layer) <= 5 or not all(isinstance(v, int) and not isinstance(v, bool) for v in layer):
        raise ValueError(f"conv layer {layer}: expected [out, kernel, stride, padding, dilation] ints")
    out, kernel, stride, padding, dilation = [*layer, 0, 1][:5] if len(layer) == 3 else [*layer, 1][:5]
    if min(out, kernel, stride, dilation) < 1 or padding < 0:
        raise ValueError(f"conv layer {layer}: out, kernel, stride, dilation must be >= 1 and padding >= 0")
    return out, kernel, stride, padding, dilation


class ConvNet(nn.Module):
    """Conv net for image observations: ``conv_hid_layers`` (Conv2d + activation each), flatten, extra inputs
    concatenated, ``fc_hid_layers`` (Linear + activation), then one or more linear heads (SLM-Lab ``ConvNet``;
    defaults the Nature CNN of Mnih et al. 2015).

    Args:
        in_shape: one observation: (C, H, W) channel-first (a frame stack), (H, W) (one grayscale channel
            added), or (H, W, C) with C in {1, 3, 4} and H, W > 4 (channel-last: permuted inside).
        out_dims: size of each head; an int gives a single head.
        conv_hid_layers: ``[[out, kernel, stride, padding, dilation], ...]``, see ``conv_layer_args``.
        fc_hid_layers: widths after the convolutions; may be empty (heads on the conv features).
        hid_layers_activation / out_layer_activation / init_fn / head_gains: as ``MLPNet`` (orthogonal init:
            ``HIDDEN_GAIN`` on conv and fc layers).
        extra_in_dim: E, features of extra inputs joined to the flattened conv output.
        obs_scale: multiplier of the input (1/255 for uint8 pixels) or None.
        precision: ``"float32"``, or ``"bfloat16"``: convolutions and fc layers under ``torch.autocast``
            (bfloat16 on the input's device), their output cast back to float32 before the heads.
        batch_norm: a ``BatchNorm2d`` after the activation of every conv layer but the first (SLM-Lab's ConvNet).

    Forward: ``x`` (B, *in_shape) any dtype (uint8 stays uint8 until here; cast to float32, times
    ``obs_scale``) and optional extras (B, E) -> (B, out_dim) float32 if one head else a list of (B, out_dim_k).

    Raises:
        ValueError: a shape other than the three above, a bad conv layer, an image too small for the
            convolutions, or (as ``MLPNet``) unknown activation/init names or head gains.
    """

    def __init__(self, in_shape: Sequence[int], out_dims: int | Sequence[int], conv_hid_layers: Sequence[Sequence[int]],
                 fc_hid_layers: Sequence[int], hid_layers_activation: str = "relu", init_fn: str | None = None,
                 out_layer_activation: str | None = None, head_gains: Sequence[float] | None = None,
                 extra_in_dim: int = 0, obs_scale: float | None = None, precision: str = "float32",
                 batch_norm: bool = False) -> None:
        super().__init__()
        _check_names(hid_layers_activation, out_layer_activation, init_fn)
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, got {precision!r}")
        self.in_shape, self.obs_scale = tuple(in_shape), obs_scale
        self.autocast_dtype = PRECISIONS[precision]
        self.layout = image_layout(self.in_shape)
        chw = self.chw_shape(self.in_shape)
        convs: list[nn.Module] = []
        channels = chw[0]
        for i, layer in enumerate(conv_hid_layers):
            out, kernel, stride, padding, dilation = conv_layer_args(layer)
            convs += [nn.Conv2d(channels, out, kernel, stride, padding, dilation),
                      hidden_activation(hid_layers_activation), *([nn.BatchNorm2d(out)] if batch_norm and i else [])]
            channels = out
        self.conv = nn.Sequential(*convs, nn.Flatten())
        self.conv.eval()  # the size probe below must not update batch-norm statistics
        with torch.no_grad():
            try:
                conv_dim = int(self.conv(torch.zeros(1, *chw)).shape[-1])
            except RuntimeError as err:
                raise ValueError(f"observation {self.in_shape} too small for conv layers {conv_hid_layers}: {err}")
        self.conv.train()
        dims = [conv_dim + extra_in_dim, *fc_hid_layers]
        fcs: list[nn.Module] = []
        for d_in, d_out in zip(dims[:-1], dims[1:]):
            fcs += [nn.Linear(d_in, d_out), hidden_activation(hid_layers_activation)]
        self.fc = nn.Sequential(*fcs)
        self.single_head, self.heads = _make_heads(dims[-1], out_dims, out_layer_activation, init_fn, head_gains,
                                                   hid_layers_activation)
        for layer in [*self.conv, *self.fc]:
            if isinstance(layer, (nn.Linear, nn.Conv2d)):
                _init_linear(layer, init_fn, HIDDEN_GAIN, hid_layers_activation)
        # NHWC kernels: on CPU (oneDNN) a Nature-CNN forward + backward of 256 frames takes 0.21 s instead of 0.39 s
        # on one thread; the weights keep their values and logical shapes (state_dict, sha256 unchanged in meaning)
        self.conv.to(memory_format=torch.channels_last)

    @classmethod
    def from_spec(cls, net_spec: NetSpec, obs_space: gym.Space, out_dims: int | Sequence[int],
                  head_gains: Sequence[float] | None = None, extra_in_dim: int = 0) -> ConvNet:
        """The conv net of ``net_spec`` for an image ``obs_space`` (numeric Box of 2 or 3 dims).

        ``normalize`` None scales by 1/255 when the space is uint8; true always; false never.

        Raises:
            ValueError: a space that is not a numeric image Box, or as the constructor.
        """
        if not (isinstance(obs_space, gym.spaces.Box) and np.issubdtype(obs_space.dtype, np.number)):
            raise ValueError(f"{cls.__name__} needs a numeric Box observation space, got {obs_space}")
        scale = net_spec.normalize if net_spec.normalize is not None else obs_space.dtype == np.uint8
        return cls(obs_space.shape, out_dims, net_spec.conv_hid_layers, net_spec.fc_hid_layers,
                   net_spec.hid_layers_activation, net_spec.init_fn, net_spec.out_layer_activation, head_gains,
                   extra_in_dim, 1.0 / 255.0 if scale else None, net_spec.precision, net_spec.batch_norm)

    def chw_shape(self, shape: tuple[int, ...]) -> tuple[int, int, int]:
        """(C, H, W) of one observation of ``shape`` under this net's layout."""
        if self.layout == "hw":
            return (1, *shape)
        return (shape[2], shape[0], shape[1]) if self.layout == "hwc" else tuple(shape)

    def features(self, x: torch.Tensor, extra: Sequence[torch.Tensor]) -> torch.Tensor:
        """fc output (B, F) of observations (B, *in_shape) and extra inputs, each (B, E_k)."""
        if self.layout == "hw":
            x = x.unsqueeze(1)
        elif self.layout == "hwc":
            x = x.permute(0, 3, 1, 2)
        x = x.contiguous(memory_format=torch.channels_last)  # NHWC while still uint8: a quarter of the bytes
        dtype = self.autocast_dtype or torch.float32  # the convs' input dtype (autocast would cast to it anyway)
        if x.dtype != dtype:  # uint8 (or float32 under bf16) -> dtype once, scaled in place (layout kept)
            x = x.to(dtype)
            if self.obs_scale is not None:
                x.mul_(self.obs_scale)
        elif self.obs_scale is not None:  # a float32 input is not modified
            x = x * self.obs_scale
        with torch.autocast(x.device.type, dtype=self.autocast_dtype or torch.bfloat16,
                            enabled=self.autocast_dtype is not None):
            h = self.conv(x)
            if extra:
                h = torch.cat([h, *(e.reshape(len(e), -1).float() for e in extra)], dim=-1)
            return self.fc(h).float()

    def forward(self, x: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor | list[torch.Tensor]:
        """(B, *in_shape) and extras (B, E) -> (B, out_dim), or a list of (B, out_dim_k) with several heads."""
        h = self.features(x, extra)
        outs = [head(h) for head in self.heads]
        return outs[0] if self.single_head else outs


class DuelingConvNet(ConvNet):
    """Dueling Q-network (Wang et al. 2016) on a ``ConvNet`` body: ``Q = V + A - mean_a A`` (B, A).

    Same arguments as ``ConvNet`` with one head (``out_dims`` = number of actions).

    Raises:
        ValueError: as ``ConvNet``, or ``out_dims`` that is not one int.
    """

    def __init__(self, in_shape: Sequence[int], out_dims: int | Sequence[int], conv_hid_layers: Sequence[Sequence[int]],
                 fc_hid_layers: Sequence[int], hid_layers_activation: str = "relu", init_fn: str | None = None,
                 out_layer_activation: str | None = None, head_gains: Sequence[float] | None = None,
                 extra_in_dim: int = 0, obs_scale: float | None = None, precision: str = "float32",
                 batch_norm: bool = False) -> None:
        if not isinstance(out_dims, int):
            raise ValueError(f"DuelingConvNet has one Q head (int out_dims), got {out_dims}")
        gains = None if head_gains is None else [head_gains[0], head_gains[0]]
        super().__init__(in_shape, [1, out_dims], conv_hid_layers, fc_hid_layers, hid_layers_activation, init_fn,
                         out_layer_activation, gains, extra_in_dim, obs_scale, precision, batch_norm)
        self.single_head = True

    def forward(self, x: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor:
        """(B, *in_shape) and extras (B, E) -> Q-values (B, A) float32."""
        return dueling_q(self.heads, self.features(x, extra))


def image_layout(shape: Sequence[int]) -> str:
    """``"chw"``, ``"hw"`` or ``"hwc"`` (channel-last: last dim 1, 3 or 4 and the first two > 4) of one image.

    Raises:
        ValueError: a shape of other than 2 or 3 dims.
    """
    if len(shape) == 2:
        return "hw"
    if len(shape) != 3:
        raise ValueError(f"conv nets need (C, H, W), (H, W) or (H, W, C) observations, got shape {tuple(shape)}")
    return "hwc" if shape[2] in (1, 3, 4) and min(shape[0], shape[1]) > 4 else "chw"


def _check_names(hid_layers_activation: str, out_layer_activation: str | None, init_fn: str | None) -> None:
    """Raise ValueError naming an unknown activation or init function (with the valid ones)."""
    for name in (hid_layers_activation, out_layer_activation):
        if name is not None and name not in ACTIVATIONS:
            raise ValueError(f"unknown activation '{name}'; expected one of {sorted(ACTIVATIONS)}")
    if init_fn is not None and init_fn not in INIT_FNS:
        raise ValueError(f"unknown init_fn '{init_fn}'; expected one of {sorted(INIT_FNS)}")


def _make_heads(in_dim: int, out_dims: int | Sequence[int], out_layer_activation: str | None, init_fn: str | None,
                head_gains: Sequence[float] | None, hid_layers_activation: str) -> tuple[bool, nn.ModuleList]:
    """(single_head, heads): one ``Sequential(Linear(in_dim, d), out activation)`` per head, initialized
    (``_init_linear``: head gains for orthogonal, the gain of the net's ``hid_layers_activation`` for xavier).

    Raises:
        ValueError: ``head_gains`` whose length differs from the number of heads.
    """
    single = isinstance(out_dims, int)
    head_dims = [out_dims] if single else list(out_dims)
    gains = [VALUE_GAIN] * len(head_dims) if head_gains is None else list(head_gains)
    if len(gains) != len(head_dims):
        raise ValueError(f"head_gains {gains} do not match the {len(head_dims)} heads {head_dims}")
    out_act = ACTIVATIONS[out_layer_activation] if out_layer_activation else nn.Identity
    heads = nn.ModuleList(nn.Sequential(nn.Linear(in_dim, d), out_act()) for d in head_dims)
    for head, gain in zip(heads, gains):
        _init_linear(head[0], init_fn, gain, hid_layers_activation)
    return single, heads


TORCHARC_VERSION = "2.1.2"
INSTALL_HINT = f"pip install --no-deps --ignore-requires-python torcharc=={TORCHARC_VERSION}"
_INIT_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def build_arc(arc: Any) -> nn.Module:
    """The torcharc module (a ``torch.fx.GraphModule``) of a torcharc 2 spec dict; lazy layers stay lazy.

    Raises:
        ValueError: ``arc`` not a dict, torcharc not installed (with the install command), or a spec torcharc
            rejects (unknown ``torch.nn`` class, bad kwargs, a graph naming a missing node, a dict output).
    """
    if not isinstance(arc, dict):
        raise ValueError(f"expected a torcharc spec {{modules: ..., graph: ...}}, got {arc!r}")
    try:
        import torcharc
    except ImportError:
        raise ValueError(f"TorchArcNet needs the torcharc package ({INSTALL_HINT})") from None
    try:
        body = torcharc.build(copy.deepcopy(arc))  # its validators rewrite the dict ({ReLU: null} -> {ReLU: {}})
    except Exception as err:  # pydantic's ValidationError, torch's TypeError, a KeyError of the graph, ...
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip() and "errors.pydantic.dev" not in ln]
        text = "; ".join(lines)
        raise ValueError(f"torcharc cannot build it: {type(err).__name__}: "
                         f"{text if len(text) <= 400 else text[:397] + '...'}") from None
    out = [n for n in body.graph.nodes if n.op == "output"][0].args[0]
    if isinstance(out, dict):
        raise ValueError(f"graph.output: expected one node name or a list (the first is used), got {out}")
    return body


class TorchArcNet(nn.Module):
    """A torcharc body, flattened, then one or more linear heads (SLM-Lab v5 ``TorchArcNet``).

    Args:
        arc: torcharc 2 spec of the body, e.g. ``{modules: {body: {Sequential: [{LazyLinear: {out_features:
            64}}, {Tanh: null}]}}, graph: {input: x, modules: {body: [x]}, output: body}}``. Its graph takes one
            input; a list/tuple output uses its first element, as SLM-Lab does.
        in_shape: one observation's shape O; the body sees (B, *O) as is (no channel permutation), or with
            extra inputs the flat (B, prod(O) + E).
        out_dims / head_gains / out_layer_activation / init_fn: as ``MLPNet``. With ``init_fn`` every Linear and
            Conv layer of the body is re-initialized (orthogonal: gain ``HIDDEN_GAIN``; xavier: the gain of
            ``hid_layers_activation``), biases 0.
        extra_in_dim: E, features of extra inputs (e.g. the action of Q(s, a)), concatenated to the flattened
            observation before the body (SLM-Lab's SAC critic input ``cat(state, action)``).
        obs_scale: multiplier of the input (1/255 for pixels) or None.
        hid_layers_activation: ``ACTIVATIONS`` key whose gain xavier init uses (SLM-Lab's TorchArcNet reads the
            spec's ``hid_layers_activation`` for it, default relu); the arc itself names its own activations.

    Lazy layers (``LazyLinear``, ``LazyConv2d``, ...) are materialized in the constructor by one forward of a
    zero batch (B = 1) in eval mode, so parameters exist before optimizers are built and checkpoints loaded.

    Forward: ``x`` (B, *O) any dtype (cast to float32, times ``obs_scale``) and extras (B, E) ->
    (B, out_dim) with one head, else a list of (B, out_dim_k).

    Raises:
        ValueError: as ``build_arc``; the dummy forward fails (shapes that do not fit the observation), the
            body leaves lazy parameters unmaterialized or returns no tensor, or unknown init/activation names.
    """

    def __init__(self, arc: dict, in_shape: Sequence[int], out_dims: int | Sequence[int],
                 init_fn: str | None = None, out_layer_activation: str | None = None,
                 head_gains: Sequence[float] | None = None, extra_in_dim: int = 0,
                 obs_scale: float | None = None, hid_layers_activation: str = "relu") -> None:
        super().__init__()
        _check_names(hid_layers_activation, out_layer_activation, init_fn)
        self.in_shape, self.extra_in_dim, self.obs_scale = tuple(in_shape), extra_in_dim, obs_scale
        self.body = build_arc(arc)
        dummy = torch.zeros(1, *self.in_shape)
        extra = (torch.zeros(1, extra_in_dim),) if extra_in_dim else ()
        self.body.eval()  # batch statistics of one row would fail (BatchNorm) and must not be recorded
        with torch.no_grad():
            try:
                feat_dim = int(self.features(dummy, extra).shape[-1])
            except (RuntimeError, ValueError, TypeError, IndexError) as err:
                raise ValueError(f"arc does not fit observations of shape {self.in_shape}"
                                 f"{f' plus {extra_in_dim} extra inputs' if extra_in_dim else ''}: {err}") from None
        self.body.train()
        lazy = [name for name, p in [*self.body.named_parameters(), *self.body.named_buffers()] if is_lazy(p)]
        if lazy:
            raise ValueError(f"arc: lazy layers not reached from graph.input, left unmaterialized: {lazy}")
        self.single_head, self.heads = _make_heads(feat_dim, out_dims, out_layer_activation, init_fn, head_gains,
                                                   hid_layers_activation)
        for layer in self.body.modules():
            if isinstance(layer, _INIT_LAYERS):
                _init_linear(layer, init_fn, HIDDEN_GAIN, hid_layers_activation)

    @classmethod
    def from_spec(cls, net_spec: NetSpec, obs_space: gym.Space, out_dims: int | Sequence[int],
                  head_gains: Sequence[float] | None = None, extra_in_dim: int = 0) -> TorchArcNet:
        """The net of ``net_spec.arc`` for a numeric Box ``obs_space``.

        ``normalize`` (SLM-Lab's TorchArcNet key): true scales inputs by 1/255, false never, None (the lab's
        default) only when the space is uint8 (pixels).

        Raises:
            ValueError: no ``arc``, a space that is not a numeric Box, or as the constructor.
        """
        if net_spec.arc is None:
            raise ValueError("agent.net.arc: net.type TorchArcNet needs a torcharc spec {modules, graph} (or, for "
                             "the actor and critic of an actor-critic algorithm, actor_arc and critic_arc)")
        if not (isinstance(obs_space, gym.spaces.Box) and np.issubdtype(obs_space.dtype, np.number)):
            raise ValueError(f"TorchArcNet needs a numeric Box observation space, got {obs_space}")
        scale = net_spec.normalize if net_spec.normalize is not None else obs_space.dtype == np.uint8
        return cls(net_spec.arc, obs_space.shape, out_dims, net_spec.init_fn, net_spec.out_layer_activation,
                   head_gains, extra_in_dim, 1.0 / 255.0 if scale else None, net_spec.hid_layers_activation)

    def features(self, x: torch.Tensor, extra: Sequence[torch.Tensor]) -> torch.Tensor:
        """Flattened body output (B, F) of observations (B, *O) and extra inputs, each (B, E_k)."""
        x = x.float()
        if self.obs_scale is not None:
            x = x * self.obs_scale
        if extra:
            x = torch.cat([x.reshape(len(x), -1), *(e.reshape(len(e), -1).float() for e in extra)], dim=-1)
        h = self.body(x)
        if isinstance(h, (list, tuple)):
            h = h[0]
        if not isinstance(h, torch.Tensor):
            raise ValueError(f"arc graph.output gave {type(h).__name__}, expected a tensor")
        return h.reshape(len(h), -1)

    def forward(self, x: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor | list[torch.Tensor]:
        """(B, *O) and extras (B, E) -> (B, out_dim), or a list of (B, out_dim_k) with several heads."""
        h = self.features(x, extra)
        outs = [head(h) for head in self.heads]
        return outs[0] if self.single_head else outs


RNN_CELLS: dict[str, type[nn.RNNBase]] = {"GRU": nn.GRU, "LSTM": nn.LSTM, "RNN": nn.RNN}


class RecurrentNet(nn.Module):
    """Recurrent net over a window of the last L observations (SLM-Lab ``RecurrentNet``): ``fc_hid_layers``
    applied to each step (Linear + activation), a ``cell_type`` cell (``nn.GRU`` / ``nn.LSTM`` / ``nn.RNN``
    with tanh, batch-first) run over the L steps from a zero hidden state, the last layer's final hidden
    state ``h_n[-1]`` (B, H) (with ``bidirectional``, as SLM-Lab, the backward direction's), extra inputs
    concatenated, then one or more linear heads.

    The window, not a hidden state, is what a rollout carries: the env returns each sub-env's last L
    observations, zero-padded at episode starts (``envs.wrappers.ObsWindow``, built by ``make_env`` with
    ``seq_len_of(net_spec)``), as SLM-Lab v4's sequence memories gave its RecurrentNet; the window lives in
    the (pickled) env, so it is reset at every episode end and restored exactly from a checkpoint.

    Args:
        in_shape: one input (L, *O): L = ``seq_len`` steps of observations O, flattened to D = prod(O).
        out_dims: size of each head; an int gives a single head.
        cell_type: key of ``RNN_CELLS``.
        hidden_size: H, the cell's hidden width; num_layers: stacked cell layers.
        fc_hid_layers: widths of the per-step layers before the cell; may be empty (the cell reads D).
        hid_layers_activation / out_layer_activation / init_fn / head_gains: as ``MLPNet``; ``init_fn`` also
            initializes every cell weight matrix (orthogonal_ with gain 1) and zeroes the cell biases.
        extra_in_dim: E, features of extra inputs joined to ``h_n[-1]`` before the heads.
        bidirectional: run the cell both ways over the window.

    Forward: ``x`` (B, L, *O) any dtype (cast to float32) and optional extras (B, E) -> (B, out_dim) if one
    head else a list of (B, out_dim_k).

    Raises:
        ValueError: an unknown ``cell_type``, an ``in_shape`` with fewer than 2 dims, or as ``MLPNet``.
    """

    def __init__(self, in_shape: Sequence[int], out_dims: int | Sequence[int], cell_type: str, hidden_size: int,
                 num_layers: int = 1, fc_hid_layers: Sequence[int] = (), hid_layers_activation: str = "relu",
                 init_fn: str | None = None, out_layer_activation: str | None = None,
                 head_gains: Sequence[float] | None = None, extra_in_dim: int = 0,
                 bidirectional: bool = False) -> None:
        super().__init__()
        _check_names(hid_layers_activation, out_layer_activation, init_fn)
        if cell_type not in RNN_CELLS:
            raise ValueError(f"unknown cell_type '{cell_type}'; expected one of {sorted(RNN_CELLS)}")
        if len(in_shape) < 2:
            raise ValueError(f"RecurrentNet needs inputs (seq_len, *O), got shape {tuple(in_shape)}")
        self.seq_len, self.in_dim, self.cell_type = int(in_shape[0]), int(np.prod(in_shape[1:])), cell_type
        dims = [self.in_dim, *fc_hid_layers]
        fcs: list[nn.Module] = []
        for d_in, d_out in zip(dims[:-1], dims[1:]):
            fcs += [nn.Linear(d_in, d_out), hidden_activation(hid_layers_activation)]
        self.fc = nn.Sequential(*fcs)
        self.rnn = RNN_CELLS[cell_type](dims[-1], hidden_size, num_layers, batch_first=True,
                                        bidirectional=bidirectional)
        self.single_head, self.heads = _make_heads(hidden_size + extra_in_dim, out_dims, out_layer_activation,
                                                   init_fn, head_gains, hid_layers_activation)
        for layer in self.fc:
            if isinstance(layer, nn.Linear):
                _init_linear(layer, init_fn, HIDDEN_GAIN, hid_layers_activation)
        if init_fn is not None:
            for name, param in self.rnn.named_parameters():
                if name.startswith("weight"):
                    INIT_FNS[init_fn](param)
                else:
                    nn.init.zeros_(param)

    @classmethod
    def from_spec(cls, net_spec: NetSpec, obs_space: gym.Space, out_dims: int | Sequence[int],
                  head_gains: Sequence[float] | None = None, extra_in_dim: int = 0) -> RecurrentNet:
        """The recurrent net of ``net_spec`` for window observations ``obs_space`` of shape (seq_len, *O).

        Raises:
            ValueError: ``rnn_hidden_size`` or ``seq_len`` unset, a space that is not a numeric Box whose first
                dim is ``seq_len`` (the env was not built with ``seq_len_of(net_spec)``), or as the constructor.
        """
        for key in ("rnn_hidden_size", "seq_len"):
            if getattr(net_spec, key) is None:
                raise ValueError(f"agent.net.{key}: RecurrentNet needs it (a positive int)")
        shape = getattr(obs_space, "shape", None) or ()
        if not (isinstance(obs_space, gym.spaces.Box) and np.issubdtype(obs_space.dtype, np.number)
                and len(shape) >= 2 and shape[0] == net_spec.seq_len):
            raise ValueError(f"RecurrentNet needs numeric Box windows (seq_len={net_spec.seq_len}, *O) from the env "
                             f"(make_env with seq_len), got {obs_space}")
        return cls(shape, out_dims, net_spec.cell_type, net_spec.rnn_hidden_size, net_spec.rnn_num_layers,
                   net_spec.fc_hid_layers, net_spec.hid_layers_activation, net_spec.init_fn,
                   net_spec.out_layer_activation, head_gains, extra_in_dim, net_spec.bidirectional)

    def features(self, x: torch.Tensor, extra: Sequence[torch.Tensor]) -> torch.Tensor:
        """``h_n[-1]`` (B, H) of windows (B, L, *O), extra inputs (B, E_k) joined: (B, H + E)."""
        h = self.fc(x.float().reshape(len(x), self.seq_len, self.in_dim))
        _, h_n = self.rnn(h)
        h = (h_n[0] if self.cell_type == "LSTM" else h_n)[-1]  # LSTM: (h_n, c_n)
        if extra:
            h = torch.cat([h, *(e.reshape(len(e), -1).float() for e in extra)], dim=-1)
        return h

    def forward(self, x: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor | list[torch.Tensor]:
        """(B, L, *O) and extras (B, E) -> (B, out_dim), or a list of (B, out_dim_k) with several heads."""
        h = self.features(x, extra)
        outs = [head(h) for head in self.heads]
        return outs[0] if self.single_head else outs


def arc_problems(arc: Any) -> list[str]:
    """Spec-time problems of ``agent.net.arc`` (torcharc validation and module construction; lazy shapes are
    checked only when the net meets its observation space), each prefixed by the key path."""
    try:
        build_arc(arc)
    except ValueError as err:
        return [f"agent.net.arc: {err}"]
    return []


def seq_len_of(net_spec: NetSpec) -> int | None:
    """The observation window L the env must give the nets of ``net_spec``: ``seq_len`` for a
    ``RecurrentNet``, None (plain observations) for every other net type."""
    return net_spec.seq_len if net_spec.type == "RecurrentNet" else None


NETS: dict[str, type[nn.Module]] = {"MLPNet": MLPNet, "DuelingMLPNet": DuelingMLPNet, "ConvNet": ConvNet,
                                    "DuelingConvNet": DuelingConvNet, "TorchArcNet": TorchArcNet,
                                    "RecurrentNet": RecurrentNet}


def obs_in_dim(obs_space: gym.Space) -> int:
    """Flattened observation size O of a ``Box`` space of any numeric dtype (integer observations, e.g.
    uint8 pixels, are cast to float32 in ``forward``).

    Raises:
        ValueError: other spaces (Discrete, Dict, Tuple, ...), which need an encoder of their own.
    """
    if isinstance(obs_space, gym.spaces.Box) and np.issubdtype(obs_space.dtype, np.number):
        return int(np.prod(obs_space.shape))
    raise ValueError(f"unsupported observation space {obs_space}; expected a numeric Box")


def make_net(net_spec: NetSpec, obs_space: gym.Space, out_dims: int | Sequence[int],
             head_gains: Sequence[float] | None = None, extra_in_dim: int = 0) -> nn.Module:
    """Build a net of ``NETS[net_spec.type]`` for observations of ``obs_space``.

    Args:
        net_spec: the ``agent.net`` section (type, layers, activations, init).
        obs_space: single-env observation space (numeric ``Box``); its shape gives O, its dtype the input
            scaling of conv nets (uint8: 1/255).
        out_dims: head size(s).
        head_gains: orthogonal-init gain per head (``POLICY_GAIN``, ``VALUE_GAIN``); default 1 each.
        extra_in_dim: E, features of the extra inputs passed to ``forward`` after the observation
            (e.g. a one-hot or continuous action for Q(s, a)).

    Raises:
        ValueError: unknown ``net_spec.type`` (lists the valid ones), an unsupported space, or a bad layer spec.
    """
    if net_spec.type not in NETS:
        raise ValueError(f"unknown net type '{net_spec.type}'; expected one of {sorted(NETS)}")
    return NETS[net_spec.type].from_spec(net_spec, obs_space, out_dims, head_gains, extra_in_dim)


def target_updates_due(frame: int, last_frame: int, update_frequency: float) -> int:
    """Target-net updates due at ``frame``: the multiples of ``update_frequency`` frames crossed since ``last_frame``.

    A fractional ``update_frequency`` below 1 counts as 1 (one update per frame): SLM-Lab v4 updates the target
    whenever ``frame % update_frequency < num_envs`` (``util.frame_mod``), which then holds at every step; with one
    sub-env that is once per frame. A fraction above 1 (e.g. 2.5: 2 updates in 5 frames) keeps its rate.
    """
    uf = max(float(update_frequency), 1.0)
    return int(frame // uf - last_frame // uf)


def polyak_update(src: nn.Module, dst: nn.Module, coef: float) -> None:
    """In place: ``dst = coef * src + (1 - coef) * dst`` over parameters (coef 1 = hard replace)."""
    with torch.no_grad():
        for p_src, p_dst in zip(src.parameters(), dst.parameters()):
            p_dst.lerp_(p_src, coef)
