"""Learner-side torso for `--env=football:*`: unpacks the bit-packed SMM and runs an IMPALA residual stack.

Input: packed observations uint16 [..., H, W] (see `seed.envs.football.pack_smm`), or the same bits as int16,
which is how the learner stores them.
Output: features float32 [..., 256].
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from seed.envs.football import NUM_PLANES, unpack_smm

SECTION_CHANNELS = (16, 32, 32, 32)
BLOCKS_PER_SECTION = 2


class _ResidualBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(F.relu(self.conv0(F.relu(x))))


class _Section(nn.Module):
    """3x3 conv, 3x3 max-pool with stride 2, then residual blocks; halves H and W (rounding up)."""

    def __init__(self, in_channels: int, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, channels, 3, padding=1)
        self.blocks = nn.Sequential(*[_ResidualBlock(channels) for _ in range(BLOCKS_PER_SECTION)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(self.conv(x), kernel_size=3, stride=2, padding=1)
        return self.blocks(x)


class FootballTorso(nn.Module):
    """IMPALA-style residual torso over unpacked SMM planes; `output_size` features per observation."""

    output_size = 256

    def __init__(self, observation_shape: tuple[int, int], width_multiplier: int = 1):
        super().__init__()
        if len(observation_shape) != 2:
            raise ValueError(f"observation_shape: got {tuple(observation_shape)}, expected (H, W)")
        if width_multiplier < 1:
            raise ValueError(f"width_multiplier: got {width_multiplier}, expected >= 1")
        self.observation_shape = tuple(int(n) for n in observation_shape)
        height, width = self.observation_shape
        sections = []
        in_channels = NUM_PLANES
        for channels in SECTION_CHANNELS:
            channels *= width_multiplier
            sections.append(_Section(in_channels, channels))
            in_channels = channels
            # max-pool(3, stride 2, padding 1) output size
            height, width = (height - 1) // 2 + 1, (width - 1) // 2 + 1
        self.sections = nn.Sequential(*sections)
        self.fc = nn.Linear(in_channels * height * width, self.output_size)

    def forward(self, packed: torch.Tensor) -> torch.Tensor:
        if tuple(packed.shape[-2:]) != self.observation_shape:
            raise ValueError(f"FootballTorso: got input of shape {tuple(packed.shape)}, expected [..., H, W] = "
                             f"[..., {self.observation_shape[0]}, {self.observation_shape[1]}]")
        leading = packed.shape[:-2]
        x = unpack_smm(packed.reshape((-1,) + self.observation_shape))  # [N, 16, H, W]
        x = self.sections(x)
        x = F.relu(x).flatten(1)
        x = F.relu(self.fc(x))
        return x.reshape(leading + (self.output_size,))
