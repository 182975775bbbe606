"""Errors shown to the user without a traceback (exit code 2); torch-free, so the driver imports them cheaply."""


class UsageError(Exception):
    """Bad command-line input: a mode, a run directory or resources that cannot work."""


class SpecError(Exception):
    """One or more problems in a spec; ``problems`` lists each with its dotted path."""

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


EXIT_RESUMABLE = 75
"""Exit code of a command that stopped early but can be resumed by running it again (BSD sysexits
``EX_TEMPFAIL``): after SIGTERM, SIGINT, SIGUSR1 or (a ``train`` driver) a persistent storage fault (disk full,
read-only, permission, credentials, object-store retries exhausted). A scheduler should retry it."""
