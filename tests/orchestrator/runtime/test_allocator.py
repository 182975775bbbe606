"""glibc's malloc kept from handing freed step buffers back to the kernel (``orchestrator.runtime.allocator``): counted
in
page faults of a fresh interpreter, with and without the setting, and with it set by building a ``Session``."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}

# a gradient step's pattern: eight 512 KB buffers live at once, then all freed (4 MB at the heap's top, over
# glibc's default trim threshold of twice the largest freed block); prints the page faults of 100 such steps
CHILD = """
import resource, sys
import numpy as np
how = sys.argv[1]
if how == "retain":
    from orchestrator.runtime.allocator import retain_freed_memory
    assert retain_freed_memory() is True
elif how == "session":
    from pathlib import Path
    from orchestrator.session.loop import Session
    from orchestrator.spec.load import load_spec
    Session(load_spec(str(Path(sys.argv[2]) / "specs/benchmark/cartpole.json"), "ppo_cartpole"), 1).close()

def step():
    buffers = [np.ones(131072, np.float32) for _ in range(8)]
    del buffers

for _ in range(5):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(100):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def page_faults(how: str) -> int:
    """Minor page faults of 100 steps in a fresh interpreter set up by ``how`` (default, retain, session)."""
    out = subprocess.run([sys.executable, "-c", CHILD, how, str(REPO)], env=ENV, capture_output=True, text=True,
                         timeout=300, check=True)
    return int(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_freed_step_buffers_are_reused_not_faulted_in_again():
    """glibc's defaults: every step's 4 MB come back as fresh pages (about 1,000 faults per step, 128 per 512 KB
    buffer). Kept: none after the first steps, the same when a Session set it (every session process: actors,
    enjoy@, tests)."""
    default = page_faults("default")
    assert default >= 100 * 8 * 100  # 100 steps x 8 buffers, at least 100 of each buffer's 128 pages faulted in
    assert page_faults("retain") < 100
    assert page_faults("session") < 100
