"""A MuZero search replayed as one CUDA graph: the representation call, every simulation and the outcome.

    graphed = GraphedSearch(agent_search)            # agent_search(network, stacked, evaluate) -> SearchOutput
    out = graphed(network, stacked, evaluate)        # eager on the first call of a shape, then replays

On a GPU an eager search is launch-bound: each simulation is a few hundred small kernels (the descent steps, the
backup of every depth, the refresh of the selection caches) around one recurrent call, at about 3.3 ms per
simulation on an H200 for 16 trees. A graph launches them all at once. The search is written to be capturable:
nothing in it reads back to the host, and while a capture runs `DepthBound` fixes the descent of simulation k at k
steps (search/__init__.py).

One graph per (network, stacked shape and dtype), captured on the first call of that shape after a warm-up on a side
stream (lazy initialisation, cuDNN's algorithm choice). A graph reads the network's parameters where they are: the
network must be updated in place (`load_state_dict`, optimizer steps), as the agent's target network is. Random
draws (root noise, Gumbel noise, sampled actions) come from the device's default generator, which graphs advance
on every replay: captures and replays take the process's graph lock (seed/runtime/cuda_graphs.py), as every graph
of the framework does, so a capture in one thread never meets a replay or a random draw in another.

The framework captures the agent's `act` the same way (seed/inference/forward_pass.py, --cuda_graphs); this class
is for the searches it does not capture: reanalysis in the training process.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from seed.runtime.cuda_graphs import capture_graph, graph_use

# (network, stacked observations [B, S, *frame], evaluate [B] bool) -> the search's SearchOutput
SearchFunction = Callable[[nn.Module, torch.Tensor, torch.Tensor], Any]


@dataclasses.dataclass
class _Captured:
    network: nn.Module  # held so that its id is not reused while the graph lives
    graph: torch.cuda.CUDAGraph
    stacked: torch.Tensor  # static input [B, S, *frame]
    evaluate: torch.Tensor  # static input [B] bool
    output: Any  # the SearchOutput the graph writes


class GraphedSearch:
    """`search_fn` on CUDA tensors as CUDA-graph replays (see the module docstring); any other device runs it
    eagerly."""

    def __init__(self, search_fn: SearchFunction):
        self.search_fn = search_fn
        self.graphs: dict[tuple[Any, ...], _Captured] = {}
        self._pool = None

    def __call__(self, network: nn.Module, stacked: torch.Tensor, evaluate: torch.Tensor) -> Any:
        if not stacked.is_cuda:
            return self.search_fn(network, stacked, evaluate)
        key = (id(network), tuple(stacked.shape), stacked.dtype)
        captured = self.graphs.get(key)
        if captured is None or captured.network is not network:
            captured = self.graphs[key] = self._capture(network, stacked, evaluate)
        with graph_use():
            captured.stacked.copy_(stacked)
            captured.evaluate.copy_(evaluate)
            captured.graph.replay()
            out = captured.output
            # the graph's outputs are overwritten by the next replay: the caller gets copies (the tree stays static)
            return dataclasses.replace(out, action=out.action.clone(), action_weights=out.action_weights.clone(),
                                       root_value=out.root_value.clone(), visit_counts=out.visit_counts.clone())

    def _capture(self, network: nn.Module, stacked: torch.Tensor, evaluate: torch.Tensor) -> _Captured:
        static_stacked, static_evaluate = stacked.clone(), evaluate.clone()
        device = stacked.device
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with graph_use(), torch.cuda.stream(side), torch.no_grad():
            for _ in range(2):  # warm-up outside the graph (draws random numbers: a shared hold)
                self.search_fn(network, static_stacked, static_evaluate)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with capture_graph(graph, pool=self._pool):  # exclusive: no other thread replays or draws meanwhile
            output = self.search_fn(network, static_stacked, static_evaluate)
        self._pool = graph.pool()
        return _Captured(network, graph, static_stacked, static_evaluate, output)
