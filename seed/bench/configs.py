"""Named benchmark configurations: the shipped seed/bench/configs.yaml (package data) or a file given with
`--bench_configs`, resolved into the learner's own configuration plus the few settings only seed-bench reads.
"""

from __future__ import annotations

import dataclasses
import os
from importlib import resources
from typing import Any

from seed.bench.measure import BenchError
from seed.config import LearnerConfig
from seed.learner.configuration import learner_fields as all_learner_fields

BENCH_ONLY_KEYS = {"description", "duration_s", "actor_torch_threads", "requires"}
# seed-bench owns these learner flags: a run needs a fresh logdir (no resume) and never stops by itself.
OWNED_FLAGS = ("logdir", "server_address", "total_environment_frames", "checkpoint_interval_s")
# Shipped inside the package, so an installed seed-bench finds it from any working directory.
DEFAULT_CONFIGS = str(resources.files("seed.bench").joinpath("configs.yaml"))


def load_bench_configs(path: str) -> dict[str, dict[str, Any]]:
    import yaml

    if not os.path.isfile(path):
        raise BenchError(f"--bench_configs: got {path!r}, expected an existing YAML file (default: {DEFAULT_CONFIGS})")
    with open(path) as f:
        configs = yaml.safe_load(f) or {}
    if not isinstance(configs, dict) or not all(isinstance(v, dict) for v in configs.values()):
        raise BenchError(f"{path}: expected a mapping of configuration names to mappings of flags")
    return configs


def split_bench_config(name: str, entry: dict[str, Any], path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(learner flags, bench-only settings) of one named configuration; unknown keys are an error."""
    learner_fields = set(all_learner_fields())
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
    from seed.learner.configuration import resolve_config

    fields = all_learner_fields()
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
        raise BenchError(f"--agent={typed.get('agent')}: not available in this installation ({error})") from None
    except ValueError as error:
        raise BenchError(str(error)) from None



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
    description = str(bench.get("description", ""))
    if overrides:  # the config's description names its own values; say which ones this run replaced
        description += " (overridden: " + ", ".join(f"{k}={v}" for k, v in sorted(overrides.items())) + ")"
    setup = BenchSetup(name=name, description=description, learner_flags=learner_flags,
                       config=config, actor_torch_threads=int(bench.get("actor_torch_threads", 1)),
                       transport=transport, switch_interval_ms=switch_interval_ms)
    return setup, bench

