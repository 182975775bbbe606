"""Restricted unpickling for the one pickle the lab still reads back from a data dir: ``env.pkl`` of checkpoints
written before env state became data (``envs.state``; docs/resume.md "Trust boundary").

``restricted_loads`` builds nothing a pickle names except numpy arrays, dtypes and scalars and
``collections.deque`` / ``OrderedDict``. Every other global must be on the allowlist (``STAND_IN_MODULES``,
``STAND_IN_NAMES``, numpy ufuncs) and becomes an inert stand-in: a ``StandIn`` subclass that records the
arguments it is called with and the state, items and keys the pickle gives it, and does nothing else (no
constructor, ``__setstate__``, ``__reduce__`` target or method of the real class runs). ``envs.state.legacy_tree``
reads the env's state out of those records. Any other global (``os.system``, ``builtins.eval``, ...) and any
persistent id is refused with ``PickleRefused`` before anything is called.

What a crafted pickle can still do: make numpy allocate arrays (memory) and make the reader of the records see
any data it likes, which is then checked like any saved env state (``envs.state.restore``).
"""

from __future__ import annotations

import io
import pickle
from typing import Any

# the only globals built for real: numpy's array reconstruction and plain containers
REAL_GLOBALS = frozenset({
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy._core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "scalar"), ("numpy.core.multiarray", "scalar"),
    ("numpy._core.numeric", "_frombuffer"), ("numpy.core.numeric", "_frombuffer"),
    ("collections", "deque"), ("collections", "OrderedDict"),
})
# modules whose classes and functions the lab's envs pickled (gymnasium's envs, wrappers, spaces and registry specs,
# ALE, the lab's own wrappers and env spec, numpy's generators), stood in for
STAND_IN_MODULES = ("gymnasium", "ale_py", "envs", "numpy.random", "mujoco")
STAND_IN_NAMES = frozenset({("functools", "partial")})


class PickleRefused(pickle.UnpicklingError):
    """A pickle names a global outside the allowlist, or a persistent id (names it); nothing of it was run."""


class StandIn:
    """An inert stand-in for an allowlisted class or function of a restricted pickle.

    Class attribute ``__pickled_class__``: ``module.name`` of the global it stands for. Instance attributes:
    ``pickled_args`` / ``pickled_kwargs`` (what the pickle called it with), ``pickled_state`` (what it set as
    state; None if nothing), ``pickled_items`` (appended items) and ``pickled_keys`` (set items).
    """

    __pickled_class__ = ""

    def __new__(cls, *args: Any, **kwargs: Any) -> StandIn:
        obj = super().__new__(cls)
        obj.pickled_args, obj.pickled_kwargs = args, kwargs
        obj.pickled_state, obj.pickled_items, obj.pickled_keys = None, [], {}
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        self.pickled_state = state

    def append(self, item: Any) -> None:
        """Record a list item the pickle appends (nothing of the named class runs)."""
        self.pickled_items.append(item)

    def extend(self, items: Any) -> None:
        """Record the list items the pickle appends (nothing of the named class runs)."""
        self.pickled_items.extend(items)

    def __setitem__(self, key: Any, value: Any) -> None:
        self.pickled_keys[key] = value

    def __repr__(self) -> str:
        return f"<stand-in for {self.__pickled_class__}>"


def _allowed_stand_in(module: str, name: str) -> bool:
    """Whether ``module.name`` is on the stand-in allowlist."""
    if (module, name) in STAND_IN_NAMES:
        return True
    if any(module == m or module.startswith(m + ".") for m in STAND_IN_MODULES):
        return True
    if module == "numpy" and name.isidentifier():  # numpy's ufuncs (np.sign, np.multiply) pickle by name
        import numpy as np

        return isinstance(getattr(np, name, None), np.ufunc)
    return False


class _RestrictedUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` whose globals are numpy array parts, plain containers or stand-ins (see module)."""

    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self._stand_ins: dict[tuple[str, str], type] = {}

    def find_class(self, module: str, name: str) -> Any:
        """The real object for ``REAL_GLOBALS`` (numpy arrays, dtypes, scalars, deque, OrderedDict), an inert
        ``StandIn`` subclass for an allowlisted name.

        Raises:
            PickleRefused: a name off the allowlist.
        """
        if (module, name) in REAL_GLOBALS:
            return super().find_class(module, name)
        if not _allowed_stand_in(module, name):
            raise PickleRefused(f"the pickle names '{module}.{name}', which is not on the allowlist")
        key = (module, name)
        if key not in self._stand_ins:
            self._stand_ins[key] = type(name, (StandIn,), {"__pickled_class__": f"{module}.{name}",
                                                           "__module__": __name__})
        return self._stand_ins[key]

    def persistent_load(self, pid: Any) -> Any:
        """Refuse every persistent id (the lab never writes one).

        Raises:
            PickleRefused: always.
        """
        raise PickleRefused(f"the pickle holds a persistent id {pid!r}")


def restricted_loads(data: bytes) -> Any:
    """Unpickle ``data`` with the allowlist: numpy arrays and containers are real, the rest stand-ins.

    Raises:
        PickleRefused: a global outside the allowlist or a persistent id (nothing was called).
        pickle.UnpicklingError: the bytes are not a valid pickle, or the pickle uses a stand-in or a numpy part
            in a way they refuse (wrapped: the cause is named).
    """
    try:
        return _RestrictedUnpickler(bytes(data)).load()
    except PickleRefused:
        raise
    except Exception as err:  # a malformed or hostile pickle fails in many ways; each is a refusal  # noqa: BLE001
        raise pickle.UnpicklingError(f"{type(err).__name__}: {err}") from None
