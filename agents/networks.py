"""Network parts shared by the agents: the body (torso, LSTM core, heads), the resetting LSTM core, initialisers.
The torsos and frame stacking live in agents/torsos.py (Football's in agents/football_torsos.py).

Every network here is time-major: inputs are [T, B, ...]; inference calls them with T = 1. Per-env state is
a dict of tensors [B, ...] (the rows of the learner's state table):

  frames  uint8 [B, S - 1, *frame]   the last S - 1 frames (only when the env stacks S > 1 frames)
  lstm_h, lstm_c  float32 [B, H]     the LSTM core state (only with an LSTM)

`done[t]` means observation t is the first of a new episode: the frame stack and the LSTM state are reset
before step t is processed.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from seed.agents.torsos import (
    ImpalaDeepTorso,
    MinAtarTorso,
    MLPTorso,
    NatureDQNTorso,
    SmallDQNTorso,
    stack_frames,
)
from seed.contracts import State
from seed.contracts.storage import torch_dtype
from seed.envs.base import EnvSpec


def resolve_network(spec: EnvSpec, requested: str, image_default: str) -> str:
    """The torso to build: `requested`, or for "auto" an MLP on vector observations and `image_default` on images."""
    if requested != "auto":
        return requested
    return "mlp" if len(spec.observation_shape) == 1 else image_default


class ResettingLSTM(nn.Module):
    """An LSTM cell unrolled over time whose state is zeroed before every step with done set.

    forward(x [T, B, I], done bool [T, B], (h, c) [B, H] each) -> outputs [T, B, H], (h, c).
    """

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.cell = nn.LSTMCell(input_size, hidden_size)
        self.hidden_size = hidden_size

    def forward(self, x: torch.Tensor, done: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        h, c = state
        keep = (~done).unsqueeze(-1).to(x.dtype)
        outputs = []
        for t in range(x.shape[0]):
            h, c = self.cell(x[t], (h * keep[t], c * keep[t]))
            outputs.append(h)
        return torch.stack(outputs), (h, c)


# The plain conv torsos, where PyTorch's default (and Glorot) init leaves Atari features nearly constant (see
# orthogonal_init_); the MLP (CartPole's defaults were tuned with the default init) and the residual torsos keep
# their default. Every agent initialises these torsos orthogonally.
ORTHOGONAL_INIT_NETWORKS = ("nature", "dqn_small", "football_small")


def orthogonal_init_(module: nn.Module, gain: float = math.sqrt(2.0)) -> None:
    """Orthogonal weights scaled by `gain` and zero biases for every linear and conv layer of `module`.

    With gain sqrt(2) a ReLU layer keeps the scale of its input. PyTorch's default init shrinks it layer by
    layer, and on Atari frames, where states differ by a few pixels, the torso's features then barely depend on
    the frame: measured on Pong (docs/learning/README.md), a supervised probe on the default-initialised
    2013 DQN torso gave the same output for every frame after 600 Adam steps, while the orthogonal one
    separated the classes.
    """
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.orthogonal_(m.weight, gain)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


def glorot_uniform_(module: nn.Module) -> None:
    """Glorot-uniform weights and zero biases for every linear, conv and LSTM layer (the paper's init)."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.xavier_uniform_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LSTMCell):
            nn.init.xavier_uniform_(m.weight_ih)
            nn.init.xavier_uniform_(m.weight_hh)
            nn.init.zeros_(m.bias_ih)
            nn.init.zeros_(m.bias_hh)


class AgentBody(nn.Module):
    """Torso + frame stacking + (one-hot previous action, reward) inputs + optional resetting LSTM.

    forward(observation [T, B, *obs], prev_action [T, B], reward [T, B], done [T, B], state)
      -> features [T, B, output_size], new state.

    Args:
      spec: the env spec (single-frame observation shape, frame stack, actions).
      network: "mlp", "nature", "dqn_small" or "impala_deep" (images), "football" / "football_small" (packed
        SMM planes), or "minatar" (MinAtar's [10, 10, C] states).
      width: filter multiplier for image torsos.
      use_lstm, lstm_size: the recurrent core.
      mlp_sizes: hidden sizes of the MLP torso.
      clip_reward_input: feed clip(reward, -1, 1) (IMPALA) instead of the raw reward (R2D2).
    """

    def __init__(self, spec: EnvSpec, network: str, width: int = 1, use_lstm: bool = True, lstm_size: int = 256,
                 mlp_sizes: tuple[int, ...] = (64, 64), clip_reward_input: bool = True):
        super().__init__()
        self.num_actions = spec.num_actions
        self.frame_shape = tuple(spec.observation_shape)
        self.frame_dtype = torch_dtype(spec.observation_dtype)
        self.history = spec.frame_stack - 1
        self.clip_reward_input = clip_reward_input
        self.torso = make_torso(spec, network, width, mlp_sizes)
        core_input = self.torso.output_size + self.num_actions + 1
        # The one-hot rows of the previous action, indexed: F.one_hot checks its input's range with two reductions
        # per call (25 us against 10 us for a batch of 128 on a 2-core VM). Not in the state dict.
        self.register_buffer("action_one_hot", torch.eye(self.num_actions), persistent=False)
        self.lstm = ResettingLSTM(core_input, lstm_size) if use_lstm else None
        self.output_size = lstm_size if use_lstm else core_input

    def initial_state(self, batch_size: int) -> State:
        state: State = {}
        if self.history:
            state["frames"] = torch.zeros((batch_size, self.history) + self.frame_shape, dtype=self.frame_dtype)
        if self.lstm is not None:
            state["lstm_h"] = torch.zeros(batch_size, self.lstm.hidden_size)
            state["lstm_c"] = torch.zeros(batch_size, self.lstm.hidden_size)
        return state

    def forward(self, observation: torch.Tensor, prev_action: torch.Tensor, reward: torch.Tensor,
                done: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        time_steps, batch = done.shape
        new_state: State = {}
        if self.history:
            # [T, B, S, H, W]: the S frames become the torso's input channels.
            observation, new_state["frames"] = stack_frames(state["frames"], observation, done)
        features = self.torso(observation.flatten(0, 1)).view(time_steps, batch, -1)
        if self.clip_reward_input:
            reward = reward.clamp(-1.0, 1.0)
        # The previous action is meaningless across an episode start: zero it there.
        one_hot = self.action_one_hot[prev_action].masked_fill_(done.unsqueeze(-1), 0.0).to(features.dtype)
        core_input = torch.cat([features, one_hot, reward.unsqueeze(-1).to(features.dtype)], dim=-1)
        if self.lstm is None:
            return core_input, new_state
        output, (h, c) = self.lstm(core_input, done, (state["lstm_h"], state["lstm_c"]))
        new_state["lstm_h"], new_state["lstm_c"] = h, c
        return output, new_state


def make_torso(spec: EnvSpec, network: str, width: int, mlp_sizes: tuple[int, ...]) -> nn.Module:
    """The torso for `network`, sized for the env's observation (frames stacked as channels)."""
    shape = tuple(spec.observation_shape)
    if network == "mlp":
        return MLPTorso(math.prod(shape) * spec.frame_stack, mlp_sizes)
    if network == "football":
        from seed.agents.football_torsos import FootballTorso

        return FootballTorso(shape, width)
    if network == "football_small":
        from seed.agents.football_torsos import SmallFootballTorso

        return SmallFootballTorso(shape, width)
    if network == "minatar":
        return MinAtarTorso(shape, spec.frame_stack)
    if len(shape) not in (2, 3):
        raise ValueError(f"--network={network}: needs image observations [H, W] or [H, W, C], got shape {shape}")
    if len(shape) == 3:
        raise ValueError(f"--network={network}: multi-channel frames {shape} are not supported; send [H, W] frames")
    if network == "nature":
        return NatureDQNTorso(spec.frame_stack, shape, width)
    if network == "dqn_small":
        return SmallDQNTorso(spec.frame_stack, shape, width)
    if network == "impala_deep":
        return ImpalaDeepTorso(spec.frame_stack, shape, width)
    raise ValueError(f"--network: got {network!r}, expected mlp, nature, dqn_small, impala_deep, football, "
                     "football_small or minatar")
