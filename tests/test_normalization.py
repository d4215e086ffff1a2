"""Running statistics as buffers (agents/normalization.py): the compensated running moments against numpy over
1e6 float32 samples (and SEED's plain float32 sums failing there), the observation normaliser by hand, its clip
and a checkpoint round trip, and the return-based reward scaler against CleanRL's wrapper written out."""

import io
import math

import numpy as np
import pytest
import torch

from seed.agents.normalization import ObservationNormalizer, ReturnScaler, RunningMoments

OFFSET = np.array([1000.0, -3000.0, 20.0])
STD = np.array([1.0, 0.5, 3.0])


def _samples():
    rng = np.random.default_rng(0)
    return (OFFSET + STD * rng.standard_normal((1_000_000, 3))).astype(np.float32)


def test_running_moments_agree_with_numpy_over_1e6_float32_samples_where_plain_float32_sums_drift():
    samples = _samples()
    exact_mean = samples.astype(np.float64).mean(0)
    exact_var = samples.astype(np.float64).var(0)
    moments = RunningMoments(3)
    # SEED's normaliser: float32 running sums of x and x^2, var = E[x^2] - E[x]^2.
    plain_sum = torch.zeros(3)
    plain_sumsq = torch.zeros(3)
    for batch in torch.from_numpy(samples).split(1000):
        moments.update(batch)
        plain_sum += batch.sum(0)
        plain_sumsq += batch.square().sum(0)
    assert int(moments.count) == 1_000_000
    # float32 holds -3000 to 2.4e-4: the compensated mean is within half an ulp (measured 4.7e-5; 9.3e-4
    # without the compensation terms), the variance within 1.2e-6 relative.
    np.testing.assert_allclose(moments.mean.double().numpy(), exact_mean, rtol=0, atol=1e-4)
    np.testing.assert_allclose(moments.var.double().numpy(), exact_var, rtol=1e-5)
    plain_mean = plain_sum.double().numpy() / 1e6
    plain_var = plain_sumsq.double().numpy() / 1e6 - (plain_sum / 1e6).square().double().numpy()
    # The plain sums: the variance of the offset dimensions is lost (off by more than 10%), and the mean drifts
    # by more than the compensated one's error.
    assert np.abs(plain_var[:2] / exact_var[:2] - 1).min() > 0.1, plain_var
    assert np.abs(plain_mean - exact_mean).max() > 1e-4, plain_mean - exact_mean


def test_moments_merge_batches_of_different_sizes_by_hand():
    moments = RunningMoments(2)
    moments.update(torch.tensor([[1.0, 2.0], [3.0, 6.0]]))
    moments.update(torch.zeros(0, 2))  # an empty batch changes nothing
    moments.update(torch.tensor([[5.0, 10.0]]))
    # Column 0: 1, 3, 5 -> mean 3, population variance (4 + 0 + 4) / 3 = 8 / 3; column 1 is twice column 0.
    torch.testing.assert_close(moments.mean, torch.tensor([3.0, 6.0]))
    torch.testing.assert_close(moments.var, torch.tensor([8 / 3, 32 / 3]))
    with pytest.raises(ValueError, match="values: got shape \\[4\\], expected \\[N, 2\\]"):
        moments.update(torch.zeros(4))


def test_observation_normalizer_is_the_identity_until_updated_then_normalizes_and_clips():
    normalizer = ObservationNormalizer(2, clip=10.0)
    x = torch.tensor([[[4.0, 6.0]]])  # [T, B, 2]
    torch.testing.assert_close(normalizer(x), x)
    normalizer.update(torch.tensor([[[1.0, 2.0], [3.0, 6.0]], [[5.0, 10.0], [3.0, 6.0]]]))
    # Column 0: 1, 3, 5, 3 -> mean 3, var 2; column 1: mean 6, var 8. (4 - 3) / sqrt(2) = 0.707107, (6 - 6) = 0.
    torch.testing.assert_close(normalizer(x), torch.tensor([[[1 / math.sqrt(2), 0.0]]]))
    # 1003 is (1003 - 3) / sqrt(2) = 707 standard deviations away: clipped to 10; so is -10 on the other side.
    torch.testing.assert_close(normalizer(torch.tensor([[1003.0, -1000.0]])), torch.tensor([[10.0, -10.0]]))
    with pytest.raises(ValueError, match="clip: got 0.0, expected > 0"):
        ObservationNormalizer(2, clip=0.0)


def test_statistics_are_buffers_that_survive_a_checkpoint_round_trip():
    network = torch.nn.Sequential()
    network.add_module("normalizer", ObservationNormalizer(3))
    network.add_module("linear", torch.nn.Linear(3, 1))
    network.normalizer.update(torch.from_numpy(_samples()[:5000]))
    assert {name for name, _ in network.named_parameters()} == {"linear.weight", "linear.bias"}
    assert {"normalizer.moments.mean", "normalizer.moments.var", "normalizer.moments.count",
            "normalizer.moments.mean_compensation"} <= set(network.state_dict())
    saved = io.BytesIO()
    torch.save(network.state_dict(), saved)
    saved.seek(0)
    restored = torch.nn.Sequential()
    restored.add_module("normalizer", ObservationNormalizer(3))
    restored.add_module("linear", torch.nn.Linear(3, 1))
    restored.load_state_dict(torch.load(saved, weights_only=True))
    x = torch.tensor([[1001.0, -3001.0, 17.0]])
    torch.testing.assert_close(restored(x), network(x))
    assert int(restored.normalizer.moments.count) == 5000
    assert not torch.equal(restored.normalizer(x), x)


def test_return_scaler_by_hand_across_batches_episodes_and_padding():
    scaler = ReturnScaler(num_envs=3, gamma=0.5)
    # Env 2, one column: rewards 1, 1, 1 (episode ends), 2. G: 1, 1.5, 1.75, reset, 2.
    rewards = torch.tensor([[1.0], [1.0], [1.0], [2.0]])
    ends = torch.tensor([[False], [False], [True], [False]])
    scaled = scaler.update_and_scale(rewards, ends, torch.tensor([2]), torch.ones(4, 1, dtype=torch.bool))
    # mean(G) = 1.5625, var(G) = (0.5625^2 + 0.0625^2 + 0.1875^2 + 0.4375^2) / 4 = 0.13671875.
    torch.testing.assert_close(scaled, rewards / math.sqrt(0.13671875))
    torch.testing.assert_close(scaler.returns, torch.tensor([0.0, 0.0, 2.0]))
    # The next batch continues env 2's return (G = 0.5 x 2 + 1 = 2); a padding step adds nothing.
    scaler.update_and_scale(torch.tensor([[7.0], [1.0]]), torch.zeros(2, 1, dtype=torch.bool), torch.tensor([2]),
                            torch.tensor([[False], [True]]))
    torch.testing.assert_close(scaler.returns, torch.tensor([0.0, 0.0, 2.0]))
    assert int(scaler.moments.count) == 5
    # Clipped after scaling: with gamma 0, G = r; 99 zeros and 1000 have std sqrt(9900) = 99.5, 1000 / 99.5 = 10.05.
    rewards = torch.zeros(100, 1)
    rewards[-1] = 1000.0
    scaled = ReturnScaler(num_envs=1, gamma=0.0).update_and_scale(
        rewards, torch.zeros(100, 1, dtype=torch.bool), torch.tensor([0]), torch.ones(100, 1, dtype=torch.bool))
    assert scaled[-1].item() == 10.0 and float(scaled[:-1].abs().max()) == 0.0


def test_return_scaler_matches_cleanrl_s_wrapper_written_out():
    # gym's NormalizeReward as CleanRL uses it: returns = returns * gamma + r; stats of the returns; r / std;
    # returns[done] = 0 (here with exact statistics instead of its count=1e-4 prior), over 3 envs, 4 batches.
    rng = np.random.default_rng(1)
    gamma, envs, steps = 0.99, 3, 40
    rewards = rng.normal(-2.0, 3.0, (steps, envs)).astype(np.float32)
    ends = rng.random((steps, envs)) < 0.05
    returns, seen, expected = np.zeros(envs), [], np.zeros((steps, envs))
    for t in range(steps):
        returns = returns * gamma + rewards[t]
        seen.extend(returns)
        if t % 10 == 9:  # the statistics after each batch of 10 steps scale that batch's rewards
            expected[t - 9:t + 1] = np.clip(rewards[t - 9:t + 1] / np.sqrt(np.var(seen) + 1e-8), -10, 10)
        returns[ends[t]] = 0.0
    scaler = ReturnScaler(num_envs=envs, gamma=gamma)
    out = [scaler.update_and_scale(torch.from_numpy(rewards[k:k + 10]), torch.from_numpy(ends[k:k + 10]),
                                   torch.tensor([2, 0, 1]), torch.ones(10, envs, dtype=torch.bool))
           for k in range(0, steps, 10)]
    np.testing.assert_allclose(torch.cat(out).numpy(), expected, rtol=1e-5)
