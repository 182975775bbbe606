"""glibc's malloc kept from handing freed tensor memory back to the kernel in a session process.

A gradient step allocates and frees the same activation and gradient buffers every time: a SAC step with 256-256
nets and batch 256 holds about twenty 256-512 KB tensors at once. glibc serves such blocks with ``mmap`` and
``munmap``s them when freed (its mmap threshold starts at 128 KB and only grows to the largest block freed so
far), and trims the top of its heap back to the kernel once 2x that threshold is free there. Each time, the next
step's buffers come back as fresh pages, and the first touch of each 4 KB page is a page fault that zero-fills it
(~1.5 us per page on this project's 2-core VMs, where an elementwise op that ran in 25 us on a reused buffer took
120-220 us on a fresh one). Over 1,000-1,500 SAC steps that was 290-370k page faults (docs/BENCHMARKS.md,
"Throughput vs Stable-Baselines3", the allocator setting).

``retain_freed_memory`` sets glibc's ``M_MMAP_THRESHOLD`` (blocks below it come from the heap and are reused, not
unmapped) and ``M_TRIM_THRESHOLD`` (free memory at the top of the heap kept up to this much) with ``mallopt``
(``man 3 mallopt``), the same knobs as its ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` environment
variables, but set from inside the process, so session actors get them without a per-actor environment. Bigger
blocks (a replay buffer's arrays) are still mapped and unmapped on their own. What is kept costs resident memory
up to the trim threshold above what is live, and changes no arithmetic: the same tensors hold the same values
wherever the allocator put them, so runs and resumes are bit for bit those without it.

PyTorch's CPU performance guide recommends a caching allocator (jemalloc or tcmalloc through ``LD_PRELOAD``) for
the same reason; these two settings give the gain measured here without a preloaded library.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

M_TRIM_THRESHOLD = -1  # glibc malloc.h mallopt parameters
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 * 2**20  # glibc's own ceiling for its dynamic threshold (DEFAULT_MMAP_THRESHOLD_MAX)
TRIM_THRESHOLD_BYTES = 128 * 2**20


@functools.cache
def retain_freed_memory(mmap_threshold: int = MMAP_THRESHOLD_BYTES,
                        trim_threshold: int = TRIM_THRESHOLD_BYTES) -> bool:
    """Keep freed blocks below ``mmap_threshold`` bytes in the heap and up to ``trim_threshold`` bytes of free heap
    top, for this whole process (see module docstring). Once per process and arguments; a no-op off Linux glibc.

    Args:
        mmap_threshold: bytes; blocks of at least this size are mapped and unmapped on their own (glibc: at most
            32 MiB on 64-bit).
        trim_threshold: bytes of free memory at the heap's top kept before glibc gives it back.

    Returns:
        True when glibc took both settings; False off glibc (other C libraries, macOS, Windows) or if it
        refused one (no error is raised: the settings only change speed).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others have no mallopt
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and bool(mallopt(M_TRIM_THRESHOLD, trim_threshold))


def release_free_memory() -> bool:
    """Give the free memory of every malloc arena back to the kernel (glibc's ``malloc_trim(0)``), so that memory
    allocated next comes as fresh pages and shows in the resident size (``orchestrator.spec.preflight`` measures
    an EnvPool sub-env's C++ memory so). Returns False off glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = (ctypes.c_size_t,), ctypes.c_int
    trim(0)
    return True
