"""EnvPool as the session's vector env (``env.vectorization: envpool``): C++ sub-envs stepped by a thread pool.

EnvPool (Weng et al. 2022, "EnvPool: A Highly Parallel Reinforcement Learning Environment Execution Engine") runs
N sub-envs on ``num_threads`` C++ threads with no Python subprocesses, pipes or pickled observations. This module
maps a spec's ``env`` section onto an EnvPool task and its options, and presents it with the same contract as
``envs.make.make_env``'s gymnasium vector envs (``EnvPoolVectorEnv``):

* ids: gymnasium ids map to EnvPool's (``ALE/Pong-v5`` and ``PongNoFrameskip-v4`` -> ``Pong-v5``; ``CartPole-v1``,
  ``HalfCheetah-v5``, ... as they are); SLM-Lab v5.3's MuJoCo Playground ids ``playground/X`` map to EnvPool's CPU
  versions (``MuJoCoPlayground/X-v1`` for locomotion and manipulation, ``X-v1`` of its DeepMind Control Suite for
  the Playground's DM Control tasks) with a warning naming both ids (``resolve_envpool_id``).
* Atari: SLM-Lab's settings become EnvPool options (``atari_options``): frame skip 4 with a max-pool over the last
  two frames, sticky actions (``repeat_action_probability``, the gymnasium path's value), 1..``noop_max`` no-op
  resets, episodic life on training envs, sign reward clipping on training envs, ``stack_num`` frames of 84x84
  grayscale uint8 (INTER_AREA resize, as gymnasium's ``AtariPreprocessing``), no fire reset.
* autoreset: EnvPool resets a finished sub-env on its next step (gymnasium's ``NEXT_STEP``); for ``same_step``
  (the lab's default) the finished sub-envs are stepped once more at once (EnvPool's own reset step, so episodic
  life continues the game), the returned rows are the next episode's first observations and ``info["final_obs"]``
  holds the true final ones.
* ``info["episode"]`` (``r``, ``l``, ``t``; mask ``_episode``) reports whole games with their true returns: the
  unclipped game reward (EnvPool's ``info["reward"]``), and a game ends on game over or truncation, not on a lost
  life, as ``RecordEpisodeStatistics`` placed before ``LifeLossTermination`` and reward clipping reports it.
* Dict observations (Playground's ``state`` + ``privileged_state``, DM Control's named parts) are concatenated in
  the space's key order into one float32 vector, as SLM-Lab flattens them.

EnvPool cannot save or restore its sub-envs' state, so ``envs.state.capture`` of this env raises ``EnvStateError``
with that reason: a checkpoint then records ``exact: false`` and a resume resets the env (``Session.from_checkpoint``).
Seeds: ``reset(seed=[s_0, ..., s_{N-1}])`` builds the pool with ``env_seed`` = each ``s_i`` mod 2**31 (EnvPool's
seeds are int32), so every sub-env keeps its own ``sub_env_seeds`` stream.
"""

from __future__ import annotations

import difflib
import math
import time
import warnings
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from envs.ids import ensure_registered, is_atari, resolve_env_id, sticky_probability
from envs.state import EnvStateError

VECTORIZATION = "envpool"
PLAYGROUND_PREFIX = "playground/"
STATE_NOT_SAVED = "EnvPool cannot save or restore its sub-envs' state (C++ envs behind a thread pool)"
_announced: set[str] = set()  # Playground ids whose mapping was warned about in this process


def _envpool() -> Any:
    """The ``envpool`` module (imported on first use: ~0.7 s).

    Raises:
        ValueError: EnvPool is not installed (it needs Python >= 3.11).
    """
    try:
        import envpool
    except ImportError as err:
        raise ValueError(f"env.vectorization 'envpool' needs the envpool package ({err}); install it with "
                         "pip install envpool==1.2.5 (Python >= 3.11)") from None
    return envpool


def envpool_ids() -> set[str]:
    """Every task id EnvPool registers."""
    return set(_envpool().list_all_envs())


def resolve_envpool_id(name: str) -> str:
    """The EnvPool task id of a spec's ``env.name``.

    ``playground/X`` (SLM-Lab v5.3's MuJoCo Playground ids) -> ``MuJoCoPlayground/X-v1``, else the DM Control Suite
    task ``X-v1`` (the Playground's DM Control tasks), with a warning naming both ids. A gymnasium id is first
    resolved as ``envs.ids.resolve_env_id`` does (old ids -> successors), then ``ALE/X-v5`` / ``XNoFrameskip-v4`` ->
    ``X-v5`` (the v4 ids' semantics, no sticky actions, come from ``atari_options``); other ids are EnvPool's own.

    Raises:
        ValueError: naming the id when EnvPool has no such task, or a non-Playground id is unknown to both
            gymnasium and EnvPool.
    """
    ids = envpool_ids()
    if name.startswith(PLAYGROUND_PREFIX):
        task = name[len(PLAYGROUND_PREFIX):]
        for candidate in (f"MuJoCoPlayground/{task}-v1", f"{task}-v1"):
            if candidate in ids:
                if name in _announced:
                    return candidate
                _announced.add(name)
                warnings.warn(f"env '{name}' (MuJoCo Playground, MJX) runs as EnvPool's CPU task '{candidate}'",
                              stacklevel=2)
                return candidate
        tasks = {i.split("/")[-1].removesuffix("-v1").lower(): i.split("/")[-1].removesuffix("-v1")
                 for i in ids if i.endswith("-v1")}
        close = difflib.get_close_matches(task.lower(), list(tasks), n=1)
        hint = f"; did you mean '{PLAYGROUND_PREFIX}{tasks[close[0]]}'?" if close else ""
        raise ValueError(f"env '{name}': EnvPool has no MuJoCo Playground task '{task}' (neither "
                         f"'MuJoCoPlayground/{task}-v1' nor '{task}-v1'), so it cannot run here{hint}")
    if name in ids:
        return name
    gym_id = resolve_env_id(name)  # ValueError for ids gymnasium does not know either
    if gym_id in ids:
        return gym_id
    if is_atari(gym_id):
        game = gym_id.split("/")[-1].split("-")[0].removesuffix("NoFrameskip").removesuffix("Deterministic")
        if f"{game}-v5" in ids:
            return f"{game}-v5"
    raise ValueError(f"env '{name}' has no EnvPool version; expected env.vectorization 'sync' or 'async' for it")


def is_envpool_atari(task_id: str) -> bool:
    """True for an EnvPool Atari task (``Pong-v5``, ...)."""
    return "repeat_action_probability" in _envpool().make_spec(task_id).config._fields


def atari_options(spec: Any, gym_id: str, train: bool = True) -> dict[str, Any]:
    """EnvPool options giving an Atari task the gymnasium path's preprocessing (``envs.make.make_sub_env``).

    Args:
        spec: the ``EnvSpec``.
        gym_id: the gymnasium id of the game (``ALE/Pong-v5``, ``PongNoFrameskip-v4``), whose registration gives
            the sticky-action probability and the episode limit the gymnasium path uses.
        train: a training env (episodic life and reward clipping as the spec says) or not (neither).

    Returns:
        ``frame_skip``, ``repeat_action_probability``, ``noop_max``, ``episodic_life``, ``reward_clip``,
        ``stack_num``, ``img_height``, ``img_width``, ``gray_scale``, ``use_inter_area_resize``,
        ``use_fire_reset``, ``max_episode_steps`` (agent steps).
    """
    reg = gym.registry[gym_id.split(":")[-1]]
    limits = [v for v in (reg.max_episode_steps, reg.kwargs.get("max_num_frames_per_episode")) if v]
    max_steps = spec.max_t if spec.max_t is not None else \
        (math.ceil(min(limits) / spec.frame_skip) if limits else 27000)
    return {
        "frame_skip": spec.frame_skip,
        "repeat_action_probability": sticky_probability(gym_id, spec),
        "noop_max": max(spec.noop_max, 1),  # EnvPool draws 1..noop_max (0 is not allowed there)
        "episodic_life": bool(train and (spec.life_loss_info is None or spec.life_loss_info)),
        "reward_clip": bool(train and spec.reward_scale in (None, "sign")),
        "stack_num": spec.frame_op_len or 4,
        "img_height": 84, "img_width": 84, "gray_scale": True, "use_inter_area_resize": True,
        "use_fire_reset": False,
        "max_episode_steps": int(max_steps),
    }


def _flat_space(space: gym.Space) -> gym.spaces.Box:
    """The lab's observation space of an EnvPool space: a float Box (bounds EnvPool reports as +-tiny/huge become
    unbounded; float64 stays float64, as gymnasium's MuJoCo envs), an integer Box as it is, a Dict -> one float32
    vector of its parts in key order."""
    if isinstance(space, gym.spaces.Dict):
        size = sum(int(np.prod(s.shape)) for s in space.spaces.values())
        return gym.spaces.Box(-np.inf, np.inf, (size,), np.float32)
    if not isinstance(space, gym.spaces.Box):
        raise ValueError(f"EnvPool observation space {space} is not supported (expected a Box or a Dict of Boxes)")
    if np.issubdtype(space.dtype, np.floating):
        bounded = np.all(np.abs(space.low) < 1e30) and np.all(np.abs(space.high) < 1e30) and np.all(space.low < 0)
        if not bounded:
            return gym.spaces.Box(-np.inf, np.inf, space.shape, space.dtype)
    return space


class EnvPoolVectorEnv(VectorEnv):
    """An EnvPool task as a gymnasium ``VectorEnv`` with the session's contract (see the module docstring).

    Args:
        task_id: EnvPool task id (``resolve_envpool_id``).
        num_envs: N sub-envs.
        num_threads: EnvPool worker threads (>= 1).
        options: EnvPool options (``atari_options``, ``max_episode_steps``).
        autoreset: ``"same_step"`` or ``"next_step"`` (``envs.make.EnvSpec.autoreset``).
        atari: True for an Atari task (true game returns from ``info["reward"]`` and game over).

    Observations (N, *O) as the space says (uint8 (N, k, 84, 84) on Atari), rewards float32 (N,) (clipped when
    ``reward_clip``), terminated / truncated bool (N,). The pool is built on the first ``reset`` and rebuilt by each
    ``reset(seed=...)``.

    Raises:
        envs.state.EnvStateError (on ``envs.state.capture``): always; EnvPool cannot save its sub-envs' state.
    """

    def __init__(self, task_id: str, num_envs: int, num_threads: int, options: dict[str, Any],
                 autoreset: str = "same_step", atari: bool = False) -> None:
        self.task_id, self.num_envs, self.num_threads = task_id, int(num_envs), max(1, int(num_threads))
        self.options, self.atari = dict(options), atari
        self.autoreset_mode = AutoresetMode.SAME_STEP if autoreset == "same_step" else AutoresetMode.NEXT_STEP
        self.metadata = {"autoreset_mode": self.autoreset_mode}
        spec = _envpool().make_spec(task_id, **self.options)
        with warnings.catch_warnings():  # gymnasium's note on EnvPool's float64 bounds of float32 spaces
            warnings.simplefilter("ignore", UserWarning)
            self._raw_space = spec.gymnasium_observation_space
            self.single_action_space = spec.gymnasium_action_space
        self.single_observation_space = _flat_space(self._raw_space)
        if isinstance(self.single_action_space, gym.spaces.Box):
            act = self.single_action_space
            self.single_action_space = gym.spaces.Box(act.low.astype(np.float32), act.high.astype(np.float32),
                                                      act.shape, np.float32)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._pool: Any = None
        self._seeds: list[int] | None = None
        self._act_dtype = np.int32 if isinstance(self.single_action_space, gym.spaces.Discrete) else np.float64
        self._episode_return = np.zeros(self.num_envs)
        self._episode_length = np.zeros(self.num_envs, np.int64)
        self._episode_start = np.zeros(self.num_envs)
        self._pending = np.zeros(self.num_envs, bool)  # next_step: rows whose next step is EnvPool's reset step

    def _build(self, seeds: list[int] | None) -> None:
        """(Re)build the pool, with per-sub-env seeds when given."""
        if self._pool is not None:
            self._pool.close()
        extra = {} if seeds is None else {"env_seed": [int(s) % 2**31 for s in seeds]}
        with warnings.catch_warnings():  # as in __init__: EnvPool's float64 bounds of float32 spaces
            warnings.simplefilter("ignore", UserWarning)
            self._pool = _envpool().make_gymnasium(self.task_id, num_envs=self.num_envs, batch_size=self.num_envs,
                                                   num_threads=self.num_threads, **self.options, **extra)
            _ = self._pool.observation_space, self._pool.action_space  # computed (and cached) on first use

    def _obs(self, obs: Any) -> np.ndarray:
        """EnvPool observations -> (n, *O): Dict parts concatenated in key order as float32."""
        if isinstance(self._raw_space, gym.spaces.Dict):
            parts = [np.asarray(obs[k]).reshape(len(np.asarray(obs[k])), -1) for k in self._raw_space.spaces]
            return np.concatenate(parts, axis=1).astype(np.float32)
        return np.asarray(obs)

    def reset(self, *, seed: int | list[int] | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every sub-env; ``seed`` (an int: sub-env i gets ``seed + i``; or N ints) rebuilds the pool with those
        seeds. Returns observations (N, *O) and EnvPool's info."""
        if seed is not None:
            seeds = [int(seed) + i for i in range(self.num_envs)] if np.isscalar(seed) else list(seed)
            if len(seeds) != self.num_envs:
                raise ValueError(f"reset(seed=...) needs {self.num_envs} seeds, got {len(seeds)}")
            self._build(seeds)
        elif self._pool is None:
            self._build(None)
        obs, info = self._pool.reset()
        self._episode_return[:] = 0
        self._episode_length[:] = 0
        self._episode_start[:] = time.perf_counter()
        self._pending[:] = False
        return self._obs(obs), info

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """One step of every sub-env (see the class docstring for the autoreset and episode statistics)."""
        obs, reward, terminated, truncated, info = self._pool.step(np.asarray(actions, self._act_dtype))
        obs, reward = self._obs(obs), np.asarray(reward, np.float32)
        terminated, truncated = np.asarray(terminated, bool), np.asarray(truncated, bool)
        raw = np.asarray(info["reward"], np.float64) if self.atari else reward.astype(np.float64)
        counted = ~self._pending  # next_step: EnvPool's reset step is not part of an episode
        self._episode_return[counted] += raw[counted]
        self._episode_length[counted] += 1
        done = terminated | truncated
        game_over = done & (np.asarray(info["terminated"], bool) | truncated) if self.atari else done
        info = dict(info)
        if game_over.any():
            now = time.perf_counter()
            info["episode"] = {"r": np.where(game_over, self._episode_return, 0.0),
                               "l": np.where(game_over, self._episode_length, 0),
                               "t": np.where(game_over, now - self._episode_start, 0.0)}
            info["_episode"] = game_over
            self._episode_return[game_over] = 0
            self._episode_length[game_over] = 0
            self._episode_start[game_over] = now
        if self.autoreset_mode == AutoresetMode.NEXT_STEP:
            self._pending = done
        elif done.any():
            obs = self._same_step_reset(obs, done, info)
        return obs, reward, terminated, truncated, info

    def _same_step_reset(self, obs: np.ndarray, done: np.ndarray, info: dict[str, Any]) -> np.ndarray:
        """Step the finished sub-envs once more (EnvPool's reset step: their actions are ignored) and return the
        observations with their rows replaced by the next episode's first ones; ``info["final_obs"]`` /
        ``info["_final_obs"]`` get the true final observations."""
        ids = np.flatnonzero(done).astype(np.int32)
        final = np.full(self.num_envs, None, dtype=object)
        for i in ids:
            final[i] = obs[i].copy()
        info["final_obs"], info["_final_obs"] = final, done.copy()
        noop = np.zeros((len(ids), *self.single_action_space.shape), self._act_dtype)
        first, _, _, _, reset_info = self._pool.step(noop, ids)
        obs = obs.copy()
        obs[np.asarray(reset_info["env_id"])] = self._obs(first)
        return obs

    def close(self, **kwargs: Any) -> None:
        """Close the pool (its threads stop)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def env_state(self) -> dict[str, Any]:
        """The ``envs.state`` protocol: always refuses.

        Raises:
            EnvStateError: EnvPool cannot save its sub-envs' state (``STATE_NOT_SAVED``).
        """
        raise EnvStateError(STATE_NOT_SAVED)


def gym_atari_id(name: str, task_id: str) -> str:
    """The gymnasium id whose registration describes an EnvPool Atari task: ``name`` when gymnasium knows it
    (``ALE/Pong-v5``, ``PongNoFrameskip-v4``), else ``ALE/{game}-v5`` (an EnvPool id such as ``Pong-v5``)."""
    ensure_registered(name)
    return name if name in gym.registry else f"ALE/{task_id}"


def make_envpool(spec: Any, num_threads: int) -> tuple[EnvPoolVectorEnv, bool]:
    """The EnvPool vector env of an ``EnvSpec`` (before reward scaling and observation wrappers).

    Args:
        spec: the ``EnvSpec`` (``vectorization: envpool``).
        num_threads: EnvPool worker threads.

    Returns:
        ``(env, atari)``: the ``EnvPoolVectorEnv`` (not yet reset) and whether it is an Atari task (then rewards
        are already sign-clipped where the spec asks for it).

    Raises:
        ValueError: an id EnvPool does not have, Atari keys on another env, or ``frame_op`` on a non-Atari env.
    """
    task_id = resolve_envpool_id(spec.name)
    atari = is_envpool_atari(task_id)
    if atari:
        options = atari_options(spec, gym_atari_id(spec.name, task_id))
    else:
        if spec.life_loss_info or spec.repeat_action_probability is not None:
            raise ValueError(f"env '{spec.name}': life_loss_info / repeat_action_probability apply to Atari envs only")
        if spec.frame_op is not None:
            raise ValueError(f"env.frame_op: frame stacking of non-Atari envs is not built for env.vectorization "
                             f"'envpool' (env '{spec.name}'); use 'sync' or 'async'")
        if spec.continuous is not None:
            raise ValueError(f"env.continuous: not an option of EnvPool's '{task_id}'; use env.vectorization 'sync'")
        options = {} if spec.max_t is None else {"max_episode_steps": int(spec.max_t)}
    env = EnvPoolVectorEnv(task_id, spec.num_envs, num_threads, options, spec.autoreset, atari)
    return env, atari

