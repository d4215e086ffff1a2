"""Counter-based random numbers for deterministic action sampling.

Each (seed, env id, step, action index) is hashed to one uniform in (0, 1) by the SplitMix64 finaliser, so a
draw depends only on those four integers: not on which batch the env's row was in, on the other rows, or on
the order requests arrived. `--deterministic` samples actions this way (Gumbel-max on these uniforms).
"""

from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1


def _signed(value: int) -> int:
    """A 64-bit constant as torch's int64 holds it."""
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_MIX1 = _signed(0xBF58476D1CE4E5B9)
_MIX2 = _signed(0x94D049BB133111EB)
_ENV = _signed(0xD1B54A32D192ED03)
_STEP = _signed(0x8CB92BA72F3D8DD7)


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _splitmix64(x: torch.Tensor) -> torch.Tensor:
    x = x + _GOLDEN
    x = (x ^ _shift_right(x, 30)) * _MIX1
    x = (x ^ _shift_right(x, 27)) * _MIX2
    return x ^ _shift_right(x, 31)


def counter_uniforms(seed: int, env_ids: torch.Tensor, steps: torch.Tensor, n: int) -> torch.Tensor:
    """float64 [B, n] uniforms in (0, 1), a pure function of (seed, env_ids[b], steps[b], i) for column i.

    Args:
      seed: the run's seed.
      env_ids: int64 [B].
      steps: int64 [B], the env's step counter (a different draw per step).
      n: draws per row (e.g. one per action for Gumbel-max).
    """
    columns = torch.arange(n, dtype=torch.int64, device=env_ids.device)
    key = _splitmix64(torch.full_like(env_ids, _signed(seed)) ^ (env_ids.long() * _ENV))
    key = _splitmix64(key ^ (steps.long() * _STEP))
    bits = _splitmix64(key.unsqueeze(-1) + columns * _GOLDEN)
    mantissa = _shift_right(bits, 11)  # 53 random bits
    return (mantissa.double() + 0.5) / float(1 << 53)


def gumbel_max_sample(logits: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Actions int64 [B] from softmax(logits [B, A]) given uniforms [B, A]: argmax(logits - log(-log u))."""
    gumbel = -torch.log(-torch.log(uniforms))
    return (logits.double() + gumbel).argmax(-1)
