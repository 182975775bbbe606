"""Envs: gymnasium env construction (``make_env``) and the session ``Clock``."""

from envs.clock import Clock
from envs.make import EnvSpec, episode_returns, final_obs, make_env, resolve_env_id, sub_env_seeds

__all__ = ["Clock", "EnvSpec", "episode_returns", "final_obs", "make_env", "resolve_env_id", "sub_env_seeds"]
