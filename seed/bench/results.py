"""One seed-bench result: run the framework and its baselines (seed/bench/jobs.py, measured by
seed/bench/measure.py), describe the machine and configuration, and write the result JSON and its summary.

Rates are env frames per second (agent steps x action repeat), latencies milliseconds, CPU use cores
(CPU seconds per wall second).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from typing import Any

import numpy as np

from seed.bench.configs import BenchSetup
from seed.bench.jobs import JOBS, env_values
from seed.bench.measure import measure
from seed.bench.probes import GpuSampler
from seed.config import LearnerConfig, env_options_class

SCHEMA = "seed-bench/1"
BASELINES = ("actor_side", "transport", "env_only")


def _versions() -> dict[str, str]:
    import grpc
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__, "grpc": grpc.__version__,
            "numpy": np.__version__}


def _package_version() -> str | None:
    """The installed distribution's version (seed-rl-torch), None when seed runs from an uninstalled tree."""
    from importlib import metadata

    try:
        return metadata.version("seed-rl-torch")
    except metadata.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    """The commit of the git checkout the running `seed` package is imported from, with "+dirty" when tracked
    files differ from it; None for an installed copy (a wheel in site-packages is no checkout, even when the
    virtual environment sits inside one: the package's own __init__.py must be tracked by the repository)."""
    import seed

    package_dir = os.path.dirname(os.path.abspath(seed.__file__))

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=package_dir, capture_output=True, text=True, timeout=10)

    try:
        if git("ls-files", "--error-unmatch", "__init__.py").returncode != 0:
            return None
        commit = git("rev-parse", "HEAD").stdout.strip()
        dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (commit + ("+dirty" if dirty else "")) or None


def cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def accelerators(config: LearnerConfig) -> dict[str, int]:
    """{device name: count} of the accelerators the learner uses (empty for a CPU-only run)."""
    inference = (config.inference_devices or config.inference_device).split(",")
    devices = sorted({d.strip() for d in (*inference, config.training_device) if d.strip().startswith("cuda")})
    if not devices:
        return {}
    names: dict[str, int] = {}
    gpus = {index: name for index, name, _, _ in GpuSampler.query()}
    for device in devices:
        index = int(device.split(":", 1)[1]) if ":" in device else 0
        name = gpus.get(index)
        if name is None:
            try:
                import torch

                name = torch.cuda.get_device_name(index)
            except Exception:  # no driver: still name the device so pricing can say what is missing
                name = device
        names[name] = names.get(name, 0) + 1
    return names


def describe(setup: BenchSetup) -> dict[str, Any]:
    c = setup.config
    from seed.envs import make_spec

    spec = make_spec(c.env, env_options_class()(**env_values(c)).env_options())
    network = c.network
    if network == "auto":
        network = "mlp" if len(spec.observation_shape) == 1 else "auto (agent image default)"
    return {
        "agent": c.agent, "env": c.env, "network": network, "network_width": c.network_width,
        "mlp_sizes": c.mlp_sizes if network == "mlp" else None, "use_lstm": c.use_lstm,
        "num_actors": c.num_actors, "envs_per_actor": c.envs_per_actor, "env_groups": c.env_groups,
        "num_envs": c.num_envs,
        "action_repeat": spec.action_repeat, "inference_batch_size": c.inference_batch_size,
        "batch_timeout_ms": c.batch_timeout_ms, "batch_size": c.batch_size, "unroll_length": c.unroll_length,
        "inference_device": c.inference_devices or c.inference_device, "training_device": c.training_device,
        "training_process": c.training_process,
        "devices": {"cpu_cores": os.cpu_count(), "accelerators": accelerators(c)},
        "cpu_cores": os.cpu_count(), "cpu_model": cpu_model(), "transport": setup.transport,
        "actor_torch_threads": setup.actor_torch_threads, "learner_flags": setup.learner_flags,
        "learner_switch_interval_ms": setup.switch_interval_ms or None,
        **_versions(), "platform": platform.platform(), "git_commit": _git_commit(),
        "seed_version": _package_version(),
    }


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median env frames/s (the lower middle one for an even count), with every run's rate."""
    ordered = sorted(runs, key=lambda r: r["env_frames_per_sec"])
    chosen = dict(ordered[(len(ordered) - 1) // 2])
    chosen["repeats"] = [{"env_frames_per_sec": r["env_frames_per_sec"], "other_processes_cores":
                          r["other_processes_cores"], "run_dir": r["run_dir"]} for r in runs]
    return chosen


def run_bench(setup: BenchSetup, runs_dir: str, duration_s: float, warmup_s: float, baselines: list[str],
              progress: bool = True, profile: tuple[str, ...] = (), repeats: int = 1) -> dict[str, Any]:
    """Measures the framework and the requested baselines one after the other, `repeats` rounds of them
    interleaved (so a neighbour's load hits all alike); each reports its median round. Returns the result."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    root = os.path.join(os.path.abspath(runs_dir), f"{setup.name}-{stamp}-{os.getpid()}")
    result: dict[str, Any] = {
        "schema": SCHEMA, "name": setup.name, "description": setup.description,
        "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]),
        "duration_s": duration_s, "warmup_s": warmup_s,
        "configuration": describe(setup),
    }
    runs: dict[str, list[dict[str, Any]]] = {}
    for round_index in range(repeats):
        for kind in ("framework", *baselines):
            run_dir = os.path.join(root, kind if repeats == 1 else f"{kind}-{round_index}")
            job = JOBS[kind](setup, run_dir, duration_s)
            runs.setdefault(kind, []).append(measure(job, duration_s, warmup_s, progress, profile))
    measured = {kind: _median_run(kind_runs) for kind, kind_runs in runs.items()}
    result["repeats"] = repeats
    framework = measured["framework"]
    result["framework"] = framework
    result["baselines"] = {kind: measured.get(kind) for kind in BASELINES}
    # The headline numbers, flat, for reports and tables.
    for key in ("env_frames_per_sec", "env_frames_per_sec_learner", "agent_steps_per_sec", "train_steps_per_sec",
                "inference_batch_size_mean", "round_trip_latency_ms_p50", "round_trip_latency_ms_p99",
                "learner_latency_ms_p50", "learner_latency_ms_p99", "cpu_seconds", "cpu_cores_used", "gpu",
                "actor_waiting_fraction"):
        result[key] = framework[key]
    ratio = lambda a, b: None if not a or not b else a / b
    transport, actor_side, env_only = (measured.get(kind) for kind in ("transport", "actor_side", "env_only"))
    result["ratios"] = {
        # The share of the simulator's own limit (the same envs, processes and cores with no learner) reached.
        "framework_over_env_only": ratio(framework["env_frames_per_sec"],
                                         env_only and env_only["env_frames_per_sec"]),
        "framework_over_transport": ratio(framework["env_frames_per_sec"],
                                          transport and transport["env_frames_per_sec"]),
        "central_over_actor_side": ratio(framework["env_frames_per_sec"],
                                         actor_side and actor_side["env_frames_per_sec"]),
    }
    return result


REQUIRED_RESULT_KEYS = (
    "schema", "name", "configuration", "framework", "baselines", "ratios", "env_frames_per_sec",
    "env_frames_per_sec_learner", "agent_steps_per_sec", "train_steps_per_sec", "inference_batch_size_mean",
    "round_trip_latency_ms_p50", "round_trip_latency_ms_p99", "learner_latency_ms_p50", "learner_latency_ms_p99",
    "cpu_seconds", "cpu_cores_used", "gpu",
)


def write_json(path: str, data: Any) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")


def fmt(value: Any, spec: str = ",.0f") -> str:
    return "-" if value is None else format(value, spec)


def summary_markdown(result: dict[str, Any]) -> str:
    c = result["configuration"]
    devices = "".join(f", {n} x {k}" for k, n in c["devices"]["accelerators"].items())
    groups = f" in {c['env_groups']} env groups" if c.get("env_groups", 1) > 1 else ""
    lines = [f"### {result['name']}: {c['agent']} on {c['env']}, {c['num_actors']} actors x {c['envs_per_actor']} "
             f"envs{groups}, network {c['network']}, {c['cpu_cores']} CPU cores{devices}",
             "",
             "| run | env frames/s (actors) | range over repeats | env frames/s (learner) | train steps/s | "
             "inference batch | round trip p50 / p99 (ms) | actors waiting | CPU cores used (learner + actors) | "
             "other load (cores) | CPU pressure |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    runs = [("framework", result["framework"])] + [(k, v) for k, v in result["baselines"].items() if v]
    for kind, m in runs:
        cores = m["cpu_cores_used"]
        repeats = [r["env_frames_per_sec"] for r in m.get("repeats", [])]
        spread = f"{min(repeats):,.0f} - {max(repeats):,.0f}" if len(repeats) > 1 else "-"
        waiting = m.get("actor_waiting_fraction")
        lines.append(
            f"| {kind} | {fmt(m['env_frames_per_sec'])} | {spread} | {fmt(m['env_frames_per_sec_learner'])} | "
            f"{fmt(m['train_steps_per_sec'], '.1f')} | {fmt(m['inference_batch_size_mean'], '.1f')} | "
            f"{fmt(m['round_trip_latency_ms_p50'], '.2f')} / {fmt(m['round_trip_latency_ms_p99'], '.2f')} | "
            f"{fmt(None if waiting is None else 100 * waiting, '.0f')}% | "
            f"{fmt(cores['learner'], '.2f')} + {fmt(cores['actors'], '.2f')} | "
            f"{fmt(m['other_processes_cores'], '.2f')} | {fmt(m.get('cpu_pressure_pct'), '.0f')}% |")
    ratios = result["ratios"]
    notes = []
    if ratios.get("framework_over_env_only") is not None:
        notes.append(f"framework / env_only (the simulator ceiling): {ratios['framework_over_env_only']:.2f}")
    if ratios["framework_over_transport"] is not None:
        notes.append(f"framework / transport ceiling: {ratios['framework_over_transport']:.2f}")
    if ratios["central_over_actor_side"] is not None:
        notes.append(f"central / actor-side inference: {ratios['central_over_actor_side']:.2f}x")
    if result["baselines"].get("env_only"):
        notes.append("env_only: round trip = one step of an actor's K envs (no learner)")
    return "\n".join(lines + ([""] + notes if notes else []))
