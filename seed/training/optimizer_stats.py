"""How far Adam moves the weights per step, as a fraction of the learning rate.

Adam moves a weight by lr * m_hat / (sqrt(v_hat) + eps). For a steady gradient g, m_hat = g and
sqrt(v_hat) = |g|, so the step is lr * |g| / (|g| + eps): where the gradients of a layer are much smaller than
eps, its weights move by a small fraction of lr, whatever lr says. R2D2's loss (value-rescaled TD errors, a few
hundredths on Pong) gives such gradients: with the paper's eps 1e-3 the median weight of the first Pong run
(docs/learning/README.md) moved by 1.8% of lr, the LSTM's by about 5%.
"""

from __future__ import annotations

import torch


def adam_step_fraction(optimizer: torch.optim.Optimizer) -> float | None:
    """Mean over every weight of sqrt(v_hat) / (sqrt(v_hat) + eps), in [0, 1).

    v_hat is Adam's bias-corrected second moment (its running mean of squared gradients). None for an optimizer
    without Adam's state or before its first step.
    """
    total, count = 0.0, 0
    for group in optimizer.param_groups:
        if "eps" not in group or "betas" not in group:
            return None
        eps, beta2 = group["eps"], group["betas"][1]
        for parameter in group["params"]:
            state = optimizer.state.get(parameter, {})
            if "exp_avg_sq" not in state:
                continue
            steps = float(state["step"])
            rms = (state["exp_avg_sq"] / (1.0 - beta2 ** steps)).sqrt()
            total += float((rms / (rms + eps)).sum())
            count += rms.numel()
    return total / count if count else None
