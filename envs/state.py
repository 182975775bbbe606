"""Env state as data: a sync vector env's whole state as JSON plus numpy arrays, restored into a freshly built env
of the same spec, with no pickle (docs/resume.md "What a checkpoint holds").

One protocol for every layer of the env (the vector wrappers outermost first, the ``SyncVectorEnv``, then per
sub-env its wrappers outermost first and the simulator env):

* a layer's **data fields** (instance attributes holding ``None``, bools, numbers, strings, numpy arrays and
  scalars, and lists, tuples, deques and str-keyed dicts of these; numpy ``Generator`` s as their bit generator
  state; gymnasium's ``RunningMeanStd`` as its fields) are its state: episode statistics, time limits, frame
  stacks, observation and reward normalizers, sticky actions, the vector env's autoreset flags, classic control
  states. Every other attribute (spaces, inner envs, functions, enums, simulators) is construction, rebuilt from
  the spec; ``SKIPPED_FIELDS`` are construction too.
* the simulator env adds its simulator: ALE ``cloneState(include_rng=True)`` (emulator, frame counters, its RNG;
  as bytes) and MuJoCo ``mj_getState(mjSTATE_INTEGRATION)`` (everything ``mj_step`` reads: time, qpos, qvel,
  act, warm start, controls, applied forces, mocap, user data, plugin state), with only its ``np_random``
  besides (reset noise, noop counts); any other ``EzPickle`` simulator (Box2D) cannot be captured.
* a layer class may define ``env_state(self) -> dict`` (its fields) and ``load_env_state(self, fields)`` instead;
  ``env_state`` raising ``EnvStateError`` says why the env cannot be captured (EnvPool).

Tree format (``FORMAT``): ``{"format": 1, "vector": [layer, ...], "sub_envs": [[layer, ...], ...]}``, a layer
``{"class": "module.QualName", "fields": {name: value}, "sim": {"kind": "ale" | "mujoco", "state": value}}``
("sim" on simulator envs only). Values are JSON scalars and lists, or tagged objects ``{"$t": tag, ...}``:
``tuple``/``dict`` (``v``), ``deque`` (``v``, ``maxlen``), ``array``/``scalar``/``bytes`` (``k``: a key of the
arrays), ``rng`` (``state``: the bit generator's state), ``object`` (``class``, ``v``: fields). Arrays are never of
dtype object. ``to_files`` writes ``env_state.json`` (the tree, plus ``"arrays"``: per key its ``dtype`` (numpy's
``dtype.str``), ``shape`` and byte ``offset``) and ``env_state.bin`` (the arrays' raw bytes, C order, one after the
other); ``read_files`` reads them back with ``numpy.frombuffer``, refusing object and structured dtypes.

``legacy_tree`` reads the same tree out of an ``env.pkl`` written before this format, unpickled into inert
stand-ins (``orchestrator.store.safe_pickle``): nothing of the pickle is constructed or called.

Kept whole: one value encoding shared by capture, restore and the reading of older pickles into the same tree.
"""

from __future__ import annotations

import copy
import json
from collections import deque
from typing import Any, Callable

import gymnasium as gym
import numpy as np
from gymnasium.utils import EzPickle
from gymnasium.vector import SyncVectorEnv, VectorWrapper

FORMAT = 1
JSON_FILE, ARRAYS_FILE = "env_state.json", "env_state.bin"
STATE_FILES = (JSON_FILE, ARRAYS_FILE)
# construction, not state: the inner envs, constructor arguments, registry specs, render settings
SKIPPED_FIELDS = frozenset({"env", "envs", "env_fns", "_saved_kwargs", "_ezpickle_args", "_ezpickle_kwargs", "spec",
                            "_cached_spec", "metadata", "_metadata", "render_mode"})
STATE_OBJECTS = frozenset({"gymnasium.wrappers.utils.RunningMeanStd"})  # objects saved as their fields
BIT_GENERATORS = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")
_LEGACY_SIM_WRAPPER = "envs.wrappers.SimStatePickle"  # the wrapper that carried the simulator state in env.pkl
_GENERATOR_CTOR = "numpy.random._pickle.__generator_ctor"


class EnvStateError(Exception):
    """The env's state cannot be captured (names the layer and why), or a saved state does not fit the env."""


class _NotData(Exception):
    """A value that is not data (construction): its field is not part of the state."""


# ---------------------------------------------------------------- layers of real envs and of unpickled stand-ins
def class_name(obj: Any) -> str:
    """``module.QualName`` of ``obj``'s class; for a stand-in of ``safe_pickle``, the class it stands for."""
    cls = type(obj)
    return getattr(cls, "__pickled_class__", None) or f"{cls.__module__}.{cls.__qualname__}"


def _is_stand_in(obj: Any) -> bool:
    return getattr(type(obj), "__pickled_class__", None) is not None


def _fields_of(obj: Any) -> dict[str, Any]:
    """Instance attributes of a real object, or the pickled state of a stand-in (``{}`` when it has none)."""
    if not _is_stand_in(obj):
        return vars(obj)
    state = obj.pickled_state
    if isinstance(state, tuple) and len(state) == 2:  # (dict, slots) of objects with __slots__
        state = {**(state[0] or {}), **(state[1] or {})}
    return state if isinstance(state, dict) else {}


def sim_kind(env: gym.Env) -> str | None:
    """``"ale"``, ``"mujoco"``, ``"other"`` (an ``EzPickle`` env of an unknown simulator, e.g. Box2D) or None
    (a plain env whose attributes hold its whole state, e.g. classic control), of ``env.unwrapped``."""
    base = env.unwrapped
    if hasattr(base, "ale") and hasattr(base.ale, "cloneState"):
        return "ale"
    if hasattr(base, "model") and hasattr(base, "data") and type(base.data).__module__.startswith("mujoco"):
        return "mujoco"
    return "other" if isinstance(base, EzPickle) else None


def _hook(obj: Any, name: str) -> Any:
    """The layer class's own ``env_state`` / ``load_env_state`` (on the class: wrappers forward attributes)."""
    return getattr(type(obj), name, None)


def _chains(venv: Any) -> tuple[list[Any], list[list[Any]]]:
    """(vector layers outermost first, ending with the ``SyncVectorEnv``; per sub-env, its layers outermost first,
    ending with the simulator env) of a real vector env.

    Raises:
        EnvStateError: the vector env is not a ``SyncVectorEnv`` (its sub-envs live elsewhere) or a layer refuses.
    """
    vector = [venv]
    while isinstance(vector[-1], VectorWrapper):
        vector.append(vector[-1].env)
    for layer in vector:
        if _hook(layer, "env_state"):
            layer.env_state()  # raises EnvStateError where the layer cannot be captured
    base = vector[-1]
    if not isinstance(base, SyncVectorEnv):
        raise EnvStateError(f"{type(base).__name__} runs its sub-envs outside this process; their state cannot be "
                            "read (env.vectorization: sync can)")
    subs = []
    for env in base.envs:
        chain = [env]
        while isinstance(chain[-1], gym.Wrapper):
            chain.append(chain[-1].env)
        subs.append(chain)
    return vector, subs


# ---------------------------------------------------------------- values
class _Arrays:
    """The arrays of one tree, keyed ``a0``, ``a1``, ... in the order they are added."""

    def __init__(self) -> None:
        self.items: dict[str, np.ndarray] = {}

    def add(self, array: np.ndarray) -> str:
        key = f"a{len(self.items)}"
        self.items[key] = np.ascontiguousarray(array)
        return key


def _encode(value: Any, arrays: _Arrays) -> Any:
    """A data value -> its JSON tree (arrays added to ``arrays``).

    Raises:
        _NotData: the value (or a part of it) is construction, not data.
    """
    if isinstance(value, (np.ndarray, np.generic)):  # before float: numpy's float64 is a float
        if value.dtype.hasobject:
            raise _NotData
        return {"$t": "array" if isinstance(value, np.ndarray) else "scalar", "k": arrays.add(np.asarray(value))}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (bytes, bytearray)):
        return {"$t": "bytes", "k": arrays.add(np.frombuffer(bytes(value), np.uint8))}
    if isinstance(value, (list, tuple, deque, dict)):
        return _encode_container(value, arrays)
    if isinstance(value, np.random.Generator):
        return {"$t": "rng", "state": _encode(value.bit_generator.state, arrays)}
    name = class_name(value)
    if name == _GENERATOR_CTOR and _is_stand_in(value):
        return {"$t": "rng", "state": _encode(_legacy_rng_state(value), arrays)}
    if name in STATE_OBJECTS:
        return {"$t": "object", "class": name, "v": _data_fields(_fields_of(value), arrays)}
    raise _NotData


def _encode_container(value: list | tuple | deque | dict, arrays: _Arrays) -> Any:
    """A list (JSON list), tuple, deque (with its ``maxlen``) or str-keyed dict of data -> its JSON tree.

    Raises:
        _NotData: a non-str dict key, or an item that is not data.
    """
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise _NotData
        return {"$t": "dict", "v": {k: _encode(v, arrays) for k, v in value.items()}}
    items = [_encode(v, arrays) for v in value]
    if isinstance(value, list):
        return items
    if isinstance(value, deque):
        return {"$t": "deque", "v": items, "maxlen": value.maxlen}
    return {"$t": "tuple", "v": items}


def _data_fields(fields: dict[str, Any], arrays: _Arrays) -> dict[str, Any]:
    """The data fields of a layer, encoded (construction fields left out)."""
    out = {}
    for key, value in fields.items():
        if key in SKIPPED_FIELDS:
            continue
        try:
            out[key] = _encode(value, arrays)
        except _NotData:
            continue
    return out


def _decode(tree: Any, arrays: dict[str, np.ndarray], current: Any, where: str) -> Any:
    """A JSON tree -> a new value for a field whose value is now ``current``, checked to fit it: an array stays an
    array, a generator a generator, a state object one of the same class.

    Raises:
        EnvStateError: unknown tag, missing array, or a value that does not fit ``current`` (names ``where``).
    """
    tag = tree.get("$t") if isinstance(tree, dict) else None
    kind = _kind(current)
    if kind is not None and tag not in _TAGS_OF_KIND[kind]:
        raise EnvStateError(f"{where}: expected a {type(current).__name__}, got {tag or type(tree).__name__}")
    if isinstance(tree, list):
        return [_decode(v, arrays, None, where) for v in tree]
    if tag is None:
        return tree
    if tag in ("array", "scalar", "bytes"):
        return _decode_array(tree, arrays, where)
    if tag == "rng":
        return _generator(_decode(tree["state"], arrays, None, where), where)
    if tag == "object":
        return _decode_object(tree, arrays, current, where)
    items = tree["v"]
    if tag == "dict":
        return {k: _decode(v, arrays, None, f"{where}.{k}") for k, v in items.items()}
    if tag in ("tuple", "deque"):
        values = (_decode(v, arrays, None, where) for v in items)
        return tuple(values) if tag == "tuple" else deque(values, maxlen=tree.get("maxlen"))
    raise EnvStateError(f"{where}: unknown value tag {tag!r}")


_TAGS_OF_KIND = {"array": ("array", "scalar"), "rng": ("rng",), "object": ("object",)}


def _kind(current: Any) -> str | None:
    """Which values may replace ``current``: ``"array"``, ``"rng"``, ``"object"`` (a state object) or None (any)."""
    if isinstance(current, (np.ndarray, np.generic)):
        return "array"
    if isinstance(current, np.random.Generator):
        return "rng"
    return "object" if class_name(current) in STATE_OBJECTS else None


def _decode_array(tree: dict[str, Any], arrays: dict[str, np.ndarray], where: str) -> Any:
    """An ``array`` (a copy), ``scalar`` (numpy scalar) or ``bytes`` value. Shapes and dtypes are not compared with
    ``current``'s: a fresh env's fields may differ from a stepped one's (a sticky action's ``last_action``, a classic
    control state that turns float64 after a step)."""
    array = arrays.get(tree.get("k"))
    if array is None:
        raise EnvStateError(f"{where}: array {tree.get('k')!r} is missing")
    if tree["$t"] == "bytes":
        return array.astype(np.uint8, copy=False).tobytes()
    return array.reshape(())[()] if tree["$t"] == "scalar" else array.copy()


def _decode_object(tree: dict[str, Any], arrays: dict[str, np.ndarray], current: Any, where: str) -> Any:
    """A copy of the state object ``current`` (of the saved class) with the saved fields it has."""
    if current is None or class_name(current) != tree.get("class"):
        raise EnvStateError(f"{where}: the env holds a {class_name(current)}, the saved state a {tree.get('class')}")
    out = copy.copy(current)
    for key, value in tree["v"].items():
        if key in vars(out):
            setattr(out, key, _decode(value, arrays, None, f"{where}.{key}"))  # statistics change shape
    return out


def _generator(state: Any, where: str) -> np.random.Generator:
    """A numpy ``Generator`` with the bit generator state ``state`` (``bit_generator.state`` dict).

    Raises:
        EnvStateError: not a state of one of ``BIT_GENERATORS``, or one numpy refuses.
    """
    name = state.get("bit_generator") if isinstance(state, dict) else None
    if name not in BIT_GENERATORS:
        raise EnvStateError(f"{where}: a generator state of {name!r}, expected one of {BIT_GENERATORS}")
    bit_generator = getattr(np.random, name)()
    try:
        bit_generator.state = state
    except (TypeError, ValueError, KeyError) as err:
        raise EnvStateError(f"{where}: bad {name} state: {err}") from None
    return np.random.Generator(bit_generator)


# ---------------------------------------------------------------- simulators
def _capture_sim(base: Any, kind: str, arrays: _Arrays) -> dict[str, Any]:
    """The simulator state of an ALE or MuJoCo env (see the module docstring)."""
    if kind == "ale":
        return {"kind": kind, "state": _encode(base.ale.cloneState(include_rng=True).__getstate__(), arrays)}
    import mujoco

    spec = mujoco.mjtState.mjSTATE_INTEGRATION
    physics = np.empty(mujoco.mj_stateSize(base.model, spec), np.float64)
    mujoco.mj_getState(base.model, base.data, physics, spec)
    return {"kind": kind, "state": _encode(physics, arrays)}


def _sim_setter(base: Any, sim: Any, arrays: dict[str, np.ndarray], where: str) -> Callable[[], None]:
    """A function that writes ``sim`` into ``base``, checked first.

    Raises:
        EnvStateError: ``sim`` is of another simulator than ``base``, or of the wrong size.
    """
    kind = sim_kind(base)
    if not isinstance(sim, dict) or sim.get("kind") != kind:
        raise EnvStateError(f"{where}: the env's simulator is {kind}, the saved state's "
                            f"{sim.get('kind') if isinstance(sim, dict) else sim!r}")
    if kind == "ale":
        import ale_py

        data = _decode(sim.get("state"), arrays, None, where)
        if not isinstance(data, bytes):
            raise EnvStateError(f"{where}: the ALE state is not bytes")
        try:
            state = ale_py.ALEState(data)
        except Exception as err:  # nanobind reports a parse failure as SystemError  # noqa: BLE001
            raise EnvStateError(f"{where}: ALE refuses the emulator state: {err}") from None
        return lambda: base.ale.restoreState(state)
    import mujoco

    spec = mujoco.mjtState.mjSTATE_INTEGRATION
    size = mujoco.mj_stateSize(base.model, spec)
    physics = np.asarray(_decode(sim.get("state"), arrays, np.empty(size), where), np.float64)
    if physics.shape != (size,):
        raise EnvStateError(f"{where}: the MuJoCo state has shape {list(physics.shape)}, this model's {size} values")
    return lambda: mujoco.mj_setState(base.model, base.data, physics, spec)


# ---------------------------------------------------------------- capture and restore
def _layer(obj: Any, arrays: _Arrays) -> dict[str, Any]:
    """One layer of a real env: class, data fields and, on a simulator env, the simulator."""
    if _hook(obj, "env_state"):
        return {"class": class_name(obj), "fields": _encode(obj.env_state(), arrays)["v"]}
    if isinstance(obj, gym.Wrapper) or not isinstance(obj, gym.Env):
        return {"class": class_name(obj), "fields": _data_fields(vars(obj), arrays)}
    kind = sim_kind(obj)
    if kind == "other":
        raise EnvStateError(f"{type(obj).__name__} is re-created from its constructor arguments (EzPickle); its "
                            "simulator state cannot be saved")
    if kind is None:
        return {"class": class_name(obj), "fields": _data_fields(vars(obj), arrays)}
    return {"class": class_name(obj), "fields": _data_fields({"_np_random": obj.np_random}, arrays),
            "sim": _capture_sim(obj, kind, arrays)}


def capture(venv: Any) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The whole state of a sync vector env as (JSON tree, arrays by key); see the module docstring.

    Raises:
        EnvStateError: names what cannot be captured: an async or EnvPool vector env, a Box2D (``EzPickle``)
            simulator.
    """
    vector, subs = _chains(venv)
    arrays = _Arrays()
    tree = {"format": FORMAT, "vector": [_layer(layer, arrays) for layer in vector],
            "sub_envs": [[_layer(layer, arrays) for layer in chain] for chain in subs]}
    return tree, arrays.items


def restore(venv: Any, tree: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """Write a ``capture`` result into ``venv``, a freshly built env of the same spec: everything is checked
    before anything is written, so on an error the env is as it was.

    Only the fields the env's layers already have are written; values are data (see ``_decode``).

    Raises:
        EnvStateError: the state does not fit the env (another format, layer class, sub-env count, array shape or
            simulator; names the layer).
    """
    if not isinstance(tree, dict) or tree.get("format") != FORMAT:
        raise EnvStateError(f"env state format {tree.get('format') if isinstance(tree, dict) else tree!r}; "
                            f"this lab reads {FORMAT}")
    vector, subs = _chains(venv)
    saved_subs = tree.get("sub_envs") or []
    if len(saved_subs) != len(subs):
        raise EnvStateError(f"the env has {len(subs)} sub-envs, the saved state {len(saved_subs)}")
    writes: list[Callable[[], None]] = []
    try:
        _plan(vector, tree.get("vector") or [], arrays, "vector env", writes)
        for i, (chain, saved) in enumerate(zip(subs, saved_subs)):
            _plan(chain, saved, arrays, f"sub-env {i}", writes)
    except (TypeError, AttributeError, KeyError, ValueError) as err:  # a tree of the wrong shape
        raise EnvStateError(f"the saved env state is malformed: {type(err).__name__}: {err}") from None
    for write in writes:
        write()


def _plan(chain: list[Any], saved: list[Any], arrays: dict[str, np.ndarray], where: str,
          writes: list[Callable[[], None]]) -> None:
    """Check the saved layers against ``chain`` and append the writes that restore them."""
    names = [class_name(layer) for layer in chain]
    saved_names = [layer.get("class") if isinstance(layer, dict) else None for layer in saved]
    if names != saved_names:
        raise EnvStateError(f"{where}: the env's layers are {names}, the saved state's {saved_names}")
    for obj, layer in zip(chain, saved):
        at = f"{where} {type(obj).__name__}"
        fields = layer.get("fields") or {}
        if _hook(obj, "load_env_state"):
            values = _decode({"$t": "dict", "v": fields}, arrays, None, at)
            writes.append(lambda obj=obj, values=values: obj.load_env_state(values))
            continue
        for key, value in fields.items():
            if key in SKIPPED_FIELDS or not _settable(obj, key):
                continue
            new = _decode(value, arrays, vars(obj).get(key), f"{at}.{key}")
            writes.append(lambda obj=obj, key=key, new=new: setattr(obj, key, new))
        if "sim" in layer:
            writes.append(_sim_setter(obj, layer["sim"], arrays, at))
        elif isinstance(obj, gym.Env) and not isinstance(obj, gym.Wrapper) and sim_kind(obj) in ("ale", "mujoco"):
            raise EnvStateError(f"{at}: the saved state has no simulator state")


def _settable(obj: Any, key: str) -> bool:
    """Whether a saved field ``key`` may be written to ``obj``: an instance attribute it has, or one it has not set
    yet (a classic control ``state`` before the first reset) that is no attribute of its class (never a method or
    property) and no dunder name."""
    return key in vars(obj) or (key.isidentifier() and not key.startswith("__") and not hasattr(type(obj), key))


def to_files(venv: Any) -> dict[str, bytes]:
    """``capture`` as checkpoint files: ``env_state.json`` (UTF-8 JSON) and ``env_state.bin`` (raw array bytes).

    Raises:
        EnvStateError: see ``capture``.
    """
    tree, arrays = capture(venv)
    index, chunks, offset = {}, [], 0
    for key, array in arrays.items():
        index[key] = {"dtype": array.dtype.str, "shape": list(array.shape), "offset": offset}
        chunks.append(array.tobytes())
        offset += array.nbytes
    return {JSON_FILE: json.dumps({**tree, "arrays": index}, separators=(",", ":")).encode(),
            ARRAYS_FILE: b"".join(chunks)}


def read_files(files: dict[str, bytes]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(tree, arrays) of checkpoint files written by ``to_files``; only JSON and raw numbers are parsed.

    Raises:
        EnvStateError: a file is missing, or does not parse: bad JSON, an object or structured dtype, an array
            outside ``env_state.bin``.
    """
    try:
        tree = json.loads(files[JSON_FILE])
        data = files[ARRAYS_FILE]
        arrays = {key: _array_at(data, entry) for key, entry in tree.pop("arrays").items()}
    except (KeyError, ValueError, TypeError, AttributeError, UnicodeDecodeError) as err:
        raise EnvStateError(f"env state files do not parse: {type(err).__name__}: {err}") from None
    return tree, arrays


def _array_at(data: bytes, entry: dict[str, Any]) -> np.ndarray:
    """The array an index entry names in ``data`` (a read-only view).

    Raises:
        ValueError: an object, structured or unsized dtype, a bad shape, or bytes outside ``data``.
    """
    dtype = np.dtype(str(entry["dtype"]))
    shape = tuple(int(n) for n in entry["shape"])
    offset = int(entry["offset"])
    if dtype.hasobject or dtype.fields is not None or dtype.itemsize == 0 or min(shape, default=0) < 0 or offset < 0:
        raise ValueError(f"array entry {entry} is not a plain numeric array")
    count = int(np.prod(shape, dtype=np.int64))
    if offset + count * dtype.itemsize > len(data):
        raise ValueError(f"array entry {entry} reaches past the {len(data)} bytes of {ARRAYS_FILE}")
    return np.frombuffer(data, dtype, count, offset).reshape(shape)


# ---------------------------------------------------------------- env.pkl of older checkpoints
def legacy_tree(root: Any) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The state tree of an ``env.pkl`` (a pickled ``SyncVectorEnv`` with its wrappers, written before this format)
    unpickled into stand-ins by ``orchestrator.store.safe_pickle.restricted_loads``: the same layers as ``capture``
    of the env it was, the simulator state from the ``SimStatePickle`` wrapper that carried it (not a layer now).

    Raises:
        EnvStateError: the object is not such an env.
    """
    arrays = _Arrays()
    vector = [root]
    while "env" in _fields_of(vector[-1]) and "envs" not in _fields_of(vector[-1]):
        vector.append(_fields_of(vector[-1])["env"])
    subs = _fields_of(vector[-1]).get("envs")
    if not isinstance(subs, list) or not all(_is_stand_in(layer) for layer in vector):
        raise EnvStateError(f"env.pkl holds a {class_name(vector[-1])}, not a pickled SyncVectorEnv")
    tree = {"format": FORMAT, "vector": [_legacy_layer(layer, None, arrays) for layer in vector], "sub_envs": []}
    for env in subs:
        chain, sim = [], None
        while _is_stand_in(env):
            fields = _fields_of(env)
            if class_name(env) == _LEGACY_SIM_WRAPPER:
                sim = fields.get("_sim_state")
            else:
                chain.append(env)
            if "env" not in fields:
                break
            env = fields["env"]
        tree["sub_envs"].append([_legacy_layer(layer, sim if i == len(chain) - 1 else None, arrays)
                                 for i, layer in enumerate(chain)])
    return tree, arrays.items


def _legacy_layer(obj: Any, sim: Any, arrays: _Arrays) -> dict[str, Any]:
    """One layer of a pickled env; ``sim``: the ``SimStatePickle`` state of its simulator env (or None)."""
    if not isinstance(sim, dict):
        return {"class": class_name(obj), "fields": _data_fields(_fields_of(obj), arrays)}
    kind = sim.get("kind")
    state = sim.get(kind)
    if kind == "ale" and _is_stand_in(state):
        state = state.pickled_state  # ALEState pickles as its serialized bytes
    try:
        return {"class": class_name(obj), "fields": {"_np_random": _encode(_generator_of(sim.get("np_random")),
                                                                           arrays)},
                "sim": {"kind": kind, "state": _encode(state, arrays)}}
    except _NotData:
        raise EnvStateError(f"env.pkl: the simulator state of {class_name(obj)} is not data") from None


def _generator_of(state: Any) -> np.random.Generator:
    try:
        return _generator(state, "env.pkl np_random")
    except EnvStateError:
        raise _NotData from None


def _legacy_rng_state(stand_in: Any) -> Any:
    """The bit generator state of a pickled numpy ``Generator``: ``__generator_ctor(bit_generator)``, whose bit
    generator stand-in holds its state (a dict, or ``(dict, seed sequence)``)."""
    args = getattr(stand_in, "pickled_args", ())
    if not args or not _is_stand_in(args[0]):
        raise _NotData
    state = args[0].pickled_state
    state = state[0] if isinstance(state, tuple) and state else state
    if not isinstance(state, dict) or state.get("bit_generator") not in BIT_GENERATORS:
        raise _NotData
    return state
