"""``lab ls``: the runs of a data dir with status per session, frames, best return and resumability.

Read-only. Per session the frame is its newest committed checkpoint's (the point a resume starts
from), the status comes from ``run.json``, and the best return is the highest ``total_reward_ma`` of
its committed checkpoints' manifests. A run is resumable (``train@{predir}``) when some session is
below ``env.max_frame`` and each such session has a committed checkpoint; with sessions lacking one,
only with ``--allow-fresh``. ``dev`` runs (run.json ``"mode": "dev"``) write no checkpoints and are
never resumable.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from orchestrator.report.rundata import no_episode_note, session_keys
from orchestrator.spec.meta import MetaSpec
from orchestrator.store import predir as predir_mod
from orchestrator.store import storage
from orchestrator.store.checkpoint import CheckpointError, CheckpointStore


@dataclass(frozen=True)
class SessionInfo:
    """One session of a run: ``key`` (``t0_s1``), ``status``, committed ``frame`` (frames), ``best``
    ``total_reward_ma`` (None before any episode), ``has_checkpoint``."""

    key: str
    status: str
    frame: int
    best: float | None
    has_checkpoint: bool


@dataclass(frozen=True)
class RunInfo:
    """One run: its predir name, spec name, ``max_frame`` (frames), sessions, resumability, the spec's env section
    and when it was created (run.json ``created``, ISO 8601; '' where unknown)."""

    name: str
    spec_name: str
    max_frame: int
    sessions: list[SessionInfo]
    resumable: str
    env: dict[str, Any]
    created: str

    @property
    def best(self) -> float | None:
        """Best ``total_reward_ma`` over the sessions."""
        scores = [s.best for s in self.sessions if s.best is not None]
        return max(scores) if scores else None


def session_info(predir: str, key: str, run: dict[str, Any], max_frame: int | None = None) -> SessionInfo:
    """Status, committed frame and best checkpoint score of session ``key`` (``t{T}_s{S}``). A session ``done`` at a
    frame below ``max_frame`` (frames) is ``paused``: it ended a part of the run (a PBT generation) or a run whose
    ``env.max_frame`` was raised since, and continues when the run is resumed."""
    t, s = (int(x) for x in re.fullmatch(r"t(\d+)_s(\d+)", key).groups())
    store = CheckpointStore(predir_mod.session_dir(predir, t, s))
    ranked = store.ranked("best")
    best = None
    if ranked:
        try:
            best = store.manifest(ranked[0]).meta.get("total_reward_ma")
        except CheckpointError:
            best = None
    entry = run.get("sessions", {}).get(key, {})
    frame = max(ranked) if ranked else int(entry.get("frame") or 0)
    dev = is_dev(run)
    status = entry.get("status") or ("dev" if dev else "not started")
    df_uri = storage.join(predir_mod.session_dir(predir, t, s), "train_df.parquet")
    if not ranked and (dev or not entry) and storage.exists(df_uri):  # a dev run: its train_df is all there is
        df = storage.read_parquet(df_uri)
        if len(df):
            frame = int(df["frame"].iloc[-1])
            best = None if df["total_reward_ma"].isna().all() else float(df["total_reward_ma"].max())
    if status == "done" and max_frame is not None and frame < max_frame:
        status = "paused"
    return SessionInfo(key, status, frame, best, bool(ranked))


def is_dev(run: dict[str, Any]) -> bool:
    """True for the run.json of a ``dev`` run (``"mode": "dev"``), or none at all (dev runs written
    before that marker had no run.json)."""
    return not run or run.get("mode") == "dev"


def resumability(sessions: list[SessionInfo], max_frame: int, dev: bool) -> str:
    """``yes``, ``with --allow-fresh`` or ``no (why)`` for ``train@{predir}``."""
    if dev:
        return "no (dev run: no checkpoints)"
    unfinished = [s for s in sessions if s.frame < max_frame]
    if not unfinished:
        return "no (complete; raise env.max_frame to continue)"
    if all(s.has_checkpoint for s in unfinished):
        return "yes"
    return "with --allow-fresh"


def run_info(predir: str) -> RunInfo | None:
    """Describe one run directory; None if it is not one (no ``{spec_name}_spec.json``)."""
    try:
        spec_name = predir_mod.spec_name_of(predir)
    except ValueError:
        return None
    spec_uri = predir_mod.spec_file(predir, spec_name)
    if not storage.exists(spec_uri):
        return None
    spec = storage.read_json_or_none(spec_uri, "run left out of the listing")
    if not isinstance(spec, dict) or not isinstance(spec.get("env"), dict) or not isinstance(spec.get("meta"), dict):
        return None
    run = storage.read_json_or_none(storage.join(predir, "run.json"),
                                    "status from the checkpoints only (train@ rebuilds it)")
    run = run if isinstance(run, dict) else {}
    keys = set(run.get("sessions", {}))
    keys |= {f"t0_s{s}" for s in range(int(MetaSpec.of(spec).max_session))}
    keys |= {f"t{t}_s{s}" for t, s in session_keys(predir)}
    max_frame = int(spec["env"]["max_frame"])
    sessions = [session_info(predir, key, run, max_frame) for key in sorted(keys, key=_key_order)]
    return RunInfo(storage.basename(predir), spec_name, max_frame, sessions,
                   resumability(sessions, max_frame, is_dev(run)), spec["env"], str(run.get("created", "")))


def _key_order(key: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", key))


def list_runs(data_dir: str) -> list[RunInfo]:
    """Every run directory directly under ``data_dir``, oldest first: by run.json's ``created`` time, timestamped
    and ``--name`` runs alike (a run without one: by the timestamp in its name, else last), then by name."""
    entries = storage.listdir(data_dir)
    names = [n for n in entries if re.search(rf"_{predir_mod.TS_RE}$", n)
             or (predir_mod.RUN_NAME_RE.match(n) and predir_mod.has_run(storage.join(data_dir, n)))]
    infos = [info for info in (run_info(storage.join(data_dir, n)) for n in names) if info is not None]
    return sorted(infos, key=lambda info: (info.created or _name_time(info.name), info.name))


def _name_time(name: str) -> str:
    """The ``YYYY-MM-DDTHH:MM:SS`` of a timestamped predir name (comparable with run.json's ISO ``created``), else
    a string after every date."""
    m = re.search(r"_(\d{4})_(\d{2})_(\d{2})_(\d{2})(\d{2})(\d{2})$", name)
    return f"{m[1]}-{m[2]}-{m[3]}T{m[4]}:{m[5]}:{m[6]}" if m else "~"


def format_run(info: RunInfo) -> list[str]:
    """Lines of one run: a header, then one line per session."""
    best = "-" if info.best is None else f"{info.best:.2f}"
    lines = [f"{info.name}  spec={info.spec_name}  max_frame={info.max_frame}  best={best}  "
             f"resumable={info.resumable}"]
    frame = max((s.frame for s in info.sessions), default=0)
    if info.best is None and frame > 0:
        lines.append(f"  {no_episode_note(info.env, frame)}")
    for s in info.sessions:
        sbest = "-" if s.best is None else f"{s.best:.2f}"
        lines.append(f"  {s.key:<8} {s.status:<12} {s.frame:>10}/{info.max_frame:<10} best {sbest}")
    return lines


def ls_command(data_dir: str) -> int:
    """``lab ls``: print every run of ``data_dir``; returns 0 (also when there is none)."""
    runs = list_runs(data_dir)
    if not runs:
        print(f"no runs in {data_dir}")
    for info in runs:
        print("\n".join(format_run(info)))
    return 0
