"""The session spec file of ``enjoy@{session_spec_file}[@latest|@best]``: its target and its checked spec."""

from __future__ import annotations

from typing import Any

from orchestrator.errors import UsageError
from orchestrator.spec.files import RUNTIME_META_KEYS
from orchestrator.spec.load import check
from orchestrator.store import storage


def parse_target(target: str | None, ckpt: str | None) -> tuple[str, str]:
    """Session spec URI and checkpoint choice (``best``/``latest``) of ``enjoy@{file}[@latest|@best]``, from its
    ``target`` (``{file}[@latest|@best]``, None for a bare ``enjoy``) and ``--ckpt``.

    Raises:
        UsageError: no file given, or ``--ckpt`` contradicts the suffix.
    """
    target = target or ""
    suffix = None
    for which in ("best", "latest"):
        if target.endswith(f"@{which}"):
            target, suffix = target[: -len(which) - 1], which
    if not target:
        raise UsageError("enjoy needs a session spec file: enjoy@{predir}/{spec_name}_t{T}_s{S}_spec.json")
    if suffix and ckpt and suffix != ckpt:
        raise UsageError(f"enjoy@...@{suffix} contradicts --ckpt {ckpt}")
    return storage.absolute(target), suffix or ckpt or "best"


def read_session_spec(uri: str, spec_name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The checked spec (CPU, sync envs) and the session meta of a session spec file.

    Raises:
        UsageError: the file is missing or is not a session spec file of ``spec_name``.
        SpecError: the saved spec does not validate.
    """
    try:
        raw = storage.read_json(uri)
    except FileNotFoundError:
        raise UsageError(f"enjoy: session spec file '{uri}' does not exist") from None
    except ValueError as err:
        raise UsageError(f"enjoy: '{uri}' is not valid JSON: {err}") from None
    meta = raw.get("meta", {}) if isinstance(raw, dict) else {}
    if not isinstance(meta.get("session_dir"), str):
        raise UsageError(f"enjoy: '{uri}' is not a session spec file ({{spec_name}}_t{{T}}_s{{S}}_spec.json)")
    if raw.get("name") != spec_name:
        raise UsageError(f"enjoy: '{uri}' is a session of '{raw.get('name')}', not of '{spec_name}'")
    session_meta = {k: meta[k] for k in RUNTIME_META_KEYS}
    spec = {**raw, "meta": {k: v for k, v in meta.items() if k not in RUNTIME_META_KEYS}}
    spec["agent"]["net"]["gpu"] = False  # runs on CPU even if the checkpoint came from a GPU
    if not str(spec["env"].get("name")).startswith("playground/"):  # only EnvPool has those: replayed there
        spec["env"]["vectorization"] = "sync"
    return check(spec), session_meta


