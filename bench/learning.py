"""Learning at SLM-Lab's budgets: run one SLM-Lab benchmark spec entry unmodified and record its scores.

Runs ``lab SPEC_FILE SPEC_NAME train`` (a real trial: the spec's ``meta.max_session`` sessions as Ray
actors, the spec's own ``env.max_frame``) in a subprocess, then reads the trial's outputs and records

* ``total_reward_ma``: the lab's final ``total_reward_ma`` per session (last train_df row: mean return
  of the last ``meta.ma_window`` = 20 episodes) and their mean (``info/t0_trial_metrics.json``);
* ``total_reward_ma_iqm`` / ``total_reward_ma_ci``: the interquartile mean of those finals across sessions and
  its 95% stratified-bootstrap CI (``orchestrator.report.stats.summary``; with fewer than 4 sessions the IQM is
  the mean, and with 2 the CI spans the two sessions);
* ``slm_total_reward_ma``: the same run scored as SLM-Lab computes the number it publishes
  (``slm_lab/agent/__init__.py`` ``MetricsTracker.ckpt`` and ``experiment/analysis.py``
  ``calc_session_metrics``): the mean of the ``total_reward`` of the last 100 log rows (``PLOT_MA_WINDOW``),
  per session, then the mean over sessions. SLM-Lab's row ``total_reward`` is the mean of gymnasium's
  vector ``RecordEpisodeStatistics`` queue (the last 100 episodes) for a vector env; ours is the mean
  return of the episodes that ended since the previous row, so this is an approximation (smoother in
  SLM-Lab's, with the same 100-row window: the last 50k frames at ``log_frequency`` 500);
* ``frames`` per session, ``wall_s`` of the whole ``lab`` command, ``fps`` (all sessions' frames / wall s),
  ``load1`` at start and end, the published score (``PUBLISHED``) and ``met`` (mean >= published);
* ``trial_graph``: the trial graph PNG of the run (copied to ``--graph-dir`` when given).

Overrides (``--max-frame``, ``--sessions``, ``--set KEY=VALUE``) are passed as ``-s env.max_frame=...`` /
``-s meta.max_session=...`` / ``-s KEY=VALUE`` and recorded under ``overrides``; a run with overrides is
stored under the key ``{spec_name}@{overrides}`` so it never replaces an unmodified run. Results are merged by key into
``--out`` (default ``bench/results/learning.json``).

Usage:
    python bench/learning.py benchmark/a2c/a2c_gae_cartpole.json a2c_gae_cartpole
        [--max-frame N] [--sessions N] [--set KEY=VALUE ...] [--data-dir DIR] [--graph-dir docs/img] [--out PATH]
    python bench/learning.py --table          # the markdown table of bench/results/learning.json
    python bench/learning.py --combine sac_pendulum sac_pendulum@sessions=2 sac_pendulum@sessions=2#2
    python bench/learning.py --graph docs/img/x.png sync=KEY_A envpool=KEY_B [--data-dir DIR]

``--combine KEY PART ...`` pools the sessions of runs of one entry (same spec file, spec name, frames per
session, same overrides but for a ``--set meta.random_seed=S``) made at different times into one record under
``KEY``, as a trial of all their sessions: its score is the mean over the pooled sessions, exactly what one trial
of that many sessions reports, since sessions of a non-distributed trial are independent and each has its own
seed (the parts' seeds must all differ: a run without ``meta.random_seed`` draws a fresh base seed, and ``--set
meta.random_seed=3`` on a 2-session run gives seeds 3 and 4). The record lists its parts (``combined_from``) and
has no fps or trial graph of its own (the parts' graphs stay). ``--key-suffix S`` stores a run under ``{key}#S``
so that a second run of the same entry and overrides keeps the first.

``--graph PNG LABEL=KEY ...`` draws one curve per record as ``lab compare`` does (the IQM of ``total_reward_ma``
across sessions against frames, its 95% bootstrap CI as a band, the env's reward threshold dotted), a combined
record's curve over all its parts' sessions; the records' run directories are read from ``--data-dir``.

``SPEC_FILE`` is a path, or a path relative to ``$SLM_LAB_SPECS/v5.3.0`` (SLM-Lab's spec files).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from orchestrator.report import stats  # noqa: E402

SLM_MA_WINDOW = 100  # SLM-Lab's viz.PLOT_MA_WINDOW: log rows in its total_reward_ma

# SLM-Lab v5.3.0's published final total_reward_ma (its docs/BENCHMARKS.md; issues 10 and 11), by the
# benchmark spec entry that reproduces it here. DQN's 475 is the goal (SLM-Lab's DQN reached 239.9).
PUBLISHED: dict[str, tuple[str, str, float]] = {
    "a2c_gae_cartpole": ("CartPole-v1", "A2C", 496.7),
    "sarsa_boltzmann_cartpole": ("CartPole-v1", "SARSA", 431.0),
    "sac_cartpole": ("CartPole-v1", "SAC", 406.1),
    "ddqn_per_boltzmann_cartpole": ("CartPole-v1", "DDQN+PER", 451.5),
    "crossq_cartpole": ("CartPole-v1", "CrossQ", 334.6),
    "dqn_epsilon_greedy_cartpole": ("CartPole-v1", "DQN", 475.0),
    "dqn_boltzmann_cartpole": ("CartPole-v1", "DQN", 475.0),
    "dqn_epsilon_greedy_cartpole_hpo": ("CartPole-v1", "DQN", 475.0),  # SLM-Lab's search specs, base values
    "dqn_epsilon_greedy_cartpole_search": ("CartPole-v1", "DQN", 475.0),
    "ppo_acrobot": ("Acrobot-v1", "PPO", -81.3),
    "ddqn_per_acrobot": ("Acrobot-v1", "DDQN+PER", -83.9),
    "a2c_gae_acrobot": ("Acrobot-v1", "A2C", -84.0),
    "sac_pendulum": ("Pendulum-v1", "SAC", -151.0),
    "crossq_pendulum": ("Pendulum-v1", "CrossQ", -145.7),
    "ppo_pendulum": ("Pendulum-v1", "PPO", -174.9),
    "ddqn_per_concat_lunar": ("LunarLander-v3", "DDQN+PER", 265.9),
    "ppo_lunar": ("LunarLander-v3", "PPO", 183.3),
    "sac_lunar": ("LunarLander-v3", "SAC", 106.2),  # discrete SAC (Categorical)
    "sac_lunar_continuous": ("LunarLanderContinuous-v3", "SAC", 125.0),  # issue 11's continuous SAC row
}


def file_stem(key: str) -> str:
    """A results key as a file name stem: ``sac_pendulum@sessions=1#2`` -> ``sac_pendulum_sessions1_2`` (no ``@``,
    ``=``, ``,``, ``/`` (a ``--set env=ALE/Pong-v5``) or ``#``, which a Markdown link would read as a fragment)."""
    return key.replace("@", "_").replace("=", "").replace("#", "_").replace("/", "-").replace(",", "_")


def resolve_spec_file(path: str) -> Path:
    """Return ``path`` if it exists, else ``$SLM_LAB_SPECS/v5.3.0/path``; raise FileNotFoundError if neither."""
    p = Path(path)
    if p.exists():
        return p.resolve()
    base = os.environ.get("SLM_LAB_SPECS")
    if base and (Path(base) / "v5.3.0" / path).exists():
        return (Path(base) / "v5.3.0" / path).resolve()
    raise FileNotFoundError(f"spec file {path!r} not found (nor under $SLM_LAB_SPECS/v5.3.0)")


def recorded_spec_file(spec_file: Path) -> str:
    """The spec file as a record names it, machine-free: relative to SLM-Lab's ``v5.3.0`` dir
    (``benchmark/sac/sac_pendulum.json``) or to this checkout (``specs/benchmark/atari.json``), else as given."""
    if "v5.3.0" in spec_file.parts:
        return Path(*spec_file.parts[spec_file.parts.index("v5.3.0") + 1:]).as_posix()
    if spec_file.is_relative_to(ROOT):
        return spec_file.relative_to(ROOT).as_posix()
    return str(spec_file)


def session_scores(predir: Path) -> list[dict[str, Any]]:
    """Per session of trial 0: final frame, the lab's final total_reward_ma and SLM-Lab's 100-row mean.

    Raises:
        FileNotFoundError: when the run has no session train_df.
    """
    out = []
    sdirs = sorted((predir / "t0").glob("s*"), key=lambda p: int(p.name[1:]))
    for sdir in sdirs:
        df = pd.read_parquet(sdir / "train_df.parquet")
        rows = df.dropna(subset=["total_reward"])
        out.append({"session": int(sdir.name[1:]), "frame": int(df["frame"].iloc[-1]),
                    "total_reward_ma": float(df["total_reward_ma"].iloc[-1]),
                    "slm_total_reward_ma": float(rows["total_reward"].iloc[-SLM_MA_WINDOW:].mean()),
                    "best_total_reward_ma": float(df["total_reward_ma"].max())})
    if not out:
        raise FileNotFoundError(f"no session train_df under {predir}/t0")
    return out


def run_entry(spec_file: Path, name: str, data_dir: Path, max_frame: int | None, sessions: int | None,
              log_path: Path, resume: Path | None = None, extra_sets: tuple[str, ...] = ()) -> dict[str, Any]:
    """Run ``lab spec_file name train`` with the overrides; return the record (see module docstring).

    ``extra_sets`` are further ``KEY=VALUE`` overrides passed as ``-s`` (a spec template's ``${env}``, any spec key),
    recorded under ``overrides["set"]``.

    With ``resume`` (a run directory of this entry) it runs ``lab spec_file name train@{resume}`` instead:
    a run made with ``--sessions 2`` resumed with the spec file that says 4 adds sessions 2 and 3 from frame 0
    with their own seeds (finished sessions are not re-run), so the trial becomes the spec's; ``wall_s``
    is then the resume's alone.

    Raises:
        RuntimeError: when ``lab`` exits non-zero or prints no predir.
    """
    sets = [arg for kv in extra_sets for arg in ("-s", kv)]
    if max_frame is not None:
        sets += ["-s", f"env.max_frame={max_frame}"]
    if sessions is not None:
        sets += ["-s", f"meta.max_session={sessions}"]
    if resume is None:
        cmd = [sys.executable, str(ROOT / "run_lab.py"), str(spec_file), name, "train",
               "--data-dir", str(data_dir), *sets]
    else:
        cmd = [sys.executable, str(ROOT / "run_lab.py"), str(spec_file), name, f"train@{resume}", *sets]
    load_start = os.getloadavg()[0]
    t0 = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    wall = time.time() - t0
    load_end = os.getloadavg()[0]
    text = log_path.read_text()
    m = re.search(r"^train: (\S+) \(", text, re.M)
    if proc.returncode != 0 or not (m or resume):
        raise RuntimeError(f"lab exited {proc.returncode}; see {log_path}")
    predir = resume if resume is not None else Path(m.group(1))
    sess = session_scores(predir)
    saved = json.loads((predir / f"{name}_spec.json").read_text())
    base_seed = saved["meta"]["random_seed"]
    trial = json.loads((predir / "info" / "t0_trial_metrics.json").read_text())
    env, algo, published = PUBLISHED.get(name, (saved["env"]["name"], saved["agent"]["algorithm"]["name"], None))
    mean_ma = float(trial["total_reward_ma"])
    robust = stats.summary([s["total_reward_ma"] for s in sess])
    frames = sum(s["frame"] for s in sess)
    graph = predir / "graph" / f"{name}_t0_trial_graph.png"
    return {
        "spec_file": recorded_spec_file(spec_file),
        "spec_name": name, "env": env, "algorithm": algo,
        "overrides": {k: v for k, v in (("max_frame", max_frame), ("sessions", sessions),
                                        ("set", list(extra_sets) or None)) if v is not None},
        "sessions": len(sess), "frames_per_session": [s["frame"] for s in sess],
        "random_seed": base_seed, "session_seeds": [base_seed + s["session"] for s in sess],
        "total_reward_ma": mean_ma,
        "total_reward_ma_sessions": [s["total_reward_ma"] for s in sess],
        "total_reward_ma_min": min(s["total_reward_ma"] for s in sess),
        "total_reward_ma_max": max(s["total_reward_ma"] for s in sess),
        "total_reward_ma_iqm": robust["iqm"], "total_reward_ma_ci": robust["ci"],
        "slm_total_reward_ma": sum(s["slm_total_reward_ma"] for s in sess) / len(sess),
        "slm_total_reward_ma_sessions": [s["slm_total_reward_ma"] for s in sess],
        "best_total_reward_ma_sessions": [s["best_total_reward_ma"] for s in sess],
        "published": published,
        "met": None if published is None else mean_ma >= published,
        # a resume trains only the unfinished sessions: its fps over all sessions' frames would be wrong
        "wall_s": round(wall, 1), "fps": None if resume is not None else round(frames / wall, 1),
        "load1_start": round(load_start, 2), "load1_end": round(load_end, 2),
        "predir": predir.name, "resumed": resume is not None, "trial_graph": str(graph),
        "platform": platform.platform(), "cpus": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }


SEED_SET = "meta.random_seed="  # a --set that only picks the sessions' seeds: parts of one --combine may differ in it


def entry_sets(record: dict[str, Any]) -> list[str] | None:
    """A record's ``--set`` overrides without its ``meta.random_seed``, or None when none is left."""
    sets = [kv for kv in record["overrides"].get("set") or [] if not kv.startswith(SEED_SET)]
    return sets or None


def combine(data: dict[str, dict[str, Any]], parts: list[str]) -> dict[str, Any]:
    """One record pooling the sessions of the records ``parts`` of ``data`` (see ``--combine``).

    Raises:
        SystemExit: a part is missing, the parts differ in spec file, spec name, frames per session or
            ``max_frame`` / ``--set`` overrides (other than ``meta.random_seed``), or two sessions share a seed (or
            a part has no recorded seeds).
    """
    missing = [k for k in parts if k not in data]
    if missing:
        raise SystemExit(f"--combine: no record {missing} in the results file")
    recs = [data[k] for k in parts]
    first = recs[0]
    for key, r in zip(parts, recs):
        same = (r["spec_file"], r["spec_name"], r["overrides"].get("max_frame"), entry_sets(r)) == \
            (first["spec_file"], first["spec_name"], first["overrides"].get("max_frame"), entry_sets(first))
        if not same or len(set(r["frames_per_session"] + first["frames_per_session"])) != 1:
            raise SystemExit(f"--combine: {key} is not a run of {parts[0]}'s entry and budget")
        if not r.get("session_seeds"):
            raise SystemExit(f"--combine: {key} has no recorded session seeds")
    seeds = [x for r in recs for x in r["session_seeds"]]
    if len(set(seeds)) != len(seeds):
        raise SystemExit(f"--combine: the parts share a session seed ({seeds})")
    ma = [x for r in recs for x in r["total_reward_ma_sessions"]]
    slm = [x for r in recs for x in r["slm_total_reward_ma_sessions"]]
    mean_ma = sum(ma) / len(ma)
    robust = stats.summary(ma)
    return {**{k: first[k] for k in ("spec_file", "spec_name", "env", "algorithm", "published", "platform", "cpus")},
            "overrides": {k: v for k, v in {**first["overrides"], "set": entry_sets(first)}.items()
                          if k != "sessions" and v is not None},
            "sessions": len(ma), "frames_per_session": [x for r in recs for x in r["frames_per_session"]],
            "session_seeds": seeds, "total_reward_ma": mean_ma, "total_reward_ma_sessions": ma,
            "total_reward_ma_min": min(ma), "total_reward_ma_max": max(ma),
            "total_reward_ma_iqm": robust["iqm"], "total_reward_ma_ci": robust["ci"],
            "slm_total_reward_ma": sum(slm) / len(slm), "slm_total_reward_ma_sessions": slm,
            "best_total_reward_ma_sessions": [x for r in recs for x in r["best_total_reward_ma_sessions"]],
            "met": None if first["published"] is None else mean_ma >= first["published"],
            "wall_s": round(sum(r["wall_s"] for r in recs), 1), "fps": None,
            "load1_start": min(r["load1_start"] for r in recs), "load1_end": max(r["load1_end"] for r in recs),
            "combined_from": parts, "predir": [r["predir"] for r in recs], "resumed": False,
            "trial_graph": [r["trial_graph"] for r in recs],
            "date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}


def graph(data: dict[str, dict[str, Any]], items: list[str], data_dir: Path, out: Path) -> list[Any]:
    """Write the PNG ``out`` of one ``lab compare`` curve per ``LABEL=KEY`` item (see ``--graph``); return the
    curves (``orchestrator.report.compare.Curve``).

    Raises:
        SystemExit: an item is not ``LABEL=KEY``, a key has no record, or a record's run directory has no
            session with a logged return under ``data_dir``.
    """
    from orchestrator.report.compare import Curve, compare_png, trial_dfs
    from orchestrator.report.graphs import iqm_band, stack_sessions
    from orchestrator.report.rundata import reward_threshold

    curves = []
    for item in items:
        label, _, key = item.partition("=")
        if not (label and key):
            raise SystemExit(f"--graph expects LABEL=KEY, got {item!r}")
        if key not in data:
            raise SystemExit(f"--graph: no record {key!r} in the results file")
        rec = data[key]
        predirs = rec["predir"] if isinstance(rec["predir"], list) else [rec["predir"]]
        dfs: dict[int, pd.DataFrame] = {}
        for predir in predirs:
            for df in trial_dfs(str(data_dir / predir), 0).get(0, {}).values():
                dfs[len(dfs)] = df
        if not dfs:
            raise SystemExit(f"--graph: no session with a logged return in {predirs} under {data_dir}")
        curves.append(Curve(label, rec["env"], len(dfs), iqm_band(stack_sessions(dfs))))
    envs = dict.fromkeys(c.env for c in curves)
    thresholds = {env: v for env in envs if (v := reward_threshold(env)) is not None}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(compare_png(curves, thresholds, " vs ".join(c.label for c in curves)))
    return curves


def merge(out: Path, key: str, record: dict[str, Any]) -> None:
    """Merge ``record`` under ``key`` into the JSON object at ``out`` (created if absent), under an exclusive
    ``flock`` of ``{out}.lock`` so that runs of several entries side by side never drop each other's record."""
    import fcntl

    out.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{out}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = json.loads(out.read_text()) if out.exists() else {}
        data[key] = record
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, out)


def table(data: dict[str, dict[str, Any]]) -> str:
    """Markdown table of the records in ``data`` (as written by ``merge``), in insertion order."""
    lines = ["| entry | env | sessions | frames | ours: final total_reward_ma, mean (min to max) | SLM-Lab-style | "
             "published | met | fps | wall s | load1 |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, r in data.items():
        met = "n/a" if r["met"] is None else ("yes" if r["met"] else "no")
        published = "-" if r["published"] is None else r["published"]
        fps = "" if r["fps"] is None else f"{r['fps']:,.0f}"  # none for a resume or a --combine
        lines.append(
            f"| `{key}` | {r['env']} | {r['sessions']} | {r['frames_per_session'][0]:,} | "
            f"{r['total_reward_ma']:.1f} ({r['total_reward_ma_min']:.1f} to {r['total_reward_ma_max']:.1f}) | "
            f"{r['slm_total_reward_ma']:.1f} | {published} | {met} | {fps} | {r['wall_s']:,.0f} | "
            f"{r['load1_start']:.1f}-{r['load1_end']:.1f} |")
    return "\n".join(lines)


def result_key(args: argparse.Namespace) -> str:
    """The results key of a run: ``{spec_name}[@{sets}][@max_frame=N][@sessions=N][#{suffix}]``."""
    key = args.spec_name
    if args.set:
        key += "@" + ",".join(args.set)
    if args.max_frame is not None:
        key += f"@max_frame={args.max_frame}"
    if args.sessions is not None:
        key += f"@sessions={args.sessions}"
    if args.key_suffix:
        key += f"#{args.key_suffix}"
    return key


def combine_command(ap: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``--combine KEY PART ...``: pool the parts' sessions into one record; returns the exit code."""
    if len(args.combine) < 3:
        ap.error("--combine needs KEY and at least two PART keys")
    out = Path(args.out)
    if not out.exists():
        ap.error(f"--combine: no results file {out}")
    record = combine(json.loads(out.read_text()), args.combine[1:])
    merge(out, args.combine[0], record)
    print(json.dumps({k: record[k] for k in ("spec_name", "sessions", "total_reward_ma", "published", "met")}))
    return 0


def graph_command(ap: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``--graph PNG LABEL=KEY ...``: one curve per record; returns the exit code."""
    if len(args.graph) < 2:
        ap.error("--graph needs PNG and at least one LABEL=KEY")
    curves = graph(json.loads(Path(args.out).read_text()), args.graph[1:], Path(args.data_dir), Path(args.graph[0]))
    from orchestrator.report.compare import final_lines

    print("\n".join(final_lines(curves)))
    print(f"graph: {args.graph[0]}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """CLI entry (see module docstring); returns the exit code."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("spec_file", nargs="?")
    ap.add_argument("spec_name", nargs="?")
    ap.add_argument("--table", action="store_true", help="print the markdown table of --out and exit")
    ap.add_argument("--max-frame", type=int)
    ap.add_argument("--sessions", type=int)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a further -s override of the lab (e.g. env=ALE/Pong-v5 for a template); part of the key")
    ap.add_argument("--data-dir", default=str(ROOT / "data" / "learning"))
    ap.add_argument("--graph-dir", help="copy the trial graph PNG here as {key}_trial_graph.png")
    ap.add_argument("--resume", help="a run directory of this entry: resume it (train@) with the overrides")
    ap.add_argument("--combine", nargs="+", metavar="KEY", help="KEY PART [PART ...]: pool the parts' sessions")
    ap.add_argument("--graph", nargs="+", metavar="ARG", help="PNG LABEL=KEY [LABEL=KEY ...]: one curve per record")
    ap.add_argument("--key-suffix", help="store the run under {key}#SUFFIX (a second run of the same entry)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "learning.json"))
    args = ap.parse_args(argv)
    if args.table:
        print(table(json.loads(Path(args.out).read_text())))
        return 0
    if args.combine:
        return combine_command(ap, args)
    if args.graph:
        return graph_command(ap, args)
    if not (args.spec_file and args.spec_name):
        ap.error("SPEC_FILE and SPEC_NAME are required (or --table, --combine or --graph)")
    bad = [kv for kv in args.set if "=" not in kv or kv.startswith("=")]
    if bad:
        ap.error(f"--set expects KEY=VALUE, got {bad}")
    spec_file = resolve_spec_file(args.spec_file)
    data_dir = Path(args.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    key = result_key(args)
    stem = file_stem(key)
    log_path = data_dir / f"{stem}{'_resume' if args.resume else ''}.log"
    resume = Path(args.resume) if args.resume else None
    record = run_entry(spec_file, args.spec_name, data_dir, args.max_frame, args.sessions, log_path, resume,
                       tuple(args.set))
    if args.graph_dir:
        dst = Path(args.graph_dir) / f"{stem}_trial_graph.png"
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(record["trial_graph"], dst)
        record["trial_graph"] = os.path.relpath(dst, ROOT)
    merge(Path(args.out), key, record)
    print(json.dumps({k: record[k] for k in ("spec_name", "sessions", "total_reward_ma", "slm_total_reward_ma",
                                             "total_reward_ma_sessions", "total_reward_ma_iqm",
                                             "total_reward_ma_ci", "published", "met", "wall_s", "fps")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
