"""Env construction: spec ``env`` section -> a seeded ``gymnasium.vector`` env.

Every session env is a vector env (``num_envs`` = 1 included), so the session loop has one shape
contract: observations ``(N, *O)``, rewards/terminated/truncated ``(N,)``. Sub-envs auto-reset in
``SAME_STEP`` mode: the observation returned on a done step is the next episode's first one and
the true final observation is in ``info["final_obs"]``; ``env.autoreset: next_step`` gives SLM-Lab's
``NEXT_STEP`` mode instead (``EnvSpec.autoreset``).

Env families (installed by ``pip install -e .``): classic control; Box2D (``box2d``: LunarLander-v3,
BipedalWalker-v3, CarRacing-v3); MuJoCo v5 (``mujoco``: Hopper-v5, HalfCheetah-v5, ...); Atari (``ale-py``,
whose wheels carry the ROMs; its ``ALE/*`` and ``*NoFrameskip-v4`` ids are registered by
``ensure_registered`` on the first lookup of an id gymnasium does not know). Atari sub-envs are composed from
maintained wrappers as SLM-Lab v5 and SB3 run Atari (Machado et al. 2018 for sticky actions; Mnih et al. 2015
for the rest), see ``make_sub_env``: ``AtariPreprocessing`` (noop resets, frame skip 4 with a max-pool over the
last two frames, 84x84 grayscale uint8), ``FrameStackObservation`` (``frame_op``), ``RecordEpisodeStatistics``
(true game scores), then ``LifeLossTermination`` (``life_loss_info``) and reward clipping (``reward_scale``) for
training only.
Frames are agent steps (the clock's unit): one Atari frame here is 4 emulator frames.

A sync vector env's state (every wrapper's, and ALE's and MuJoCo's simulator state) is checkpointed as data by
``envs.state`` (docs/ARCHITECTURE.md section 5); Box2D sub-envs, async and EnvPool vector envs cannot be captured, so
their checkpoints are ``exact: false`` with the reason.

Seeds (docs/ARCHITECTURE.md section 7): ``make_env`` seeds only the vector action space with the session seed;
the reset seeds of the sub-envs come from ``sub_env_seeds(session_seed, num_envs, stream, index)``,
a ``numpy.random.SeedSequence`` of the session seed. Sub-env i is therefore *not* ``seed + i``
(gymnasium's default for an int reset seed), which would make sessions s and s + 1 of a trial
share N - 1 env streams.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv, VectorEnv, VectorWrapper
from gymnasium.vector.utils import batch_space
from gymnasium.wrappers.utils import RunningMeanStd

from envs.ids import OLD_ENV_IDS, ensure_registered, is_atari, resolve_env_id, sticky_probability  # noqa: F401
from envs.wrappers import LifeLossTermination, ObsWindow

TRAIN_STREAM = 0  # sub_env_seeds stream of the training env's resets (index: resume_count)
EVAL_STREAM = 1  # sub_env_seeds stream of the evaluation env's resets (index: frame)

@dataclass(frozen=True)
class EnvSpec:
    """The spec ``env`` section (SLM-Lab key names), validated by ``orchestrator.spec``.

    Fields:
        name: gymnasium id (``ALE/Pong-v5``, ``LunarLander-v3``, ``Hopper-v5``, ...).
        max_frame: frame budget of a session, summed over sub-envs (agent steps).
        num_envs: N, sub-envs per vector env.
        max_t: episode step limit (agent steps) or None for the env's own.
        normalize_state: running mean/std of observations.
        reward_scale: float multiplier, ``"sign"`` for sign clipping, or None: none, except ``"sign"`` on
            Atari (SLM-Lab clips Atari rewards); ``1`` turns Atari clipping off.
        vectorization: ``"sync"`` (one process; its state is saved, so resume is exact), ``"async"`` (one
            process per sub-env; its state cannot be read, so ``exact: false``) or ``"auto"`` (async when the
            session has more than one CPU, ``meta.resources.num_cpus`` > 1, and N > 1; resolved by the session, see
            ``resolve_vec``) or ``"envpool"`` (EnvPool's C++ sub-envs on ``num_cpus`` threads,
            ``envs.envpool_vec``; its state cannot be read, so ``exact: false``; the default for SLM-Lab's
            ``playground/...`` ids, which only EnvPool runs).
        frame_op: frame stacking, SLM-Lab v4 names: ``"concat"`` (k frames joined on the first axis:
            (k*D,) for vector obs, (k, 84, 84) for grayscale frames, (k*C, H, W) for channel-first ones),
            ``"stack"`` (a new leading axis, (k, *O); on (84, 84) frames the same (k, 84, 84) as ``"concat"``,
            where SLM-Lab v4 made (k, 1, 84, 84) for recurrent nets, which this lab has not) or None: none,
            except ``"concat"`` on Atari.
        frame_op_len: k, frames stacked (None: 4 where ``frame_op`` applies).
        life_loss_info: Atari: a lost life ends the training episode (``terminated``) without a reset
            (ale-py's name); None: true on Atari training envs; evaluation envs never use it.
        repeat_action_probability: Atari sticky actions (None: the id's own, 0.25 for ``ALE/*-v5``, 0 for
            ``*NoFrameskip-v4``).
        noop_max: Atari: at most this many no-op steps after each reset (0 disables).
        frame_skip: Atari: emulator frames per agent step, max-pooled over the last two.
        image_downsize: Atari: the frame size ``[width, height]`` (SLM-Lab v4's key, ``cv2.resize`` order: frames
            are (height, width)); None: 84x84. Other envs: not read on vector observations (as in SLM-Lab v4);
            ``make_sub_env`` refuses it on image observations, which SLM-Lab v4 grayscaled and resized.
        continuous: passed to ``gym.make`` as the env's own ``continuous`` kwarg when not None (e.g.
            ``LunarLander-v3`` with Box actions; SLM-Lab passes such env keys to ``gym.make`` as well).
        autoreset: the vector env's autoreset mode (the lab's key). ``"same_step"`` (default): a sub-env whose
            episode ended resets inside that step, the returned observation is the next episode's first and the
            true final one is in ``info["final_obs"]``; every stored transition is real. ``"next_step"``: as
            SLM-Lab v5 steps its ``gym.make_vec`` envs (gymnasium's default): the done step returns the final
            observation, and the sub-env's next step ignores its action and returns the next episode's first
            observation with reward 0, not done. That step costs a frame and is stored as a transition
            (final obs, ignored action, 0, first obs, not done), about one per episode, as in SLM-Lab's memories.
            Not with a ``RecurrentNet`` (its observation windows assume ``same_step``); evaluation and ``enjoy``
            envs always use ``same_step``.
        normalize_obs: SLM-Lab v5's running mean/std of observations (gymnasium's vector wrapper), as
            ``normalize_state``, then clipped to ``[-clip_obs, clip_obs]``.
        normalize_reward: SLM-Lab v5's reward normalizer: rewards divided by the running std of the discounted
            return with the algorithm's ``gamma``, then clipped to ``[-clip_reward, clip_reward]``.
        clip_obs / clip_reward: the clips of ``normalize_obs`` / ``normalize_reward`` (SLM-Lab's 10), applied only
            with their normalizer; null: no clip.

    The normalizers' statistics are part of the env state (``envs.state``), so they are in every checkpoint and a
    resume is exact.
    """

    name: str
    max_frame: int = field(metadata={"gt": 0})
    num_envs: int = field(default=1, metadata={"gt": 0})
    max_t: int | None = field(default=None, metadata={"gt": 0})
    normalize_state: bool = False
    reward_scale: float | str | None = None
    vectorization: str = field(default="sync",
                               metadata={"origin": "lab", "choices": ("sync", "async", "auto", "envpool")})
    frame_op: str | None = field(default=None, metadata={"choices": ("concat", "stack")})
    frame_op_len: int | None = field(default=None, metadata={"gt": 0})
    life_loss_info: bool | None = field(default=None, metadata={"origin": "ale-py"})
    repeat_action_probability: float | None = field(default=None, metadata={"origin": "ale-py", "ge": 0, "le": 1})
    continuous: bool | None = None
    noop_max: int = field(default=30, metadata={"origin": "gymnasium", "ge": 0})
    frame_skip: int = field(default=4, metadata={"origin": "gymnasium", "gt": 0})
    image_downsize: list | None = None
    normalize_obs: bool = False
    normalize_reward: bool = False
    clip_obs: float | None = field(default=10.0, metadata={"gt": 0})
    clip_reward: float | None = field(default=10.0, metadata={"gt": 0})
    autoreset: str = field(default="same_step", metadata={"origin": "lab", "choices": ("same_step", "next_step")})


AUTORESET_MODES = {"same_step": AutoresetMode.SAME_STEP, "next_step": AutoresetMode.NEXT_STEP}


def eval_spec(spec: EnvSpec, num_envs: int) -> EnvSpec:
    """The env section of an evaluation / enjoy env: ``num_envs`` sync sub-envs (EnvPool ones for an EnvPool
    session, so evaluation plays the same env), no reward scaling, whole games (no ``life_loss_info``), no reward
    normalization, ``same_step`` autoreset; everything else (frame ops, sticky actions, limits, observation
    normalization) as in training."""
    vec = "envpool" if spec.vectorization == "envpool" else "sync"
    return dataclasses.replace(spec, num_envs=num_envs, reward_scale=1.0, vectorization=vec,  # 1: unscaled
                               life_loss_info=False, normalize_reward=False, autoreset="same_step")


def resolve_vec(spec: EnvSpec, num_cpus: float) -> EnvSpec:
    """``vectorization: auto`` -> ``"async"`` when ``num_cpus`` > 1 and ``num_envs`` > 1, else ``"sync"``."""
    if spec.vectorization != "auto":
        return spec
    return dataclasses.replace(spec, vectorization="async" if num_cpus > 1 and spec.num_envs > 1 else "sync")


def _clip(values: np.ndarray, bound: float) -> np.ndarray:
    """``values`` clipped to ``[-bound, bound]``."""
    return np.clip(values, -bound, bound)


def make_env(spec: EnvSpec, seed: int | None, render_mode: str | None = None,
             video_folder: str | None = None, gamma: float = 0.99, seq_len: int | None = None,
             num_cpus: float = 1.0) -> VectorEnv:
    """Build the session's vector env and reset-seed it.

    Args:
        spec: the env section (``vectorization: auto`` must be resolved first, see ``resolve_vec``).
        seed: session seed; seeds the vector action space only (None: unseeded). Reset the env with
            ``env.reset(seed=sub_env_seeds(seed, spec.num_envs))`` for seeded sub-envs.
        render_mode: gymnasium render mode of every sub-env (``"human"``, ``"rgb_array"``) or None.
        video_folder: local directory where gymnasium's ``RecordVideo`` writes every episode as MP4
            (needs ``render_mode="rgb_array"``, moviepy, and one sub-env: names are per sub-env).
        gamma: discount of the return whose running std ``normalize_reward`` divides by (the algorithm's).
        seq_len: L, observation windows for a recurrent net (``agents.nets.seq_len_of``): observations become
            (N, L, *O), each sub-env's last L, zero-padded at episode starts (``envs.wrappers.ObsWindow``,
            outermost); None: plain observations.
        num_cpus: the session's ``meta.resources.num_cpus``: EnvPool's threads (at least 1, at most N).

    Returns:
        A ``VectorEnv`` with ``num_envs`` sub-envs. Observations (N, *O) in the sub-env's dtype (uint8
        (N, k, 84, 84) on Atari). The episode statistics wrapper sits before the life-loss signal and reward
        scaling, so ``info["episode"]["r"]`` is the true undiscounted game return.

    Raises:
        ValueError: unknown env id or vectorization mode, Atari options on a non-Atari env, a
            ``frame_op`` the observation shape does not allow, or ``autoreset: next_step`` with ``seq_len``.
    """
    if spec.autoreset == "next_step" and seq_len is not None:
        raise ValueError("env.autoreset: 'next_step' does not work with a RecurrentNet's observation windows "
                         "(they assume 'same_step'); expected env.autoreset: same_step")
    if spec.vectorization == "envpool":
        from envs.envpool_vec import make_envpool

        if render_mode is not None or video_folder is not None:
            raise ValueError("env.vectorization 'envpool' does not render; use 'sync' to render or record video")
        venv, atari = make_envpool(spec, num_threads=min(spec.num_envs, max(1, int(num_cpus))))
        return _outer_wrappers(venv, spec, atari, seed, gamma, seq_len, clipped=atari)
    env_id = resolve_env_id(spec.name)
    atari = is_atari(env_id)
    if not atari and (spec.life_loss_info or spec.repeat_action_probability is not None):
        raise ValueError(f"env '{env_id}': life_loss_info / repeat_action_probability apply to Atari envs only")
    env_fns = [functools.partial(make_sub_env, env_id, spec, render_mode, video_folder)] * spec.num_envs
    if spec.vectorization == "sync":
        venv: VectorEnv = SyncVectorEnv(env_fns, autoreset_mode=AUTORESET_MODES[spec.autoreset])
    elif spec.vectorization == "async":
        venv = AsyncVectorEnv(env_fns, autoreset_mode=AUTORESET_MODES[spec.autoreset])
    else:
        raise ValueError(f"env.vectorization must be 'sync' or 'async', got '{spec.vectorization}'")
    venv = gym.wrappers.vector.RecordEpisodeStatistics(venv)
    if atari and (spec.life_loss_info is None or spec.life_loss_info):
        venv = LifeLossTermination(venv)
    return _outer_wrappers(venv, spec, atari, seed, gamma, seq_len, clipped=False)


def _outer_wrappers(venv: VectorEnv, spec: EnvSpec, atari: bool, seed: int | None, gamma: float,
                    seq_len: int | None, clipped: bool) -> VectorEnv:
    """Reward scaling (``reward_scale``; ``"sign"`` by default on Atari, unless the env already ``clipped``),
    ``NormalizeReward`` (+ clip), ``observation_wrappers``; the action space seeded with ``seed``."""
    reward_scale = "sign" if atari and spec.reward_scale is None else spec.reward_scale
    if clipped and reward_scale == "sign":
        reward_scale = None
    if reward_scale == "sign":
        venv = gym.wrappers.vector.TransformReward(venv, np.sign)
    elif reward_scale is not None and reward_scale != 1:
        venv = gym.wrappers.vector.TransformReward(venv, functools.partial(np.multiply, float(reward_scale)))
    if spec.normalize_reward:
        venv = gym.wrappers.vector.NormalizeReward(venv, gamma=gamma)
        if spec.clip_reward is not None:
            venv = gym.wrappers.vector.TransformReward(venv, functools.partial(_clip, bound=float(spec.clip_reward)))
    venv = observation_wrappers(venv, spec, seq_len)
    venv.action_space.seed(seed)
    return venv


def observation_wrappers(venv: VectorEnv, spec: EnvSpec, seq_len: int | None) -> VectorEnv:
    """The outermost wrappers: ``NormalizeObservation`` (``normalize_state`` / ``normalize_obs``), then ``ObsWindow``
    (``seq_len``; it forwards ``obs_rms`` / ``update_running_mean``, so they reach the normalizer)."""
    if spec.normalize_state or spec.normalize_obs:
        clip = spec.clip_obs if spec.normalize_obs else None
        venv = NormalizeObservation(venv, clip=None if clip is None else float(clip))
    return venv if seq_len is None else ObsWindow(venv, seq_len)


def make_sub_env(env_id: str, spec: EnvSpec, render_mode: str | None = None,
                 video_folder: str | None = None) -> gym.Env:
    """One sub-env: ``gym.make`` plus, on Atari, the SLM-Lab v5 preprocessing, then ``frame_op``.

    Atari: ``gym.make(id, frameskip=1, repeat_action_probability=0)``, gymnasium's ``StickyAction`` with the
    id's or the spec's probability on every emulator frame (Machado et al. 2018), gymnasium's ``AtariPreprocessing``
    (``noop_max`` no-op resets, ``frame_skip`` with a max-pool of the last two emulator frames, 84x84 or
    ``image_downsize`` grayscale uint8, no scaling: nets divide by 255), then ``max_t`` as a ``TimeLimit`` in agent
    steps.
    Other envs: ``gym.make(id, max_episode_steps=max_t)``. Then ``FrameStackObservation`` (``frame_op``,
    zero-padded at episode start).

    Returns:
        A ``gym.Env`` whose observation space is the session's single observation space O.

    Raises:
        ValueError: a ``frame_op`` the observation shape does not allow, or ``image_downsize`` on a non-Atari env
            with image (3-D) observations.
        gymnasium.error.DependencyNotInstalled: the env family's package is missing.
    """
    if is_atari(env_id):
        env = gym.make(env_id, render_mode=render_mode, frameskip=1, repeat_action_probability=0.0)
        sticky = sticky_probability(env_id, spec)
        if sticky > 0:
            env = gym.wrappers.StickyAction(env, sticky)
        env = gym.wrappers.AtariPreprocessing(env, noop_max=spec.noop_max, frame_skip=spec.frame_skip,
                                              screen_size=tuple(spec.image_downsize or (84, 84)),
                                              grayscale_obs=True, scale_obs=False)
        if spec.max_t is not None:
            env = gym.wrappers.TimeLimit(env, spec.max_t)
        frame_op, frame_op_len = spec.frame_op or "concat", spec.frame_op_len or 4
    else:
        kwargs = {} if spec.max_t is None else {"max_episode_steps": spec.max_t}
        if spec.continuous is not None:
            kwargs["continuous"] = spec.continuous
        env = gym.make(env_id, render_mode=render_mode, **kwargs)
        if spec.image_downsize is not None and len(env.observation_space.shape or ()) == 3:
            raise ValueError(f"env.image_downsize: SLM-Lab v4 grayscales and resizes the image observations of "
                             f"non-Atari envs to it, which this lab does not; {env_id} gives "
                             f"{env.observation_space.shape}: leave image_downsize out")
        frame_op, frame_op_len = spec.frame_op, spec.frame_op_len or 4
    if frame_op is not None:
        env = stack_frames(env, frame_op, frame_op_len)
    if video_folder is not None:
        env = gym.wrappers.RecordVideo(env, video_folder, episode_trigger=_every_episode, name_prefix="episode")
    return env


def stack_frames(env: gym.Env, frame_op: str, k: int) -> gym.Env:
    """SLM-Lab's ``frame_op`` with gymnasium's ``FrameStackObservation`` (k frames, zero-padded at reset).

    ``"stack"``: (k, *O). ``"concat"``: the k frames joined on their first axis: (k*D,) for (D,) vectors,
    (k, H, W) for (H, W) grayscale frames (each frame one channel), (k*C, H, W) for channel-first images.

    Raises:
        ValueError: unknown ``frame_op``, or ``"concat"`` of frames with more than 3 axes.
    """
    if frame_op not in ("concat", "stack"):
        raise ValueError(f"env.frame_op must be 'concat' or 'stack', got {frame_op!r}")
    shape = env.observation_space.shape
    env = gym.wrappers.FrameStackObservation(env, k, padding_type="zero")
    if frame_op == "stack" or len(shape) == 2:
        return env
    if len(shape) not in (1, 3):
        raise ValueError(f"env.frame_op 'concat' needs 1-3 dimensional frames, got shape {shape}")
    return gym.wrappers.ReshapeObservation(env, (k * shape[0], *shape[1:]))


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
    env state saves them. ``clip`` (SLM-Lab's ``clip_obs``) bounds the normalized values.
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
        clip = getattr(self, "clip", None)  # env.pkl files pickled before clip existed have none
        return out if clip is None else np.clip(out, -clip, clip)

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        """Reset the vector env; observations (N, *O) update the statistics (unless frozen) and come back
        normalized."""
        obs, info = self.env.reset(seed=seed, options=options)
        if self.update_running_mean:
            self.obs_rms.update(obs)
        return self.normalize(obs), info

    def step(self, actions: Any) -> tuple[np.ndarray, Any, Any, Any, dict]:
        """Step the vector env; observations (N, *O) update the statistics (unless frozen) and come back
        normalized, as do the ``final_obs`` of sub-envs whose episode ended."""
        obs, reward, terminated, truncated, info = self.env.step(actions)
        if self.update_running_mean:
            self.obs_rms.update(obs)
        if "final_obs" in info:
            final = np.array(info["final_obs"], dtype=object)  # a copy: None where not done
            for i in np.flatnonzero(info["_final_obs"]):
                final[i] = self.normalize(np.asarray(final[i]))
            info = {**info, "final_obs": final}
        return self.normalize(obs), reward, terminated, truncated, info


def _every_episode(episode: int) -> bool:
    return True


def final_obs(next_obs_NO: np.ndarray, done_N: np.ndarray, info: dict[str, Any]) -> np.ndarray:
    """The true next observations of a step: ``info["final_obs"]`` where an episode ended.

    Args:
        next_obs_NO: observations returned by ``env.step`` (N, *O); on done rows these already
            belong to the next episode under ``same_step`` autoreset, and are the true final ones under
            ``next_step`` (whose info has no ``final_obs``, except on Atari life-loss rows).
        done_N: bool (N,), terminated | truncated.
        info: the step's info dict; ``final_obs`` (N,) object and its mask ``_final_obs`` (N,) bool where set.

    Returns:
        (N, *O) array; a copy only when some sub-env has a ``final_obs``.
    """
    if not done_N.any() or "final_obs" not in info:
        return next_obs_NO
    out = next_obs_NO.copy()
    for i in np.flatnonzero(done_N & np.asarray(info["_final_obs"], bool)):
        out[i] = info["final_obs"][i]
    return out


def episode_returns(info: dict[str, Any]) -> np.ndarray:
    """Undiscounted returns of the episodes that ended this step (before reward scaling), (k,)."""
    episode = info.get("episode")
    if episode is None:
        return np.empty(0)
    return np.asarray(episode["r"])[info["_episode"]]
