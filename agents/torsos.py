"""Torsos: what turns one step's observation into features, and the frame stacking image torsos read.

Every torso here is time-major: inputs are [T, B, ...]; inference calls them with T = 1. agents/networks.py puts
a torso, an optional LSTM core and the heads together (`AgentBody`); agents/football_torsos.py builds Football's
torsos from the residual stack and the DQN torso below.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


def stack_frames(previous: torch.Tensor, observation: torch.Tensor, done: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Stacks each frame with the S - 1 before it, zeroing frames from an earlier episode.

    Args:
      previous: [B, S - 1, *frame], the frames before observation[0] (already zeroed across episodes).
      observation: [T, B, *frame].
      done: bool [T, B]; done[t] means observation[t] starts a new episode.
    Returns:
      stacked [T, B, S, *frame] (oldest first) and the new `previous` [B, S - 1, *frame].
    """
    history = previous.shape[1]
    if history == 0:
        return observation.unsqueeze(2), previous
    time_steps, batch = done.shape
    sequence = torch.cat([previous.transpose(0, 1), observation], dim=0)  # [S - 1 + T, B, *frame]
    starts = torch.cat([torch.zeros(history, batch, dtype=torch.long, device=done.device), done.long()], dim=0)
    episode = starts.cumsum(0)  # frame j belongs to output t's episode iff episode[j] == episode[t + S - 1]
    frame_dims = (1,) * (observation.dim() - 2)
    current = episode[history:]  # [T, B]
    slots = []
    for k in range(history + 1):
        same = (episode[k:k + time_steps] == current).view(time_steps, batch, *frame_dims)
        slots.append(sequence[k:k + time_steps] * same.to(sequence.dtype))
    stacked = torch.stack(slots, dim=2)
    last = stacked[-1]  # [B, S, *frame]: the newest stack, already zeroed across episodes
    return stacked, last[:, 1:].contiguous()


def _scaled_input(observation: torch.Tensor) -> torch.Tensor:
    if observation.dtype == torch.uint8:
        return observation.float() / 255.0
    return observation.float()


def conv_on_frames(conv: nn.Conv2d, frames: torch.Tensor) -> torch.Tensor:
    """conv(frames scaled to [0, 1]) for uint8 frames [N, C, H, W], without the scaling pass over the input.

    The 1/255 is folded into the kernel (conv is linear: conv(x / 255, W) = conv(x, W / 255)), so the frames are
    only converted to float. On a CPU learner the division was 14% of an R2D2 training step on Pong (a pass over
    [T x B, 4, 84, 84] floats per forward; docs/performance/README.md). Parameters and checkpoints are unchanged.
    """
    if frames.dtype != torch.uint8:
        return conv(frames.float())
    return F.conv2d(frames.float(), conv.weight * (1.0 / 255.0), conv.bias, conv.stride, conv.padding,
                    conv.dilation, conv.groups)


class MLPTorso(nn.Module):
    """Flattened vector observation [N, D] -> MLP features [N, sizes[-1]], ReLU (or `activation`) after each layer
    (the Box actor-critic's MLPs use tanh, as CleanRL's and SEED's MuJoCo networks)."""

    def __init__(self, input_size: int, sizes: tuple[int, ...], activation: type[nn.Module] = nn.ReLU):
        super().__init__()
        layers, last = [], input_size
        for size in sizes:
            layers += [nn.Linear(last, size), activation()]
            last = size
        self.layers = nn.Sequential(*layers)
        self.output_size = last

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.layers(_scaled_input(observation).flatten(1))


class _ConvFcTorso(nn.Module):
    """Valid convolutions with ReLU, then fc ReLU. `layers` = (filters, kernel, stride) per convolution;
    `width` multiplies the filters. Input [N, C, H, W] (uint8 frames scaled to [0, 1]); output [N, fc_size]."""

    LAYERS: tuple[tuple[int, int, int], ...] = ()

    def __init__(self, in_channels: int, frame_shape: tuple[int, int], width: int = 1, fc_size: int = 512):
        super().__init__()
        convs, last = [], in_channels
        for filters, kernel, stride in self.LAYERS:
            convs += [nn.Conv2d(last, filters * width, kernel, stride=stride), nn.ReLU()]
            last = filters * width
        self.convs = nn.Sequential(*convs)
        with torch.no_grad():
            flat = self.convs(torch.zeros(1, in_channels, *frame_shape)).numel()
        self.fc = nn.Linear(flat, fc_size)
        self.output_size = fc_size

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        first, rest = self.convs[0], self.convs[1:]
        return F.relu(self.fc(rest(conv_on_frames(first, observation)).flatten(1)))


class NatureDQNTorso(_ConvFcTorso):
    """Nature DQN convolutions (32 8x8/4, 64 4x4/2, 64 3x3/1, valid, ReLU) then fc 512 ReLU: [N, C, H, W] ->
    [N, 512]. About 9.4M multiply-adds per 84 x 84 x 4 input."""

    LAYERS = ((32, 8, 4), (64, 4, 2), (64, 3, 1))


class SmallDQNTorso(_ConvFcTorso):
    """The 2013 DQN torso (Mnih et al., "Playing Atari with Deep RL"): 16 8x8/4, 32 4x4/2 (valid, ReLU), fc 256:
    [N, C, H, W] -> [N, fc_size]. About a third of the Nature torso's multiply-adds (3.0M per 84 x 84 x 4
    input): the network a 2-core CPU learner trains Atari with."""

    LAYERS = ((16, 8, 4), (32, 4, 2))

    def __init__(self, in_channels: int, frame_shape: tuple[int, int], width: int = 1, fc_size: int = 256):
        super().__init__(in_channels, frame_shape, width, fc_size)


class MinAtarTorso(nn.Module):
    """The MinAtar paper's network body (Young & Tian 2019): one 3x3 convolution with 16 filters, stride 1, valid
    (10 x 10 -> 8 x 8), ReLU, then fc 128 ReLU. About 0.17M multiply-adds per 10 x 10 x 4 state.

    Input: MinAtar states [N, 10, 10, C] (channel last, as the env sends them), or [N, S, 10, 10, C] with a frame
    stack of S (the S x C planes become the input channels); bool or 0/1 values, read as 0/1 floats (no 1/255
    scaling: they are not pixels). Output [N, 128]. PyTorch's default init, as the paper's code.
    """

    def __init__(self, frame_shape: tuple[int, int, int], frame_stack: int = 1, filters: int = 16,
                 fc_size: int = 128):
        super().__init__()
        if len(frame_shape) != 3:
            raise ValueError(f"--network=minatar: needs [H, W, C] states, got observation shape {tuple(frame_shape)}")
        height, width, channels = frame_shape
        self.frame_shape = tuple(frame_shape)
        self.conv = nn.Conv2d(channels * frame_stack, filters, 3, stride=1)
        self.fc = nn.Linear(filters * (height - 2) * (width - 2), fc_size)
        self.output_size = fc_size

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        x = observation.float()
        if x.dim() == 5:  # [N, S, H, W, C] -> [N, S, C, H, W]; S x C planes
            x = x.permute(0, 1, 4, 2, 3).flatten(1, 2)
        else:  # [N, H, W, C] -> [N, C, H, W]
            x = x.permute(0, 3, 1, 2)
        return F.relu(self.fc(F.relu(self.conv(x)).flatten(1)))


class _ResidualBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(F.relu(self.conv0(F.relu(x))))


class ImpalaResidualStack(nn.Module):
    """IMPALA residual sections: per section a 3x3 conv, 3x3 max-pool stride 2, two residual blocks.

    Input [N, C, H, W] (uint8 frames are scaled to [0, 1] by the first convolution, `conv_on_frames`); output
    [N, channels[-1], H', W'] after a final ReLU.
    """

    def __init__(self, in_channels: int, channels: tuple[int, ...]):
        super().__init__()
        sections, last = [], in_channels
        for out in channels:
            sections += [nn.Conv2d(last, out, 3, padding=1), nn.MaxPool2d(3, stride=2, padding=1),
                         _ResidualBlock(out), _ResidualBlock(out)]
            last = out
        self.sections = nn.Sequential(*sections)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.sections[1:](conv_on_frames(self.sections[0], x)))


class ImpalaDeepTorso(nn.Module):
    """The IMPALA "deep" network torso: residual sections (16, 32, 32) x width, ReLU, fc 256 ReLU."""

    def __init__(self, in_channels: int, frame_shape: tuple[int, int], width: int = 1, fc_size: int = 256):
        super().__init__()
        self.stack = ImpalaResidualStack(in_channels, tuple(c * width for c in (16, 32, 32)))
        with torch.no_grad():
            flat = self.stack(torch.zeros(1, in_channels, *frame_shape)).numel()
        self.fc = nn.Linear(flat, fc_size)
        self.output_size = fc_size

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return F.relu(self.fc(self.stack(observation).flatten(1)))
