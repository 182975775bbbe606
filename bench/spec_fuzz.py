"""Spec fuzz: mutate one leaf of a benchmark spec at a time and run ``lab ... dev`` in-process.

Every case must end in exit 0 (the mutated spec runs) or exit 2 (one ``error:`` message after any ``warning:`` lines, no
traceback, no run directory created). Anything else is a finding: an exception escaping
``orchestrator.cli.main`` (``crash:{type}``), exit 1, an exit 2 that left a predir or printed a
traceback (``bad_exit2``), or a run still going after ``--timeout`` seconds (``timeout``).

Cases: for every spec in the spec file (default ``specs/benchmark/*.json``), with its defaults
filled in and shrunk to a short run
(``env.max_frame`` = 300 frames, ``meta.log_frequency`` = 100, ``training_start_step`` <= 100,
``training_iter`` <= 1, ``net.hid_layers`` widths <= 64), every
leaf (dict values; list elements too) gets each mutation kind that applies to its value:
``wrong_type``, ``negative``, ``zero``, ``huge``, ``empty``, ``null``, ``unknown_key`` (a sibling key
that no section has) and, with ``--all-kinds``, ``nan``, ``inf``, ``fraction`` (2.5 for an int),
``tiny``. The list is shuffled with ``--seed`` and taken round-robin over specs, so the first N cases
cover every spec. ``env.max_frame`` is never made huge (a valid, just very long, run).

Usage:
    python bench/spec_fuzz.py [--cases 300] [--seed 0] [--all-kinds] [--timeout 60]
        [--spec-file specs/benchmark/cartpole.json ...] [--out bench/results/spec_fuzz.json]

Prints the count per outcome and one line per finding; exits 1 if there is a finding.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BASE_KINDS = ("wrong_type", "negative", "zero", "huge", "empty", "null", "unknown_key")
EXTRA_KINDS = ("nan", "inf", "fraction", "tiny")
SHRINK = {("env", "max_frame"): 300, ("meta", "log_frequency"): 100}
NOT_HUGE = {("env", "max_frame")}  # huge is valid there: a run that takes forever
Path_ = tuple[Any, ...]  # keys of nested dicts, int indices of lists


@dataclass(frozen=True)
class Case:
    """One mutated spec: ``spec_name`` with the leaf at ``path`` mutated by ``kind`` to ``value``."""

    spec_name: str
    path: Path_
    kind: str
    value: Any

    @property
    def label(self) -> str:
        """One line naming the spec, the path and the mutation (value cut at 60 chars)."""
        return f"{self.spec_name} {'.'.join(map(str, self.path))} {self.kind}={json.dumps(self.value)[:60]}"


def shrink(spec: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``spec`` that runs a few hundred frames (see module docstring)."""
    spec = copy.deepcopy(spec)
    for (section, key), value in SHRINK.items():
        spec.setdefault(section, {})[key] = value
    algo = spec.get("agent", {}).get("algorithm", {})
    if "training_start_step" in algo:
        algo["training_start_step"] = min(algo["training_start_step"], 100)
    if isinstance(algo.get("training_iter"), int):  # off-policy: a few hundred frames of 256-256 SAC steps
        algo["training_iter"] = min(algo["training_iter"], 1)  # would take ~30 s on 2 loaded cores
    net = spec.get("agent", {}).get("net", {})
    if isinstance(net.get("hid_layers"), list) and all(isinstance(h, int) for h in net["hid_layers"]):
        net["hid_layers"] = [min(h, 64) for h in net["hid_layers"]]
    return spec


def leaves(tree: Any, path: Path_ = ()) -> list[tuple[Path_, Any]]:
    """Every leaf below ``tree``: dict values recursively; a list is a leaf and so is each element."""
    if isinstance(tree, dict):
        return [leaf for key, value in tree.items() for leaf in leaves(value, (*path, key))]
    if isinstance(tree, list):
        return [(path, tree)] + [leaf for i, v in enumerate(tree) for leaf in leaves(v, (*path, i))]
    return [(path, tree)]


def _number_mutation(value: int | float, kind: str) -> Any:
    is_int = isinstance(value, int)
    table = {"negative": -abs(value) if value else -1, "zero": 0 if is_int else 0.0,
             "huge": 10**12 if is_int else 1e30, "nan": float("nan"), "inf": float("inf"),
             "fraction": 2.5 if is_int else None, "tiny": 1e-30}
    return table.get(kind)


def mutate(value: Any, kind: str) -> tuple[bool, Any]:
    """``(applies, new value)`` of a mutation kind for a leaf value (``unknown_key`` handled apart)."""
    if kind == "null":
        return value is not None, None
    if kind == "wrong_type":
        return True, 7 if isinstance(value, str) else "x"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        new = _number_mutation(value, kind)
        return new is not None and new != value, new
    table = {(str, "empty"): "", (str, "huge"): "x" * 10000, (list, "empty"): [], (list, "huge"): [10**12]}
    new = table.get((type(value), kind))
    return new is not None, new


def cases_of(spec_name: str, spec: dict[str, Any], kinds: tuple[str, ...]) -> list[Case]:
    """Every applicable single-leaf mutation of one (shrunk) spec."""
    out = []
    for path, value in leaves(spec):
        for kind in kinds:
            if kind == "unknown_key":
                if path and not isinstance(path[-1], int):
                    out.append(Case(spec_name, (*path[:-1], f"{path[-1]}_zz"), kind, 1))
                continue
            applies, new = mutate(value, kind)
            if applies and not (kind == "huge" and path in NOT_HUGE):
                out.append(Case(spec_name, path, kind, new))
    return out


def all_cases(specs: dict[str, dict[str, Any]], seed: int, kinds: tuple[str, ...]) -> list[Case]:
    """Cases of every spec, interleaved round-robin over specs; within a spec the cases are shuffled
    with ``seed`` and ordered round-robin over ``kinds`` (starting at a kind rotated per spec), so any
    prefix of ``len(specs) * k`` cases covers every spec and, for k large enough, every kind."""
    rng = random.Random(seed)
    per_spec = []
    for i, name in enumerate(sorted(specs)):
        cases = cases_of(name, shrink(specs[name]), kinds)
        rng.shuffle(cases)
        by_kind = [[c for c in cases if c.kind == k] for k in kinds[i % len(kinds):] + kinds[:i % len(kinds)]]
        per_spec.append([group[j] for j in range(max(map(len, by_kind), default=0))
                         for group in by_kind if j < len(group)])
    out = []
    for i in range(max(map(len, per_spec), default=0)):
        out += [cases[i] for cases in per_spec if i < len(cases)]
    return out


def apply_case(spec: dict[str, Any], case: Case) -> dict[str, Any]:
    """The shrunk spec with the case's leaf set (or, for ``unknown_key``, added)."""
    spec = shrink(spec)
    node = spec
    for key in case.path[:-1]:
        node = node[key]
    node[case.path[-1]] = case.value
    return spec


class _Timeout(Exception):
    pass


def _on_alarm(signum: int, frame: Any) -> None:
    raise _Timeout


def run_case(spec: dict[str, Any], case: Case, workdir: Path, timeout_s: float = 60.0) -> tuple[str, str]:
    """Run one case with ``orchestrator.cli.main([... 'dev' ...])`` in this process.

    Returns:
        (outcome, stderr): outcome ``ok``, ``exit2`` or a finding (see module docstring).
    """
    from orchestrator import cli

    spec_file, data = workdir / f"{case.spec_name}.json", workdir / "data"
    spec_file.write_text(json.dumps({case.spec_name: apply_case(spec, case)}))
    out, err = io.StringIO(), io.StringIO()
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main([str(spec_file), case.spec_name, "dev", "--quiet", "--data-dir", str(data)])
    except SystemExit as exc:
        code = exc.code
    except _Timeout:
        return "timeout", err.getvalue()
    except BaseException as exc:  # a finding: record it and go on with the next case
        return f"crash:{type(exc).__name__}: {str(exc)[:200]}", err.getvalue()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return classify(code, err.getvalue(), data), err.getvalue()


def classify(code: Any, stderr: str, data: Path) -> str:
    """``ok`` / ``exit2`` / ``bad_exit2`` / ``exit{code}`` of a finished case (``data``: its data dir)."""
    if "Traceback" in stderr:
        return f"traceback_exit{code}"
    if code == 0:
        return "ok"
    if code == 2:
        predirs = [p for p in data.iterdir() if p.is_dir()] if data.exists() else []
        first = next((ln for ln in stderr.splitlines() if not ln.startswith("warning:")), "")  # warnings may precede
        return "exit2" if first.startswith("error:") and not predirs else "bad_exit2"
    return f"exit{code}"


def is_finding(outcome: str) -> bool:
    """Whether an outcome is a defect: anything but a run (``ok``) or a clear refusal (``exit2``)."""
    return outcome not in ("ok", "exit2")


def load_specs(files: list[str]) -> dict[str, dict[str, Any]]:
    """Every spec of the files, normalised to the flat shape with every default filled (so keys the
    file leaves out, e.g. ``meta.resources``, are mutated too)."""
    from orchestrator.spec.files import normalize, read_spec_file
    from orchestrator.spec.schema import fill_defaults
    return {name: fill_defaults(normalize(spec)) for f in files for name, spec in read_spec_file(f).items()}


def run(files: list[str], n_cases: int, seed: int, kinds: tuple[str, ...], timeout_s: float) -> dict[str, Any]:
    """Run the first ``n_cases`` cases; returns counts per outcome and the findings."""
    import warnings
    warnings.filterwarnings("ignore")
    specs = load_specs(files)
    cases = all_cases(specs, seed, kinds)[:n_cases]
    counts: Counter[str] = Counter()
    findings = []
    start = time.time()
    for case in cases:
        with tempfile.TemporaryDirectory(prefix="spec-fuzz-") as tmp:
            outcome, stderr = run_case(specs[case.spec_name], case, Path(tmp), timeout_s)
        counts[outcome.split(":")[0]] += 1
        if is_finding(outcome):
            findings.append({"case": case.label, "outcome": outcome, "stderr_tail": stderr[-400:]})
            print(f"FINDING {outcome}: {case.label}", file=sys.stderr, flush=True)
    return {"cases": len(cases), "seed": seed, "kinds": list(kinds), "wall_s": round(time.time() - start, 1),
            "counts": dict(counts), "findings": findings}


def main(argv: list[str] | None = None) -> int:
    """The command line (usage in the module docstring): runs the fuzz cases, writes the results; returns 1 when a
    case crashed, hung or printed a traceback (a finding), else 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=300, help="cases to run (default 300)")
    parser.add_argument("--seed", type=int, default=0, help="shuffle seed (default 0)")
    parser.add_argument("--all-kinds", action="store_true", help="add nan, inf, fraction, tiny")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per case (default 60)")
    parser.add_argument("--spec-file", nargs="+", default=sorted(map(str, (REPO / "specs/benchmark").glob("*.json"))))
    parser.add_argument("--out", default=None, help="write the result JSON here")
    args = parser.parse_args(argv)
    kinds = BASE_KINDS + (EXTRA_KINDS if args.all_kinds else ())
    result = run(args.spec_file, args.cases, args.seed, kinds, args.timeout)
    print(f"{result['cases']} cases in {result['wall_s']} s (seed {args.seed}): "
          + ", ".join(f"{k}={v}" for k, v in sorted(result["counts"].items())))
    for finding in result["findings"]:
        print(f"FINDING {finding['outcome']}: {finding['case']}\n    {finding['stderr_tail'][-200:]!r}")
    if args.out:
        from orchestrator.store import storage  # atomic: a kill mid-write leaves the old file
        storage.write_text(str(args.out), json.dumps(result, indent=1) + "\n")
    return 1 if result["findings"] else 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
