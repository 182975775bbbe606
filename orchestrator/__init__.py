"""Orchestration: CLI, spec, trials of Ray session actors, storage, search, analysis."""
