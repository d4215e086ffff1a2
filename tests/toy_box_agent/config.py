"""The toy Box agent's flags (`toy_box_` prefix); the replay variant adds the replay's (ReplayOptions)."""

from __future__ import annotations

import dataclasses

from seed.config import ReplayOptions, option
from seed.contracts.agent import AgentConfig


@dataclasses.dataclass
class ToyBoxConfig(AgentConfig):
    toy_box_hidden_size: int = option(16, "Toy Box agent: hidden units of its one-layer Gaussian actor-critic.")
    toy_box_nan_env_id: int = option(-1, "Toy Box agent, for refusal tests: the env id whose actions are NaN "
                                         "(-1: none).")


@dataclasses.dataclass
class ToyBoxReplayConfig(ToyBoxConfig, ReplayOptions):
    pass
