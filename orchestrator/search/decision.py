"""One PBT/PB2 decision as a typed record (``Decision``) and its line in ``{predir}/pbt.jsonl`` (``to_json`` /
``from_json``), without Ray, numpy or torch.

The file format: one JSON object per line, per trial and generation. Records of ``VERSION`` 2 carry every field, in
the order ``version, generation, frame, trial, rank, failed, donor, score, donor_score, config, explore, redraws,
reseed``; records written before versions (no ``version`` key) carry ``generation, frame, trial, donor, score,
donor_score, config`` only. Both are read, and each is written back in its own form, so rewriting the file keeps
every recorded line as it was.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

VERSION = 2  # pbt.jsonl records with ``version``, ``rank``, ``failed``, ``explore``, ``redraws``, ``reseed``
V1_KEYS = ("generation", "frame", "trial", "donor", "score", "donor_score", "config")


@dataclass(frozen=True)
class Decision:
    """The decision of one generation for one trial (``orchestrator.search.pbt_policy.decide``).

    Fields:
        generation: 1 for the first decision (made at the end of generation 1).
        frame: the frame every trial's checkpoint was committed at.
        trial: the trial decided about.
        donor: the trial whose state it continues from (None: it keeps its own).
        score: its score at ``frame`` (mean return; None: no finite score).
        donor_score: the donor's score (None when kept or without one).
        config: its searched values after the decision (``{dotted.path: value}``).
        version: ``VERSION``, or None for a record written before versions (fields below at their defaults).
        rank: its place in the ranking, 1 the best.
        failed: a session of the trial failed in the generation.
        explore: recipients: per key the ``explore_key`` record ``{"op", "factor" (perturb only), "before",
            "after", "clamped"}`` (op ``redraw`` after the spec check refused a value, ``kept`` for the donor's value
            kept, ``pb2`` for PB2's pick); None for kept trials.
        redraws: the problems of each config the spec check refused.
        reseed: recipients: the seed their acting RNG streams restart from (``pbt_policy.reseed``).
    """

    generation: int
    frame: int
    trial: int
    donor: int | None
    score: float | None
    donor_score: float | None
    config: dict[str, Any]
    version: int | None = VERSION
    rank: int | None = None
    failed: bool = False
    explore: dict[str, dict[str, Any]] | None = None
    redraws: list[list[str]] = field(default_factory=list)
    reseed: int | None = None

    @property
    def exploited(self) -> bool:
        """Whether the trial continues from a donor's state."""
        return self.donor is not None

    def to_json(self) -> dict[str, Any]:
        """The record as its ``pbt.jsonl`` object (module docstring: the key order of its version)."""
        if self.version is None:
            return {k: getattr(self, k) for k in V1_KEYS}
        return {"version": self.version, "generation": self.generation, "frame": self.frame, "trial": self.trial,
                "rank": self.rank, "failed": self.failed, "donor": self.donor, "score": self.score,
                "donor_score": self.donor_score, "config": self.config, "explore": self.explore,
                "redraws": self.redraws, "reseed": self.reseed}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Decision:
        """The record of one ``pbt.jsonl`` object, of any version (generations, frames, trials and seeds as int).

        Raises:
            KeyError: a key every version has is missing.
        """
        def num(value: Any, cast: type) -> Any:
            return None if value is None else cast(value)

        version = obj.get("version")
        return cls(generation=int(obj["generation"]), frame=int(obj["frame"]), trial=int(obj["trial"]),
                   donor=num(obj["donor"], int), score=obj["score"],
                   donor_score=obj["donor_score"], config=obj["config"],
                   version=num(version, int), rank=num(obj.get("rank"), int), failed=bool(obj.get("failed", False)),
                   explore=obj.get("explore"), redraws=obj.get("redraws") or [], reseed=num(obj.get("reseed"), int))
