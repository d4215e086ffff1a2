"""EfficientZero math, time-major [T, B]: the invertible value transform, categorical supports, n-step value
targets with the off-policy correction, value-prefix targets, and the masks of a K-step unroll.

Step semantics (docs/ARCHITECTURE.md, seed/contracts/training.py): the action at step t earns `reward[t + 1]`; `done[t +
1]`
means the episode ended after that action (step t + 1 is the first step of the next episode); `truncated[t + 1]`
means it ended by the time limit.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F


def value_transform(x: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x (Pohlen et al. 2018; MuZero's and EfficientZero's supports)."""
    return torch.sign(x) * (torch.sqrt(torch.abs(x) + 1.0) - 1.0) + eps * x


def inverse_value_transform(y: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """h^-1(y) = sign(y) (((sqrt(1 + 4 eps (|y| + 1 + eps)) - 1) / (2 eps))^2 - 1), the exact inverse of h, in the
    algebraically equal form that subtracts no nearly equal numbers:

        s = sqrt((1 + 2 eps)^2 + 4 eps |y|),   d = 2 |y| / (1 + 2 eps + s),   h^-1(y) = sign(y) d (d + 2)

    ((s - 1) / (2 eps) = 1 + d, so the square minus 1 is d (d + 2); eps = 0 gives d = |y|). The textbook form loses
    about three digits in float32 near 0 (errors up to 1.7e-4; all-zero value logits read 2.6e-5): enough noise to
    decide a Gumbel search's min-max rescaled Q (search/gumbel.py). This one stays within a few float32 ulps."""
    magnitude = torch.abs(y)
    s = torch.sqrt((1.0 + 2.0 * eps) ** 2 + 4.0 * eps * magnitude)
    d = 2.0 * magnitude / (1.0 + 2.0 * eps + s)
    return torch.sign(y) * d * (d + 2.0)


def scalar_to_support(x: torch.Tensor, support_size: int, eps: float = 1e-3) -> torch.Tensor:
    """Scalars [...] -> two-hot distributions [..., 2 * support_size + 1] over the integer atoms
    -support_size..support_size of h(x): the two atoms around h(x) share the mass so that its mean is h(x)
    (clipped to the support's range)."""
    y = value_transform(x, eps).clamp(-support_size, support_size)
    low = y.floor()
    upper_weight = y - low
    index = (low + support_size).long()
    probabilities = torch.zeros(*x.shape, 2 * support_size + 1, dtype=x.dtype, device=x.device)
    probabilities.scatter_(-1, index.unsqueeze(-1), (1.0 - upper_weight).unsqueeze(-1))
    # At the top atom upper_weight is 0: index + 1 is clamped onto it and adds nothing.
    upper = (index + 1).clamp(max=2 * support_size).unsqueeze(-1)
    probabilities.scatter_add_(-1, upper, upper_weight.unsqueeze(-1))
    return probabilities


def support_to_scalar(logits: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """Logits [..., 2 S + 1] over the atoms -S..S of h -> scalars [...]: h^-1 of the softmax's mean atom."""
    support_size = (logits.shape[-1] - 1) // 2
    atoms = torch.arange(-support_size, support_size + 1, dtype=logits.dtype, device=logits.device)
    return inverse_value_transform((F.softmax(logits, dim=-1) * atoms).sum(-1), eps)


def td_horizons(policy_version: torch.Tensor, train_steps: int, td_steps: int, age_per_step: int) -> torch.Tensor:
    """EfficientZero's off-policy correction: older data bootstraps sooner.

    horizon = clip(td_steps - age // age_per_step, 1, td_steps), with age = train_steps - policy_version in
    learner updates (how many updates ago the acting network chose the step). EfficientZero measures the age in
    env steps with age_per_step = 0.3 x its training steps; `age_per_step` = 0 turns the correction off.

    Args: policy_version int64 [T, B]. Returns int64 [T, B] in [1, td_steps].
    """
    if age_per_step <= 0:
        return torch.full_like(policy_version, td_steps)
    age = (train_steps - policy_version).clamp(min=0)
    return (td_steps - age // age_per_step).clamp(1, td_steps)


def n_step_value_targets(reward: torch.Tensor, done: torch.Tensor, truncated: torch.Tensor, bootstrap: torch.Tensor,
                         horizon: torch.Tensor, discount: float) -> tuple[torch.Tensor, torch.Tensor]:
    """n-step value targets of the states of a segment, each with its own horizon.

    For state t with horizon m = horizon[t]:
        z_t = sum_{j=0}^{m-1} discount^j reward[t+1+j] + discount^m bootstrap[t+m]
    except:
      - terminal at t+1+j (done, not truncated): reward[t+1+j] is the last one, no bootstrap;
      - truncated at t+1+j: the old episode's last observation was never sent, so the horizon ends one step
        early: sum_{i<j} discount^i reward[t+1+i] + discount^j bootstrap[t+j]; for j = 0 (the state's own
        step) the state gets no target (mask False);
      - a horizon that runs past the segment's last step: no target (mask False).

    Args:
      reward, done, truncated: [T, B] step fields of the segment.
      bootstrap: [T, B] scalar value of each step's state (the target network's).
      horizon: int64 [T, B], each state's n >= 1.
    Returns:
      targets [T, B] and a bool mask [T, B] of the states that have one.
    """
    steps, batch = reward.shape
    device = reward.device
    max_horizon = int(horizon.max()) if horizon.numel() else 0
    t = torch.arange(steps, device=device).unsqueeze(1).expand(steps, batch)
    column = torch.arange(batch, device=device).unsqueeze(0).expand(steps, batch)
    targets = torch.zeros(steps, batch, dtype=bootstrap.dtype, device=device)
    scale = torch.ones_like(targets)  # discount^j for the next reward
    open_ = torch.ones(steps, batch, dtype=torch.bool, device=device)  # horizon not yet closed
    mask = torch.ones_like(open_)
    for j in range(max_horizon):
        i = t + 1 + j  # the step whose reward comes next
        inside = i < steps
        mask &= inside | ~open_  # an open horizon that leaves the segment has no target
        ic = i.clamp(max=steps - 1)
        active = open_ & inside
        is_done, is_trunc = done[ic, column], truncated[ic, column]
        cut = active & is_done & is_trunc
        targets = targets + torch.where(cut, scale * bootstrap[ic - 1, column], torch.zeros_like(targets))
        if j == 0:
            mask &= ~cut
        add = active & ~cut
        targets = targets + torch.where(add, scale * reward[ic, column], torch.zeros_like(targets))
        scale = torch.where(add, scale * discount, scale)
        terminal = add & is_done
        horizon_end = add & ~is_done & (j + 1 == horizon)
        targets = targets + torch.where(horizon_end, scale * bootstrap[ic, column], torch.zeros_like(targets))
        open_ = open_ & ~cut & ~terminal & ~horizon_end & inside
    return targets, mask


def unroll_indices(starts: int, unroll_steps: int, device: torch.device | None = None) -> torch.Tensor:
    """int64 [K + 1, U]: position s + k of unroll step k from start s, for the U = `starts` starts."""
    return (torch.arange(unroll_steps + 1, device=device).unsqueeze(1)
            + torch.arange(starts, device=device).unsqueeze(0))


def gather_unroll(values: torch.Tensor, starts: int, unroll_steps: int) -> torch.Tensor:
    """[L, B, ...] step values -> [K + 1, U, B, ...]: the value at position s + k for start s and unroll step k."""
    index = unroll_indices(starts, unroll_steps, values.device)
    return values[index]


def unroll_masks(done: torch.Tensor, truncated: torch.Tensor, valid: torch.Tensor, starts: int, unroll_steps: int
                 ) -> dict[str, torch.Tensor]:
    """Which unroll steps k of each start s have which targets, [K + 1, U, B] bool each.

    Past the end of the start's episode the model unrolls into an absorbing state: reward 0 and, after a
    termination, value 0; after a truncation the true continuation is unknown and those targets are masked.

      start:    start s is a real step (not the padding in front of a fresh env's first unroll).
      alive:    the state at s + k belongs to the start's episode (no episode start in (s, s + k]).
      absorbed: the start's episode ended by termination in (s, s + k] (value 0 and reward 0 are known targets).
      reward:   the edge into step k (k >= 1) has a reward target: the episode's own reward (`edge_alive`), or
                the absorbing 0 after a termination. False at k = 0.
      edge_alive: the edge into step k starts from the start's episode (alive at k - 1): its reward is the
                stored reward[s + k]. False at k = 0.
    """
    started = gather_unroll(done, starts, unroll_steps).clone()
    started[0] = False  # done at s itself opens the start's episode
    count = started.long().cumsum(0)
    ended = count > 0  # an episode start in (s, s + k]
    first_boundary = started & (count == 1)
    by_truncation = (first_boundary & gather_unroll(truncated, starts, unroll_steps)).long().cumsum(0) > 0
    start = valid[:starts].unsqueeze(0).expand_as(ended)
    alive = ~ended & start
    absorbed = ended & ~by_truncation & start
    edge_alive = torch.zeros_like(alive)
    edge_alive[1:] = alive[:-1]
    reward = edge_alive | absorbed
    reward[0] = False
    return {"start": start, "alive": alive, "absorbed": absorbed, "reward": reward, "edge_alive": edge_alive}


def value_prefix_targets(edge_rewards: torch.Tensor, horizon: int) -> torch.Tensor:
    """Value-prefix targets [K + 1, U, B] from the rewards of the edges into each unroll step [K + 1, U, B] (row
    0 unused; 0 for the absorbing state's edges): the sum of the rewards since the last LSTM reset, which
    happens after every `horizon` unroll steps (EfficientZero resets the value-prefix LSTM every 5 steps of a
    search path too)."""
    prefix = torch.zeros_like(edge_rewards)
    running = torch.zeros_like(edge_rewards[0])
    for k in range(1, edge_rewards.shape[0]):
        running = running + edge_rewards[k]
        prefix[k] = running
        if k % horizon == 0:
            running = torch.zeros_like(running)
    return prefix


def sequence_priorities(errors: torch.Tensor, mask: torch.Tensor, eta: float) -> torch.Tensor:
    """p = eta max_s |e_s| + (1 - eta) mean_s |e_s| over the masked starts of each sequence: [U, B] -> [B]."""
    absolute = errors.abs() * mask
    count = mask.sum(0).clamp(min=1)
    return eta * absolute.max(0).values + (1.0 - eta) * absolute.sum(0) / count
