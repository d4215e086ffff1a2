"""The toy agent's flags: one of its own, and the framework's (batch_size, discounting, ...) through the learner."""

from __future__ import annotations

import dataclasses

from seed.config import option
from seed.contracts.agent import AgentConfig


@dataclasses.dataclass
class ToyConfig(AgentConfig):
    toy_hidden_size: int = option(16, "Toy agent: hidden units of its one-layer actor-critic.")
    toy_entropy_cost: float = option(0.01, "Toy agent: weight of the entropy bonus.")
