"""Per-env state on the inference device: one row per env id.

Holds the agent's state (recurrent core state, frame stack: whatever `initial_state` returns) and the previous
action on the inference device, where the network reads them. The bookkeeping the network never reads (the
actor run id that owns the row, the running episode return and length) stays in host memory, so that
checking run ids and logging episodes never waits on the device.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

State = dict[str, torch.Tensor]


class StateTable:
    """Rows [num_envs, ...] gathered and scattered by env id in single vectorised ops.

    Args:
      initial_state: n -> State with tensors [n, ...], the agent's zero state.
      num_envs: rows in the table (total envs over all actors).
      device: the inference device.
    """

    def __init__(self, initial_state: Callable[[int], State], num_envs: int, device: torch.device):
        self.num_envs = num_envs
        self.device = device
        self._initial_state = initial_state
        self.agent_state = {k: v.to(device) for k, v in initial_state(num_envs).items()}
        self.prev_action = torch.zeros(num_envs, dtype=torch.int64, device=device)
        self.episode_return = np.zeros(num_envs, np.float64)
        self.episode_length = np.zeros(num_envs, np.int64)
        self.run_id = np.zeros(num_envs, np.int64)
        self.connected = np.zeros(num_envs, bool)

    def gather(self, env_ids: torch.Tensor) -> State:
        return {k: v.index_select(0, env_ids) for k, v in self.agent_state.items()}

    def scatter(self, env_ids: torch.Tensor, rows: State) -> None:
        for k, v in rows.items():
            self.agent_state[k].index_copy_(0, env_ids, v)

    def reset(self, env_ids: torch.Tensor, run_id: int) -> None:
        """Fresh rows for envs of a new actor run: zero state, action, episode stats."""
        device_ids = env_ids.to(self.device)
        zero = {k: v.to(self.device) for k, v in self._initial_state(len(env_ids)).items()}
        self.scatter(device_ids, zero)
        self.prev_action[device_ids] = 0
        host_ids = env_ids.cpu().numpy()
        self.episode_return[host_ids] = 0
        self.episode_length[host_ids] = 0
        self.run_id[host_ids] = run_id
        self.connected[host_ids] = True

    def is_current(self, first_env_id: int, run_id: int) -> bool:
        """Whether the rows starting at `first_env_id` already belong to actor run `run_id`."""
        return bool(self.connected[first_env_id]) and int(self.run_id[first_env_id]) == run_id
