"""V-trace off-policy targets (Espeholt et al. 2018, "IMPALA", section 4.1).

With rho_t = pi(a_t|x_t) / mu(a_t|x_t), clipped importance weights rho-bar_t = min(rho_bar, rho_t) and
c_t = lambda * min(1, rho_t), the n-step V-trace target is, by the backward recursion

    delta_t  = rho-bar_t (r_t + gamma_t V(x_{t+1}) - V(x_t))
    v_t - V(x_t) = delta_t + gamma_t c_t (v_{t+1} - V(x_{t+1})),      v_T = V(x_T) = bootstrap_value

and the policy-gradient advantage is min(pg_rho_bar, rho_t) (r_t + gamma_t v_{t+1} - V(x_t)).
All inputs are time-major [T, B] (bootstrap_value [B]); gamma_t = `discounts[t]` is 0 where an episode ends.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class VTraceReturns(NamedTuple):
    vs: torch.Tensor  # [T, B] V-trace value targets
    pg_advantages: torch.Tensor  # [T, B] policy-gradient advantages


@torch.no_grad()
def from_importance_weights(
    log_rhos: torch.Tensor,
    discounts: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
    lambda_: float = 1.0,
) -> VTraceReturns:
    """V-trace targets and advantages from log importance weights log(pi/mu), without gradients.

    Args:
      log_rhos: [T, B] log pi(a_t|x_t) - log mu(a_t|x_t).
      discounts: [T, B] gamma_t, the discount applied to the value of x_{t+1}.
      rewards: [T, B] r_t, received after taking a_t.
      values: [T, B] V(x_t).
      bootstrap_value: [B] V(x_T).
      clip_rho_threshold: rho_bar; None disables clipping.
      clip_pg_rho_threshold: rho_bar for the advantage; None disables clipping.
      lambda_: mixing parameter in the trace coefficients c_t = lambda * min(1, rho_t).
    """
    if log_rhos.dim() != 2:
        raise ValueError(f"log_rhos: got shape {list(log_rhos.shape)}, expected [T, B]")
    for name, tensor in (("discounts", discounts), ("rewards", rewards), ("values", values)):
        if tensor.shape != log_rhos.shape:
            raise ValueError(f"{name}: got shape {list(tensor.shape)}, expected {list(log_rhos.shape)} (as log_rhos)")
    if bootstrap_value.shape != log_rhos.shape[1:]:
        raise ValueError(f"bootstrap_value: got shape {list(bootstrap_value.shape)}, expected [{log_rhos.shape[1]}]")

    rhos = torch.exp(log_rhos)
    clipped_rhos = rhos.clamp(max=clip_rho_threshold) if clip_rho_threshold is not None else rhos
    cs = lambda_ * rhos.clamp(max=1.0)
    values_next = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)
    deltas = clipped_rhos * (rewards + discounts * values_next - values)

    vs_minus_values = torch.zeros_like(values)
    carry = torch.zeros_like(bootstrap_value)
    for t in reversed(range(values.shape[0])):
        carry = deltas[t] + discounts[t] * cs[t] * carry
        vs_minus_values[t] = carry
    vs = vs_minus_values + values

    vs_next = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)], dim=0)
    pg_rhos = rhos.clamp(max=clip_pg_rho_threshold) if clip_pg_rho_threshold is not None else rhos
    pg_advantages = pg_rhos * (rewards + discounts * vs_next - values)
    return VTraceReturns(vs=vs, pg_advantages=pg_advantages)
