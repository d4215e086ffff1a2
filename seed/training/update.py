"""The optimizer and one learner update on one batch: what the training thread (or --training_process) runs.

Both places that train call `train_on_batch`, so a step means the same thing wherever it runs: the policy-lag
check, MuZero's reanalysis (--reanalyse_ratio), the agent's loss (or PPO's own epochs of minibatches), gradient
clipping, the optimizer step and the values logged for it.
"""

from __future__ import annotations

import dataclasses

import torch

from seed.config import LearnerConfig
from seed.contracts.agent import Agent, UpdateStep
from seed.contracts.training import TrainingBatch, Unroll
from seed.runtime.cuda_graphs import graph_use
from seed.training.data_parallel import Shard, synchronise_batch_norm
from seed.training.optimizer_stats import adam_step_fraction

OPTIMIZER_STATS_EVERY = 50  # train steps between samples of optimizer/adam_step_fraction


@dataclasses.dataclass
class StepResult:
    """What one call of `train_on_batch` did.

    Attributes:
      trained: False if the batch was dropped (--max_policy_lag) and the network is unchanged.
      values: metrics of the update (losses, gradient_norm, policy_lag_updates, ...); empty if dropped.
      priorities: float [B] new replay priorities (R2D2), else None.
    """

    trained: bool
    values: dict[str, float]
    priorities: torch.Tensor | None = None


def train_on_batch(agent: Agent, optimizer: torch.optim.Optimizer, batch: TrainingBatch, config: LearnerConfig,
                   train_steps: int, shard: Shard | None = None) -> StepResult:
    """One update of `agent.network` on `batch`; `train_steps`: updates made before this one.

    With `shard` (--training_devices, seed/training/data_parallel.py) every rank is given the whole batch, trains on its
    share of the columns and averages the gradients with the other ranks before the clip; the policy-lag check
    is the whole batch's, and the priorities (R2D2) are the whole batch's, gathered in batch order."""
    lag = policy_lag(batch.unrolls, train_steps)
    if config.max_policy_lag and shard is not None:  # every rank drops or trains alike, once all read the slot
        lag = shard.agreed_lag(lag)
    if config.max_policy_lag and lag > config.max_policy_lag:
        return StepResult(False, {})
    if shard is not None:  # batch norm over every rank's share (a no-op after the first update)
        synchronise_batch_norm(agent.network)
    with graph_use():  # on a GPU: no random draw or graph replay while another thread captures a graph
        output = agent.update(batch, optimizer, UpdateStep(train_steps, config.grad_clip_norm, shard))
    values, priorities = output.values, output.priorities
    values["policy_lag_updates"] = lag
    if train_steps % OPTIMIZER_STATS_EVERY == 0:  # a pass over every weight's state: sample it
        fraction = adam_step_fraction(optimizer)
        if fraction is not None:
            values["optimizer/adam_step_fraction"] = fraction
    return StepResult(True, values, priorities)


def policy_lag(unrolls: Unroll, train_steps: int) -> int:
    """Updates between the oldest parameters that chose a trained action of the batch (step field
    `policy_version`, steps [:-1] that are valid) and the parameters about to be trained (`train_steps`)."""
    if "policy_version" not in unrolls.steps:  # a replay restored from before the field existed
        return 0
    versions = unrolls.policy_version[:-1]
    valid = unrolls.valid[:-1]
    if not bool(valid.any()):
        return 0
    return train_steps - int(versions[valid].min())
