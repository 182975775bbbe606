"""SLM-Lab spec compatibility: validate every spec entry of SLM-Lab's own spec files, tally the outcomes.

Walks every ``*.json`` / ``*.yaml`` / ``*.yml`` file under each SLM-Lab spec folder (default
``$SLM_LAB_SPECS`` or ``../shared/slm_lab_specs`` beside the checkout: its ``v5.3.0/`` and, if present, ``v4/``), and
for every spec entry in a file runs what ``lab FILE NAME dev`` runs before anything starts:
``orchestrator.spec.load_spec`` (read, normalise, fill ``${var}`` templates from ``--set``, defaults,
validation). Each entry ends in one outcome:

* ``ok``: the spec validates;
* ``refused``: a ``SpecError`` (the lab's exit 2); its first problem, with quoted values and numbers
  blanked, is tallied as the refusal reason;
* ``crash:{type}``: any other exception (a bug: the CLI would print a traceback).

A file with ``${env}`` / ``${max_frame}`` placeholders is loaded as a user would run it, with
``-s env=...`` (``ALE/Pong-v5`` for Atari files, ``HalfCheetah-v5`` for MuJoCo ones, else
``CartPole-v1``) and ``-s max_frame=1e6``. Files named ``_*`` are data, not specs (SLM-Lab skips them too).

With ``--dev N`` every ``ok`` entry whose env is classic control is also run in-process as
``lab FILE NAME dev -s env.max_frame=N`` and its exit code tallied (slow: a few seconds per entry).

Usage:
    python bench/slm_lab_specs.py [--root DIR] [--set env=CartPole-v1 ...] [--dev 300] [--limit K]
        [--out bench/results/slm_lab_specs.json] [--verbose] [--markdown]

Prints the count per outcome, per version, and the refusal reasons by frequency; exits 1 on a crash.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
import tempfile
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# the shared/ folder beside the repository checkout holds SLM-Lab's spec files, unmodified
DEFAULT_ROOT = Path(os.environ.get("SLM_LAB_SPECS", REPO.parent / "shared" / "slm_lab_specs"))
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
    from orchestrator.spec import SpecError, spec_names
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
               "HalfCheetah-v5" if any(k in name for k in ("mujoco", "cheetah", "humanoid", "playground")) else
               "CartPole-v1")
        fills.append(f"env={env}")
    if "${max_frame}" in text:
        fills.append("max_frame=1e6")
    return fills


def validate_entry(path: Path, name: str, overrides: list[str]) -> tuple[str, str]:
    """``(outcome, message)`` of loading one entry: ok / refused / crash:{type}."""
    from orchestrator.spec import SpecError, load_spec
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            load_spec(str(path), name, overrides)
    except SpecError as err:
        return "refused", str(err)
    except Exception as err:  # noqa: BLE001 - a crash is what this bench looks for
        return f"crash:{type(err).__name__}", f"{type(err).__name__}: {err}"
    return "ok", ""


def dev_entry(path: Path, name: str, overrides: list[str], frames: int) -> int:
    """Exit code of ``lab FILE NAME dev -s env.max_frame=frames`` run in-process (crash: 99)."""
    from orchestrator import cli
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        argv = [str(path), name, "dev", "--quiet", "--data-dir", tmp, "-s", f"env.max_frame={frames}"]
        for item in overrides:
            argv += ["-s", item]
        try:
            return int(cli.main(argv) or 0)
        except SystemExit as err:
            return int(err.code or 0)
        except Exception:  # noqa: BLE001
            return 99


def is_classic(path: Path, name: str) -> bool:
    """Whether the entry's env is a classic-control one (from the raw file, before any templating)."""
    from orchestrator.spec import read_spec_file
    try:
        env = read_spec_file(str(path)).get(name, {}).get("env")
    except Exception:  # noqa: BLE001
        return False
    env = env[0] if isinstance(env, list) and env else env
    return isinstance(env, dict) and isinstance(env.get("name"), str) and env["name"].startswith(CLASSIC)


def sweep(root: Path, overrides: list[str], dev_frames: int, limit: int | None, verbose: bool) -> dict[str, Any]:
    """Validate (and optionally dev-run) every entry; returns the tallies and one record per entry."""
    records = []
    for version, path in spec_files(root):
        names = entry_names(path)
        rel = str(path.relative_to(root))
        if isinstance(names, str):
            records.append({"version": version, "file": rel, "name": None, "outcome": "refused", "message": names})
            continue
        fills = template_fills(path)
        for name in names:
            outcome, message = validate_entry(path, name, overrides + fills)
            rec = {"version": version, "file": rel, "name": name, "outcome": outcome, "message": message,
                   "set": fills}
            if dev_frames and outcome == "ok" and is_classic(path, name) and (limit is None or limit > 0):
                rec["dev_rc"] = dev_entry(path, name, overrides + fills, dev_frames)
                limit = None if limit is None else limit - 1
            if verbose:
                print(f"{outcome:10s} {rel} {name} {message.splitlines()[0] if message else ''}", flush=True)
            records.append(rec)
    return summarize(records)


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts per outcome and version, refusal reasons by frequency, dev exit codes."""
    outcomes = Counter(r["outcome"] for r in records)
    per_version = {v: dict(Counter(r["outcome"] for r in records if r["version"] == v))
                   for v in sorted({r["version"] for r in records})}
    reasons = Counter(reason(r["message"]) for r in records if r["outcome"] == "refused")
    dev = Counter(r["dev_rc"] for r in records if "dev_rc" in r)
    return {"entries": len(records), "outcomes": dict(outcomes), "per_version": per_version,
            "reasons": reasons.most_common(), "dev_rc": {str(k): v for k, v in dev.items()}, "records": records}


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


def main(argv: list[str] | None = None) -> int:
    """Run the sweep, print the tallies, write the JSON record; 1 if any entry crashed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--dev", type=int, default=0, metavar="FRAMES", help="dev-run ok classic entries")
    parser.add_argument("--limit", type=int, default=None, help="at most this many dev runs")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--markdown", action="store_true", help="also print the per-family table")
    args = parser.parse_args(argv)
    result = sweep(args.root, args.overrides, args.dev, args.limit, args.verbose)
    print(f"entries: {result['entries']}  outcomes: {result['outcomes']}")
    for version, counts in result["per_version"].items():
        print(f"  {version}: {counts}")
    if result["dev_rc"]:
        print(f"dev exit codes: {result['dev_rc']}")
    print("refusal reasons:")
    for text, count in result["reasons"]:
        print(f"  {count:4d}  {text}")
    if args.markdown:
        print(markdown(result))
    for rec in result["records"]:
        if rec["outcome"].startswith("crash"):
            print(f"CRASH {rec['file']} {rec['name']}: {rec['message']}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1, default=str))
    return 1 if any(r["outcome"].startswith("crash") for r in result["records"]) else 0


if __name__ == "__main__":
    sys.exit(main())
