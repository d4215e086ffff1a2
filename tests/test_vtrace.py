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


def test_agent_reports_off_policyness_and_advantage_metrics(tmp_path):
    """On-policy data gives rho = 1 and nothing clipped; behaviour logits that make the taken actions less likely
    than the trained policy does show up as rho > 1 and a clipped fraction."""
    from seed.agents import agent_class
    from seed.contracts.training import TrainingBatch, Unroll
    from seed.envs import make_spec
    from seed.learner.configuration import resolve_config

    config = resolve_config({"logdir": str(tmp_path / "run"), "agent": "vtrace", "num_actors": 1,
                             "envs_per_actor": 2})
    agent = agent_class("vtrace")(make_spec(config.env, config.env_options()), config)
    steps, envs, generator = 6, 3, torch.Generator().manual_seed(0)
    spec = agent.spec
    unroll_steps = {
        "observation": torch.randn((steps, envs, *spec.observation_shape), generator=generator),
        "reward": torch.rand((steps, envs), generator=generator),
        "done": torch.zeros((steps, envs), dtype=torch.bool),
        "prev_action": torch.randint(spec.num_actions, (steps, envs), generator=generator),
        "action": torch.randint(spec.num_actions, (steps, envs), generator=generator),
        "valid": torch.ones(steps, envs, dtype=torch.bool),
    }
    state = agent.initial_state(envs)
    with torch.no_grad():
        logits, _, _ = agent.network(unroll_steps["observation"], unroll_steps["prev_action"],
                                     unroll_steps["reward"], unroll_steps["done"], state)
    on_policy = agent.loss(TrainingBatch(Unroll({**unroll_steps, "policy_logits": logits}, state,
                                                torch.arange(envs)))).metrics
    assert on_policy["vtrace/rho_mean"] == pytest.approx(1.0, abs=1e-5)
    assert on_policy["vtrace/rho_clipped_fraction"] == 0.0
    assert on_policy["vtrace/advantage_abs_mean"] > 0.0
    # The behaviour policy put 1/e^3 of the target's odds on each taken action: every rho = e^3 (clipped).
    shifted = logits - 3.0 * torch.nn.functional.one_hot(unroll_steps["action"], spec.num_actions)
    off_policy = agent.loss(TrainingBatch(Unroll({**unroll_steps, "policy_logits": shifted}, state,
                                                 torch.arange(envs)))).metrics
    assert off_policy["vtrace/rho_mean"] > 2.0
    assert off_policy["vtrace/rho_clipped_fraction"] == 1.0
