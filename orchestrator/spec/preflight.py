"""Preflight: checks that run after spec validation and before any run directory or Ray actor exists.

A spec can be valid field by field and still be unable to run on this machine:

* the env cannot be built: a dependency is missing (Box2D, MuJoCo, ALE, ...) or its constructor
  fails. ``check_env`` builds the env once (one sub-env, as ``envs.make.make_env`` does) and names
  the pip command that installs what is missing;
* sizes that allocate up front do not fit in memory: the replay buffer (``agent.memory.max_size``) and a sample
  of it (``agent.memory.batch_size``),
  the sub-envs (``env.num_envs``, ``meta.rigorous_eval``), a PPO/REINFORCE rollout
  (``agent.algorithm.time_horizon`` / ``training_frequency`` x ``env.num_envs``) and the net
  (``agent.net.hid_layers``). ``check_memory`` compares each with the memory one session can use:
  the available system memory (``MemAvailable``, capped by a cgroup limit) divided by the sessions
  that run at once on this machine.

Every failure raises ``SpecError`` (exit 2 through ``orchestrator.cli``) naming the spec key and, for
memory, the bytes needed and the bytes available. ``check_spec`` is what every mode runs before it starts
(``orchestrator.modes.common.preflight``; a ``train`` driver in ``orchestrator.modes.spec_check``).
"""

from __future__ import annotations

import dataclasses
import math
import os
import tracemalloc
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import gymnasium as gym
import numpy as np

from agents.algorithms import ALGORITHMS
from agents.memory import transition_bytes
from envs.envpool_vec import resolve_envpool_id
from envs.make import EnvSpec, make_env, resolve_env_id
from orchestrator.errors import SpecError
from orchestrator.runtime import allocator
from orchestrator.spec.load import build, check
from orchestrator.spec.search_space import apply_values, parse_search

# entry-point module prefix (or env id prefix) -> the pip command that installs the env family
INSTALL_HINTS: tuple[tuple[str, str], ...] = (
    ("gymnasium.envs.box2d", 'pip install swig && pip install "gymnasium[box2d]"'),
    ("gymnasium.envs.mujoco", 'pip install "gymnasium[mujoco]"'),
    ("ale_py", "pip install ale-py"),
    ("ALE/", "pip install ale-py"),
    ("gymnasium.envs.classic_control", 'pip install "gymnasium[classic-control]"'),
    ("gymnasium.envs.toy_text", 'pip install "gymnasium[toy-text]"'),
)
FLOAT32_BYTES = 4
MIN_ENV_BYTES = 4096  # floor of one sub-env's footprint (bytes) when tracing sees less
ASYNC_WORKER_BYTES = 32 * 2**20  # one AsyncVectorEnv worker process (bytes), a lower bound
NET_COPIES = 4  # weights, gradients and Adam's two moments: bytes of a net = 4 x its parameters x 4


@dataclass(frozen=True)
class EnvShape:
    """What one sub-env allocates and the spaces the agent is built from.

    Fields: ``obs_shape`` (O), ``act_shape`` (A, ``()`` for discrete), ``act_dtype`` (as the agent
    stores it), ``n_actions`` (outputs of the policy head), ``env_bytes`` (bytes one sub-env holds,
    measured with ``tracemalloc`` while building it: a lower bound, C allocations are not seen),
    ``obs_dtype`` (the observation space's dtype: uint8 Atari frames).
    """

    obs_shape: tuple[int, ...]
    act_shape: tuple[int, ...]
    act_dtype: np.dtype
    n_actions: int
    env_bytes: int
    obs_dtype: np.dtype = np.dtype(np.float32)


def install_hint(env_id: str) -> str:
    """The pip command for the env family of ``env_id`` (from its id or entry point), or ''."""
    entry = gym.registry[env_id].entry_point if env_id in gym.registry else ""
    entry = entry if isinstance(entry, str) else getattr(entry, "__module__", "")
    for prefix, command in INSTALL_HINTS:
        if env_id.startswith(prefix) or entry.startswith(prefix):
            return command
    return ""


def _build_env(env: dict[str, Any]) -> Any:
    """One sub-env built like the session's (every ``env`` key: max_t, wrappers, gym.make kwargs), sync.
    Raises what gymnasium raises."""
    known = {f.name for f in dataclasses.fields(EnvSpec)}
    vec = "envpool" if env.get("vectorization") == "envpool" else "sync"  # EnvPool-only ids (Playground) included
    spec = EnvSpec(**{**{k: v for k, v in env.items() if k in known}, "max_frame": 1, "num_envs": 1,
                      "vectorization": vec})
    return make_env(spec, None)


def _resident_bytes() -> int:
    """This process's resident memory (bytes, ``/proc/self/statm``; 0 where there is none)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _traced_build(env: dict[str, Any]) -> tuple[Any, int]:
    """A reset sub-env and the peak bytes Python allocated building it (0 if tracemalloc is in use). An EnvPool
    sub-env allocates in C++, which tracing does not see: its bytes are the resident memory a second sub-env adds
    while the first is still open (so freed memory of an earlier build is not reused) and after malloc gave its free
    memory back to the kernel (``allocator.release_free_memory``: memory freed earlier in the process, reused, would
    not show), when that is more."""
    if env.get("vectorization") == "envpool":
        first = _build_env(env)
        first.reset(seed=0)
        allocator.release_free_memory()
        before = _resident_bytes()
        venv, traced = _python_traced_build(env)
        added = _resident_bytes() - before
        first.close()
        return venv, max(traced, added)
    return _python_traced_build(env)


def _python_traced_build(env: dict[str, Any]) -> tuple[Any, int]:
    """A reset sub-env and the peak bytes Python allocated building it (0 if tracemalloc is in use)."""
    if tracemalloc.is_tracing():  # someone else traces: do not stop their trace
        venv = _build_env(env)
        venv.reset(seed=0)
        return venv, 0
    tracemalloc.start()
    try:
        venv = _build_env(env)
        venv.reset(seed=0)
        return venv, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def check_env(env: dict[str, Any]) -> EnvShape:
    """Build the spec's env once and return its shape (closes it again).

    Args:
        env: the checked ``env`` section.

    Returns:
        The ``EnvShape`` of one sub-env.

    Raises:
        SpecError: ``env.name`` is unknown, needs a package that is not installed (the message gives
            the pip command), or its constructor fails.
    """
    try:
        env_id = resolve_envpool_id(env["name"]) if env.get("vectorization") == "envpool" else \
            resolve_env_id(env["name"])
    except ValueError as err:
        raise SpecError(f"env.name: {err}") from None
    try:
        _build_env(env).close()  # the first build imports the env's modules
        venv, env_bytes = _traced_build(env)
    except (gym.error.DependencyNotInstalled, ImportError) as err:
        hint = install_hint(env_id.split(":")[-1])
        what = str(err).split(",")[0].split(";")[0].strip() if hint else str(err)
        how = f"; install it with: {hint}" if hint else ""
        raise SpecError(f"env.name: env '{env['name']}' needs a package that is not installed: {what}{how}") from None
    except Exception as err:  # any constructor failure is bad input here, reported before a run exists
        raise SpecError(f"env.name: env '{env['name']}' cannot be built: {type(err).__name__}: {err}") from None
    obs_space, act_space = venv.single_observation_space, venv.single_action_space
    venv.close()
    discrete = isinstance(act_space, gym.spaces.Discrete)
    return EnvShape(tuple(obs_space.shape or ()), () if discrete else tuple(act_space.shape or ()),
                    np.dtype(np.int64) if discrete else np.dtype(np.float32),
                    int(act_space.n) if discrete else int(np.prod(act_space.shape or ())),
                    max(int(env_bytes), MIN_ENV_BYTES), np.dtype(obs_space.dtype))


# ---------------------------------------------------------------- memory

def replay_bytes(max_size: int, obs_shape: tuple[int, ...], act_shape: tuple[int, ...], act_dtype: np.dtype) -> int:
    """Bytes of ``max_size`` rows of float32 obs and next_obs (max_size, *O), act (max_size, *A) of
    ``act_dtype``, reward and terminated float32 (max_size,): an upper bound of a rollout's rows (a replay's
    own bytes: ``replay_transition_bytes``)."""
    obs = int(np.prod(obs_shape, dtype=object)) * FLOAT32_BYTES
    act = int(np.prod(act_shape, dtype=object)) * np.dtype(act_dtype).itemsize
    return int(max_size) * (2 * obs + act + 2 * FLOAT32_BYTES)


def replay_transition_bytes(spec: dict[str, Any], shape: EnvShape, obs_shape: tuple[int, ...], name: str,
                            store_next_obs: bool = True) -> int:
    """Bytes per transition, rounded up, of the replay kind ``name`` the checked ``spec``'s ``agent.memory``
    builds for observations ``obs_shape`` of ``shape.obs_dtype`` (``agents.memory.transition_bytes``: uint8
    frames as they are, each frame once for frame stacks unless ``optimize_memory_usage`` is false)."""
    memory = build(spec).agent.memory
    space = SimpleNamespace(shape=tuple(obs_shape), dtype=shape.obs_dtype)
    return math.ceil(transition_bytes(memory, space, shape.act_shape, shape.act_dtype, name, store_next_obs))


def conv_net_bytes(conv_hid_layers: list[Any], fc_hid_layers: list[int], out_dim: int) -> int:
    """A lower bound of the bytes of a ConvNet with its gradients and Adam state: ``NET_COPIES`` x 4 x the parameters
    of its conv layers (``[out, kernel, ...]``, from one input channel) and of its fc layers from a 1x1 feature map.
    Huge channel or fc widths are refused by it before torch tries to allocate them."""
    params, channels = 0, 1
    for layer in conv_hid_layers:
        out, kernel = int(layer[0]), layer[1]
        area = int(np.prod(kernel, dtype=object)) if isinstance(kernel, (list, tuple)) else int(kernel) ** 2
        params += channels * out * area + out
        channels = out
    dims = [channels, *(int(d) for d in fc_hid_layers), out_dim]
    params += sum(d_in * d_out + d_out for d_in, d_out in zip(dims, dims[1:]))
    return NET_COPIES * FLOAT32_BYTES * params


def net_bytes(in_dim: int, hid_layers: list[int], out_dim: int) -> int:
    """Bytes of one MLP with its gradients and Adam state: ``NET_COPIES`` x 4 x parameters (a lower
    bound of the agent's nets: actor-critic and target nets add more)."""
    dims = [in_dim, *hid_layers, out_dim]
    params = sum(d_in * d_out + d_out for d_in, d_out in zip(dims, dims[1:]))
    return NET_COPIES * FLOAT32_BYTES * params


def _system_available() -> int:
    """Available system memory (bytes): psutil's ``available`` where installed, else ``MemAvailable`` of
    /proc/meminfo, else ``os.sysconf`` free pages."""
    try:
        import psutil
        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def available_bytes() -> int:
    """Memory this process can still allocate (bytes): ``_system_available``, capped by the cgroup v2/v1
    limit minus current usage."""
    found = [_system_available()]
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit_file) as f, open(usage_file) as g:
                limit, usage = f.read().strip(), g.read().strip()
        except OSError:
            continue
        if limit.isdigit() and int(limit) < 2**60:
            found.append(max(0, int(limit) - int(usage)))
    return min(found)


def fmt_bytes(n: int) -> str:
    """``n`` bytes as ``"n bytes (x.y GiB)"``."""
    units = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"]
    k = min(int(math.log(n, 1024)) if n > 0 else 0, len(units) - 1)
    return f"{n} bytes" if k == 0 else f"{n} bytes ({n / 1024**k:.1f} {units[k]})"


def concurrent_sessions(spec: dict[str, Any], mode: str, max_concurrent_trials: int | None = None) -> int:
    """Sessions that run at once on this machine: 1 in ``dev``/``enjoy``; in ``train``, ``meta.max_session``
    and in ``search`` that times the concurrent trials, at most as many as the CPUs fit
    (``meta.resources.num_cpus`` each)."""
    meta = spec["meta"]
    if mode in ("dev", "enjoy"):
        return 1
    sessions = int(meta["max_session"])
    if mode == "search":
        sessions *= min(int(meta["max_trial"]), max_concurrent_trials or int(meta["max_trial"]))
    per_cpu = float(meta["resources"].get("num_cpus", 1) or 0)
    fit = int((os.cpu_count() or 1) // per_cpu) if per_cpu > 0 else sessions
    return max(1, min(sessions, fit))


def memory_needs(spec: dict[str, Any], shape: EnvShape) -> list[tuple[str, int, str]]:
    """``(spec key, bytes, what)`` of each up-front allocation of one session."""
    env, agent = spec["env"], spec["agent"]
    memory, algo, net = agent["memory"], agent["algorithm"], agent["net"]
    n_envs = int(env["num_envs"])
    per_env = shape.env_bytes + (ASYNC_WORKER_BYTES if env["vectorization"] == "async" else 0)
    window = net.get("seq_len") if net.get("type") == "RecurrentNet" else None  # the env's (L, *O) windows
    obs_shape = shape.obs_shape if window is None else (int(window), *shape.obs_shape)
    step = replay_bytes(1, obs_shape, shape.act_shape, shape.act_dtype)
    needs = [("env.num_envs", n_envs * per_env, f"{n_envs} sub-envs x {per_env} bytes")]
    if spec["meta"]["rigorous_eval"]:
        k = int(spec["meta"]["rigorous_eval"])
        needs.append(("meta.rigorous_eval", k * shape.env_bytes, f"{k} eval sub-envs x {shape.env_bytes} bytes"))
    if memory["name"] in ("Replay", "PrioritizedReplay"):
        size = int(memory["max_size"])
        per = replay_transition_bytes(spec, shape, obs_shape, memory["name"])
        needs.append(("agent.memory.max_size", size * per, f"replay of {size} transitions x {per} bytes"))
        batch = int(memory["batch_size"])  # may exceed max_size: drawn with replacement, as SLM-Lab's Replay
        needs.append(("agent.memory.batch_size", batch * step, f"sample of {batch} transitions x {step} bytes"))
    if getattr(ALGORITHMS.get(str(algo.get("name"))), "sil_replay", False):  # beside the on-policy memory
        size = int(memory["max_size"])
        sil = replay_transition_bytes(spec, shape, obs_shape, memory.get("sil_replay_name") or "Replay", False)
        needs.append(("agent.memory.max_size", size * sil, f"SIL replay of {size} transitions x {sil} bytes"))
    horizon_key = "time_horizon" if "time_horizon" in algo else "training_frequency"
    if memory["name"] == "OnPolicyBatchReplay" and horizon_key in algo:
        steps = min(int(algo[horizon_key]), -(-int(env["max_frame"]) // n_envs))  # a rollout ends by max_frame
        needs.append((f"agent.algorithm.{horizon_key}", 2 * steps * n_envs * step,
                      f"rollout of {steps} steps x {n_envs} sub-envs x {step} bytes, stacked once"))
    obs_dim = int(np.prod(shape.obs_shape, dtype=object))
    if "Conv" in str(net.get("type")) and net.get("conv_hid_layers"):
        conv, fc = list(net["conv_hid_layers"]), list(net.get("fc_hid_layers") or [])
        needs.append(("agent.net.conv_hid_layers", conv_net_bytes(conv, fc, shape.n_actions),
                      f"conv net {conv} + fc {fc} (at least) with gradients and optimizer state"))
        return needs
    needs.append(("agent.net.hid_layers", net_bytes(obs_dim, list(net["hid_layers"]), shape.n_actions),
                  f"net {[obs_dim, *net['hid_layers'], shape.n_actions]} with gradients and optimizer state"))
    return needs


def check_memory(spec: dict[str, Any], shape: EnvShape, sessions: int = 1, available: int | None = None) -> None:
    """Refuse up-front allocations one session cannot hold.

    Args:
        spec: a checked flat spec.
        shape: from ``check_env``.
        sessions: sessions sharing this machine's memory at once (``concurrent_sessions``).
        available: bytes free on the machine (default: ``available_bytes()``).

    Raises:
        SpecError: one problem per key whose allocation (bytes) exceeds the session's share (bytes),
            and one for the total when only the sum does not fit.
    """
    free = available_bytes() if available is None else int(available)
    share = free // max(1, sessions)
    can_use = f"only {fmt_bytes(free)} are available" if sessions <= 1 else \
        f"a session can use {fmt_bytes(share)} ({fmt_bytes(free)} available, shared by {sessions} sessions)"
    needs = memory_needs(spec, shape)
    problems = [f"{key}: {what} needs {fmt_bytes(need)}, but {can_use}" for key, need, what in needs if need > share]
    total = sum(need for _, need, _ in needs)
    if not problems and total > share:
        keys = ", ".join(key for key, _, _ in needs)
        problems.append(f"{keys}: together need {fmt_bytes(total)}, but {can_use}")
    if problems:
        raise SpecError(problems)


# ---------------------------------------------------------------- searched values

def search_extremes(spec: dict[str, Any]) -> list[tuple[str, Any]]:
    """``(dotted path, value)`` of each searched leaf at every value it can take (``choice``,
    ``grid_search``) or at its bounds (``uniform``, ``loguniform``; ``randint`` low and high - 1);
    ``normal`` has none."""
    out = []
    for var in parse_search(spec)[0]:
        if var.kind in ("choice", "grid_search"):
            values = list(var.arg)
        elif var.kind in ("uniform", "loguniform"):
            values = list(var.arg[:2])
        else:
            values = [var.arg[0], var.arg[1] - 1] if var.kind == "randint" else []
        out += [(var.path, value) for value in values]
    return out


def check_search(spec: dict[str, Any], shape: EnvShape, sessions: int) -> None:
    """``check`` and ``check_memory`` of the spec with each searched value of ``search_extremes``, one at
    a time, so a sampled trial cannot fail on a value the search section allows.

    Raises:
        SpecError: each problem prefixed by ``search {path}={value}``.
    """
    problems = []
    for path, value in search_extremes(spec):
        try:
            trial = check(apply_values(spec, {path: value}))
            check_memory(trial, check_env(trial["env"]) if path.startswith("env.") else shape, sessions)
        except SpecError as err:
            problems += [f"search {path}={value!r}: {problem}" for problem in err.problems]
    if problems:
        raise SpecError(problems)


def check_spec(spec: dict[str, Any], mode: str, max_concurrent_trials: int | None = None) -> EnvShape:
    """``check_env`` then ``check_memory`` for a checked spec run in ``mode`` (the part before '@'); in
    ``search``, also ``check_search``.

    Raises:
        SpecError: see ``check_env``, ``check_memory`` and ``check_search``.
    """
    shape = check_env(spec["env"])
    sessions = concurrent_sessions(spec, mode, max_concurrent_trials)
    check_memory(spec, shape, sessions)
    if mode == "search":
        check_search(spec, shape, sessions)
    return shape
