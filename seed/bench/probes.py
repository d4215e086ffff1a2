"""What a benchmark samples from the operating system: CPU seconds of a process and of the whole machine
(/proc), CPU pressure (Linux PSI), GPU utilisation and memory (nvidia-smi), and py-spy profiles.

Times are seconds, GPU utilisation percent, GPU memory MiB.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from typing import Any

import numpy as np


def process_cpu_times(pid: int) -> tuple[float, float] | None:
    """(user, system) CPU seconds of a live process, all its threads (/proc/<pid>/stat); None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / ticks, int(fields[12]) / ticks


def _children(pid: int) -> list[int]:
    children = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                children += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return children


def process_tree_cpu_times(pid: int) -> tuple[float, float] | None:
    """(user, system) CPU seconds of a live process and its live descendants (the learner's serving process);
    None if the process is gone."""
    own = process_cpu_times(pid)
    if own is None:
        return None
    user, system = own
    for child in _children(pid):
        times = process_tree_cpu_times(child)
        if times is not None:
            user, system = user + times[0], system + times[1]
    return user, system


def machine_busy_seconds() -> float | None:
    """CPU seconds spent busy by the whole machine since boot (all cores; /proc/stat), for the load of others."""
    try:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return (sum(values[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def cpu_pressure_seconds() -> float | None:
    """Seconds during which some runnable task waited for a CPU since boot (Linux PSI, /proc/pressure/cpu)."""
    try:
        with open("/proc/pressure/cpu") as f:
            some = f.readline().split()
    except OSError:
        return None
    values = dict(item.split("=") for item in some[1:])
    return int(values["total"]) / 1e6 if "total" in values else None


class GpuSampler:
    """Samples `nvidia-smi` once a second on a thread; `summary()` is None where there is no nvidia-smi."""

    QUERY = ["nvidia-smi", "--query-gpu=index,name,utilization.gpu,memory.used", "--format=csv,noheader,nounits"]

    def __init__(self):
        self.available = shutil.which("nvidia-smi") is not None
        self._samples: dict[int, dict[str, Any]] = {}
        self._recording = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpu-sampler", daemon=True)

    @staticmethod
    def query() -> list[tuple[int, str, float, float]]:
        if shutil.which("nvidia-smi") is None:
            return []
        try:
            output = subprocess.run(GpuSampler.QUERY, capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return []
        rows = []
        for line in output.strip().splitlines():
            parts = [p.strip() for p in line.split(",")]
            try:
                rows.append((int(parts[0]), parts[1], float(parts[2]), float(parts[3])))
            except (IndexError, ValueError):
                continue
        return rows

    def start(self) -> None:
        if self.available:
            self._thread.start()

    def record(self, on: bool) -> None:
        self._recording = on

    def _loop(self) -> None:
        while not self._stop.wait(1.0):
            if not self._recording:
                continue
            for index, name, utilization, memory in self.query():
                entry = self._samples.setdefault(index, {"index": index, "name": name, "util": [], "mem": []})
                entry["util"].append(utilization)
                entry["mem"].append(memory)

    def stop(self) -> None:
        self._stop.set()

    def summary(self) -> list[dict[str, Any]] | None:
        if not self.available:
            return None
        return [{"index": e["index"], "name": e["name"], "utilization_pct_mean": float(np.mean(e["util"])),
                 "memory_used_mib_max": float(np.max(e["mem"])), "samples": len(e["util"])}
                for e in self._samples.values() if e["util"]]



def start_profiler(pid: int, seconds: float, path: str) -> subprocess.Popen | None:
    """py-spy sampling `pid` (only threads holding the GIL) for `seconds` into `path`; None without py-spy."""
    if shutil.which("py-spy") is None:
        print("seed-bench: --profile needs py-spy (pip install py-spy); not profiling", file=sys.stderr)
        return None
    return subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--duration", str(max(1, int(seconds))),
                             "--rate", "200", "--format", "raw", "--threads", "--gil", "--nonblocking",
                             "--output", path],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def summarise_profile(path: str, top: int = 20) -> dict[str, Any] | None:
    """Share of samples per thread, and the top functions by self and inclusive samples, from py-spy raw output."""
    if not os.path.exists(path):
        return None
    self_counts: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    threads: dict[str, int] = {}
    total = 0
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            frames = stack.split(";")
            total += n
            threads[frames[0]] = threads.get(frames[0], 0) + n
            self_counts[frames[-1]] = self_counts.get(frames[-1], 0) + n
            for frame in set(frames[1:]):
                inclusive[frame] = inclusive.get(frame, 0) + n
    if not total:
        return None
    share = lambda counts: [{"frame": k, "pct": round(100.0 * v / total, 1)}
                            for k, v in sorted(counts.items(), key=lambda kv: -kv[1])[:top]]
    return {"samples": total, "path": path, "threads": share(threads), "self": share(self_counts),
            "inclusive": share(inclusive)}

