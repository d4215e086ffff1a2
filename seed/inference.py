"""Central inference for one device: state tables in, actions out, steps into the unroll store.

`CentralInference.run_batch` is the learner's hot path. Per batch it does a fixed number of vectorised
tensor ops, whatever the number of envs: drop stale requests, concatenate the actors' rows, reset envs of
new actor runs, gather their state, run the agent's `act` under `torch.inference_mode`, scatter the new
state, append the step to the unroll store and answer each request with its slice of actions.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from seed.batcher import StaleRequest, StepRequest
from seed.state_table import StateTable
from seed.unroll import Unroll
from seed.unroll_store import UnrollStore
from seed.wire import to_torch


@dataclasses.dataclass
class InferenceBatch:
    """The agent's `act` input: B env rows on the inference device.

    Attributes:
      env_ids: int64 [B].
      observation: [B, *observation_shape], single frames as the actors sent them.
      reward: float32 [B], reward received on arriving at this step.
      done: bool [B], this step starts a new episode (reset the recurrent state and frame stack first).
      prev_action: int64 [B], the action taken at the previous step.
    """

    env_ids: torch.Tensor
    observation: torch.Tensor
    reward: torch.Tensor
    done: torch.Tensor
    prev_action: torch.Tensor


@dataclasses.dataclass
class ActOutput:
    """The agent's `act` result: actions int64 [B], outputs to store [B, ...], new state rows [B, ...]."""

    action: torch.Tensor
    outputs: dict[str, torch.Tensor]
    state: dict[str, torch.Tensor]


@dataclasses.dataclass
class FinishedEpisodes:
    """Episodes that ended in one batch, from the learner's state table (returns as the loss sees them)."""

    env_ids: np.ndarray  # int64 [E]
    returns: np.ndarray  # float64 [E]
    lengths: np.ndarray  # int64 [E], agent steps


class CentralInference:
    """Owns the state table and unroll store of one inference device.

    Args:
      agent: has `act(network, batch: InferenceBatch, state) -> ActOutput` and `initial_state(n)`.
      network: the inference copy of the agent's network on `device`.
      num_envs: rows in the state table (num_actors x envs_per_actor).
      registry: actor_index -> run_id of the actor's live run (written at handshake).
      sink: receives completed unrolls; may block (queue back-pressure).
      on_episodes: receives the episodes finished in each batch.
    """

    def __init__(self, agent: Any, network: torch.nn.Module, device: torch.device, num_envs: int,
                 unroll_length: int, burn_in: int, registry: dict[int, int],
                 sink: Callable[[list[Unroll]], None], on_episodes: Callable[[FinishedEpisodes], None],
                 on_batch: Callable[[int, list[float]], None]):
        self.agent = agent
        self.network = network
        self.device = device
        self.registry = registry
        self.state_table = StateTable(agent.initial_state, num_envs, device)
        self.unroll_store = UnrollStore(num_envs, unroll_length, burn_in)
        self.sink = sink
        self.on_episodes = on_episodes
        self.on_batch = on_batch
        self.parameter_lock = threading.Lock()

    def publish(self, parameters: dict[str, torch.Tensor]) -> None:
        """Copies new parameters (a state dict on any device) into the inference network."""
        with self.parameter_lock, torch.no_grad():
            for name, value in self.network.state_dict().items():
                value.copy_(parameters[name], non_blocking=True)

    def _live(self, requests: list[StepRequest]) -> list[StepRequest]:
        """Drops requests of replaced actor runs (restart while the batch was filling) and duplicates."""
        live, seen = [], set()
        for request in reversed(requests):  # newest first: a restarted actor's new request wins
            if self.registry.get(request.actor_index) != request.run_id or request.actor_index in seen:
                request.future.set_exception(StaleRequest(f"actor {request.actor_index} run {request.run_id} replaced"))
                continue
            seen.add(request.actor_index)
            live.append(request)
        return live[::-1]

    def run_batch(self, requests: list[StepRequest]) -> None:
        requests = self._live(requests)
        if not requests:
            return
        table = self.state_table
        first_contact = []
        for request in requests:
            is_new = not table.is_current(request.first_env_id, request.run_id)
            if is_new:  # first contact of these env ids, or their actor restarted: fresh rows
                new_ids = torch.arange(request.first_env_id, request.first_env_id + request.num_envs)
                table.reset(new_ids, request.run_id)
                self.unroll_store.reset(new_ids)
            first_contact.append(np.full(request.num_envs, is_new))
        first = np.concatenate(first_contact)
        env_ids = np.concatenate([np.arange(r.first_env_id, r.first_env_id + r.num_envs) for r in requests])
        reward = np.concatenate([r.reward for r in requests])
        reward[first] = 0.0
        done = np.concatenate([r.done for r in requests]) | first
        truncated = np.concatenate([r.truncated for r in requests]) & ~first
        observation = np.concatenate([r.observation for r in requests])
        self._count_episodes(env_ids, reward, done & ~first)

        device = self.device
        env_ids_t = torch.from_numpy(env_ids)
        batch = InferenceBatch(
            env_ids=env_ids_t.to(device),
            observation=to_torch(observation).to(device),
            reward=torch.from_numpy(reward).to(device),
            done=torch.from_numpy(done).to(device),
            prev_action=table.prev_action.index_select(0, env_ids_t.to(device)),
        )
        state = table.gather(batch.env_ids)
        with self.parameter_lock, torch.inference_mode():
            out = self.agent.act(self.network, batch, state)
        table.scatter(batch.env_ids, out.state)
        table.prev_action.index_copy_(0, batch.env_ids, out.action)
        action_host = out.action.cpu()

        step = {
            "observation": to_torch(observation),
            "reward": torch.from_numpy(reward),
            "done": torch.from_numpy(done),
            "truncated": torch.from_numpy(truncated),
            "prev_action": batch.prev_action,
            "action": action_host,
            **out.outputs,
        }
        completed = self.unroll_store.append(env_ids_t, step, state)

        actions = action_host.numpy()
        now = time.monotonic()
        offset = 0
        for request in requests:
            request.future.set_result(actions[offset:offset + request.num_envs])
            offset += request.num_envs
        self.on_batch(len(env_ids), [now - r.arrival_time for r in requests])
        if completed:
            self.sink(completed)  # may block: back-pressure from the training side

    def _count_episodes(self, env_ids: np.ndarray, reward: np.ndarray, ended: np.ndarray) -> None:
        table = self.state_table
        table.episode_return[env_ids] += reward
        table.episode_length[env_ids] += 1
        if ended.any():
            ids = env_ids[ended]
            # The step that reports done opens the new episode: it counts as the new episode's first step.
            self.on_episodes(FinishedEpisodes(ids, table.episode_return[ids].copy(), table.episode_length[ids] - 1))
            table.episode_return[ids] = 0.0
            table.episode_length[ids] = 1
