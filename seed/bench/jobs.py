"""The processes of one measured run, as command lines: the framework (seed-learner + seed-actor), the
actor-side-inference baseline (seed/bench/actor_side.py), the transport ceiling (seed/bench/transport_ceiling.py)
and the simulator ceiling (seed/bench/env_only.py: the actors' envs alone, no server).

Every path handed to a process (logdir, stats files, unix sockets) is absolute, made from the run directory,
so the processes never depend on the working directory they start in.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import shutil
import socket
import sys
import tempfile
from typing import Any

from seed.bench.configs import BenchSetup
from seed.bench.measure import BenchError, Job
from seed.config import LearnerConfig, actor_config_class, env_options_class


def _flag_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def as_flags(values: dict[str, Any]) -> list[str]:
    return [f"--{key}={_flag_value(value)}" for key, value in values.items()]



def _short_socket_dir(run_dir: str) -> str:
    # unix socket paths are limited to ~107 bytes; deep run dirs get a short private directory instead.
    if len(run_dir) < 80:
        return run_dir
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


def env_values(config: LearnerConfig) -> dict[str, Any]:
    """Every env flag, resolved, so actors and servers build exactly the learner's env spec."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(env_options_class())}


def _learner_flags(setup: BenchSetup, logdir: str, listen: str, log_interval_s: float) -> dict[str, Any]:
    return {**setup.learner_flags, "logdir": logdir, "server_address": listen, "total_environment_frames": 1e15,
            "checkpoint_interval_s": 1e9, "log_interval_s": log_interval_s}


def _stats_interval(duration_s: float) -> float:
    return max(0.2, min(1.0, duration_s / 20.0))


def framework_job(setup: BenchSetup, run_dir: str, duration_s: float) -> Job:
    run_dir = os.path.abspath(run_dir)
    listen, dial = _addresses(setup, run_dir, "learner")
    logdir = os.path.join(run_dir, "learner")
    if setup.switch_interval_ms > 0:  # an experiment knob: how much GIL hand-over latency costs the learner
        launcher = ["-c", f"import sys; sys.setswitchinterval({setup.switch_interval_ms / 1000.0}); "
                          "from seed.learner.main import run; run()"]
    else:
        launcher = ["-m", "seed.learner.main"]
    server = [sys.executable, *launcher, *as_flags(_learner_flags(setup, logdir, listen, _stats_interval(duration_s)))]
    actor_fields = {f.name for f in dataclasses.fields(actor_config_class())}
    env_flags = {k: v for k, v in env_values(setup.config).items() if k in actor_fields}
    stats = [os.path.join(run_dir, f"actor{i}.stats.jsonl") for i in range(setup.config.num_actors)]
    actors = [[sys.executable, "-m", "seed.actor.main", f"--actor_index={i}", f"--server_address={dial}",
               f"--stats_file={stats[i]}", f"--stats_interval_s={_stats_interval(duration_s)}",
               "--log_interval_s=1e9", *as_flags(env_flags)] for i in range(setup.config.num_actors)]
    return Job("framework", run_dir, dial, server, actors, stats, os.path.join(logdir, "metrics.jsonl"))


def actor_side_job(setup: BenchSetup, run_dir: str, duration_s: float) -> Job:
    run_dir = os.path.abspath(run_dir)
    if setup.config.agent != "vtrace":
        raise BenchError(f"--baselines=actor_side: needs --agent=vtrace (got {setup.config.agent!r}); "
                         "the actor-side baseline trains V-trace")
    listen, dial = _addresses(setup, run_dir, "actor_side")
    logdir = os.path.join(run_dir, "learner")
    flags_ = as_flags(_learner_flags(setup, logdir, listen, _stats_interval(duration_s)))
    module = [sys.executable, "-m", "seed.bench.actor_side"]
    server = [*module, "--role=learner", *flags_]
    stats = [os.path.join(run_dir, f"actor{i}.stats.jsonl") for i in range(setup.config.num_actors)]
    actors = [[*module, "--role=actor", f"--actor_index={i}", f"--stats_file={stats[i]}",
               f"--stats_interval_s={_stats_interval(duration_s)}",
               f"--actor_torch_threads={setup.actor_torch_threads}", *flags_]
              for i in range(setup.config.num_actors)]
    return Job("actor_side", run_dir, dial, server, actors, stats, os.path.join(logdir, "metrics.jsonl"))


def transport_job(setup: BenchSetup, run_dir: str, duration_s: float) -> Job:
    run_dir = os.path.abspath(run_dir)
    listen, dial = _addresses(setup, run_dir, "ceiling")
    env_flags = as_flags(env_values(setup.config))
    server = [sys.executable, "-m", "seed.bench.transport_ceiling", f"--server_address={listen}",
              f"--num_actors={setup.config.num_actors}", *env_flags]
    stats = [os.path.join(run_dir, f"actor{i}.stats.jsonl") for i in range(setup.config.num_actors)]
    actors = [[sys.executable, "-m", "seed.actor.main", f"--actor_index={i}", f"--server_address={dial}",
               f"--stats_file={stats[i]}", f"--stats_interval_s={_stats_interval(duration_s)}",
               "--log_interval_s=1e9", *env_flags] for i in range(setup.config.num_actors)]
    return Job("transport", run_dir, dial, server, actors, stats, None)


def env_only_job(setup: BenchSetup, run_dir: str, duration_s: float) -> Job:
    """The actors' envs alone: num_actors processes with the framework actors' env flags and indices, each
    stepping its K envs with random actions; no server, so nothing to dial."""
    run_dir = os.path.abspath(run_dir)
    actor_fields = {f.name for f in dataclasses.fields(actor_config_class())}
    env_flags = as_flags({k: v for k, v in env_values(setup.config).items() if k in actor_fields})
    stats = [os.path.join(run_dir, f"actor{i}.stats.jsonl") for i in range(setup.config.num_actors)]
    actors = [[sys.executable, "-m", "seed.bench.env_only", f"--actor_index={i}", f"--stats_file={stats[i]}",
               f"--stats_interval_s={_stats_interval(duration_s)}", *env_flags]
              for i in range(setup.config.num_actors)]
    return Job("env_only", run_dir, "", None, actors, stats, None)


JOBS = {"framework": framework_job, "actor_side": actor_side_job, "transport": transport_job,
        "env_only": env_only_job}
