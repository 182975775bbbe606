"""Learning of K seeds trained as one batched program against the same K seeds as separate sessions: do both reach
the same IQM within the bootstrap CI?

For one spec (``specs/benchmark/*.json``, the spec's own ``env.max_frame`` unless ``--frames``), seeds ``seed ..
seed+K-1`` (session indexes 0..K-1), in one process with one torch thread:

- ``separate``: each seed's ``Session`` built, run with ``Session.run_rl`` to the end and closed, one after the
  other, as K session processes would (a session seeds the global RNGs when it is built);
- ``batched``: one ``SessionGroup`` (``orchestrator.session.batched``, ``meta.session_batch: K``) of the same seeds.

Recorded per session: its train_df curve (``frame``, ``epi``, ``total_reward``, ``total_reward_ma``) and two of
the scores a trial's metrics summarise across sessions (``across_sessions`` in ``t{T}_trial_metrics.json``):

- ``total_reward_ma``: the final ``total_reward_ma`` (the mean return of the last ``meta.ma_window`` episodes at the
  last log row): where the seeds end;
- ``strength``: SLM-Lab's strength, the mean over the log rows of ``total_reward`` minus the random policy's mean
  return (``orchestrator.report.metrics.calc_strength``, ``compute_random_baseline``): the area under the return
  curve, so how fast the seeds learn.

Per variant and score: the IQM over the K seeds and its 95% stratified-bootstrap CI
(``orchestrator.report.stats.summary``, as ``lab analyze``), and the IQM curve of ``total_reward_ma`` over frames
with its CI band (``orchestrator.report.graphs.iqm_band``, as ``lab compare``). The verdict per score: whether the
two CIs overlap, whether each IQM lies in the other's CI, and the difference of the IQMs (batched minus separate)
with a 95% paired bootstrap CI (``stats.bootstrap_ci`` resampling seeds, the same resampled seeds for both variants,
since seed k is the same seed in both); ``agree`` when that CI contains 0. Also per seed
``first_divergent_frame``: the first log frame where the two runs of the seed differ in ``epi``, ``total_reward``
or ``total_reward_ma`` (None: never), i.e. from where float rounding has changed the seed's trajectory.

Outputs: the JSON ``--out`` (default ``bench/results/batched_learning_{spec}.json``) and the graph ``--graph``
(default ``docs/images/batched_learning_{spec}.png``: both IQM curves with their CI bands, as ``lab compare``
draws them). ``--table JSON ...`` prints the docs' markdown table of result files instead; ``--rescore JSON``
recomputes the scores, verdicts, curves and graph of a result file from its recorded sessions.

Usage:
    python bench/batched_learning.py [--spec ppo_cartpole] [--seeds 8] [--seed 1] [--frames N]
        [--override key=value ...] [--out PATH] [--graph PNG]
    python bench/batched_learning.py --table bench/results/batched_learning_*.json
    python bench/batched_learning.py --rescore bench/results/batched_learning_ppo_cartpole.json [--graph PNG]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.batched_seeds import spec_file  # noqa: E402

CURVE_COLUMNS = ("frame", "epi", "total_reward", "total_reward_ma")
MAX_PNG_BYTES = 100_000
SCORES = ("total_reward_ma", "strength")


def session_record(session: Any) -> dict[str, Any]:
    """One finished session as recorded: seed, session index, final frame and its train_df curve
    (``CURVE_COLUMNS``, NaN as None)."""
    df = session.train_df
    curve = {c: [None if v != v else v for v in df[c].tolist()] for c in CURVE_COLUMNS}
    return {"seed": session.seed, "session": session.session, "frame": session.clock.frame, "curve": curve}


def scores(record: dict[str, Any], rand_return: float) -> dict[str, float | None]:
    """``SCORES`` of one recorded session (see the module docstring): None where no episode has ended."""
    import pandas as pd

    from orchestrator.report.metrics import calc_strength

    ma = [v for v in record["curve"]["total_reward_ma"] if v is not None]
    returns = pd.Series([v for v in record["curve"]["total_reward"] if v is not None], dtype=float)
    return {"total_reward_ma": ma[-1] if ma else None,
            "strength": calc_strength(returns, rand_return)[0] if len(returns) else None}


def run_variant(variant: str, spec: dict[str, Any], seeds: list[int]) -> dict[str, Any]:
    """Train ``seeds`` to the spec's ``env.max_frame`` as ``variant`` (``separate`` or ``batched``); returns
    ``{"variant", "wall_s", "sessions": [session_record, ...]}`` in seed order."""
    from orchestrator.session.batched import SessionGroup
    from orchestrator.session.loop import Session

    t0 = time.perf_counter()
    records = []
    if variant == "separate":
        for k, seed in enumerate(seeds):
            session = Session(spec, seed, session=k)
            session.run_rl()
            records.append(session_record(session))
            session.close()
            print(f"separate seed {seed}: final total_reward_ma {records[-1]['curve']['total_reward_ma'][-1]}",
                  flush=True)
    else:
        group = SessionGroup(spec, seeds)
        group.run_rl()
        records = [session_record(s) for s in group.sessions]
        group.close()
    return {"variant": variant, "wall_s": time.perf_counter() - t0, "sessions": records}


def band(records: list[dict[str, Any]]) -> Any:
    """The IQM curve of the sessions' ``total_reward_ma`` across sessions with its 95% CI (``iqm_band``): a
    DataFrame indexed by frame, columns ``iqm``, ``low``, ``high``, at the frames where every session has a value."""
    import pandas as pd

    from orchestrator.report.graphs import iqm_band, stack_sessions

    return iqm_band(stack_sessions({r["session"]: pd.DataFrame(r["curve"]) for r in records}))


def first_divergent_frame(a: dict[str, Any], b: dict[str, Any]) -> int | None:
    """The first log frame at which two runs of one seed differ in ``epi``, ``total_reward`` or ``total_reward_ma``
    (NaN equal to NaN), or None if they never do."""
    ca, cb = a["curve"], b["curve"]
    for i, frame in enumerate(ca["frame"]):
        if i >= len(cb["frame"]) or cb["frame"][i] != frame:
            return frame
        if any(ca[c][i] != cb[c][i] for c in ("epi", "total_reward", "total_reward_ma")):
            return frame
    return None


def verdict(separate: list[float | None], batched: list[float | None]) -> dict[str, Any]:
    """For one score of the same seeds in the same order: per variant the IQM and its 95% bootstrap CI
    (``stats.summary``); the CIs' overlap, each IQM in the other's CI, and the IQM difference (batched - separate)
    with its paired bootstrap 95% CI; ``agree``: that CI contains 0.

    Raises:
        ValueError: a seed without the score (no episode ended: raise the frames), or lists of different lengths.
    """
    import numpy as np

    from orchestrator.report import stats

    if len(separate) != len(batched) or any(v is None for v in separate + batched):
        raise ValueError("a seed has no score (no episode ended: raise --frames) or the variants differ in seeds")
    both = np.array([batched, separate], dtype=float).T  # (K seeds, 2 variants)
    out: dict[str, Any] = {"batched": stats.summary(both[:, 0]), "separate": stats.summary(both[:, 1])}
    b, s = out["batched"], out["separate"]
    out["ci_overlap"] = b["ci"][0] <= s["ci"][1] and s["ci"][0] <= b["ci"][1]
    out["batched_iqm_in_separate_ci"] = s["ci"][0] <= b["iqm"] <= s["ci"][1]
    out["separate_iqm_in_batched_ci"] = b["ci"][0] <= s["iqm"] <= b["ci"][1]
    low, high = stats.bootstrap_ci(both, statistic=lambda x: stats.iqm(x[:, 0]) - stats.iqm(x[:, 1]))
    out["iqm_diff"] = b["iqm"] - s["iqm"]
    out["iqm_diff_ci"] = [low, high]
    out["agree"] = bool(low <= 0 <= high)
    return out


def analyse(result: dict[str, Any]) -> dict[str, Any]:
    """Fill a result's scores (per session), verdicts (per score), IQM curves and first divergent frames from its
    recorded sessions (``result["sessions"]``) and random baseline; returns ``result``.

    Raises:
        ValueError: the separate and batched sessions are not the same seeds in the same order; or ``verdict``'s.
    """
    runs, rand = result["sessions"], result["random_baseline"]["mean"]
    if [r["seed"] for r in runs["separate"]] != [r["seed"] for r in runs["batched"]]:
        raise ValueError("the separate and batched runs are not the same seeds")
    for records in runs.values():
        for r in records:
            r.pop("score", None)  # a result written before the scores were a dict
            r["scores"] = scores(r, rand)
    result["verdict"] = {key: verdict([r["scores"][key] for r in runs["separate"]],
                                      [r["scores"][key] for r in runs["batched"]]) for key in SCORES}
    result["first_divergent_frame"] = {str(a["seed"]): first_divergent_frame(a, b)
                                       for a, b in zip(runs["separate"], runs["batched"])}
    result["iqm_curves"] = {variant: {k: v.tolist() for k, v in band(records).reset_index(names="frame").items()}
                            for variant, records in runs.items()}
    return result


def write_graph(path: Path, env: str, spec_name: str, frames: int, runs: dict[str, list[dict[str, Any]]]) -> None:
    """Write the PNG of both variants' IQM curves with their CI bands (``lab compare``'s figure) to ``path``.

    Raises:
        SystemExit: the PNG is over ``MAX_PNG_BYTES``.
    """
    from orchestrator.report.compare import Curve, compare_png
    from orchestrator.report.rundata import reward_threshold

    curves = [Curve(variant, env, len(records), band(records), "one SessionGroup" if variant == "batched"
                    else "separate Sessions") for variant, records in runs.items()]
    threshold = reward_threshold(env)
    data = compare_png(curves, {} if threshold is None else {env: threshold},
                       f"{spec_name}: the same {len(runs['batched'])} seeds, {frames:,} frames each")
    if len(data) > MAX_PNG_BYTES:
        raise SystemExit(f"{path}: {len(data)} bytes, over {MAX_PNG_BYTES}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def table(paths: list[str]) -> str:
    """The docs' markdown table of result files (one row per file and score)."""
    lines = ["| spec | seeds | frames per seed | score | IQM batched [95% CI] | IQM separate [95% CI] | "
             "IQM difference [95% CI] | verdict |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for path in paths:
        r = json.loads(Path(path).read_text())
        for key in SCORES:
            v = r["verdict"][key]
            b, s, d = v["batched"], v["separate"], v["iqm_diff_ci"]
            said = "same: 0 in the difference's CI" if v["agree"] else "differ: 0 outside the difference's CI"
            said += "; CIs overlap" if v["ci_overlap"] else "; CIs disjoint"
            inside = v["batched_iqm_in_separate_ci"] + v["separate_iqm_in_batched_ci"]
            said += f"; {('neither IQM', 'one IQM', 'each IQM')[inside]} in the other's CI"
            lines.append(f"| `{r['spec']}` | {r['seeds']} | {r['frames_per_seed']:,} | `{key}` | {b['iqm']:.1f} "
                         f"[{b['ci'][0]:.1f}, {b['ci'][1]:.1f}] | {s['iqm']:.1f} [{s['ci'][0]:.1f}, "
                         f"{s['ci'][1]:.1f}] | {v['iqm_diff']:+.1f} [{d[0]:+.1f}, {d[1]:+.1f}] | {said} |")
    return "\n".join(lines)


def report(result: dict[str, Any], out: Path, graph: Path, env: str) -> None:
    """Write the result JSON to ``out`` and its graph to ``graph``, and print the verdicts."""
    out.parent.mkdir(parents=True, exist_ok=True)
    ordered = {**{k: v for k, v in result.items() if k != "sessions"}, "sessions": result["sessions"]}
    out.write_text(json.dumps(ordered, indent=1) + "\n")
    write_graph(graph, env, result["spec"], result["frames_per_seed"], result["sessions"])
    for key in SCORES:
        v = result["verdict"][key]
        b, s = v["batched"], v["separate"]
        print(f"IQM {key}: batched {b['iqm']:.1f} {b['ci']}, separate {s['iqm']:.1f} {s['ci']}; difference "
              f"{v['iqm_diff']:+.1f} {v['iqm_diff_ci']}: {'same' if v['agree'] else 'DIFFER'}")
    print(f"first divergent log frame per seed: {result['first_divergent_frame']}\nresults: {out}\ngraph: {graph}")


def main(argv: list[str] | None = None) -> int:
    """The command line (usage in the module docstring): runs both variants, writes the JSON and the graph."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default="ppo_cartpole")
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--frames", type=int, default=None, help="frames per seed (default: the spec's env.max_frame)")
    ap.add_argument("--override", action="append", default=[], help="key=value spec override (repeatable)")
    ap.add_argument("--out", default=None, help="default bench/results/batched_learning_{spec}.json")
    ap.add_argument("--graph", default=None, help="default docs/images/batched_learning_{spec}.png")
    ap.add_argument("--table", nargs="+", metavar="JSON", help="print the markdown table of these result files")
    ap.add_argument("--rescore", metavar="JSON", help="recompute a result file's analysis from its sessions")
    args = ap.parse_args(argv)
    if args.table:
        print(table(args.table))
        return 0
    if args.rescore:
        out = Path(args.rescore)
        result = json.loads(out.read_text())
        if "random_baseline" not in result:  # a result written before it recorded the env and baseline
            from orchestrator.report.metrics import compute_random_baseline

            env_spec = json.loads(spec_file(result["spec"]).read_text())[result["spec"]]["env"]
            result["env"] = env_spec["name"]
            result["random_baseline"] = compute_random_baseline(env_spec["name"], env_spec.get("max_t"))
        result = analyse(result)
        env = result["env"]
        report(result, out, Path(args.graph or ROOT / f"docs/images/batched_learning_{result['spec']}.png"), env)
        return 0
    if args.seeds < 1:
        ap.error("--seeds must be at least 1")
    import torch

    from orchestrator.report.metrics import compute_random_baseline
    from orchestrator.spec.load import load_spec

    torch.set_num_threads(1)
    overrides = ["meta.rigorous_eval=0", *([f"env.max_frame={args.frames}"] if args.frames else []), *args.override]
    spec = load_spec(str(spec_file(args.spec)), args.spec, overrides)
    env = spec["env"]["name"]
    seeds = list(range(args.seed, args.seed + args.seeds))
    runs, walls = {}, {}
    for variant in ("batched", "separate"):
        rec = run_variant(variant, spec, seeds)
        runs[variant], walls[variant] = rec["sessions"], rec["wall_s"]
        print(f"{variant}: {rec['wall_s']:.0f} s", flush=True)
    result = analyse({
        "spec": args.spec, "spec_file": spec_file(args.spec).relative_to(ROOT).as_posix(), "env": env,
        "overrides": overrides, "seeds": args.seeds, "session_seeds": seeds,
        "frames_per_seed": spec["env"]["max_frame"], "torch_threads": 1, "cpu_count": os.cpu_count(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "wall_s": walls,
        "random_baseline": compute_random_baseline(env, spec["env"].get("max_t")), "sessions": runs})
    report(result, Path(args.out or ROOT / f"bench/results/batched_learning_{args.spec}.json"),
           Path(args.graph or ROOT / f"docs/images/batched_learning_{args.spec}.png"), env)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
