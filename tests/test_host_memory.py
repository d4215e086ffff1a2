"""seed.host_memory: a process that keeps freed memory reuses it instead of page-faulting fresh pages per step."""

import json
import subprocess
import sys

import pytest

from seed.host_memory import keep_freed_memory

# Allocates, touches and frees a 64 MiB tensor (above glibc's largest mmap threshold) 10 times after 10 warm-up
# rounds (the heap grows to its high-water mark: an aligned allocation does not fit the exact chunk freed before
# it until free chunks have merged), and prints the minor page faults those 10 rounds took.
PROBE = """
import json, resource, sys, torch
from seed.host_memory import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else False
def cycle():
    x = torch.empty(16 * 2**20, dtype=torch.float32)
    x.fill_(1.0)
    del x
for _ in range(10):
    cycle()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    cycle()
print(json.dumps({"kept": kept, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""


def _faults(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's (Linux)")
def test_large_tensors_are_reused_instead_of_faulted_in_every_step():
    default, kept = _faults("default"), _faults("keep")
    assert kept["kept"] is True
    # Default glibc: each round maps 64 MiB afresh, 16K pages of 4 KiB faulted in and zeroed by the kernel.
    assert default["faults"] > 10 * 8000, default
    assert kept["faults"] < default["faults"] / 20, (kept, default)


def test_keep_freed_memory_says_whether_it_took_effect():
    assert isinstance(keep_freed_memory(), bool)
