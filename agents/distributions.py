"""Action distributions over Box action spaces: a tanh-squashed diagonal Gaussian mapped into [low, high].

With u ~ Normal(mean, std) per dimension (D dimensions, independent), the action is

    a = loc + scale * tanh(u),        loc = (high + low) / 2,  scale = (high - low) / 2

and by the change of variables a = f(u) (f increasing, per dimension) its density is

    log p(a) = sum_d [ log N(u_d; mean_d, std_d) - log(1 - tanh(u_d)^2) - log(scale_d) ],  u = atanh((a - loc) / scale)

with the stable form log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)), which stays finite where tanh(u)
rounds to +-1. The std has a floor: std = max(exp(log_std), min_std), as SEED's NormalTanhDistribution keeps a
minimum std of 1e-3 (there: softplus + min_std). Above the floor exp(log_std) is the std unchanged, so CleanRL's
SAC log-std range [-5, 2] (std >= 6.7e-3) means what it says.

Used by PPO and V-trace on Box actions (agents/ppo, agents/vtrace) and by SAC; a pure module over tensors.

`ClippedNormal` is the alternative PPO and V-trace offer (`--box_policy=clipped`): the same Gaussian mapped
affinely, a = loc + scale * u, unsquashed; the env clips a into [low, high] (CleanRL's ppo_continuous_action,
whose Normal samples go through gym's ClipAction). Its density is that of the unclipped sample, which the unroll
stores: log p(a) = sum_d [ log N(u_d; mean_d, std_d) - log(scale_d) ], u = (a - loc) / scale.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch.nn import functional as F

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_LOG_2 = math.log(2.0)
# atanh's input is clamped to [-1 + BOUND_EPS, 1 - BOUND_EPS] in log_prob: an action on a bound (the env's
# clip, or a float32 tanh that rounded to 1) reads as |u| = atanh(1 - 1e-6) = 7.25 instead of infinity.
BOUND_EPS = 1e-6


def log1m_tanh_sq(u: torch.Tensor) -> torch.Tensor:
    """log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)), elementwise; finite for every finite u (about
    -2|u| + 2 log 2 for large |u|, where 1 - tanh(u)^2 itself rounds to 0)."""
    return 2.0 * (_LOG_2 - u - F.softplus(-2.0 * u))


def _as_bound(name: str, value: torch.Tensor | Sequence[float], like: torch.Tensor) -> torch.Tensor:
    bound = torch.as_tensor(value, dtype=like.dtype, device=like.device)
    size = like.shape[-1]
    if bound.shape != (size,):
        raise ValueError(f"TanhNormal {name}: got shape {list(bound.shape)}, expected [{size}] (the mean's last "
                         "dimension, one bound per action dimension)")
    return bound


class TanhNormal:
    """A diagonal Gaussian over D pre-squash dimensions, squashed by tanh and mapped affinely into [low, high].

    Args:
      mean: [..., D] the Gaussian's mean (pre-tanh units).
      log_std: [..., D] (or broadcastable to it, e.g. [D] for a state-independent std) the log of its std.
      low, high: [D] the action bounds in the env's units (tensor or sequence of floats), low < high (checked
        unless they are on a GPU).
      min_std: the std's floor (std = max(exp(log_std), min_std)).
    """

    def __init__(self, mean: torch.Tensor, log_std: torch.Tensor, low: torch.Tensor | Sequence[float],
                 high: torch.Tensor | Sequence[float], min_std: float = 1e-3):
        if mean.dim() < 1:
            raise ValueError(f"TanhNormal mean: got shape {list(mean.shape)}, expected [..., D] with D >= 1")
        try:
            log_std = log_std.expand_as(mean)
        except RuntimeError:
            raise ValueError(f"TanhNormal log_std: got shape {list(log_std.shape)}, expected "
                             f"{list(mean.shape)} or broadcastable to it (the mean's)") from None
        if min_std <= 0:
            raise ValueError(f"TanhNormal min_std: got {min_std!r}, expected > 0")
        low, high = _as_bound("low", low, mean), _as_bound("high", high, mean)
        # Checked on the host only: reading a GPU tensor's value synchronises, which a CUDA graph capture of
        # inference refuses (the agents' bounds come from a checked EnvSpec).
        if low.device.type == "cpu" and not bool((low < high).all()):
            raise ValueError(f"TanhNormal low/high: got low {low.tolist()} and high {high.tolist()}, expected "
                             "low < high in every dimension")
        self.mean = mean
        self.std = log_std.exp().clamp(min=min_std)
        self.loc = (high + low) / 2
        self.scale = (high - low) / 2

    def _log_prob_pre_tanh(self, u: torch.Tensor) -> torch.Tensor:
        """log p(a) [...] of the action a = loc + scale tanh(u), from u [..., D] itself (no atanh)."""
        z = (u - self.mean) / self.std
        log_normal = -0.5 * z * z - self.std.log() - _LOG_SQRT_2PI
        return (log_normal - log1m_tanh_sq(u) - self.scale.log()).sum(-1)

    def rsample_with_log_prob(self, noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterised sample: (action [..., D] in [low, high], its log density [...]); gradients flow
        to mean and log_std through both. The log density is computed from the pre-tanh sample, not by
        inverting the action (`log_prob(action)` agrees with it wherever |u| < 7.25, see BOUND_EPS).
        `noise`: standard normal draws [..., D] to use (e.g. counter-based ones); default torch.randn."""
        if noise is None:
            noise = torch.randn_like(self.mean)
        u = self.mean + self.std * noise
        return self.loc + self.scale * torch.tanh(u), self._log_prob_pre_tanh(u)

    def log_prob(self, action: torch.Tensor) -> torch.Tensor:
        """log p(action) [...] for actions [..., D] in the env's units (at the bounds too: the atanh input is
        clamped to 1 -+ BOUND_EPS, so the result and its gradient are finite)."""
        if action.shape[-1:] != self.mean.shape[-1:]:
            raise ValueError(f"TanhNormal.log_prob action: got shape {list(action.shape)}, expected [..., "
                             f"{self.mean.shape[-1]}]")
        y = ((action - self.loc) / self.scale).clamp(-1.0 + BOUND_EPS, 1.0 - BOUND_EPS)
        return self._log_prob_pre_tanh(torch.atanh(y))

    def mode(self) -> torch.Tensor:
        """The action [..., D] of the Gaussian's mean, loc + scale tanh(mean): the evaluation policy (the
        squashed density's own mode differs slightly where std is large)."""
        return self.loc + self.scale * torch.tanh(self.mean)

    def entropy_estimate(self) -> torch.Tensor:
        """A one-sample estimate [...] of the entropy, -log p(a) for a reparameterised a ~ p (differentiable;
        the squashed density has no closed-form entropy)."""
        return -self.rsample_with_log_prob()[1]


class ClippedNormal(TanhNormal):
    """A diagonal Gaussian over D dimensions mapped affinely onto the action box without a squash: actions may
    fall outside [low, high] and the env clips them. Same arguments and methods as TanhNormal."""

    def _log_prob_pre_tanh(self, u: torch.Tensor) -> torch.Tensor:
        """log p(a) [...] of the unclipped action a = loc + scale u, from u [..., D]."""
        z = (u - self.mean) / self.std
        return (-0.5 * z * z - self.std.log() - _LOG_SQRT_2PI - self.scale.log()).sum(-1)

    def rsample_with_log_prob(self, noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterised sample: (the unclipped action [..., D], its log density [...])."""
        if noise is None:
            noise = torch.randn_like(self.mean)
        u = self.mean + self.std * noise
        return self.loc + self.scale * u, self._log_prob_pre_tanh(u)

    def log_prob(self, action: torch.Tensor) -> torch.Tensor:
        """log p(action) [...] of unclipped actions [..., D] in the env's units."""
        if action.shape[-1:] != self.mean.shape[-1:]:
            raise ValueError(f"ClippedNormal.log_prob action: got shape {list(action.shape)}, expected [..., "
                             f"{self.mean.shape[-1]}]")
        return self._log_prob_pre_tanh((action - self.loc) / self.scale)

    def mode(self) -> torch.Tensor:
        """The mean action [..., D], clipped into [low, high] (what the env would play)."""
        low, high = self.loc - self.scale, self.loc + self.scale
        return torch.minimum(torch.maximum(self.loc + self.scale * self.mean, low), high)

    def entropy_estimate(self) -> torch.Tensor:
        """The Gaussian's entropy [...] in closed form (of the unclipped action)."""
        per_dim = 0.5 + _LOG_SQRT_2PI + self.std.log() + self.scale.log()
        return per_dim.sum(-1).expand(self.mean.shape[:-1])


# --box_policy's choices: the distribution class of each (the option's check and the network both read this).
BOX_POLICIES: dict[str, type[TanhNormal]] = {"tanh": TanhNormal, "clipped": ClippedNormal}
