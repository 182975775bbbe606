"""Run the lab: ``python run_lab.py SPEC_FILE SPEC_NAME MODE [options]`` (see orchestrator/cli.py)."""

from orchestrator.cli import entry

if __name__ == "__main__":
    entry()  # main(), then a fast exit (orchestrator.cli.entry)
