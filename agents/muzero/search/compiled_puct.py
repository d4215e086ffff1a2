"""MuZero's pUCT selection, compiled (Numba, nopython): the descent of one simulation down every tree, and the step
that ends a simulation (expansion and backup, compiled_tree.py) and starts the next (the descent).

The score is puct.py's, in the same order of operations and in the tree's dtype:

    score(s, a) = (log((N(s) + c2 + 1) / c2) + c1) * (sqrt(N(s)) / (N(s, a) + 1)) * P(s, a) + Qn(s, a)
    Qn(s, a)    = max((Q(s, a) - min_q) / (max_q - min_q), 0) for a visited child when the tree has a range, else 0

invalid root actions score -inf, ties go to the lowest action index, a NaN score wins (numpy's argmax; see
puct.py for non-finite network outputs). The numpy search caches the first term and
each node's choice and refreshes them after a backup; here each node's choice is computed as the descent reaches
it, from the same statistics, so no cache is kept (every node on a descent was backed up through since the last
descent that reached it, so a cache would be recomputed there anyway).

Arrays as in compiled_tree.py. The factors that depend on a node's visits only are a table (visit_terms), made
by numpy with puct.py's operations.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from seed.agents.muzero.search.compiled_tree import (
    backup_leaves,
    expand_leaves,
    first_argmax,
    gather_embeddings,
    store_embeddings,
)
from seed.agents.muzero.search.tree import EDGE_VISITS, PRIOR, VISITS, Q


def visit_terms(pb_c_base: float, pb_c_init: float, num_simulations: int, dtype: np.dtype) -> np.ndarray:
    """The factors of the score that depend on a node's visits N only, for N = 0 .. num_simulations + 1: [2, S + 2]
    in the tree's dtype, (log((N + c2 + 1) / c2) + c1, sqrt(N)), computed by numpy as puct.prior_scores does."""
    visits = np.arange(num_simulations + 2).astype(dtype)
    return np.stack((np.log((visits + (pb_c_base + 1.0)) / pb_c_base) + pb_c_init, np.sqrt(visits)))


@njit(cache=True, error_model="numpy", inline="always")
def puct_action(edge: np.ndarray, row: int, visits: int, low: float, span: float, root_invalid: np.ndarray,
                tree: int, is_root: bool, terms: np.ndarray, scores: np.ndarray) -> int:
    """argmax_a score(row, a), the lowest index among ties. visits: N(row); low, span: the tree's normaliser
    (`normaliser`'s: min_q and max_q - min_q when the tree has a range, else +inf and 1: every Qn is then 0, as for
    an unvisited child, whose Q is -inf); root_invalid [B, A] bool: row `tree` holds the tree's invalid root
    actions (read when is_root); terms: visit_terms; scores [A]: scratch. Inlined where it is called (a call per
    node costs about as much as its arithmetic)."""
    zero = edge.dtype.type(0)
    one = edge.dtype.type(1)
    pb_c, sqrt_visits = terms[0, visits], terms[1, visits]
    num_actions = edge.shape[2]
    for a in range(num_actions):  # no branch: LLVM vectorises it
        prior_score = (pb_c * (sqrt_visits / (edge[row, EDGE_VISITS, a] + one))) * edge[row, PRIOR, a]
        scores[a] = max((edge[row, Q, a] - low) / span, zero) + prior_score
    if is_root:
        for a in range(num_actions):
            if root_invalid[tree, a]:
                scores[a] = -np.inf
    return first_argmax(scores)


@njit(cache=True, error_model="numpy", inline="always")
def normaliser(min_q: float, max_q: float, no_range: tuple[float, float]) -> tuple[float, float]:
    """(low, span) of a tree (puct.q_normaliser): (min_q, max_q - min_q) when that span is positive and finite
    (not NaN), else `no_range`, (+inf, 1) in the tree's dtype."""
    span = max_q - min_q
    return (min_q, span) if span > 0 and span < np.inf else no_range


@njit(cache=True, error_model="numpy")
def puct_descend(node: np.ndarray, edge: np.ndarray, child_row: np.ndarray, num_nodes: int, min_q: np.ndarray,
                 max_q: np.ndarray, root_invalid: np.ndarray, terms: np.ndarray, parent_rows: np.ndarray,
                 actions: np.ndarray) -> None:
    """Descends every tree b from its root (row b * N) by pUCT to the first unexpanded edge: writes its row into
    parent_rows[b] and its action into actions[b] ([B] int64). min_q, max_q [B]; root_invalid [B, A] bool;
    terms: visit_terms."""
    scores = np.empty(edge.shape[2], edge.dtype)
    no_range = edge.dtype.type(np.inf), edge.dtype.type(1)  # (low, span) in the tree's dtype
    for b in range(min_q.shape[0]):
        low, span = normaliser(min_q[b], max_q[b], no_range)
        row = b * num_nodes
        action = puct_action(edge, row, int(node[row, VISITS]), low, span, root_invalid, b, True, terms, scores)
        child = child_row[row, action]
        while child != row:
            row = child
            action = puct_action(edge, row, int(node[row, VISITS]), low, span, root_invalid, b, False, terms,
                                 scores)
            child = child_row[row, action]
        parent_rows[b] = row
        actions[b] = action


@njit(cache=True, error_model="numpy", nogil=True)
def puct_step(node: np.ndarray, node_index: np.ndarray, edge: np.ndarray, child_row: np.ndarray, num_nodes: int,
              min_q: np.ndarray, max_q: np.ndarray, root_invalid: np.ndarray, terms: np.ndarray,
              leaf_parents: np.ndarray, leaf_actions: np.ndarray, flat_embedding: np.ndarray, gathered: np.ndarray,
              move: bool, k: int, reward: np.ndarray, discount: np.ndarray, value: np.ndarray, logits: np.ndarray,
              new_embedding: np.ndarray) -> None:
    """Between two network calls: ends simulation k - 1 (k > 0: expands its leaves into node k with the network's
    reward, discount, value [B] and logits [B, A], and backs them up) and starts simulation k (k < S: its descent
    into leaf_parents[k], leaf_actions[k]; leaf_parents, leaf_actions [S, B] int64). move: the embedding is one
    array, flat_embedding [B * N + 1, E]: the new nodes' new_embedding [B, E] is stored and the next parents'
    gathered into gathered[k] ([S, B, E]) here (else the caller moves them and these are placeholders)."""
    if k > 0:
        if move:
            store_embeddings(flat_embedding, num_nodes, k, new_embedding)
        expand_leaves(node, node_index, edge, child_row, num_nodes, k, leaf_parents[k - 1], leaf_actions[k - 1],
                      reward, discount, value, logits)
        backup_leaves(node, node_index, edge, num_nodes, k, min_q, max_q, True)
    if k < leaf_parents.shape[0]:
        puct_descend(node, edge, child_row, num_nodes, min_q, max_q, root_invalid, terms, leaf_parents[k],
                     leaf_actions[k])
        if move:
            gather_embeddings(flat_embedding, leaf_parents[k], gathered[k])
