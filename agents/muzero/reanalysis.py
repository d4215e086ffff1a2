"""EfficientZero's reanalysis (`--reanalyse_ratio`): fresher policy targets for a training batch.

A step's policy target is the search policy stored when it was acted, by a network that may be thousands of
updates old. Before an update, the first `round(reanalyse_ratio x B)` sequences of the batch (the replay samples
them independently, so the first columns are a random subset) get new policy targets: a search of every stored
position that a K-step unroll reads a policy target from (positions 0 .. unroll_length + K - 1) with the target
network, with the training envs' root noise (as EfficientZero's reanalysis: pUCT's Dirichlet noise; a Gumbel
search adds none, its improved policy is built from the network's own logits). Value targets need no
pass here: the loss bootstraps them from the target network at every update (agents/muzero/losses.py).

Where it runs: inside the update (seed/training/update.py), so in the training process by default, or on the learner's
training thread with --notraining_process; never on the inference thread. With --training_devices each rank
reanalyses the sequences of its own share. With --reanalyse_workers=N it runs instead in N processes beside the
training process (seed/training/batch_workers.py, the agent's `prepare_batch`), batch k + 1 while batch k trains,
with the target network they were last sent (at each target update); the trainer's update logs the staleness at
training time (batch_workers/staleness_updates) and its wait for a batch (training_process/batch_wait_ms).

Staleness (SpeedyZero's "reanalyse staleness"): updates between the network that reanalysed a batch and the
network the batch trains: here the target network's age, train_steps minus the update it was copied at
(0 .. target_update_interval).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from seed.contracts.training import TrainingBatch, Unroll


def reanalysed_columns(batch_size: int, ratio: float) -> int:
    """How many of a batch's B sequences are reanalysed: round(ratio x B), at least 1 when ratio > 0."""
    if ratio <= 0:
        return 0
    return min(batch_size, max(1, round(ratio * batch_size)))


# (network, stacked observations [N, S, *frame], evaluate [N] bool) -> the search's SearchOutput (search/types.py)
SearchFunction = Callable[[nn.Module, torch.Tensor, torch.Tensor], Any]


@torch.no_grad()
def reanalyse_batch(batch: TrainingBatch, train_steps: int, *, config: Any,
                    stacked_observations: Callable[[Unroll], torch.Tensor], search: SearchFunction,
                    network: nn.Module, network_version: int) -> tuple[TrainingBatch, dict[str, float]]:
    """The batch with the policy targets (`search_policy` [L, B, A]) and root values (`root_value` [L, B]) of its
    first reanalysed sequences recomputed by `search` with `network` (the target network, of parameter version
    `network_version`), as the training envs search (root noise, evaluate False); the tensors of `batch` are not
    written (the batch may live in a shared-memory slot). config: reanalyse_ratio, unroll_length, unroll_steps;
    stacked_observations: sequences [L, B] -> the networks' stacked observations [L, B, S, *frame].

    Returns the new batch and metrics: reanalysis/ms (wall time of the pass), reanalysis/searches (roots searched),
    reanalysis/staleness_updates (the target network's age in updates), reanalysis/stored_policy_age_updates (mean
    age, in updates, of the replaced targets' acting network) and reanalysis/policy_change (mean total-variation
    distance between the stored and the new policy targets of valid positions).
    """
    unrolls = batch.unrolls
    length, batch_size = unrolls.reward.shape
    columns = reanalysed_columns(batch_size, config.reanalyse_ratio)
    if columns == 0:
        return batch, {}
    start = time.perf_counter()
    positions = min(length, config.unroll_length + config.unroll_steps)
    stacked = stacked_observations(unrolls)[:positions, :columns]  # [P, C, S, *frame]
    roots = positions * columns
    training_rows = torch.zeros(roots, dtype=torch.bool, device=stacked.device)  # root noise, as when acting
    out = search(network, stacked.flatten(0, 1), training_rows)
    new_policy = out.action_weights.float().view(positions, columns, -1)

    stored_policy = unrolls.search_policy
    valid = unrolls.valid[:positions, :columns]
    count = valid.sum().clamp(min=1)
    change = 0.5 * (new_policy - stored_policy[:positions, :columns].float()).abs().sum(-1)
    age = (train_steps - unrolls.policy_version[:positions, :columns]).float()

    if new_policy.is_cuda:  # reanalysis/ms is the pass's time, not its launch's (a graph replay returns at once)
        torch.cuda.synchronize(new_policy.device)
    steps = dict(unrolls.steps)
    steps["search_policy"] = stored_policy.clone()
    steps["search_policy"][:positions, :columns] = new_policy.to(stored_policy.dtype)
    steps["root_value"] = unrolls.root_value.clone()
    steps["root_value"][:positions, :columns] = out.root_value.view(positions, columns).to(unrolls.root_value.dtype)
    reanalysed = TrainingBatch(Unroll(steps, unrolls.initial_state, unrolls.env_id), batch.importance_weights,
                               batch.replay_indices, batch.replay_generations)
    metrics = {
        "reanalysis/ms": (time.perf_counter() - start) * 1e3,
        "reanalysis/searches": float(roots),
        "reanalysis/staleness_updates": float(train_steps - network_version),
        "reanalysis/stored_policy_age_updates": float((age * valid).sum() / count),
        "reanalysis/policy_change": float((change * valid).sum() / count),
    }
    return reanalysed, metrics
