"""The compiled simulation loop of the CPU search: per simulation one compiled call (compiled_puct.puct_step or
compiled_gumbel.gumbel_step: the previous simulation's expansion and backup, then this one's descent down all B
trees) and one `recurrent_fn` call on the B leaves; nothing else runs in Python but the gather of the leaves'
parent embeddings and the store of the new ones.

The tree is the numpy search's (tree.py; `host` arrays, numpy views of the CPU tensors), set up the same way by
search(): the roots' statistics, prior (with the root noise) and logits are written before the loop, the outputs
are read after it, so the two loops are interchangeable. The compiled loop keeps no selection caches: the PB
channel, `choice` and `next_row` stay as new_tree left them.

Numba compiles each function on its first call for each dtype (float32, float64) and keeps the machine code in its
cache (`cache=True`: __pycache__ beside these modules, or $NUMBA_CACHE_DIR), so later processes load it instead.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from seed.agents.muzero.search.compiled_gumbel import gumbel_params, gumbel_step
from seed.agents.muzero.search.compiled_puct import puct_step, visit_terms
from seed.agents.muzero.search.compiled_tree import tree_indices
from seed.agents.muzero.search.tree import Tree, tree_map, tree_map2
from seed.agents.muzero.search.types import RecurrentFn, SearchConfig


def _host(x: Tensor, dtype: torch.dtype) -> np.ndarray:
    """A recurrent output in the tree's dtype as a numpy array, not copied: Numba compiles a version of the step
    for each combination of contiguous and strided outputs it meets (a copy per output and simulation would cost
    more than the step's arithmetic)."""
    return (x if x.dtype == dtype else x.to(dtype)).numpy()


def run_simulations(tree: Tree, recurrent_fn: RecurrentFn, config: SearchConfig,
                    gumbel_root: tuple[np.ndarray, np.ndarray] | None = None) -> None:
    """Runs config.num_simulations simulations on a CPU tree whose roots are set up (tree.arrays numpy views).

    gumbel_root (Gumbel MuZero only): gumbel_logits [B, A] (g + logits - max(logits)) and considered_visits [S, B]
    (the sequential-halving schedule of each tree), in the tree's dtype; None for pUCT.
    """
    t = tree.arrays
    b, n, a = tree.num_trees, tree.num_nodes, tree.num_actions
    simulations = config.num_simulations
    dtype = tree.node.dtype
    leaf_parents = np.empty((simulations, b), np.int64)  # a row per simulation: recurrent_fn gets its own actions
    leaf_actions = np.empty((simulations, b), np.int64)
    parents_tensor, actions_tensor = torch.from_numpy(leaf_parents), torch.from_numpy(leaf_actions)
    invalid = tree.root_invalid.numpy()
    storage = (t.node, t.node_index, t.edge, t.child_row, n, t.min_q, t.max_q)
    if gumbel_root is None:
        step = puct_step
        terms = visit_terms(config.pb_c_base, config.pb_c_init, simulations, t.node.dtype)
        static = (*storage, invalid, terms, leaf_parents, leaf_actions)
    else:
        from seed.agents.muzero.search.gumbel import LOW_LOGIT, MIN_Q_RANGE

        step = gumbel_step
        gumbel_logits, considered_visits = gumbel_root
        params = gumbel_params(config.maxvisit_init, config.value_scale, MIN_Q_RANGE, LOW_LOGIT, t.node.dtype)
        static = (*storage, gumbel_logits, considered_visits, invalid, params, leaf_parents, leaf_actions)
    # Views made once (a torch index costs microseconds): each simulation's parents and actions, and the embedding
    # store of each new node ([B, ...] per leaf of the embedding pytree).
    parent_rows, actions = parents_tensor.unbind(0), actions_tensor.unbind(0)
    stores: list[tuple[Tensor, ...]] = []
    tree_map(lambda view: stores.append(view.unbind(1)), tree.embeddings)
    single = isinstance(tree.flat_embeddings, Tensor)  # one embedding tensor: no tree_map
    no_leaf = np.zeros(b, t.node.dtype)
    step(*static, 0, no_leaf, no_leaf, no_leaf, np.zeros((b, a), t.node.dtype))
    for k in range(simulations):
        rows = parent_rows[k]
        if single:
            parents = tree.flat_embeddings.index_select(0, rows)
        else:
            parents = tree_map(lambda x, rows=rows: x.index_select(0, rows), tree.flat_embeddings)
        out = recurrent_fn(parents, actions[k])
        if single:
            stores[0][k + 1].copy_(out.embedding)
        else:
            new_embeddings: list[Tensor] = []  # in the order of tree.embeddings' leaves (dicts by its keys)
            tree_map2(lambda view, x, into=new_embeddings: into.append(x), tree.embeddings, out.embedding)
            for store, x in zip(stores, new_embeddings, strict=True):
                store[k + 1].copy_(x)
        step(*static, k + 1, _host(out.reward, dtype), _host(out.discount, dtype), _host(out.value, dtype),
             _host(out.prior_logits, dtype))


def finished_tree(tree: Tree) -> Tree:
    """tree.finished_tree, compiled: the tree with its per-tree index fields (children_index, parent,
    action_from_parent)."""
    b, n, a = tree.num_trees, tree.num_nodes, tree.num_actions
    children_index = torch.empty((b, n, a), dtype=torch.int64)
    parent, action = torch.empty((b, n), dtype=torch.int64), torch.empty((b, n), dtype=torch.int64)
    t = tree.arrays
    tree_indices(t.node, t.node_index, t.child_row, n, children_index.numpy(), parent.numpy(), action.numpy())
    return Tree(**{**tree.__dict__, "children_index": children_index, "parent": parent, "action_from_parent": action})
