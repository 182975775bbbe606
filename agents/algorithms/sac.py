"""Soft actor-critic (Haarnoja et al. 2018, arXiv:1801.01290 and arXiv:1812.05905), continuous and discrete.

Continuous (Box) actions: a tanh-squashed Gaussian policy (``policy.tanh_gaussian_sample``, log-prob with
the tanh correction), twin critics Q_k(s, a) fed ``[obs, a]`` with ``a`` in [-1, 1]; the env is sent ``a``
rescaled to the Box bounds (``env_action``), memory stores ``a``. Discrete actions (as SLM-Lab has it,
Christodoulou 2019, arXiv:1910.07207): a categorical policy, critics Q_k(s) -> (B, A), expectations over
actions taken exactly, and the mean (not the min) of the two critics in the target and the policy loss.

Per gradient step, on a replay batch (``Replay`` or ``PrioritizedReplay``), with ``alpha = exp(log_alpha)``:

    y = r + gamma * (1 - terminated) * V'(s')        V'(s') = min_k Q'_k(s', a') - alpha * log pi(a'|s'), a' ~ pi
                                                      (discrete: sum_a pi(a|s') [mean_k Q'_k(s', a) - alpha log pi])
    critic: L(Q_1(s, a), y) + L(Q_2(s, a), y)         (PER: each term weighted per sample; priorities |y - min_k Q_k|)
    actor:  mean(alpha * log pi(a~|s) - min_k Q_k(s, a~)), a~ reparameterized
            (discrete: mean(sum_a pi (alpha log pi - mean_k Q_k(s, a))), Q detached)
    alpha:  -mean(exp(log_alpha) * (log pi(a~|s) + H_target))   (discrete: -exp(log_alpha) * (H_target - H))

then ``log_alpha`` is clamped to [log_alpha_min, log_alpha_max] (default -5, 2 as SLM-Lab v5.3) and the target critics
move by polyak averaging, ``Q' <- polyak_coef * Q + (1 - polyak_coef) * Q'`` every step (right after the critics'
step, since neither the actor's nor the temperature's loss reads the targets; SLM-Lab v5.3's
``polyak_update``: ``polyak_coef`` is the weight of the online net, the paper's tau), or, with
``update_type: replace``, are copied once per ``net.update_frequency`` frames crossed. ``H_target`` is
``target_entropy``, by default -A (continuous) or 0.6 ln A (discrete, SLM-Lab's ``start_ratio``).

Cadence (``ReplayCadence``): uniform random actions while ``clock.frame < training_start_step``; once the
replay holds ``training_start_step`` transitions, a vector step that crosses a multiple of
``training_frequency`` frames runs one round of ``training_iter`` gradient steps (SLM-Lab v5.3: at most one
round per vector step; ``training_iter`` defaults to ``num_envs``). ``opt_step`` counts critic steps (one per
gradient step; both critics are stepped on their summed loss in one ``optim_step``, each clipped to its own
norm); actor and temperature steps (one backward of their summed losses, which share no parameters) are not counted.

Nets: ``net`` (actor), ``q1_net``, ``q2_net``, ``target_q1_net``, ``target_q2_net`` and the tensor
``log_alpha`` (1,) (``add_tensor``, not transferred), the actor, the critics and ``log_alpha`` each with
its own optimizer: ``net.actor_optim_spec`` / ``net.critic_optim_spec`` / ``algorithm.alpha_optim_spec``, each
falling back to ``net.optim_spec``. With SLM-Lab's ``agent.critic_net`` (a whole net spec) the critics are built
from it, with its ``optim_spec``, ``loss_spec``, ``lr_scheduler_spec`` and ``clip_grad_val``.

Twin critics as one ensemble (``stacked_critics``: plain ``MLPNet`` critics without ``clip_grad_val``, the
common case): the two critics' (and the two targets') weights are stacked per layer into one ``StackedMLP``
(``agents/nets/mlp.py``), so each critic forward, backward, Adam step and polyak update runs once for both, with
batched matmuls; the per-critic semantics (own weights, own targets, min or mean over the two) are unchanged.
``q1_net`` / ``q2_net`` and their targets stay in the nets, with their weights views of the stack: checkpoints,
``weights_sha256`` and ``agent.net.init_from`` transfer see the same two critics as before; the optimizer is
one ``critics`` Adam over the stack (elementwise, so the same steps as one per critic). Otherwise (other net
types, CrossQ's batch-renormalized critics, a critic ``clip_grad_val``) each critic is its own net with its own
optimizer ``q1_net`` / ``q2_net``.

train_df columns of its own (means over the update's gradient steps): ``q_loss`` (critic loss, both
critics), ``policy_loss``, ``alpha_loss``, ``alpha`` (temperature after the update) and ``td_error``
(mean |y - Q_1|).
"""

from __future__ import annotations

import contextlib
import copy
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator

import numpy as np
import torch
import torch.nn.functional as F

from agents import policy
from agents.algorithms.base import Algorithm, AlgorithmSpec, LossStats, ReplayCadence
from agents.algorithms.dqn import sample_batch
from agents.memory import PrioritizedReplay, Replay, make_replay
from agents.nets import POLICY_GAIN, NetSpec, StackedMLP, make_loss, polyak_update, stackable, target_updates_due
from agents.nets.spec import OPTIM_PERTURBABLE
from envs.clock import Clock

LOG_ALPHA_MIN, LOG_ALPHA_MAX = -5.0, 2.0


def step_mean(values: list[torch.Tensor]) -> torch.Tensor | float:
    """Mean of one update's per-step scalar tensors, a scalar tensor (the value itself for one step); NaN if none."""
    if not values:
        return math.nan
    return values[0] if len(values) == 1 else torch.stack(values).mean()


@contextlib.contextmanager
def frozen(params: list[torch.nn.Parameter]) -> Iterator[None]:
    """Inside the block, ``params`` take no gradient (``requires_grad`` False), then take it again, also on an
    error: a loss that reads the critics for the actor keeps no gradient for their weights."""
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


@dataclass(frozen=True)
class SoftActorCriticSpec(AlgorithmSpec):
    """SAC keys (SLM-Lab names).

    Fields:
        action_pdtype: ``Normal`` for Box, ``Categorical`` for Discrete, or ``default``; ``GumbelSoftmax``,
            SLM-Lab's name in its discrete SAC specs, is read as ``Categorical``: SLM-Lab v5.3's discrete SAC takes
            exact expectations over actions, so only sampling uses the distribution, and the argmax of a
            Gumbel-perturbed logit vector is an exact categorical sample, the Gumbel-max trick.
        training_iter: gradient steps per training round; None: ``num_envs``, SLM-Lab's default, one gradient step
            per frame at ``training_frequency`` 1.
        training_frequency: frames per round, at most one round per vector step (``ReplayCadence``).
        training_start_step: frames of random actions, and replay transitions needed before training.
        target_entropy: nats; None: -A for Box, 0.6 ln A for Discrete.
        alpha_optim_spec: optimizer of ``log_alpha``; None: ``net.optim_spec``.
        policy_delay: actor and temperature step once per this many critic steps, on the critic step count
            ``opt_step``, so a resume keeps the phase (TD3's delayed policy updates, Fujimoto et al. 2018, as
            SLM-Lab's CrossQ specs use); 1: every step.
        log_alpha_min / log_alpha_max: the clamp of ``log_alpha`` after each temperature step (SLM-Lab v5.3's
            -5 and 2).
        alpha_lr: SLM-Lab's learning rate of the temperature optimizer, replacing the ``lr`` of
            ``alpha_optim_spec`` / ``net.optim_spec``; None: theirs.
    """

    action_pdtype: str = field(default="default",
                               metadata={"choices": ("default", "Normal", "Categorical", "GumbelSoftmax")})
    training_iter: int | None = field(default=None, metadata={"gt": 0, "perturbable": True})
    training_frequency: int = field(default=1, metadata={"gt": 0})
    training_start_step: int = field(default=1000, metadata={"gt": 0})
    target_entropy: float | None = field(default=None, metadata={"origin": "lab", "perturbable": True})
    alpha_optim_spec: dict | None = field(default=None, metadata={"origin": "lab", "perturbable": OPTIM_PERTURBABLE})
    policy_delay: int = field(default=1, metadata={"gt": 0})
    log_alpha_min: float = field(default=LOG_ALPHA_MIN, metadata={"origin": "lab"})
    log_alpha_max: float = field(default=LOG_ALPHA_MAX, metadata={"origin": "lab"})
    alpha_lr: float | None = field(default=None, metadata={"gt": 0, "le": 10, "perturbable": True})


class SoftActorCritic(ReplayCadence, Algorithm):
    """Soft actor-critic with twin critics and automatic temperature; see module docstring."""

    spec_cls = SoftActorCriticSpec
    memory_names = ("Replay", "PrioritizedReplay")
    optim_keys = ("net.optim_spec", "net.actor_optim_spec", "net.critic_optim_spec", "algorithm.alpha_optim_spec",
                  "critic_net.optim_spec")
    metric_names = ("q_loss", "policy_loss", "alpha_loss", "alpha", "td_error")
    reads_critic_net = True
    stack_critics: ClassVar[bool] = True  # twin MLP critics as one StackedMLP when they allow it (stacked_critics)

    def init_nets(self) -> None:
        """Actor (B, *O) -> (B, 2A) or (B, A) logits; critics Q(s, a) -> (B, 1) (Box) or Q(s) -> (B, A)
        (Discrete) with frozen target copies; ``log_alpha`` = 0; the actor's, the critics' (one ``critics``
        optimizer over the ``StackedMLP`` when ``stacked_critics``, else ``q1_net`` and ``q2_net``) and the
        temperature's optimizers.

        Raises:
            ValueError: an action space other than Discrete and 1-D Box.
        """
        ns, cs = self.net_spec, self.critic_spec
        self.nets["net"] = self.make_net(policy.pdparam_dim(self.action_space), [POLICY_GAIN])
        act_dim = 0 if self.discrete else self.action_space.shape[0]
        q_out = int(self.action_space.n) if self.discrete else 1
        for k in ("q1_net", "q2_net"):
            self.nets[k] = self.make_net(q_out, extra_in_dim=act_dim, net_spec=cs)
            self.nets[f"target_{k}"] = copy.deepcopy(self.nets[k]).requires_grad_(False)
        log_alpha = self.add_tensor("log_alpha", torch.zeros(1), transfer=False)
        self.add_optim("net", self.nets["net"].parameters(), ns.actor_optim_spec or ns.optim_spec)
        self.critics = self.target_critics = None
        if self.stacked_critics():
            self.critics = StackedMLP([self.nets["q1_net"], self.nets["q2_net"]])
            self.target_critics = StackedMLP([self.nets["target_q1_net"], self.nets["target_q2_net"]])
            self.target_critics.requires_grad_(False)
            self.add_optim("critics", self.critics.parameters(), self.critic_optim_spec, cs)
        else:
            for k in ("q1_net", "q2_net"):
                self.add_optim(k, self.nets[k].parameters(), self.critic_optim_spec, cs)
        alpha_optim = dict(self.algo_spec.alpha_optim_spec or ns.optim_spec)
        if self.algo_spec.alpha_lr is not None:
            alpha_optim["lr"] = self.algo_spec.alpha_lr
        self.add_optim("log_alpha", [log_alpha], alpha_optim)
        if self.algo_spec.target_entropy is not None:
            self.target_entropy = float(self.algo_spec.target_entropy)
        else:
            self.target_entropy = 0.6 * math.log(self.action_space.n) if self.discrete else -float(act_dim)
        self.loss_fn = make_loss({**cs.loss_spec, "reduction": "none"})
        self.last_train_frame = 0
        self.last_target_frame = 0

    def stacked_critics(self) -> bool:
        """True when the twin critics are evaluated as one ``StackedMLP`` (weights stacked per layer, one batched
        matmul for both; ``q1_net`` / ``q2_net`` and their targets stay per-critic nets whose weights are views of
        the stack, so checkpoints, ``weights_sha256`` and transfer see two critics): with ``stack_critics``, both
        critics ``stackable`` (plain single-head ``MLPNet``s) and no ``clip_grad_val`` on them (their one
        optimizer would clip both critics' joint norm, not each critic's as SLM-Lab does)."""
        return (self.stack_critics and all(stackable(self.nets[k]) for k in ("q1_net", "q2_net"))
                and self.critic_spec.clip_grad_val is None)

    @property
    def critic_optims(self) -> tuple[str, ...]:
        """Names of the critics' optimizers: ``("critics",)`` when stacked, else ``("q1_net", "q2_net")``."""
        return ("critics",) if self.critics is not None else ("q1_net", "q2_net")

    def critic_params(self) -> list[torch.nn.Parameter]:
        """The critics' trained parameters (the stack's when stacked)."""
        return [p for k in self.critic_optims for g in self.optims[k].param_groups for p in g["params"]]

    @property
    def critic_spec(self) -> NetSpec:
        """The critics' net spec: ``agent.critic_net`` (SLM-Lab's separate critic spec) or ``agent.net``."""
        return self.spec.critic_net or self.net_spec

    @property
    def critic_optim_spec(self) -> dict[str, Any]:
        """Each critic's optimizer: ``critic_net.optim_spec`` with ``agent.critic_net``, else
        ``net.critic_optim_spec`` falling back to ``net.optim_spec``."""
        if self.spec.critic_net is not None:
            return self.spec.critic_net.optim_spec
        return self.net_spec.critic_optim_spec or self.net_spec.optim_spec

    def init_memory(self) -> Replay:
        """A ``Replay`` or ``PrioritizedReplay`` of ``memory.max_size`` transitions (Box actions float32)."""
        act_shape, act_dtype = ((), np.int64) if self.discrete else (self.action_space.shape, np.float32)
        return make_replay(self.spec.memory, self.obs_space, act_shape, act_dtype, num_envs=self.num_envs)

    @property
    def training_iter(self) -> int:
        """Gradient steps per training round: ``algorithm.training_iter``, or ``num_envs`` when unset."""
        return self.algo_spec.training_iter or self.num_envs

    @property
    def alpha(self) -> torch.Tensor:
        """Temperature ``exp(log_alpha)``, (1,), detached."""
        return self.nets["log_alpha"].value.detach().exp()

    @torch.no_grad()
    def act(self, obs_NO: np.ndarray, clock: Clock, deterministic: bool = False) -> np.ndarray:
        """Actions (N,) int or (N, A) in [-1, 1]: uniform from ``self.rng`` while ``clock.frame <
        training_start_step`` (not when ``deterministic``), else sampled from the policy (its mode when
        ``deterministic``)."""
        n = len(obs_NO)
        if not deterministic and clock.frame < self.algo_spec.training_start_step:
            if self.discrete:
                return self.rng.integers(0, self.action_space.n, size=n)
            return self.rng.uniform(-1.0, 1.0, size=(n, *self.action_space.shape)).astype(np.float32)
        pdparam = self.nets["net"](self.obs_tensor(obs_NO))
        if self.discrete:
            return policy.sample(pdparam, True, self.gen, deterministic).cpu().numpy()
        # tanh of the Gaussian sample: tanh_gaussian_sample's action from the same draw, without its log-prob
        return torch.tanh(policy.sample(pdparam, False, self.gen, deterministic)).cpu().numpy()

    def env_action(self, act: np.ndarray) -> np.ndarray:
        """Box actions (N, A) in [-1, 1] rescaled to ``[low, high]`` (SLM-Lab's ``RescaleAction``); discrete
        unchanged."""
        if self.discrete:
            return act
        low, high = self.action_space.low, self.action_space.high
        return low + (np.clip(act, -1.0, 1.0) + 1.0) * 0.5 * (high - low)

    def q_values(self, k: str, obs: torch.Tensor, act: torch.Tensor | None = None) -> torch.Tensor:
        """Critic ``k``: Q(s, a) (B,) for Box actions (B, A); all Q(s, .) (B, A) for Discrete."""
        return self.nets[k](obs) if self.discrete else self.nets[k](obs, act).squeeze(-1)

    def twin_q(self, obs: torch.Tensor, act: torch.Tensor | None = None, target: bool = False) -> torch.Tensor:
        """Both critics (or, ``target``, both target critics) stacked: Q_k(s, a) (2, B) for Box actions (B, A),
        Q_k(s, .) (2, B, A) for Discrete; one ``StackedMLP`` forward when ``stacked_critics``."""
        stack = self.target_critics if target else self.critics
        if stack is not None:
            return stack(obs) if self.discrete else stack(obs, act).squeeze(-1)
        names = ("target_q1_net", "target_q2_net") if target else ("q1_net", "q2_net")
        return torch.stack([self.q_values(k, obs, act) for k in names])

    @torch.no_grad()
    def next_action(self, next_obs: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """a' ~ pi(.|s') (B, A) and log pi(a'|s') (B,) for Box; (None, log pi(.|s') (B, A)) for Discrete."""
        pdparam = self.nets["net"](next_obs)
        if self.discrete:
            return None, F.log_softmax(pdparam, dim=-1)
        return policy.tanh_gaussian_sample(pdparam, self.gen)

    def soft_value(self, q1_next: torch.Tensor, q2_next: torch.Tensor, next_logp: torch.Tensor,
                   alpha: torch.Tensor) -> torch.Tensor:
        """V'(s') (B,): ``min(q1, q2) - alpha * logp`` from (B,) values, or, Discrete, ``sum_a pi (mean(q1, q2) -
        alpha log pi)`` from (B, A) values and log-probs."""
        if self.discrete:
            return (next_logp.exp() * (0.5 * (q1_next + q2_next) - alpha * next_logp)).sum(-1)
        return torch.min(q1_next, q2_next) - alpha * next_logp

    @torch.no_grad()
    def soft_target(self, batch: dict[str, torch.Tensor], alpha: torch.Tensor) -> torch.Tensor:
        """``y = r + gamma * (1 - terminated) * V'(s')``, (B,), from the target critics; see module docstring."""
        next_obs = batch["next_obs"]
        next_act, next_logp = self.next_action(next_obs)
        q_next = self.twin_q(next_obs, next_act, target=True)
        return batch["reward"] + self.algo_spec.gamma * (1.0 - batch["terminated"]) * self.soft_value(
            q_next[0], q_next[1], next_logp, alpha)

    def critic_preds(self, batch: dict[str, torch.Tensor],
                     alpha: torch.Tensor) -> tuple[torch.Tensor, Any, torch.Tensor]:
        """Q_k(s, a) of both critics (2, B) with grad, their detached Q_k(s, .) (2, B, A) for Discrete (else
        None), and the target y (B,)."""
        y = self.soft_target(batch, alpha)
        obs, act = batch["obs"], batch["act"]
        if not self.discrete:
            return self.twin_q(obs, act), None, y
        q_all = self.twin_q(obs)
        return q_all.gather(-1, act.expand(2, -1).unsqueeze(-1)).squeeze(-1), q_all.detach(), y

    def actor_losses(self, obs: torch.Tensor, alpha: torch.Tensor,
                     q_all: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Policy loss and temperature loss (scalars) on observations (B, *O); ``q_all`` are the two critics'
        (B, A) Q-values of the discrete case (detached; (2, B, A) or a pair), None for Box."""
        pdparam = self.nets["net"](obs)
        exp_log_alpha = self.nets["log_alpha"].value.exp()
        if self.discrete:
            logp = F.log_softmax(pdparam, dim=-1)
            prob = logp.exp()
            policy_loss = (prob * (alpha * logp - 0.5 * (q_all[0] + q_all[1]))).sum(-1).mean()
            entropy = -(prob * logp).sum(-1).mean().detach()
            return policy_loss, -(exp_log_alpha * (self.target_entropy - entropy)).sum()
        act, logp = policy.tanh_gaussian_sample(pdparam, self.gen)
        with frozen(self.critic_params()):  # gradients reach the actor through the critics' inputs, not their weights
            q = self.twin_q(obs, act).min(dim=0).values
        policy_loss = (alpha * logp - q).mean()
        return policy_loss, -(exp_log_alpha * (logp.detach() + self.target_entropy)).mean()

    def critic_loss(self, batch: dict[str, torch.Tensor], alpha: torch.Tensor,
                    metrics: dict[str, list[Any]]) -> tuple[torch.Tensor, Any]:
        """Summed critic loss ``L(Q_1, y) + L(Q_2, y)`` (scalar mean over the batch; PER: weighted per sample) and
        ``critic_preds``' discrete Q(s, .); updates PER priorities from |y - min_k Q_k(s, a)|."""
        q, q_all, y = self.critic_preds(batch, alpha)
        elem = self.loss_fn(q, y.expand_as(q)).sum(dim=0)
        loss = (batch["weight"] * elem).mean() if "weight" in batch else elem.mean()
        if isinstance(self.memory, PrioritizedReplay):
            self.memory.update_priorities(batch["idx"], (y - q.detach().min(dim=0).values).cpu().numpy())
        metrics["td_error"].append((y - q[0].detach()).abs().mean())
        return loss, q_all

    def update(self, clock: Clock) -> LossStats:
        """One training round (``ReplayCadence``): ``training_iter`` gradient steps (critics, targets, then actor and
        temperature; ``num_envs`` steps when ``training_iter`` is unset). The returned stats are scalar tensors
        (means over the steps), read only when a log row takes them."""
        self.last_train_frame = clock.frame
        metrics: dict[str, list[Any]] = {name: [] for name in self.metric_names}
        losses, grad_norms = [], []
        critic_optims, log_alpha = self.critic_optims, self.nets["log_alpha"].value
        for _ in range(self.training_iter):
            batch = sample_batch(self, clock)
            alpha = self.alpha
            q_loss, q_all = self.critic_loss(batch, alpha, metrics)
            grad_norms.append(self.optim_step_tensor(q_loss, critic_optims, clock))
            # the targets move now, not after the actor's step: nothing below reads them (the same values bit for
            # bit), and the critics' weights are still in the cache (2-3% of a step)
            self.polyak_targets()
            metrics["q_loss"].append(q_loss.detach())
            loss = q_loss.detach()
            if clock.opt_step % self.algo_spec.policy_delay == 0:  # delayed policy updates (policy_delay critic steps)
                policy_loss, alpha_loss = self.actor_losses(batch["obs"], alpha, q_all)
                # one backward for both: the policy loss reads alpha detached and the temperature loss log pi
                # detached, so each loss's gradients are those of its own backward
                self.optim_step_tensor(policy_loss + alpha_loss, ("net", "log_alpha"), clock, count=False, norm=False)
                with torch.no_grad():
                    log_alpha.clamp_(self.algo_spec.log_alpha_min, self.algo_spec.log_alpha_max)
                loss = loss + (policy_loss + alpha_loss).detach()
                metrics["policy_loss"].append(policy_loss.detach())
                metrics["alpha_loss"].append(alpha_loss.detach())
            losses.append(loss)
            metrics["alpha"].append(self.alpha.squeeze())
        self.replace_targets(clock)
        return LossStats(step_mean(losses), math.nan, step_mean(grad_norms),
                         {k: step_mean(v) for k, v in metrics.items()})

    def polyak_targets(self) -> None:
        """With ``update_type: polyak``: ``Q'_k <- polyak_coef * Q_k + (1 - polyak_coef) * Q'_k`` (per step)."""
        if self.net_spec.update_type == "polyak":
            self.lerp_targets(self.net_spec.polyak_coef)

    def lerp_targets(self, coef: float) -> None:
        """In place: every target critic parameter ``<- coef * online + (1 - coef) * target`` (1: copy), over the
        stacks when ``stacked_critics`` (one lerp per stacked tensor), else per critic (``polyak_update``)."""
        if self.critics is not None:
            polyak_update(self.critics, self.target_critics, coef)
            return
        for k in ("q1_net", "q2_net"):
            polyak_update(self.nets[k], self.nets[f"target_{k}"], coef)

    def replace_targets(self, clock: Clock) -> None:
        """With ``update_type: replace``: copy the critics once any multiple of ``net.update_frequency``
        frames was crossed since the last copy."""
        due = target_updates_due(clock.frame, self.last_target_frame, self.net_spec.update_frequency)
        if self.net_spec.update_type == "replace" and due > 0:
            self.last_target_frame = clock.frame
            self.lerp_targets(1.0)

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """``Algorithm.load_state_dict``; with ``stacked_critics``, a state that holds the two critic optimizers
        ``q1_net`` / ``q2_net`` (written before the critics were stacked) loads too, each Adam state tensor being
        the two critics' stacked as the stack's parameters are (``stacked_optim_state``)."""
        if self.critics is not None and "critics" not in state["optims"] and \
                {"q1_net", "q2_net"} <= set(state["optims"]):
            optims = {k: v for k, v in state["optims"].items() if k not in ("q1_net", "q2_net")}
            optims["critics"] = self.stacked_optim_state(state["optims"]["q1_net"], state["optims"]["q2_net"])
            scheds = {k: v for k, v in state["lr_scheds"].items() if k != "q2_net"}
            scheds["critics"] = scheds.pop("q1_net")
            state = {**state, "optims": optims, "lr_scheds": scheds}
        return super().load_state_dict(state)

    def stacked_optim_state(self, q1_state: dict[str, Any], q2_state: dict[str, Any]) -> dict[str, Any]:
        """The ``critics`` optimizer state of two per-critic optimizer states (torch ``state_dict`` form, one param
        group over ``q1_net`` / ``q2_net``'s parameters): per-parameter tensors stacked (step counts from q1's)."""
        names = [n for n, _ in self.nets["q1_net"].named_parameters()]  # the per-critic optimizers' param order
        per_critic = [{names[int(i)]: st for i, st in sd["state"].items()} for sd in (q1_state, q2_state)]
        stacked: dict[int, dict[str, torch.Tensor]] = {}
        for j, (name, param) in enumerate(zip(self.critics.member_names, self.critics.parameters())):
            if name in per_critic[0]:  # else not stepped yet
                stacked[j] = {key: value if value.dim() == 0 else  # Adam's step count, the same for both critics
                              torch.stack([c[name][key] for c in per_critic]).reshape(param.shape)
                              for key, value in per_critic[0][name].items()}
        group = {**q1_state["param_groups"][0], "params": list(range(len(self.critics.member_names)))}
        return {"state": stacked, "param_groups": [group]}

    def extra_state(self) -> dict[str, Any]:
        """Frames of the last update and of the last target copy."""
        return {"last_train_frame": self.last_train_frame, "last_target_frame": self.last_target_frame}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Restore ``extra_state``."""
        self.last_train_frame = int(state["last_train_frame"])
        self.last_target_frame = int(state["last_target_frame"])
