"""A CPU learner's process settings: freed host memory kept for reuse (seed.runtime.host_memory) and OpenMP threads that
sleep
when idle (seed-learner)."""

import json
import subprocess
import sys

import pytest

from seed.runtime.host_memory import keep_freed_memory

# Allocates, touches and frees a 64 MiB tensor (above glibc's largest mmap threshold) 10 times after 10 warm-up
# rounds (the heap grows to its high-water mark: an aligned allocation does not fit the exact chunk freed before
# it until free chunks have merged), and prints the minor page faults those 10 rounds took.
PROBE = """
import json, resource, sys, torch
from seed.runtime.host_memory import keep_freed_memory
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


# seed-learner's OpenMP setting: it must be in the environment before torch (and with it libgomp) loads.
LEARNER_OMP_PROBE = """
import os, sys
os.environ.pop("OMP_WAIT_POLICY", None)
if len(sys.argv) > 2:
    os.environ["OMP_WAIT_POLICY"] = sys.argv[2]
from seed.learner import main as learner_main
assert "torch" not in sys.modules, "importing seed.learner.main loaded torch before run() could set OMP_WAIT_POLICY"
sys.argv = ["seed-learner", "--print_config", "--logdir=" + sys.argv[1]]
try:
    learner_main.run()
except SystemExit:
    pass
print("OMP_WAIT_POLICY=" + os.environ["OMP_WAIT_POLICY"])
"""


@pytest.mark.parametrize("given,expected", [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_the_learner_sets_passive_openmp_threads_before_torch_loads_unless_told_otherwise(tmp_path, given, expected):
    args = [sys.executable, "-c", LEARNER_OMP_PROBE, str(tmp_path / "run")] + ([given] if given else [])
    out = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == f"OMP_WAIT_POLICY={expected}"
