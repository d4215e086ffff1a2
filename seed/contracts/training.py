"""Data contracts between inference, the unroll store, the queue or replay, and the loss.

Step fields stored for every env step t (time index within an unroll):

  observation  [*obs_shape]  the single frame the actor sent at t
  reward       float32       reward received on arriving at t (the last reward of the old episode if done)
  done         bool          t is the first step of a new episode (forced True on an env's first contact)
  truncated    bool          the episode that ended at t was cut by the time limit (only with done)
  prev_action  int64         the action fed to the network at t (the action taken at t - 1)
  action       int64         the action taken at t
               (Box action spaces: prev_action and action are float32 [D], in the env's units)
  valid        bool          False for the zero padding in front of a fresh env's first unroll
  policy_version int64       the learner's train_steps whose parameters chose the action at t (inference)
  <agent outputs>            e.g. policy_logits [A] (V-trace) or q_values [A] (R2D2), at t

An unroll holds `burn_in + unroll_length + 1` consecutive steps of one env; the last step only provides the
bootstrap. `initial_state` is the agent state (recurrent core state, frame stack) before the first stored step.
Unrolls travel as time-major batches ([L, B, ...]) from the unroll store to the queue or replay and the loss: the
store emits every unroll one batch completes as one such batch, so no step of the path loops over unrolls.

`PublishedParameters` is the other direction: the trained parameters, as a reader beside inference pulls them.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import torch

STEP_FIELDS = ("observation", "reward", "done", "truncated", "prev_action", "action", "valid", "policy_version")


@dataclasses.dataclass
class Unroll:
    """One unroll ([L, ...] per field) or a time-major batch of them ([L, B, ...], made by `stack`).

    Attributes:
      steps: step fields (see module docstring) and agent outputs.
      initial_state: agent state before steps[0]; [...] for one unroll, [B, ...] for a batch.
      env_id: int64 [] for one unroll, [B] for a batch.
    """

    steps: dict[str, torch.Tensor]
    initial_state: dict[str, torch.Tensor]
    env_id: torch.Tensor

    def __getattr__(self, name: str) -> torch.Tensor:
        # unroll.reward reads unroll.steps["reward"]; keeps loss code close to the paper's notation.
        steps = self.__dict__.get("steps")
        if steps is not None and name in steps:
            return steps[name]
        raise AttributeError(name)

    @property
    def length(self) -> int:
        return int(self.steps["reward"].shape[0])

    @staticmethod
    def stack(unrolls: list[Unroll]) -> Unroll:
        """Time-major batch: step fields [L, B, ...], initial state [B, ...], env ids [B]."""
        steps = {key: torch.stack([u.steps[key] for u in unrolls], dim=1) for key in unrolls[0].steps}
        state = {key: torch.stack([u.initial_state[key] for u in unrolls]) for key in unrolls[0].initial_state}
        return Unroll(steps, state, torch.stack([u.env_id for u in unrolls]))

    # Time-major batches ([L, B, ...], state [B, ...], env ids [B]) as one unit, a fixed number of tensor operations
    # per call whatever B is.

    @property
    def batch_size(self) -> int:
        """B of a time-major batch (the number of unrolls in it)."""
        return int(self.env_id.shape[0])

    def columns(self, index: slice | torch.Tensor) -> Unroll:
        """The unrolls `index` (a slice, or int64 positions [n]) of a time-major batch, as a batch (a view for a
        slice, a copy for positions)."""
        return Unroll({k: v[:, index] for k, v in self.steps.items()},
                      {k: v[index] for k, v in self.initial_state.items()}, self.env_id[index])

    @staticmethod
    def concat(batches: list[Unroll]) -> Unroll:
        """Time-major batches joined along B, in order: a new contiguous batch (one copy per field)."""
        first = batches[0]
        return Unroll({k: torch.cat([b.steps[k] for b in batches], dim=1) for k in first.steps},
                      {k: torch.cat([b.initial_state[k] for b in batches]) for k in first.initial_state},
                      torch.cat([b.env_id for b in batches]))

    def unbind(self) -> list[Unroll]:
        """The single unrolls of a time-major batch (views)."""
        return [Unroll({k: v[:, i] for k, v in self.steps.items()}, {k: v[i] for k, v in self.initial_state.items()},
                       self.env_id[i]) for i in range(self.batch_size)]

    def map(self, fn) -> Unroll:
        return Unroll({k: fn(v) for k, v in self.steps.items()},
                      {k: fn(v) for k, v in self.initial_state.items()}, fn(self.env_id))

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Unroll:
        return self.map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> Unroll:
        return self.map(lambda t: t.pin_memory())


@dataclasses.dataclass
class TrainingBatch:
    """What the training loop hands to `agent.loss`.

    Attributes:
      unrolls: time-major batch on the training device ([L, B, ...]).
      importance_weights: float32 [B] (prioritized replay), or None (FIFO queue).
      replay_indices: the replay slots of the sequences, for the priority update, or None.
      replay_generations: the slots' generations when sampled (the priority update skips slots written
        since), or None.
    """

    unrolls: Unroll
    importance_weights: torch.Tensor | None = None
    replay_indices: object | None = None
    replay_generations: object | None = None


@dataclasses.dataclass
class LossOutput:
    """`agent.loss` result: the scalar to minimise, metrics to log, and new priorities [B] (replay only)."""

    loss: torch.Tensor
    metrics: dict[str, float]
    priorities: torch.Tensor | None = None


class PublishedParameters(Protocol):
    """Where the learner publishes its trained parameters, as a reader beside inference sees them (Priority
    Refresh, seed/experience/priority_refresh.py). seed/inference/parameter_publisher.py's `ParameterPublisher`
    implements it; the reader depends on this contract, not on the inference room. A version is the learner's
    train_steps when the parameters were published."""

    @property
    def published(self) -> int:
        """The version of the newest published parameters."""

    def read(self, targets: dict[str, torch.Tensor], newer_than: int) -> int:
        """Copies the newest published parameters into `targets` (a state dict of the same names, any device) if
        their version is above `newer_than`; returns the version `targets` now hold. Complete on return."""
