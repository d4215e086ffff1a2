"""The one place that names the agents: `--agent=NAME` -> the agent's class and its configuration class.

A new agent is a folder under agents/ (its Agent subclass, its configuration dataclass, networks and loss; see
seed/contracts/agent.py) plus one line in AGENTS. An agent outside this package registers itself: a module named
in the environment variable SEED_RL_PLUGINS (comma-separated, importable on PYTHONPATH) calls `register` when
imported; every process of a run (the learner, its training process, seed-eval) imports them, so they all know
the same agents.

Each entry names two classes by "module:Class": the agent, and its configuration, which is imported without torch
(flags and --help stay fast).
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from seed import envs

PLUGINS_ENV = envs.PLUGINS_ENV


@dataclasses.dataclass(frozen=True)
class Registration:
    """Where an agent lives: "module:Class" of its Agent subclass and of its configuration dataclass."""

    agent: str
    config: str


AGENTS: dict[str, Registration] = {
    "vtrace": Registration("seed.agents.vtrace.agent:VTraceAgent", "seed.agents.vtrace.config:VTraceConfig"),
    "r2d2": Registration("seed.agents.r2d2.agent:R2D2Agent", "seed.agents.r2d2.config:R2D2Config"),
    "ppo": Registration("seed.agents.ppo.agent:PPOAgent", "seed.agents.ppo.config:PPOConfig"),
    "muzero": Registration("seed.agents.muzero.agent:MuZeroAgent", "seed.agents.muzero.config:MuZeroConfig"),
    "sac": Registration("seed.agents.sac.agent:SACAgent", "seed.agents.sac.config:SACConfig"),
}


def register(name: str, registration: Registration) -> None:
    """Adds an agent (from a plugin module; see the module docstring). A name taken by another is refused."""
    existing = AGENTS.get(name)
    if existing is not None and existing != registration:
        raise ValueError(f"agent {name!r}: already registered as {existing}, refused {registration}")
    AGENTS[name] = registration


def _load_plugins() -> None:
    # One loader for every kind of plug-in: a module may register agents and env families alike.
    envs.load_plugins()


def names() -> list[str]:
    """Every registered agent's name, built-in ones first."""
    _load_plugins()
    return list(AGENTS)


def _registration(name: str) -> Registration:
    _load_plugins()
    if name not in AGENTS:
        raise ValueError(f"--agent: got {name!r}, expected one of {', '.join(AGENTS)}")
    return AGENTS[name]


def _import(path: str) -> Any:
    module, _, qualname = path.partition(":")
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


def config_class(name: str) -> type:
    """The configuration dataclass of agent `name` (imported without its networks)."""
    return _import(_registration(name).config)


def agent_class(name: str) -> type:
    """The Agent subclass registered as `name` (seed/contracts/agent.py), checked against its registration."""
    registration = _registration(name)
    found = _import(registration.agent)
    declared = _import(registration.config)
    if found.config_class is not declared:
        raise ValueError(f"agent {name!r}: {registration.agent}.config_class is {found.config_class.__name__}, "
                         f"expected {registration.config} as registered")
    return found
