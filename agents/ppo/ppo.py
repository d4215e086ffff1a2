"""PPO math (Schulman et al. 2017, "Proximal Policy Optimization Algorithms"): generalized advantage
estimation and the clipped surrogate objective. Pure functions on time-major tensors ([T, B]).

GAE (Schulman et al. 2016), by the backward recursion with gamma_t = `discounts[t]` (0 where an episode ends
after step t):

    delta_t = r_t + gamma_t V(x_{t+1}) - V(x_t)
    A_t     = delta_t + gamma_t lambda A_{t+1},          A_T = 0, V(x_T) = bootstrap
    R_t     = A_t + V(x_t)                               (the value target)

Clipped surrogate, with ratio_t = pi(a_t|x_t) / mu(a_t|x_t) = exp(log pi - log mu) and epsilon = `clip`:

    L_clip = -mean_t min(ratio_t A_t, clip(ratio_t, 1 - epsilon, 1 + epsilon) A_t)

Decoupled (Hilton et al. 2022, "Batch size-invariance for policy optimization"), for data that a policy mu older
than the update's starting point played (HTS's one-step-delayed acting): the ratio is taken against the
proximal policy pi_prox (the parameters at the start of this update) and each sample is weighted by
w_t = pi_prox(a_t|x_t) / mu(a_t|x_t), so that the unclipped term is still pi / mu:

    L_dec = -mean_t w_t min(rho_t A_t, clip(rho_t, 1 - epsilon, 1 + epsilon) A_t),   rho_t = pi / pi_prox
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class GaeReturns(NamedTuple):
    advantages: torch.Tensor  # [T, B] A_t
    returns: torch.Tensor  # [T, B] R_t = A_t + V(x_t), the value target


@torch.no_grad()
def gae(rewards: torch.Tensor, values: torch.Tensor, bootstrap: torch.Tensor, discounts: torch.Tensor,
        lambda_: float) -> GaeReturns:
    """Generalized advantage estimates and value targets, without gradients.

    Args:
      rewards: [T, B] r_t, received after taking a_t.
      values: [T, B] V(x_t).
      bootstrap: [B] V(x_T), the value of the state after the last step.
      discounts: [T, B] gamma_t, the discount applied to V(x_{t+1}); 0 where the episode ended after step t.
      lambda_: the GAE lambda in [0, 1] (1: Monte-Carlo returns bootstrapped at T; 0: one-step TD).
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards: got shape {list(rewards.shape)}, expected [T, B]")
    for name, tensor in (("values", values), ("discounts", discounts)):
        if tensor.shape != rewards.shape:
            raise ValueError(f"{name}: got shape {list(tensor.shape)}, expected {list(rewards.shape)} (as rewards)")
    if bootstrap.shape != rewards.shape[1:]:
        raise ValueError(f"bootstrap: got shape {list(bootstrap.shape)}, expected [{rewards.shape[1]}]")
    values_next = torch.cat([values[1:], bootstrap.unsqueeze(0)], dim=0)
    deltas = rewards + discounts * values_next - values
    advantages = torch.zeros_like(values)
    carry = torch.zeros_like(bootstrap)
    for t in reversed(range(values.shape[0])):
        carry = deltas[t] + discounts[t] * lambda_ * carry
        advantages[t] = carry
    return GaeReturns(advantages=advantages, returns=advantages + values)


def normalize(advantages: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(A - mean A) / (std A + eps) over every element (one minibatch)."""
    return (advantages - advantages.mean()) / (advantages.std(unbiased=False) + eps)


class SurrogateLoss(NamedTuple):
    loss: torch.Tensor  # [] L_clip
    clip_fraction: torch.Tensor  # [] share of samples whose ratio lies outside [1 - epsilon, 1 + epsilon]
    approx_kl: torch.Tensor  # [] mean (ratio - 1) - log ratio, an estimate of KL(mu || pi) >= 0


def clipped_surrogate_loss(log_probs: torch.Tensor, behaviour_log_probs: torch.Tensor, advantages: torch.Tensor,
                           clip: float, weights: torch.Tensor | None = None) -> SurrogateLoss:
    """PPO's clipped surrogate objective, negated to be minimised.

    Args:
      log_probs: [...] log pi(a_t|x_t) under the parameters being trained (gradients flow through it).
      behaviour_log_probs: [...] log mu(a_t|x_t) under the parameters that chose the actions; for the decoupled
        objective, log pi_prox(a_t|x_t) under the parameters at the start of the update.
      advantages: [...] A_t (already normalised if wanted; treated as constants).
      clip: epsilon, e.g. 0.2.
      weights: [...] w_t = pi_prox / mu per sample (the decoupled objective; constants), or None (all 1).
    """
    if weights is not None and weights.shape != log_probs.shape:
        raise ValueError(f"weights: got shape {list(weights.shape)}, expected {list(log_probs.shape)} (as log_probs)")
    if not (log_probs.shape == behaviour_log_probs.shape == advantages.shape):
        raise ValueError(f"log_probs, behaviour_log_probs, advantages: got shapes {list(log_probs.shape)}, "
                         f"{list(behaviour_log_probs.shape)}, {list(advantages.shape)}, expected one shape")
    log_ratio = log_probs - behaviour_log_probs.detach()
    ratio = log_ratio.exp()
    advantages = advantages.detach()
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip, 1.0 + clip) * advantages
    objective = torch.min(unclipped, clipped)
    loss = -(objective if weights is None else weights.detach() * objective).mean()
    with torch.no_grad():
        clip_fraction = ((ratio - 1.0).abs() > clip).float().mean()
        approx_kl = ((ratio - 1.0) - log_ratio).mean()
    return SurrogateLoss(loss, clip_fraction, approx_kl)
