"""Per-env state on the inference device: one row per env id, plus one scratch row.

Holds the agent's state (recurrent core state, frame stack: whatever `initial_state` returns) on the
inference device, where the network reads it. The bookkeeping the network never reads (the running episode
return and length) stays in host memory, so logging episodes never waits on the device.

Row `num_envs` is scratch: padded rows of a fixed-size (CUDA-graph) batch gather from and scatter to it, so
padding never touches a real env's state.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from seed.contracts import State


class StateTable:
    """Rows [num_envs + 1, ...] gathered and scattered by env id in single vectorised ops.

    Args:
      initial_state: n -> State with tensors [n, ...], the agent's zero state.
      num_envs: real rows in the table (total envs over all actors); row num_envs is scratch.
      device: the inference device.
    """

    def __init__(self, initial_state: Callable[[int], State], num_envs: int, device: torch.device):
        self.num_envs = num_envs
        self.scratch_row = num_envs
        self.device = device
        self._initial_state = initial_state
        self.agent_state = {k: v.to(device) for k, v in initial_state(num_envs + 1).items()}
        self.episode_return = np.zeros(num_envs, np.float64)
        self.episode_length = np.zeros(num_envs, np.int64)

    def gather(self, env_ids: torch.Tensor) -> State:
        return {k: v.index_select(0, env_ids) for k, v in self.agent_state.items()}

    def scatter(self, env_ids: torch.Tensor, rows: State) -> None:
        for k, v in rows.items():
            self.agent_state[k].index_copy_(0, env_ids, v)

    def reset(self, env_ids: np.ndarray) -> None:
        """Fresh rows for envs of a new actor run: zero state and episode stats."""
        device_ids = torch.from_numpy(env_ids).to(self.device)
        for v in self.agent_state.values():
            v.index_fill_(0, device_ids, 0)
        self.episode_return[env_ids] = 0
        self.episode_length[env_ids] = 0
