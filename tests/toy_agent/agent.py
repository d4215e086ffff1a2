"""A one-step actor-critic on vector observations: the smallest agent the contract allows (act, loss, state)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from seed.contracts import ActOutput, InferenceBatch, State
from seed.contracts import agent as contract
from seed.contracts.training import LossOutput, TrainingBatch
from tests.toy_agent.config import ToyConfig


class ToyNetwork(nn.Module):
    def __init__(self, observation_size: int, num_actions: int, hidden: int):
        super().__init__()
        self.torso = nn.Sequential(nn.Linear(observation_size, hidden), nn.Tanh())
        self.policy = nn.Linear(hidden, num_actions)
        self.value = nn.Linear(hidden, 1)

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """observation [..., D] -> policy logits [..., A], value [...]."""
        hidden = self.torso(observation.float())
        return self.policy(hidden), self.value(hidden).squeeze(-1)


class ToyAgent(contract.Agent):
    config_class = ToyConfig

    @classmethod
    def check_config(cls, config: Any) -> None:
        if config.toy_hidden_size < 1:
            raise ValueError(f"--toy_hidden_size: got {config.toy_hidden_size}, expected >= 1")

    def __init__(self, spec: Any, config: Any):
        self.config = config
        self.network = ToyNetwork(int(np.prod(spec.observation_shape)), spec.num_actions, config.toy_hidden_size)

    def initial_state(self, batch_size: int) -> State:
        return {}

    def act(self, network: nn.Module, batch: InferenceBatch, state: State) -> ActOutput:
        logits, _ = network(batch.observation.flatten(1))
        action = torch.distributions.Categorical(logits=logits).sample()
        return ActOutput(action=action, outputs={"policy_logits": logits}, state=state)

    def loss(self, batch: TrainingBatch) -> LossOutput:
        """One-step advantage actor-critic on a time-major batch [T + 1, B]: a_t, r_{t+1}, done_{t+1}."""
        unrolls = batch.unrolls
        logits, values = self.network(unrolls.observation.flatten(2))
        discounts = (~unrolls.done[1:]).float() * self.config.discounting
        targets = (unrolls.reward[1:] + discounts * values[1:]).detach()
        advantages = targets - values[:-1]
        log_probs = F.log_softmax(logits[:-1], -1)
        taken = log_probs.gather(-1, unrolls.action[:-1].unsqueeze(-1)).squeeze(-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1).mean()
        policy_loss = -(taken * advantages.detach()).mean()
        value_loss = 0.5 * advantages.pow(2).mean()
        total = policy_loss + value_loss - self.config.toy_entropy_cost * entropy
        return LossOutput(total, {"losses/toy_total": total.item(), "losses/toy_value": value_loss.item()})
