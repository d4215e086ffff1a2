"""seed/training/optimizer_stats.py on a real Adam optimizer."""

import torch

from seed.training.optimizer_stats import adam_step_fraction


def _fraction_after_steps(gradient_scale: float, eps: float) -> float:
    torch.manual_seed(0)
    weights = torch.nn.Parameter(torch.zeros(1000))
    optimizer = torch.optim.Adam([weights], lr=1e-3, eps=eps)
    assert adam_step_fraction(optimizer) is None  # no step yet
    for _ in range(20):
        optimizer.zero_grad()
        (weights * torch.randn(1000) * gradient_scale).sum().backward()
        optimizer.step()
    return adam_step_fraction(optimizer)


def test_small_gradients_under_a_large_eps_move_the_weights_by_a_small_fraction_of_lr():
    damped = _fraction_after_steps(gradient_scale=1e-5, eps=1e-3)
    assert 0.005 < damped < 0.02  # |g| ~ 1e-5 against eps 1e-3: about 1%
    assert _fraction_after_steps(gradient_scale=1e-5, eps=1e-8) > 0.99
    assert 0.4 < _fraction_after_steps(gradient_scale=1e-3, eps=1e-3) < 0.6


def test_the_fraction_matches_the_weights_actual_move():
    weights = torch.nn.Parameter(torch.zeros(4))
    optimizer = torch.optim.Adam([weights], lr=1.0, eps=1e-3, betas=(0.0, 0.999))  # no momentum: m_hat = g
    weights.grad = torch.full((4,), 1e-3)
    optimizer.step()
    # After one step sqrt(v_hat) = |g| = 1e-3, so each weight moved lr * 1e-3 / (1e-3 + 1e-3) = 0.5.
    assert torch.allclose(weights.detach().abs(), torch.full((4,), 0.5), atol=1e-4)
    assert abs(adam_step_fraction(optimizer) - 0.5) < 1e-4


def test_an_optimizer_without_adam_state_gives_none():
    weights = torch.nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.SGD([weights], lr=0.1)
    weights.grad = torch.ones(3)
    optimizer.step()
    assert adam_step_fraction(optimizer) is None
