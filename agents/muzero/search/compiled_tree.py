"""The compiled search's tree bookkeeping (Numba, nopython): expanding the B new leaves of a simulation and
backing their values up to the roots, one tree and one node at a time, on the flat rows of tree.py.

The arrays are the numpy views of `TreeArrays` (the CPU search's storage, see tree.py): row b * N + n is node n
of tree b.

    node        [B * N + 1, 5] float       VISITS, VALUE_SUM, RAW_VALUE, REWARD, DISCOUNT (of the edge into the node)
    node_index  [B * N + 1, 3] int64       PARENT_ROW, ACTION, DEPTH
    edge        [B * N + 1, 8, A] float    PB, Q, EDGE_VISITS, PRIOR, LOGITS, EDGE_VALUES, EDGE_REWARD, EDGE_DISCOUNT
    child_row   [B * N + 1, A] int64       the child's row; an unexpanded edge points at its own row

The arithmetic runs in the tree's dtype (float32 or float64), in the order of the numpy search (puct.backup): on
float64 trees the numbers are the numpy search's, bit for bit. The prior's softmax is computed here (numpy's
search calls torch's), so a prior may differ from it in the last bit.

Network outputs that are not finite (a diverged network's NaN) meet numpy's arithmetic here too, so that every
backend makes the same choices (see puct.py): `propagating_min` / `propagating_max` where numpy's minimum and
maximum propagate a NaN (Python's min and max, as Numba compiles them, keep their first argument instead), and
`first_argmax`, numpy's argmax, where a NaN is the maximum.

Every compiled function of the search uses error_model="numpy": a division by zero gives inf or nan instead of
raising, so the loops carry no exception branch and LLVM vectorises them (the searches never divide by zero). The
functions called from Python (the steps, tree_indices) release the GIL: a search's arrays are its own, so a search
in another thread (the learner's inference and reanalysis threads) runs meanwhile.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from seed.agents.muzero.search.tree import (
    ACTION,
    DEPTH,
    DISCOUNT,
    EDGE_DISCOUNT,
    EDGE_REWARD,
    EDGE_VALUES,
    EDGE_VISITS,
    LOGITS,
    PARENT_ROW,
    PRIOR,
    RAW_VALUE,
    REWARD,
    VALUE_SUM,
    VISITS,
    Q,
)


@njit(cache=True, error_model="numpy", inline="always")
def beats(score: float, top: float) -> bool:
    """Whether `score` takes the argmax from the best so far, `top`, as in numpy's argmax: a larger score, or the
    first NaN (a NaN compares false with everything, so without the second test it would never win and the first
    index, an invalid action's -inf, would stay chosen)."""
    return score > top or (score != score and top == top)


@njit(cache=True, error_model="numpy", inline="always")
def first_argmax(scores: np.ndarray) -> int:
    """The index of the largest of scores [A], the lowest among ties, the first NaN if there is one (numpy's argmax;
    0 when all are -inf)."""
    best = 0
    top = scores[0]
    for a in range(1, scores.shape[0]):
        if beats(scores[a], top):
            best, top = a, scores[a]
    return best


@njit(cache=True, error_model="numpy", inline="always")
def propagating_min(a: float, b: float) -> float:
    """numpy's minimum of two numbers: NaN if either is NaN."""
    return a if (a < b or a != a) else b


@njit(cache=True, error_model="numpy", inline="always")
def propagating_max(a: float, b: float) -> float:
    """numpy's maximum of two numbers: NaN if either is NaN."""
    return a if (a > b or a != a) else b


@njit(cache=True, error_model="numpy")
def expand_leaves(node: np.ndarray, node_index: np.ndarray, edge: np.ndarray, child_row: np.ndarray,
                  num_nodes: int, new_node: int, parent_rows: np.ndarray, actions: np.ndarray,
                  reward: np.ndarray, discount: np.ndarray, value: np.ndarray, logits: np.ndarray) -> None:
    """Expands edge (parent_rows[b], actions[b]) of every tree b into node `new_node` (row b * N + new_node): the
    node's network value, the reward and discount of the edge into it (on the node and on the parent's edge), the
    links and depth, its logits and prior softmax(logits). Visits and value sum stay 0: the backup adds the node's
    own value. parent_rows, actions [B] int64; reward, discount, value [B], logits [B, A] in the tree's dtype."""
    num_actions = edge.shape[2]
    exps = np.empty(num_actions, edge.dtype)
    for b in range(parent_rows.shape[0]):
        leaf = b * num_nodes + new_node
        parent, action = parent_rows[b], actions[b]
        node[leaf, RAW_VALUE] = value[b]
        node[leaf, REWARD] = reward[b]
        node[leaf, DISCOUNT] = discount[b]
        node_index[leaf, PARENT_ROW] = parent
        node_index[leaf, ACTION] = action
        node_index[leaf, DEPTH] = node_index[parent, DEPTH] + 1
        edge[parent, EDGE_REWARD, action] = reward[b]
        edge[parent, EDGE_DISCOUNT, action] = discount[b]
        child_row[parent, action] = leaf
        top = logits[b, 0]
        for a in range(1, num_actions):
            top = max(top, logits[b, a])
        total = edge.dtype.type(0)
        for a in range(num_actions):
            exps[a] = math.exp(logits[b, a] - top)
            total += exps[a]
        for a in range(num_actions):
            edge[leaf, LOGITS, a] = logits[b, a]
            edge[leaf, PRIOR, a] = exps[a] / total


@njit(cache=True, error_model="numpy", inline="always")
def store_embeddings(flat: np.ndarray, num_nodes: int, new_node: int, new_embedding: np.ndarray) -> None:
    """An embedding that is one array flat [B * N + 1, E] (the tree's store): copies new_embedding [B, E] (the
    network's output) into node `new_node` of every tree."""
    for b in range(new_embedding.shape[0]):
        flat[b * num_nodes + new_node] = new_embedding[b]


@njit(cache=True, error_model="numpy", inline="always")
def gather_embeddings(flat: np.ndarray, parent_rows: np.ndarray, gathered: np.ndarray) -> None:
    """Copies the rows parent_rows [B] of flat [B * N + 1, E] into gathered [B, E] (the network's next input)."""
    for b in range(parent_rows.shape[0]):
        gathered[b] = flat[parent_rows[b]]


@njit(cache=True, error_model="numpy")
def backup_leaves(node: np.ndarray, node_index: np.ndarray, edge: np.ndarray, num_nodes: int, new_node: int,
                  min_q: np.ndarray, max_q: np.ndarray, min_max: bool) -> None:
    """Backs the value of every tree's new leaf (row b * N + new_node) up to its root (MuZero's `backpropagate`):

        G(leaf) = v,   G(parent) = r(child) + discount(child) * G(child),

    each node on the path gets one visit and G added to its value sum; the edge into it gets the node's visits,
    mean value and Q = r + discount * mean. min_max (pUCT): min_q, max_q [B] take in those Q (Gumbel MuZero
    normalises per node and leaves them alone)."""
    one = node.dtype.type(1)  # a float64 literal would turn float32 arithmetic into float64
    for b in range(min_q.shape[0]):
        row = b * num_nodes + new_node
        g = node[row, RAW_VALUE]
        while True:
            visits = node[row, VISITS] + one
            value_sum = node[row, VALUE_SUM] + g
            node[row, VISITS] = visits
            node[row, VALUE_SUM] = value_sum
            if node_index[row, DEPTH] == 0:
                break
            parent, action = node_index[row, PARENT_ROW], node_index[row, ACTION]
            reward, discount = node[row, REWARD], node[row, DISCOUNT]
            mean = value_sum / visits
            q = discount * mean + reward
            edge[parent, EDGE_VISITS, action] = visits
            edge[parent, EDGE_VALUES, action] = mean
            edge[parent, Q, action] = q
            if min_max:
                min_q[b] = propagating_min(min_q[b], q)
                max_q[b] = propagating_max(max_q[b], q)
            g = discount * g + reward
            row = parent


@njit(cache=True, error_model="numpy", nogil=True)
def tree_indices(node: np.ndarray, node_index: np.ndarray, child_row: np.ndarray, num_nodes: int,
                 children_index: np.ndarray, parent: np.ndarray, action: np.ndarray) -> None:
    """tree.finished_tree's index fields, written into children_index [B, N, A] (the child's node index, -1 while
    unexpanded), parent and action [B, N] (the parent's node index and the action from it; -1 for the roots and
    the unused nodes), all int64."""
    for b in range(parent.shape[0]):
        base = b * num_nodes
        for n in range(num_nodes):
            row = base + n
            for a in range(child_row.shape[1]):
                child = child_row[row, a]
                children_index[b, n, a] = -1 if child == row else child - base
            expanded = n > 0 and node[row, VISITS] > 0
            parent[b, n] = node_index[row, PARENT_ROW] - base if expanded else -1
            action[b, n] = node_index[row, ACTION] if expanded else -1
