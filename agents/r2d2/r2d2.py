"""R2D2 math (Kapturowski et al. 2019), time-major [T, B]: value rescaling, n-step double-Q targets,
sequence priorities and the Ape-X epsilon schedule.
"""

from __future__ import annotations

import numpy as np
import torch


def value_rescale(x: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x."""
    return torch.sign(x) * (torch.sqrt(torch.abs(x) + 1.0) - 1.0) + eps * x


def inverse_value_rescale(x: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """h^-1(x) = sign(x) (((sqrt(1 + 4 eps (|x| + 1 + eps)) - 1) / (2 eps))^2 - 1), the exact inverse of h."""
    if eps == 0:
        return torch.sign(x) * ((torch.abs(x) + 1.0) ** 2 - 1.0)
    return torch.sign(x) * (
        ((torch.sqrt(1.0 + 4.0 * eps * (torch.abs(x) + 1.0 + eps)) - 1.0) / (2.0 * eps)) ** 2 - 1.0)


def n_step_targets(rewards: torch.Tensor, done: torch.Tensor, truncated: torch.Tensor, bootstrap: torch.Tensor,
                   n: int, discount: float) -> tuple[torch.Tensor, torch.Tensor]:
    """n-step targets for the T transitions of a segment of T + 1 steps (indices 0..T).

    Step semantics (docs/ARCHITECTURE.md): the action at step t earns `rewards[t + 1]`; `done[t + 1]` means the episode
    ended after that action (and step t + 1 is the first step of the next episode); `truncated[t + 1]` means
    it ended by the time limit.

    For transition t the target is  sum_{k=0}^{m-1} discount^k rewards[t+1+k] + discount^m bootstrap[t+m]
    with m = min(n, T - t) (the last targets fall back to shorter horizons), except:
      - terminal at t+1+k (done and not truncated): the reward at t+1+k is the last one, no bootstrap;
      - truncated at t+1+k: bootstrap instead of terminating. The final observation of the old episode is
        not sent, so the horizon ends one step early: sum_{j<k} discount^j rewards[t+1+j] +
        discount^k bootstrap[t+k]. For k = 0 that would be the transition's own state, so the
        transition gets no target (mask False).

    Args:
      rewards, done, truncated: [T + 1, B]; index 0 is unused (it belongs to the previous transition).
      bootstrap: [T + 1, B], the value of each step's state (double-Q: target net at the online argmax).
    Returns:
      targets [T, B] and a bool mask [T, B] of transitions that have a target.
    """
    steps, batch = rewards.shape[0] - 1, rewards.shape[1]
    device = rewards.device
    t = torch.arange(steps, device=device).unsqueeze(1).expand(steps, batch)
    targets = torch.zeros(steps, batch, dtype=bootstrap.dtype, device=device)
    scale = torch.ones_like(targets)  # discount^k for the next reward
    open_ = torch.ones(steps, batch, dtype=torch.bool, device=device)  # horizon not yet closed
    mask = torch.ones_like(open_)
    column = torch.arange(batch, device=device).unsqueeze(0).expand(steps, batch)
    for k in range(n):
        i = t + 1 + k  # the step whose reward comes next
        inside = i <= steps
        ic = i.clamp(max=steps)
        reward, is_done, is_trunc = rewards[ic, column], done[ic, column], truncated[ic, column]
        active = open_ & inside
        cut = active & is_done & is_trunc  # truncation: bootstrap from the step before, without its reward
        targets = targets + torch.where(cut, scale * bootstrap[ic - 1, column], torch.zeros_like(targets))
        if k == 0:
            mask = ~cut
        add = active & ~cut
        targets = targets + torch.where(add, scale * reward, torch.zeros_like(targets))
        scale = torch.where(add, scale * discount, scale)
        terminal = add & is_done
        horizon_end = add & ~is_done & ((k == n - 1) | (i == steps))
        targets = targets + torch.where(horizon_end, scale * bootstrap[ic, column], torch.zeros_like(targets))
        open_ = open_ & ~cut & ~terminal & ~horizon_end & inside
    return targets, mask


def sequence_priorities(td_errors: torch.Tensor, mask: torch.Tensor, eta: float = 0.9) -> torch.Tensor:
    """p = eta max_t |delta_t| + (1 - eta) mean_t |delta_t| over the masked steps of each sequence: [T, B] -> [B]."""
    abs_td = td_errors.abs() * mask
    count = mask.sum(0).clamp(min=1)
    return eta * abs_td.max(0).values + (1.0 - eta) * abs_td.sum(0) / count


def epsilon_schedule(num_envs: int, num_eval_envs: int, base: float = 0.4, alpha: float = 7.0,
                     eval_epsilon: float = 1e-3) -> np.ndarray:
    """Per env id: training env i of N acts with base^(1 + alpha i / (N - 1)).

    The last `num_eval_envs` env ids get `eval_epsilon`.
    """
    num_train = num_envs - num_eval_envs
    if num_train < 1:
        raise ValueError(f"num_eval_envs: got {num_eval_envs}, expected < the number of envs ({num_envs})")
    exponents = 1.0 + alpha * np.arange(num_train) / max(num_train - 1, 1)
    return np.concatenate([base ** exponents, np.full(num_eval_envs, eval_epsilon)])


def annealed_epsilons(epsilons: torch.Tensor, training: torch.Tensor, acted: torch.Tensor, anneal_steps: int
                      ) -> torch.Tensor:
    """Row epsilons [B] after `acted` (a scalar or per-row [B] tensor) agent steps of the training envs: on the
    `training` rows [B] the line from 1 at step 0 to the row's own epsilon at `anneal_steps` (and after it), DQN's
    annealing ending at each env's epsilon of `epsilon_schedule`; other rows (evaluation, padding) unchanged."""
    remaining = (1.0 - acted.to(epsilons.dtype) / anneal_steps).clamp(min=0.0)
    return torch.where(training, epsilons + (1.0 - epsilons) * remaining, epsilons)
