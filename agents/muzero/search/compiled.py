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
from seed.agents.muzero.search.tree import Tree, tree_map, tree_map2
from seed.agents.muzero.search.types import RecurrentFn, SearchConfig


def _host(x: Tensor, dtype: torch.dtype) -> np.ndarray:
    """A recurrent output in the tree's dtype as a C-contiguous numpy array (one compiled version per layout)."""
    x = x if x.dtype == dtype else x.to(dtype)
    return np.ascontiguousarray(x.numpy())


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
    if gumbel_root is None:
        terms = visit_terms(config.pb_c_base, config.pb_c_init, simulations, t.node.dtype)

        def step(k: int, reward: np.ndarray, discount: np.ndarray, value: np.ndarray, logits: np.ndarray) -> None:
            puct_step(t.node, t.node_index, t.edge, t.child_row, n, t.min_q, t.max_q, invalid, terms, leaf_parents,
                      leaf_actions, k, reward, discount, value, logits)
    else:
        from seed.agents.muzero.search.gumbel import LOW_LOGIT

        gumbel_logits, considered_visits = gumbel_root
        # 1e-8: the floor of gumbel.completed_q_sigma's rescaling span
        params = gumbel_params(config.maxvisit_init, config.value_scale, 1e-8, LOW_LOGIT, t.node.dtype)

        def step(k: int, reward: np.ndarray, discount: np.ndarray, value: np.ndarray, logits: np.ndarray) -> None:
            gumbel_step(t.node, t.node_index, t.edge, t.child_row, n, t.min_q, t.max_q, gumbel_logits,
                        considered_visits, invalid, params, leaf_parents, leaf_actions, k, reward, discount, value,
                        logits)

    no_leaf = np.zeros(b, t.node.dtype)
    step(0, no_leaf, no_leaf, no_leaf, np.zeros((b, a), t.node.dtype))
    for k in range(simulations):
        rows = parents_tensor[k]
        out = recurrent_fn(tree_map(lambda x, rows=rows: x.index_select(0, rows), tree.flat_embeddings),
                           actions_tensor[k])
        tree_map2(lambda store, x, k=k: store[:, k + 1].copy_(x), tree.embeddings, out.embedding)
        step(k + 1, _host(out.reward, dtype), _host(out.discount, dtype), _host(out.value, dtype),
             _host(out.prior_logits, dtype))
