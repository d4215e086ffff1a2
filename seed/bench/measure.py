"""Measuring one benchmark run (used by `seed-bench`): start a server process and actor processes, run them
for a fixed time, and read what they did over the window after the warm-up.

  env frames/s at the actors   each actor's cumulative stats rows (seed/actor/stats.py), interpolated at the
                               window's ends, summed over actors
  env frames/s at the learner  two rows of the server's metrics.jsonl (the learner's own clock)
  round-trip latency           the actors' latency samples of the rows written in the window, weighted by the
                               round trips each row stands for (env_only: the time of one step of the K envs)
  actor waiting fraction       the actors' cumulative waited_s (blocked waiting for actions) over the window,
                               divided by the window: the share of the time the envs sat idle
  CPU                          /proc/<pid>/stat utime and stime of every process at the window's ends; the
                               whole machine's busy time from /proc/stat, so the load of other processes shows
  GPU                          nvidia-smi once a second, when there is one
  profiles                     optionally py-spy (threads holding the GIL) over the window
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np

from seed.bench.probes import (
    GpuSampler,
    cpu_pressure_seconds,
    machine_busy_seconds,
    process_cpu_times,
    process_tree_cpu_times,
    start_profiler,
    summarise_profile,
)
from seed.local_launcher import stop_all

SERVER_START_TIMEOUT_S = 180.0
ACTOR_START_TIMEOUT_S = 180.0


class BenchError(RuntimeError):
    """A benchmark could not run or measure (the message says which process and where its log is)."""


def read_jsonl(path: str) -> list[dict[str, Any]]:
    if not os.path.exists(path):
        return []
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:  # a row being written while we read
                    continue
    return rows


def weighted_percentiles(samples: list[float], weights: list[float], quantiles: tuple[float, ...]) -> list[float]:
    """Percentiles of samples where each sample stands for `weight` observations (reservoir-thinned windows)."""
    order = np.argsort(samples)
    values = np.asarray(samples, np.float64)[order]
    cumulative = np.cumsum(np.asarray(weights, np.float64)[order])
    cumulative /= cumulative[-1]
    return [float(values[min(np.searchsorted(cumulative, q / 100.0), len(values) - 1)]) for q in quantiles]


def _value_at(rows: list[dict[str, Any]], key: str, when: float) -> float:
    """`key` linearly interpolated between the rows written around `when` (clamped to the first/last row)."""
    times = [r["time"] for r in rows]
    return float(np.interp(when, times, [r[key] for r in rows]))


def actor_window(rows: list[dict[str, Any]], start: float, end: float) -> dict[str, Any] | None:
    """Counts of one actor over [start, end] (unix time) interpolated from its cumulative stats rows, and the
    latency samples of the rows whose windows fall in it. None if the actor has no rows around the window."""
    rows = sorted(rows, key=lambda r: r["time"])
    if len(rows) < 2 or rows[-1]["time"] <= start or rows[0]["time"] >= end:
        return None
    start, end = max(start, rows[0]["time"]), min(end, rows[-1]["time"])
    counts = {key: _value_at(rows, key, end) - _value_at(rows, key, start)
              for key in ("agent_steps", "env_frames", "round_trips", "cpu_s")}
    # Seconds blocked waiting for actions (seed/actor/stats.py); stats files from before it was recorded lack it.
    counts["waited_s"] = (_value_at(rows, "waited_s", end) - _value_at(rows, "waited_s", start)
                          if all("waited_s" in r for r in rows) else None)
    samples, weights = [], []
    for previous, row in zip(rows, rows[1:], strict=False):
        # A row holds the samples since the previous row: keep it if most of that span is in the window.
        if row["latency_ms"] and start <= (previous["time"] + row["time"]) / 2 <= end:
            weight = row["latency_count"] / len(row["latency_ms"])
            samples.extend(row["latency_ms"])
            weights.extend([weight] * len(row["latency_ms"]))
    return {"seconds": end - start, **counts, "samples": samples, "weights": weights}


def learner_window(first: dict[str, Any] | None, last: dict[str, Any] | None, rows: list[dict[str, Any]]
                   ) -> dict[str, Any]:
    """Learner-side rates between two metrics.jsonl rows and means of the per-row values between them."""
    out: dict[str, Any] = {"env_frames_per_sec_learner": None, "train_steps_per_sec": None,
                           "inference_batch_size_mean": None, "learner_latency_ms_p50": None,
                           "learner_latency_ms_p99": None}
    if last is None:
        return out
    if first is None or first["time_s"] >= last["time_s"]:
        first = {"time_s": 0.0, "env_frames": 0, "train_steps": 0}
    seconds = last["time_s"] - first["time_s"]
    out["env_frames_per_sec_learner"] = (last["env_frames"] - first["env_frames"]) / seconds
    out["train_steps_per_sec"] = (last["train_steps"] - first["train_steps"]) / seconds
    window = [r for r in rows if first["time_s"] < r["time_s"] <= last["time_s"]]

    def mean_of(key: str) -> float | None:
        values = [r[key] for r in window if r.get(key) is not None]
        return float(np.mean(values)) if values else None

    out["inference_batch_size_mean"] = mean_of("inference_batch_size_mean")
    out["learner_latency_ms_p50"] = mean_of("inference_latency_ms_p50")
    out["learner_latency_ms_p99"] = mean_of("inference_latency_ms_p99")
    return out


@dataclasses.dataclass
class Job:
    """One measured run: a server process (learner, actor-side learner or ceiling) and actor processes, or
    actor processes alone (env_only: no server, `server_cmd` None)."""

    kind: str  # "framework", "actor_side", "transport" or "env_only"
    run_dir: str  # absolute, like every path below: the processes start in run_dir, not in the caller's cwd
    address: str  # what the actors dial, also used for the health check; "" without a server
    server_cmd: list[str] | None
    actor_cmds: list[list[str]]
    stats_files: list[str]
    metrics_path: str | None  # the server's metrics.jsonl, if it writes one


def _check_absolute(job: Job) -> None:
    paths = {"run_dir": job.run_dir, "metrics_path": job.metrics_path,
             **{f"stats_files[{i}]": p for i, p in enumerate(job.stats_files)}}
    for field, path in paths.items():
        if path is not None and not os.path.isabs(path):
            raise BenchError(f"{job.kind}: Job.{field}: got {path!r}, expected an absolute path")


def _tail(path: str, lines: int = 30) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


class _Progress:
    """A one-line progress bar on stderr (redrawn in place on a terminal, a line per quarter otherwise)."""

    def __init__(self, label: str, total_s: float, width: int = 30):
        self.label, self.total_s, self.width = label, total_s, width
        self.tty = sys.stderr.isatty()
        self._last_quarter = -1

    def update(self, elapsed_s: float, phase: str, fps: float | None) -> None:
        fraction = min(1.0, elapsed_s / self.total_s)
        filled = int(round(fraction * self.width))
        rate = "-" if fps is None else f"{fps:,.0f}"
        line = (f"{self.label} [{'#' * filled}{'.' * (self.width - filled)}] {elapsed_s:5.1f}/{self.total_s:.0f}s "
                f"{phase:<7} learner fps={rate}")
        if self.tty:
            sys.stderr.write("\r" + line + "\x1b[K")
            sys.stderr.flush()
        elif int(fraction * 4) > self._last_quarter:
            self._last_quarter = int(fraction * 4)
            print(line, file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()



def measure(job: Job, duration_s: float, warmup_s: float, progress: bool = True,
            profile: tuple[str, ...] = ()) -> dict[str, Any]:
    """Runs `job` for `duration_s` seconds after its actors start; measures over the last duration - warmup.

    `profile` names processes ("server", "actor0", ...) to sample with py-spy during the measurement window.
    """
    from seed.local_launcher import wait_until_serving

    _check_absolute(job)
    os.makedirs(job.run_dir, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")

    def start(cmd: list[str], name: str) -> subprocess.Popen:
        log = open(os.path.join(job.run_dir, f"{name}.log"), "ab")
        # The run directory as working directory: nothing a process reads or writes depends on where seed-bench
        # was started, and `python -m` cannot pick up a `seed` source tree from the caller's directory.
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=job.run_dir)
        log.close()
        process.log_path = os.path.join(job.run_dir, f"{name}.log")  # type: ignore[attr-defined]
        return process

    server = start(job.server_cmd, "server") if job.server_cmd else None
    actors: list[subprocess.Popen] = []
    gpu = GpuSampler()
    gpu.start()
    bar = _Progress(f"[{job.kind}]", duration_s) if progress else None
    try:
        if server and not wait_until_serving(job.address, server, SERVER_START_TIMEOUT_S):
            raise BenchError(f"{job.kind}: the server did not start serving on {job.address} "
                             f"(exit code {server.poll()}); {server.log_path}:\n{_tail(server.log_path)}")
        actors = [start(cmd, f"actor{i}") for i, cmd in enumerate(job.actor_cmds)]
        # The clock starts once every actor steps (its first stats row), not at spawn: importing torch and
        # building a network take seconds, and would otherwise count against whichever run does more of it.
        deadline = time.monotonic() + ACTOR_START_TIMEOUT_S
        processes = [p for p in (server, *actors) if p is not None]
        while not all(read_jsonl(path) for path in job.stats_files):
            for process in processes:
                if process.poll() is not None:
                    raise BenchError(f"{job.kind}: a process exited early with code {process.returncode}; "
                                     f"{process.log_path}:\n{_tail(process.log_path)}")
            if time.monotonic() > deadline:
                raise BenchError(f"{job.kind}: actors did not start stepping within {ACTOR_START_TIMEOUT_S:.0f}s; "
                                 f"logs in {job.run_dir}")
            if bar:
                bar.update(0.0, "start", None)
            time.sleep(0.1)
        started = time.time()
        warm_end, end = started + warmup_s, started + duration_s
        load_before = os.getloadavg()
        marks: dict[str, dict[str, Any]] = {}
        profilers: dict[str, subprocess.Popen] = {}
        named = {**({"server": server} if server else {}), **{f"actor{i}": a for i, a in enumerate(actors)}}

        def mark() -> dict[str, Any]:
            rows = read_jsonl(job.metrics_path) if job.metrics_path else []
            return {"time": time.time(), "learner_cpu": process_tree_cpu_times(server.pid) if server else None,
                    "actor_cpu": [process_cpu_times(a.pid) for a in actors],
                    "machine_busy": machine_busy_seconds(), "cpu_pressure": cpu_pressure_seconds(),
                    "learner_row": rows[-1] if rows else None}

        while True:
            now = time.time()
            if "warm" not in marks and now >= warm_end:
                marks["warm"] = mark()
                gpu.record(True)
                for name in profile:
                    if name in named:
                        profiler = start_profiler(named[name].pid, end - now,
                                                  os.path.join(job.run_dir, f"profile-{name}.txt"))
                        if profiler:
                            profilers[name] = profiler
            if now >= end:
                marks["end"] = mark()
                break
            for process in processes:
                if process.poll() is not None:
                    raise BenchError(f"{job.kind}: a process exited early with code {process.returncode}; "
                                     f"{process.log_path}:\n{_tail(process.log_path)}")
            if bar:
                rows = read_jsonl(job.metrics_path) if job.metrics_path else []
                fps = rows[-1].get("env_frames_per_sec") if rows else None
                bar.update(now - started, "warm-up" if now < warm_end else "measure", fps)
            time.sleep(min(0.5, max(0.01, (warm_end if "warm" not in marks else end) - now)))
        gpu.record(False)
        load_after = os.getloadavg()
        for profiler in profilers.values():
            try:
                profiler.wait(timeout=30)
            except subprocess.TimeoutExpired:
                profiler.kill()
    finally:
        if bar:
            bar.done()
        gpu.stop()
        stop_all(actors, timeout_s=15)
        if server:
            stop_all([server], timeout_s=30)

    warm, last = marks["warm"], marks["end"]
    seconds = last["time"] - warm["time"]
    windows = [actor_window(read_jsonl(path), warm["time"], last["time"]) for path in job.stats_files]
    live = [w for w in windows if w is not None]
    if not live:
        raise BenchError(f"{job.kind}: no actor wrote two stats rows in the measurement window "
                         f"({seconds:.1f}s); make --duration_s longer. Logs in {job.run_dir}")
    waited = [w["waited_s"] for w in live]
    samples = [s for w in live for s in w["samples"]]
    weights = [x for w in live for x in w["weights"]]
    p50, p99 = weighted_percentiles(samples, weights, (50, 99)) if samples else (None, None)

    def cpu_delta(before: tuple[float, float] | None, after: tuple[float, float] | None
                  ) -> tuple[float, float] | None:
        return None if before is None or after is None else (after[0] - before[0], after[1] - before[1])

    learner_times = cpu_delta(warm["learner_cpu"], last["learner_cpu"])
    actor_times = [cpu_delta(b, a) for b, a in zip(warm["actor_cpu"], last["actor_cpu"], strict=True)]
    learner_cpu = None if learner_times is None else sum(learner_times)
    if all(t is not None for t in actor_times):
        actors_cpu = float(sum(sum(t) for t in actor_times))
        actors_system = float(sum(t[1] for t in actor_times))
    else:  # an actor is gone: fall back on the actors' own accounting
        actors_cpu, actors_system = float(sum(w["cpu_s"] for w in live)), None
    busy = None if warm["machine_busy"] is None else last["machine_busy"] - warm["machine_busy"]
    ours = (learner_cpu or 0.0) + actors_cpu
    metrics_rows = read_jsonl(job.metrics_path) if job.metrics_path else []
    result = {
        "env_frames_per_sec": sum(w["env_frames"] / w["seconds"] for w in live),
        "agent_steps_per_sec": sum(w["agent_steps"] / w["seconds"] for w in live),
        "round_trips_per_sec": sum(w["round_trips"] / w["seconds"] for w in live),
        **learner_window(warm["learner_row"], last["learner_row"], metrics_rows),
        "round_trip_latency_ms_p50": p50,
        "round_trip_latency_ms_p99": p99,
        "latency_samples": len(samples),
        # Share of the actors' time spent blocked waiting for actions (envs idle), averaged over actors.
        "actor_waiting_fraction": None if None in waited else sum(waited) / sum(w["seconds"] for w in live),
        "cpu_seconds": {"learner": learner_cpu, "actors": actors_cpu},
        "cpu_cores_used": {"learner": None if learner_cpu is None else learner_cpu / seconds,
                           "actors": actors_cpu / seconds},
        "cpu_system_fraction": {"learner": None if not learner_cpu else learner_times[1] / learner_cpu,
                                "actors": None if not actors_cpu or actors_system is None
                                else actors_system / actors_cpu},
        "machine_busy_cores": None if busy is None else busy / seconds,
        "other_processes_cores": None if busy is None else max(0.0, (busy - ours) / seconds),
        # Share of the window in which some runnable task waited for a CPU: near 100% means oversubscribed.
        "cpu_pressure_pct": None if warm["cpu_pressure"] is None or last["cpu_pressure"] is None
        else 100.0 * (last["cpu_pressure"] - warm["cpu_pressure"]) / seconds,
        "load_average": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in load_after]},
        "gpu": gpu.summary(),
        "measured_s": seconds,
        "actors_measured": len(live),
        "run_dir": job.run_dir,
        "profiles": {name: summarise_profile(os.path.join(job.run_dir, f"profile-{name}.txt")) for name in profile}
        or None,
    }
    return result
