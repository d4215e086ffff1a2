"""The compiled simulation loop of the CPU search: per simulation one compiled call (compiled_puct.puct_step or
compiled_gumbel.gumbel_step: the previous simulation's expansion and backup, then this one's descent down all B
trees) and one `recurrent_fn` call on the B leaves; nothing else runs in Python but, for a pytree embedding, the
gather of the leaves' parent embeddings and the store of the new ones.

The tree is the numpy search's (tree.py, its tensors seen as numpy arrays), set up the same way by
search(): the roots' statistics, prior (with the root noise) and logits are written before the loop, the outputs
are read after it, so the two loops are interchangeable. The compiled loop keeps no selection caches: the PB
channel, `choice` and `next_row` stay as new_tree left them.

Numba compiles each function on its first call for each dtype (float32, float64) and keeps the machine code in its
cache (`cache=True`: __pycache__ beside these modules, or $NUMBA_CACHE_DIR), so later processes load it instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from seed.agents.muzero.search.compiled_gumbel import gumbel_params, gumbel_step
from seed.agents.muzero.search.compiled_puct import puct_step, visit_terms
from seed.agents.muzero.search.compiled_tree import tree_indices
from seed.agents.muzero.search.tree import Tree, tree_map, tree_map2
from seed.agents.muzero.search.types import RecurrentFn, SearchConfig


def _host(x: Tensor, dtype: torch.dtype) -> np.ndarray:
    """A recurrent output in the tree's dtype as a numpy array, not copied (a strided slice stays strided: Numba
    compiles a version of the step for each combination of contiguous and strided outputs it meets, once)."""
    return (x if x.dtype == dtype else x.to(dtype)).numpy()


def run_simulations(tree: Tree, recurrent_fn: RecurrentFn, config: SearchConfig,
                    gumbel_root: tuple[np.ndarray, np.ndarray] | None = None) -> None:
    """Runs config.num_simulations simulations on a CPU tree whose roots are set up.

    gumbel_root (Gumbel MuZero only): gumbel_logits [B, A] (g + logits - max(logits)) and considered_visits [S, B]
    (the sequential-halving schedule of each tree), in the tree's dtype; None for pUCT.

    An embedding that is one [B, E] tensor of float32, float64 or int64 (the stub of seed-bench search, a latent
    vector) is gathered and stored by the compiled step (an index_select and a copy_ per simulation less); any
    other pytree by torch here.
    """
    b, n, a = tree.num_trees, tree.num_nodes, tree.num_actions
    simulations = config.num_simulations
    dtype = tree.node.dtype
    node, node_index, edge, child_row, min_q, max_q = (x.numpy() for x in (tree.node, tree.node_index, tree.edge,
                                                                            tree.child_row, tree.min_q, tree.max_q))
    leaf_parents = np.empty((simulations, b), np.int64)  # a row per simulation: recurrent_fn gets its own actions
    leaf_actions = np.empty((simulations, b), np.int64)
    flat = tree.flat_embeddings
    move = isinstance(flat, Tensor) and flat.dim() == 2 and flat.dtype in (torch.float32, torch.float64, torch.int64)
    width = flat.shape[1] if move else 1
    flat_array = flat.numpy() if move else np.zeros((1, 1), np.float32)
    gathered = np.empty((simulations, b, width), flat_array.dtype) if move else np.zeros((1, 1, 1), np.float32)
    no_embedding = np.zeros((1, 1), flat_array.dtype)  # the step's new_embedding when it has none to store
    if gumbel_root is None:
        step = puct_step
        terms = visit_terms(config.pb_c_base, config.pb_c_init, simulations, node.dtype)
        static = (node, node_index, edge, child_row, n, min_q, max_q, tree.root_invalid.numpy(), terms)
    else:
        from seed.agents.muzero.search.gumbel import LOW_LOGIT, MIN_Q_RANGE

        step = gumbel_step
        gumbel_logits, considered_visits = gumbel_root
        params = gumbel_params(config.maxvisit_init, config.value_scale, MIN_Q_RANGE, LOW_LOGIT, node.dtype)
        static = (node, node_index, edge, child_row, n, min_q, max_q, gumbel_logits, considered_visits,
                  tree.root_invalid.numpy(), params)
    static = (*static, leaf_parents, leaf_actions, flat_array, gathered, move)
    # Views made once (a torch index costs microseconds): each simulation's parents, actions and (move) gathered
    # parent embeddings, and the store of each new node's embedding ([B, ...] per leaf of the pytree).
    parent_rows, actions = torch.from_numpy(leaf_parents).unbind(0), torch.from_numpy(leaf_actions).unbind(0)
    inputs = torch.from_numpy(gathered).unbind(0) if move else ()
    stores: list[tuple[Tensor, ...]] = []
    if not move:
        tree_map(lambda view: stores.append(view.unbind(1)), tree.embeddings)
    no_leaf = np.zeros(b, node.dtype)
    step(*static, 0, no_leaf, no_leaf, no_leaf, np.zeros((b, a), node.dtype), no_embedding)
    for k in range(simulations):
        if move:
            parents = inputs[k]
        else:
            parents = tree_map(lambda x, rows=parent_rows[k]: x.index_select(0, rows), flat)
        out = recurrent_fn(parents, actions[k])
        if move:
            new_embedding = _embedding(out.embedding, flat, b)
        else:
            new_embedding = no_embedding
            leaves: list[Tensor] = []  # in the order of tree.embeddings' leaves (dicts by its keys)
            tree_map2(lambda view, x, into=leaves: into.append(x), tree.embeddings, out.embedding)
            for store, x in zip(stores, leaves, strict=True):
                store[k + 1].copy_(x)
        step(*static, k + 1, _host(out.reward, dtype), _host(out.discount, dtype), _host(out.value, dtype),
             _host(out.prior_logits, dtype), new_embedding)


def _embedding(x: Any, flat: Tensor, batch: int) -> np.ndarray:
    """The new nodes' embedding [B, E] as a numpy array in the store's dtype (the compiled step copies it)."""
    if not isinstance(x, Tensor) or tuple(x.shape) != (batch, flat.shape[1]):
        got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"RecurrentOutput.embedding: got {got}, expected a tensor of shape [B, E] = "
                         f"{(batch, flat.shape[1])} like the root's")
    return (x if x.dtype == flat.dtype else x.to(flat.dtype)).numpy()


def finished_tree(tree: Tree) -> Tree:
    """tree.finished_tree, compiled: the tree with its per-tree index fields (children_index, parent,
    action_from_parent)."""
    b, n, a = tree.num_trees, tree.num_nodes, tree.num_actions
    children_index = torch.empty((b, n, a), dtype=torch.int64)
    parent, action = torch.empty((b, n), dtype=torch.int64), torch.empty((b, n), dtype=torch.int64)
    tree_indices(tree.node.numpy(), tree.node_index.numpy(), tree.child_row.numpy(), n, children_index.numpy(),
                 parent.numpy(), action.numpy())
    return Tree(**{**tree.__dict__, "children_index": children_index, "parent": parent, "action_from_parent": action})
