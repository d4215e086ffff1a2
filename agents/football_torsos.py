"""Learner-side torso for `--env=football:*`: unpacks the bit-packed SMM and runs an IMPALA residual stack.

Input: packed observations uint16 [..., H, W] (see `seed.envs.football.pack_smm`), or the same bits as int16,
which is how the learner stores them.
Output: features float32 [..., 256].
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from seed.agents.torsos import ImpalaResidualStack, SmallDQNTorso
from seed.envs.football import NUM_PLANES, unpack_smm

SECTION_CHANNELS = (16, 32, 32, 32)


class FootballTorso(nn.Module):
    """SEED's Football network torso: the IMPALA residual stack with 4 sections (16, 32, 32, 32) x width over
    the unpacked SMM planes, then ReLU and fc 256 ReLU; `output_size` features per observation."""

    output_size = 256

    def __init__(self, observation_shape: tuple[int, int], width_multiplier: int = 1):
        super().__init__()
        if len(observation_shape) != 2:
            raise ValueError(f"observation_shape: got {tuple(observation_shape)}, expected (H, W)")
        if width_multiplier < 1:
            raise ValueError(f"width_multiplier: got {width_multiplier}, expected >= 1")
        self.observation_shape = tuple(int(n) for n in observation_shape)
        self.stack = ImpalaResidualStack(NUM_PLANES, tuple(c * width_multiplier for c in SECTION_CHANNELS))
        with torch.no_grad():
            flat = self.stack(torch.zeros(1, NUM_PLANES, *self.observation_shape)).numel()
        self.fc = nn.Linear(flat, self.output_size)

    def forward(self, packed: torch.Tensor) -> torch.Tensor:
        if tuple(packed.shape[-2:]) != self.observation_shape:
            raise ValueError(f"FootballTorso: got input of shape {tuple(packed.shape)}, expected [..., H, W] = "
                             f"[..., {self.observation_shape[0]}, {self.observation_shape[1]}]")
        leading = packed.shape[:-2]
        x = unpack_smm(packed.reshape((-1,) + self.observation_shape))  # [N, 16, H, W]
        x = F.relu(self.fc(self.stack(x).flatten(1)))
        return x.reshape(leading + (self.output_size,))


class SmallFootballTorso(nn.Module):
    """`--network=football_small`: the unpacked SMM planes through the 2013 DQN torso (16 8x8/4, 32 4x4/2,
    fc 256): about a seventh of the IMPALA stack's multiply-adds on the 72 x 96 map, for CPU learners.
    Input packed [..., H, W]; output float32 [..., 256]."""

    output_size = 256

    def __init__(self, observation_shape: tuple[int, int], width_multiplier: int = 1):
        super().__init__()
        if len(observation_shape) != 2:
            raise ValueError(f"observation_shape: got {tuple(observation_shape)}, expected (H, W)")
        self.observation_shape = tuple(int(n) for n in observation_shape)
        self.torso = SmallDQNTorso(NUM_PLANES, self.observation_shape, width_multiplier, self.output_size)

    def forward(self, packed: torch.Tensor) -> torch.Tensor:
        leading = packed.shape[:-2]
        x = self.torso(unpack_smm(packed.reshape((-1,) + self.observation_shape)))
        return x.reshape(leading + (self.output_size,))
