"""The inference forward pass of one batch: state gather, the agent's `act`, state scatter, results to host.

`EagerPolicy` runs it op by op (any device). `GraphedPolicy` captures it once per padded batch size as a
CUDA graph and replays it: one launch instead of ~50 kernel launches and their Python, which is what an
inference step costs on a GPU. Batches are padded to a power-of-two number of actors (at most the number of
actors); padded rows use the state table's scratch row, so they never touch a real env.

Both take host tensors (pinned on GPUs), copy them to the device once, and copy actions and outputs back once,
synchronising only on that copy. Captures, replays and eager steps on a GPU take the process's graph lock
(seed/runtime/cuda_graphs.py): the training thread captures and replays graphs too (MuZero's reanalysis). An eager
step on the CPU launches no CUDA work and draws from the CPU generator, so it takes no hold (the hold was 3.8 us of
every inference batch; docs/performance/cpu/hot_path_ab/).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import torch

from seed.contracts import InferenceBatch, State
from seed.inference.state_table import StateTable
from seed.runtime.cuda_graphs import capture_graph, graph_use

PolicyResult = tuple[torch.Tensor, dict[str, torch.Tensor], State]
"""(actions int64 [B] (Box: float32 [B, D]) on the host, outputs {name: [B, ...]} on the host, state before the
step [B, ...] on the device)."""


class _HostResults:
    """Pinned host buffers the device results are copied into (allocated on first use, `rows` long)."""

    def __init__(self, rows: int, pin: bool):
        self.rows, self.pin = rows, pin
        self._buffers: dict[str, torch.Tensor] = {}

    def copy(self, name: str, value: torch.Tensor) -> torch.Tensor:
        if value.device.type == "cpu":
            return value
        buffer = self._buffers.get(name)
        if buffer is None:
            buffer = self._buffers[name] = torch.empty((self.rows, *value.shape[1:]), dtype=value.dtype,
                                                       pin_memory=self.pin)
        return buffer[:len(value)].copy_(value, non_blocking=True)


def _run_act(agent: Any, network: torch.nn.Module, table: StateTable, batch: InferenceBatch
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor], State]:
    state = table.gather(batch.env_ids)
    out = agent.act(network, batch, state)
    table.scatter(batch.env_ids, out.state)
    return out.action, out.outputs, state


def _run_act_row_by_row(agent: Any, network: torch.nn.Module, table: StateTable, batch: InferenceBatch
                        ) -> tuple[torch.Tensor, dict[str, torch.Tensor], State]:
    """`_run_act` on one row at a time: each row's numbers are those of a batch of one, whatever the batch."""
    results = [_run_act(agent, network, table, InferenceBatch(**{f.name: getattr(batch, f.name)[i:i + 1]
                                                                  for f in dataclasses.fields(batch)}))
               for i in range(len(batch))]
    action = torch.cat([r[0] for r in results])
    outputs = {k: torch.cat([r[1][k] for r in results]) for k in results[0][1]}
    state = {k: torch.cat([r[2][k] for r in results]) for k in results[0][2]}
    return action, outputs, state


class EagerPolicy:
    """Args:
      row_by_row: run the agent on one row at a time (`--deterministic`): a row's result then depends on that
        row only, not on how many rows its batch had (matrix kernels may sum in another order for another
        batch size), so runs with different numbers of actors per batch agree bit for bit.
    """

    def __init__(self, agent: Any, network: torch.nn.Module, table: StateTable, device: torch.device,
                 row_by_row: bool = False):
        self.agent, self.network, self.table, self.device = agent, network, table, device
        self._results = _HostResults(table.num_envs + 1, device.type == "cuda")
        self._act = _run_act_row_by_row if row_by_row else _run_act

    def __call__(self, inputs: InferenceBatch) -> PolicyResult:
        cuda = self.device.type == "cuda"
        on_device = inputs.to(self.device, non_blocking=True) if cuda else inputs
        with torch.no_grad(), graph_use() if cuda else contextlib.nullcontext():
            # on a GPU the agent may draw random numbers: never during a capture
            action, outputs, state = self._act(self.agent, self.network, self.table, on_device)
        action = self._results.copy("action", action)
        outputs = {k: self._results.copy(k, v) for k, v in outputs.items()}
        if cuda:
            torch.cuda.current_stream(self.device).synchronize()
        return action, outputs, state


@dataclasses.dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: InferenceBatch  # static device buffers [rows, ...]
    action: torch.Tensor
    outputs: dict[str, torch.Tensor]
    state: State


class GraphedPolicy:
    """CUDA-graph replay of the inference step, one graph per padded batch size (captured on first use)."""

    def __init__(self, agent: Any, network: torch.nn.Module, table: StateTable, device: torch.device,
                 envs_per_actor: int):
        self.agent, self.network, self.table, self.device = agent, network, table, device
        self.k = envs_per_actor
        self.num_actors = table.num_envs // envs_per_actor
        self.graphs: dict[int, _Captured] = {}
        self._pool = None
        self._results = _HostResults(table.num_envs + 1, pin=True)
        self._env_ids = torch.empty(table.num_envs, dtype=torch.int64, pin_memory=True)

    def padded_rows(self, rows: int) -> int:
        actors = -(-rows // self.k)
        return min(1 << (actors - 1).bit_length(), self.num_actors) * self.k

    def _capture(self, rows: int, like: InferenceBatch) -> _Captured:
        device = self.device
        static = InferenceBatch(
            observation=torch.zeros((rows, *like.observation.shape[1:]), dtype=like.observation.dtype, device=device),
            env_ids=torch.full((rows,), self.table.scratch_row, dtype=torch.int64, device=device),
            prev_action=torch.zeros((rows, *like.prev_action.shape[1:]), dtype=like.prev_action.dtype,
                                    device=device),
            reward=torch.zeros(rows, dtype=torch.float32, device=device),
            done=torch.ones(rows, dtype=torch.bool, device=device))
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with graph_use(), torch.cuda.stream(side), torch.no_grad():
            for _ in range(2):  # warm-up outside the graph (lazy initialisation, cuDNN autotuning); scratch rows only
                _run_act(self.agent, self.network, self.table, static)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with capture_graph(graph, pool=self._pool):  # exclusive: no other thread replays or draws meanwhile
            action, outputs, state = _run_act(self.agent, self.network, self.table, static)
        self._pool = graph.pool()
        return _Captured(graph, static, action, outputs, state)

    def __call__(self, inputs: InferenceBatch) -> PolicyResult:
        rows = len(inputs.env_ids)
        padded = self.padded_rows(rows)
        captured = self.graphs.get(padded)
        if captured is None:
            captured = self.graphs[padded] = self._capture(padded, inputs)
        static = captured.inputs
        env_ids = self._env_ids[:padded]
        env_ids[:rows] = inputs.env_ids
        env_ids[rows:] = self.table.scratch_row
        static.env_ids.copy_(env_ids, non_blocking=True)
        for name in ("observation", "prev_action", "reward", "done"):
            getattr(static, name)[:rows].copy_(getattr(inputs, name), non_blocking=True)
        with graph_use():
            captured.graph.replay()
        action = self._results.copy("action", captured.action[:rows])
        outputs = {k: self._results.copy(k, v[:rows]) for k, v in captured.outputs.items()}
        torch.cuda.current_stream(self.device).synchronize()
        return action, outputs, {k: v[:rows] for k, v in captured.state.items()}
