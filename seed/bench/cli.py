"""`seed-bench`: throughput, latency and CPU use of a learner plus actors on this machine, as one JSON file.

    seed-bench --config=fake_mlp --duration_s=30 --out=bench_results/fake_mlp.json
    seed-bench --config=fake_mlp --baselines=actor_side,transport --out=bench_results/fake_mlp.json
    seed-bench --config=fake_mlp --sweep=actors --values=1,2,4 --out=bench_results/sweep_actors.json
    seed-bench --list

A run starts the learner (`python -m seed.learner_main`) with the named configuration from
launch/bench_configs.yaml (flags typed here override it), waits until it serves (gRPC health check),
starts `num_actors` actor processes that write stats files (seed/actor_stats.py), runs for `--duration_s`
seconds from the moment every actor steps, and stops everything. Rates are taken over the window after the
warm-up (`--warmup_s`, default 20% of the duration); seed/bench_measure.py says how each value is measured.
Env frames/s are counted at the actors (the headline FPS) and at the learner; round-trip latency is measured
at the actor (send of a step message to receipt of its actions); CPU per process type from /proc.

Baselines (`--baselines=actor_side,transport`) run right after, with the same env, actors, envs and duration:
  actor_side  IMPALA-style: every actor runs its own copy of the network (seed/actor_side_inference.py)
  transport   the transport ceiling: the same seed-actor processes against a server that answers every step
              with zero actions and does nothing else (seed/transport_ceiling.py)

Sweeps (`--sweep=actors|envs_per_actor|network_width --values=...`) run the configuration once per value
and also write a Markdown table (<out>.md) and a plot of FPS against the value (<out>.png).
"""

from __future__ import annotations

import atexit
import dataclasses
import datetime
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
from typing import Any

import numpy as np
from absl import app, flags

from seed.bench_measure import REPO_ROOT, BenchError, GpuSampler, Job, measure
from seed.config import ActorConfig, EnvOptions, LearnerConfig, define_flags, explicit_flags

SCHEMA = "seed-bench/1"
BASELINES = ("actor_side", "transport")
SWEEPS = {"actors": "num_actors", "envs_per_actor": "envs_per_actor", "network_width": "network_width"}
BENCH_ONLY_KEYS = {"description", "duration_s", "actor_torch_threads", "requires"}
# seed-bench owns these learner flags: a run needs a fresh logdir (no resume) and never stops by itself.
OWNED_FLAGS = ("logdir", "server_address", "total_environment_frames", "checkpoint_interval_s")
DEFAULT_CONFIGS = os.path.join(REPO_ROOT, "launch", "bench_configs.yaml")


# ----------------------------------------------------------------------------------------------- configurations


def load_bench_configs(path: str) -> dict[str, dict[str, Any]]:
    import yaml

    if not os.path.exists(path):
        raise BenchError(f"--bench_configs: {path} does not exist")
    with open(path) as f:
        configs = yaml.safe_load(f) or {}
    if not isinstance(configs, dict) or not all(isinstance(v, dict) for v in configs.values()):
        raise BenchError(f"{path}: expected a mapping of configuration names to mappings of flags")
    return configs


def split_bench_config(name: str, entry: dict[str, Any], path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(learner flags, bench-only settings) of one named configuration; unknown keys are an error."""
    learner_fields = {f.name for f in dataclasses.fields(LearnerConfig)}
    unknown = sorted(set(entry) - learner_fields - BENCH_ONLY_KEYS)
    if unknown:
        raise BenchError(f"bench configuration {name!r} in {path}: keys {unknown} are neither seed-learner flags "
                         f"(LearnerConfig fields) nor bench keys {sorted(BENCH_ONLY_KEYS)}")
    owned = sorted(set(entry) & set(OWNED_FLAGS))
    if owned:
        raise BenchError(f"bench configuration {name!r} in {path}: {owned} are set by seed-bench itself")
    learner = {k: v for k, v in entry.items() if k in learner_fields}
    bench = {k: v for k, v in entry.items() if k in BENCH_ONLY_KEYS}
    return learner, bench


def resolve_learner_config(learner_flags: dict[str, Any]) -> LearnerConfig:
    """The learner's resolved configuration (agent defaults applied), as the learner process will see it."""
    from seed.learner_main import resolve_config

    fields = {f.name: f for f in dataclasses.fields(LearnerConfig)}
    typed = {}
    for key, value in learner_flags.items():
        kind = type(fields[key].default)
        if kind is bool and isinstance(value, str):
            typed[key] = value.strip().lower() in ("1", "true", "yes")
        else:
            typed[key] = kind(value)
    try:
        return resolve_config(typed)
    except ModuleNotFoundError as error:
        raise BenchError(f"--agent={typed.get('agent')}: not available in this checkout ({error})") from None
    except ValueError as error:
        raise BenchError(str(error)) from None


def _flag_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def as_flags(values: dict[str, Any]) -> list[str]:
    return [f"--{key}={_flag_value(value)}" for key, value in values.items()]


# ----------------------------------------------------------------------------------------------- measurements


# ----------------------------------------------------------------------------------------------- jobs


@dataclasses.dataclass
class BenchSetup:
    """A named configuration with overrides applied: what every job of one seed-bench run shares."""

    name: str
    description: str
    learner_flags: dict[str, Any]  # as typed (bench config < command-line overrides)
    config: LearnerConfig  # resolved by the learner's own rules
    actor_torch_threads: int
    transport: str  # unix or tcp
    switch_interval_ms: float = 0.0  # the learner's sys.setswitchinterval; 0 = Python's default (5 ms)


def _short_socket_dir(run_dir: str) -> str:
    # unix socket paths are limited to ~107 bytes; deep run dirs get a short private directory instead.
    if len(os.path.abspath(run_dir)) < 80:
        return os.path.abspath(run_dir)
    path = tempfile.mkdtemp(prefix="seed-bench-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _addresses(setup: BenchSetup, run_dir: str, name: str) -> tuple[str, str]:
    """(listen address, dial address) for a server of this run."""
    if setup.transport == "tcp":
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        return f"127.0.0.1:{port}", f"127.0.0.1:{port}"
    path = os.path.join(_short_socket_dir(run_dir), f"{name}.sock")
    return f"unix:{path}", f"unix:{path}"


def _env_flags(config: LearnerConfig) -> dict[str, Any]:
    """Every env flag, resolved, so actors and servers build exactly the learner's env spec."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(EnvOptions)}


def _learner_flags(setup: BenchSetup, logdir: str, listen: str, log_interval_s: float) -> dict[str, Any]:
    return {**setup.learner_flags, "logdir": logdir, "server_address": listen, "total_environment_frames": 1e15,
            "checkpoint_interval_s": 1e9, "log_interval_s": log_interval_s}


def _stats_interval(duration_s: float) -> float:
    return max(0.2, min(1.0, duration_s / 20.0))


def framework_job(setup: BenchSetup, run_dir: str, duration_s: float) -> Job:
    listen, dial = _addresses(setup, run_dir, "learner")
    logdir = os.path.join(run_dir, "learner")
    if setup.switch_interval_ms > 0:  # an experiment knob: how much GIL hand-over latency costs the learner
        launcher = ["-c", f"import sys; sys.setswitchinterval({setup.switch_interval_ms / 1000.0}); "
                          "from seed.learner_main import run; run()"]
    else:
        launcher = ["-m", "seed.learner_main"]
    server = [sys.executable, *launcher, *as_flags(_learner_flags(setup, logdir, listen, _stats_interval(duration_s)))]
    actor_fields = {f.name for f in dataclasses.fields(ActorConfig)}
    env_flags = {k: v for k, v in _env_flags(setup.config).items() if k in actor_fields}
    stats = [os.path.join(run_dir, f"actor{i}.stats.jsonl") for i in range(setup.config.num_actors)]
    actors = [[sys.executable, "-m", "seed.actor_main", f"--actor_index={i}", f"--server_address={dial}",
               f"--stats_file={stats[i]}", f"--stats_interval_s={_stats_interval(duration_s)}",
               "--log_interval_s=1e9", *as_flags(env_flags)] for i in range(setup.config.num_actors)]
    return Job("framework", run_dir, dial, server, actors, stats, os.path.join(logdir, "metrics.jsonl"))


def actor_side_job(setup: BenchSetup, run_dir: str, duration_s: float) -> Job:
    if setup.config.agent != "vtrace":
        raise BenchError(f"--baselines=actor_side: needs --agent=vtrace (got {setup.config.agent!r}); "
                         "the actor-side baseline trains V-trace")
    listen, dial = _addresses(setup, run_dir, "actor_side")
    logdir = os.path.join(run_dir, "learner")
    flags_ = as_flags(_learner_flags(setup, logdir, listen, _stats_interval(duration_s)))
    module = [sys.executable, "-m", "seed.actor_side_inference"]
    server = [*module, "--role=learner", *flags_]
    stats = [os.path.join(run_dir, f"actor{i}.stats.jsonl") for i in range(setup.config.num_actors)]
    actors = [[*module, "--role=actor", f"--actor_index={i}", f"--stats_file={stats[i]}",
               f"--stats_interval_s={_stats_interval(duration_s)}",
               f"--actor_torch_threads={setup.actor_torch_threads}", *flags_]
              for i in range(setup.config.num_actors)]
    return Job("actor_side", run_dir, dial, server, actors, stats, os.path.join(logdir, "metrics.jsonl"))


def transport_job(setup: BenchSetup, run_dir: str, duration_s: float) -> Job:
    listen, dial = _addresses(setup, run_dir, "ceiling")
    env_flags = as_flags(_env_flags(setup.config))
    server = [sys.executable, "-m", "seed.transport_ceiling", f"--server_address={listen}",
              f"--num_actors={setup.config.num_actors}", *env_flags]
    stats = [os.path.join(run_dir, f"actor{i}.stats.jsonl") for i in range(setup.config.num_actors)]
    actors = [[sys.executable, "-m", "seed.actor_main", f"--actor_index={i}", f"--server_address={dial}",
               f"--stats_file={stats[i]}", f"--stats_interval_s={_stats_interval(duration_s)}",
               "--log_interval_s=1e9", *env_flags] for i in range(setup.config.num_actors)]
    return Job("transport", run_dir, dial, server, actors, stats, None)


JOBS = {"framework": framework_job, "actor_side": actor_side_job, "transport": transport_job}


# ----------------------------------------------------------------------------------------------- results


def _versions() -> dict[str, str]:
    import grpc
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__, "grpc": grpc.__version__,
            "numpy": np.__version__}


def _git_commit() -> str | None:
    """The checkout's commit, with "+dirty" when tracked files differ from it; None outside a git checkout."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                                timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (commit + ("+dirty" if dirty else "")) or None


def _cpu_model() -> str | None:
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

    spec = make_spec(c.env, EnvOptions(**_env_flags(c)).env_options())
    network = c.network
    if network == "auto":
        network = "mlp" if len(spec.observation_shape) == 1 else "auto (agent image default)"
    return {
        "agent": c.agent, "env": c.env, "network": network, "network_width": c.network_width,
        "mlp_sizes": c.mlp_sizes if network == "mlp" else None, "use_lstm": c.use_lstm,
        "num_actors": c.num_actors, "envs_per_actor": c.envs_per_actor, "num_envs": c.num_envs,
        "action_repeat": spec.action_repeat, "inference_batch_size": c.inference_batch_size,
        "batch_timeout_ms": c.batch_timeout_ms, "batch_size": c.batch_size, "unroll_length": c.unroll_length,
        "inference_device": c.inference_devices or c.inference_device, "training_device": c.training_device,
        "devices": {"cpu_cores": os.cpu_count(), "accelerators": accelerators(c)},
        "cpu_cores": os.cpu_count(), "cpu_model": _cpu_model(), "transport": setup.transport,
        "actor_torch_threads": setup.actor_torch_threads, "learner_flags": setup.learner_flags,
        "learner_switch_interval_ms": setup.switch_interval_ms or None,
        **_versions(), "platform": platform.platform(), "git_commit": _git_commit(),
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
    root = os.path.join(runs_dir, f"{setup.name}-{stamp}-{os.getpid()}")
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
                "learner_latency_ms_p50", "learner_latency_ms_p99", "cpu_seconds", "cpu_cores_used", "gpu"):
        result[key] = framework[key]
    ratio = lambda a, b: None if not a or not b else a / b
    transport, actor_side = measured.get("transport"), measured.get("actor_side")
    result["ratios"] = {
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


def _fmt(value: Any, spec: str = ",.0f") -> str:
    return "-" if value is None else format(value, spec)


def summary_markdown(result: dict[str, Any]) -> str:
    c = result["configuration"]
    devices = "".join(f", {n} x {k}" for k, n in c["devices"]["accelerators"].items())
    lines = [f"### {result['name']}: {c['agent']} on {c['env']}, {c['num_actors']} actors x {c['envs_per_actor']} "
             f"envs, network {c['network']}, {c['cpu_cores']} CPU cores{devices}",
             "",
             "| run | env frames/s (actors) | range over repeats | env frames/s (learner) | train steps/s | "
             "inference batch | round trip p50 / p99 (ms) | CPU cores used (learner + actors) | other load (cores) | "
             "CPU pressure |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    runs = [("framework", result["framework"])] + [(k, v) for k, v in result["baselines"].items() if v]
    for kind, m in runs:
        cores = m["cpu_cores_used"]
        repeats = [r["env_frames_per_sec"] for r in m.get("repeats", [])]
        spread = f"{min(repeats):,.0f} - {max(repeats):,.0f}" if len(repeats) > 1 else "-"
        lines.append(
            f"| {kind} | {_fmt(m['env_frames_per_sec'])} | {spread} | {_fmt(m['env_frames_per_sec_learner'])} | "
            f"{_fmt(m['train_steps_per_sec'], '.1f')} | {_fmt(m['inference_batch_size_mean'], '.1f')} | "
            f"{_fmt(m['round_trip_latency_ms_p50'], '.2f')} / {_fmt(m['round_trip_latency_ms_p99'], '.2f')} | "
            f"{_fmt(cores['learner'], '.2f')} + {_fmt(cores['actors'], '.2f')} | "
            f"{_fmt(m['other_processes_cores'], '.2f')} | {_fmt(m.get('cpu_pressure_pct'), '.0f')}% |")
    ratios = result["ratios"]
    if ratios["framework_over_transport"] is not None:
        lines.append(f"\nframework / transport ceiling: {ratios['framework_over_transport']:.2f}")
    if ratios["central_over_actor_side"] is not None:
        lines.append(f"central / actor-side inference: {ratios['central_over_actor_side']:.2f}x")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- sweeps


def sweep_setups(setup: BenchSetup, sweep: str, values: list[int]) -> list[tuple[int, BenchSetup]]:
    """One setup per swept value. network_width on an MLP scales mlp_sizes (width is an image-net flag)."""
    key = SWEEPS[sweep]
    setups = []
    for value in values:
        flags_ = dict(setup.learner_flags)
        if key == "network_width" and setup.config.network == "mlp":
            base = [int(s) for s in str(setup.config.mlp_sizes).split(",") if s]
            flags_["mlp_sizes"] = ",".join(str(s * value) for s in base)
        flags_[key] = value
        config = resolve_learner_config(flags_)
        setups.append((value, dataclasses.replace(setup, name=f"{setup.name}-{sweep}{value}", learner_flags=flags_,
                                                  config=config)))
    return setups


def sweep_table(sweep: str, points: list[dict[str, Any]]) -> str:
    lines = [f"| {sweep} | envs | env frames/s (actors) | env frames/s (learner) | train steps/s | "
             "round trip p50 (ms) | transport ceiling | actor-side | other load (cores) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for point in points:
        r = point["result"]
        base = r["baselines"]
        lines.append(
            f"| {point['value']} | {r['configuration']['num_envs']} | {_fmt(r['env_frames_per_sec'])} | "
            f"{_fmt(r['env_frames_per_sec_learner'])} | {_fmt(r['train_steps_per_sec'], '.1f')} | "
            f"{_fmt(r['round_trip_latency_ms_p50'], '.2f')} | "
            f"{_fmt(base['transport'] and base['transport']['env_frames_per_sec'])} | "
            f"{_fmt(base['actor_side'] and base['actor_side']['env_frames_per_sec'])} | "
            f"{_fmt(r['framework'].get('other_processes_cores'), '.2f')} |")
    return "\n".join(lines)


def sweep_plot(sweep: str, points: list[dict[str, Any]], title: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    values = [p["value"] for p in points]
    fig, ax = plt.subplots(figsize=(6, 4))
    baseline_fps = lambda r, kind: r["baselines"][kind] and r["baselines"][kind]["env_frames_per_sec"]
    series = [("framework (central inference)", lambda r: r["env_frames_per_sec"]),
              ("transport ceiling", lambda r: baseline_fps(r, "transport")),
              ("actor-side inference", lambda r: baseline_fps(r, "actor_side"))]
    for label, get in series:
        ys = [get(p["result"]) for p in points]
        if any(y is not None for y in ys):
            ax.plot(values, [np.nan if y is None else y for y in ys], marker="o", label=label)
    ax.set_xlabel(sweep)
    ax.set_ylabel("env frames / s")
    if min(values) > 0 and max(values) >= 8 * min(values):  # powers of two read best on a log axis
        ax.set_xscale("log", base=2)
    ax.set_xticks(values, [str(v) for v in values])
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _stem(path: str) -> str:
    return path[:-5] if path.endswith(".json") else path


# ----------------------------------------------------------------------------------------------- main

FLAGS = flags.FLAGS


def _define_bench_flags() -> None:
    define_flags(LearnerConfig)  # any learner flag overrides the named configuration
    flags.DEFINE_string("config", "", "Name of a configuration in --bench_configs (see --list).")
    flags.DEFINE_string("bench_configs", DEFAULT_CONFIGS, "The YAML file of named configurations.")
    flags.DEFINE_bool("list", False, "List the named configurations and exit.")
    flags.DEFINE_float("duration_s", 0.0, "Seconds each run lasts once its actors start, warm-up included; "
                                          "0 = the configuration's duration_s (else 30).")
    flags.DEFINE_float("warmup_s", -1.0, "Seconds excluded from the rates at the start; -1 = 20% of the duration.")
    flags.DEFINE_string("out", "", "Result JSON path; default bench_results/<config>.json.")
    flags.DEFINE_string("runs_dir", "bench_results/runs", "Where each run's logs, metrics and stats files go.")
    flags.DEFINE_list("baselines", [], "Also measure: actor_side (IMPALA-style), transport (gRPC ceiling).")
    flags.DEFINE_enum("sweep", "", ["", *SWEEPS], "Run once per --values of actors, envs_per_actor or network_width.")
    flags.DEFINE_list("values", [], "The swept values, e.g. 1,2,4.")
    flags.DEFINE_enum("transport", "unix", ["unix", "tcp"], "Actors dial a unix socket or TCP on 127.0.0.1.")
    flags.DEFINE_bool("progress", True, "Show a progress bar on stderr.")
    flags.DEFINE_integer("repeats", 1, "Rounds of (framework, baselines...); each reports its median round.")
    flags.DEFINE_float("switch_interval_ms", 0.0, "Experiment: run the learner with sys.setswitchinterval(this); "
                                                  "0 = Python's default (5 ms).")
    flags.DEFINE_list("profile", [], "Sample these processes with py-spy over the measurement window: server "
                                     "(learner / ceiling), actor0, actor1, ...; writes <run_dir>/profile-*.txt.")


def build_setup(name: str, path: str, overrides: dict[str, Any], transport: str = "unix",
                switch_interval_ms: float = 0.0) -> tuple[BenchSetup, dict]:
    configs = load_bench_configs(path)
    if name not in configs:
        raise BenchError(f"--config: got {name!r}, expected one of {', '.join(configs)} (from {path})")
    learner, bench = split_bench_config(name, configs[name], path)
    owned = sorted(set(overrides) & set(OWNED_FLAGS))
    if owned:
        raise BenchError(f"seed-bench sets {owned} itself; use --runs_dir for where runs go")
    if bench.get("requires") == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise BenchError(f"--config={name} needs a CUDA GPU (requires: cuda in {path}); "
                             "torch.cuda.is_available() is False on this machine")
    learner_flags = {**learner, **overrides}
    config = resolve_learner_config(learner_flags)
    setup = BenchSetup(name=name, description=str(bench.get("description", "")), learner_flags=learner_flags,
                       config=config, actor_torch_threads=int(bench.get("actor_torch_threads", 1)),
                       transport=transport, switch_interval_ms=switch_interval_ms)
    return setup, bench


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    try:
        if FLAGS.list:
            configs = load_bench_configs(FLAGS.bench_configs)
            width = max(map(len, configs), default=0)
            for name, entry in configs.items():
                print(f"{name:{width}s}  {entry.get('description', '')}")
            return
        if not FLAGS.config:
            raise BenchError("--config: required (see --list)")
        unknown = sorted(set(FLAGS.baselines) - set(BASELINES))
        if unknown:
            raise BenchError(f"--baselines: got {unknown}, expected a subset of {', '.join(BASELINES)}")
        overrides = explicit_flags(LearnerConfig, FLAGS)
        setup, bench = build_setup(FLAGS.config, FLAGS.bench_configs, overrides, FLAGS.transport,
                                   FLAGS.switch_interval_ms)
        duration = FLAGS.duration_s or float(bench.get("duration_s", 30))
        warmup = FLAGS.warmup_s if FLAGS.warmup_s >= 0 else 0.2 * duration
        if not 0 <= warmup < duration - 1:
            raise BenchError(f"--warmup_s: got {warmup}, expected 0 <= warmup_s < duration_s - 1 ({duration})")
        out = FLAGS.out or os.path.join("bench_results", f"{FLAGS.config}.json")
        baselines = [b for b in BASELINES if b in FLAGS.baselines]
        if not FLAGS.sweep:
            result = run_bench(setup, FLAGS.runs_dir, duration, warmup, baselines, FLAGS.progress, tuple(FLAGS.profile),
                               FLAGS.repeats)
            write_json(out, result)
            print(summary_markdown(result))
            print(f"\nwrote {out}")
            return
        if not FLAGS.values:
            raise BenchError("--values: required with --sweep, e.g. --values=1,2,4")
        try:
            values = [int(v) for v in FLAGS.values]
        except ValueError:
            raise BenchError(f"--values: got {FLAGS.values}, expected integers") from None
        points = []
        stem = _stem(out)
        for value, point_setup in sweep_setups(setup, FLAGS.sweep, values):
            print(f"[bench] {FLAGS.sweep}={value}", file=sys.stderr, flush=True)
            result = run_bench(point_setup, FLAGS.runs_dir, duration, warmup, baselines, FLAGS.progress,
                               tuple(FLAGS.profile), FLAGS.repeats)
            write_json(f"{stem}-{FLAGS.sweep}{value}.json", result)
            points.append({"value": value, "result": result})
        table = sweep_table(FLAGS.sweep, points)
        c = setup.config
        title = (f"{FLAGS.config}: {c.agent} on {c.env}, sweep {FLAGS.sweep}; {os.cpu_count()} CPU cores, "
                 f"{c.inference_device}/{c.training_device}")
        write_json(out, {"schema": SCHEMA + "-sweep", "name": FLAGS.config, "sweep": FLAGS.sweep,
                         "values": values, "title": title, "points": points})
        with open(f"{stem}.md", "w") as f:
            f.write(f"{title}\n\n{table}\n")
        sweep_plot(FLAGS.sweep, points, title, f"{stem}.png")
        print(f"{title}\n\n{table}\n\nwrote {out}, {stem}.md, {stem}.png")
    except BenchError as error:
        print(f"seed-bench: {error}", file=sys.stderr)
        sys.exit(1)


def run() -> None:
    _define_bench_flags()
    app.run(main)


if __name__ == "__main__":
    run()
