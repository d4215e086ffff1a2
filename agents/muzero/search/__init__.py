"""Batched MuZero / Gumbel MuZero tree search: B trees as tensors on the inference device.

    from seed.agents.muzero.search import RootInput, RecurrentOutput, SearchConfig, search
    out = search(RootInput(prior_logits, value, embedding), recurrent_fn, SearchConfig(num_simulations=50),
                 temperature=1.0, generator=generator, invalid_actions=invalid)
    out.action [B], out.action_weights [B, A], out.root_value [B], out.visit_counts [B, A], out.tree

One simulation of all B trees is: a descent from the roots (a loop over depth, one gather per step for all trees:
every node caches the action it selects and the child that leads to), one `recurrent_fn` call for the B new
leaves (tree.expand), one backup of all depths at once (puct.backup), and the refresh of the selection caches
(pUCT, puct.refresh: the nodes just backed up through and every node of the trees whose normalisation changed;
gumbel: the nodes just backed up through and the roots' sequential-halving choice for the next simulation,
gumbel.refresh_choices).

Nothing is read back to the host inside the loop on CUDA: the number of descent steps comes from `DepthBound`
(an asynchronous copy, polled, never waited for). So a whole search can be captured as one CUDA graph (the
framework's --cuda_graphs captures the agent's `act`; agents/muzero/graphed_search.py replays reanalysis's): while
a capture runs the depth is not polled at all and the descent of simulation k takes k steps, and nothing in the
search copies from host memory. On the CPU, where reading a tensor costs no round trip, the
depth is read at once, the backup stops at the deepest new leaf, the refreshes skip the padding of the paths and
the trees whose normalisation did not change, and the whole loop runs on numpy views of the tree's tensors
(tree.TreeArrays: numpy's cost per call on tens to thousands of numbers is about a quarter of torch's; the same
functions run on the tensors on other devices, and with NUMPY_ON_CPU = False on the CPU, as a test does).

On the CPU the simulations run compiled by default (SearchConfig.backend "auto" or "numba"; compiled.py,
compiled_tree.py, compiled_puct.py, compiled_gumbel.py): per simulation one Numba call (the previous simulation's
expansion and backup, then the descent of all B trees, each node's choice computed as the descent reaches it) and
the `recurrent_fn` call; the same roots, outputs and trees as the loop of numpy / torch calls described here, which
stays as the reference and the path of other devices (backend "numpy").

Search times are dominated by the number of array operations, not their size: the per-node caches, the
all-depths backup and inference mode are there to keep that number down. On a CPU, run it
with one intra-op thread (torch.set_num_threads(1)): with two OpenMP threads on a busy 2-core machine, a tiny
reduction can wait tens of milliseconds at a barrier.

Conventions (the scalar reference in reference.py follows the same): the root and every new node count their own
expansion as one visit with their network value; Q(s, a) = reward + discount * V(child) with the edge's own
discount (0 after a terminal); pUCT's Q is min-max normalised per tree over the Q values its backups have seen,
0 for unvisited children and 0 everywhere while the tree has no range; ties go to the lowest action index.
Network outputs that are not finite (a diverged network's NaN) meet the same arithmetic in every backend (puct.py):
the same trees, and an invalid root action is never chosen.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor

from seed.agents.muzero.search.gumbel import (
    considered_visits_table,
    gumbel_outcome,
    refresh_choices,
)
from seed.agents.muzero.search.puct import backup, refresh
from seed.agents.muzero.search.tree import (
    LOGITS,
    PRIOR,
    RAW_VALUE,
    VALUE_SUM,
    VISITS,
    Tree,
    expand,
    finished_tree,
    new_tree,
    tree_map2,
)
from seed.agents.muzero.search.types import RecurrentFn, RecurrentOutput, RootInput, SearchConfig, SearchOutput

__all__ = ["RecurrentFn", "RecurrentOutput", "RootInput", "SearchConfig", "SearchOutput", "Tree", "search",
           "dirichlet_noise", "sample_action", "DepthBound"]


# The sequential-halving schedules of every number of considered actions: pure Python, the same for every search of
# a configuration (about 2 ms of a 10 ms Gumbel search of 64 trees at 50 simulations).
_considered_visits_table = functools.lru_cache(maxsize=16)(considered_visits_table)


@functools.lru_cache(maxsize=16)
def _considered_visits_tensor(max_num_considered: int, simulations: int, device: torch.device) -> Tensor:
    """The schedules as an int64 tensor [max_num_considered + 1, simulations] on `device`, made once: a search being
    captured in a CUDA graph may not copy from host memory (its warm-up call made this)."""
    return torch.tensor(_considered_visits_table(max_num_considered, simulations), device=device)

# Run the CPU search's numpy / torch loop (backend "numpy") on numpy views of the tree (False: on the tensors, as on
# every other device; the tests use it to check that code path without a GPU).
NUMPY_ON_CPU = True


class DepthBound:
    """An upper bound, known on the host, of the depth of the deepest node of the B trees, so the descent loop
    runs bound + 1 steps. Each simulation deepens a tree by at most one, so a depth d known after simulation j
    bounds the depth after simulation k by min(k, d + k - j).

    On the CPU the depth is read at once (a CPU tensor; no device round trip). On CUDA it is copied
    asynchronously into pinned memory and used once the copy has landed (polled with an event, never waited for);
    until then the bound grows by one per simulation. Other devices, and a search being captured in a CUDA graph
    (where nothing may be read back, so the loop's length is fixed), use the bound k: the descent of simulation k
    runs k steps, those past a tree's depth staying where they are.
    """

    def __init__(self, device: torch.device):
        capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        self.mode = device.type if device.type in ("cpu", "cuda") and not capturing else "none"
        self.exact = self.mode == "cpu"
        self.last_leaf_depth = 0  # on the CPU: the deepest node the last simulation created
        self.known, self.known_at = 0, 0
        self.pending: int | None = None
        if self.mode == "cuda":
            self.deepest = torch.zeros((), dtype=torch.int64, device=device)
            self.pinned = torch.zeros((), dtype=torch.int64).pin_memory()
            self.event = torch.cuda.Event()

    def bound(self, simulations_done: int) -> int:
        if self.pending is not None and self.event.query():
            self.known, self.known_at, self.pending = int(self.pinned), self.pending, None
        return min(simulations_done, self.known + simulations_done - self.known_at)

    def update(self, simulations_done: int, leaf_depth: Tensor) -> None:
        """leaf_depth [B] int64: the depths of the nodes the last simulation created."""
        if self.mode == "cpu":
            self.last_leaf_depth = int(leaf_depth.max())
            self.known, self.known_at = max(self.known, self.last_leaf_depth), simulations_done
        elif self.mode == "cuda":
            torch.maximum(self.deepest, leaf_depth.max(), out=self.deepest)
            if self.pending is None:
                self.pinned.copy_(self.deepest, non_blocking=True)
                self.event.record()
                self.pending = simulations_done


def dirichlet_noise(alpha: float, invalid: Tensor, dtype: torch.dtype, generator: torch.Generator | None) -> Tensor:
    """Dirichlet(alpha) over the valid actions of each row, 0 on invalid ones. invalid [B, A] bool -> [B, A]."""
    concentration = torch.full(invalid.shape, alpha, dtype=dtype, device=invalid.device)
    gamma = torch._standard_gamma(concentration, generator=generator).masked_fill(invalid, 0.0)
    return gamma / gamma.sum(-1, keepdim=True).clamp_min(torch.finfo(dtype).tiny)


def sample_action(visit_counts: Tensor, temperature: Tensor | float, generator: torch.Generator | None) -> Tensor:
    """An action per row drawn with probability proportional to visits ** (1 / temperature); temperature 0 (a float,
    or per row in a [B] tensor) takes the most visited action, the lowest index among ties. visit_counts [B, A]."""
    greedy = visit_counts.argmax(-1)
    if isinstance(temperature, (int, float)):
        if temperature == 0:
            return greedy
        temperature_rows = torch.full((visit_counts.shape[0],), float(temperature), dtype=visit_counts.dtype,
                                      device=visit_counts.device)
    else:
        temperature_rows = temperature.to(visit_counts.device, visit_counts.dtype).reshape(-1)
    is_zero = temperature_rows == 0
    logits = visit_counts.log() / torch.where(is_zero, 1.0, temperature_rows).unsqueeze(1)
    if visit_counts.is_cuda:  # the Gumbel-max trick: the same distribution, and it may be captured in a CUDA graph
        uniform = torch.rand(logits.shape, dtype=logits.dtype, device=logits.device, generator=generator)
        sampled = (logits - torch.log(-torch.log(uniform.clamp_min(torch.finfo(logits.dtype).tiny)))).argmax(-1)
    else:
        sampled = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator).squeeze(1)
    return torch.where(is_zero, greedy, sampled)


def _check(root: RootInput, config: SearchConfig, invalid_actions: Tensor | None) -> None:
    logits, value = root.prior_logits, root.value
    if logits.dim() != 2:
        raise ValueError(f"RootInput.prior_logits: got shape {tuple(logits.shape)}, expected [B, A]")
    if tuple(value.shape) != (logits.shape[0],):
        raise ValueError(f"RootInput.value: got shape {tuple(value.shape)}, expected [B] = ({logits.shape[0]},)")
    if not value.is_floating_point():
        raise ValueError(f"RootInput.value: got dtype {value.dtype}, expected a floating dtype")
    if invalid_actions is not None and tuple(invalid_actions.shape) != tuple(logits.shape):
        raise ValueError(f"invalid_actions: got shape {tuple(invalid_actions.shape)}, expected [B, A] = "
                         f"{tuple(logits.shape)}")


def search(root: RootInput, recurrent_fn: RecurrentFn, config: SearchConfig, *,
           temperature: Tensor | float = 1.0, generator: torch.Generator | None = None,
           invalid_actions: Tensor | None = None) -> SearchOutput:
    """Searches B trees at once; see the module docstring and SearchOutput.

    temperature: float or [B] tensor (puct's action sampling; gumbel ignores it). generator: draws the Dirichlet
    noise, the Gumbel noise and the sampled action (on the search's device). invalid_actions [B, A] bool (True =
    may not be taken at the root); every row needs at least one valid action.
    """
    _check(root, config, invalid_actions)
    with torch.inference_mode():  # about 15% less time per op than no_grad at these sizes
        out = _search(root, recurrent_fn, config, temperature, generator, invalid_actions)
    # Ordinary tensors for the caller (inference tensors refuse in-place updates outside inference mode); the tree
    # stays as it is, read-only.
    return SearchOutput(action=out.action.clone(), action_weights=out.action_weights.clone(),
                        root_value=out.root_value.clone(), visit_counts=out.visit_counts.clone(), tree=out.tree)


def _search(root: RootInput, recurrent_fn: RecurrentFn, config: SearchConfig, temperature: Tensor | float,
            generator: torch.Generator | None, invalid_actions: Tensor | None) -> SearchOutput:
    b, a = root.prior_logits.shape
    dtype, device = root.value.dtype, root.value.device
    simulations = config.num_simulations
    n = simulations + 1
    compiled = _compiled(config, device, dtype)
    # The loop below runs on tree.arrays: numpy views on the CPU, the tensors elsewhere (see tree.py).
    host = device.type == "cpu" and (NUMPY_ON_CPU or compiled)
    tree = new_tree(b, n, a, root.embedding, dtype, device, host, loop_arrays=not compiled)
    if invalid_actions is not None:
        tree.root_invalid.copy_(invalid_actions.to(torch.bool))
    invalid = tree.root_invalid
    logits = root.prior_logits.to(dtype)
    logits = (logits - logits.amax(-1, keepdim=True)).masked_fill(invalid, torch.finfo(dtype).min)
    prior = torch.softmax(logits, -1)
    gumbel = config.algorithm == "gumbel"
    if not gumbel and config.dirichlet_fraction > 0:
        noise = dirichlet_noise(config.dirichlet_alpha, invalid, dtype, generator)
        prior = (1.0 - config.dirichlet_fraction) * prior + config.dirichlet_fraction * noise
    value = root.value.to(dtype)
    tree.node[:-1].view(b, n, -1)[:, 0, VISITS:RAW_VALUE + 1] = torch.stack((torch.ones_like(value), value, value), 1)
    root_edges = tree.edge[:-1].view(b, n, *tree.edge.shape[1:])[:, 0]
    root_edges[:, PRIOR] = prior
    root_edges[:, LOGITS] = logits
    tree_map2(lambda store, x: store[:-1].view(b, n, *store.shape[1:])[:, 0].copy_(x), tree.flat_embeddings,
              root.embedding)

    if gumbel:
        uniform = torch.rand(b, a, dtype=dtype, device=device, generator=generator)
        gumbel_noise = -torch.log(-torch.log(uniform.clamp_min(torch.finfo(dtype).tiny))) * config.gumbel_scale
        gumbel_logits = gumbel_noise + (logits - logits.amax(-1, keepdim=True))  # [B, A]
        table = _considered_visits_tensor(config.max_num_considered_actions, simulations, device)
        considered = (a - invalid.sum(-1)).clamp_max(config.max_num_considered_actions)
        considered_visits = table.index_select(0, considered).to(dtype).T.contiguous()  # [simulations, B]
    finish = finished_tree
    if compiled:
        from seed.agents.muzero.search.compiled import finished_tree as finish
        from seed.agents.muzero.search.compiled import run_simulations

        run_simulations(tree, recurrent_fn, config, (gumbel_logits.numpy(), considered_visits.numpy()) if gumbel
                        else None)
    else:
        _reference_loop(tree, recurrent_fn, config, host, gumbel_logits if gumbel else None,
                        considered_visits if gumbel else None)
    roots = tree.node[:-1].view(b, n, -1)[:, 0]
    root_value = roots[:, VALUE_SUM] / roots[:, VISITS]
    visit_counts = tree.children_visits[:, 0].clone()
    if gumbel:
        action, action_weights = gumbel_outcome(tree, gumbel_logits, config)
    else:
        action = sample_action(visit_counts, temperature, generator)
        action_weights = visit_counts / visit_counts.sum(-1, keepdim=True)
    return SearchOutput(action=action, action_weights=action_weights, root_value=root_value,
                        visit_counts=visit_counts, tree=finish(tree))


def _compiled(config: SearchConfig, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the search runs the compiled loop (compiled.py): config.backend "numba", or "auto" for float32 or
    float64 trees on the CPU."""
    supported = device.type == "cpu" and dtype in (torch.float32, torch.float64)
    if config.backend == "numba" and not supported:
        raise ValueError(f"SearchConfig.backend: got 'numba' for {dtype} tensors on {device}, expected 'auto' or "
                         "'numpy' (the compiled search runs on the CPU, in float32 or float64)")
    return config.backend == "numba" or (config.backend == "auto" and supported)


def _reference_loop(tree: Tree, recurrent_fn: RecurrentFn, config: SearchConfig, host: bool,
                    gumbel_logits: Tensor | None, considered_visits: Tensor | None) -> None:
    """The simulations as numpy calls (host: on numpy views of the CPU tree) or torch calls (the tensors, on any
    device); see the module docstring. gumbel_logits [B, A] and considered_visits [S, B] for Gumbel MuZero."""
    simulations = config.num_simulations
    invalid = tree.root_invalid
    gumbel = gumbel_logits is not None
    device = tree.node.device

    def array(x: Tensor) -> Any:
        return x.numpy() if host else x

    t = tree.arrays
    if gumbel:
        root_args = array(gumbel_logits.T.contiguous()), array(considered_visits), array(invalid.T.contiguous())
        refresh_choices(t, t.base, root_args[0], root_args[1][0], root_args[2], config)
    else:
        root_invalid = array(invalid)
        refresh(t, t.base, t.node[t.base, VISITS], None, 1, root_invalid, config.pb_c_base, config.pb_c_init)
    depth = DepthBound(device)
    for k in range(simulations):
        rows = t.base
        path = [rows]
        for _ in range(depth.bound(k)):  # a node whose chosen edge is unexpanded leads back to itself
            rows = t.next_row.take(rows)
            path.append(rows)
        actions = t.choice.take(rows)
        leaf_value, leaf_depth = expand(tree, rows, actions, k + 1, recurrent_fn)
        depth.update(k + 1, leaf_depth)
        if depth.exact:  # on the CPU: back up only as deep as the deepest new leaf
            path = path[:depth.last_leaf_depth]
        backed, visits, rescaled = backup(t, path, t.base + (k + 1), leaf_value, min_max=not gumbel)
        if gumbel:
            # the roots' choices for the next simulation (the last one's are not used)
            next_visit = root_args[1][min(k + 1, simulations - 1)]
            refresh_choices(t, backed, root_args[0], next_visit, root_args[2], config)
        else:
            # Every node's score moved in the trees whose normalisation changed (on the host: only those trees).
            refresh(t, backed, visits, rescaled if host else None, k + 2, root_invalid, config.pb_c_base,
                    config.pb_c_init)
