"""The optimizer and one learner update on one batch: what the training thread (or --training_process) runs.

Both places that train call `train_on_batch`, so a step means the same thing wherever it runs: the policy-lag
check, MuZero's reanalysis (--reanalyse_ratio), the agent's loss (or PPO's own epochs of minibatches), gradient
clipping, the optimizer step and the values logged for it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from seed.config import LearnerConfig
from seed.data_parallel import Shard
from seed.optimizer_stats import adam_step_fraction
from seed.optimizers import clipped_lars
from seed.unroll import TrainingBatch, Unroll

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


def make_optimizer(agent: Any, config: LearnerConfig) -> torch.optim.Optimizer:
    """The learner's optimizer (the same in the learner process and the training process): --optimizer=adam
    (the default) or clipped_lars (seed/optimizers.py), over `agent.network`'s parameters."""
    if config.optimizer == "clipped_lars":
        return clipped_lars(agent.network, lr=config.learning_rate, eta=config.lars_eta,
                            weight_decay=config.weight_decay, momentum=config.momentum,
                            warmup_steps=config.lars_warmup_steps, bn_bias_eta=config.lars_bn_bias_eta)
    if config.optimizer != "adam":
        raise ValueError(f"optimizer: got {config.optimizer!r}, expected adam or clipped_lars")
    # foreach: one multi-tensor update instead of a Python loop over parameters (CPU defaults to the loop).
    return torch.optim.Adam(agent.network.parameters(), lr=config.learning_rate, eps=config.adam_epsilon,
                            betas=(config.adam_beta1, 0.999), foreach=True)


def train_on_batch(agent: Any, optimizer: torch.optim.Optimizer, batch: TrainingBatch, config: LearnerConfig,
                   train_steps: int, shard: Shard | None = None) -> StepResult:
    """One update of `agent.network` on `batch`; `train_steps`: updates made before this one.

    With `shard` (--training_devices, seed/data_parallel.py) every rank is given the whole batch, trains on its
    share of the columns and averages the gradients with the other ranks before the clip; the policy-lag check
    is the whole batch's, and the priorities (R2D2) are the whole batch's, gathered in batch order."""
    lag = policy_lag(batch.unrolls, train_steps)
    if config.max_policy_lag and shard is not None:  # every rank drops or trains alike, once all read the slot
        lag = shard.agreed_lag(lag)
    if config.max_policy_lag and lag > config.max_policy_lag:
        return StepResult(False, {})
    priorities = None
    if hasattr(agent, "train_rollout"):  # PPO: its own epochs x minibatches of optimizer steps
        values = agent.train_rollout(batch, optimizer, config.grad_clip_norm, train_steps, shard)
    else:
        share, loss_scale = (batch, 1.0) if shard is None else shard.batch(batch)
        reanalysis: dict[str, float] = {}
        if config.reanalyse_ratio > 0:  # MuZero: fresher policy targets before the loss (agents/muzero/reanalysis.py)
            share, reanalysis = agent.reanalyse_batch(share, train_steps)
        out = agent.loss(share)
        optimizer.zero_grad(set_to_none=True)
        (out.loss if shard is None else out.loss * loss_scale).backward()
        if shard is not None:
            shard.all_reduce_gradients(list(agent.network.parameters()))
        values = dict(out.metrics, **reanalysis)
        if config.grad_clip_norm > 0:
            values["gradient_norm"] = float(torch.nn.utils.clip_grad_norm_(agent.network.parameters(),
                                                                           config.grad_clip_norm))
        optimizer.step()
        priorities = out.priorities
        if shard is not None and priorities is not None:
            priorities = shard.gather_columns(priorities, int(batch.unrolls.env_id.shape[0]))
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
