"""Experiment tracking of one session: TensorBoard event files (always on unless ``meta.tensorboard``
is false) and, with ``meta.tracking``, one W&B or MLflow run per session; all of it survives resume.

TensorBoard: ``t{T}/s{S}/tb/`` holds the session's event files (``tensorboard --logdir {predir}``):
each train_df metric column as scalar ``train/{column}`` and each eval_df metric column as
``eval/{column}``, at step = ``frame`` (env frames; the bookkeeping columns ``BOOKKEEPING``: ``frame``,
``epi``, ``t``, ``wall_t``, ``fps``, ``refill`` are not scalars); non-finite values (a NaN loss before the first
update) are not written. A fresh session also writes its spec as hyperparameters (HParams plugin,
metric ``train/total_reward_ma``) and as text ``spec``. Rows are written and flushed at log rows only
(the actor calls ``SessionTracker.log`` once per checkpoint chunk, before it submits the chunk's
checkpoint write), never in the step loop. A session restored from a checkpoint at frame F opens a new event file with
``purge_step = F + 1``: TensorBoard then drops every event of the older files at a step after F
(events written after the checkpoint by the killed process), so a curve never shows a step twice
and continues exactly as train_df does. On an object-store data dir (``s3://``, ``gs://``) the
writer writes to a local staging directory and each changed event file is put whole into
``tb/`` before each checkpoint commits (``upload``, on the checkpoint writer thread): a checkpoint
never commits frames whose events are not stored. TensorBoard reads ``s3://`` log dirs itself
(with ``boto3``; set ``AWS_ENDPOINT_URL``/``S3_ENDPOINT`` for other servers) or after ``aws s3 sync``.

W&B / MLflow (``meta.tracking``: ``wandb`` or ``mlflow``; ``pip install -e ".[wandb]"`` /
``".[mlflow]"``): the session is one run named ``{predir name}/t{T}_s{S}`` in group ``{predir name}``
(a trial; in a search, the experiment), with the spec as config (W&B) or params (MLflow, flattened
dotted keys). ``meta.tracking_options`` is passed on: W&B ``wandb.init`` keyword arguments (e.g.
``project`` (default: the spec name), ``entity``, ``mode``: ``offline``); MLflow ``tracking_uri`` (default:
MLflow's own, ``MLFLOW_TRACKING_URI``) and ``experiment`` (default: the spec name). The run id is
kept in ``t{T}/s{S}/tracking.json`` (written by the session actor at its first start; no race with
the driver's run.json, into which the driver copies it from the ``started`` event), so ``train@``
and actor restarts continue the same run (W&B ``resume="must"``
with the id, MLflow ``run_id``). Rows go to these backends only once a checkpoint at or after their
frame committed (a checkpoint later than TensorBoard), so a restored session never logs a step
again: neither backend can purge steps (W&B drops steps below its current one; MLflow keeps every
value). A resumed MLflow run is asked for its last step and gets the restored rows after it (a kill
between a commit and the next log loses nothing); W&B cannot be asked (offline runs), so such rows
are missing from a W&B run (train_df and TensorBoard have them). Not covered: a restore that falls
back to an older checkpoint (the newest failed verification) logs the frames after it twice in
MLflow (W&B drops them).

Timing: ``SessionTracker.seconds`` is the wall time (seconds) spent writing rows (``log``),
``SessionTracker.rows`` the train_df rows written, ``SessionTracker.setup_seconds`` the time spent
opening and closing the streams; tests print ms per log row.

Event files are written by TensorBoard's writer itself (it owns the format); every other read and
write goes through ``orchestrator.store.storage``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Iterator

from orchestrator.spec.meta import MetaSpec
from orchestrator.store import predir as predir_mod
from orchestrator.store import storage

TRACKING_FILE = "tracking.json"
TB_DIR = "tb"
HPARAM_METRIC = "train/total_reward_ma"
# log-row columns that are bookkeeping (the step, counters, timing, memory state), not metrics to plot
BOOKKEEPING = frozenset({"frame", "epi", "t", "wall_t", "fps", "refill"})








def flat_spec(spec: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Spec leaves as ``{dotted.path: value}``; lists, None and other non-scalars become JSON text."""
    out: dict[str, Any] = {}
    for key, value in spec.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            out.update(flat_spec(value, path))
        elif isinstance(value, (bool, int, float, str)):
            out[path] = value
        else:
            out[path] = json.dumps(value, default=str)
    return out


def scalars(row: dict[str, Any], prefix: str) -> dict[str, float]:
    """``{prefix/column: float}`` of a log row's finite numeric metric values (``BOOKKEEPING`` columns left
    out; ``frame`` is the step)."""
    out = {}
    for key, value in row.items():
        if key in BOOKKEEPING or not isinstance(value, (bool, int, float)) or value is None:
            continue
        value = float(value)
        if math.isfinite(value):
            out[f"{prefix}/{key}"] = value
    return out


def frame_rows(train: list[dict[str, Any]], evals: list[dict[str, Any]]) -> list[tuple[int, dict[str, float]]]:
    """Train and eval rows merged by frame: ``[(frame, {train/..: v, eval/..: v})]`` in frame order."""
    merged: dict[int, dict[str, float]] = {}
    for rows, prefix in ((train, "train"), (evals, "eval")):
        for row in rows:
            merged.setdefault(int(row["frame"]), {}).update(scalars(row, prefix))
    return sorted(merged.items())


# ---------------------------------------------------------------- TensorBoard

def has_events(tb_uri: str) -> bool:
    """True if a session's tb directory (URI) holds event files (from earlier processes)."""
    return any(n.startswith("events.out.tfevents") for n in storage.listdir(tb_uri))


TB_REMOTE_BACKENDS = ("boto3", "botocore", "fsspec")
# set by a process that is the lab's own (a session actor: SessionActor.__init__): TensorBoard's writer is imported
# there without its remote backends, which would stay off for the whole process (tensorboard decides once)
LEAN_PROCESS = {"tensorboard": False}


@contextlib.contextmanager
def without_modules(names: tuple[str, ...]) -> Iterator[None]:
    """Within the block, ``import`` of each of ``names`` not yet imported raises ImportError (Python's own
    ``sys.modules[name] = None`` convention); afterwards they import as usual.

    TensorBoard's file layer (``tensorboard.compat.tensorflow_stub.io.gfile``) imports boto3 and fsspec whenever
    they are installed, for ``s3://`` and fsspec log dirs; the lab's writer only writes a local directory (an
    object store gets its files through ``orchestrator.store.storage``), so a session actor's process, which reads no
    TensorBoard files, leaves them out (``LEAN_PROCESS``): boto3 alone is ~8 MB and 0.3 s (docs/BENCHMARKS.md
    "Process memory"). A process that uses the lab in-process keeps TensorBoard's S3 reading.
    """
    blocked = [name for name in names if name not in sys.modules]
    for name in blocked:
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        for name in blocked:
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]


class TensorBoardLog:
    """One session's TensorBoard stream in ``{session_dir}/tb`` (local or object store).

    Args:
        tb_uri: the ``tb`` directory URI of the session.
        purge_step: steps (frames) at and after it are purged from older event files (restore at
            frame F: F + 1); None for a fresh stream.

    Raises:
        ImportError: the ``tensorboard`` package is missing (it is a dependency of the lab).
    """

    def __init__(self, tb_uri: str, purge_step: int | None) -> None:
        with without_modules(TB_REMOTE_BACKENDS if LEAN_PROCESS["tensorboard"] else ()):
            from torch.utils.tensorboard import SummaryWriter

        self.uri, self.remote = tb_uri, storage.is_remote(tb_uri)
        self.local = tempfile.mkdtemp(prefix="rl-trial-lab-tb-") if self.remote else storage.resolve(tb_uri)[1]
        os.makedirs(self.local, exist_ok=True)
        self.writer = SummaryWriter(self.local, purge_step=purge_step, max_queue=1000, flush_secs=3600)
        self.lock = threading.Lock()
        self.staged: dict[str, bytes] = {}  # file name -> complete bytes not yet put (object stores)

    def write(self, rows: list[tuple[int, dict[str, float]]]) -> None:
        """Add scalars ``[(frame, {tag: value})]``, flush to disk, and stage changed files for upload."""
        for frame, values in rows:
            for tag, value in values.items():
                self.writer.add_scalar(tag, value, frame)
        self.flush()

    def hparams(self, spec: dict[str, Any]) -> None:
        """Write the spec as HParams (dotted keys) and as JSON text ``spec`` (fresh streams only)."""
        from torch.utils.tensorboard.summary import hparams

        for summary in hparams(flat_spec(spec), {HPARAM_METRIC: math.nan}):
            self.writer.file_writer.add_summary(summary)
        self.writer.add_text("spec", "```\n" + json.dumps(spec, indent=1, default=str) + "\n```", 0)
        self.flush()

    def flush(self) -> None:
        """Flush the writer; on object stores read each event file whole (complete records) to stage it.

        Raises:
            storage.StorageError: the event file cannot be written (e.g. a full disk).
        """
        try:
            self.writer.flush()
        except OSError as err:
            raise storage.storage_error(f"cannot write TensorBoard events in '{self.uri}': {err}", self.uri,
                                        err) from None
        if not self.remote:
            return
        with self.lock:
            for name in os.listdir(self.local):
                with open(os.path.join(self.local, name), "rb") as f:
                    self.staged[name] = f.read()

    def upload(self) -> None:
        """Put the staged event files into ``tb/`` (object stores; a no-op locally).

        Raises:
            storage.StorageError: a put failed (the files stay staged and go with the next upload).
        """
        with self.lock:
            staged, self.staged = self.staged, {}
        try:
            for name, data in staged.items():
                storage.write_bytes(storage.join(self.uri, name), data)
        except storage.StorageError:
            with self.lock:
                self.staged = {**staged, **self.staged}
            raise

    def close(self) -> None:
        """Flush, upload (object stores) and close the writer; remove the staging directory."""
        self.flush()
        self.writer.close()
        self.upload()
        if self.remote:
            shutil.rmtree(self.local, ignore_errors=True)


# ---------------------------------------------------------------- W&B and MLflow

class WandbRun:
    """A W&B run of one session (``wandb.init``; ``resume="must"`` when ``run_id`` is given).

    Args:
        spec: the session's spec (config); name, group: run name and group; run_id: an existing
            run's id or None for a new run; local_dir: directory for W&B's local files;
        options: extra ``wandb.init`` keyword arguments (``meta.tracking_options``).
    """

    def __init__(self, spec: dict[str, Any], name: str, group: str, run_id: str | None, local_dir: str,
                 options: dict[str, Any]) -> None:
        import wandb

        os.makedirs(local_dir, exist_ok=True)
        kwargs = {"project": spec["name"], "settings": wandb.Settings(silent=True, console="off"), **options}
        self.run = wandb.init(id=run_id, resume="must" if run_id else None, name=name, group=group,
                              config=spec, dir=local_dir, reinit="create_new", **kwargs)
        self.run_id = self.run.id

    def last_frame(self) -> int | None:
        """The last frame this run holds: unknown (None) for W&B, whose offline runs cannot be read."""
        return None

    def log(self, rows: list[tuple[int, dict[str, float]]]) -> None:
        """Log ``[(frame, {tag: value})]`` at ``step = frame`` (frames increase)."""
        for frame, values in rows:
            self.run.log(values, step=frame)

    def close(self) -> None:
        """Finish the run (it can be resumed by id)."""
        self.run.finish()


class MlflowRun:
    """An MLflow run of one session, through ``MlflowClient`` (no global active run).

    Args:
        spec, name, group, run_id: as ``WandbRun``; options: ``tracking_uri``, ``experiment``.
    """

    def __init__(self, spec: dict[str, Any], name: str, group: str, run_id: str | None,
                 options: dict[str, Any]) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(options.get("tracking_uri"))
        if run_id:
            self.client.update_run(run_id, status="RUNNING")
            self.run_id = run_id
            return
        experiment = self.experiment_id(options.get("experiment", spec["name"]))
        self.run_id = self.client.create_run(experiment, run_name=name, tags={"group": group}).info.run_id
        params = [Param(k[:250], str(v)[:6000]) for k, v in flat_spec(spec).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def experiment_id(self, name: str) -> str:
        """Id of the experiment ``name``, created if missing (sibling sessions may race to create it)."""
        from mlflow.exceptions import MlflowException

        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(name)
        except MlflowException:
            return self.client.get_experiment_by_name(name).experiment_id

    def last_frame(self) -> int | None:
        """The last frame (step) of ``train/opt_step`` (finite in every row) this run holds; None if none."""
        steps = [m.step for m in self.client.get_metric_history(self.run_id, "train/opt_step")]
        return max(steps) if steps else None

    def log(self, rows: list[tuple[int, dict[str, float]]]) -> None:
        """Log ``[(frame, {tag: value})]`` as metrics at ``step = frame`` (batches of 1000)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(tag, value, now, frame) for frame, values in rows for tag, value in values.items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def close(self) -> None:
        """Mark the run finished (``update_run`` sets it running again on resume)."""
        self.client.set_terminated(self.run_id)


# ---------------------------------------------------------------- the session's tracker

def logged_counts(session: Any, last_frame: int | None, restored: tuple[int, int]) -> tuple[int, int]:
    """(train rows, eval rows) of a restored session that a resumed run already holds: those at frames
    up to ``last_frame`` (the run's newest step), or all ``restored`` rows when the run cannot tell."""
    if last_frame is None:
        return restored
    return (sum(r["frame"] <= last_frame for r in session.train_rows),
            sum(r["frame"] <= last_frame for r in session.eval_rows))


class SessionTracker:
    """TensorBoard and the optional W&B/MLflow run of one session; the actor's only tracking hooks.

    Call order (``SessionRunner``): ``start`` once (after a restore), ``log`` at each checkpoint chunk
    before its write is submitted, ``upload`` on the writer thread before each commit, ``close`` at the end.

    Args:
        spec: the checked flat spec; predir: run URI; trial, session: indices.
        log_line: where upload failures are reported (the session's log.txt).
    """

    def __init__(self, spec: dict[str, Any], predir: str, trial: int, session: int,
                 log_line: Callable[[str], None] = print) -> None:
        meta = MetaSpec.of(spec)
        self.spec, self.log_line = spec, log_line
        self.backend, self.options = meta.tracking, dict(meta.tracking_options or {})
        self.enabled_tb = bool(meta.tensorboard)
        self.session_dir = predir_mod.session_dir(predir, trial, session)
        self.group = storage.basename(predir)
        self.name = f"{self.group}/t{trial}_s{session}"
        self.tb: TensorBoardLog | None = None
        self.run: WandbRun | MlflowRun | None = None
        self.n_tb = self.n_run = (0, 0)  # (train rows, eval rows) already written
        self.seconds, self.rows, self.setup_seconds = 0.0, 0, 0.0

    def start(self, session: Any, restored_frame: int | None) -> None:
        """Open the streams; a restored session (at ``restored_frame``) continues them.

        TensorBoard: purge after ``restored_frame``; when the tb directory has no events yet (tracking
        turned on at resume, a copied run without them), the restored rows are written first. W&B /
        MLflow: the run id in tracking.json is resumed, else a new run starts (the restored rows are
        logged to it).
        """
        begin = time.perf_counter()
        restored = (len(session.train_rows), len(session.eval_rows))
        if self.enabled_tb:
            tb_uri = storage.join(self.session_dir, TB_DIR)
            continued = restored_frame is not None and has_events(tb_uri)
            self.tb = TensorBoardLog(tb_uri, restored_frame + 1 if continued else None)
            if continued:
                self.n_tb = restored
            else:
                self.tb.hparams(self.spec)
        if self.backend != "none":
            run_id = self.saved_run_id()
            self.run = self.open_run(run_id)
            if run_id is None:
                storage.write_json(storage.join(self.session_dir, TRACKING_FILE), self.record())
            else:
                self.n_run = logged_counts(session, self.run.last_frame(), restored)
        self.setup_seconds += time.perf_counter() - begin

    def record(self) -> dict[str, str] | None:
        """``{"backend", "run_id", "name", "group"}`` of the W&B/MLflow run (for run.json), or None."""
        if self.run is None:
            return None
        return {"backend": self.backend, "run_id": self.run.run_id, "name": self.name, "group": self.group}

    def saved_run_id(self) -> str | None:
        """The run id of this backend in tracking.json, or None (no file, or another backend's)."""
        uri = storage.join(self.session_dir, TRACKING_FILE)
        if not storage.exists(uri):
            return None
        saved = storage.read_json(uri)
        return saved["run_id"] if saved.get("backend") == self.backend else None

    def open_run(self, run_id: str | None) -> WandbRun | MlflowRun:
        """Start or resume the W&B / MLflow run."""
        if self.backend == "wandb":
            local = self.session_dir if not storage.is_remote(self.session_dir) else \
                os.path.join(tempfile.gettempdir(), "rl-trial-lab-wandb", self.name.replace("/", "_"))
            return WandbRun(self.spec, self.name, self.group, run_id, storage.resolve(local)[1], self.options)
        return MlflowRun(self.spec, self.name, self.group, run_id, self.options)

    def log(self, session: Any, committed: int | None) -> None:
        """Write the session's new rows: all to TensorBoard (flushed), those at frames up to the
        committed checkpoint ``committed`` (frames; None: none yet) to W&B / MLflow."""
        begin = time.perf_counter()
        train, evals = session.train_rows, session.eval_rows
        if self.tb is not None:
            self.tb.write(frame_rows(train[self.n_tb[0]:], evals[self.n_tb[1]:]))
            self.rows += len(train) - self.n_tb[0]
            self.n_tb = (len(train), len(evals))
        if self.run is not None and committed is not None:
            new_train = [r for r in train[self.n_run[0]:] if r["frame"] <= committed]
            new_eval = [r for r in evals[self.n_run[1]:] if r["frame"] <= committed]
            self.run.log(frame_rows(new_train, new_eval))
            self.n_run = (self.n_run[0] + len(new_train), self.n_run[1] + len(new_eval))
        self.seconds += time.perf_counter() - begin

    def upload(self) -> None:
        """Put staged TensorBoard files into the object store (before a checkpoint commits); a failure
        is reported to ``log_line`` and retried with the next upload."""
        if self.tb is None or not self.tb.remote:
            return
        try:
            self.tb.upload()
        except storage.StorageError as err:
            self.log_line(f"tensorboard upload failed (retried at the next checkpoint): {err}")

    def close(self, session: Any, committed: int | None) -> None:
        """Log what is left up to ``committed``, then close TensorBoard (uploading it) and the run."""
        self.log(session, committed)
        begin = time.perf_counter()
        if self.tb is not None:
            self.tb.close()
        if self.run is not None:
            self.run.close()
        self.setup_seconds += time.perf_counter() - begin
