"""Population-based training on exact checkpoints: ``search`` with ``meta.search_scheduler: {"name": "PBT", ...}``
(settings and perturbable keys: ``orchestrator.spec.pbt``; decisions: ``orchestrator.search.pbt_policy``).

The population is ``meta.max_trial`` trials of ``meta.max_session`` sessions, all trained together in synchronous
generations: every session trains to the next multiple of ``perturbation_interval`` (``F_g``) and commits a
checkpoint exactly there (its spec's ``max_frame`` is ``F_g`` for the generation, so the loop ends on a log row and
a checkpoint, as ``train@`` with ``max_frame`` raised continues exactly). Then, once per generation:

1. **rank**: each trial's score (``scores``) is the mean over its sessions of the mean return of the episodes that
   ended within the generation, ``(F_{g-1}, F_g]``, read from the train_df in the checkpoints at ``F_g`` (with
   ``meta.rigorous_eval``, the mean eval return of the generation's eval rows); a trial whose session failed (an
   exception) has no score and is replaced;
2. **decide** (``pbt_policy.decide``, seeded from ``(meta.random_seed, g)``; failed trials ranked last and
   replaced) and record every decision in ``{predir}/pbt.jsonl`` (written whole, atomically, before anything
   changes); an exploit's record carries ``reseed`` (``pbt_policy.reseed``);
3. **exploit**: a bottom trial's sessions continue from the donor's committed checkpoints session for session: the
   recipient's ``ckpt/`` is deleted manifest first (``CheckpointStore.delete_all``), then the donor's (nets,
   optimizers, LR schedulers, clock, every RNG, env state, replay) and its train_df/eval_df copies replace it, so
   the trial's curve continues the donor's rows; its sessions restore that state with their acting RNG streams
   restarted at ``session_reseed(reseed, s)``, so recipient and donor do not act alike;
4. **explore**: the new values are written into the trial's spec files (``{name}_t{T}_spec.json``): every place
   that reads them gets them on the restore (the optimizers' lr via ``Algorithm.apply_optim_specs``, schedules as
   pure functions of the frame, ``gamma`` also in the env's ``NormalizeReward``); ``pbt.json`` then records the
   generation as applied.

Kept trials continue with their live state: session actors survive between generations (``SessionHosts``), and a
session that was not exploited goes on in the same process with everything in memory (``SessionActor.run(extend=
...)``, no restore); a restore of its checkpoint would give the same state, which is what a resume does (and what
a seed group of ``meta.session_batch`` does at every generation: it is restored, with its sessions' reseeds). A replay
buffer must therefore be in the checkpoints (``agent.memory.checkpoint: true``, required for replay-based
algorithms in a PBT search by the spec check) so that a recipient, a resume and a replay get it. A population with
more sessions than the cluster's resources hold at once runs as many at a time as fit (``session_hosts.capacity``),
the others restored in the actors of sessions that end. A SIGKILL at any moment is resumed by ``search@`` (or the
same ``search --name``): decisions already recorded are applied again (idempotent: donors are never recipients of
the same generation), unrecorded ones are derived again from the same checkpoints and seed, so an interrupted PBT
run writes the same ``pbt.jsonl`` and train_dfs as an uninterrupted one. ``lab SPEC NAME train --pbt-replay PREDIR
--trial T`` (``orchestrator.search.pbt_replay``) trains one trial from scratch through the recorded schedule and
checks it against the original.

Files of a PBT search beside the usual search files: ``pbt.jsonl`` (decisions), ``pbt.json`` (the last applied
generation, and the trials that failed in a generation not yet decided), ``graph/{name}_pbt_lineage.png``/
``.html``; ``t{T}/trial.json`` holds the trial's current values.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any, Callable

import numpy as np

from orchestrator.errors import EXIT_RESUMABLE, SpecError
from orchestrator.search.decision import Decision
from orchestrator.search.pbt_policy import decide, format_exploit, initial_config
from orchestrator.search.trials import trial_json, write_spec_files
from orchestrator.session_hosts import SessionHosts, capacity, host_key
from orchestrator.spec.meta import MetaSpec
from orchestrator.spec.pbt import PBTSettings, key_range
from orchestrator.spec.search_space import SearchVar, apply_values, parse_search
from orchestrator.store import predir as predir_mod
from orchestrator.store import storage
from orchestrator.store.checkpoint import CheckpointError, CheckpointStore
from orchestrator.store.lease import Lease
from orchestrator.store.predir import session_seed
from orchestrator.store.record import RunRecord, SessionPlan, now_iso
from orchestrator.trial import Trial
from orchestrator.verify import session_done

RECORDS, STATE = "pbt.jsonl", "pbt.json"


def read_records(predir: str) -> list[Decision]:
    """The decisions in ``{predir}/pbt.jsonl`` (empty when there are none yet)."""
    uri = storage.join(predir, RECORDS)
    if not storage.exists(uri):
        return []
    return [Decision.from_json(json.loads(line)) for line in storage.read_text(uri).splitlines() if line.strip()]


def write_records(predir: str, records: list[Decision]) -> None:
    """``{predir}/pbt.jsonl``, written whole (atomically) with one line per decision (``Decision.to_json``)."""
    storage.write_text(storage.join(predir, RECORDS), "".join(json.dumps(r.to_json()) + "\n" for r in records))


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
        self.name, self.meta = spec["name"], MetaSpec.of(spec)
        self.settings = PBTSettings.from_spec(spec)
        self.variables: list[SearchVar] = parse_search(spec)[0]
        self.seed = int(self.meta.random_seed)
        self.trials = list(range(self.meta.max_trial))
        self.sessions = self.meta.max_session
        self.boundaries = self.settings.boundaries(int(spec["env"]["max_frame"]))
        self.hosts = SessionHosts()
        self.current: Trial | None = None  # the generation's Trial while it runs (signals stop it)
        self.stop_requested = False
        self.ranges = {v.path: key_range(spec, v.path) for v in self.variables}
        self.initial = {t: initial_config(self.variables, self.seed, t, self.ranges, self.config_problems)
                        for t in self.trials}

    # ---------------------------------------------------------------- configs and specs
    def configs_after(self, records: list[Decision], generation: int) -> dict[int, dict[str, Any]]:
        """Trial -> its values for generation ``generation + 1`` (after decision ``generation``; 0: initial)."""
        configs = {t: dict(c) for t, c in self.initial.items()}
        for r in records:
            if r.generation <= generation:
                configs[r.trial] = r.config
        return configs

    def trial_spec(self, config: dict[str, Any]) -> dict[str, Any]:
        """The spec with ``config`` applied, checked.

        Raises:
            SpecError: a value makes the spec invalid (names the key).
        """
        return self.check(apply_values(self.spec, config))

    def config_problems(self, config: dict[str, Any]) -> list[str]:
        """The problems of the spec with ``config`` applied (``trial_spec``'s check; empty when it is valid)."""
        try:
            self.trial_spec(config)
            return []
        except SpecError as err:
            return err.problems

    def write_trial(self, t: int, config: dict[str, Any], status: str, **extra: Any) -> None:
        """Trial ``t``'s spec files and ``trial.json`` with its current values (and ``extra`` keys)."""
        write_spec_files(self.predir, self.trial_spec(config), t)
        uri = trial_json(self.predir, t)
        info = storage.read_json(uri) if storage.exists(uri) else {"trial": t, "started": now_iso()}
        storage.write_json(uri, {**info, "values": config, "status": status, **extra})

    # ---------------------------------------------------------------- one generation
    def run_generation(self, frame: int, specs: dict[int, dict[str, Any]], seeds: dict[int, list[int]],
                       live: set[int] = frozenset(), reseeds: dict[int, Decision] | None = None
                       ) -> tuple[int, set[int]]:
        """Train every session of ``specs``'s trials to ``frame`` (skipping those already there).

        Args:
            live: trials whose sessions continue in memory in the actors that hold them (kept at the last decision).
            reseeds: trial -> the ``Decision`` of its exploit (with a ``reseed``): its sessions restored from its
                frame restart their acting RNG streams (``session_reseed``).

        Returns:
            (exit code of the generation's ``Trial``: 0 when every session reached ``frame``; the trials with a
            failed session).
        """
        plans = []
        for t in sorted(specs):
            for s in range(self.sessions):
                plan = SessionPlan(t, s, seeds[t][s], resume=False)
                is_done, selection = session_done(self.predir, plan, frame)
                if not is_done:
                    plan.resume, plan.frame = selection.frame is not None, selection.frame or 0
                    plans.append(plan)
        if not plans:
            return 0, set()
        at_frame = {t: {**spec, "env": {**spec["env"], "max_frame": frame}} for t, spec in specs.items()}
        record = RunRecord.load_or_new(self.predir, self.name)
        reseeds = reseeds or {}
        trial = Trial(self.spec, self.predir, plans, record, quiet=self.quiet, analyze=False, lease=self.lease,
                      hosts=self.hosts, specs=at_frame, resume_mode="search",
                      max_running=capacity(host_key(self.meta)), keep_live=True,
                      continue_live={p.key for p in plans if p.trial in live},
                      reseeds={f"t{t}_s{s}": {"frame": reseeds[t].frame, "seed": session_reseed(reseeds[t].reseed, s)}
                               for t in reseeds for s in range(self.sessions)})
        self.current = trial
        if self.stop_requested:
            trial.stop_requested = True
        try:
            code = trial.run()
        finally:
            self.current = None
        failed = {p.trial for p in plans if p.status == "failed"}
        self.hosts.forget_live({p.key for p in plans if p.trial in failed})  # siblings of a failed session
        if code == 1 and failed and all(p.status == "done" for p in plans if p.trial not in failed):
            code = 0  # the others reached the frame: the failed trials are replaced at the decision
        return code, failed

    def scores(self, frame: int, trials: list[int], since: int = 0) -> dict[int, float | None]:
        """Trial -> mean over its sessions of ``generation_score`` of the checkpoints at ``frame`` for the frames
        ``(since, frame]`` (None when no session has one)."""
        rigorous = bool(self.meta.rigorous_eval)
        out: dict[int, float | None] = {}
        for t in trials:
            values = []
            for s in range(self.sessions):
                store = CheckpointStore(predir_mod.session_dir(self.predir, t, s))
                held = store.manifest(frame).files
                evals = store.read_file(frame, "eval_df.parquet") if rigorous and "eval_df.parquet" in held else None
                score = generation_score(store.read_file(frame, "train_df.parquet"), evals, since, frame)
                if score is not None:
                    values.append(score)
            out[t] = sum(values) / len(values) if values else None
        return out

    # ---------------------------------------------------------------- exploit
    def exploit(self, record: Decision) -> None:
        """Replace trial ``record.trial``'s session state by its donor's, session for session (idempotent): the
        recipient's checkpoints are deleted manifest first, then the donor's up to the decision's frame copied."""
        t, donor, frame = record.trial, record.donor, record.frame
        self.hosts.forget_live({f"t{t}_s{s}" for s in range(self.sessions)})
        for s in range(self.sessions):
            src = predir_mod.session_dir(self.predir, donor, s)
            dst = predir_mod.session_dir(self.predir, t, s)
            CheckpointStore(src).copy_to(CheckpointStore(dst), frame)  # the donor's state at the decision's frame
            reseeded = "" if record.reseed is None else \
                f"; acting RNG streams reseeded with {session_reseed(record.reseed, s)}"
            storage.append_text(storage.join(dst, "log.txt"),
                                f"[{now_iso()}] PBT generation {record.generation}: continues from t{donor}_s{s}'s "
                                f"checkpoint at frame {frame}; values {json.dumps(record.config)}{reseeded}\n")

    # ---------------------------------------------------------------- the search
    def read_state(self) -> dict[str, Any]:
        """``pbt.json``: ``{"applied": G, "frame": F, "failed": {"g": [trials]}}`` (empty before the first)."""
        uri = storage.join(self.predir, STATE)
        return storage.read_json(uri) if storage.exists(uri) else {}

    def begin(self) -> tuple[int, dict[int, set[int]]]:
        """The generations applied so far and the failures recorded (``pbt.json``); a new population's trials get
        their initial values written first."""
        state = self.read_state()
        applied = int(state.get("applied", 0))
        if applied == 0:
            for t in self.trials:
                self.write_trial(t, self.initial[t], "running")
        return applied, {int(g): set(ts) for g, ts in state.get("failed", {}).items()}

    def run(self) -> int:
        """Run (or resume) every generation; returns the exit code (0, ``EXIT_RESUMABLE`` after a signal, 1 when a
        session failed otherwise than in a generation followed by a decision, or every trial failed)."""
        records = read_records(self.predir)
        applied, failures = self.begin()
        try:
            for g, frame in enumerate(self.boundaries, start=1):
                if g <= applied:
                    continue
                configs = self.configs_after(records, g - 1)
                # decisions recorded but not all applied (killed mid-exploit): a recipient's ckpt/ may be half
                # copied, so nothing trains before the exploits are applied again
                if sum(r.generation == g for r in records) != len(self.trials):
                    code = self.train_generation(g, records, configs, failures)
                    if code != 0 or self.stop_requested:
                        return code or EXIT_RESUMABLE
                failed = failures.get(g, set())
                if failed and (frame == self.boundaries[-1] or failed >= set(self.trials)):
                    return self.stop_failed(g, failed)
                if frame == self.boundaries[-1]:
                    break
                records = self.decide_and_apply(records, g, frame, configs, failed)
                if self.stop_requested:
                    return EXIT_RESUMABLE
        finally:
            self.hosts.clear()
        for t, config in self.configs_after(records, len(self.boundaries)).items():
            self.write_trial(t, config, "done", frame=self.boundaries[-1], finished=now_iso())
        return 0

    def train_generation(self, g: int, records: list[Decision], configs: dict[int, dict[str, Any]],
                         failures: dict[int, set[int]]) -> int:
        """Train generation ``g``: the trials kept at decision ``g - 1`` continue live, its recipients restore their
        donor's state reseeded, trials that failed in it already (``failures[g]``, from ``pbt.json``) do not train
        again; new failures are added to ``failures`` and recorded in ``pbt.json``. Returns ``run_generation``'s
        exit code."""
        before = [r for r in records if r.generation == g - 1]
        failed = failures.get(g, set())
        seeds = {t: [session_seed(self.seed, t, s) for s in range(self.sessions)] for t in self.trials}
        code, new = self.run_generation(
            self.boundaries[g - 1], {t: self.trial_spec(configs[t]) for t in self.trials if t not in failed}, seeds,
            live={r.trial for r in before if not r.exploited},
            reseeds={r.trial: r for r in before if r.exploited and r.reseed is not None})
        if new:
            failures[g] = failed | new
            storage.write_json(storage.join(self.predir, STATE),
                               {**self.read_state(), "failed": {str(k): sorted(v) for k, v in failures.items()}})
        return code

    def stop_failed(self, g: int, failed: set[int]) -> int:
        """The end of a population that cannot go on: every trial failed in generation ``g``, or some failed in the
        last one (no decision left to replace them). Marks them ``error`` and returns 1."""
        for t in sorted(failed):
            self.write_trial(t, self.configs_after(read_records(self.predir), g - 1)[t], "error")
        which = "every trial" if failed >= set(self.trials) else "trials " + ", ".join(f"t{t}" for t in sorted(failed))
        print(f"error: {self.settings.method} stopped: {which} failed in generation {g} (frames up to "
              f"{self.boundaries[g - 1]}); nothing is left to continue them from. Each failed session's error is in "
              f"its t{{T}}/s{{S}}/log.txt and run.json", file=sys.stderr)
        return 1

    def decide_and_apply(self, records: list[Decision], g: int, frame: int,
                         configs: dict[int, dict[str, Any]], failed: set[int] = frozenset()) -> list[Decision]:
        """Decision ``g`` at ``frame``: the recorded one, or a new one recorded first (``pbt.jsonl`` rewritten whole);
        then its exploits and explored values applied and ``pbt.json`` marking it applied.

        Args:
            failed: trials with a failed session in generation ``g``: no score, never donors, always replaced.

        Returns:
            Every record so far.
        """
        decided = [r for r in records if r.generation == g]
        if len(decided) != len(self.trials):
            if self.lease is not None:  # a driver that lost the run's lease records nothing (LeaseLostError: 75)
                self.lease.check()
            since = self.boundaries[g - 2] if g > 1 else 0
            scores = self.scores(frame, [t for t in self.trials if t not in failed], since)
            scores.update({t: None for t in failed})
            decided = decide(g, frame, scores, configs, self.variables, self.settings, self.seed, records,
                             len(self.boundaries), failed=failed, ranges=self.ranges, problems=self.config_problems)
            records = [r for r in records if r.generation < g] + decided
            write_records(self.predir, records)
        for r in decided:
            if r.exploited:
                if self.lease is not None:  # a driver that lost the run's lease copies nothing (LeaseLostError: 75)
                    self.lease.check()
                self.exploit(r)
            self.write_trial(r.trial, r.config, "running")
        state = self.read_state()
        storage.write_json(storage.join(self.predir, STATE),
                           {**state, "applied": g, "frame": frame,
                            "failed": {k: v for k, v in state.get("failed", {}).items() if int(k) > g}})
        self.print_generation(decided)
        return records

    def print_generation(self, decided: list[Decision]) -> None:
        """One line per exploit of a generation."""
        for r in decided:
            if r.exploited:
                print(format_exploit(r, self.settings.method), flush=True)

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


def session_reseed(reseed: int, session: int) -> int:
    """The seed session ``session`` of a recipient restarts its acting RNG streams at, from its decision's
    ``reseed`` (distinct per session, as session seeds are)."""
    return int(np.random.SeedSequence([reseed, session]).generate_state(1)[0] >> 1)


def generation_score(train_df: bytes, eval_df: bytes | None, since: int, frame: int) -> float | None:
    """The score of one session for the generation ``(since, frame]``: the mean return of the episodes that ended
    within it, from the train_df rows logged there (each row's ``total_reward`` is the mean return of the episodes
    ended since the previous row, ``epi`` counts them; rows where none ended are skipped). With ``eval_df`` (bytes of
    the checkpoint's eval_df, ``meta.rigorous_eval``) and eval rows within the generation: their mean
    ``total_reward`` instead.

    Args:
        train_df, eval_df: Parquet bytes of the checkpoint at ``frame``.

    Returns:
        The score in undiscounted return units, or None when no episode ended (no eval row) within the generation.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if eval_df is not None:
        rows = pq.read_table(pa.BufferReader(eval_df), columns=["frame", "total_reward"]).to_pylist()
        returns = [r["total_reward"] for r in rows if since < r["frame"] <= frame and _finite(r["total_reward"])]
        if returns:
            return float(np.mean(returns))
    rows = pq.read_table(pa.BufferReader(train_df), columns=["frame", "epi", "total_reward"]).to_pylist()
    epi_before = max((r["epi"] for r in rows if r["frame"] <= since), default=0)
    total = count = 0.0
    for r in sorted((r for r in rows if since < r["frame"] <= frame), key=lambda r: r["frame"]):
        ended = int(r["epi"]) - int(epi_before)
        epi_before = r["epi"]
        if ended > 0 and _finite(r["total_reward"]):
            total, count = total + float(r["total_reward"]) * ended, count + ended
    return total / count if count else None


def _finite(value: Any) -> bool:
    return value is not None and math.isfinite(float(value))


# ---------------------------------------------------------------- lineage graph
def lineage_of(predir: str, spec: dict[str, Any]) -> Any:
    """The ``orchestrator.report.pbt_graph.Lineage`` of the generations decided so far (``pbt.jsonl``: only what is
    committed), with the final scores once every session committed its checkpoint at ``max_frame``; None before the
    first decision."""
    from orchestrator.report.pbt_graph import lineage_of as build

    records = read_records(predir)
    if not records:
        return None
    pop = Population(predir, spec, None, True, lambda s: s)
    last = max(r.generation for r in records) + 1
    try:
        finals = pop.scores(pop.boundaries[-1], pop.trials, pop.boundaries[-2]) if last == len(pop.boundaries) else {}
    except (CheckpointError, storage.StorageError, KeyError):  # a session not at max_frame (yet, or failed)
        finals = {}
    return build(records, pop.initial, finals, pop.boundaries[-1],
                 frozenset(v.path for v in pop.variables if v.kind == "loguniform"))


def lineage_graph(predir: str, spec: dict[str, Any]) -> list[str]:
    """Write the lineage graph (``orchestrator.report.pbt_graph``) of ``lineage_of``; returns the files written (none
    before the first decision, or when drawing failed: one warning line)."""
    from orchestrator.report.pbt_graph import write_lineage

    lin = lineage_of(predir, spec)
    if lin is None:
        return []
    settings = PBTSettings.from_spec(spec)
    meta = MetaSpec.of(spec)
    title = f"{spec['name']}: {settings.method} lineage ({meta.max_trial} trials x {meta.max_session} sessions)"
    try:
        return write_lineage(storage.join(predir, "graph"), spec["name"], lin, title)
    except Exception as err:  # noqa: BLE001 - a graph never fails the run; `lab analyze` does not redo it
        print(f"warning: the lineage graph of {predir} was not drawn ({type(err).__name__}: {err})", file=sys.stderr)
        return []
