"""Replay memory per 1M Atari transitions (issue 11's goal: <= 7.2 GB), measured on a real Pong stream.

Steps ``ALE/Pong-v5`` with the lab's Atari preprocessing (``envs.make.make_env``: sticky actions, frame skip 4 with
max-pool, 84x84 grayscale uint8, 4 frames stacked: (4, 84, 84) observations) under a uniform random policy, N
sub-envs, and adds every transition, as a session does (``final_obs`` at episode ends), to each replay kind at
``max_size`` = the number of transitions:

- ``Replay`` with float32 storage (the lab before uint8 storage; SLM-Lab stores uint8 frames as they are);
- ``Replay`` in the space's dtype, uint8 (obs and next_obs: two copies of each stacked observation);
- ``FrameOnceReplay``: each stacked observation once, the next one by index, episode ends keeping their true final
  observation (what ``agent.memory.optimize_memory_usage: true`` gave Atari before ``FrameStackReplay``; it still
  does for observations that are not (K, H, W) stacks);
- ``FrameStackReplay`` (``Replay`` on Atari unless ``agent.memory.optimize_memory_usage`` is false): each 84x84 frame
  once, a row's stack rebuilt from its sub-env's previous rows, whole stacks kept only for heads (episode starts, each
  stream's oldest row) and episode ends' true final observations;
- ``PrioritizedFrameStackReplay`` (``PrioritizedReplay`` on Atari, the same condition): that storage plus the sum tree.

``Replay.nbytes`` (its preallocated arrays plus what it holds beside them) divided by the transitions stored gives
bytes per transition; times 1,000,000 the projected bytes of a 1M-transition replay (GB = 10**9 bytes). The
preallocated arrays scale exactly with ``max_size``; what a real stream adds (final observations of episode ends,
``FrameStackReplay``'s heads) is the part this run measures. ``max_size`` equal to the transitions: the ring has not
wrapped, so everything the stream added is still held (a wrapped ring adds one head per sub-env).

Usage:
    python bench/replay_memory.py [--transitions 20000] [--envs 4] [--seed 1]
        [--out bench/results/replay_memory.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.memory import FrameOnceReplay, FrameStackReplay, PrioritizedFrameStackReplay, Replay  # noqa: E402
from envs.make import EnvSpec, final_obs, make_env, sub_env_seeds  # noqa: E402

GOAL_GB = 7.2  # issue 11: replay memory per 1M Atari transitions


def measure(transitions: int, num_envs: int, seed: int) -> dict[str, Any]:
    """Fill the five replay kinds with ``transitions`` transitions (rounded down to whole vector steps) of a
    random-policy Pong stream; returns bytes per transition and projected GB per 1M transitions per kind.

    Raises:
        ValueError: ``num_envs`` < 1 or ``transitions`` < 2 * ``num_envs`` (``FrameOnceReplay`` needs two vector
            steps).
    """
    if num_envs < 1 or transitions < 2 * num_envs:
        raise ValueError(f"--envs must be >= 1 and --transitions >= 2 * --envs, got {num_envs} and {transitions}")
    steps = transitions // num_envs
    size = steps * num_envs
    env = make_env(EnvSpec("ALE/Pong-v5", max_frame=size, num_envs=num_envs), seed=seed)
    space = env.single_observation_space
    memories = {"Replay (float32)": Replay(size, space.shape, (), np.int64, 32, obs_dtype=np.float32),
                "Replay (uint8)": Replay(size, space.shape, (), np.int64, 32, obs_dtype=np.uint8),
                "FrameOnceReplay (uint8)": FrameOnceReplay(size, space.shape, (), np.int64, 32, obs_dtype=np.uint8),
                "FrameStackReplay (uint8)": FrameStackReplay(size, space.shape, (), np.int64, 32, obs_dtype=np.uint8),
                "PrioritizedFrameStackReplay (uint8)": PrioritizedFrameStackReplay(size, space.shape, (), np.int64, 32,
                                                                                   obs_dtype=np.uint8)}
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=sub_env_seeds(seed, num_envs))
    episodes, t0 = 0, time.perf_counter()
    for _ in range(steps):
        act = rng.integers(0, env.single_action_space.n, num_envs)
        next_obs, reward, term, trunc, info = env.step(act)
        done = term | trunc
        for mem in memories.values():
            mem.add(obs, act, reward, final_obs(next_obs, done, info), term, trunc)
        episodes += int(done.sum())
        obs = next_obs
    env.close()
    kinds = {name: {"bytes_per_transition": mem.nbytes / len(mem),
                    "gb_per_1m": mem.nbytes / len(mem) * 1e6 / 1e9} for name, mem in memories.items()}
    return {"env": "ALE/Pong-v5", "obs_shape": list(space.shape), "obs_dtype": str(space.dtype),
            "transitions": size, "num_envs": num_envs, "episode_ends": episodes,
            "seconds": time.perf_counter() - t0, "goal_gb_per_1m": GOAL_GB, "kinds": kinds}


def main(argv: list[str] | None = None) -> int:
    """The command line (usage in the module docstring): measures, prints a table, writes the JSON; returns 0."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--transitions", type=int, default=20000)
    ap.add_argument("--envs", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "bench/results/replay_memory.json"))
    args = ap.parse_args(argv)
    try:
        rec = measure(args.transitions, args.envs, args.seed)
    except ValueError as e:
        ap.error(str(e))  # exit 2, no traceback
    rec["created"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    print(f"{rec['transitions']:,} transitions of {rec['env']} {tuple(rec['obs_shape'])} {rec['obs_dtype']}, "
          f"{rec['num_envs']} sub-envs, {rec['episode_ends']} episode ends\n")
    print("| replay | bytes / transition | GB per 1M transitions | goal |\n|---|---|---|---|")
    for name, k in rec["kinds"].items():
        met = "met" if k["gb_per_1m"] <= GOAL_GB else "not met"
        print(f"| {name} | {k['bytes_per_transition']:,.0f} | {k['gb_per_1m']:.2f} | <= {GOAL_GB} GB: {met} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rec, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
