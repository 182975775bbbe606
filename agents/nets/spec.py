"""The ``agent.net`` spec section (``NetSpec``) and what is read off it before a net is built: an actor-critic
role's spec (``role_spec``) and the observation window a net needs (``seq_len_of``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

# optimizer arguments PBT may change mid-run: they are re-applied to the optimizers' param groups after every
# restore (field metadata ``perturbable``, orchestrator.spec.pbt)
OPTIM_PERTURBABLE = ("lr", "weight_decay", "eps", "momentum")
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
    clip_grad_val: float | None = field(default=None, metadata={"perturbable": True})
    loss_spec: dict = field(default_factory=lambda: {"name": "MSELoss"})
    optim_spec: dict = field(default_factory=lambda: {"name": "Adam", "lr": 1e-3},
                             metadata={"perturbable": OPTIM_PERTURBABLE})
    actor_optim_spec: dict | None = field(default=None, metadata={"perturbable": OPTIM_PERTURBABLE})
    critic_optim_spec: dict | None = field(default=None, metadata={"perturbable": OPTIM_PERTURBABLE})
    lr_scheduler_spec: dict | None = field(default=None, metadata={"perturbable": "*"})
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


def seq_len_of(net_spec: NetSpec) -> int | None:
    """The observation window L the env must give the nets of ``net_spec``: ``seq_len`` for a
    ``RecurrentNet``, None (plain observations) for every other net type."""
    return net_spec.seq_len if net_spec.type == "RecurrentNet" else None
