"""A one-step Gaussian actor-critic on a Box action space: the smallest agent that acts with action vectors.

Acting: u ~ Normal(mean(obs), exp(log_std)) [B, D]; the action is tanh(u) mapped into the env's bounds, float32
[B, D] in the env's units (`ActOutput`), and u is stored (`pre_tanh`) so the loss can score it. The loss is a
one-step advantage actor-critic; it refuses action columns that are not float32 [T + 1, B, D] and reports what it
saw (`toy_box/*` metrics): the action range, and how far `prev_action[t + 1]` is from `action[t]` inside episodes
(0 when the learner's previous-action table carries the vectors right).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from seed.contracts import ActOutput, InferenceBatch, State
from seed.contracts import agent as contract
from seed.contracts.training import LossOutput, TrainingBatch, Unroll
from tests.toy_box_agent.config import ToyBoxConfig, ToyBoxReplayConfig


class ToyBoxNetwork(nn.Module):
    def __init__(self, observation_size: int, low: tuple[float, ...], high: tuple[float, ...], hidden: int):
        super().__init__()
        dims = len(low)
        self.torso = nn.Sequential(nn.Linear(observation_size, hidden), nn.Tanh())
        self.mean = nn.Linear(hidden, dims)
        self.value = nn.Linear(hidden, 1)
        self.log_std = nn.Parameter(torch.zeros(dims))
        self.register_buffer("low", torch.tensor(low, dtype=torch.float32))
        self.register_buffer("high", torch.tensor(high, dtype=torch.float32))

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """observation [..., O] -> Gaussian mean [..., D] (before the tanh), value [...]."""
        hidden = self.torso(observation.float())
        return self.mean(hidden), self.value(hidden).squeeze(-1)

    def to_bounds(self, pre_tanh: torch.Tensor) -> torch.Tensor:
        """[..., D] -> float32 [..., D] in [low, high]."""
        return self.low + (torch.tanh(pre_tanh) + 1) * 0.5 * (self.high - self.low)


def check_action_column(unrolls: Unroll, dims: int) -> None:
    """Raises ValueError unless the batch's action and prev_action columns are float32 [T + 1, B, D]."""
    reward = unrolls.reward
    for name in ("action", "prev_action"):
        column = unrolls.steps[name]
        expected = (*reward.shape, dims)
        if column.dtype != torch.float32 or tuple(column.shape) != expected:
            raise ValueError(f"unrolls.{name}: got {column.dtype} {list(column.shape)}, expected torch.float32 "
                             f"{list(expected)}")


class ToyBoxAgent(contract.Agent):
    config_class = ToyBoxConfig
    action_spaces = ("box",)

    def __init__(self, spec: Any, config: Any):
        self.config = config
        self.dims = spec.action_shape[0]
        self.network = ToyBoxNetwork(int(np.prod(spec.observation_shape)), spec.action_low, spec.action_high,
                                     config.toy_box_hidden_size)

    def initial_state(self, batch_size: int) -> State:
        return {}

    def act(self, network: nn.Module, batch: InferenceBatch, state: State) -> ActOutput:
        mean, _ = network(batch.observation.flatten(1))
        pre_tanh = mean + network.log_std.exp() * torch.randn_like(mean)
        action = network.to_bounds(pre_tanh)
        if self.config.toy_box_nan_env_id >= 0:  # a broken policy for one env, for the actors' refusal
            action[batch.env_ids == self.config.toy_box_nan_env_id] = float("nan")
        return ActOutput(action=action, outputs={"pre_tanh": pre_tanh}, state=state)

    def loss(self, batch: TrainingBatch) -> LossOutput:
        """One-step advantage actor-critic on a time-major batch [T + 1, B]: u_t, r_{t+1}, done_{t+1}."""
        unrolls = batch.unrolls
        check_action_column(unrolls, self.dims)
        mean, values = self.network(unrolls.observation.flatten(2))
        discounts = (~unrolls.done[1:]).float() * self.config.discounting
        targets = (unrolls.reward[1:] + discounts * values[1:]).detach()
        advantages = targets - values[:-1]
        normal = torch.distributions.Normal(mean[:-1], self.network.log_std.exp())
        log_probs = normal.log_prob(unrolls.pre_tanh[:-1]).sum(-1)
        weights = unrolls.valid[:-1].float()
        if batch.importance_weights is not None:
            weights = weights * batch.importance_weights
        policy_loss = -(log_probs * advantages.detach() * weights).mean()
        value_loss = 0.5 * (advantages.pow(2) * weights).mean()
        total = policy_loss + value_loss
        action, prev_action = unrolls.action, unrolls.prev_action
        inside = (unrolls.valid[:-1] & unrolls.valid[1:] & ~unrolls.done[1:]).unsqueeze(-1)
        carried = ((prev_action[1:] - action[:-1]).abs() * inside).max() if inside.any() else torch.tensor(0.0)
        valid = unrolls.valid.unsqueeze(-1).expand_as(action)
        metrics = {"losses/toy_box_total": total.item(),
                   "toy_box/action_min": action[valid].min().item(), "toy_box/action_max": action[valid].max().item(),
                   "toy_box/action_rank": float(action.dim()), "toy_box/action_dims": float(action.shape[-1]),
                   "toy_box/prev_action_error": carried.item()}
        priorities = advantages.detach().abs().max(0).values + 1e-3 if self.uses_replay else None
        return LossOutput(total, metrics, priorities)


class ToyBoxReplayAgent(ToyBoxAgent):
    """The same agent trained from the central replay (priorities: the largest |advantage| of a sequence)."""

    config_class = ToyBoxReplayConfig
    uses_replay = True

    def replay_sequence_bytes(self) -> int:
        return 4096
