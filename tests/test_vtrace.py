"""V-trace against a direct NumPy evaluation of the paper's definition (Espeholt et al. 2018, eq. 1)."""

import numpy as np
import pytest
import torch

from seed.agents.vtrace.vtrace import from_importance_weights


def _vtrace_by_definition(log_rhos, discounts, rewards, values, bootstrap, rho_bar, pg_rho_bar, lambda_):
    """v_s = V(x_s) + sum_{t>=s} (prod_{i<t} gamma_i) (prod_{s<=i<t} c_i) delta_t, written out as a double sum."""
    T, B = log_rhos.shape
    rhos = np.exp(log_rhos)
    clipped = np.minimum(rho_bar, rhos)
    cs = lambda_ * np.minimum(1.0, rhos)
    values_next = np.concatenate([values[1:], bootstrap[None]], 0)
    vs = np.zeros((T, B))
    for b in range(B):
        for s in range(T):
            total = values[s, b]
            for t in range(s, T):
                weight = np.prod(discounts[s:t, b]) * np.prod(cs[s:t, b])
                delta = clipped[t, b] * (rewards[t, b] + discounts[t, b] * values_next[t, b] - values[t, b])
                total += weight * delta
            vs[s, b] = total
    vs_next = np.concatenate([vs[1:], bootstrap[None]], 0)
    pg = np.minimum(pg_rho_bar, rhos) * (rewards + discounts * vs_next - values)
    return vs, pg


@pytest.mark.parametrize("rho_bar,pg_rho_bar,lambda_",
                         [(1.0, 1.0, 1.0), (3.7, 2.2, 1.0), (0.8, 1.3, 0.9), (2.0, 0.5, 0.5)])
def test_matches_definition(rho_bar, pg_rho_bar, lambda_):
    rng = np.random.default_rng(7)
    T, B = 7, 5
    log_rhos = rng.normal(0, 1, (T, B))
    # Per-column discounts, with episode ends (zeros) in some columns.
    discounts = np.stack([np.full(T, g) for g in (0.9, 0.99, 0.5, 1.0, 0.95)], 1)
    discounts[3, 1] = 0.0
    discounts[0, 4] = 0.0
    rewards = rng.normal(0, 2, (T, B))
    values = rng.normal(0, 1, (T, B))
    bootstrap = rng.normal(0, 1, B)
    expected_vs, expected_pg = _vtrace_by_definition(log_rhos, discounts, rewards, values, bootstrap,
                                                     rho_bar, pg_rho_bar, lambda_)
    t = lambda x: torch.tensor(x, dtype=torch.float64)
    out = from_importance_weights(t(log_rhos), t(discounts), t(rewards), t(values), t(bootstrap),
                                  clip_rho_threshold=rho_bar, clip_pg_rho_threshold=pg_rho_bar, lambda_=lambda_)
    np.testing.assert_allclose(out.vs.numpy(), expected_vs, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(out.pg_advantages.numpy(), expected_pg, rtol=1e-10, atol=1e-10)


def test_on_policy_lambda_one_is_n_step_return():
    # With pi == mu and no clipping active, v_s is the discounted n-step return bootstrapped from V(x_T).
    T, B = 4, 1
    rewards = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
    out = from_importance_weights(torch.zeros(T, B), torch.full((T, B), 0.5), rewards, torch.zeros(T, B),
                                  torch.tensor([8.0]))
    assert out.vs[0].item() == pytest.approx(1 + 0.5 * 2 + 0.25 * 3 + 0.125 * 4 + 0.0625 * 8)


def test_no_gradients_and_shape_errors():
    values = torch.zeros(3, 2, requires_grad=True)
    out = from_importance_weights(torch.zeros(3, 2), torch.ones(3, 2), torch.ones(3, 2), values, torch.zeros(2))
    assert not out.vs.requires_grad and not out.pg_advantages.requires_grad
    with pytest.raises(ValueError, match=r"rewards: got shape \[3, 3\], expected \[3, 2\]"):
        from_importance_weights(torch.zeros(3, 2), torch.ones(3, 2), torch.ones(3, 3), values, torch.zeros(2))
