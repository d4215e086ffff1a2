"""Environment families: the registry. `--env=FAMILY:NAME` picks one, e.g. `gym:CartPole-v1`, `atari:Pong`,
`minatar:breakout`.

The one place that names the families: `FAMILIES` maps each name to its `Registration`. A new family is a module
plus one line here; a family outside this package registers itself: a module named in the environment variable
SEED_RL_PLUGINS (comma-separated, importable on PYTHONPATH; the same variable that loads agents) calls `register`
when imported. Every process of a run imports the plug-ins, so they all know the same families.

A family's envs module defines:

    make_spec(name: str, options: dict) -> EnvSpec
    make_batch(name: str, num_envs: int, first_env_id: int, options: dict) -> EnvBatch
    render_rgb() on the envs of its batch (`batch.envs[0].render_rgb()`, uint8 [H, W, 3]), for seed-eval's videos
                                      (optional; the option `render_rgb`, True when a video is asked for, lets an
                                      env prepare)

and its declarations, in the same module or in a config module importable without the family's own dependencies
(`Registration.config`, e.g. envs/atari_config.py), may define (the framework reaches them through this module
only, never by a family's name):

    Options                           a dataclass of its flags (fields made with `base.flag`): the learner, the
                                      actors and seed-eval get them as --<name>; the values reach `options`
    AGENT_DEFAULTS: dict[str, dict]   agent name -> its defaults on this family, over the agent's own defaults and
                                      under a preset's values (e.g. R2D2's paper Table 8 on Atari)
    SHOWS_RAW_RETURN: bool            the raw return (the score) differs from the rewards' sum: log both
    EVALUATION_OPTIONS: dict          options seed-eval plays with (over the run's)
    reference_scores(name, settings) -> (human, random)
                                      reference returns for human-normalised scores; `settings` holds the run's
                                      configuration values; ValueError, KeyError or OSError say why there are none

`options` holds the env flags (seed, action_repeat, the family's own ...); env i of the run is seeded from
`options["seed"] + first_env_id + i`, so runs are repeatable.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from seed.envs.base import EnvBatch, EnvSpec

PLUGINS_ENV = "SEED_RL_PLUGINS"



@dataclasses.dataclass(frozen=True)
class Registration:
    """Where a family lives: the module of its envs (make_spec, make_batch) and the module of its declarations
    (Options, AGENT_DEFAULTS, the reporting hooks), imported without the envs' dependencies; "" = the envs module."""

    module: str
    config: str = ""


FAMILIES: dict[str, Registration] = {
    "gym": Registration("seed.envs.gym"),
    "atari": Registration("seed.envs.atari", "seed.envs.atari_config"),
    "football": Registration("seed.envs.football", "seed.envs.football_config"),
    "minatar": Registration("seed.envs.minatar"),
    "fake": Registration("seed.envs.fake"),
}

_plugins_loaded: set[str] = set()  # the SEED_RL_PLUGINS modules this process imported, each once


class PluginError(ValueError):
    """A module SEED_RL_PLUGINS names failed to import (its own ImportError or any other error)."""


def register(name: str, registration: Registration) -> None:
    """Adds an env family (from a plug-in module): `--env=<name>:...` then uses it. A taken name is refused."""
    if not name or ":" in name:
        raise ValueError(f"env family: got name {name!r}, expected a non-empty name without ':'")
    existing = FAMILIES.get(name)
    if existing is not None and existing != registration:
        raise ValueError(f"env family {name!r}: already registered as {existing}, refused {registration}")
    FAMILIES[name] = registration


def load_plugins() -> None:
    """Imports the modules SEED_RL_PLUGINS names that this process has not imported yet; they register agents and env
    families. A module that fails is refused (PluginError, naming the variable, the module and its error) on every
    call, each call trying it again, and the modules after it are still imported."""
    failed: list[tuple[str, Exception]] = []
    for module in filter(None, (m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(","))):
        if module in _plugins_loaded:
            continue
        try:
            importlib.import_module(module)
        except Exception as error:  # noqa: BLE001 - any error of a plug-in's import is reported, with its module
            failed.append((module, error))
        else:
            _plugins_loaded.add(module)
    if failed:
        causes = "; ".join(f"module {module!r} fails on import ({type(error).__name__}: {error})"
                           for module, error in failed)
        raise PluginError(f"{PLUGINS_ENV}={os.environ.get(PLUGINS_ENV, '')!r}: {causes}; expected importable "
                          "modules that register agents or env families") from failed[0][1]


def names() -> list[str]:
    """Every registered family's name, built-in ones first."""
    load_plugins()
    return list(FAMILIES)


def split_env_name(env: str) -> tuple[str, str]:
    """'atari:Pong' -> ('atari', 'Pong'), with a clear error for a malformed value."""
    family, sep, name = env.partition(":")
    if not sep or not name or family not in names():
        raise ValueError(f"--env: got {env!r}, expected FAMILY:NAME with FAMILY one of {', '.join(FAMILIES)}")
    return family, name


def _registration(family: str) -> Registration:
    if family not in names():
        raise ValueError(f"env family: got {family!r}, expected one of {', '.join(FAMILIES)}")
    return FAMILIES[family]


def family_module(family: str) -> ModuleType:
    """The envs module of the registered family `family` (imported on first use)."""
    return importlib.import_module(_registration(family).module)


def family_config(family: str) -> ModuleType:
    """The module of the family's declarations (Options, AGENT_DEFAULTS, hooks): imported without its envs."""
    registration = _registration(family)
    return importlib.import_module(registration.config or registration.module)


def option_classes() -> dict[str, type]:
    """Family name -> its `Options` dataclass, for every registered family that has flags (built-in ones first).
    Two families declaring one flag are refused naming both."""
    found: dict[str, type] = {}
    owner: dict[str, str] = {}
    for family in names():
        options = getattr(family_config(family), "Options", None)
        if options is None:
            continue
        for field in dataclasses.fields(options):
            if field.name in owner:
                raise ValueError(f"env family {family!r}: flag --{field.name} is declared by {owner[field.name]!r} "
                                 "too; expected each family's flags to have names of their own")
            owner[field.name] = family
        found[family] = options
    return found


def make_spec(env: str, options: dict[str, Any] | None = None) -> EnvSpec:
    family, name = split_env_name(env)
    return family_module(family).make_spec(name, dict(options or {}))


def make_batch(env: str, num_envs: int, first_env_id: int, options: dict[str, Any] | None = None) -> EnvBatch:
    family, name = split_env_name(env)
    return family_module(family).make_batch(name, num_envs, first_env_id, dict(options or {}))


# ----------------------------------------------------------------------------------------------- family hooks


def agent_defaults(env: str, agent: str) -> dict[str, Any]:
    """The defaults of agent `agent` on the family of `env` (its `AGENT_DEFAULTS` entry; {} without one)."""
    family, _ = split_env_name(env)
    return dict(getattr(family_config(family), "AGENT_DEFAULTS", {}).get(agent, {}))


def shows_raw_return(env: str) -> bool:
    """True when the family's raw return (its score, e.g. Football's goals) differs from the rewards' sum."""
    family, _ = split_env_name(env)
    return bool(getattr(family_config(family), "SHOWS_RAW_RETURN", False))


def evaluation_options(env: str) -> dict[str, Any]:
    """The options seed-eval sets over the run's for the family of `env` (e.g. no threaded vector env)."""
    family, _ = split_env_name(env)
    return dict(getattr(family_config(family), "EVALUATION_OPTIONS", {}))


def reference_scores(env: str, settings: Mapping[str, Any]) -> tuple[float, float] | None:
    """(human, random) reference returns of `env` for human-normalised scores, or None for a family without them.
    Raises what the family's `reference_scores` raises when the env lacks a score (ValueError, KeyError, OSError)."""
    family, name = split_env_name(env)
    hook = getattr(family_config(family), "reference_scores", None)
    return None if hook is None else hook(name, settings)
