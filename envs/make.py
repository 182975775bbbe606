"""Env construction: spec ``env`` section -> a seeded ``gymnasium.vector`` env.

Every session env is a vector env (``num_envs`` = 1 included), so the session loop has one shape
contract: observations ``(N, *O)``, rewards/terminated/truncated ``(N,)``. Sub-envs auto-reset in
``SAME_STEP`` mode: the observation returned on a done step is the next episode's first one and
the true final observation is in ``info["final_obs"]``.

The sync vector env is built from ``functools.partial(gym.make, ...)`` so it pickles (DESIGN.md
section 5: env state can be checkpointed).

Seeds (DESIGN.md section 8): ``make_env`` seeds only the vector action space with the session seed;
the reset seeds of the sub-envs come from ``sub_env_seeds(session_seed, num_envs, stream, index)``,
a ``numpy.random.SeedSequence`` of the session seed. Sub-env i is therefore *not* ``seed + i``
(gymnasium's default for an int reset seed), which would make sessions s and s + 1 of a trial
share N - 1 env streams.
"""

from __future__ import annotations

import functools
import importlib
import warnings
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv, VectorEnv, VectorWrapper
from gymnasium.vector.utils import batch_space
from gymnasium.wrappers.utils import RunningMeanStd

TRAIN_STREAM = 0  # sub_env_seeds stream of the training env's resets (index: resume_count)
EVAL_STREAM = 1  # sub_env_seeds stream of the evaluation env's resets (index: frame)

# SLM-Lab / old gym ids that gymnasium no longer registers -> their successors.
OLD_ENV_IDS: dict[str, str] = {
    "LunarLander-v2": "LunarLander-v3",
    "LunarLanderContinuous-v2": "LunarLanderContinuous-v3",
    "BipedalWalker-v2": "BipedalWalker-v3",
    "BipedalWalkerHardcore-v2": "BipedalWalkerHardcore-v3",
    "CarRacing-v0": "CarRacing-v3",
    "Pendulum-v0": "Pendulum-v1",
    "Acrobot-v0": "Acrobot-v1",
}


@dataclass(frozen=True)
class EnvSpec:
    """The spec ``env`` section, validated by ``orchestrator.spec``.

    Fields: ``name`` (gymnasium id), ``num_envs`` (sub-envs per vector env), ``max_frame``
    (frame budget of a session, summed over sub-envs), ``max_t`` (episode step limit or None for
    the env's own), ``normalize_state`` (running mean/std of observations), ``reward_scale``
    (float multiplier, ``"sign"`` for sign clipping, or None), ``vectorization`` (``"sync"`` or
    ``"async"``).

    SLM-Lab v5's running normalizers (its meaning: gymnasium's vector wrappers): ``normalize_obs``
    (running mean/std of observations, as ``normalize_state``, then clipped to ``[-clip_obs, clip_obs]``),
    ``normalize_reward`` (rewards divided by the running std of the discounted return with the
    algorithm's ``gamma``, then clipped to ``[-clip_reward, clip_reward]``). ``clip_obs`` / ``clip_reward``
    (default 10, SLM-Lab's) apply only with their normalizer; null: no clip. The statistics are part of the
    pickled vector env, so they are in every checkpoint (``env.pkl``) and a resume is exact.
    """

    name: str
    max_frame: int = field(metadata={"gt": 0})
    num_envs: int = field(default=1, metadata={"gt": 0})
    max_t: int | None = field(default=None, metadata={"gt": 0})
    normalize_state: bool = False
    reward_scale: float | str | None = None
    vectorization: str = field(default="sync", metadata={"choices": ("sync", "async")})
    normalize_obs: bool = False
    normalize_reward: bool = False
    clip_obs: float | None = field(default=10.0, metadata={"gt": 0})
    clip_reward: float | None = field(default=10.0, metadata={"gt": 0})


def resolve_env_id(name: str) -> str:
    """Map an id gymnasium no longer registers to its successor, with a warning.

    Ids gymnasium still has (e.g. ``CartPole-v0``) are returned as they are. A custom env may be
    given as ``"module:EnvId-v0"`` (gymnasium's syntax): the module is imported to register it.

    Raises:
        ValueError: if neither ``name`` nor its mapped successor is registered, or the module of a
            ``module:EnvId`` name cannot be imported.
    """
    if ":" in name:
        module, env_id = name.split(":", 1)
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise ValueError(f"env '{name}': cannot import module '{module}': {err}") from None
        if env_id not in gym.registry:
            raise ValueError(f"unknown env id '{env_id}': module '{module}' does not register it")
        return name
    if name in gym.registry:
        return name
    new = OLD_ENV_IDS.get(name)
    if new is not None and new in gym.registry:
        warnings.warn(f"env '{name}' is not in gymnasium; using its successor '{new}'", stacklevel=2)
        return new
    raise ValueError(f"unknown env id '{name}': gymnasium has no such environment registered")


def _clip(values: np.ndarray, bound: float) -> np.ndarray:
    """``values`` clipped to ``[-bound, bound]`` (a module-level function, so the wrapper pickles)."""
    return np.clip(values, -bound, bound)


def make_env(spec: EnvSpec, seed: int | None, render_mode: str | None = None,
             video_folder: str | None = None, gamma: float = 0.99) -> VectorEnv:
    """Build the session's vector env and reset-seed it.

    Args:
        spec: the env section.
        seed: session seed; seeds the vector action space only (None: unseeded). Reset the env with
            ``env.reset(seed=sub_env_seeds(seed, spec.num_envs))`` for seeded sub-envs.
        render_mode: gymnasium render mode of every sub-env (``"human"``, ``"rgb_array"``) or None.
        video_folder: local directory where gymnasium's ``RecordVideo`` writes every episode as MP4
            (needs ``render_mode="rgb_array"``, moviepy, and one sub-env: names are per sub-env).
        gamma: discount of the return whose running std ``normalize_reward`` divides by (the algorithm's).

    Returns:
        A ``VectorEnv`` with ``num_envs`` sub-envs; the episode statistics wrapper sits before
        reward scaling so ``info["episode"]["r"]`` is the true undiscounted return.

    Raises:
        ValueError: unknown env id or vectorization mode.
    """
    env_id = resolve_env_id(spec.name)
    kwargs = {} if spec.max_t is None else {"max_episode_steps": spec.max_t}
    env_fns = [functools.partial(gym.make, env_id, **kwargs) for _ in range(spec.num_envs)]
    if render_mode is not None or video_folder is not None:
        env_fns = [functools.partial(_make_rendered, env_id, render_mode, video_folder, kwargs)] * spec.num_envs
    if spec.vectorization == "sync":
        venv: VectorEnv = SyncVectorEnv(env_fns, autoreset_mode=AutoresetMode.SAME_STEP)
    elif spec.vectorization == "async":
        venv = AsyncVectorEnv(env_fns, autoreset_mode=AutoresetMode.SAME_STEP)
    else:
        raise ValueError(f"env.vectorization must be 'sync' or 'async', got '{spec.vectorization}'")
    venv = gym.wrappers.vector.RecordEpisodeStatistics(venv)
    if spec.reward_scale == "sign":
        venv = gym.wrappers.vector.TransformReward(venv, np.sign)
    elif spec.reward_scale is not None:
        venv = gym.wrappers.vector.TransformReward(venv, functools.partial(np.multiply, float(spec.reward_scale)))
    if spec.normalize_reward:
        venv = gym.wrappers.vector.NormalizeReward(venv, gamma=gamma)
        if spec.clip_reward is not None:
            venv = gym.wrappers.vector.TransformReward(venv, functools.partial(_clip, bound=float(spec.clip_reward)))
    if spec.normalize_state or spec.normalize_obs:  # outermost, so ``env.obs_rms`` / ``update_running_mean`` reach it
        clip = spec.clip_obs if spec.normalize_obs else None
        venv = NormalizeObservation(venv, clip=None if clip is None else float(clip))
    venv.action_space.seed(seed)
    return venv


def sub_env_seeds(seed: int, num_envs: int, stream: int = TRAIN_STREAM, index: int = 0) -> list[int]:
    """Reset seeds of a vector env's sub-envs, derived from (session seed, stream, index, sub-env).

    ``SeedSequence(seed, spawn_key=(stream, index)).generate_state(num_envs, uint64)``: for a given
    session seed each (stream, index) pair (e.g. the training env after ``index`` resumes, or the eval
    env at frame ``index``) gets its own seeds, and two different session seeds share none except by
    a 64-bit hash collision (probability about n**2 / 2**65 for n seeds in all). Pass the list to
    ``env.reset(seed=...)``.

    Args:
        seed: the session seed, an int >= 0.
        num_envs: N, sub-envs of the vector env.
        stream: which reset sequence (``TRAIN_STREAM``, ``EVAL_STREAM``), an int >= 0.
        index: position in that sequence (resume count, frame), an int >= 0.

    Returns:
        N distinct-with-overwhelming-probability ints in [0, 2**64).

    Raises:
        ValueError: if ``seed``, ``stream`` or ``index`` is negative, or ``num_envs`` < 1.
    """
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    if min(seed, stream, index) < 0:
        raise ValueError(f"seed ({seed}), stream ({stream}) and index ({index}) must be >= 0")
    seq = np.random.SeedSequence(int(seed), spawn_key=(int(stream), int(index)))
    return [int(x) for x in seq.generate_state(num_envs, np.uint64)]


class NormalizeObservation(VectorWrapper):
    """Running mean/std observation normalization for ``SAME_STEP`` autoreset vector envs.

    gymnasium's own vector ``NormalizeObservation`` accepts only ``NEXT_STEP`` autoreset because it
    would leave ``info["final_obs"]`` unnormalized; this one normalizes the returned observations
    (N, *O) and the final observations in ``info`` with the same statistics. ``obs_rms`` holds the
    statistics (updated from every returned batch while ``update_running_mean`` is true); the
    wrapper pickles with them. ``clip`` (SLM-Lab's ``clip_obs``) bounds the normalized values.
    """

    def __init__(self, env: VectorEnv, epsilon: float = 1e-8, clip: float | None = None) -> None:
        super().__init__(env)
        self.clip = clip
        shape = env.single_observation_space.shape
        self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, shape, np.float32)
        self.observation_space = batch_space(self.single_observation_space, env.num_envs)
        self.obs_rms = RunningMeanStd(shape=shape, dtype=np.float32)
        self.update_running_mean = True
        self.epsilon = epsilon

    def normalize(self, obs: np.ndarray) -> np.ndarray:
        """``(obs - mean) / sqrt(var + epsilon)`` as float32, clipped to ``[-clip, clip]`` when set."""
        out = ((obs - self.obs_rms.mean) / np.sqrt(self.obs_rms.var + self.epsilon)).astype(np.float32)
        clip = getattr(self, "clip", None)  # checkpoints pickled before clip existed have none
        return out if clip is None else np.clip(out, -clip, clip)

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        obs, info = self.env.reset(seed=seed, options=options)
        if self.update_running_mean:
            self.obs_rms.update(obs)
        return self.normalize(obs), info

    def step(self, actions: Any) -> tuple[np.ndarray, Any, Any, Any, dict]:
        obs, reward, terminated, truncated, info = self.env.step(actions)
        if self.update_running_mean:
            self.obs_rms.update(obs)
        if "final_obs" in info:
            final = np.array(info["final_obs"], dtype=object)  # a copy: None where not done
            for i in np.flatnonzero(info["_final_obs"]):
                final[i] = self.normalize(np.asarray(final[i]))
            info = {**info, "final_obs": final}
        return self.normalize(obs), reward, terminated, truncated, info


def _make_rendered(env_id: str, render_mode: str | None, video_folder: str | None,
                   kwargs: dict[str, Any]) -> gym.Env:
    """One sub-env with a render mode; with ``video_folder``, every episode is recorded there."""
    env = gym.make(env_id, render_mode=render_mode, **kwargs)
    if video_folder is not None:
        env = gym.wrappers.RecordVideo(env, video_folder, episode_trigger=_every_episode, name_prefix="episode")
    return env


def _every_episode(episode: int) -> bool:
    return True


def final_obs(next_obs_NO: np.ndarray, done_N: np.ndarray, info: dict[str, Any]) -> np.ndarray:
    """The true next observations of a step: ``info["final_obs"]`` where an episode ended.

    Args:
        next_obs_NO: observations returned by ``env.step`` (N, *O); on done rows these already
            belong to the next episode (SAME_STEP autoreset).
        done_N: bool (N,), terminated | truncated.
        info: the step's info dict.

    Returns:
        (N, *O) array; a copy only when some sub-env is done.
    """
    if not done_N.any():
        return next_obs_NO
    out = next_obs_NO.copy()
    for i in np.flatnonzero(done_N):
        out[i] = info["final_obs"][i]
    return out


def episode_returns(info: dict[str, Any]) -> np.ndarray:
    """Undiscounted returns of the episodes that ended this step (before reward scaling), (k,)."""
    episode = info.get("episode")
    if episode is None:
        return np.empty(0)
    return np.asarray(episode["r"])[info["_episode"]]
