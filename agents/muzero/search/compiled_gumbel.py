"""Gumbel MuZero's selection, compiled (Numba, nopython): sequential halving at the root, the improved-policy
selection inside, the descent of one simulation down every tree, and the step between two network calls.

The formulas are gumbel.py's, per node and in the tree's dtype (see gumbel.py for the paper's references):

    completed Q(a) = Q(a) if N(a) > 0 else v_mix,  v_mix = (v + (N(s) - 1) * sum_visited(p Q) / sum_visited(p)) / N(s)
                     (p floored at the dtype's tiny), min-max rescaled over the node's actions (span floored)
    sigma(a)       = (maxvisit_init + max_b N(b)) * value_scale * rescaled completed Q(a)
    root           argmax over the valid actions with the schedule's considered visits of max(g + logits + sigma,
                   LOW_LOGIT)
    inside         argmax softmax(logits + sigma)(a) - N(a) / N(s)                    N(s) = 1 + sum_b N(b)

Ties go to the lowest action index, a NaN score wins (numpy's argmax), and the minima and maxima propagate a NaN
as numpy's do (compiled_tree.py). As in compiled_puct.py, each node's choice is computed as the descent reaches
it (the numpy search caches it and refreshes it after each backup: the same choices). The selections are inlined
into the descent (a call per node costs about as much as a root's pick).

Arrays as in compiled_tree.py. params [5] in the tree's dtype: gumbel_params' (maxvisit_init, value_scale, the
prior's floor, the rescaling span's floor, LOW_LOGIT).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from seed.agents.muzero.search.compiled_tree import (
    backup_leaves,
    beats,
    expand_leaves,
    gather_embeddings,
    propagating_max,
    propagating_min,
    store_embeddings,
)
from seed.agents.muzero.search.tree import EDGE_VISITS, LOGITS, PRIOR, RAW_VALUE, VISITS, Q

MAXVISIT_INIT, VALUE_SCALE, PRIOR_FLOOR, SPAN_FLOOR, LOW_LOGIT = range(5)


def gumbel_params(maxvisit_init: float, value_scale: float, span_floor: float, low_logit: float,
                  dtype: np.dtype) -> np.ndarray:
    """The constants of the selection as an array [5] in the tree's dtype (numpy's search rounds them to it)."""
    return np.array([maxvisit_init, value_scale, np.finfo(dtype).tiny, span_floor, low_logit], dtype)


@njit(cache=True, error_model="numpy", inline="always")
def completed_q_sigma(edge: np.ndarray, row: int, node_visits: float, raw_value: float, params: np.ndarray,
                      sigma: np.ndarray) -> None:
    """sigma(completed Q) of node `row` into sigma [A]. node_visits: N(s) (its own expansion counts as one);
    raw_value: the network's value of the node."""
    zero = edge.dtype.type(0)
    one = edge.dtype.type(1)
    num_actions = edge.shape[2]
    sum_prior = zero
    for a in range(num_actions):
        if edge[row, EDGE_VISITS, a] > 0:
            sum_prior += max(edge[row, PRIOR, a], params[PRIOR_FLOOR])
    denominator = sum_prior if sum_prior > 0 else one
    weighted_q = zero
    for a in range(num_actions):
        if edge[row, EDGE_VISITS, a] > 0:
            weighted_q += max(edge[row, PRIOR, a], params[PRIOR_FLOOR]) * edge[row, Q, a] / denominator
    mixed = (raw_value + (node_visits - one) * weighted_q) / node_visits
    low, high, max_visits = edge.dtype.type(np.inf), edge.dtype.type(-np.inf), zero
    for a in range(num_actions):
        visits = edge[row, EDGE_VISITS, a]
        completed = edge[row, Q, a] if visits > 0 else mixed
        sigma[a] = completed
        low, high = propagating_min(low, completed), propagating_max(high, completed)
        max_visits = max(max_visits, visits)
    span = max(high - low, params[SPAN_FLOOR])
    scale = (params[MAXVISIT_INIT] + max_visits) * params[VALUE_SCALE]
    for a in range(num_actions):
        sigma[a] = scale * ((sigma[a] - low) / span)


@njit(cache=True, error_model="numpy", inline="always")
def root_action(edge: np.ndarray, row: int, sigma: np.ndarray, gumbel_logits: np.ndarray, considered_visit: float,
                root_invalid: np.ndarray, tree: int, params: np.ndarray) -> int:
    """Sequential halving's pick at root `row` of tree `tree`: argmax of max(g + logits + sigma, LOW_LOGIT) over
    the valid actions whose visits equal considered_visit (0 when there is none). sigma [A] (completed_q_sigma's);
    gumbel_logits [B, A]: g + logits - max(logits); root_invalid [B, A] bool. An invalid action is never chosen,
    whatever the scores (a NaN among them wins, as in numpy's argmax)."""
    best, top = 0, edge.dtype.type(-np.inf)
    for a in range(edge.shape[2]):
        if edge[row, EDGE_VISITS, a] != considered_visit or root_invalid[tree, a]:
            continue
        score = max(gumbel_logits[tree, a] + sigma[a], params[LOW_LOGIT])  # a NaN first: max keeps it, as numpy's
        if beats(score, top):
            best, top = a, score
    return best


@njit(cache=True, error_model="numpy", inline="always")
def interior_action(edge: np.ndarray, row: int, node_visits: float, sigma: np.ndarray) -> int:
    """The deterministic pick inside the tree: argmax softmax(logits + sigma)(a) - N(a) / N(s). sigma [A]
    (completed_q_sigma's; overwritten)."""
    num_actions = edge.shape[2]
    top = edge.dtype.type(-np.inf)
    for a in range(num_actions):
        sigma[a] = edge[row, LOGITS, a] + sigma[a]
        top = propagating_max(top, sigma[a])
    total = edge.dtype.type(0)
    for a in range(num_actions):
        sigma[a] = math.exp(sigma[a] - top)
        total += sigma[a]
    best, best_score = 0, edge.dtype.type(-np.inf)
    for a in range(num_actions):
        score = sigma[a] / total - edge[row, EDGE_VISITS, a] / node_visits
        if beats(score, best_score):
            best, best_score = a, score
    return best


@njit(cache=True, error_model="numpy")
def gumbel_descend(node: np.ndarray, edge: np.ndarray, child_row: np.ndarray, num_nodes: int,
                   gumbel_logits: np.ndarray, considered_visit: np.ndarray, root_invalid: np.ndarray,
                   params: np.ndarray, parent_rows: np.ndarray, actions: np.ndarray) -> None:
    """Descends every tree b from its root (row b * N) to the first unexpanded edge: writes its row into
    parent_rows[b] and its action into actions[b] ([B] int64). gumbel_logits [B, A]; considered_visit [B] (this
    simulation's entry of the schedule); root_invalid [B, A] bool."""
    sigma = np.empty(edge.shape[2], edge.dtype)
    for b in range(parent_rows.shape[0]):
        row = b * num_nodes
        completed_q_sigma(edge, row, node[row, VISITS], node[row, RAW_VALUE], params, sigma)
        action = root_action(edge, row, sigma, gumbel_logits, considered_visit[b], root_invalid, b, params)
        child = child_row[row, action]
        while child != row:
            row = child
            completed_q_sigma(edge, row, node[row, VISITS], node[row, RAW_VALUE], params, sigma)
            action = interior_action(edge, row, node[row, VISITS], sigma)
            child = child_row[row, action]
        parent_rows[b] = row
        actions[b] = action


@njit(cache=True, error_model="numpy", nogil=True)
def gumbel_step(node: np.ndarray, node_index: np.ndarray, edge: np.ndarray, child_row: np.ndarray,
                num_nodes: int, min_q: np.ndarray, max_q: np.ndarray, gumbel_logits: np.ndarray,
                considered_visits: np.ndarray, root_invalid: np.ndarray, params: np.ndarray,
                leaf_parents: np.ndarray, leaf_actions: np.ndarray, flat_embedding: np.ndarray, gathered: np.ndarray,
                move: bool, k: int, reward: np.ndarray, discount: np.ndarray, value: np.ndarray, logits: np.ndarray,
                new_embedding: np.ndarray) -> None:
    """Between two network calls: ends simulation k - 1 (k > 0: expands its leaves into node k and backs them up;
    min_q and max_q are left alone) and starts simulation k (k < S: its descent, with considered_visits [S, B] row
    k, into leaf_parents[k], leaf_actions[k] ([S, B] int64)). The embedding arguments as in puct_step."""
    if k > 0:
        if move:
            store_embeddings(flat_embedding, num_nodes, k, new_embedding)
        expand_leaves(node, node_index, edge, child_row, num_nodes, k, leaf_parents[k - 1], leaf_actions[k - 1],
                      reward, discount, value, logits)
        backup_leaves(node, node_index, edge, num_nodes, k, min_q, max_q, False)
    if k < leaf_parents.shape[0]:
        gumbel_descend(node, edge, child_row, num_nodes, gumbel_logits, considered_visits[k], root_invalid, params,
                       leaf_parents[k], leaf_actions[k])
        if move:
            gather_embeddings(flat_embedding, leaf_parents[k], gathered[k])
