"""Learner memory over a long run: does the resident set stay flat once the replay is full?

    python -m seed.bench.rss --duration_s=3600 --out=docs/reliability/rss-cartpole-muzero.json -- \\
        --preset=cartpole_muzero --replay_capacity=1000 --total_environment_frames=1e9

Starts `launch/local.sh` with the flags after `--` (its own logdir under --runs_dir), and every `--interval_s`
samples the resident set size (RSS, MiB) of the learner process and of every process it started (the serving
and training processes), beside the replay's size from the learner's metrics.jsonl. Stops the run with SIGTERM
after `--duration_s` and writes a JSON file: the samples, when the replay became full, and the growth of the
learner's RSS between the first sample after that and the end (the issue's target: within 5%).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]


def _learner(launcher: psutil.Process) -> psutil.Process | None:
    for child in launcher.children(recursive=True):
        try:
            if "seed.learner.main" in " ".join(child.cmdline()):
                return child
        except psutil.Error:
            continue
    return None


def _rss_mib(process: psutil.Process) -> tuple[float, float]:
    """(the process's own RSS, its RSS plus its descendants'), MiB."""
    own = process.memory_info().rss
    total = own
    for child in process.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.Error:
            continue
    return own / 2**20, total / 2**20


def _last_metrics(logdir: Path) -> dict:
    path = logdir / "metrics.jsonl"
    if not path.exists():
        return {}
    lines = path.read_text().strip().splitlines()
    return json.loads(lines[-1]) if lines else {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration_s", type=float, default=3600.0)
    parser.add_argument("--interval_s", type=float, default=30.0)
    parser.add_argument("--runs_dir", default="/tmp/seed-rss")
    parser.add_argument("--out", required=True)
    parser.add_argument("flags", nargs="*", help="flags for launch/local.sh (after --)")
    args = parser.parse_args(argv)
    logdir = Path(args.runs_dir) / time.strftime("%Y%m%d-%H%M%S")
    command = [str(REPO / "launch" / "local.sh"), f"--logdir={logdir}", *args.flags]
    launcher = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=dict(os.environ, PYTHON=sys.executable))
    samples, start = [], time.monotonic()
    try:
        while time.monotonic() - start < args.duration_s and launcher.poll() is None:
            time.sleep(args.interval_s)
            learner = _learner(psutil.Process(launcher.pid))
            if learner is None:
                continue
            try:
                own, with_children = _rss_mib(learner)
            except psutil.Error:
                continue
            metrics = _last_metrics(logdir)
            samples.append(dict(t_s=round(time.monotonic() - start, 1), learner_rss_mib=round(own, 1),
                                learner_tree_rss_mib=round(with_children, 1),
                                replay_size=metrics.get("replay_size"), train_steps=metrics.get("train_steps"),
                                env_frames=metrics.get("env_frames")))
            print(json.dumps(samples[-1]), flush=True)
    finally:
        launcher.send_signal(signal.SIGTERM)
        code = launcher.wait(timeout=120)
    capacity = next((int(f.split("=", 1)[1]) for f in args.flags if f.startswith("--replay_capacity=")), None)
    full = [s for s in samples if capacity is not None and (s["replay_size"] or 0) >= capacity]
    result = dict(command=command, duration_s=args.duration_s, interval_s=args.interval_s, launcher_exit=code,
                  replay_capacity=capacity, samples=samples, cpu_count=os.cpu_count())
    if full:
        first, last = full[0], full[-1]
        result.update(full_at_s=first["t_s"], full_for_s=round(last["t_s"] - first["t_s"], 1),
                      learner_rss_growth_pct=round(100 * (last["learner_rss_mib"] / first["learner_rss_mib"] - 1), 2),
                      learner_tree_rss_growth_pct=round(
                          100 * (last["learner_tree_rss_mib"] / first["learner_tree_rss_mib"] - 1), 2),
                      learner_rss_max_over_first_pct=round(
                          100 * (max(s["learner_rss_mib"] for s in full) / first["learner_rss_mib"] - 1), 2))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print({k: v for k, v in result.items() if k != "samples"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
