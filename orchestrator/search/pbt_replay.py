"""The replay of one trial of a finished PBT/PB2 search (``lab SPEC NAME train --pbt-replay PREDIR --trial T``): the
trial trained again from scratch through its recorded schedule, generation by generation (``replay``), then compared
with the original bit for bit (``compare_replay``)."""

from __future__ import annotations

from typing import Any, Callable

from orchestrator.errors import UsageError
from orchestrator.search.pbt import STATE, Population, read_records
from orchestrator.search.pbt_policy import lineage
from orchestrator.search.trials import write_spec_files
from orchestrator.store import predir as predir_mod
from orchestrator.store import storage
from orchestrator.store.checkpoint import CheckpointStore
from orchestrator.store.predir import session_seed


def replay(source: str, trial: int, spec: dict[str, Any], predir: str, quiet: bool,
           check: Callable[[dict[str, Any]], dict[str, Any]]) -> tuple[int, list[dict[str, Any]]]:
    """Train trial ``trial`` of the PBT run ``source`` again from scratch, as trial 0 of the new run ``predir``: per
    generation, the sessions (seeds) and values of the trial that trained that part of its final state
    (``pbt_policy.lineage``), switching at the same frames, so the exploits become plain continuations.

    Args:
        spec: the PBT run's saved spec (with its search section).

    Returns:
        (exit code, the lineage replayed).

    Raises:
        UsageError: ``source`` is not a finished PBT run, or has no trial ``trial``.
    """
    pop = Population(source, spec, None, quiet, check)
    state = storage.read_json(storage.join(source, STATE)) if storage.exists(storage.join(source, STATE)) else {}
    if trial not in pop.trials:
        raise UsageError(f"--trial {trial}: the PBT run {source} has trials 0..{len(pop.trials) - 1}")
    if int(state.get("applied", 0)) < len(pop.boundaries) - 1:
        raise UsageError(f"--pbt-replay: {source} has not applied every generation's decisions yet "
                         f"({state.get('applied', 0)} of {len(pop.boundaries) - 1}); finish it with search@ first")
    records = read_records(source)
    schedule = lineage(records, trial, pop.initial, len(pop.boundaries))
    decisions = {(r.generation, r.trial): r for r in records}
    runner = Population(predir, spec, None, quiet, check)
    runner.trials = [0]
    storage.write_json(storage.join(predir, "pbt_replay.json"),
                       {"source": source, "trial": trial, "lineage": schedule, "boundaries": pop.boundaries})
    try:
        for g, (step, frame) in enumerate(zip(schedule, pop.boundaries), start=1):
            owner = int(step["trial"])
            trial_spec = pop.trial_spec(step["config"])
            write_spec_files(predir, {**trial_spec, "search": {}}, 0)
            seeds = {0: [session_seed(pop.seed, owner, s) for s in range(pop.sessions)]}
            decision = decisions.get((g - 1, owner))  # how the owner of generation g started it
            exploited = decision is not None and decision.exploited
            code, failed = runner.run_generation(
                frame, {0: trial_spec}, seeds, live={0} if g > 1 and not exploited else set(),
                reseeds={0: decision} if exploited and decision.reseed is not None else {})
            if code != 0 or failed:
                return code or 1, schedule
    finally:
        runner.hosts.clear()
    return 0, schedule


def compare_replay(source: str, trial: int, predir: str, sessions: int) -> list[str]:
    """Differences between the replayed sessions (``predir``, trial 0) and trial ``trial`` of ``source``: final
    train_df (all columns but ``wall_t`` and ``fps``) and ``weights_sha256`` of the newest checkpoint per session.

    Returns:
        One line per difference (empty: replayed bit for bit).
    """
    import pandas as pd

    out = []
    for s in range(sessions):
        a, b = predir_mod.session_dir(source, trial, s), predir_mod.session_dir(predir, 0, s)
        ma, mb = (CheckpointStore(d).select_latest().manifest for d in (a, b))
        if ma is None or mb is None or ma.frame != mb.frame:
            out.append(f"s{s}: final checkpoint frame {ma and ma.frame} vs {mb and mb.frame}")
            continue
        if ma.meta.get("weights_sha256") != mb.meta.get("weights_sha256"):
            out.append(f"s{s}: weights_sha256 differ at frame {ma.frame}")
        dfs = [storage.read_parquet(storage.join(d, "train_df.parquet")).drop(columns=["wall_t", "fps"])
               for d in (a, b)]
        try:
            pd.testing.assert_frame_equal(dfs[0], dfs[1], check_exact=True)
        except AssertionError as err:
            out.append(f"s{s}: train_df differs: {str(err).splitlines()[0]}")
    return out
