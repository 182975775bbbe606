"""The Ray actor that owns one ``Session`` (through ``orchestrator.session.runner.SessionRunner``): runs it in
checkpoint-sized frame chunks, commits a checkpoint after each chunk, streams progress events to the driver, and on
SIGTERM commits a final checkpoint and reports ``interrupted``.

Events (yielded by ``run``): the records of ``orchestrator.session.events`` (``Started``, ``Log``, ``Checkpoint``,
``CheckpointFailed``, ``Done``, ``Interrupted``, ``StorageFault``, ``StorageRetry``, ``Batch``). An actor may host
a seed group instead (``meta.session_batch``: ``run(group=...)``, ``orchestrator.session.group_runner``): its
sessions' events come tagged with their session index (``Grouped``).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import signal
import socket
import sys
from typing import Any, Iterator

import ray

from orchestrator.global_params import GlobalExchange
from orchestrator.runtime.console import install_warning_format
from orchestrator.session import events as ev
from orchestrator.session.group_runner import GroupRunner, group_batches
from orchestrator.session.runner import SessionRunner, checkpoint_batches


def skip_ray_pydantic_serializers() -> None:
    """Keep pydantic out of this process's Ray serializer (8-11 MB of a session actor's RSS).

    The first time a Ray worker deserializes anything, Ray builds its serialization context, which imports
    pydantic when it is installed (``ray._common.pydantic_compat``, from ``ray.util.serialization_addons``) to
    register serializers for pydantic models; the lab installs pydantic for torcharc, and no session passes a
    pydantic object through Ray. Importing that module once with pydantic hidden (``tracking.without_modules``)
    makes it record "not installed", so the context registers nothing; pydantic itself still imports as usual
    afterwards (torcharc's TorchArcNet). Only a process that never imports Ray Tune or Ray Train may do this
    (both build pydantic models from that module at import): a session actor, called first thing in its
    ``__init__``, which Ray runs before any deserialization because the actor is built with no arguments. A
    no-op where Ray already built its context or imported the module. docs/BENCHMARKS.md "Process memory".
    """
    if "ray._common.pydantic_compat" in sys.modules:
        return
    from orchestrator.report.tracking import without_modules

    with without_modules(("pydantic",)):
        import ray._common.pydantic_compat  # noqa: F401


@ray.remote(max_restarts=0, max_concurrency=2)
class SessionActor:
    """Ray actor wrapper of ``SessionRunner``; SIGTERM asks the session to stop and checkpoint (and ends an actor
    that hosts no session yet).

    Two concurrent calls are allowed so ``stop`` reaches the session while ``run`` streams.

    One actor hosts one session at a time. Once a session is ``done``, the same actor (its process, with torch
    and the lab imported) may host another: ``run(session=...)`` builds a new ``SessionRunner`` from scratch
    (a search's next trial reuses its trial's actors: ``orchestrator.trial.SessionHosts``). Nothing of the
    previous session is kept: the runner, its session, envs, nets and trackers are dropped and collected
    first, and a ``Session`` seeds every global RNG it uses (``orchestrator.session.seed_globals``), so a
    session's results do not depend on which process hosts it.

    An actor is built empty, with no arguments, and gets its session from ``run(session=...)`` (a search trial
    starts its session actors before it has checked its spec, so their processes start while it does, and checks
    the spec in one of them: ``check_spec``; the trial's own process imports no torch). Building it with no
    arguments lets ``__init__`` run before Ray deserializes anything in this process: see
    ``skip_ray_pydantic_serializers``.
    """

    def __init__(self) -> None:
        skip_ray_pydantic_serializers()
        install_warning_format()  # one 'warning: ...' line, no ANSI codes, in the worker's log
        import torch  # noqa: F401  (imported while a search trial checks its spec: see above)

        from orchestrator.report import tracking

        tracking.LEAN_PROCESS["tensorboard"] = True  # this process writes TensorBoard files, never reads them
        self.runner: SessionRunner | GroupRunner | None = None
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def open(self, spec: dict[str, Any], predir: str, trial: int, session: int, seed: int, resume: bool,
             global_params: Any = None, num_threads: int = 1, reseed: dict[str, int] | None = None) -> None:
        """Build the runner of a session in this actor, after dropping (and collecting) the previous one.

        Args:
            spec, predir, trial, session, seed, resume, reseed: see ``SessionRunner``.
            global_params: with ``meta.distributed``, the trial's ``GlobalParamsActor`` handle: the session's
                ``GlobalExchange`` (``SessionRunner``'s ``exchange``).
            num_threads: torch intra-op threads (the actor's CPU share, at least 1).
        """
        import gc

        import torch

        torch.set_num_threads(max(1, num_threads))
        self.drop()
        gc.collect()
        exchange = None if global_params is None else functools.partial(GlobalExchange, global_params)
        self.runner = SessionRunner(spec, predir, trial, session, seed, resume, exchange, reseed=reseed)

    def open_group(self, spec: dict[str, Any], predir: str, trial: int, sessions: list[int], seeds: list[int],
                   resume: bool, passengers: list[int], num_threads: int = 1,
                   reseeds: dict[int, dict[str, int]] | None = None) -> None:
        """Build the ``GroupRunner`` of a seed group in this actor (arguments as its own; ``num_threads`` as
        ``open``'s), after dropping (and collecting) the previous runner."""
        import gc

        import torch

        torch.set_num_threads(max(1, num_threads))
        self.drop()
        gc.collect()
        self.runner = GroupRunner(spec, predir, trial, sessions, seeds, resume, passengers,
                                  reseeds={int(s): r for s, r in (reseeds or {}).items()})

    def drop(self) -> None:
        """Drop the hosted session, closing its envs when it was kept live (``keep_live``)."""
        runner, self.runner = self.runner, None
        if isinstance(runner, SessionRunner) and runner.keep_live:
            runner.session.close()

    def check_spec(self, spec: dict[str, Any]) -> dict[str, Any]:
        """``orchestrator.spec.check`` of a flat spec in this process (torch imported here already).

        Returns:
            The defaults-filled copy.

        Raises:
            SpecError: every problem found (``ray.get`` raises it as a ``RayTaskError`` that is also a ``SpecError``).
        """
        from orchestrator.spec.load import check

        return check(spec)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        """SIGTERM: a hosted session stops at its next step and commits a final checkpoint (``stop``); an actor
        with no session yet (an empty host, or one building its session: nothing of it is committed) ends as
        the signal's default action would."""
        if self.runner is None:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        self.stop()

    def pid(self) -> int:
        """Process id of the actor's worker (tests kill it with ``os.kill``)."""
        return os.getpid()

    def stop(self) -> None:
        """Ask the session (every session of a group) to stop after the current step and commit a final
        checkpoint."""
        if isinstance(self.runner, GroupRunner):
            self.runner.stop()
        elif self.runner is not None:
            self.runner.session.stop_requested = True

    def run(self, session: dict[str, Any] | None = None, extend: dict[str, Any] | None = None,
            keep_live: bool = False, group: dict[str, Any] | None = None) -> Iterator[ev.Event]:
        """Generator method: streams the session's events (see module docstring); the ``started``
        event also names the Ray node (``node_id``, hex) and ``hostname`` the actor runs on. The events of
        one checkpoint (its commit, the chunk's log rows) come as one ``batch`` event.

        Args:
            session: the keyword arguments of ``open`` (spec, predir, trial, session, seed, resume,
                global_params, num_threads, reseed) to host a new session in this actor first; None runs the
                session it already hosts.
            extend: ``{"spec": spec}``: continue the hosted live session instead (``SessionRunner.extend``).
            keep_live: a session ending ``done`` with its checkpoint committed stays open for ``run(extend=...)``.
            group: the keyword arguments of ``open_group``: host a seed group instead; its events come as
                ``Grouped`` events (``group_runner.group_batches``).
        """
        if group is not None:
            self.open_group(**group)
            yield from self.located(group_batches(self.runner))
            return
        if session is not None:
            self.open(**session)
        elif extend is not None:
            self.runner.extend(extend["spec"])
        self.runner.keep_live = keep_live
        yield from self.located(checkpoint_batches(self.runner))

    @staticmethod
    def located(events: Iterator[ev.Event]) -> Iterator[ev.Event]:
        """``events`` with each ``Started`` event (also inside ``Grouped``) naming the Ray node (``node_id``, hex)
        and ``hostname`` of this actor."""
        where = {"node_id": ray.get_runtime_context().get_node_id(), "hostname": socket.gethostname()}
        for event in events:
            if isinstance(event, ev.Started):
                event = dataclasses.replace(event, **where)
            elif isinstance(event, ev.Grouped):
                event = ev.Grouped([(s, dataclasses.replace(e, **where) if isinstance(e, ev.Started) else e)
                                    for s, e in event.events])
            yield event
