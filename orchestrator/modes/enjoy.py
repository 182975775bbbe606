"""``enjoy@{session_spec_file}``: replay a trained session without training (docs/ARCHITECTURE.md sections 3, 7).

The target is the ``{spec_name}_t{T}_s{S}_spec.json`` of a run (path or URI). Enjoy loads that
session's best checkpoint (highest ``total_reward_ma`` in the manifests; ``--ckpt latest`` or an
``@latest`` suffix takes the newest), restores the session on CPU, and runs ``--episodes`` evaluation
episodes on a fresh one-env copy of the training env (no reward scaling; observation normalization
with the training statistics, frozen).

Exploration is at its end values, as in SLM-Lab's enjoy: actions come from ``algorithm.act`` with a
clock whose frame lies beyond every schedule, so epsilon / temperature are their schedules'
``final_val``; policy-gradient agents sample their policy. ``--seed`` (default: the session seed)
reseeds the env and the acting RNGs, so one seed always gives the same returns.

Outputs go only to ``{predir}/enjoy/{YYYY_MM_DD_HHMMSS}[_k]/``: ``returns.parquet`` (one row per
episode: ``episode, total_reward, t``), ``summary.json`` and, with ``--record``, one MP4 per episode.
Enjoy reads the run and never writes anything else (no run.json, no checkpoint, no train_df):
unlike ``train@``, a checkpoint that fails verification is skipped, not moved aside.
"""

from __future__ import annotations

import importlib.util
import math
import os
import shutil
import sys
import tempfile
import warnings
from datetime import datetime
from typing import Any

import numpy as np

from orchestrator.commandline import DEFAULT_EPISODES, Command
from orchestrator.errors import SpecError, UsageError
from orchestrator.modes.common import dev_run_hint, is_dev_run
from orchestrator.spec.session_spec import parse_target, read_session_spec
from orchestrator.store import storage
from orchestrator.store.checkpoint import CheckpointError, CheckpointStore, Manifest
from orchestrator.store.predir import TS_FORMAT

FAR_FRAME = 2**62  # a clock frame past the end of every schedule: explore vars at their final values


def load_checkpoint(session_dir: str, which: str) -> tuple[Manifest, dict[str, bytes]]:
    """The verified best or latest checkpoint of a session (read-only).

    Raises:
        UsageError: no checkpoint was committed, or none verifies.
    """
    try:
        found = CheckpointStore(session_dir).load_readonly(which)
    except CheckpointError as err:
        raise UsageError(f"enjoy: {err}") from None
    if found is None:
        raise UsageError(f"enjoy: no committed checkpoint in {session_dir}")
    return found


def check_display(render: bool) -> str | None:
    """``"human"`` when rendering was asked for and a display exists; warns and returns None otherwise."""
    if not render:
        return None
    has_display = os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
    if sys.platform.startswith("linux") and not has_display:
        warnings.warn("--render: no display (DISPLAY/WAYLAND_DISPLAY unset); running without rendering",
                      stacklevel=2)
        return None
    return "human"


def make_eval_env(session: Any, render_mode: str | None, video_dir: str | None) -> Any:
    """One-env copy of the session's env for evaluation (no reward scaling, frozen obs statistics).

    Raises:
        UsageError: a package needed to render or record (pygame, moviepy) is missing.
    """
    import gymnasium as gym

    from agents.nets import seq_len_of
    from envs.make import eval_spec, make_env

    es = session.spec.env
    spec = eval_spec(es, 1)
    if video_dir is not None:
        if importlib.util.find_spec("moviepy") is None:
            raise UsageError("--record needs moviepy, which is not installed: pip install moviepy "
                             "(or gymnasium[other])")
        render_mode = "rgb_array"
    try:
        env = make_env(spec, None, render_mode=render_mode, video_folder=video_dir,
                       seq_len=seq_len_of(session.spec.agent.net))
    except gym.error.DependencyNotInstalled as err:
        raise UsageError(f"--render/--record: a package is missing: {err}") from None
    if es.normalize_state or es.normalize_obs:
        env.obs_rms = session.env.obs_rms
        env.update_running_mean = False
    return env


def run_episodes(session: Any, env: Any, episodes: int, seed: int) -> list[dict[str, Any]]:
    """Run ``episodes`` episodes with exploration at its final values; one row per episode.

    Returns:
        ``[{"episode": i, "total_reward": undiscounted return, "t": length in steps}]``.

    Raises:
        UsageError: a package needed to render or record is missing (found on the first reset).
    """
    import gymnasium as gym

    from envs.clock import Clock

    algo = session.algorithm
    algo.reseed(seed)
    clock = Clock(FAR_FRAME, 1)
    clock.frame = FAR_FRAME
    try:
        obs, _ = env.reset(seed=seed)
    except gym.error.DependencyNotInstalled as err:
        raise UsageError(f"--render/--record: a package is missing: {err}") from None
    rows: list[dict[str, Any]] = []
    while len(rows) < episodes:
        obs, _, terminated, truncated, info = env.step(algo.env_action(algo.act(obs, clock)))
        if (terminated | truncated).any():
            rows.append({"episode": len(rows), "total_reward": float(np.asarray(info["episode"]["r"])[0]),
                         "t": int(np.asarray(info["episode"]["l"])[0])})
    return rows


def new_output_dir(predir: str) -> str:
    """``{predir}/enjoy/{ts}`` (``_1``, ``_2``... appended when that name is taken); not created yet."""
    base = storage.join(predir, "enjoy", datetime.now().strftime(TS_FORMAT))
    out, k = base, 0
    while storage.exists(out):
        k += 1
        out = f"{base}_{k}"
    return out


def summarize(rows: list[dict[str, Any]]) -> dict[str, float]:
    """mean / std (population) / min / max of the episodes' ``total_reward``."""
    returns = np.array([r["total_reward"] for r in rows])
    return {"mean": float(returns.mean()), "std": float(returns.std()), "min": float(returns.min()),
            "max": float(returns.max())}


def write_outputs(out_dir: str, rows: list[dict[str, Any]], summary: dict[str, Any],
                  video_dir: str | None) -> list[str]:
    """Write returns.parquet, the videos and summary.json (last); returns the video names."""
    import pandas as pd

    returns = pd.DataFrame(rows, columns=["episode", "total_reward", "t"])
    storage.write_parquet(storage.join(out_dir, "returns.parquet"), returns)
    videos = sorted(n for n in os.listdir(video_dir) if n.endswith(".mp4")) if video_dir else []
    for name in videos:
        with open(os.path.join(video_dir, name), "rb") as f:
            storage.write_bytes(storage.join(out_dir, name), f.read())
    storage.write_json(storage.join(out_dir, "summary.json"), {**summary, "videos": videos})
    return videos


def run_enjoy(cmd: Command) -> int:
    """``enjoy@{session_spec_file}``: see the module docstring; returns the exit code (0).

    Raises:
        UsageError / SpecError: bad target, no checkpoint, missing render/record packages.
    """
    import torch

    from orchestrator.session.loop import Session

    episodes = DEFAULT_EPISODES if cmd.episodes is None else cmd.episodes
    if episodes < 1:
        raise UsageError(f"--episodes must be >= 1, got {episodes}")
    uri, which = parse_target(cmd.target, cmd.ckpt)
    spec, smeta = read_session_spec(uri, cmd.spec_name)
    predir = storage.dirname(uri)
    session_dir = storage.join(predir, *smeta["session_dir"].split("/"))
    if is_dev_run(predir) and not CheckpointStore(session_dir).frames():
        raise UsageError(f"enjoy: no committed checkpoint in {session_dir}: '{predir}' is a dev run, and dev runs "
                         f"never checkpoint; train the spec with a train run, then enjoy@ its session spec file: "
                         f"{dev_run_hint(predir)}")
    manifest, files = load_checkpoint(session_dir, which)
    torch.set_num_threads(1)
    session = Session(spec, int(smeta["session_seed"]), int(smeta["trial"]), int(smeta["session"]),
                      fresh=False)
    try:
        session.from_checkpoint(files)
    except (KeyError, RuntimeError, ValueError) as err:
        raise SpecError(f"checkpoint {manifest.frame} does not fit the session spec {uri}: {err}") from None
    seed = int(smeta["session_seed"]) if cmd.seed is None else int(cmd.seed)
    video_dir = tempfile.mkdtemp(prefix="lab-enjoy-") if cmd.record else None
    try:
        env = make_eval_env(session, check_display(cmd.render), video_dir)
        try:
            rows = run_episodes(session, env, episodes, seed)
        finally:
            env.close()  # RecordVideo writes the last video on close
        stats = summarize(rows)
        explore = session.algorithm.explore_var(FAR_FRAME)
        checkpoint = {"which": which, "frame": manifest.frame,
                      "total_reward_ma": manifest.meta.get("total_reward_ma")}
        summary = {"session_spec": uri, "spec_name": spec["name"], "trial": smeta["trial"],
                   "session": smeta["session"], "checkpoint": checkpoint, "seed": seed, "episodes": len(rows),
                   **stats, "explore_var": None if math.isnan(explore) else explore,
                   "created": datetime.now().isoformat()}
        out_dir = new_output_dir(predir)
        write_outputs(out_dir, rows, summary, video_dir)
    finally:
        session.close()
        if video_dir is not None:
            shutil.rmtree(video_dir, ignore_errors=True)
    print(f"enjoy {spec['name']} t{smeta['trial']}_s{smeta['session']}, {which} checkpoint at frame "
          f"{manifest.frame}: {len(rows)} episodes, return mean={stats['mean']:.2f} std={stats['std']:.2f} "
          f"min={stats['min']:.2f} max={stats['max']:.2f}\n  results: {out_dir}")
    return 0
