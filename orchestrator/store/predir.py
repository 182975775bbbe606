"""Run directories (predirs): naming, lookup and the spec files saved in them (docs/ARCHITECTURE.md section 3).

``{data_dir}/{spec_name}_{YYYY_MM_DD_HHMMSS}/`` holds ``{spec_name}_spec.json`` (the spec as run),
``{spec_name}_t{T}_spec.json`` per trial, ``{spec_name}_t{T}_s{S}_spec.json`` per session (the
``enjoy@`` target), and ``t{T}/s{S}/`` per session. Paths stored in a run are predir-relative.
A run started with ``--name RUN`` lives in ``{data_dir}/{RUN}`` instead. ``overrides.json`` holds the ``-s``
overrides the run was started with (``{"overrides": ["key=value", ...]}``); resumes apply them again.
"""

from __future__ import annotations

import copy
import re
import time
from datetime import datetime
from typing import Any

from orchestrator.errors import UsageError
from orchestrator.store import storage

TS_FORMAT = "%Y_%m_%d_%H%M%S"
TS_RE = r"\d{4}_\d{2}_\d{2}_\d{6}"


def session_seed(base_seed: int, trial: int, session: int) -> int:
    """Seed of session ``session`` of trial ``trial``: ``base_seed + 1000 * trial + session``."""
    return int(base_seed) + 1000 * int(trial) + int(session)


def new_predir(data_dir: str, spec_name: str) -> str:
    """Create and return a fresh predir URI ``{data_dir}/{spec_name}_{ts}``.

    Never reuses an existing directory: if the timestamp is taken, waits for the next second.

    Raises:
        storage.StorageError: the data dir is not writable.
    """
    while True:
        predir = storage.join(data_dir, f"{spec_name}_{datetime.now().strftime(TS_FORMAT)}")
        if not storage.exists(predir):
            storage.makedirs(predir)
            return predir
        time.sleep(0.2)


def latest_predir(data_dir: str, spec_name: str) -> str | None:
    """Newest predir named exactly ``{spec_name}_{ts}`` by timestamp, or None."""
    pattern = re.compile(rf"^{re.escape(spec_name)}_({TS_RE})$")
    stamped = [(m.group(1), name) for name in storage.listdir(data_dir) if (m := pattern.match(name))]
    if not stamped:
        return None
    return storage.join(data_dir, max(stamped)[1])


def spec_name_of(predir: str) -> str:
    """The spec name of a run: the part of its basename before the timestamp (``{spec_name}_{ts}``), or for a
    run named with ``--name``, the name of its one ``{spec_name}_spec.json``.

    Raises:
        ValueError: the name does not end in a timestamp and the directory holds no single experiment spec.
    """
    m = re.match(rf"^(.+)_({TS_RE})$", storage.basename(predir))
    if m:
        return m.group(1)
    names = sorted({n[:-len("_spec.json")] for n in storage.listdir(predir) if n.endswith("_spec.json")}, key=len)
    # the others are that spec's trial, session and best-trial files: {spec_name}_t0_spec.json, ...
    if not names or not all(n.startswith(f"{names[0]}_") for n in names[1:]):
        raise ValueError(f"'{predir}' is not a run directory named {{spec_name}}_{{YYYY_MM_DD_HHMMSS}} "
                         "and holds no single {spec_name}_spec.json")
    return names[0]


RUN_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


def named_predir(data_dir: str, name: str) -> str:
    """The predir ``{data_dir}/{name}`` of ``--name name``.

    Raises:
        UsageError: ``name`` is not a plain directory name (letters, digits, ``.``, ``_``, ``-``; not starting
            with ``.``, ``_`` or ``-``; at most 200 characters).
    """
    if not RUN_NAME_RE.match(name):
        raise UsageError(f"--name '{name}': expected a plain directory name (letters, digits, '.', '_', '-', "
                         "starting with a letter or digit, at most 200 characters), e.g. --name $SLURM_JOB_ID")
    return storage.join(data_dir, name)


def has_run(predir: str) -> bool:
    """True if ``predir`` holds a started run (an experiment spec file), False if it is absent or empty."""
    return storage.is_dir(predir) and any(n.endswith("_spec.json") for n in storage.listdir(predir))


OVERRIDES_NAME = "overrides.json"


def save_overrides(predir: str, overrides: list[str]) -> None:
    """Record the ``-s`` overrides a run was started with (``{predir}/overrides.json``).

    Raises:
        storage.StorageError: the write failed.
    """
    storage.write_json(storage.join(predir, OVERRIDES_NAME), {"overrides": list(overrides)})


def saved_overrides(predir: str) -> list[str]:
    """The ``-s`` overrides ``predir`` was started with ([] for a run started before they were recorded).

    Raises:
        UsageError: ``overrides.json`` is damaged (names the file and the fix).
    """
    uri = storage.join(predir, OVERRIDES_NAME)
    try:
        data = storage.read_json(uri)
    except FileNotFoundError:
        return []
    except (ValueError, UnicodeDecodeError) as err:
        data = err
    if not (isinstance(data, dict) and isinstance(data.get("overrides"), list)
            and all(isinstance(x, str) for x in data["overrides"])):
        raise UsageError(f"{uri} is damaged: expected {{\"overrides\": [\"key=value\", ...]}}, the -s overrides "
                         "the run was started with; fix it (or delete it to apply none)")
    return list(data["overrides"])


def session_dir(predir: str, trial: int, session: int) -> str:
    """``{predir}/t{T}/s{S}``."""
    return storage.join(predir, f"t{trial}", f"s{session}")


def spec_file(predir: str, spec_name: str, trial: int | None = None, session: int | None = None) -> str:
    """URI of the experiment, trial or session spec file in a predir."""
    suffix = "" if trial is None else f"_t{trial}" + ("" if session is None else f"_s{session}")
    return storage.join(predir, f"{spec_name}{suffix}_spec.json")


def session_spec(spec: dict[str, Any], trial: int, session: int, seed: int) -> dict[str, Any]:
    """The spec of one session: the run's spec plus its indices, seed and predir-relative dir."""
    out = copy.deepcopy(spec)
    out["meta"] = {**out["meta"], "trial": trial, "session": session, "session_seed": seed,
                   "session_dir": f"t{trial}/s{session}"}
    return out


def save_specs(predir: str, spec: dict[str, Any], trial: int, seeds: list[int]) -> None:
    """Write the experiment, trial and per-session spec files of a run."""
    name = spec["name"]
    storage.write_json(spec_file(predir, name), spec)
    storage.write_json(spec_file(predir, name, trial), {**spec, "meta": {**spec["meta"], "trial": trial}})
    for s, seed in enumerate(seeds):
        storage.write_json(spec_file(predir, name, trial, s), session_spec(spec, trial, s, seed))


def read_json_file(uri: str, what: str) -> Any:
    """Parse a JSON file a resume depends on.

    Raises:
        UsageError: the file is missing or damaged (names it and ``what`` it is).
        storage.StorageError: the store cannot be read.
    """
    try:
        return storage.read_json(uri)
    except FileNotFoundError:
        raise UsageError(f"{what} {uri} is missing") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise UsageError(f"{what} {uri} is damaged (not valid JSON: {err}); restore it from a copy") from None
