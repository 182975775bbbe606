"""Run directories (predirs): naming, lookup and the spec files saved in them (docs/ARCHITECTURE.md section 3).

``{data_dir}/{spec_name}_{YYYY_MM_DD_HHMMSS}/`` holds ``{spec_name}_spec.json`` (the spec as run),
``{spec_name}_t{T}_spec.json`` per trial, ``{spec_name}_t{T}_s{S}_spec.json`` per session (the
``enjoy@`` target), and ``t{T}/s{S}/`` per session. Paths stored in a run are predir-relative.
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
    """The spec name part of a predir's basename (``{spec_name}_{ts}``).

    Raises:
        ValueError: the name does not end in a timestamp.
    """
    m = re.match(rf"^(.+)_({TS_RE})$", storage.basename(predir))
    if not m:
        raise ValueError(f"'{predir}' is not a run directory named {{spec_name}}_{{YYYY_MM_DD_HHMMSS}}")
    return m.group(1)


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
