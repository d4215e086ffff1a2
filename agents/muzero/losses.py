"""EfficientZero's training loss on a batch of replay sequences, time-major.

For every start s < U = unroll_length of every sequence b, the model unrolls K = unroll_steps steps with the
stored actions (the representation of the start's stacked observation, then dynamics), and each unroll step k
is trained against:

  policy       cross-entropy with the search policy stored at s + k (while s + k is in the start's episode);
  value        cross-entropy of the value support with the n-step target z[s + k]: rewards, then the TARGET
               network's value n steps on (n shortened for older data: `td_horizons`); 0 in the absorbing state
               after a termination;
  value prefix (k >= 1) cross-entropy with the sum of the rewards since the last LSTM reset (every
               value_prefix_horizon steps);
  consistency  (k >= 1) negative cosine similarity between predictor(projection(latent after k dynamics steps))
               and projection(representation(observation at s + k)), the latter without gradient (SimSiam).

Weights: policy_cost, value_cost, reward_cost, consistency_cost; the terms of k >= 1 are divided by K and the
gradient into each dynamics step is halved (MuZero); each sequence's terms are weighted by its importance weight.
The new priority of a sequence is eta max_s |v_s - z_s| + (1 - eta) mean_s over its starts (v: the online
network's value at the start), like R2D2's sequence priorities.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from seed.agents.muzero.targets import (
    gather_unroll,
    n_step_value_targets,
    scalar_to_support,
    sequence_priorities,
    support_to_scalar,
    td_horizons,
    unroll_masks,
    value_prefix_targets,
)
from seed.config import LearnerConfig
from seed.contracts.training import LossOutput, TrainingBatch, Unroll

PRIORITY_EPSILON = 1e-6  # no sequence's priority is 0 (it would never be sampled again)


def predicted_values(network: torch.nn.Module, stacked: torch.Tensor, length: int, batch: int
                     ) -> torch.Tensor:
    """`network`'s predicted value [L, B] of every stored position, from stacked observations [L * B, S, *frame]
    (with the target network: what the n-step value targets bootstrap with)."""
    _, _, value_logits = network.initial_inference(stacked)
    return support_to_scalar(value_logits).view(length, batch)


def start_priorities(start_value: torch.Tensor, targets: torch.Tensor, start_mask: torch.Tensor, eta: float
                     ) -> torch.Tensor:
    """A sequence's priority from its starts' values and targets [U, B] where `start_mask` [U, B] is set:
    eta max |v - z| + (1 - eta) mean |v - z| (`sequence_priorities`), never 0. Returns [B]."""
    return sequence_priorities(start_value - targets, start_mask, eta) + PRIORITY_EPSILON


def trained_starts(unrolls: Unroll, unroll_length: int) -> int:
    """How many starts the loss of sequences [L, B] averages over: the valid steps among each sequence's first
    `unroll_length` (the padding in front of a fresh env's first sequence is not trained)."""
    return int(unrolls.valid[:unroll_length].sum())


def clipped_rewards(unrolls: Unroll, config: LearnerConfig) -> torch.Tensor:
    """Rewards [L, B] as the loss sees them: clipped to [-max_abs_reward, max_abs_reward] when that is set."""
    reward = unrolls.reward.float()
    if config.max_abs_reward > 0:
        reward = reward.clamp(-config.max_abs_reward, config.max_abs_reward)
    return reward


def value_targets(unrolls: Unroll, bootstrap: torch.Tensor, config: LearnerConfig, train_steps: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """n-step value targets [L, B] and their mask of every stored step, bootstrapped with `bootstrap` [L, B], each
    step's horizon shortened by its age (`td_horizons`)."""
    horizon = td_horizons(unrolls.policy_version, train_steps, config.td_steps, config.td_age_updates)
    return n_step_value_targets(clipped_rewards(unrolls, config), unrolls.done, unrolls.truncated, bootstrap,
                                horizon, config.discounting)


def _cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """-sum target log softmax(logits) over the last axis: [..., D] x [..., D] -> [...]."""
    return -(target * F.log_softmax(logits, dim=-1)).sum(-1)


def scale_gradient(x: torch.Tensor, scale: float) -> torch.Tensor:
    """x in the forward pass; its gradient times `scale` in the backward pass (MuZero's dynamics scaling)."""
    return x * scale + x.detach() * (1.0 - scale)


def unroll_targets(unrolls: Unroll, bootstrap: torch.Tensor, config: LearnerConfig, train_steps: int
                   ) -> dict[str, torch.Tensor]:
    """The targets of every unroll step k of every start s < unroll_length of sequences [L, B], each [K + 1, U, B]
    (policy: [K + 1, U, B, A]), from the bootstrap values [L, B] (the target network's), with their masks:

      value, value_mask    z[s + k] while s + k is in the start's episode and has a target; 0 (a known target)
                           in the absorbing state after a termination inside the unroll
      prefix, reward_mask  the value prefix: rewards of the edges since the last LSTM reset, the absorbing
                           state's edges adding 0 (reward_mask: unroll_masks' "reward", False at k = 0)
      policy, alive        the search policy stored at s + k while in the start's episode
      start                the start is a trained step (not padding)
    """
    starts, k_steps = config.unroll_length, config.unroll_steps
    z, z_mask = value_targets(unrolls, bootstrap, config, train_steps)
    masks = unroll_masks(unrolls.done, unrolls.truncated, unrolls.valid, starts, k_steps)
    alive, absorbed = masks["alive"], masks["absorbed"]
    edge_rewards = gather_unroll(clipped_rewards(unrolls, config), starts, k_steps) * masks["edge_alive"]
    return {
        "value": torch.where(absorbed, torch.zeros_like(z[:1]), gather_unroll(z, starts, k_steps)),
        "value_mask": (alive & gather_unroll(z_mask, starts, k_steps)) | absorbed,
        "prefix": value_prefix_targets(edge_rewards, config.value_prefix_horizon),
        "reward_mask": masks["reward"],
        "policy": gather_unroll(unrolls.search_policy.float(), starts, k_steps),
        "alive": alive,
        "start": masks["start"],
        "z": z,
        "z_mask": z_mask,
    }


def unroll_model(network: nn.Module, latent: torch.Tensor, actions: torch.Tensor, prefix_horizon: int
                 ) -> dict[str, torch.Tensor]:
    """The model unrolled K steps from the start latents [N, ...] with the actions [K + 1, U, B] of
    `gather_unroll` (N = U B; row k - 1 is taken into step k, row K is unused): each step's dynamics (its
    gradient halved into the step before, MuZero's scaling), value prefix (the LSTM reset after every
    `prefix_horizon` steps), prediction and consistency projection, stacked over the steps:

      policy [K + 1, N, A], value [K + 1, N, 2 Sv + 1]  (k = 0 is the start's own prediction)
      prefix [K, N, 2 Sr + 1], projection [K, N, P]       (steps k = 1..K)

    One call of each network part per step: every part has batch norm, whose batch statistics are the step's
    (stacking the steps into one call would change them and what is trained)."""
    k_steps = actions.shape[0] - 1
    policy, value = network.predict(latent)
    policies, values, prefixes, projections = [policy], [value], [], []
    lstm = network.initial_state_lstm(latent.shape[0], latent.device)
    for k in range(1, k_steps + 1):
        latent = scale_gradient(latent, 0.5)
        latent, prefix_logits, lstm, policy, value = network.recurrent_inference(latent, actions[k - 1].flatten(),
                                                                                 lstm)
        if k % prefix_horizon == 0:
            lstm = (torch.zeros_like(lstm[0]), torch.zeros_like(lstm[1]))
        policies.append(policy)
        values.append(value)
        prefixes.append(prefix_logits)
        projections.append(network.project(latent, with_predictor=True))
    return {"policy": torch.stack(policies), "value": torch.stack(values), "prefix": torch.stack(prefixes),
            "projection": torch.stack(projections)}


def _with_k0(values: torch.Tensor, shape: tuple[int, int, int]) -> torch.Tensor:
    """Terms of the steps k = 1..K [K, U * B] -> [K + 1, U, B] with zeros at k = 0 (a term k = 0 does not have)."""
    return torch.cat([values.new_zeros(1, values.shape[1]), values]).view(shape)


def muzero_loss(network: nn.Module, target_network: nn.Module, batch: TrainingBatch, config: LearnerConfig,
                train_steps: int, stacked_observations: Callable[[Unroll], torch.Tensor]) -> LossOutput:
    """The loss of `network` on `batch` (see the module docstring), value targets bootstrapped with
    `target_network` at the horizons of parameter version `train_steps`; `stacked_observations` maps sequences
    [L, B] to the stacked observations [L, B, S, *frame] the networks read (the agent's frame stacking)."""
    c = config
    unrolls = batch.unrolls
    length, batch_size = unrolls.reward.shape
    starts, k_steps = c.unroll_length, c.unroll_steps
    if length < starts + k_steps + c.td_steps:
        raise ValueError(f"training batch: got sequences of {length} steps, expected >= unroll_length + unroll_steps"
                         f" + td_steps = {starts + k_steps + c.td_steps}")
    stacked = stacked_observations(unrolls).flatten(0, 1)  # [L * B, S, *frame]

    # Every stored position through the representation once: the starts' latents (with gradient) and the
    # consistency targets (their projections, detached).
    latent_all = network.represent(stacked)
    latent_shape = latent_all.shape[1:]
    with torch.no_grad():
        bootstrap = predicted_values(target_network, stacked, length, batch_size)
        targets = unroll_targets(unrolls, bootstrap, c, train_steps)
        z, z_mask, alive = targets["z"], targets["z_mask"], targets["alive"]
        value_target, value_mask = targets["value"], targets["value_mask"]
        prefix_target, policy_target = targets["prefix"], targets["policy"]
        projection_target = network.project(latent_all.detach(), with_predictor=False).detach()
        projection_target = gather_unroll(projection_target.view(length, batch_size, -1), starts, k_steps)
        actions = gather_unroll(unrolls.action, starts, k_steps)  # [K + 1, U, B]

    latent = latent_all.view(length, batch_size, *latent_shape)[:starts].flatten(0, 1)  # [U * B, ...]
    outputs = unroll_model(network, latent, actions, c.value_prefix_horizon)
    start_value = support_to_scalar(outputs["value"][0].detach()).view(starts, batch_size)

    # Every term of every unroll step at once, [K + 1, U, B] (the value prefix and consistency terms are 0 at
    # k = 0: they have none there).
    unrolled = (k_steps + 1, starts, batch_size)
    value_support = scalar_to_support(value_target, c.value_support_size)
    prefix_support = scalar_to_support(prefix_target, c.reward_support_size)
    similarity = F.cosine_similarity(outputs["projection"], projection_target[1:].flatten(1, 2), dim=-1)
    terms = {
        "policy": (_cross_entropy(outputs["policy"], policy_target.flatten(1, 2)).view(unrolled), alive),
        "value": (_cross_entropy(outputs["value"], value_support.flatten(1, 2)).view(unrolled), value_mask),
        "reward": (_with_k0(_cross_entropy(outputs["prefix"], prefix_support[1:].flatten(1, 2)), unrolled),
                   targets["reward_mask"]),
        "consistency": (_with_k0(-similarity, unrolled), alive),
    }

    costs = {"policy": c.policy_cost, "value": c.value_cost, "reward": c.reward_cost,
             "consistency": c.consistency_cost}
    weights = batch.importance_weights if batch.importance_weights is not None else torch.ones(batch_size)
    weights = weights.to(latent.device).float()
    # k = 0 counts fully, each later unroll step 1 / K (MuZero); each sequence by its importance weight.
    step_weights = torch.full((k_steps + 1, 1, 1), 1.0 / k_steps, device=latent.device)
    step_weights[0] = 1.0
    positions = max(1, trained_starts(unrolls, starts))  # = targets["start"][0].sum()
    total = torch.zeros((), device=latent.device)
    metrics: dict[str, Any] = {}
    for name, (values, mask) in terms.items():
        term = (values * mask.to(values.dtype) * step_weights * weights).sum() / positions
        total = total + costs[name] * term
        metrics[f"losses/{name}"] = float(term.detach())
    metrics["losses/total"] = float(total.detach())

    start_mask = targets["start"][0] & z_mask[:starts]
    errors = start_value - z[:starts]
    priorities = start_priorities(start_value, z[:starts], start_mask, c.priority_eta)
    count = start_mask.sum().clamp(min=1)
    metrics.update({
        "value/start_mean": float((start_value * start_mask).sum() / count),
        "value/target_mean": float((z[:starts] * start_mask).sum() / count),
        "value/abs_error_mean": float((errors.abs() * start_mask).sum() / count),
        "search/root_value_mean": float((unrolls.root_value[:starts].float() * start_mask).sum() / count),
        "updated_priorities_mean": float(priorities.mean()),
    })
    return LossOutput(total, metrics, priorities.detach())
