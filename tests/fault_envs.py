"""Test-only envs for fault injection, made by gymnasium's ``"tests.fault_envs:Id-v0"`` syntax so
Ray workers import and register them too."""

import time

import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv

from envs.make import sub_env_seeds

# Sub-env seeds are hashes of the session seed (envs.make.sub_env_seeds): the first sub-env seed of
# every even session seed below 1000 marks an env that fails.
FAILING_SEEDS = frozenset(sub_env_seeds(s, 1)[0] for s in range(0, 1000, 2))


class FailingCartPole(CartPoleEnv):
    """CartPole that raises ``RuntimeError`` after ``fail_after`` steps when reset with the first
    sub-env seed of an even session seed (so with an even base seed and one sub-env, session 0 fails
    and session 1 runs normally)."""

    fail_after = 300

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.fails, self.steps = seed in FAILING_SEEDS, 0
        return super().reset(seed=seed, options=options)

    def step(self, action):
        self.steps = getattr(self, "steps", 0) + 1
        if getattr(self, "fails", False) and self.steps > self.fail_after:
            raise RuntimeError(f"injected failure after {self.fail_after} steps")
        return super().step(action)


gym.register("FailingCartPole-v0", entry_point=FailingCartPole, max_episode_steps=500)


class SlowCartPole(CartPoleEnv):
    """CartPole whose every step sleeps ``delay_s`` seconds, so a session trains at a known, slow pace (about
    ``1 / delay_s`` frames per second per sub-env) without using the CPU: a test can act between two checkpoints."""

    delay_s = 0.001

    def step(self, action):
        time.sleep(self.delay_s)
        return super().step(action)


gym.register("SlowCartPole-v0", entry_point=SlowCartPole, max_episode_steps=500)
