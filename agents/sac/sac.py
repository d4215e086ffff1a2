"""Soft Actor-Critic math (Haarnoja et al. 2018, "Soft Actor-Critic Algorithms and Applications"), time-major
[T, B]: the transitions of a stored sequence, the clipped double-Q soft target, the critic, actor and temperature
losses, sequence priorities and the Polyak update. Pure functions over tensors; agents/sac/agent.py wires them.

Step semantics (seed/contracts/training.py): the action at step t earns `reward[t + 1]`; `done[t + 1]` means the
episode ended after it (step t + 1 is then the first step of the next episode), `truncated[t + 1]` that it ended
by the time limit. A sequence of L = T + 1 stored steps holds T transitions (s_t, a_t, r_{t+1}, s_{t+1}).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn


@dataclasses.dataclass
class Transitions:
    """The T transitions of a batch of sequences [T + 1, B] (time-major; T = the sequences' length - 1).

    Attributes:
      observation: [T, B, *obs] s_t.
      action: float32 [T, B, D] a_t, in the env's units.
      reward: float32 [T, B] r_{t+1}, earned by a_t.
      next_observation: [T, B, *obs] s_{t+1}.
      terminal: bool [T, B] the episode ended at t + 1 in a terminal state: no bootstrap.
      trained: bool [T, B] the transition has a critic target: s_t is real (not padding) and s_{t+1} follows it
        in the same episode or ends it in a terminal state. A time-limit end is not trained: the first
        observation of the next episode stands at t + 1, the old episode's last one was never sent.
      state_valid: bool [T, B] s_t is real: the actor and temperature losses use every such state.
    """

    observation: torch.Tensor
    action: torch.Tensor
    reward: torch.Tensor
    next_observation: torch.Tensor
    terminal: torch.Tensor
    trained: torch.Tensor
    state_valid: torch.Tensor


def transitions(steps: dict[str, torch.Tensor]) -> Transitions:
    """The transitions of sequences whose step fields (seed/contracts/training.py) are [T + 1, B, ...]."""
    done, truncated = steps["done"][1:], steps["truncated"][1:]
    state_valid = steps["valid"][:-1] & steps["valid"][1:]
    return Transitions(
        observation=steps["observation"][:-1], action=steps["action"][:-1], reward=steps["reward"][1:],
        next_observation=steps["observation"][1:], terminal=done & ~truncated,
        trained=state_valid & ~(done & truncated), state_valid=state_valid)


def soft_targets(reward: torch.Tensor, terminal: torch.Tensor, next_q1: torch.Tensor, next_q2: torch.Tensor,
                 next_log_prob: torch.Tensor, alpha: torch.Tensor | float, discount: float) -> torch.Tensor:
    """The clipped double-Q soft target [T, B] (paper eq. 3 with the twin critics of its section 5):

        y_t = r_{t+1} + discount (1 - terminal_{t+1}) (min(Q1'(s', a'), Q2'(s', a')) - alpha log pi(a'|s'))

    with s' = s_{t+1}, a' ~ pi(.|s') sampled from the current policy and Q1', Q2' the target critics. All inputs
    [T, B]."""
    soft_value = torch.minimum(next_q1, next_q2) - alpha * next_log_prob
    return reward + discount * (~terminal).to(reward.dtype) * soft_value


def critic_loss(q1: torch.Tensor, q2: torch.Tensor, targets: torch.Tensor, trained: torch.Tensor,
                weights: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The twin critics' loss: mean over trained transitions of w_b ((Q1 - y)^2 + (Q2 - y)^2).

    Args:
      q1, q2: [T, B] Q1(s_t, a_t), Q2(s_t, a_t) of the online critics.
      targets: [T, B] y_t (no gradient).
      trained: bool [T, B] the transitions with a target.
      weights: float [B] importance weights (prioritized replay), or None (all 1).
    Returns:
      (loss, Q1's mean squared error, Q2's), scalars; with weights 1 the loss is CleanRL's qf1_loss + qf2_loss.
    """
    mask = trained.to(q1.dtype)
    if weights is not None:
        mask = mask * weights.to(q1.dtype).unsqueeze(0)
    count = trained.sum().clamp(min=1)
    q1_loss = ((q1 - targets).pow(2) * mask).sum() / count
    q2_loss = ((q2 - targets).pow(2) * mask).sum() / count
    return q1_loss + q2_loss, q1_loss, q2_loss


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` [T, B] over the True entries of `mask` [T, B] (0 if none)."""
    return (values * mask.to(values.dtype)).sum() / mask.sum().clamp(min=1)


def actor_loss(log_prob: torch.Tensor, q1: torch.Tensor, q2: torch.Tensor, alpha: torch.Tensor | float,
               state_valid: torch.Tensor) -> torch.Tensor:
    """The policy's loss (paper eq. 7, reparameterised): mean over real states of
    alpha log pi(a|s_t) - min(Q1(s_t, a), Q2(s_t, a)) with a ~ pi(.|s_t); inputs [T, B], alpha held fixed."""
    return masked_mean(alpha * log_prob - torch.minimum(q1, q2), state_valid)


def temperature_loss(log_alpha: torch.Tensor, log_prob: torch.Tensor, target_entropy: float,
                     state_valid: torch.Tensor) -> torch.Tensor:
    """The temperature's loss (paper eq. 18, as CleanRL writes it): mean over real states of
    -alpha (log pi(a|s_t) + target_entropy), alpha = exp(log_alpha), log_prob [T, B] without gradient.

    Its gradient in log_alpha is alpha (entropy - target_entropy) on average: alpha falls while the policy's
    entropy (-log pi) is above the target and rises while it is below."""
    return masked_mean(-log_alpha.exp() * (log_prob.detach() + target_entropy), state_valid)


def sequence_priorities(td1: torch.Tensor, td2: torch.Tensor, trained: torch.Tensor, eta: float) -> torch.Tensor:
    """Priorities [B]: eta max_t |delta_t| + (1 - eta) mean_t |delta_t| over the trained transitions, with
    |delta_t| = (|Q1 - y| + |Q2 - y|) / 2 the twin critics' mean absolute TD error (R2D2's mix over a sequence;
    for sequences of one transition, that transition's |delta|)."""
    abs_td = 0.5 * (td1.abs() + td2.abs()) * trained.to(td1.dtype)
    count = trained.sum(0).clamp(min=1)
    return eta * abs_td.max(0).values + (1.0 - eta) * abs_td.sum(0) / count


@torch.no_grad()
def polyak_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    """target <- tau online + (1 - tau) target, for every parameter (buffers copied as they are)."""
    targets = [p for p in target.parameters()]
    sources = [p for p in online.parameters()]
    if len(targets) != len(sources):
        raise ValueError(f"polyak_update: got {len(sources)} online parameters, expected {len(targets)} "
                         "(the target's)")
    torch._foreach_lerp_(targets, sources, tau)
    for t, s in zip(target.buffers(), online.buffers(), strict=True):
        t.copy_(s)
