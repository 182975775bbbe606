"""Transfer: ``agent.net.init_from`` initializes a fresh session's nets from another run's checkpoint.

Only the nets' weights are taken (the ``nets`` group of the checkpoint's ``state.pt``, including
trainable tensors an algorithm declared with ``add_tensor``, less those declared ``transfer=False``,
which stay as built: ``Algorithm.transfer_nets``); optimizers,
LR schedulers, the clock and RNG states start fresh. ``init_from`` names one of:

* a session spec file ``{spec_name}_t{T}_s{S}_spec.json`` of a run: that session's best checkpoint
  (highest ``total_reward_ma`` in its manifests);
* a session directory ``{predir}/t{T}/s{S}``: its best checkpoint;
* a checkpoint directory ``{predir}/t{T}/s{S}/ckpt/{frame:012d}``: exactly that checkpoint.

Every net of the new algorithm must exist in the checkpoint with the same layer names and shapes;
otherwise a ``SpecError`` names each net or layer and both shapes (the CLI exits 2). Applied to
fresh sessions only: a session restored from its own checkpoint never reads ``init_from`` again.
"""

from __future__ import annotations

import dataclasses
import io
import re
from typing import Any

import torch

from agents.algorithms import ALGORITHMS, Algorithm
from agents.nets import seq_len_of
from envs.make import make_env
from orchestrator.errors import SpecError
from orchestrator.spec.load import build
from orchestrator.store import storage
from orchestrator.store.checkpoint import MANIFEST_NAME, CheckpointError, CheckpointStore

KEY = "agent.net.init_from"
_CKPT_DIR_RE = re.compile(r"^\d{12}$")


def _session_dir_of_spec_file(uri: str) -> str:
    """Session directory named by a session spec file (``meta.session_dir``, predir-relative).

    Raises:
        SpecError: unreadable, or not a session spec file.
    """
    try:
        spec = storage.read_json(uri)
    except (FileNotFoundError, ValueError, storage.StorageError) as err:
        raise SpecError(f"{KEY}: cannot read session spec file '{uri}': {err}") from None
    rel = spec.get("meta", {}).get("session_dir") if isinstance(spec, dict) else None
    if not isinstance(rel, str):
        raise SpecError(f"{KEY}: '{uri}' is not a session spec file ({{spec_name}}_t{{T}}_s{{S}}_spec.json "
                        "of a run directory)")
    return storage.join(storage.dirname(uri), *rel.split("/"))


def load_checkpoint(source: str) -> tuple[dict[str, bytes], str]:
    """Files of the checkpoint ``init_from`` names, verified, and the checkpoint's URI.

    Reads only; a checkpoint that fails verification is skipped with a warning (best checkpoint) or
    is an error (an explicit checkpoint directory).

    Raises:
        SpecError: ``source`` names nothing usable (says what was expected) or holds no valid checkpoint.
    """
    source = source.rstrip("/")
    try:
        if not storage.is_dir(source) and storage.exists(source):
            session_dir, frame = _session_dir_of_spec_file(source), None
        elif _CKPT_DIR_RE.match(storage.basename(source)) and \
                storage.exists(storage.join(source, MANIFEST_NAME)):
            session_dir, frame = storage.dirname(storage.dirname(source)), int(storage.basename(source))
        elif storage.is_dir(storage.join(source, "ckpt")):
            session_dir, frame = source, None
        else:
            raise SpecError(f"{KEY}: '{source}' is not a session spec file, a session directory (with ckpt/) "
                            "or a checkpoint directory (with MANIFEST.json)")
        store = CheckpointStore(session_dir)
        if frame is not None:
            return store.load(frame)[1], store.frame_uri(frame)
        found = store.load_readonly("best")
    except (CheckpointError, storage.StorageError) as err:
        raise SpecError(f"{KEY}: {err}") from None
    if found is None:
        raise SpecError(f"{KEY}: no committed checkpoint in '{session_dir}'")
    manifest, files = found
    return files, store.frame_uri(manifest.frame)


def net_states(files: dict[str, bytes]) -> dict[str, dict[str, torch.Tensor]]:
    """The ``nets`` group of a checkpoint's ``state.pt``, on CPU (loaded with ``weights_only=True``).

    Raises:
        SpecError: no ``state.pt`` or no nets in it.
    """
    if "state.pt" not in files:
        raise SpecError(f"{KEY}: the checkpoint has no state.pt (files: {sorted(files)})")
    state = torch.load(io.BytesIO(files["state.pt"]), weights_only=True, map_location="cpu")
    nets = state.get("algorithm", {}).get("nets") if isinstance(state, dict) else None
    if not isinstance(nets, dict):
        raise SpecError(f"{KEY}: the checkpoint's state.pt holds no nets")
    return nets


def mismatches(algorithm: Algorithm, nets: dict[str, dict[str, torch.Tensor]], where: str) -> list[str]:
    """Every difference between the algorithm's nets and checkpoint ``nets``, one line each."""
    wanted = algorithm.transfer_nets()
    if not set(wanted) <= set(nets) <= set(algorithm.nets):
        return [f"{KEY}: the checkpoint {where} has nets {sorted(nets)}, this spec builds "
                f"{sorted(algorithm.nets)} (same algorithm and agent.net.shared needed)"]
    problems = []
    for name, net in wanted.items():
        own, theirs = net.state_dict(), nets[name]
        for key in [*own, *(k for k in theirs if k not in own)]:  # state_dict order
            layer = f"{name}.{key}"
            if key not in theirs:
                problems.append(f"{KEY}: layer '{layer}' of this spec is missing in the checkpoint {where}")
            elif key not in own:
                problems.append(f"{KEY}: layer '{layer}' of the checkpoint {where} is not in this spec")
            elif tuple(own[key].shape) != tuple(theirs[key].shape):
                problems.append(f"{KEY}: layer '{layer}' has shape {tuple(theirs[key].shape)} in the "
                                f"checkpoint {where} but {tuple(own[key].shape)} in this spec")
    return problems


def init_nets(algorithm: Algorithm, source: str) -> str:
    """Load the nets of ``algorithm`` from the checkpoint ``source`` names; returns that checkpoint's URI.

    Optimizers, LR schedulers and RNG states are left as built.

    Raises:
        SpecError: see ``load_checkpoint``; or nets/layers/shapes that differ (each named with both shapes).
    """
    files, where = load_checkpoint(source)
    nets = net_states(files)
    problems = mismatches(algorithm, nets, where)
    if problems:
        raise SpecError(problems)
    with torch.no_grad():
        for name, net in algorithm.transfer_nets().items():
            net.load_state_dict({k: v.to(algorithm.device) for k, v in nets[name].items()})
    return where


def check_init_from(spec: dict[str, Any]) -> None:
    """Driver-side check before sessions start: build the algorithm on CPU and load ``init_from``.

    A no-op when ``init_from`` is unset.

    Raises:
        SpecError: as ``init_nets``.
    """
    run = build(spec)
    if not run.agent.net.init_from:
        return
    env = make_env(run.env, None, seq_len=seq_len_of(run.agent.net))
    try:
        with torch.random.fork_rng(devices=[]):
            cpu_agent = dataclasses.replace(run.agent, net=dataclasses.replace(run.agent.net, gpu=False))
            algo = ALGORITHMS[run.agent.algorithm.name](cpu_agent, env.single_observation_space,
                                                        env.single_action_space, run.env.num_envs, 0)
            init_nets(algo, run.agent.net.init_from)
    finally:
        env.close()

