"""Resume-edit rules: which spec keys a ``train@``/``search@`` may change mid-run, and the merge of a new spec into the
saved one."""

from __future__ import annotations

import copy
from typing import Any

from orchestrator.errors import SpecError
from orchestrator.spec.aliases import apply_key_aliases
from orchestrator.spec.load import check
from orchestrator.spec.pbt import PBT_RESUME_FIXED, is_pbt
from orchestrator.spec.schema import fill_defaults
from orchestrator.store.predir import read_json_file, spec_file

# Edits a resume may apply: they change only the future of a run (docs/ARCHITECTURE.md section 5).
RESUME_EDITABLE = ("env.max_frame", "meta.log_frequency", "meta.eval_frequency", "meta.checkpoint_frequency",
                   "meta.checkpoint_interval_s", "meta.keep_checkpoints", "meta.resources", "meta.max_session",
                   "meta.rigorous_eval",
                   "meta.max_restarts", "meta.shutdown_grace_s", "meta.tensorboard", "meta.tracking",
                   "meta.tracking_options")


# null in the spec given on train@ keeps the saved value: the seed, and the replay layout (null picks one by the
# observations; a run saved with an explicit true/false keeps the layout its checkpointed replay is in)
KEEP_SAVED_IF_UNSET = ("meta.random_seed", "agent.memory.optimize_memory_usage")
# "auto" in the spec given on a resume keeps the number the run picked when it started
KEEP_SAVED_IF_AUTO = ("meta.session_batch",)


def _leaves(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Flatten nested dicts to ``{dotted.path: leaf}`` (lists are leaves)."""
    if not isinstance(tree, dict) or not tree:
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(_leaves(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def resume_edits(saved: dict[str, Any], new: dict[str, Any]) -> tuple[dict[str, Any], list[str], list[str]]:
    """Compare the spec a run was saved with against the spec given on ``train@``.

    Edits under ``RESUME_EDITABLE`` are applied (``max_frame`` and ``max_session`` only upwards, and neither in a
    PBT search: ``PBT_RESUME_FIXED``); every other difference contradicts the past. ``meta.random_seed`` unset in
    the new spec means "keep the saved seed", ``agent.memory.optimize_memory_usage`` unset "keep the saved replay
    layout", ``meta.session_batch: "auto"`` "keep the number the run picked". Keys the saved spec lacks (fields
    added to the lab since it was saved, e.g. ``env.noop_max``, ``agent.net.conv_hid_layers``) take their current
    defaults, so older runs resume.

    Args:
        saved: the checked spec stored in the predir.
        new: the checked spec from the spec file and ``-s`` overrides.

    Returns:
        (merged spec, applied edits as "key: old -> new", conflicts as "key: saved X, given Y").
    """
    # keys added to the lab after the run was saved: their defaults; keys renamed since: their new name
    saved = fill_defaults(apply_key_aliases(copy.deepcopy(saved), warn=False))
    old_leaves, new_leaves = _leaves(saved), _leaves(new)
    merged = copy.deepcopy(saved)
    applied, conflicts = [], []
    for key in sorted(set(old_leaves) | set(new_leaves)):
        old, value = old_leaves.get(key), new_leaves.get(key)
        if old == value or key == "name" or (key in KEEP_SAVED_IF_UNSET and value is None) \
                or (key in KEEP_SAVED_IF_AUTO and value == "auto"):
            continue
        editable = any(key == e or key.startswith(e + ".") for e in RESUME_EDITABLE)
        lowered = key in ("env.max_frame", "meta.max_session") and isinstance(old, int) and value < old
        population = key in PBT_RESUME_FIXED and is_pbt(saved)
        if not editable or lowered or population:
            why = " (may only be raised)" if lowered else ""
            why = " (a PBT population keeps it: its generations and recorded decisions depend on it)" \
                if population else why
            conflicts.append(f"{key}: the run was saved with {old!r}, the spec gives {value!r}{why}")
            continue
        node = merged
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
        applied.append(f"{key}: {old!r} -> {value!r}")
    conflicts += _group_conflicts(saved, merged)
    return merged, applied, conflicts


def _group_conflicts(saved: dict[str, Any], merged: dict[str, Any]) -> list[str]:
    """A raised ``meta.max_session`` that would put new sessions into a saved seed group (``meta.session_batch``:
    its remainder group), whose sessions must stay the ones it ran with to resume exactly."""
    k = int(merged["meta"].get("session_batch") or 1)
    old, new = int(saved["meta"].get("max_session") or 1), int(merged["meta"].get("max_session") or 1)
    if k == 1 or new == old or old % k == 0:
        return []
    return [f"meta.max_session: the run was saved with {old!r}, the spec gives {new!r} (with meta.session_batch {k} "
            f"the new sessions would join the group of sessions {old - old % k}..{old - 1}, which must keep running "
            f"as it ran; raise it from a multiple of {k} only)"]


def resume_spec(predir: str, new_spec: dict[str, Any],
                what: str = "the run's saved spec") -> tuple[dict[str, Any], list[str], dict[str, Any]]:
    """The spec a resume of ``predir`` runs (``train@``, ``search@``): the run's saved spec with the edits of
    ``new_spec`` (the checked spec given now) merged by ``resume_edits``, checked again.

    Returns:
        (merged checked spec, applied edits as "key: old -> new", the saved spec as read).

    Raises:
        SpecError: edits that contradict the run's past (each key with both values).
        UsageError: the saved spec is missing or damaged (``what`` names it).
        storage.StorageError: the store cannot be read.
    """
    saved = read_json_file(spec_file(predir, new_spec["name"]), what)
    merged, applied, conflicts = resume_edits(saved, new_spec)
    if conflicts:
        raise SpecError([f"cannot resume {predir}: the spec contradicts the run's past"] + conflicts)
    return check(merged), applied, saved


