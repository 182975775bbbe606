"""Patch of torch's optimizer wrappers (private ``torch._disable_dynamo`` forms): optimizers in eager mode without
importing the compiler stack.

Checked on: torch 2.13.0 (``CHECKED_ON``). Fallback below. Measured gain: 73 MB RSS and 1-3 s of each session
process's start (docs/BENCHMARKS.md "Start-up and exit", "Process memory"), 2-6% of the 45 s CartPole ``train``
timed there. ``tests/test_architecture.py`` fails when a new torch changes the wrappers.

torch (2.x) wraps its ``Optimizer`` methods for ``torch.compile``: ``step`` with ``_use_grad_for_differentiable``,
which imports ``torch._dynamo`` and calls ``torch._dynamo.graph_break()`` on every step, and ``add_param_group``
(called by every optimizer's constructor), ``zero_grad``, ``state_dict`` and ``load_state_dict`` with
``torch._disable_dynamo``, which imports ``torch._dynamo`` on the first call. An eager process that never compiles
still pays that import: 73 MB of RSS and 1-3 s of a session process's start on this 2-core machine, before its
first frame (docs/BENCHMARKS.md "Start-up and exit" and "Process memory"). This module removes it without changing
an optimizer's arithmetic:

* ``defer_dynamo`` gives each ``torch._disable_dynamo`` method a disabled form (the attribute that wrapper caches)
  that calls the method directly while ``torch._dynamo`` is not loaded (nothing can be compiling then) and torch's
  own ``torch._dynamo.disable`` form once it is, so a process that later compiles gets torch's behaviour.
* ``step`` runs an optimizer's undecorated ``step`` under ``torch.no_grad`` (what the wrapper does for a
  non-differentiable optimizer), and ``optim.step()`` itself once ``torch._dynamo`` is loaded, or for a
  ``differentiable`` optimizer. Optimizer step hooks (``register_step_pre_hook`` and the like) are not run by the
  undecorated step; the lab registers none.

The same parameters, gradients and state give bit-identical results either way (``tests/agents/test_torch_optim.py``).
Where a future torch changes these wrappers, ``defer_dynamo`` leaves a method it does not recognize alone and
``step`` falls back to ``optim.step()``: the import comes back, nothing else changes
(``tests/orchestrator/test_lean_imports.py`` notices).
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from typing import Any

import torch

# the Optimizer methods torch wraps with torch._disable_dynamo (as of torch 2.13, the version pyproject pins)
DYNAMO_DISABLED_METHODS = ("add_param_group", "zero_grad", "state_dict", "load_state_dict")
_CACHE_ATTR = "__dynamo_disable"  # where torch._disable_dynamo's wrapper caches a method's disabled form


CHECKED_ON = "torch==2.13.0"


def applies() -> bool:
    """Whether the installed torch wraps ``Optimizer``'s methods as on ``CHECKED_ON``: each of
    ``DYNAMO_DISABLED_METHODS`` is a wrapper of its method, and ``Adam.step``'s outer wrapper is torch's
    ``_use_grad_for_differentiable``."""
    wrapped = all(getattr(getattr(torch.optim.Optimizer, name, None), "__wrapped__", None) is not None
                  for name in DYNAMO_DISABLED_METHODS)
    return wrapped and _undecorated_step(torch.optim.Adam) is not None


def _dynamo_loaded() -> bool:
    """True once ``torch._dynamo`` is imported (anything may compile from then on)."""
    return "torch._dynamo" in sys.modules


def _deferred(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as the disabled form ``torch._disable_dynamo`` calls: ``fn`` itself while ``torch._dynamo`` is not
    loaded, ``torch._dynamo.disable(fn)`` (built once, as torch does) after."""
    disabled: list[Callable[..., Any]] = []

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if disabled:
            return disabled[0](*args, **kwargs)
        if not _dynamo_loaded():
            return fn(*args, **kwargs)
        disabled.append(torch._dynamo.disable(fn, recursive=True, wrapping=False))
        return disabled[0](*args, **kwargs)

    return call


def defer_dynamo() -> None:
    """Make ``torch.optim.Optimizer``'s ``DYNAMO_DISABLED_METHODS`` import ``torch._dynamo`` only once it is loaded
    anyway (see module docstring). Idempotent; a method whose wrapper is not torch's ``_disable_dynamo`` form (a
    ``__wrapped__`` function without a cached disabled form) is left alone."""
    for name in DYNAMO_DISABLED_METHODS:
        fn = getattr(getattr(torch.optim.Optimizer, name, None), "__wrapped__", None)
        if fn is not None and getattr(fn, _CACHE_ATTR, None) is None:
            setattr(fn, _CACHE_ATTR, _deferred(fn))


@functools.cache
def _undecorated_step(cls: type[torch.optim.Optimizer]) -> Callable[..., Any] | None:
    """The ``step`` an optimizer class defines, under torch's wrappers (``inspect.unwrap``), or None when its
    outermost wrapper is not torch's ``_use_grad_for_differentiable`` one (then ``step`` calls ``optim.step()``)."""
    outer = cls.step
    inner = inspect.unwrap(outer)
    wrappers = [f.__code__.co_name for f in _wrapper_chain(outer)]
    return inner if inner is not outer and "_use_grad" in wrappers else None


def _wrapper_chain(fn: Callable[..., Any]) -> list[Callable[..., Any]]:
    """``fn`` and the functions its ``__wrapped__`` attributes lead to, the undecorated one excluded."""
    chain = []
    while getattr(fn, "__wrapped__", None) is not None:
        chain.append(fn)
        fn = fn.__wrapped__
    return [f for f in chain if hasattr(f, "__code__")]


def step(optim: torch.optim.Optimizer) -> None:
    """One ``optim.step()`` without importing ``torch._dynamo`` (see module docstring): the class's undecorated
    ``step`` under ``torch.no_grad()``; ``optim.step()`` itself for a ``differentiable`` optimizer, once
    ``torch._dynamo`` is loaded, or for a step whose wrappers are not torch's.
    """
    raw = None if optim.defaults.get("differentiable") or _dynamo_loaded() else _undecorated_step(type(optim))
    if raw is None:
        optim.step()
        return
    with torch.no_grad():
        raw(optim)
