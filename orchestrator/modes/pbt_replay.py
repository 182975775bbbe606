"""``lab SPEC NAME train --pbt-replay PREDIR --trial T``: train trial ``T`` of a finished PBT search from scratch
through its recorded schedule (``orchestrator.search.pbt.replay``) in a new run directory, then compare it with the
original: final train_df (all columns but ``wall_t`` and ``fps``) and ``weights_sha256`` of every session."""

from __future__ import annotations

import sys
from typing import Any

from orchestrator.commandline import Command, mode_header
from orchestrator.errors import UsageError
from orchestrator.modes.common import resolve_predir
from orchestrator.runtime.ray_start import check_resources, init_ray
from orchestrator.search.pbt_replay import compare_replay, replay
from orchestrator.spec.meta import MetaSpec
from orchestrator.store import predir as predir_mod
from orchestrator.store import storage
from orchestrator.store.lease import Lease
from orchestrator.store.predir import read_json_file


def run_replay(cmd: Command) -> int:
    """Run the replay; returns 0 when it reproduced the trial bit for bit, 1 when it did not (differences printed)
    or a session failed, ``EXIT_RESUMABLE`` when a signal stopped it (start it again: a replay is one trial).

    Raises:
        UsageError: wrong mode or options, or the run named is not a finished PBT search (exit 2); the run dir
            this command created is removed again when the replay is refused before writing in it.
    """
    if cmd.word != "train" or cmd.pbt_replay is None or cmd.trial is None:
        raise UsageError("--pbt-replay PREDIR and --trial T go together, with the train mode: "
                         "lab SPEC_FILE SPEC_NAME train --pbt-replay PREDIR --trial T")
    if cmd.overrides or cmd.name:
        raise UsageError("--pbt-replay replays the search's saved spec: it takes no -s overrides and no --name")
    source = resolve_predir(cmd.pbt_replay, cmd.data_dir, cmd.spec_name)
    settings = storage.join(source, "search.json")
    if not storage.exists(settings) or storage.read_json(settings).get("search_alg") not in ("PBT", "PB2"):
        raise UsageError(f"--pbt-replay: '{source}' is not a PBT search (its search.json does not say PBT or PB2)")
    spec = read_json_file(predir_mod.spec_file(source, cmd.spec_name), "--pbt-replay: the search's saved spec")
    meta = MetaSpec.of(spec)
    init_ray(cmd.address, cmd.dashboard)
    check_resources(meta.resources, meta.max_session)
    predir = predir_mod.new_predir(cmd.data_dir, spec["name"])
    try:
        with Lease(predir, cmd.word):
            return replay_into(cmd, source, spec, predir)
    except UsageError:  # refused before the replay wrote anything (e.g. no trial --trial): the dir created above goes
        if not storage.listdir(predir):
            storage.delete(predir)
        raise


def replay_into(cmd: Command, source: str, spec: dict[str, Any], predir: str) -> int:
    """The replay of ``run_replay`` in the new run dir ``predir`` (its lease held); returns the exit code.

    Raises:
        UsageError: ``source`` has no trial ``cmd.trial`` or has not applied every generation's decisions
            (before anything is written in ``predir``).
    """
    from orchestrator.spec.load import check

    meta = MetaSpec.of(spec)
    print(f"{mode_header(cmd.word, predir)} (replay of PBT trial t{cmd.trial} of {source})")
    code, schedule = replay(source, cmd.trial, spec, predir, cmd.quiet, check)
    final = storage.read_json(predir_mod.spec_file(predir, spec["name"], 0))
    storage.write_json(predir_mod.spec_file(predir, spec["name"]), {**final, "search": {}})
    if code != 0:
        return code
    from orchestrator.report.analysis import analyze_after_run
    from orchestrator.trial import aggregate_trial
    aggregate_trial(predir, final, [0])
    analyze_after_run(predir)
    steps = " -> ".join(f"t{step['trial']}" for step in schedule)
    differences = compare_replay(source, cmd.trial, predir, meta.max_session)
    if differences:
        print(f"replay of t{cmd.trial} ({steps}) differs from the original:\n  " + "\n  ".join(differences),
              file=sys.stderr)
        return 1
    print(f"replay of t{cmd.trial} (generations trained by {steps}): final train_df and weights_sha256 of "
          f"every session equal the original's\n  {predir}")
    return 0
