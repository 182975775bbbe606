"""Errors shown to the user without a traceback (exit code 2)."""


class UsageError(Exception):
    """Bad command-line input: a mode, a run directory or resources that cannot work."""
