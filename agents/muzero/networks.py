"""EfficientZero's model (Ye et al. 2021; SpeedyZero Table 5): representation, dynamics with the value-prefix
LSTM, prediction, and the SimSiam projection and predictor of the self-supervised consistency loss.

Two variants share one interface:
  MLP (vector observations, CartPole): latent [N, D].
  ResNet (image frames, Atari): EfficientZero's downsampling residual network, latent [N, C, H/16, W/16]; on
    MinAtar's 10 x 10 states the same network without downsampling, latent [N, C, 10, 10].

Every latent state is min-max normalised to [0, 1] per sample (MuZero's appendix), after the representation and
after every dynamics step. Values and value prefixes are categorical over the atoms -S..S of the transformed
value h(x) (agents/muzero/targets.py); the last layers of the value, value-prefix and policy heads start at zero
(EfficientZero's init): a new network predicts 0 and the uniform policy.

  initial_inference(observation)          -> latent, policy logits [N, A], value logits [N, 2 Sv + 1]
  recurrent_inference(latent, action, lstm_state)
                                          -> next latent, value-prefix logits [N, 2 Sr + 1], new lstm state,
                                             policy logits, value logits
  project(latent, with_predictor)         -> [N, P] (the consistency loss's vectors)
"""

from __future__ import annotations

import abc
import math

import torch
from torch import nn
from torch.nn import functional as F

from seed.agents.torsos import conv_on_frames

LstmState = tuple[torch.Tensor, torch.Tensor]


def normalize_latent(latent: torch.Tensor) -> torch.Tensor:
    """Min-max scaling of each sample's latent to [0, 1]: [N, ...] -> [N, ...], in the latent's memory format (a
    channels-last latent stays channels-last: no copy back to NCHW between two convolutions)."""
    dims = tuple(range(1, latent.dim()))
    low = latent.amin(dims, keepdim=True)
    high = latent.amax(dims, keepdim=True)
    return (latent - low) / (high - low).clamp(min=1e-5)


def _mlp(sizes: tuple[int, ...], activate_last: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or activate_last:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def _zero_last(module: nn.Module) -> None:
    last = [m for m in module.modules() if isinstance(m, nn.Linear)][-1]
    nn.init.zeros_(last.weight)
    nn.init.zeros_(last.bias)


class _ProjectionHead(nn.Module):
    """SimSiam (Chen & He 2021) as EfficientZero uses it: projection fc-BN-ReLU-fc-BN-ReLU-fc-BN, predictor
    fc-BN-ReLU-fc. The target branch is the projection alone, without gradient (the caller detaches)."""

    def __init__(self, input_size: int, hidden: int, output: int, predictor_hidden: int):
        super().__init__()
        self.projection = nn.Sequential(
            nn.Linear(input_size, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
            nn.Linear(hidden, output), nn.BatchNorm1d(output))
        self.predictor = nn.Sequential(
            nn.Linear(output, predictor_hidden), nn.BatchNorm1d(predictor_hidden), nn.ReLU(),
            nn.Linear(predictor_hidden, output))

    def forward(self, latent: torch.Tensor, with_predictor: bool) -> torch.Tensor:
        projected = self.projection(latent.flatten(1))
        return self.predictor(projected) if with_predictor else projected


class _ValuePrefixLSTM(nn.Module):
    """Latent after a dynamics step -> (value-prefix logits, new LSTM state): features, LSTM, BN, ReLU, fc, ReLU,
    fc over the reward support."""

    def __init__(self, feature_size: int, lstm_size: int, hidden: int, support: int, norm: bool):
        super().__init__()
        self.lstm = nn.LSTMCell(feature_size, lstm_size)
        self.norm = nn.BatchNorm1d(lstm_size) if norm else nn.Identity()
        self.head = nn.Sequential(nn.Linear(lstm_size, hidden), nn.BatchNorm1d(hidden) if norm else nn.Identity(),
                                  nn.ReLU(), nn.Linear(hidden, support))
        _zero_last(self.head)
        self.lstm_size = lstm_size

    def forward(self, features: torch.Tensor, state: LstmState) -> tuple[torch.Tensor, LstmState]:
        h, c = self.lstm(features, state)
        return self.head(F.relu(self.norm(h))), (h, c)


class MuZeroNetwork(nn.Module, abc.ABC):
    """The shared interface; subclasses build `representation`, `dynamics_core`, `prefix_features`,
    `prediction_core`, `value_head`, `policy_head`, `value_prefix` and `projection`."""

    num_actions: int
    lstm_size: int

    def initial_state_lstm(self, batch: int, device: torch.device) -> LstmState:
        zeros = torch.zeros(batch, self.lstm_size, device=device)
        return zeros, zeros.clone()

    @abc.abstractmethod
    def represent(self, observation: torch.Tensor) -> torch.Tensor:
        """Stacked observations [N, S, *frame] -> normalised latent."""

    @abc.abstractmethod
    def dynamics(self, latent: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """(latent, action int64 [N]) -> the next normalised latent."""

    @abc.abstractmethod
    def predict(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """latent -> (policy logits [N, A], value logits [N, 2 Sv + 1])."""

    def initial_inference(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        latent = self.represent(observation)
        policy, value = self.predict(latent)
        return latent, policy, value

    def recurrent_inference(self, latent: torch.Tensor, action: torch.Tensor, lstm_state: LstmState
                            ) -> tuple[torch.Tensor, torch.Tensor, LstmState, torch.Tensor, torch.Tensor]:
        next_latent = self.dynamics(latent, action)
        prefix_logits, lstm_state = self.value_prefix(self.prefix_features(next_latent), lstm_state)
        policy, value = self.predict(next_latent)
        return next_latent, prefix_logits, lstm_state, policy, value

    def project(self, latent: torch.Tensor, with_predictor: bool) -> torch.Tensor:
        return self.projection(latent, with_predictor)


class MLPMuZeroNetwork(MuZeroNetwork):
    """Vector observations: MLP representation, dynamics (latent + one-hot action -> latent) and heads.

    Args:
      observation_size: flattened stacked observation size.
      hidden: hidden layer sizes; latent_size: the latent state's dimension.
    """

    def __init__(self, observation_size: int, num_actions: int, hidden: tuple[int, ...], latent_size: int,
                 lstm_size: int, value_support: int, reward_support: int, projection_size: int = 128):
        super().__init__()
        self.num_actions = num_actions
        self.lstm_size = lstm_size
        self.representation = _mlp((observation_size, *hidden, latent_size), activate_last=False)
        self.dynamics_core = _mlp((latent_size + num_actions, *hidden, latent_size), activate_last=False)
        self.prefix_features = nn.Identity()
        self.value_prefix = _ValuePrefixLSTM(latent_size, lstm_size, hidden[-1], 2 * reward_support + 1, norm=False)
        self.value_head = _mlp((latent_size, hidden[-1], 2 * value_support + 1), activate_last=False)
        self.policy_head = _mlp((latent_size, hidden[-1], num_actions), activate_last=False)
        _zero_last(self.value_head)
        _zero_last(self.policy_head)
        self.projection = _ProjectionHead(latent_size, projection_size, projection_size, projection_size // 2)

    def represent(self, observation: torch.Tensor) -> torch.Tensor:
        return normalize_latent(self.representation(observation.float().flatten(1)))

    def dynamics(self, latent: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        one_hot = F.one_hot(action, self.num_actions).to(latent.dtype)
        return normalize_latent(self.dynamics_core(torch.cat([latent, one_hot], dim=-1)))

    def predict(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.policy_head(latent), self.value_head(latent)


class ResidualBlock(nn.Module):
    """conv-BN-ReLU-conv-BN + skip, ReLU (EfficientZero's block); with `stride` 2 a strided 3x3 conv on the skip
    downsamples and changes the channels."""

    def __init__(self, channels: int, out_channels: int | None = None, stride: int = 1):
        super().__init__()
        out_channels = out_channels or channels
        self.conv0 = nn.Conv2d(channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.norm0 = nn.BatchNorm2d(out_channels)
        self.conv1 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.norm1 = nn.BatchNorm2d(out_channels)
        self.skip = (nn.Conv2d(channels, out_channels, 3, stride=stride, padding=1, bias=False)
                     if stride != 1 or out_channels != channels else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.norm0(self.conv0(x)))
        out = self.norm1(self.conv1(out))
        return F.relu(out + (x if self.skip is None else self.skip(x)))


class ResNetMuZeroNetwork(MuZeroNetwork):
    """Frames [N, S, H, W] (uint8) or MinAtar states [N, S, H, W, C]: EfficientZero's network of SpeedyZero Table 5,
    with `channels` (64 there) and `blocks` (1) as parameters and each stacked grayscale frame one input plane.

    Representation: conv 3x3/2 (channels / 2) BN ReLU, residual block, residual downsample block /2 (channels),
    residual block, avg-pool /2, residual block, avg-pool /2, `blocks` residual blocks: [N, C, H/16, W/16] (6 x 6
    from 84 or 96). With `torso="nature"` the downsampling is the Nature DQN's three convolutions instead (32 8x8/4,
    64 4x4/2, `channels` 3x3/1, each BN ReLU; 7 x 7 from 84), about a quarter of the multiply-adds per frame, for
    CPU learners. With `torso="minatar"` the frames are MinAtar states [N, S, 10, 10, C] (bool, channel last; the
    S x C planes are the input) and nothing downsamples: conv 3x3/1 (channels) BN ReLU and a residual block, so
    with the `blocks` after it the latent is [N, channels, 10, 10].
    Dynamics: the latent with the action as a plane (a / A), conv 3x3 BN, + the latent, ReLU, `blocks` residual
    blocks. Prediction: `blocks` residual blocks, then per head conv 1x1 (16) BN ReLU, fc 32
    ReLU, fc. Value prefix: conv 1x1 (16) BN ReLU, LSTM, BN ReLU, fc 32 BN ReLU, fc.
    """

    def __init__(self, frame_shape: tuple[int, int], frame_stack: int, num_actions: int, channels: int,
                 blocks: int, lstm_size: int, value_support: int, reward_support: int, head_channels: int = 16,
                 head_hidden: int = 32, projection_size: int = 1024, predictor_hidden: int = 512,
                 torso: str = "resnet", channels_last: bool = True):
        super().__init__()
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.num_actions = num_actions
        self.lstm_size = lstm_size
        if torso == "resnet":
            half = channels // 2
            self.stem = nn.Conv2d(frame_stack, half, 3, stride=2, padding=1, bias=False)
            self.stem_norm = nn.BatchNorm2d(half)
            self.downsample = nn.Sequential(
                ResidualBlock(half), ResidualBlock(half, channels, stride=2), ResidualBlock(channels),
                nn.AvgPool2d(3, stride=2, padding=1), ResidualBlock(channels), nn.AvgPool2d(3, stride=2, padding=1))
        elif torso == "nature":
            self.stem = nn.Conv2d(frame_stack, 32, 8, stride=4, bias=False)
            self.stem_norm = nn.BatchNorm2d(32)
            self.downsample = nn.Sequential(
                nn.Conv2d(32, 64, 4, stride=2, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                nn.Conv2d(64, channels, 3, stride=1, bias=False), nn.BatchNorm2d(channels), nn.ReLU())
        elif torso == "minatar":  # MinAtar's 10 x 10 states keep their size: no downsampling
            self.stem = nn.Conv2d(frame_stack * frame_shape[-1], channels, 3, stride=1, padding=1, bias=False)
            self.stem_norm = nn.BatchNorm2d(channels)
            self.downsample = ResidualBlock(channels)
        else:
            raise ValueError(f"torso: got {torso!r}, expected resnet, nature or minatar")
        self.representation_blocks = nn.Sequential(*[ResidualBlock(channels) for _ in range(blocks)])
        self.dynamics_conv = nn.Conv2d(channels + 1, channels, 3, padding=1, bias=False)
        self.dynamics_norm = nn.BatchNorm2d(channels)
        self.dynamics_blocks = nn.Sequential(*[ResidualBlock(channels) for _ in range(blocks)])
        self.prediction_blocks = nn.Sequential(*[ResidualBlock(channels) for _ in range(blocks)])
        with torch.no_grad():
            latent_hw = self._downsampled(torch.zeros(1, frame_stack, *frame_shape)).shape[-2:]
        flat = head_channels * math.prod(latent_hw)

        def head(output: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(channels, head_channels, 1), nn.BatchNorm2d(head_channels), nn.ReLU(),
                                 nn.Flatten(), nn.Linear(flat, head_hidden), nn.ReLU(), nn.Linear(head_hidden, output))

        self.value_head = head(2 * value_support + 1)
        self.policy_head = head(num_actions)
        _zero_last(self.value_head)
        _zero_last(self.policy_head)
        self.prefix_features = nn.Sequential(nn.Conv2d(channels, head_channels, 1), nn.BatchNorm2d(head_channels),
                                             nn.ReLU(), nn.Flatten())
        self.value_prefix = _ValuePrefixLSTM(flat, lstm_size, head_hidden, 2 * reward_support + 1, norm=True)
        self.projection = _ProjectionHead(channels * math.prod(latent_hw), projection_size, projection_size,
                                          predictor_hidden)
        # Channels-last (NHWC) weights and inputs, so every convolution's output is channels-last too: oneDNN
        # reorders NCHW on every call, and on MinAtar's 16 x 10 x 10 latents the convolutions' share of an update
        # fell from 40% to 32% (docs/performance/cpu/muzero_update.md). The same values either way.
        self.to(memory_format=self.memory_format)

    def _downsampled(self, observation: torch.Tensor) -> torch.Tensor:
        if observation.dim() == 5:  # MinAtar states [N, S, H, W, C] -> S x C input planes [N, S C, H, W]
            observation = observation.permute(0, 1, 4, 2, 3).flatten(1, 2)
        observation = observation.contiguous(memory_format=self.memory_format)
        return self.downsample(F.relu(self.stem_norm(conv_on_frames(self.stem, observation))))

    def represent(self, observation: torch.Tensor) -> torch.Tensor:
        return normalize_latent(self.representation_blocks(self._downsampled(observation)))

    def dynamics(self, latent: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        plane = (action.to(latent.dtype) / self.num_actions).view(-1, 1, 1, 1).expand(-1, 1, *latent.shape[-2:])
        out = self.dynamics_norm(self.dynamics_conv(torch.cat([latent, plane], dim=1)))
        return normalize_latent(self.dynamics_blocks(F.relu(out + latent)))

    def predict(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.prediction_blocks(latent)
        return self.policy_head(features), self.value_head(features)
