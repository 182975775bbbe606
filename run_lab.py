"""Run the lab: ``python run_lab.py SPEC_FILE SPEC_NAME MODE [options]`` (see orchestrator/cli.py)."""

import sys

from orchestrator.cli import main

if __name__ == "__main__":
    sys.exit(main())
