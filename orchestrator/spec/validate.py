"""Spec validation: every problem of a defaults-filled spec, each naming its dotted path and what was expected (types
and ranges from the schema dataclasses' metadata, registered names, sizes, resources, buildable nets and
optimizers)."""

from __future__ import annotations

import dataclasses
import math
import typing
import warnings
from typing import Any

import torch

from agents.algorithms import ALGORITHMS
from agents.algorithms.base import AlgorithmSpec
from agents.memory import MEMORIES, MemorySpec
from agents.nets import (
    ACTIVATIONS,
    GLOBAL_OPTIMIZERS,
    INIT_FNS,
    LOSSES,
    NETS,
    OPTIMIZERS,
    PRECISION_NETS,
    NetSpec,
    arc_problems,
    conv_layer_args,
    make_loss,
    make_optim,
)
from agents.schedules import DECAYS, LR_SCHEDULERS, VarSchedule, lr_factor
from envs import envpool_vec
from envs.make import is_atari, resolve_env_id
from orchestrator.spec.hints import did_you_mean
from orchestrator.spec.pbt import replay_problems as pbt_replay_problems
from orchestrator.spec.schema import (
    AGENT_KEYS,
    MAX_LR,
    RANGE_LIMITS,
    TOP_KEYS,
    reads_critic_net,
    registered,
    section_classes,
    section_defaults,
    type_name,
    type_ok,
    value_at,
    word_problems,
)
from orchestrator.spec.search_space import search_problems
from orchestrator.spec.slm_lab import SLM_LAB_KEYS, slm_lab_key_problem, slm_lab_name_problem
from orchestrator.spec.tracking_keys import tracking_problems


def _check_section(section: Any, cls: type, path: str, problems: list[str]) -> None:
    """Unknown keys (with a suggestion), types and ranges of one section."""
    if not isinstance(section, dict):
        problems.append(f"{path}: expected an object, got {type(section).__name__}")
        return
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for name, f in fields.items():
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required and name not in section:
            problems.append(f"{path}.{name}: required key is missing ({type_name(hints[name])} expected)")
    for key, value in section.items():
        dotted = f"{path}.{key}"
        if key not in fields:
            table_key = dotted.replace("agent.critic_net.", "agent.net.", 1)  # a critic net takes net keys
            if table_key in SLM_LAB_KEYS:
                problem = slm_lab_key_problem(table_key, value)
                problem = problem and problem.replace(table_key, dotted, 1)
                problems.extend([problem] if problem else [])
                continue
            hint = did_you_mean(key, fields) or f"; valid keys: {sorted(fields)}"
            problems.append(f"{dotted}: unknown key{hint}")
            continue
        if not type_ok(value, hints[key]):
            problems.append(f"{dotted}: expected {type_name(hints[key], fields[key].metadata)}, got {value!r}")
            continue
        _check_range(value, fields[key].metadata, dotted, problems)
        _check_range(value, RANGE_LIMITS.get(dotted, {}), dotted, problems)


def _check_range(value: Any, meta: Any, dotted: str, problems: list[str]) -> None:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):  # see _check_finite
        return
    if "words" in meta and isinstance(value, str):  # a number or one of these words (meta.session_batch: "auto")
        return problems.extend(word_problems(value, meta["words"], dotted))
    if "choices" in meta and value not in meta["choices"]:
        problems.append(f"{dotted}: expected one of {list(meta['choices'])}, got {value!r}")
    if "gt" in meta and not value > meta["gt"]:
        problems.append(f"{dotted}: must be > {meta['gt']}, got {value!r}")
    if "ge" in meta and not value >= meta["ge"]:
        problems.append(f"{dotted}: must be >= {meta['ge']}, got {value!r}")
    if "le" in meta and not value <= meta["le"]:
        problems.append(f"{dotted}: must be <= {meta['le']}, got {value!r}")


def _name_checker(problems: list[str]) -> Any:
    """``check(path, value, registry)``: record an unknown registry name with the valid ones."""
    def check(path: str, value: Any, valid: Any) -> None:
        if registered(valid, value) is None:
            problems.append(slm_lab_name_problem(path, value, sorted(valid))
                            or f"{path}: unknown name {value!r}{did_you_mean(str(value), valid)} "
                               f"(expected one of {sorted(valid)})")
    return check


def _check_agent_names(spec: dict[str, Any], problems: list[str]) -> None:
    """Algorithm, net type and memory names, and the memory the algorithm allows."""
    check = _name_checker(problems)
    algo_name = value_at(spec, "agent.algorithm.name")
    check("agent.algorithm.name", algo_name, ALGORITHMS)
    check("agent.net.type", value_at(spec, "agent.net.type"), NETS)
    if reads_critic_net(spec):
        check("agent.critic_net.type", value_at(spec, "agent.critic_net.type"), NETS)
    mem_name = value_at(spec, "agent.memory.name")
    check("agent.memory.name", mem_name, MEMORIES)
    algo_cls = registered(ALGORITHMS, algo_name)
    if algo_cls and registered(MEMORIES, mem_name) and mem_name not in algo_cls.memory_names:
        problems.append(f"agent.memory.name: {algo_name} needs one of "
                        f"{list(ALGORITHMS[algo_name].memory_names)}, got {mem_name!r}")


def algorithm_class(spec: dict[str, Any]) -> Any:
    """The registered algorithm class the spec names, or None."""
    return registered(ALGORITHMS, value_at(spec, "agent.algorithm.name"))


def _optim_paths(spec: dict[str, Any]) -> list[str]:
    """Dotted paths of the optimizer specs the algorithm reads (its ``optim_keys`` under ``agent``)."""
    algo_cls = algorithm_class(spec)
    return [f"agent.{key}" for key in (algo_cls.optim_keys if algo_cls else ("net.optim_spec",))]


def _schedule_paths(spec: dict[str, Any]) -> list[str]:
    """Dotted paths of the variable schedules the algorithm reads (its ``schedule_keys``)."""
    algo_cls = algorithm_class(spec)
    return [f"agent.algorithm.{key}" for key in (algo_cls.schedule_keys if algo_cls else ())]


def _unused_optim_problems(spec: dict[str, Any], problems: list[str]) -> None:
    """An optimizer spec of ``agent.net`` set (to other than its default) that the algorithm does not read."""
    net, paths, defaults = value_at(spec, "agent.net"), _optim_paths(spec), section_defaults(NetSpec)
    for key, value in (net.items() if isinstance(net, dict) and algorithm_class(spec) else []):
        unused = key.endswith("optim_spec") and f"agent.net.{key}" not in paths
        if unused and isinstance(value, dict) and value != defaults.get(key):
            problems.append(f"agent.net.{key}: {value_at(spec, 'agent.algorithm.name')} does not read it; it reads "
                            f"{[p.removeprefix('agent.') for p in paths]}")


def _check_loss_name(spec: dict[str, Any], problems: list[str]) -> None:
    """``agent.net.loss_spec.name``: one of ``LOSSES`` for an algorithm that reads the loss; for one that does not
    (``reads_loss`` false: REINFORCE, Random), any torch.nn loss class, as SLM-Lab builds it and never calls it
    (v4's ``reinforce_cross_entropy_cartpole``: ``CrossEntropyLoss``)."""
    section = value_at(spec, "agent.net.loss_spec")
    if not isinstance(section, dict):
        return
    algo_cls, name = algorithm_class(spec), section.get("name")
    if algo_cls is None or algo_cls.reads_loss:
        _name_checker(problems)("agent.net.loss_spec.name", name, LOSSES)
    elif not (isinstance(name, str) and name.endswith("Loss") and isinstance(getattr(torch.nn, name, None), type)):
        problems.append(f"agent.net.loss_spec.name: expected a torch.nn loss class name (unread by "
                        f"{value_at(spec, 'agent.algorithm.name')}), got {name!r}")


def _check_component_names(spec: dict[str, Any], problems: list[str]) -> None:
    """Optimizer, loss, LR scheduler and variable schedule names (and optimizer learning rates)."""
    check = _name_checker(problems)
    for path in _optim_paths(spec):
        optim = value_at(spec, path)
        if isinstance(optim, dict):
            check(f"{path}.name", optim.get("name"), OPTIMIZERS)
            if optim.get("name") in GLOBAL_OPTIMIZERS and value_at(spec, "meta.distributed") in (False, None):
                problems.append(f"{path}.name: {optim['name']!r} is SLM-Lab's optimizer of meta.distributed training "
                                f"(one global net per trial); set meta.distributed to 'synced' or 'shared', or use "
                                f"{optim['name'].removeprefix('Global')!r}")
            lr = optim.get("lr", 1e-3)
            if not type_ok(lr, float) or lr < 0:
                problems.append(f"{path}.lr: expected a number >= 0, got {lr!r}")
            elif lr > MAX_LR:
                problems.append(f"{path}.lr: must be <= {MAX_LR:g} (larger steps diverge at once), got {lr!r}")
    _unused_optim_problems(spec, problems)
    _check_loss_name(spec, problems)
    section = value_at(spec, "agent.net.lr_scheduler_spec")
    if isinstance(section, dict):
        check("agent.net.lr_scheduler_spec.name", section.get("name"), LR_SCHEDULERS)
    for path in _schedule_paths(spec):
        value = value_at(spec, path)
        if isinstance(value, dict):
            check(f"{path}.name", value.get("name", "no_decay"), DECAYS)


def _check_env_name(spec: dict[str, Any], problems: list[str]) -> None:
    """The env id resolves to a registered gymnasium env (an EnvPool task with ``vectorization: envpool``)."""
    env_name = value_at(spec, "env.name")
    if not isinstance(env_name, str):
        problems.append(f"env.name: expected a gymnasium env id string, got {env_name!r}")
        return
    envpool = value_at(spec, "env.vectorization") == envpool_vec.VECTORIZATION
    if env_name.startswith(envpool_vec.PLAYGROUND_PREFIX) and not envpool:
        problems.append(f"env.vectorization: env '{env_name}' (MuJoCo Playground) runs only through EnvPool; "
                        f"expected 'envpool', got {value_at(spec, 'env.vectorization')!r}")
        return
    try:
        env_id = envpool_vec.resolve_envpool_id(env_name) if envpool else resolve_env_id(env_name)
    except ValueError as err:
        ale = env_name.startswith("ALE/") or "NoFrameskip" in env_name
        problems.append(f"env.name: {err}" + ("; Atari envs need: pip install ale-py" if ale and not envpool else ""))
        return
    if not (envpool_vec.is_envpool_atari(env_id) if envpool else is_atari(env_id)):
        env = spec["env"]
        for key, neutral in (("life_loss_info", (None, False)), ("repeat_action_probability", (None,)),
                             ("noop_max", (30,)), ("frame_skip", (4,))):
            if env.get(key, neutral[0]) not in neutral:
                problems.append(f"env.{key}: applies to Atari (ALE) envs only, not '{env_id}'")


def _int_at(spec: dict[str, Any], path: str) -> int | None:
    """The int at ``path``, or None when it is missing or not an int (then reported elsewhere)."""
    value = value_at(spec, path)
    return value if type_ok(value, int) else None


def _check_autoreset(spec: dict[str, Any], problems: list[str]) -> None:
    """``env.autoreset: next_step`` (SLM-Lab's vector stepping) does not combine with a RecurrentNet, whose
    observation windows (``envs.wrappers.ObsWindow``) start a new episode on the done step itself."""
    if value_at(spec, "env.autoreset") == "next_step" and value_at(spec, "agent.net.type") == "RecurrentNet":
        problems.append("env.autoreset: 'next_step' does not work with agent.net.type RecurrentNet (its observation "
                        "windows assume 'same_step'); expected env.autoreset: same_step")


def _check_sizes(spec: dict[str, Any], problems: list[str]) -> None:
    """Cross-key size rules: the training start fits in the replay (Replay memory, or SIL's replay beside its
    on-policy memory: on-policy memories ignore ``batch_size``/``max_size``), and one vector step fits in the frame
    budget. A sample larger than the replay is a warning, not a problem: it repeats transitions, drawn uniformly
    with replacement as in SLM-Lab's ``Replay.sample_idxs`` (SLM-Lab v4's ``base_memory``: 32 of 5)."""
    max_size = _int_at(spec, "agent.memory.max_size")
    replay = value_at(spec, "agent.memory.name") == "Replay" or getattr(algorithm_class(spec), "sil_replay", False)
    if replay and max_size is not None and max_size > 0:
        batch = _int_at(spec, "agent.memory.batch_size")
        if batch is not None and batch > max_size:
            warnings.warn(f"agent.memory.batch_size: {batch} transitions per sample exceed the replay's capacity "
                          f"agent.memory.max_size={max_size}, so every sample repeats transitions (drawn uniformly "
                          "with replacement, as SLM-Lab's Replay)", stacklevel=2)
        start = _int_at(spec, "agent.algorithm.training_start_step")
        if start is not None and start > max_size:
            problems.append(f"agent.algorithm.training_start_step: {start} transitions can never be stored in a "
                            f"replay of agent.memory.max_size={max_size}, so training would never start; "
                            "expected training_start_step <= max_size")
    num_envs, max_frame = _int_at(spec, "env.num_envs"), _int_at(spec, "env.max_frame")
    if num_envs is not None and max_frame is not None and num_envs > max_frame > 0:
        problems.append(f"env.num_envs: one vector step of {num_envs} sub-envs is {num_envs} frames, more than "
                        f"the whole budget env.max_frame={max_frame}; expected num_envs <= max_frame")


RESOURCE_KEYS = ("num_cpus", "num_gpus")


NET_FIELDS = {f.name for f in dataclasses.fields(NetSpec)}


MAX_RESOURCE = 2**20  # CPUs or GPUs per session: more than any machine has (torch threads overflow at 2**31)


def _check_resources(spec: dict[str, Any], problems: list[str]) -> None:
    """``meta.resources``: only ``num_cpus`` and ``num_gpus``, each a number in [0, ``MAX_RESOURCE``] per session."""
    res = value_at(spec, "meta.resources")
    if not isinstance(res, dict):
        return  # a non-dict is reported by the meta section's type check
    for key, value in res.items():
        path = f"meta.resources.{key}"
        if key not in RESOURCE_KEYS:
            problems.append(f"{path}: unknown key" + (did_you_mean(key, RESOURCE_KEYS)
                                                      or f"; valid keys: {list(RESOURCE_KEYS)}"))
        elif not type_ok(value, float) or not 0 <= value <= MAX_RESOURCE:
            unit = "CPUs" if key == "num_cpus" else "GPUs"
            problems.append(f"{path}: expected a number in [0, {MAX_RESOURCE}] ({unit} per session), got {value!r}")


SEARCH_RESOURCE_KEYS = ("cpu", "gpu")
MAX_IMAGE_SIDE = 1024  # env.image_downsize: a frame side above ALE's 210 x 160 screen is only an upscale


def _check_image_downsize(spec: dict[str, Any], problems: list[str]) -> None:
    """``env.image_downsize``: null or [width, height], two positive ints (SLM-Lab v4's Atari frame size)."""
    size = value_at(spec, "env.image_downsize")
    if size is not None and not (isinstance(size, list) and len(size) == 2 and
                                 all(type_ok(v, int) and 0 < v <= MAX_IMAGE_SIDE for v in size)):
        problems.append(f"env.image_downsize: expected [width, height], two ints in [1, {MAX_IMAGE_SIDE}] (SLM-Lab "
                        f"v4's Atari frame size), got {size!r}")


def _check_slm_lab_meta(spec: dict[str, Any], problems: list[str]) -> None:
    """SLM-Lab meta keys with a meaning of their own: ``distributed``, v4's ``search``, ``search_resources``."""
    meta = spec.get("meta") if isinstance(spec.get("meta"), dict) else {}
    dist = meta.get("distributed", False)
    if dist not in (False, "synced", "shared"):
        problems.append(f"meta.distributed: expected false, 'synced' or 'shared', got {dist!r}")
    if meta.get("search") not in (None, "RandomSearch"):
        problems.append(f"meta.search: SLM-Lab v4's search algorithm {meta['search']!r} is not supported; expected "
                        "'RandomSearch' (or leave it out; --search-alg picks the sampler)")
    res = meta.get("search_resources")
    for key, value in (res.items() if isinstance(res, dict) else ()):
        if key not in SEARCH_RESOURCE_KEYS:
            problems.append(f"meta.search_resources.{key}: unknown key; valid keys: {list(SEARCH_RESOURCE_KEYS)}")
        elif not type_ok(value, float) or not 0 <= value <= MAX_RESOURCE:
            problems.append(f"meta.search_resources.{key}: expected a number in [0, {MAX_RESOURCE}] per trial, "
                            f"got {value!r}")
    net = value_at(spec, "agent.net") if isinstance(value_at(spec, "agent.net"), dict) else {}
    for key in ("actor_init_std", "critic_init_std"):
        if net.get(key) is not None and net.get("init_fn") != "orthogonal_" and key not in NET_FIELDS:
            problems.append(f"agent.net.{key}: SLM-Lab's head init std applies only with init_fn 'orthogonal_' here "
                            f"(the lab's gains 0.01 policy / 1 value), got init_fn {net.get('init_fn')!r}")


def _check_finite(tree: Any, path: str, problems: list[str]) -> None:
    """NaN and infinities anywhere (Python's JSON reader accepts ``NaN``/``Infinity``): no spec value
    is meant to be one, and they turn into NaN weights instead of an error."""
    if isinstance(tree, float) and not math.isfinite(tree):
        problems.append(f"{path}: expected a finite number, got {tree!r}")
    elif isinstance(tree, dict):
        for key, value in tree.items():
            _check_finite(value, f"{path}.{key}" if path else str(key), problems)
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            _check_finite(value, f"{path}[{i}]", problems)


def _check_names(spec: dict[str, Any], problems: list[str]) -> None:
    """Registry names: algorithm, net, memory, optimizers, losses, schedules, env id."""
    _check_agent_names(spec, problems)
    problems += pbt_replay_problems(spec, registered(MEMORIES, value_at(spec, "agent.memory.name")))
    _check_component_names(spec, problems)
    _check_env_name(spec, problems)


def _try_build(problems: list[str], path: str, build_fn: Any, *args: Any) -> None:
    """Record ``path: message`` if building a registered object from spec arguments fails."""
    try:
        build_fn(*args)
    except (ValueError, TypeError, ArithmeticError) as err:
        problems.append(f"{path}: cannot build from {args[-1]!r}: {err}")


def _check_layers(net: dict[str, Any], problems: list[str], path: str = "agent.net", role_arcs: bool = False) -> None:
    """``hid_layers`` / ``fc_hid_layers``: positive ints; ``conv_hid_layers``: [out, kernel, stride, padding,
    dilation] lists (``agents.nets.conv_layer_args``); ``arc`` of a TorchArcNet: a spec torcharc builds, or, for an
    algorithm with ``role_arcs``, ``actor_arc`` / ``critic_arc`` in its place (``agents.nets.role_spec``; refused
    for the other algorithms); a ``RecurrentNet``'s ``rnn_hidden_size`` and ``seq_len``."""
    for key in ("hid_layers", "fc_hid_layers"):
        hid = net.get(key)
        if isinstance(hid, list) and not all(type_ok(h, int) and h > 0 for h in hid):
            problems.append(f"{path}.{key}: expected a list of positive ints, got {hid!r}")
    for i, layer in enumerate(net.get("conv_hid_layers") or []):
        try:
            conv_layer_args(layer if isinstance(layer, list) else [layer])
        except ValueError as err:
            problems.append(f"{path}.conv_hid_layers[{i}]: {err}")
    _check_arcs(net, problems, path, role_arcs)
    if net.get("precision", "float32") != "float32" and net.get("type") not in PRECISION_NETS:
        problems.append(f"{path}.precision: {net['precision']!r} is read by net types {list(PRECISION_NETS)} "
                        f"only, not {net.get('type')!r}; use 'float32'")
    for key in ("rnn_hidden_size", "seq_len") if net.get("type") == "RecurrentNet" else ():
        if net.get(key) is None:
            problems.append(f"{path}.{key}: net.type RecurrentNet needs it (a positive int; SLM-Lab has no default)")


def _check_arcs(net: dict[str, Any], problems: list[str], path: str, role_arcs: bool) -> None:
    """A TorchArcNet's body specs (see ``_check_layers``): each net it builds has one, and each one torcharc builds."""
    arcs = {key: net.get(key) for key in ("arc", "actor_arc", "critic_arc")}
    if not role_arcs:
        readers = sorted(name for name, cls in ALGORITHMS.items() if cls.role_arcs)
        for key in ("actor_arc", "critic_arc"):
            if arcs.pop(key) is not None:
                problems.append(f"{path}.{key}: read only by the actor-critic algorithms {readers} (the {key[:-4]}'s "
                                f"TorchArcNet body, as SLM-Lab's ActorCritic); expected no {key} here")
    if net.get("type") != "TorchArcNet":
        return
    roles = ("actor",) if net.get("shared") else ("actor", "critic")
    missing = [role for role in roles if arcs["arc"] is None and arcs.get(f"{role}_arc") is None]
    if missing and role_arcs:
        problems.append(f"{path}.arc: net.type TorchArcNet needs a torcharc spec {{modules, graph}}, or "
                        f"{' and '.join(f'{role}_arc' for role in missing)}")
    elif missing:
        problems.append(f"{path}.arc: net.type TorchArcNet needs a torcharc spec {{modules, graph}}")
    for key, arc in arcs.items():
        if isinstance(arc, dict):  # another type is reported by the section's type check
            problems += [p.replace("agent.net.arc", f"{path}.{key}", 1) for p in arc_problems(arc)]


def _check_build_args(spec: dict[str, Any], problems: list[str]) -> None:
    """What only a constructor can check: net activations/init/widths, schedule steps, and the
    keyword arguments of optimizers and LR schedulers (built once on a dummy parameter)."""
    net = value_at(spec, "agent.net") if isinstance(value_at(spec, "agent.net"), dict) else {}
    algo_cls = algorithm_class(spec)
    _check_net_build_args(net, "agent.net", problems, role_arcs=bool(algo_cls and algo_cls.role_arcs))
    if reads_critic_net(spec):
        _check_net_build_args(value_at(spec, "agent.critic_net"), "agent.critic_net", problems)
    for path in _schedule_paths(spec):
        value = value_at(spec, path)
        if isinstance(value, dict) and registered(DECAYS, value.get("name", "no_decay")):
            _try_build(problems, path, VarSchedule.from_spec, value)
    for path in _optim_paths(spec):
        optim = value_at(spec, path)
        known = isinstance(optim, dict) and registered(OPTIMIZERS, optim.get("name"))
        if known and type_ok(optim.get("lr", 0), float) and 0 <= optim.get("lr", 0) <= MAX_LR:  # else reported
            _try_build(problems, path, _check_optim_args, optim)


def _check_net_build_args(net: dict[str, Any], path: str, problems: list[str], role_arcs: bool = False) -> None:
    """A net section's activations, init, layers, loss and LR scheduler (built once on a dummy parameter);
    ``role_arcs``: the algorithm reads ``actor_arc`` / ``critic_arc`` (``_check_layers``)."""
    for key, valid in (("hid_layers_activation", ACTIVATIONS), ("out_layer_activation", ACTIVATIONS),
                       ("init_fn", INIT_FNS)):
        if net.get(key) is not None and registered(valid, net[key]) is None:
            problems.append(f"{path}.{key}: unknown name {net[key]!r}{did_you_mean(str(net[key]), valid)} "
                            f"(expected one of {sorted(valid)})")
    _check_layers(net, problems, path, role_arcs)
    loss = net.get("loss_spec")
    if isinstance(loss, dict) and registered(LOSSES, loss.get("name")):
        _try_build(problems, f"{path}.loss_spec", make_loss, loss)
    sched = net.get("lr_scheduler_spec")
    if isinstance(sched, dict) and registered(LR_SCHEDULERS, sched.get("name")):
        _try_build(problems, f"{path}.lr_scheduler_spec", lambda spec: lr_factor(spec)(0), sched)


def _check_optim_args(optim_spec: dict[str, Any]) -> None:
    """Build the optimizer of ``optim_spec`` on an empty parameter list: torch's optimizers check
    their arguments before their parameters, and this never calls ``add_param_group``, whose first
    call imports ``torch._dynamo`` (1 to 4 s of the driver's start-up on 2 cores).

    Raises:
        ValueError / TypeError: a bad argument (anything but torch's "empty parameter list").
    """
    try:
        make_optim([], optim_spec)
    except ValueError as err:
        if "empty parameter list" not in str(err):
            raise


def _check_agent_keys(agent: dict[str, Any], problems: list[str]) -> None:
    """Keys of the ``agent`` section: its sections, ``name``, and SLM-Lab's agent-level keys (``critic_net``)."""
    for key in agent:
        if f"agent.{key}" in SLM_LAB_KEYS:
            problem = slm_lab_key_problem(f"agent.{key}", agent[key])
            problems.extend([problem] if problem else [])
        elif key not in AGENT_KEYS:
            problems.append(f"agent.{key}: unknown key" + (did_you_mean(key, AGENT_KEYS) or _section_hint(key)))


def _section_hint(key: str) -> str:
    """``"; did you mean 'agent.net.optim_spec'?"`` for an agent-level key that is a key of one of its sections
    (``agent.optim_spec``), else ''."""
    for section, cls in (("net", NetSpec), ("algorithm", AlgorithmSpec), ("memory", MemorySpec)):
        if key in {f.name for f in dataclasses.fields(cls)}:
            return f"; did you mean 'agent.{section}.{key}'?"
    return ""


def validate(spec: dict[str, Any]) -> list[str]:
    """Every problem of a defaults-filled flat spec, each prefixed by its dotted path."""
    problems: list[str] = []
    for key in spec:
        if key not in TOP_KEYS:
            problems.append(f"{key}: unknown top-level key" + did_you_mean(key, TOP_KEYS))
    agent = spec.get("agent")
    if not isinstance(agent, dict):
        return problems + [f"agent: expected an object with {list(AGENT_KEYS[1:])}, got {agent!r}"]
    _check_agent_keys(agent, problems)
    if "critic_net" in agent and not isinstance(agent["critic_net"], dict):
        problems.append(f"agent.critic_net: expected an object (a net spec), got {agent['critic_net']!r}")
    elif "critic_net" in agent and not reads_critic_net(spec) and algorithm_class(spec) is not None:
        problems.append(f"agent.critic_net: {value_at(spec, 'agent.algorithm.name')} does not read it (a separate "
                        f"critic net spec, read by SoftActorCritic and CrossQ); expected no agent.critic_net")
    if not isinstance(spec.get("env"), dict):
        return problems + [f"env: expected an object, got {spec.get('env')!r}"]
    known_algo = registered(ALGORITHMS, value_at(spec, "agent.algorithm.name")) is not None
    for path, cls in section_classes(spec).items():
        if path != "agent.algorithm" or known_algo:  # an unknown algorithm has no key set to check
            _check_section(value_at(spec, path), cls, path, problems)
    _check_names(spec, problems)
    _check_build_args(spec, problems)
    _check_sizes(spec, problems)
    _check_autoreset(spec, problems)
    _check_image_downsize(spec, problems)
    _check_resources(spec, problems)
    _check_slm_lab_meta(spec, problems)
    _check_finite(spec, "", problems)
    if not isinstance(spec.get("search"), dict):
        problems.append(f"search: expected an object, got {spec.get('search')!r}")
    else:
        problems += search_problems(spec)
    problems += tracking_problems(spec.get("meta"))
    return problems


