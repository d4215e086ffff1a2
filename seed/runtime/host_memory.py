"""Host memory for a CPU learner: large tensors are served from the heap and freed memory is kept for reuse.

glibc serves every allocation above its mmap threshold (at most 32 MiB) with a fresh mmap and returns it with
munmap on free, so each training step's large activations (an R2D2 batch of 32 x 26 stacked Pong frames is
~90 MB of float32 per forward) are page-faulted in and zeroed by the kernel, step after step. Measured on 2
cores (`python -m seed.bench.compute_cost --preset=pong_r2d2 --torch_threads=1`, a learning run on the other
core): a training step took 1,379-1,775 ms with 3.2 s of system time per run, and 959-1,003 ms with 0.7-0.9 s
once mmap is off and freed memory stays in the heap; on quiet cores the gain varies from run to run
(docs/performance/README.md). PyTorch's CPU performance guide recommends jemalloc or tcmalloc for the same reason;
these two mallopt settings need no extra package.

The cost: the process keeps the high-water mark of its heap (freed tensors are reused, not returned to the
kernel), which for a learner is the steady state anyway.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

# glibc's mallopt parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
TRIM_THRESHOLD_BYTES = 2**31 - 1  # the largest int mallopt takes: free space at the heap's top is never trimmed


def keep_freed_memory() -> bool:
    """Turns off mmap for allocations and heap trimming in this process (glibc only; elsewhere nothing changes).

    Call once at process start, before the large allocations. Returns whether both settings took effect.
    """
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        log.info("host memory: no glibc mallopt here; the allocator keeps its defaults")
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
    if not done:
        log.warning("host memory: mallopt refused M_MMAP_MAX / M_TRIM_THRESHOLD; the allocator keeps its defaults")
    return done
