"""The tanh-squashed Gaussian (agents/distributions.py) against hand-computed densities, numerical integration
of its density over [low, high] and Monte-Carlo samples, at the bounds, and its refusals."""

import math

import numpy as np
import pytest
import torch

from seed.agents.distributions import TanhNormal, log1m_tanh_sq

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)  # 0.918939


def _dist(mean, log_std, low, high, dtype=torch.float64, **kwargs):
    return TanhNormal(torch.tensor(mean, dtype=dtype), torch.tensor(log_std, dtype=dtype), low, high, **kwargs)


def test_log_prob_by_hand_in_one_and_two_dimensions():
    # 1-D, N(0, 1), bounds [-2, 2] (loc 0, scale 2). Action 0: u = 0, log N(0) = -0.918939, log(1 - 0) = 0,
    # log-det of the affine map log 2 = 0.693147: log p = -0.918939 - 0.693147 = -1.612086.
    dist = _dist([0.0], [0.0], [-2.0], [2.0])
    assert dist.log_prob(torch.tensor([0.0], dtype=torch.float64)).item() == pytest.approx(-1.612086, abs=1e-6)
    # Action 1: y = 0.5, u = atanh(0.5) = 0.549306, log N(u) = -0.918939 - 0.150869 = -1.069808,
    # -log(1 - 0.25) = +0.287682, -log 2: log p = -1.475272.
    assert dist.log_prob(torch.tensor([1.0], dtype=torch.float64)).item() == pytest.approx(-1.475272, abs=1e-6)
    # 2-D, mean (0.2, -0.3), std (0.5, e^-1), bounds [-1, 1] x [0, 4], action (0.5, 1.0):
    #   dim 0: scale 1, y = 0.5, u = 0.549306, z = (0.549306 - 0.2) / 0.5 = 0.698612,
    #          log N = -0.244030 + 0.693147 - 0.918939 = -0.469821, -log(0.75) = 0.287682, -log 1 = 0 -> -0.182139
    #   dim 1: loc 2, scale 2, y = -0.5, u = -0.549306, z = (-0.549306 + 0.3) e = -0.677685,
    #          log N = -0.229628 + 1 - 0.918939 = -0.148567, +0.287682, -0.693147 -> -0.554032
    # sum -0.736171.
    dist = _dist([0.2, -0.3], [math.log(0.5), -1.0], [-1.0, 0.0], [1.0, 4.0])
    assert dist.log_prob(torch.tensor([0.5, 1.0], dtype=torch.float64)).item() == pytest.approx(-0.736171, abs=1e-5)


def test_mode_is_the_squashed_mean_in_the_env_units():
    # loc 2, scale 2: 2 + 2 tanh(0.5) = 2 + 2 x 0.462117 = 2.924234; a mean of 0 gives the middle of the box.
    dist = _dist([[0.5, 0.0]], [[0.0, 0.0]], [0.0, -3.0], [4.0, 1.0])
    torch.testing.assert_close(dist.mode(), torch.tensor([[2.924234, -1.0]], dtype=torch.float64))


@pytest.mark.parametrize("mean, std", [(0.3, 0.8), (-1.0, 1.0), (0.0, 0.1)])
def test_density_integrates_to_one_over_the_box(mean, std):
    low, high = -1.0, 3.0
    dist = _dist([mean], [math.log(std)], [low], [high])
    grid = torch.linspace(low, high, 400_001, dtype=torch.float64).unsqueeze(-1)
    density = dist.log_prob(grid).exp().numpy()
    total = np.trapezoid(density, grid[:, 0].numpy())
    assert total == pytest.approx(1.0, abs=1e-5)


def test_samples_follow_the_density_and_their_log_prob_is_the_change_of_variables():
    torch.manual_seed(0)
    low, high, mean, std = -1.0, 3.0, 0.3, 0.8
    dist = TanhNormal(torch.full((200_000, 1), mean, dtype=torch.float64),
                      torch.tensor([math.log(std)], dtype=torch.float64), [low], [high])
    action, log_prob = dist.rsample_with_log_prob()
    assert action.shape == (200_000, 1) and log_prob.shape == (200_000,)
    assert float(action.min()) >= low and float(action.max()) <= high
    # The empirical CDF at a few points against the integral of exp(log_prob) (3-sigma of a binomial: 3.4e-3).
    one = _dist([mean], [math.log(std)], [low], [high])
    grid = torch.linspace(low, high, 200_001, dtype=torch.float64).unsqueeze(-1)
    density = one.log_prob(grid).exp().numpy()
    cdf = np.concatenate([[0.0], np.cumsum(np.diff(grid[:, 0].numpy()) * 0.5 * (density[1:] + density[:-1]))])
    for c in (-0.5, 0.5, 1.0, 2.0, 2.9):
        empirical = float((action[:, 0] < c).double().mean())
        assert empirical == pytest.approx(np.interp(c, grid[:, 0].numpy(), cdf), abs=3.4e-3), c
    # log p(a) by the change of variables written out in numpy: N(atanh(y); mean, std) / (scale (1 - y^2)).
    a = action[:1000, 0].detach().numpy()
    y = (a - 1.0) / 2.0
    u = np.arctanh(y)
    direct = -0.5 * ((u - mean) / std) ** 2 - np.log(std) - LOG_SQRT_2PI - np.log(2.0 * (1 - y ** 2))
    np.testing.assert_allclose(log_prob[:1000].detach().numpy(), direct, rtol=1e-9, atol=1e-9)
    # And log_prob of the action (through atanh) gives the same number as the sample's own.
    torch.testing.assert_close(dist.log_prob(action)[:1000], log_prob[:1000])


def test_rsample_is_reparameterised():
    torch.manual_seed(1)
    mean = torch.tensor([[0.4, -0.2]], dtype=torch.float64, requires_grad=True)
    log_std = torch.tensor([-0.5, 0.1], dtype=torch.float64, requires_grad=True)
    dist = TanhNormal(mean, log_std, [-1.0, 0.0], [1.0, 2.0])
    action, _ = dist.rsample_with_log_prob()
    action.sum().backward()
    # d a / d mean = scale (1 - tanh(u)^2) = scale (1 - y^2), y = (a - loc) / scale; scales 1 and 1.
    y = (action.detach() - torch.tensor([0.0, 1.0], dtype=torch.float64))
    torch.testing.assert_close(mean.grad, 1 - y ** 2)
    assert bool((log_std.grad != 0).all())


def test_log_prob_at_the_bounds_and_far_tails_is_finite_with_finite_gradients():
    mean = torch.tensor([[0.0, 3.0]], requires_grad=True)  # float32, as the agents run it
    log_std = torch.tensor([0.0, 0.0], requires_grad=True)
    dist = TanhNormal(mean, log_std, [-2.0, -1.0], [2.0, 1.0])
    actions = torch.tensor([[2.0, -1.0], [-2.0, 1.0], [1.9999999, 0.9999999]])
    log_prob = dist.log_prob(actions)
    assert bool(torch.isfinite(log_prob).all()), log_prob
    log_prob.sum().backward()
    assert bool(torch.isfinite(mean.grad).all()) and bool(torch.isfinite(log_std.grad).all())
    # The stable log(1 - tanh^2): the naive float32 form is -inf at u = 10 (tanh rounds to 1);
    # 2 (log 2 - 10 - softplus(-20)) = -18.613706.
    u = torch.tensor(10.0)
    assert torch.log(1 - torch.tanh(u) ** 2).item() == -math.inf
    assert log1m_tanh_sq(u).item() == pytest.approx(-18.613706, abs=1e-5)
    assert log1m_tanh_sq(torch.tensor(0.3, dtype=torch.float64)).item() == pytest.approx(
        math.log(1 - math.tanh(0.3) ** 2), abs=1e-12)


def test_a_sample_whose_tanh_rounds_to_the_bound_has_a_finite_log_prob():
    # A std of e^3 = 20: float32 tanh(u) is exactly +-1 for |u| > 9, so many actions land on the bounds.
    torch.manual_seed(2)
    dist = TanhNormal(torch.zeros(10_000, 1), torch.tensor([3.0]), [-1.0], [1.0])
    action, log_prob = dist.rsample_with_log_prob()
    assert bool((action.abs() == 1).any())
    assert bool(torch.isfinite(log_prob).all()) and bool(torch.isfinite(dist.log_prob(action)).all())


def test_std_floor_and_entropy_estimate():
    dist = _dist([[0.0]], [[-20.0]], [-1.0], [1.0], min_std=1e-3)
    assert dist.std.item() == pytest.approx(1e-3)
    assert _dist([[0.0]], [[math.log(0.5)]], [-1.0], [1.0]).std.item() == pytest.approx(0.5)  # above: unchanged
    # The mean of -log p over samples estimates the entropy: with std 0.05 around 0 and scale 1, tanh is nearly
    # linear, so the entropy is close to the Gaussian's 0.5 log(2 pi e 0.05^2) = -1.576 (the tanh's log-det,
    # E[-log(1 - tanh(u)^2)] ~ E[u^2] = 0.0025, takes a little off).
    torch.manual_seed(3)
    many = TanhNormal(torch.zeros(100_000, 1, dtype=torch.float64), torch.tensor([math.log(0.05)],
                                                                               dtype=torch.float64), [-1.0], [1.0])
    gaussian = 0.5 * math.log(2 * math.pi * math.e * 0.05 ** 2)
    assert float(many.entropy_estimate().mean()) == pytest.approx(gaussian - 0.0025, abs=3e-3)


@pytest.mark.parametrize("make, message", [
    (lambda: TanhNormal(torch.zeros(3), torch.zeros(2), [-1.0] * 3, [1.0] * 3), "log_std: got shape \\[2\\]"),
    (lambda: TanhNormal(torch.zeros(3), torch.zeros(3), [-1.0] * 2, [1.0] * 3),
     "low: got shape \\[2\\], expected \\[3\\]"),
    (lambda: TanhNormal(torch.zeros(2), torch.zeros(2), [-1.0, 1.0], [1.0, 1.0]), "low < high"),
    (lambda: TanhNormal(torch.zeros(2), torch.zeros(2), [-1.0] * 2, [1.0] * 2, min_std=0.0), "min_std: got 0.0"),
    (lambda: TanhNormal(torch.zeros(2), torch.zeros(2), [-1.0] * 2, [1.0] * 2).log_prob(torch.zeros(3)),
     "action: got shape \\[3\\], expected \\[..., 2\\]"),
])
def test_refusals_name_the_field_the_value_and_what_was_expected(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_given_noise_is_used_instead_of_fresh_draws():
    dist = _dist([[0.5, -0.2]], [[math.log(0.5), 0.0]], [0.0, -3.0], [4.0, 1.0])
    action, log_prob = dist.rsample_with_log_prob(torch.zeros(1, 2, dtype=torch.float64))
    torch.testing.assert_close(action, dist.mode())  # u = mean
    # u = mean + std x 1 = (1.0, 0.8): 2 + 2 tanh(1.0) = 3.523188, -1 + 2 tanh(0.8) = 0.328074.
    action, log_prob = dist.rsample_with_log_prob(torch.ones(1, 2, dtype=torch.float64))
    torch.testing.assert_close(action, torch.tensor([[3.523188, 0.328074]], dtype=torch.float64), atol=1e-6, rtol=0)
    torch.testing.assert_close(log_prob, dist.log_prob(action))


def test_clipped_normal_is_the_affine_gaussian_of_the_unclipped_action():
    """--box_policy=clipped: a = loc + scale u, u ~ N(mean, std), unsquashed (the env clips); the density and
    entropy are the Gaussian's in the env's units, the mode the mean clipped into the box."""
    from seed.agents.distributions import ClippedNormal

    mean = torch.tensor([[0.3, -2.0], [1.5, 0.1]])
    log_std = torch.tensor([-0.5, 0.2])
    low, high = (-1.0, 0.0), (1.0, 4.0)  # loc (0, 2), scale (1, 2)
    dist = ClippedNormal(mean, log_std, low, high)
    action, log_prob = dist.rsample_with_log_prob(torch.tensor([[3.0, 0.0], [-1.0, 2.0]]))
    u = mean + log_std.exp() * torch.tensor([[3.0, 0.0], [-1.0, 2.0]])
    torch.testing.assert_close(action, torch.tensor([0.0, 2.0]) + torch.tensor([1.0, 2.0]) * u)
    assert float(action[0, 0]) > 1.0  # outside the box: the env clips it, the density is the sample's
    reference = torch.distributions.Normal(torch.tensor([0.0, 2.0]) + torch.tensor([1.0, 2.0]) * mean,
                                           torch.tensor([1.0, 2.0]) * log_std.exp())
    torch.testing.assert_close(log_prob, reference.log_prob(action).sum(-1))
    torch.testing.assert_close(dist.log_prob(action), log_prob)
    torch.testing.assert_close(dist.entropy_estimate(), reference.entropy().sum(-1))
    # The mode: (0.3, 2 - 4) -> (0.3, 0.0) clipped at low; (1.5, 2.2) -> (1.0, 2.2) clipped at high.
    torch.testing.assert_close(dist.mode(), torch.tensor([[0.3, 0.0], [1.0, 2.2]]))
    with pytest.raises(ValueError, match=r"ClippedNormal.log_prob action: got shape \[2, 3\], expected \[..., 2\]"):
        dist.log_prob(torch.zeros(2, 3))
