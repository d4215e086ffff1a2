"""SAC's networks: a tanh-normal actor and twin Q critics, MLPs over flat observations (CleanRL's
sac_continuous_action: 2 hidden layers of 256 ReLU units each, the log-std squashed into [-5, 2]).

Every module takes leading dimensions [..., *] (time-major [T, B] in the loss, [B] at inference) and works on the
last one. SACNetworks is the agent's trained `network`: inference runs a copy of it (the actor only), the
training process trains all of it, and its `updates` buffer (published with the parameters) tells inference
whether training has started.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from seed.agents.distributions import TanhNormal
from seed.envs.base import EnvSpec

# CleanRL's (from SpinUp / Denis Yarats): the actor's log-std head is tanh-squashed into this range.
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


def mlp(input_size: int, hidden_sizes: tuple[int, ...], output_size: int) -> nn.Sequential:
    """Linear + ReLU per hidden size, then a linear output layer (PyTorch's default initialisation, as CleanRL)."""
    layers: list[nn.Module] = []
    for size in hidden_sizes:
        layers += [nn.Linear(input_size, size), nn.ReLU()]
        input_size = size
    layers.append(nn.Linear(input_size, output_size))
    return nn.Sequential(*layers)


class Actor(nn.Module):
    """obs [..., O] -> (mean [..., D], log_std [..., D]) of a TanhNormal over the env's Box [low, high]
    (agents/distributions.py); log_std = -5 + 3.5 (tanh(x) + 1), in [-5, 2]."""

    def __init__(self, observation_size: int, action_low: tuple[float, ...], action_high: tuple[float, ...],
                 hidden_sizes: tuple[int, ...]):
        super().__init__()
        dims = len(action_low)
        self.torso = mlp(observation_size, hidden_sizes[:-1], hidden_sizes[-1])
        self.mean = nn.Linear(hidden_sizes[-1], dims)
        self.log_std = nn.Linear(hidden_sizes[-1], dims)
        self.register_buffer("action_low", torch.tensor(action_low, dtype=torch.float32))
        self.register_buffer("action_high", torch.tensor(action_high, dtype=torch.float32))

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = torch.relu(self.torso(observation))
        log_std = torch.tanh(self.log_std(features))
        return self.mean(features), LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1.0)

    def distribution(self, observation: torch.Tensor) -> TanhNormal:
        """The policy pi(.|s) at observations [..., O]."""
        mean, log_std = self(observation)
        return TanhNormal(mean, log_std, self.action_low, self.action_high)


class TwinQ(nn.Module):
    """Two independent critics: (obs [..., O], action [..., D]) -> (Q1 [...], Q2 [...]), each an MLP over the
    concatenated observation and action."""

    def __init__(self, observation_size: int, action_size: int, hidden_sizes: tuple[int, ...]):
        super().__init__()
        self.q1 = mlp(observation_size + action_size, hidden_sizes, 1)
        self.q2 = mlp(observation_size + action_size, hidden_sizes, 1)

    def forward(self, observation: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([observation, action], -1)
        return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)


class SACNetworks(nn.Module):
    """The actor, the twin critics, the temperature's log alpha and the count of updates made.

    Attributes:
      actor: Actor; critic: TwinQ.
      log_alpha: float32 [] parameter, alpha = exp(log_alpha) (starts at log(initial_alpha); CleanRL: alpha 1).
      updates: int64 [] buffer, the SAC updates made; inference acts uniformly at random while it is 0.
    """

    def __init__(self, spec: EnvSpec, hidden_sizes: tuple[int, ...], initial_alpha: float = 1.0):
        super().__init__()
        observation_size = math.prod(spec.observation_shape)
        self.actor = Actor(observation_size, spec.action_low, spec.action_high, hidden_sizes)
        self.critic = TwinQ(observation_size, spec.action_shape[0], hidden_sizes)
        self.log_alpha = nn.Parameter(torch.tensor(math.log(initial_alpha), dtype=torch.float32))
        self.register_buffer("updates", torch.zeros((), dtype=torch.int64))

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The actor's (mean, log_std) at observations [..., O] (what inference runs)."""
        return self.actor(observation)
