"""Environment families. `--env=FAMILY:NAME` picks one, e.g. `gym:CartPole-v1`, `atari:Pong`, `minatar:breakout`.

Every family module defines:

    make_spec(name: str, options: dict) -> EnvSpec
    make_batch(name: str, num_envs: int, first_env_id: int, options: dict) -> EnvBatch

`options` holds the env flags (seed, sticky_actions, ...); env i of the run is seeded from
`options["seed"] + first_env_id + i`, so runs are repeatable.
"""

from __future__ import annotations

import importlib
from typing import Any

from seed.envs.base import EnvBatch, EnvSpec

FAMILIES = ("gym", "atari", "football", "minatar", "fake")


def split_env_name(env: str) -> tuple[str, str]:
    """'atari:Pong' -> ('atari', 'Pong'), with a clear error for a malformed value."""
    family, sep, name = env.partition(":")
    if not sep or not name or family not in FAMILIES:
        raise ValueError(f"--env: got {env!r}, expected FAMILY:NAME with FAMILY one of {', '.join(FAMILIES)}")
    return family, name


def _module(family: str):
    return importlib.import_module(f"seed.envs.{family}")


def make_spec(env: str, options: dict[str, Any] | None = None) -> EnvSpec:
    family, name = split_env_name(env)
    return _module(family).make_spec(name, dict(options or {}))


def make_batch(env: str, num_envs: int, first_env_id: int, options: dict[str, Any] | None = None) -> EnvBatch:
    family, name = split_env_name(env)
    return _module(family).make_batch(name, num_envs, first_env_id, dict(options or {}))
