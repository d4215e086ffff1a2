"""Running input statistics kept as module buffers: observation normalisation and return-based reward scaling.

Both are nn.Modules whose statistics are buffers, not parameters: they travel in `state_dict()` with the
network's parameters to the inference side and into checkpoints, so acting, evaluation and seed-eval normalise
exactly as training does; the optimizer never sees them. Both are updated from training batches in the agent's
update (the training process), never while acting.

RunningMoments: per-dimension running mean and variance of a stream of float32 vectors, merged batch by batch
(Chan et al.'s parallel update) into float32 accumulators with compensated (Kahan) additions:

    n' = n + m,  delta = mean_batch - mean,  mean' = mean + delta m / n',  M2' = M2 + M2_batch + delta^2 n m / n'

with var = M2 / n. Plain float32 sums drift: over 1e6 samples around 1,000 SEED's sum / sum-of-squares form
(var = E[x^2] - mean^2) loses the variance entirely (tests/test_normalization.py measures it), and a float32
mean of 1,000 cannot take increments below its ulp (6e-5) without the compensation terms.

ObservationNormalizer: (x - mean) / sqrt(var + eps), clipped to [-clip, clip] (SEED's mujoco code and CleanRL
clip at 10). Before any update it is the identity, as CleanRL's RunningMeanStd (mean 0, var 1).

ReturnScaler: CleanRL's `normalize_reward` (gym's NormalizeReward): each env keeps a running discounted return
G <- gamma G + r (zeroed after its episode ends); rewards are divided by the running std of G over every env's
steps, then clipped to [-clip, clip]. It runs on the training side, not in the actor's env wrapper as CleanRL's
does: the learner logs the episode returns it sums from the rewards it receives (and evaluation envs' too), so
scaling on the actor would change the logged return and the evaluation score; here the logged return stays the
raw one, the statistics are checkpointed, and every env's steps reach the update in order (HTS rollouts, or the
FIFO queue's unrolls), which is what the per-env return needs.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from seed.contracts.training import TrainingBatch, Unroll

SCALED_REWARD = "scaled_reward"  # the unroll column a ReturnScaler adds: float32 [T + 1, B], row t + 1 scales r_{t+1}


def _kahan_add(total: torch.Tensor, compensation: torch.Tensor, value: torch.Tensor) -> None:
    """total += value in place, with the running compensation of Kahan summation (also updated in place)."""
    corrected = value - compensation
    new_total = total + corrected
    compensation.copy_((new_total - total) - corrected)
    total.copy_(new_total)


class RunningMoments(nn.Module):
    """Running mean and variance [size] of vectors [N, size], float32 buffers with Kahan compensation.

    Buffers: count int64 [] (samples seen), mean and m2 float32 [size] (sum of squared deviations), and their
    compensations; var [size] float32, m2 / count (1 before any sample).
    """

    def __init__(self, size: int):
        super().__init__()
        if size < 1:
            raise ValueError(f"RunningMoments size: got {size!r}, expected >= 1")
        self.size = size
        self.register_buffer("count", torch.zeros((), dtype=torch.int64))
        self.register_buffer("mean", torch.zeros(size))
        self.register_buffer("mean_compensation", torch.zeros(size))
        self.register_buffer("m2", torch.zeros(size))
        self.register_buffer("m2_compensation", torch.zeros(size))
        self.register_buffer("var", torch.ones(size))

    @torch.no_grad()
    def update(self, values: torch.Tensor) -> None:
        """Merges a batch of vectors [N, size] (any float dtype; N may be 0) into the statistics."""
        if values.dim() != 2 or values.shape[1] != self.size:
            raise ValueError(f"RunningMoments.update values: got shape {list(values.shape)}, expected [N, {self.size}]")
        batch = int(values.shape[0])
        if batch == 0:
            return
        values = values.to(self.mean.dtype)
        batch_mean = values.mean(0)
        batch_m2 = (values - batch_mean).square().sum(0)
        old, total = int(self.count), int(self.count) + batch
        # The mean with its compensation folded back in: Kahan's total is mean - compensation.
        delta = batch_mean - (self.mean - self.mean_compensation)
        _kahan_add(self.mean, self.mean_compensation, delta * (batch / total))
        _kahan_add(self.m2, self.m2_compensation, batch_m2 + delta.square() * (old * batch / total))
        self.count.fill_(total)
        self.var.copy_((self.m2 - self.m2_compensation) / total)


class ObservationNormalizer(nn.Module):
    """forward(x [..., size]) -> clip((x - mean) / sqrt(var + eps), -clip, clip), float32; `update(x [..., size])`
    adds observations to the running statistics (RunningMoments)."""

    def __init__(self, size: int, clip: float = 10.0, eps: float = 1e-8):
        super().__init__()
        if clip <= 0:
            raise ValueError(f"ObservationNormalizer clip: got {clip!r}, expected > 0")
        self.moments = RunningMoments(size)
        self.clip = clip
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normalized = (x.float() - self.moments.mean) * torch.rsqrt(self.moments.var + self.eps)
        return normalized.clamp(-self.clip, self.clip)

    def update(self, x: torch.Tensor) -> None:
        self.moments.update(x.reshape(-1, self.moments.size))


class ReturnScaler(nn.Module):
    """Divides rewards by the running std of each env's discounted return (CleanRL's normalize_reward).

    Buffers: returns float32 [num_envs] (each env's running discounted return G, by env id) and the moments
    of G (RunningMoments of size 1).
    """

    def __init__(self, num_envs: int, gamma: float, clip: float = 10.0, eps: float = 1e-8):
        super().__init__()
        if num_envs < 1:
            raise ValueError(f"ReturnScaler num_envs: got {num_envs!r}, expected >= 1")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"ReturnScaler gamma: got {gamma!r}, expected in [0, 1]")
        self.register_buffer("returns", torch.zeros(num_envs))
        self.moments = RunningMoments(1)
        self.gamma = gamma
        self.clip = clip
        self.eps = eps

    @torch.no_grad()
    def update_and_scale(self, rewards: torch.Tensor, episode_ends: torch.Tensor, env_ids: torch.Tensor,
                         valid: torch.Tensor) -> torch.Tensor:
        """Runs each env's return over the batch, adds the returns to the statistics, and scales the rewards.

        Args:
          rewards: float32 [T, B], r_t received after the action at t, in env order within each column.
          episode_ends: bool [T, B], the episode ended with r_t (G is zeroed after adding it).
          env_ids: int64 [B], the env of each column (rows of `returns`).
          valid: bool [T, B], False for padding (neither accumulated nor counted).
        Returns:
          clip(r_t / sqrt(var(G) + eps), -clip, clip) [T, B], with var(G) after this batch's returns.
        """
        if rewards.dim() != 2 or episode_ends.shape != rewards.shape or valid.shape != rewards.shape:
            raise ValueError(f"ReturnScaler rewards/episode_ends/valid: got shapes {list(rewards.shape)}, "
                             f"{list(episode_ends.shape)}, {list(valid.shape)}, expected the same [T, B]")
        if env_ids.shape != rewards.shape[1:]:
            raise ValueError(f"ReturnScaler env_ids: got shape {list(env_ids.shape)}, expected [{rewards.shape[1]}]")
        returns = self.returns[env_ids]
        seen = []
        for t in range(rewards.shape[0]):
            keep = valid[t]
            returns = torch.where(keep, returns * self.gamma + rewards[t], returns)
            seen.append(returns[keep])
            returns = torch.where(keep & episode_ends[t], torch.zeros_like(returns), returns)
        self.returns[env_ids] = returns
        self.moments.update(torch.cat(seen).unsqueeze(-1))
        scale = torch.rsqrt(self.moments.var + self.eps)
        return (rewards * scale).clamp(-self.clip, self.clip)


def with_scaled_rewards(scaler: ReturnScaler | None, batch: TrainingBatch) -> TrainingBatch:
    """`batch` with a SCALED_REWARD column beside the raw rewards (which the networks read as inputs, so they
    stay as inference saw them), made by `scaler` from the whole batch; `batch` itself when `scaler` is None.

    Row t + 1 of the column is the scaled reward r_{t+1} of the action at t; row 0 is 0 (it belongs to the previous
    unroll, whose last step this one repeats). Two unrolls of one env in the same batch (possible from the FIFO
    queue) both continue the env's return from before the batch.
    """
    if scaler is None:
        return batch
    unrolls = batch.unrolls
    scaled = torch.zeros_like(unrolls.reward)
    # r_{t+1} is the reward of the action at t: counted where step t is valid (padding is only at the front).
    scaled[1:] = scaler.update_and_scale(unrolls.reward[1:], unrolls.done[1:], unrolls.env_id, unrolls.valid[:-1])
    steps = {**unrolls.steps, SCALED_REWARD: scaled}
    return dataclasses.replace(batch, unrolls=Unroll(steps, unrolls.initial_state, unrolls.env_id))


def loss_rewards(unrolls: Unroll, max_abs_reward: float) -> torch.Tensor:
    """The rewards [T, B] a loss trains on: r_{t+1} scaled by `with_scaled_rewards` when the batch has them,
    else the raw rewards, clipped to [-max_abs_reward, max_abs_reward] when that is > 0."""
    rewards = unrolls.steps[SCALED_REWARD][1:] if SCALED_REWARD in unrolls.steps else unrolls.reward[1:]
    return rewards.clamp(-max_abs_reward, max_abs_reward) if max_abs_reward > 0 else rewards


def update_observation_statistics(normalizer: ObservationNormalizer | None, unrolls: Unroll) -> None:
    """Adds the batch's observations to `normalizer` (None: nothing): every valid step but the last, which the next
    unroll of the env repeats as its first, so each step counts once."""
    if normalizer is not None:
        normalizer.update(unrolls.observation[:-1][unrolls.valid[:-1]])


def state_dict_with_scaler(network: nn.Module, scaler: ReturnScaler | None) -> dict:
    """An agent's checkpoint state: the network's state dict (the observation statistics are its buffers) and,
    with --normalize_rewards, the reward scaler's (each env's return and the returns' moments)."""
    state = {"network": network.state_dict()}
    if scaler is not None:
        state["reward_scaler"] = scaler.state_dict()
    return state


def load_state_dict_with_scaler(network: nn.Module, scaler: ReturnScaler | None, state: dict) -> None:
    """Restores `state_dict_with_scaler`'s result (a checkpoint without reward statistics starts them afresh)."""
    network.load_state_dict(state["network"])
    if scaler is not None and "reward_scaler" in state:
        scaler.load_state_dict(state["reward_scaler"])
