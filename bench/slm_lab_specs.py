"""SLM-Lab spec compatibility: validate every spec entry of SLM-Lab's own spec files, tally the outcomes.

Walks every ``*.json`` / ``*.yaml`` / ``*.yml`` file under each SLM-Lab spec folder (``--root``, default
``$SLM_LAB_SPECS``, else SLM-Lab's pinned spec files downloaded into a cache and checked as the tests get them,
``tests/slm_lab_fetch.py``: its ``v5.3.0/`` and, if present, ``v4/``), and
for every spec entry in a file runs what ``lab FILE NAME dev`` runs before anything starts:
``orchestrator.spec.load_spec`` (read, normalise, fill ``${var}`` templates from ``--set``, defaults,
validation). Each entry ends in one outcome:

* ``ok``: the spec validates;
* ``refused``: a ``SpecError`` (the lab's exit 2); its first problem, with quoted values and numbers
  blanked, is tallied as the refusal reason;
* ``crash:{type}``: any other exception (a bug: the CLI would print a traceback).

A file with ``${env}`` / ``${max_frame}`` placeholders is loaded as a user would run it, with
``-s env=...`` (``ALE/Pong-v5`` for Atari files, ``playground/CartpoleBalance`` for Playground ones,
``HalfCheetah-v5`` for MuJoCo ones, else ``CartPole-v1``) and ``-s max_frame=1e6``. Files named ``_*`` are data,
not specs (SLM-Lab skips them too).

With ``--dev N`` every ``ok`` entry whose env is classic control is also run in-process as
``lab FILE NAME dev -s env.max_frame=N`` and its exit code tallied (slow: a few seconds per entry).
``--dev-all`` dev-runs every ``ok`` entry instead (Atari, Box2D, MuJoCo, classic: every validating
entry has its env installed), and every refused one (which must exit 2 there too), each under a
wall-clock limit (``--timeout``, seconds; an entry still running then is stopped by ``SIGALRM``
in-process and recorded as exit 124), with only the generic ``-s`` overrides a user could pass, each
given only where the entry has the key and its value is larger (``dev_overrides``, so the entry keeps
its own smaller values; ``training_start_step`` is left as written: capping it makes the Atari
conv-net updates run on CPU, 30 to 100 s an entry, and the update path is run by every classic entry):

* ``env.max_frame=N`` (every entry);
* ``env.num_envs=4``: 16 Atari/MuJoCo sub-envs take longer to build than 500 frames take to run;
* ``agent.memory.max_size=10000``: a 1e6-frame Atari replay does not fit in memory (the preflight's exit 2);
* ``meta.rigorous_eval=1``: fewer eval sub-envs to build;
* ``agent.algorithm.training_iter=1``, ``agent.algorithm.training_batch_iter=1``: SLM-Lab's Atari DQN
  entries take up to 32 conv-net gradient steps every 4 frames (4,000 in 500 frames: minutes on CPU).

``--shard K/N`` keeps every N-th file from the K-th (0-based), to run N sweeps side by side;
``--merge A.json B.json ...`` tallies the records of such shards as one sweep (``--out``, ``--markdown``).

``--no-analysis`` skips the end-of-run analysis of each dev run (``orchestrator.report.analysis.analyze_after_run``:
metrics and graphs, some 10 s of a 12 s classic run on a loaded machine). Its failures only warn and
never change the exit code, so the exit codes are the same; the CI sample runs it.

Each dev record has ``dev_rc`` (0 ok, 2 refused, 124 timed out, 99 an exception escaped the CLI),
``dev_s`` (seconds) and, unless 0, ``dev_error``: the first line of the ``error:`` message (exit 2)
or the exception with the innermost lab frame of its traceback.

Usage:
    python bench/slm_lab_specs.py [--root DIR] [--set env=CartPole-v1 ...] [--dev 300 | --dev-all 500]
        [--timeout 300] [--no-analysis] [--only SUBSTRING] [--shard K/N] [--limit K]
        [--out bench/results/slm_lab_specs.json]
        [--verbose] [--markdown]

Prints the count per outcome, per version, and the refusal reasons by frequency; exits 1 on a crash
(or a dev run that ended other than 0 or 2).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import signal
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

VERSIONS = ("v5.3.0", "v4")
CLASSIC = ("CartPole", "Acrobot", "MountainCar", "Pendulum")


def spec_files(root: Path) -> list[tuple[str, Path]]:
    """``(version, file)`` of every spec file under ``root/{version}`` for the known versions, sorted."""
    out = []
    for version in VERSIONS:
        base = root / version
        if base.is_dir():
            out += [(version, p) for p in sorted(base.rglob("*"))
                    if p.suffix in (".json", ".yaml", ".yml") and not p.name.startswith("_")]
    return out


def entry_names(path: Path) -> list[str] | str:
    """The spec names of one file (as the lab reads it), or the read error's message."""
    from orchestrator.errors import SpecError
    from orchestrator.spec.files import spec_names
    try:
        return spec_names(str(path))
    except SpecError as err:
        return str(err)


def reason(message: str) -> str:
    """A refusal message reduced to its kind: the value after ``got``, quoted values and numbers blanked."""
    first = message.splitlines()[0]
    first = re.split(r"(; allowed only as|, got | got )", first)[0]
    first = re.sub(r"(?<![A-Za-z])'[^']*'", "'_'", first)
    first = re.sub(r"\b\d+(\.\d+)?(e-?\d+)?\b", "N", first)
    return first[:160]


def template_fills(path: Path) -> list[str]:
    """``-s`` values for a file's ``${var}`` placeholders, as a user would give them (by the file's family)."""
    text = path.read_text()
    fills = []
    if "${env}" in text:
        name = str(path).lower()
        env = ("ALE/Pong-v5" if any(k in name for k in ("atari", "pong", "qbert", "breakout")) else
               "playground/CartpoleBalance" if "playground" in name else  # the file's own usage line
               "HalfCheetah-v5" if any(k in name for k in ("mujoco", "cheetah", "humanoid")) else
               "CartPole-v1")
        fills.append(f"env={env}")
    if "${max_frame}" in text:
        fills.append("max_frame=1e6")
    return fills


def validate_entry(path: Path, name: str, overrides: list[str]) -> tuple[str, str]:
    """``(outcome, message)`` of loading one entry: ok / refused / crash:{type}."""
    from orchestrator.errors import SpecError
    from orchestrator.spec.load import load_spec
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            load_spec(str(path), name, overrides)
    except SpecError as err:
        return "refused", str(err)
    except Exception as err:  # noqa: BLE001 - a crash is what this bench looks for
        return f"crash:{type(err).__name__}", f"{type(err).__name__}: {err}"
    return "ok", ""


# generic ``-s`` caps of --dev-all: key path -> largest value passed (only where the entry's value is larger)
DEV_CAPS = {
    "env.num_envs": 4,
    "agent.memory.max_size": 10000,
    "meta.rigorous_eval": 1,
    "agent.algorithm.training_iter": 1,
    "agent.algorithm.training_batch_iter": 1,
}
TIMEOUT_RC = 124  # exit code recorded for an entry stopped at its wall-clock limit
CRASH_RC = 99  # exit code recorded for an exception that escaped the CLI (a traceback)


class DevTimeout(BaseException):
    """Raised in the main thread by SIGALRM when a dev run passes its wall-clock limit (not an
    ``Exception``, so the lab's own ``except Exception`` blocks do not swallow it)."""


def dev_overrides(spec: dict[str, Any]) -> list[str]:
    """The ``DEV_CAPS`` ``-s`` overrides that apply to a loaded (flat, defaults filled) spec: each key
    the spec has with a number larger than its cap."""
    out = []
    for path, cap in DEV_CAPS.items():
        node: Any = spec
        for key in path.split("."):
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, (int, float)) and not isinstance(node, bool) and node > cap:
            out.append(f"{path}={cap}")
    return out


def _alarm(signum: int, frame: Any) -> None:
    raise DevTimeout()


def _first_error_line(text: str) -> str:
    """The first problem of a captured ``error: ...`` message (the line after the header when the
    header only names the spec)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for i, line in enumerate(lines):
        if line.startswith("error:"):
            if line.startswith("error: invalid spec") and i + 1 < len(lines):
                return lines[i + 1]
            return line
    return lines[-1] if lines else ""


def _crash_line(err: BaseException) -> str:
    """``Type: message`` of an exception, with the innermost frame of the lab's own code."""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if str(REPO) in f.filename]
    where = f" at {Path(frames[-1].filename).relative_to(REPO)}:{frames[-1].lineno}" if frames else ""
    return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}{where}"[:300]


def dev_run(path: Path, name: str, overrides: list[str], frames: int,
            timeout: float | None = None, analysis: bool = True) -> tuple[int, float, str]:
    """``(exit code, seconds, first error line)`` of ``lab FILE NAME dev -s env.max_frame=frames
    [-s ...]`` run in-process; exit code 99 for an exception that escaped the CLI, 124 when the run
    passed ``timeout`` seconds (SIGALRM, main thread only). ``analysis=False`` skips the end-of-run
    analysis (which only warns on failure)."""
    from unittest import mock

    from orchestrator import cli
    err_text = io.StringIO()
    start = time.monotonic()
    old = signal.signal(signal.SIGALRM, _alarm) if timeout else None
    with tempfile.TemporaryDirectory() as tmp:
        argv = [str(path), name, "dev", "--quiet", "--data-dir", tmp, "-s", f"env.max_frame={frames}"]
        for item in overrides:
            argv += ["-s", item]
        try:
            skip = mock.patch("orchestrator.report.analysis.analyze_after_run", return_value=None)
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err_text), \
                    (contextlib.nullcontext() if analysis else skip):
                if timeout:
                    signal.setitimer(signal.ITIMER_REAL, timeout)
                try:
                    rc, message = int(cli.main(argv) or 0), ""
                finally:
                    if timeout:
                        signal.setitimer(signal.ITIMER_REAL, 0)
        except SystemExit as err:
            rc, message = int(err.code or 0), ""
        except DevTimeout:
            rc, message = TIMEOUT_RC, f"timed out after {timeout:g} s"
        except Exception as err:  # noqa: BLE001 - a crash is what this bench looks for
            rc, message = CRASH_RC, _crash_line(err)
        finally:
            if timeout:
                signal.signal(signal.SIGALRM, old)
    if rc not in (0, CRASH_RC, TIMEOUT_RC) and not message:
        message = _first_error_line(err_text.getvalue())
    return rc, round(time.monotonic() - start, 2), message


def dev_entry(path: Path, name: str, overrides: list[str], frames: int) -> int:
    """Exit code of ``lab FILE NAME dev -s env.max_frame=frames`` run in-process (crash: 99)."""
    return dev_run(path, name, overrides, frames)[0]


def is_classic(path: Path, name: str) -> bool:
    """Whether the entry's env is a classic-control one (from the raw file, before any templating)."""
    from orchestrator.spec.files import read_spec_file
    try:
        env = read_spec_file(str(path)).get(name, {}).get("env")
    except Exception:  # noqa: BLE001
        return False
    env = env[0] if isinstance(env, list) and env else env
    return isinstance(env, dict) and isinstance(env.get("name"), str) and env["name"].startswith(CLASSIC)


def sweep(root: Path, overrides: list[str], dev_frames: int, limit: int | None, verbose: bool,
          dev_all: bool = False, timeout: float | None = None, only: str | None = None,
          shard: tuple[int, int] = (0, 1), analysis: bool = True) -> dict[str, Any]:
    """Validate (and optionally dev-run) every entry; returns the tallies and one record per entry.

    ``dev_frames`` > 0 dev-runs the ``ok`` classic-control entries (all ``ok`` entries with ``dev_all``,
    then with ``dev_overrides``), at most ``limit`` of them, each under ``timeout`` seconds; ``only``
    keeps the files whose relative path contains that substring, ``shard`` ``(k, n)`` every n-th file from
    the k-th; ``analysis=False`` skips each dev run's end-of-run analysis."""
    from orchestrator.spec.load import load_spec
    records = []
    for index, (version, path) in enumerate(spec_files(root)):
        rel = str(path.relative_to(root))
        if (only and only not in rel) or index % shard[1] != shard[0]:
            continue
        names = entry_names(path)
        if isinstance(names, str):
            records.append({"version": version, "file": rel, "name": None, "outcome": "refused", "message": names})
            continue
        fills = template_fills(path)
        for name in names:
            outcome, message = validate_entry(path, name, overrides + fills)
            rec = {"version": version, "file": rel, "name": name, "outcome": outcome, "message": message,
                   "set": fills}
            wanted = dev_all or is_classic(path, name)
            if dev_all and outcome == "refused":  # the CLI refuses it too (exit 2, before anything runs), except a
                # broken search section, which dev only warns about (it runs: exit 0)
                rc, seconds, error = dev_run(path, name, overrides + fills, dev_frames, timeout, analysis)
                rec.update(dev_rc=rc, dev_s=seconds, dev_set=[], dev_error=error)
            elif dev_frames and outcome == "ok" and wanted and (limit is None or limit > 0):
                extra = []
                if dev_all:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        extra = dev_overrides(load_spec(str(path), name, overrides + fills))
                rc, seconds, error = dev_run(path, name, overrides + fills + extra, dev_frames, timeout, analysis)
                rec.update(dev_rc=rc, dev_s=seconds, dev_set=extra)
                if rc:
                    rec["dev_error"] = error
                limit = None if limit is None else limit - 1
            if verbose:
                dev = f" dev={rec['dev_rc']} {rec['dev_s']}s {rec.get('dev_error', '')}" if "dev_rc" in rec else ""
                print(f"{outcome:10s} {rel} {name} {message.splitlines()[0] if message else ''}{dev}", flush=True)
            records.append(rec)
    return summarize(records)


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts per outcome and version, refusal reasons by frequency, dev exit codes."""
    outcomes = Counter(r["outcome"] for r in records)
    per_version = {v: dict(Counter(r["outcome"] for r in records if r["version"] == v))
                   for v in sorted({r["version"] for r in records})}
    reasons = Counter(reason(r["message"]) for r in records if r["outcome"] == "refused")
    dev = Counter(r["dev_rc"] for r in records if "dev_rc" in r)
    dev_errors = Counter(reason(r["dev_error"]) for r in records if r.get("dev_error"))
    return {"entries": len(records), "outcomes": dict(outcomes), "per_version": per_version,
            "reasons": reasons.most_common(), "dev_rc": {str(k): v for k, v in sorted(dev.items())},
            "dev_errors": dev_errors.most_common(), "records": records}


def family(rec: dict[str, Any]) -> str:
    """An entry's spec family: its folder under the version (``benchmark/ppo``), or the file at the top."""
    parts = rec["file"].split("/")
    return "/".join(parts[1:-1]) or parts[-1]


def markdown(result: dict[str, Any]) -> str:
    """Per-family table for docs/COMPATIBILITY.md: entries, validating, dev exit 0, main refusal reasons."""
    rows = ["| family | entries | validate | dev 0 / run | refused for (first problem, count) |",
            "| --- | ---: | ---: | ---: | --- |"]
    fams: dict[str, list[dict[str, Any]]] = {}
    for rec in result["records"]:
        fams.setdefault(f"{rec['version']}/{family(rec)}", []).append(rec)
    for fam, recs in sorted(fams.items()):
        ok = sum(r["outcome"] == "ok" for r in recs)
        devs = [r["dev_rc"] for r in recs if "dev_rc" in r]
        dev = f"{devs.count(0)} / {len(devs)}" if devs else "-"
        if devs and devs.count(0) < len(devs):
            dev += " (" + ", ".join(f"{n} exit {rc}" for rc, n in sorted(Counter(devs).items()) if rc) + ")"
        why = Counter(short_reason(r["message"]) for r in recs if r["outcome"] == "refused")
        text = "; ".join(f"{k} ({v})" for k, v in why.most_common(4))
        rows.append(f"| `{fam}` | {len(recs)} | {ok} | {dev} | {text} |")
    return "\n".join(rows)


def short_reason(message: str) -> str:
    """The feature a refusal names, in a few words (the key path and its feature)."""
    first = message.splitlines()[0]
    path, _, rest = first.partition(": ")
    rest = re.sub(r"^SLM-Lab key not supported here: ", "", rest)
    rest = re.split(r"(; allowed only as|, got | got |, which |; expected one of|; fill it)", rest)[0]
    return f"`{path}`: {rest[:90]}".replace("|", "/")


def report(result: dict[str, Any], table: bool) -> None:
    """Print the tallies, the refusal and dev-failure reasons, the per-family table (``table``), and
    every crash and every dev run that ended other than 0 or 2."""
    print(f"entries: {result['entries']}  outcomes: {result['outcomes']}")
    for version, counts in result["per_version"].items():
        print(f"  {version}: {counts}")
    if result["dev_rc"]:
        print(f"dev exit codes: {result['dev_rc']}")
        for text, count in result["dev_errors"]:
            print(f"  {count:4d}  {text}")
    print("refusal reasons:")
    for text, count in result["reasons"]:
        print(f"  {count:4d}  {text}")
    if table:
        print(markdown(result))
    for rec in result["records"]:
        if rec["outcome"].startswith("crash"):
            print(f"CRASH {rec['file']} {rec['name']}: {rec['message']}")
        if rec.get("dev_rc", 0) not in (0, 2):
            print(f"DEV {rec['dev_rc']} {rec['file']} {rec['name']}: {rec.get('dev_error', '')}")


def main(argv: list[str] | None = None) -> int:
    """Run the sweep (or merge shards), print the tallies, write the JSON record; 1 if any entry crashed
    or a dev run ended other than 0 or 2."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=None,
                        help="folder holding v5.3.0/ (default $SLM_LAB_SPECS, else the tests' cached download)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--dev", type=int, default=0, metavar="FRAMES", help="dev-run ok classic entries")
    parser.add_argument("--dev-all", type=int, default=0, metavar="FRAMES",
                        help="dev-run every ok entry (all env families) with the DEV_CAPS overrides")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per dev run (default 300)")
    parser.add_argument("--no-analysis", action="store_true",
                        help="skip each dev run's end-of-run analysis (it only warns on failure)")
    parser.add_argument("--only", default=None, metavar="SUBSTRING", help="only files whose path contains it")
    parser.add_argument("--shard", default="0/1", metavar="K/N", help="every N-th file from the K-th (0-based)")
    parser.add_argument("--merge", type=Path, nargs="+", default=None, metavar="JSON",
                        help="tally the records of these sweep results (shards) instead of sweeping")
    parser.add_argument("--limit", type=int, default=None, help="at most this many dev runs")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--markdown", action="store_true", help="also print the per-family table")
    args = parser.parse_args(argv)
    if args.merge:
        result = summarize([rec for part in args.merge for rec in json.loads(part.read_text())["records"]])
    else:
        k, n = (int(x) for x in args.shard.split("/"))
        if args.root is None:
            from tests.slm_lab_fetch import SpecsUnavailable, ensure
            try:
                args.root = ensure()
            except SpecsUnavailable as err:
                print(f"error: {err}", file=sys.stderr)
                return 2
        result = sweep(args.root, args.overrides, args.dev_all or args.dev, args.limit, args.verbose,
                       dev_all=bool(args.dev_all), timeout=args.timeout, only=args.only, shard=(k, n),
                       analysis=not args.no_analysis)
    report(result, args.markdown)
    if args.out:
        from orchestrator.store import storage  # atomic: a kill mid-write leaves the old file
        storage.write_text(str(args.out), json.dumps(result, indent=1, default=str))
    failed = any(r["outcome"].startswith("crash") or r.get("dev_rc", 0) not in (0, 2) for r in result["records"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
