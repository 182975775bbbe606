"""Population-based training on exact checkpoints: ``search`` with ``meta.search_scheduler: {"name": "PBT", ...}``
(settings and perturbable keys: ``orchestrator.spec.pbt``; decisions: ``orchestrator.search.pbt_policy``).

The population is ``meta.max_trial`` trials of ``meta.max_session`` sessions, all trained together in synchronous
generations: every session trains to the next multiple of ``perturbation_interval`` (``F_g``) and commits a
checkpoint exactly there (its spec's ``max_frame`` is ``F_g`` for the generation, so the loop ends on a log row and
a checkpoint, as ``train@`` with ``max_frame`` raised continues exactly). Then, once per generation:

1. **rank**: each trial's score is the mean over its sessions of ``total_reward_ma`` in the manifests of the
   checkpoints at ``F_g`` (not the order in which sessions finished);
2. **decide** (``pbt_policy.decide``, seeded from ``(meta.random_seed, g)``) and record every decision in
   ``{predir}/pbt.jsonl`` (written whole, atomically, before anything changes);
3. **exploit**: a bottom trial's sessions continue from the donor's committed checkpoints session for session: the
   donor's ``ckpt/`` (nets, optimizers, LR schedulers, clock, every RNG, env state, stored replay) and its
   train_df/eval_df copies replace the trial's own, so the trial's curve continues the donor's rows;
4. **explore**: the new values are written into the trial's spec files (``{name}_t{T}_spec.json``): every place
   that reads them gets them on the next restore (the optimizers' lr via ``Algorithm.apply_optim_specs``,
   schedules as pure functions of the frame); ``pbt.json`` then records the generation as applied.

Session actors survive between generations (``SessionHosts``): the next generation restores each session in the
same process. A population with more sessions than the cluster's resources hold at once runs as many at a time as
fit (``session_hosts.capacity``), the others starting in the actors of sessions that end. A SIGKILL at any moment
is resumed by ``search@`` (or the same ``search --name``): decisions already
recorded are applied again (idempotent: donors are never recipients of the same generation), unrecorded ones are
derived again from the same checkpoints and seed, so an interrupted PBT run writes the same ``pbt.jsonl`` and
train_dfs as an uninterrupted one. ``lab SPEC NAME train --pbt-replay PREDIR --trial T`` (``replay``) trains one
trial from scratch through the recorded schedule and checks it against the original.

Files of a PBT search beside the usual search files: ``pbt.jsonl`` (decisions), ``pbt.json`` (the last applied
generation), ``graph/{name}_pbt_lineage.png``/``.html``; ``t{T}/trial.json`` holds the trial's current values.
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable

from orchestrator.errors import EXIT_RESUMABLE, UsageError
from orchestrator.search.pbt_policy import decide, initial_config, lineage
from orchestrator.search.trials import trial_json, write_spec_files
from orchestrator.session_actor import EXPORTED_FILES
from orchestrator.session_hosts import SessionHosts, capacity, host_key
from orchestrator.spec.pbt import PBTSettings
from orchestrator.spec.search_space import SearchVar, apply_values, parse_search
from orchestrator.store import predir as predir_mod
from orchestrator.store import storage
from orchestrator.store.checkpoint import MANIFEST_NAME, CheckpointError, CheckpointStore
from orchestrator.store.lease import Lease
from orchestrator.store.predir import session_seed
from orchestrator.store.record import RunRecord, SessionPlan, now_iso
from orchestrator.trial import Trial
from orchestrator.verify import session_done

RECORDS, STATE = "pbt.jsonl", "pbt.json"


def read_records(predir: str) -> list[dict[str, Any]]:
    """The decisions in ``{predir}/pbt.jsonl`` (empty when there are none yet)."""
    uri = storage.join(predir, RECORDS)
    if not storage.exists(uri):
        return []
    return [json.loads(line) for line in storage.read_text(uri).splitlines() if line.strip()]


class Population:
    """The PBT state of one run directory, and the generations that train it.

    Args:
        predir: run directory URI (holds the spec as run).
        spec: the checked spec with its search section and a PBT ``meta.search_scheduler``.
        lease: the run's lease held by this driver.
        quiet: no live progress display.
        check: checks a spec with values applied (``orchestrator.spec.load.check``); raises ``SpecError``.
    """

    def __init__(self, predir: str, spec: dict[str, Any], lease: Lease | None, quiet: bool,
                 check: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        self.predir, self.spec, self.lease, self.quiet, self.check = predir, spec, lease, quiet, check
        self.name, self.meta = spec["name"], spec["meta"]
        self.settings = PBTSettings.from_spec(spec)
        self.variables: list[SearchVar] = parse_search(spec)[0]
        self.seed = int(self.meta["random_seed"])
        self.trials = list(range(int(self.meta["max_trial"])))
        self.sessions = int(self.meta["max_session"])
        self.boundaries = self.settings.boundaries(int(spec["env"]["max_frame"]))
        self.hosts = SessionHosts()
        self.current: Trial | None = None  # the generation's Trial while it runs (signals stop it)
        self.stop_requested = False
        self.initial = {t: initial_config(self.variables, self.seed, t) for t in self.trials}

    # ---------------------------------------------------------------- configs and specs
    def configs_after(self, records: list[dict[str, Any]], generation: int) -> dict[int, dict[str, Any]]:
        """Trial -> its values for generation ``generation + 1`` (after decision ``generation``; 0: initial)."""
        configs = {t: dict(c) for t, c in self.initial.items()}
        for r in records:
            if int(r["generation"]) <= generation:
                configs[int(r["trial"])] = r["config"]
        return configs

    def trial_spec(self, config: dict[str, Any]) -> dict[str, Any]:
        """The spec with ``config`` applied, checked.

        Raises:
            SpecError: a value makes the spec invalid (names the key).
        """
        return self.check(apply_values(self.spec, config))

    def write_trial(self, t: int, config: dict[str, Any], status: str, **extra: Any) -> None:
        """Trial ``t``'s spec files and ``trial.json`` with its current values (and ``extra`` keys)."""
        write_spec_files(self.predir, self.trial_spec(config), t)
        uri = trial_json(self.predir, t)
        info = storage.read_json(uri) if storage.exists(uri) else {"trial": t, "started": now_iso()}
        storage.write_json(uri, {**info, "values": config, "status": status, **extra})

    # ---------------------------------------------------------------- one generation
    def run_generation(self, frame: int, specs: dict[int, dict[str, Any]],
                       seeds: dict[int, list[int]]) -> int:
        """Train every session of ``specs``'s trials to ``frame`` (skipping those already there); returns the exit
        code of the generation's ``Trial`` (0 when every session reached ``frame``)."""
        plans = []
        for t in sorted(specs):
            for s in range(self.sessions):
                plan = SessionPlan(t, s, seeds[t][s], resume=False)
                is_done, selection = session_done(self.predir, plan, frame)
                if not is_done:
                    plan.resume, plan.frame = selection.frame is not None, selection.frame or 0
                    plans.append(plan)
        if not plans:
            return 0
        at_frame = {t: {**spec, "env": {**spec["env"], "max_frame": frame}} for t, spec in specs.items()}
        record = RunRecord.load_or_new(self.predir, self.name)
        trial = Trial(self.spec, self.predir, plans, record, quiet=self.quiet, analyze=False, lease=self.lease,
                      hosts=self.hosts, specs=at_frame, resume_mode="search",
                      max_running=capacity(host_key(self.meta)))
        self.current = trial
        if self.stop_requested:
            trial.stop_requested = True
        try:
            return trial.run()
        finally:
            self.current = None

    def scores(self, frame: int, trials: list[int]) -> dict[int, float | None]:
        """Trial -> mean over its sessions of ``total_reward_ma`` in the manifests of their checkpoints at ``frame``
        (None when no session has a finite one)."""
        out: dict[int, float | None] = {}
        for t in trials:
            values = []
            for s in range(self.sessions):
                store = CheckpointStore(predir_mod.session_dir(self.predir, t, s))
                ma = store.manifest(frame).meta.get("total_reward_ma")
                if ma is not None and not math.isnan(float(ma)):
                    values.append(float(ma))
            out[t] = sum(values) / len(values) if values else None
        return out

    # ---------------------------------------------------------------- exploit
    def exploit(self, record: dict[str, Any]) -> None:
        """Replace trial ``record["trial"]``'s session state by its donor's, session for session (idempotent)."""
        t, donor, frame = int(record["trial"]), int(record["donor"]), int(record["frame"])
        for s in range(self.sessions):
            src = predir_mod.session_dir(self.predir, donor, s)
            dst = predir_mod.session_dir(self.predir, t, s)
            source = CheckpointStore(src)
            storage.delete(storage.join(dst, "ckpt"))
            for f in (f for f in source.frames() if f <= frame):  # the donor's state at the decision's frame
                storage.copy_tree(source.frame_uri(f), CheckpointStore(dst).frame_uri(f), last=MANIFEST_NAME)
            held = source.manifest(frame).files
            for name in EXPORTED_FILES:  # the user copies, from the donor's checkpoint at the decision's frame
                if name in held:
                    storage.write_bytes(storage.join(dst, name), source.read_file(frame, name))
            storage.append_text(storage.join(dst, "log.txt"),
                                f"[{now_iso()}] PBT generation {record['generation']}: continues from t{donor}_s{s}'s "
                                f"checkpoint at frame {frame}; values {json.dumps(record['config'])}\n")

    # ---------------------------------------------------------------- the search
    def run(self) -> int:
        """Run (or resume) every generation; returns the exit code (0, ``EXIT_RESUMABLE`` after a signal, 1 when a
        session failed)."""
        records = read_records(self.predir)
        state_uri = storage.join(self.predir, STATE)
        applied = int(storage.read_json(state_uri).get("applied", 0)) if storage.exists(state_uri) else 0
        if applied == 0:
            for t in self.trials:
                self.write_trial(t, self.initial[t], "running")
        seeds = {t: [session_seed(self.seed, t, s) for s in range(self.sessions)] for t in self.trials}
        try:
            for g, frame in enumerate(self.boundaries, start=1):
                if g <= applied:
                    continue
                configs = self.configs_after(records, g - 1)
                # decisions recorded but not all applied (killed mid-exploit): a recipient's ckpt/ may be half
                # copied, so nothing trains before the exploits are applied again
                recorded = sum(int(r["generation"]) == g for r in records) == len(self.trials)
                code = 0 if recorded else self.run_generation(
                    frame, {t: self.trial_spec(configs[t]) for t in self.trials}, seeds)
                if code != 0:
                    return code
                if frame == self.boundaries[-1]:
                    break
                records = self.decide_and_apply(records, g, frame, configs)
                if self.stop_requested:
                    return EXIT_RESUMABLE
        finally:
            self.hosts.clear()
        for t, config in self.configs_after(records, len(self.boundaries)).items():
            self.write_trial(t, config, "done", frame=self.boundaries[-1], finished=now_iso())
        return 0

    def decide_and_apply(self, records: list[dict[str, Any]], g: int, frame: int,
                         configs: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
        """Decision ``g`` at ``frame``: the recorded one, or a new one recorded first (``pbt.jsonl`` rewritten whole);
        then its exploits and explored values applied and ``pbt.json`` marking it applied.

        Returns:
            Every record so far.
        """
        decided = [r for r in records if int(r["generation"]) == g]
        if len(decided) != len(self.trials):
            decided = decide(g, frame, self.scores(frame, self.trials), configs, self.variables, self.settings,
                             self.seed, records, len(self.boundaries))
            records = [r for r in records if int(r["generation"]) < g] + decided
            storage.write_text(storage.join(self.predir, RECORDS), "".join(json.dumps(r) + "\n" for r in records))
        for r in decided:
            if r["donor"] is not None:
                self.exploit(r)
            self.write_trial(int(r["trial"]), r["config"], "running")
        storage.write_json(storage.join(self.predir, STATE), {"applied": g, "frame": frame})
        self.print_generation(decided)
        return records

    def print_generation(self, decided: list[dict[str, Any]]) -> None:
        """One line per exploit of a generation."""
        for r in decided:
            if r["donor"] is not None:
                values = ", ".join(f"{k.rsplit('.', 1)[-1]}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                   for k, v in r["config"].items())
                print(f"{self.settings.method} generation {r['generation']} (frame {r['frame']}): t{r['trial']} "
                      f"(score {_fmt(r['score'])}) continues from t{r['donor']} (score {_fmt(r['donor_score'])}) "
                      f"with {values}", flush=True)

    def on_stop_signal(self, signum: int) -> str:
        """The stop target of ``run`` (``orchestrator.runtime.signals``): the generation's sessions commit their
        checkpoints and stop (``EXIT_RESUMABLE``); between generations the decisions under way are finished first.

        Returns:
            The line the stop handler prints.
        """
        self.stop_requested = True
        if self.current is not None:
            self.current.stop_requested = True
        return "committing final checkpoints (Ctrl-C twice leaves at once)"


def _fmt(score: float | None) -> str:
    return "n/a" if score is None else f"{score:.4g}"


# ---------------------------------------------------------------- replay
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
    schedule = lineage(read_records(source), trial, pop.initial, len(pop.boundaries))
    runner = Population(predir, spec, None, quiet, check)
    runner.trials = [0]
    storage.write_json(storage.join(predir, "pbt_replay.json"),
                       {"source": source, "trial": trial, "lineage": schedule, "boundaries": pop.boundaries})
    try:
        for step, frame in zip(schedule, pop.boundaries):
            owner = int(step["trial"])
            trial_spec = pop.trial_spec(step["config"])
            write_spec_files(predir, {**trial_spec, "search": {}}, 0)
            seeds = {0: [session_seed(pop.seed, owner, s) for s in range(pop.sessions)]}
            code = runner.run_generation(frame, {0: trial_spec}, seeds)
            if code != 0:
                return code, schedule
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


# ---------------------------------------------------------------- lineage graph
def lineage_graph(predir: str, spec: dict[str, Any]) -> list[str]:
    """Write the lineage graph (``orchestrator.report.pbt_graph``) of the generations decided so far, with the final
    scores once every trial reached ``max_frame``; returns the files written (none before the first decision)."""
    from orchestrator.report.pbt_graph import Lineage, write_lineage

    records = read_records(predir)
    if not records:
        return []
    pop = Population(predir, spec, None, True, lambda s: s)
    points = {(int(r["generation"]), int(r["trial"])): (int(r["frame"]), r["score"]) for r in records}
    parents = {(int(r["generation"]) + 1, int(r["trial"])): (int(r["donor"]) if r["donor"] is not None
                                                              else int(r["trial"]), r["donor"] is not None)
               for r in records}
    last = max(g for g, _ in points) + 1
    final = pop.boundaries[-1]
    try:
        finals = pop.scores(final, pop.trials) if last == len(pop.boundaries) else {}
    except CheckpointError:  # a session not at max_frame yet
        finals = {}
    for t, score in finals.items():
        points[(last, t)] = (final, score)
    ends = {t: s for (g, t), (_, s) in points.items() if g == max(g for g, _ in points)}
    best = max(sorted(ends), key=lambda t: -math.inf if ends[t] is None else ends[t])
    path = [(max(g for g, _ in points), best)]
    while path[-1] in parents:
        g, t = path[-1]
        path.append((g - 1, parents[(g, t)][0]))
    title = f"{spec['name']}: PBT lineage ({len(pop.trials)} trials x {pop.sessions} sessions)"
    return write_lineage(storage.join(predir, "graph"), spec["name"], Lineage(points, parents, path[::-1]), title)
