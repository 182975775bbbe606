"""The session clock: the counters that drive every schedule, cadence and log row.

Units (docs/ARCHITECTURE.md section 1):

* ``frame``: env frames summed over all vector sub-envs (one ``env.step`` of N envs adds N).
* ``t``: steps of sub-env 0 in its current episode (SLM-Lab's ``t``).
* ``epi``: completed episodes summed over all sub-envs.
* ``opt_step``: optimizer steps (not samples, unlike SLM-Lab v4).
* ``wall_t``: seconds of training, continuous across resumes.
* ``resume_count``: how many times the session was restored from a checkpoint.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np


class Clock:
    """Per-session counters; ``state_dict()`` / ``load_state_dict()`` make it resumable.

    Args:
        max_frame: frame budget of the session (frames).
        num_envs: sub-envs per vector step, so ``tick`` advances ``frame`` by this many.

    Raises:
        ValueError: if ``max_frame`` or ``num_envs`` is not positive.
    """

    def __init__(self, max_frame: int, num_envs: int = 1) -> None:
        if max_frame <= 0:
            raise ValueError(f"max_frame must be > 0 frames, got {max_frame}")
        if num_envs <= 0:
            raise ValueError(f"num_envs must be > 0, got {num_envs}")
        self.max_frame = int(max_frame)
        self.num_envs = int(num_envs)
        self.frame = 0
        self.t = 0
        self.epi = 0
        self.opt_step = 0
        self.resume_count = 0
        self._wall_t_offset = 0.0
        self._start: float | None = None  # perf_counter() when the timer started; None: stopped

    @property
    def wall_t(self) -> float:
        """Seconds since the training loop first started, including time before any resume."""
        running = 0.0 if self._start is None else time.perf_counter() - self._start
        return self._wall_t_offset + running

    def start_timer(self) -> None:
        """Start the wall timer if it is stopped (the loop calls this each time it (re)starts)."""
        if self._start is None:
            self._start = time.perf_counter()

    def tick(self, done_N: np.ndarray) -> None:
        """Advance one vector step.

        Args:
            done_N: bool array (N,), true where a sub-env's episode ended (terminated or truncated)
                on this step.
        """
        self.frame += self.num_envs
        n_done = int(done_N.sum())
        if n_done:
            self.epi += n_done
        self.t = 0 if done_N[0] else self.t + 1

    def tick_opt_step(self, n: int = 1) -> None:
        """Count ``n`` optimizer steps."""
        self.opt_step += n

    def done(self) -> bool:
        """True once the frame budget is spent."""
        return self.frame >= self.max_frame

    def crossed(self, prev_frame: int, frequency: int) -> bool:
        """True if a multiple of ``frequency`` frames lies in ``(prev_frame, frame]``.

        Vector envs advance ``frame`` by ``num_envs``, so an exact ``frame % frequency == 0`` test
        could skip boundaries; this is SLM-Lab's ``frame_mod`` made exact. Non-positive
        ``frequency`` means never.
        """
        return frequency > 0 and self.frame // frequency > prev_frame // frequency

    def state_dict(self) -> dict[str, Any]:
        """Counters as plain numbers (``wall_t`` in seconds)."""
        return {
            "frame": self.frame,
            "t": self.t,
            "epi": self.epi,
            "opt_step": self.opt_step,
            "wall_t": self.wall_t,
            "resume_count": self.resume_count,
            "num_envs": self.num_envs,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore counters; ``max_frame`` stays as constructed (a resume may raise it).

        Raises:
            KeyError: naming a missing counter.
            ValueError: if the saved ``num_envs`` differs (frames would no longer line up).
        """
        for key in ("frame", "t", "epi", "opt_step", "wall_t", "resume_count", "num_envs"):
            if key not in state:
                raise KeyError(f"clock state lacks '{key}'")
        if int(state["num_envs"]) != self.num_envs:
            raise ValueError(f"clock num_envs {state['num_envs']} != {self.num_envs}")
        self.frame = int(state["frame"])
        self.t = int(state["t"])
        self.epi = int(state["epi"])
        self.opt_step = int(state["opt_step"])
        self.resume_count = int(state["resume_count"])
        self._wall_t_offset = float(state["wall_t"])
        self._start = None

    def __repr__(self) -> str:
        return (f"Clock(frame={self.frame}/{self.max_frame}, epi={self.epi}, t={self.t}, "
                f"opt_step={self.opt_step}, wall_t={self.wall_t:.1f}s)")
