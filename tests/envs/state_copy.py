"""Test helper: a fresh env of the same spec holding another env's state, through the checkpoint files."""

from envs.state import read_files, restore, to_files


def state_copy(env, fresh):
    """Write ``env``'s state (``envs.state.to_files``, then parsed back as a resume reads it) into ``fresh``, an env
    built from the same spec; returns ``fresh``."""
    restore(fresh, *read_files(to_files(env)))
    return fresh
