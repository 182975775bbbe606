"""SLM-Lab's ``meta.distributed`` on Ray: the sessions of a trial train one global set of nets (A3C, DPPO, async SAC).

One ``GlobalParamsActor`` per trial holds the global nets (every net whose parameters an optimizer steps; target nets
and buffers stay per session) and the global optimizers with their state. Each session actor sets
``Algorithm.grad_exchange`` to a ``GlobalExchange``: after each local backward (and gradient clipping) the session
sends its gradients and current learning rates; the global actor steps the global optimizers on them and returns the
fresh parameters, which the session loads before it acts again. That is SLM-Lab's push-then-sync cadence of
``"synced"`` (reference: SLM-Lab ``slm_lab/agent/net/net_util.py`` ``init_global_nets`` / ``push_global_grads`` and
``net/base.py`` ``train_step``; A3C: Mnih et al. 2016, "Asynchronous Methods for Deep Reinforcement Learning").

Where this differs from SLM-Lab, on purpose:

* ``"shared"`` (Hogwild: SLM-Lab's sessions act on the very tensors in shared memory, so they see the others'
  updates between their own) behaves as ``"synced"`` here: Ray actors share no memory, so a session sees the
  others' updates at its own next push (and at start and every checkpoint).
* The global actor always owns the optimizer, whatever its name: ``GlobalAdam`` / ``GlobalRMSprop`` are Adam /
  RMSprop (``agents.nets.OPTIMIZERS``), and an ordinary optimizer (the ``AdamW`` of SLM-Lab's experimental A3C
  specs) is global too (SLM-Lab steps a non-``Global`` optimizer locally and then overwrites the result by the
  global weights, which nothing steps).
* Every session starts from the global weights (the nets of the trial's session 0, ``agent.net.init_from``
  applied), and loads the global weights again at each of its checkpoints, so a session's checkpoint holds the
  weights of the global checkpoint written at the same moment.
* Learning rates follow each session's own frame-driven schedule (sent with its gradients), not one shared
  scheduler stepped by whichever session trains.

Checkpoints: the global actor commits ``{predir}/t{T}/global/ckpt/{step:012d}/`` (``orchestrator.store.checkpoint``,
atomic; ``step`` = global optimizer steps) whenever a session commits one, and ``train@`` restores its newest valid
one. Sessions and the global state are checkpointed at different moments, so a resumed distributed trial is not
exact: each session's manifest says ``exact: false`` with ``EXACT_REASON``.
"""

from __future__ import annotations

import io
import signal
from typing import TYPE_CHECKING, Any

import ray

from orchestrator.spec.meta import MetaSpec
from orchestrator.store import storage
from orchestrator.store.checkpoint import CheckpointStore

if TYPE_CHECKING:
    import torch  # annotations only: the driver imports this module and must not load torch

EXACT_REASON = ("meta.distributed: the sessions train one global net asynchronously; the order of their "
                "gradient pushes depends on timing, and sessions and the global state are checkpointed apart")


def distributed(spec: dict[str, Any]) -> bool:
    """True when ``meta.distributed`` is ``"synced"`` or ``"shared"``."""
    return MetaSpec.of(spec).distributed in ("synced", "shared")


def global_dir(predir: str, trial: int) -> str:
    """``{predir}/t{T}/global``: where the global actor of trial T checkpoints."""
    return storage.join(predir, f"t{trial}", "global")


def optim_params(algorithm: Any, optim_names: tuple[str, ...]) -> list[torch.nn.Parameter]:
    """The parameters of optimizers ``optim_names`` of an ``Algorithm``, in param-group order (the order
    ``Algorithm.optim_step`` hands gradients to its ``grad_exchange``)."""
    return [p for n in optim_names for g in algorithm.optims[n].param_groups for p in g["params"]]


def global_net_names(algorithm: Any) -> list[str]:
    """Names of the nets that are global: every parameter of them is (the storage of) a tensor stepped by one of
    the optimizers (a net whose weights are views of a stepped stack, e.g. SAC's stacked critics, counts)."""
    stepped = {p.untyped_storage().data_ptr() for p in optim_params(algorithm, tuple(algorithm.optims))}
    return [name for name, net in algorithm.nets.items()
            if any(True for _ in net.parameters())
            and all(p.untyped_storage().data_ptr() in stepped for p in net.parameters())]


class GlobalParams:
    """The Ray-free core of ``GlobalParamsActor``: the global nets and optimizers of one trial.

    Args:
        spec: checked flat spec of the trial.
        predir: run directory URI; trial: index T.
        seed: seed of the global nets' initialization (the trial's session 0 seed).
        resume: restore the newest valid global checkpoint when there is one.
    """

    def __init__(self, spec: dict[str, Any], predir: str, trial: int, seed: int, resume: bool) -> None:
        from orchestrator.session.loop import Session  # heavy torch: imported inside the worker

        holder = Session(spec, seed, trial, 0, fresh=True)  # the algorithm as a session builds it
        holder.close()
        self.algorithm = holder.algorithm
        self.algorithm.memory = None  # the global actor never acts or samples
        self.net_names = global_net_names(self.algorithm)
        self.params = optim_params(self.algorithm, tuple(self.algorithm.optims))
        self.step = 0  # global optimizer steps (one per push)
        self.pushes: dict[str, int] = {}  # session key -> pushes
        self.store = CheckpointStore(global_dir(predir, trial), keep=MetaSpec.of(spec).keep_checkpoints)
        self.committed: int | None = None
        if resume:
            self.restore()

    def push(self, key: str, optim_names: tuple[str, ...], lrs: list[float],
             grads: list[torch.Tensor | None]) -> list[torch.Tensor]:
        """One global step of optimizers ``optim_names`` on one session's gradients.

        Args:
            key: the pushing session (``t{T}_s{S}``), counted in ``pushes``.
            optim_names / lrs / grads: see ``agents.algorithms.base.GradExchange``.

        Returns:
            The new parameter values of those optimizers (CPU tensors, param-group order).

        Raises:
            ValueError: ``grads`` does not match the optimizers' parameters (count or shapes).
        """
        from agents import torch_optim  # here: the driver imports this module and must not load torch

        params = optim_params(self.algorithm, optim_names)
        if len(grads) != len(params):
            raise ValueError(f"push from {key}: {len(grads)} gradients for {len(params)} parameters of {optim_names}")
        for p, g in zip(params, grads):
            if g is not None and g.shape != p.shape:
                raise ValueError(f"push from {key}: gradient of shape {tuple(g.shape)} for a parameter of shape "
                                 f"{tuple(p.shape)}")
            p.grad = None if g is None else g.to(p.device)
        for name, lr in zip(optim_names, lrs):
            optim = self.algorithm.optims[name]
            for group in optim.param_groups:
                group["lr"] = lr
            torch_optim.step(optim)
        self.step += 1
        self.pushes[key] = self.pushes.get(key, 0) + 1
        return [p.detach().cpu().clone() for p in params]

    def pull(self) -> list[torch.Tensor]:
        """Every global parameter (all optimizers, in ``Algorithm.optims`` order), CPU copies."""
        return [p.detach().cpu().clone() for p in self.params]

    def weights_sha256(self) -> dict[str, str]:
        """``Algorithm.weights_sha256`` of the global nets (comparable to a session manifest's entries)."""
        return {k: v for k, v in self.algorithm.weights_sha256().items() if k in self.net_names}

    def state(self) -> dict[str, Any]:
        """``pushes``, ``step`` and ``weights_sha256``: what the global checkpoint's manifest records."""
        return {"step": self.step, "pushes": dict(self.pushes), "weights_sha256": self.weights_sha256()}

    def checkpoint(self) -> tuple[int, list[torch.Tensor], dict[str, str]]:
        """Commit the global state as checkpoint ``step`` (unless already committed) and return it.

        Returns:
            (step, ``pull()``, ``weights_sha256()``): a session loads these values so its checkpoint holds the
            weights of this global checkpoint.

        Raises:
            orchestrator.store.checkpoint.CheckpointError / storage.StorageError: the write failed.
        """
        if self.committed != self.step:
            import torch

            buf = io.BytesIO()
            torch.save({"nets": {k: self.algorithm.nets[k].state_dict() for k in self.net_names},
                        "optims": {k: v.state_dict() for k, v in self.algorithm.optims.items()},
                        "step": self.step, "pushes": dict(self.pushes)}, buf)
            self.store.commit(self.step, {"global.pt": buf.getvalue()}, {**self.state(), "exact": False,
                                                                          "exact_reason": EXACT_REASON})
            self.store.prune()
            self.committed = self.step
        return self.step, self.pull(), self.weights_sha256()

    def restore(self) -> None:
        """Load the newest valid global checkpoint (none: keep the fresh nets, as before the first push).

        Raises:
            orchestrator.store.checkpoint.CheckpointError: checkpoints exist but none verifies.
        """
        self.store.collect_garbage()
        selection = self.store.select_latest()
        if selection.manifest is None:
            if selection.rejected or selection.earlier_corrupt:
                from orchestrator.store.checkpoint import CheckpointError
                raise CheckpointError(f"global state: {selection.describe()}")
            return
        import torch

        state = torch.load(io.BytesIO(selection.files["global.pt"]), weights_only=True, map_location="cpu")
        for name in self.net_names:
            self.algorithm.nets[name].load_state_dict(state["nets"][name])
        for name, optim in self.algorithm.optims.items():
            optim.load_state_dict(state["optims"][name])
        self.step, self.pushes = int(state["step"]), {k: int(v) for k, v in state["pushes"].items()}
        self.committed = self.step


@ray.remote(max_restarts=0)
class GlobalParamsActor:
    """Ray actor around ``GlobalParams`` (same arguments); its methods run one at a time, so pushes are atomic."""

    def __init__(self, spec: dict[str, Any], predir: str, trial: int, seed: int, resume: bool) -> None:
        # The sessions' final checkpoints after a SIGTERM/SIGINT still need it; the Trial ends it (ray.kill).
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        import torch

        torch.set_num_threads(1)
        self.core = GlobalParams(spec, predir, trial, seed, resume)

    def push(self, key: str, optim_names: tuple[str, ...], lrs: list[float],
             grads: list[torch.Tensor | None]) -> list[torch.Tensor]:
        """See ``GlobalParams.push``."""
        return self.core.push(key, optim_names, lrs, grads)

    def pull(self) -> list[torch.Tensor]:
        """See ``GlobalParams.pull``."""
        return self.core.pull()

    def checkpoint(self) -> tuple[int, list[torch.Tensor], dict[str, str]]:
        """See ``GlobalParams.checkpoint``."""
        return self.core.checkpoint()

    def state(self) -> dict[str, Any]:
        """See ``GlobalParams.state``."""
        return self.core.state()


class GlobalExchange:
    """A session's ``Algorithm.grad_exchange`` (``agents.algorithms.base.GradExchange``) over a global actor.

    Args:
        handle: a ``GlobalParamsActor`` handle, or a ``GlobalParams`` (in-process, tests).
        key: the session's ``t{T}_s{S}``.
        algorithm: the session's ``Algorithm`` (``load`` writes its parameters).
    """

    exact_reason = EXACT_REASON  # what a session's manifests say: never exact

    def __init__(self, handle: Any, key: str, algorithm: Any) -> None:
        self.handle, self.key, self.algorithm = handle, key, algorithm

    def _call(self, method: str, *args: Any) -> Any:
        fn = getattr(self.handle, method)
        return ray.get(fn.remote(*args)) if hasattr(fn, "remote") else fn(*args)

    def __call__(self, optim_names: tuple[str, ...], lrs: list[float],
                 grads: list[torch.Tensor | None]) -> list[torch.Tensor]:
        """Push the gradients (as CPU tensors), return the new global values."""
        cpu = [None if g is None else g.detach().cpu() for g in grads]
        return self._call("push", self.key, tuple(optim_names), [float(lr) for lr in lrs], cpu)

    def load(self, values: list[torch.Tensor]) -> None:
        """Copy global values (``GlobalParams.pull`` order) into the session's parameters."""
        import torch

        params = optim_params(self.algorithm, tuple(self.algorithm.optims))
        with torch.no_grad():
            for p, v in zip(params, values, strict=True):
                p.copy_(v)

    def sync(self) -> None:
        """Load the current global weights (at session start)."""
        self.load(self._call("pull"))

    def checkpoint(self) -> tuple[int, dict[str, str]]:
        """Have the global state checkpointed and load its weights; returns (global step, its weights_sha256)."""
        step, values, sha = self._call("checkpoint")
        self.load(values)
        return step, sha
