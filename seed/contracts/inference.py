"""Data contracts of the inference path: what inference hands an agent, what the agent hands back, what
inference reports to the learner. Producers and consumers import them from here; this module imports no other
part of seed, so no two modules need to import each other for a type.

  State             the agent's per-env state: inference's state table <-> `agent.act`, unroll store
  InferenceBatch    inference (seed/inference/central.py, seed/inference/forward_pass.py) -> `agent.act`
  ActOutput         `agent.act` -> inference
  FinishedEpisodes  inference -> the learner's metrics

The contracts of the training side (Unroll, TrainingBatch, LossOutput: unroll store -> queue or replay ->
`agent.loss`) live in seed/contracts/training.py, which likewise holds nothing but those records.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

State = dict[str, torch.Tensor]
"""Per-env agent state, e.g. {"lstm_h": float32 [B, H], "lstm_c": ..., "frames": uint8 [B, S - 1, *frame]};
whatever the agent's `initial_state(n)` returns, with one row per env."""


@dataclasses.dataclass
class InferenceBatch:
    """The agent's `act` input: B env rows (on the host while inference assembles them, then on the device).

    Attributes:
      env_ids: int64 [B] (padded rows of a fixed-size batch carry the state table's scratch row id).
      observation: [B, *observation_shape], single frames as the actors sent them.
      reward: float32 [B], reward received on arriving at this step.
      done: bool [B], this step starts a new episode (reset the recurrent state and frame stack first).
      prev_action: the action taken at the previous step (0 after a reset): int64 [B] for a Discrete action
        space, float32 [B, D] in the env's units for a Box (EnvSpec.action_shape (D,)).
    """

    env_ids: torch.Tensor
    observation: torch.Tensor
    reward: torch.Tensor
    done: torch.Tensor
    prev_action: torch.Tensor

    def to(self, device: torch.device, non_blocking: bool = False) -> InferenceBatch:
        return InferenceBatch(**{field.name: getattr(self, field.name).to(device, non_blocking=non_blocking)
                                 for field in dataclasses.fields(self)})

    def __len__(self) -> int:
        return len(self.env_ids)


@dataclasses.dataclass
class ActOutput:
    """The agent's `act` result: actions, outputs to store {name: [B, ...]}, new state rows [B, ...].

    `action`: int64 [B] for a Discrete action space; float32 [B, D] in the env's units for a Box (an agent maps
    its squashed output into [action_low, action_high]; the env clips what still falls outside, and an actor
    refuses a NaN or an inf)."""

    action: torch.Tensor
    outputs: dict[str, torch.Tensor]
    state: State


@dataclasses.dataclass
class FinishedEpisodes:
    """Episodes that ended in one batch, from the learner's state table (returns as the loss sees them)."""

    env_ids: np.ndarray  # int64 [E]
    returns: np.ndarray  # float64 [E]
    lengths: np.ndarray  # int64 [E], agent steps
