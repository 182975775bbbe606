"""What a plain search prints while its trials run, in the lab's own format: a line with each trial's sampled values
when it starts, each session's progress as ``train`` shows it (``report.progress.SessionProgress``, sessions named
``t{T}_s{S}``: live bars on a terminal, otherwise one plain line per session at most every ``PLAIN_INTERVAL_S``
seconds and at each status change) and a line when the trial ends (done, stopped by the scheduler, failed).

The session rows reach the driver in the trial's reports to Tune (``trials.TrialReporter``: ``progress``, the
latest row and status of each session); ``ConsoleRelay``, a Tune callback in the driver, hands them to ``CONSOLE``.
Tune's own output (its tables and boxes, and a TensorBoard path of its own) is off: ``make_tuner``'s ``verbose=0``
and ``quiet_tune``.
"""

from __future__ import annotations

import contextlib
import math
import os
from typing import Any, Iterator

from ray import tune

from orchestrator.report.progress import SessionProgress
from orchestrator.report.rows import format_value

# Tune's settings while a search's fit runs (Ray's documented environment variables): the legacy output engine, which
# prints nothing at verbose=0 (the newer one still prints a results path and a TensorBoard path under Ray's temp
# dir), and no automatic CSV/JSON/TensorBoard loggers of Tune's own (TensorBoard pointed at the run would show them
# next to the sessions' event files).
QUIET_TUNE_ENV = {"RAY_AIR_NEW_OUTPUT": "0", "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1"}


@contextlib.contextmanager
def quiet_tune() -> Iterator[None]:
    """Set ``QUIET_TUNE_ENV`` for the duration (the previous values are put back after)."""
    before = {k: os.environ.get(k) for k in QUIET_TUNE_ENV}
    os.environ.update(QUIET_TUNE_ENV)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def format_metric(value: Any) -> str:
    """A metric for the console (``-`` when missing or NaN: no episode ended yet)."""
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.4g}"


class SearchConsole:
    """The console of the running search (one per driver process: ``CONSOLE``); prints nothing outside ``showing``."""

    def __init__(self) -> None:
        self.progress: SessionProgress | None = None
        self.max_frame = 0
        self.quiet = True
        self.shown: dict[str, tuple[int, str]] = {}  # session key -> (frame, status) last shown

    @contextlib.contextmanager
    def showing(self, spec: dict[str, Any], quiet: bool) -> Iterator["SearchConsole"]:
        """Show the search of ``spec`` while the block runs (``quiet``: nothing, as ``train --quiet``)."""
        self.max_frame, self.quiet, self.shown = int(spec["env"]["max_frame"]), quiet, {}
        with SessionProgress(disable=quiet) as progress:
            self.progress = progress
            try:
                yield self
            finally:
                self.progress = None

    def trial_started(self, name: str, config: dict[str, Any]) -> None:
        """``t{T} started: path=value, ...``."""
        if self.progress is not None and not self.quiet:
            values = ", ".join(f"{k}={format_value(v)}" for k, v in config.items())
            print(f"{name} started: {values}", flush=True)

    def result(self, result: dict[str, Any]) -> None:
        """Show the sessions of one trial report (``progress``: ``{t{T}_s{S}: {frame, fps, total_reward_ma,
        status}}``); a session whose frame and status did not change since it was last shown is left as it is."""
        if self.progress is None or self.quiet:
            return
        for key, row in (result.get("progress") or {}).items():
            state = (int(row.get("frame") or 0), row.get("status") or "")
            if self.shown.get(key) == state:
                continue
            changed = self.shown.get(key, (None, ""))[1] != state[1]
            self.shown[key] = state
            self.progress.update(key, row, self.max_frame, state[1], line=changed)

    def trial_ended(self, name: str, result: dict[str, Any]) -> None:
        """``t{T} done: ...`` (it ran to its end now), ``t{T} stopped by the scheduler ...``, or ``t{T} was already
        done ...`` (a finished trial that Tune ran again only for its metrics)."""
        if self.progress is None or self.quiet:
            return
        self.result(result)
        metric = f"total_reward_ma {format_metric(result.get('total_reward_ma'))} at frame {result.get('frame', 0)}"
        if result.get("ran"):
            print(f"{name} done: {metric} (mean of {result.get('sessions', 0)} session(s))", flush=True)
        elif "progress" in result:
            print(f"{name} stopped by the scheduler: {metric}", flush=True)
        else:
            print(f"{name} was already done: {metric}", flush=True)

    def trial_failed(self, name: str) -> None:
        """``t{T} failed`` (its error is printed when the search ends)."""
        if self.progress is not None and not self.quiet:
            print(f"{name} failed (its error is shown when the search ends)", flush=True)


CONSOLE = SearchConsole()


class ConsoleRelay(tune.Callback):
    """Tune callback (run in the driver) handing the trials' starts, reports and ends to ``CONSOLE``. Stateless, so a
    restored Tuner's copy (Tune pickles its callbacks) reaches this process's console."""

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """A trial (named ``t{T}`` by ``TrialNamer``) started."""
        CONSOLE.trial_started(str(trial), trial.config)

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        """A trial reported (``trials.TrialReporter``)."""
        CONSOLE.result(result)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """A trial ended: by itself or stopped by the scheduler."""
        CONSOLE.trial_ended(str(trial), trial.last_result or {})

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """A trial raised (a session failed)."""
        CONSOLE.trial_failed(str(trial))
