"""MuZero's pUCT selection and the backup, vectorised over the B trees.

Selection (Schrittwieser et al. 2020, pseudocode `ucb_score`) picks at node s the child a maximising

    score(s, a) = (log((N(s) + c2 + 1) / c2) + c1) * sqrt(N(s)) / (N(s, a) + 1) * P(s, a) + Qn(s, a)

with c1 = pb_c_init, c2 = pb_c_base, N(s) the node's visits (its own expansion counts as one, so the root's
first selection already follows the prior), and Qn the tree's min-max normalised Q:

    Q(s, a)  = r(s, a) + discount(s, a) * V(child)            V = mean of the values backed up into the child
    Qn(s, a) = (Q(s, a) - min_q) / (max_q - min_q)             when the tree has seen max_q > min_q, else 0
    Qn(s, a) = 0 for an unvisited child                        (MuZero's convention: the tree's minimum)

min_q / max_q run over every Q computed in a backup of that tree (the edges of each backed-up path, the new leaf's
included; the root has no edge into it and adds nothing). Ties go to the lowest action index. Invalid root actions
score -inf.

The first term only changes when the node is backed up through, so it is cached per child (edge channel PB) and
recomputed for the nodes of each backed-up path. After each backup the choice of every node whose score may have
changed is recomputed (`refresh_path`: the backed-up nodes; `refresh_trees`: every expanded node of the trees
whose normalisation changed), so the next descent is one gather per depth for all B trees.

The functions take `TreeArrays` (numpy on the CPU, torch elsewhere; see tree.py) and use only what both spell
the same.
"""

from __future__ import annotations

import numpy as np

from seed.agents.muzero.search.tree import (
    ACTION,
    DISCOUNT,
    EDGE_VISITS,
    PARENT_ROW,
    PB,
    PRIOR,
    REWARD,
    VALUE_SUM,
    VISITS,
    Array,
    Q,
    TreeArrays,
    amax,
    amin,
    namespace,
    take_rows,
)


def prior_scores(prior: Array, children_visits: Array, visits: Array, pb_c_base: float, pb_c_init: float) -> Array:
    """pUCT's exploration term (log((N + c2 + 1) / c2) + c1) * (sqrt(N) / (n + 1)) * P.

    prior, children_visits [..., A]; visits [...] (N of the parent). Returns [..., A].
    """
    xp = namespace(prior)
    pb_c = xp.log((visits + (pb_c_base + 1.0)) / pb_c_base) + pb_c_init
    return (pb_c[..., None] * (xp.sqrt(visits)[..., None] / (children_visits + 1.0))) * prior


def q_normaliser(min_q: Array, max_q: Array) -> tuple[Array, Array]:
    """(low [B], span [B]) such that clip((Q - low) / span, 0) is the normalised Q of a visited child and 0 for an
    unvisited one (whose cached Q is -inf). Without a range (max_q <= min_q) low is +inf, so every normalised value
    is 0. min_q, max_q [B]."""
    xp = namespace(min_q)
    has_range = max_q > min_q
    return xp.where(has_range, min_q, np.inf), xp.where(has_range, max_q - min_q, 1.0)


def puct_choices(prior_score: Array, q: Array, low: Array, span: Array) -> Array:
    """argmax_a PB(a) + Qn(a), the lowest index among ties. prior_score, q [..., A]; low, span broadcast to
    [..., 1]. Returns [...] int64."""
    xp = namespace(q)
    return (prior_score + xp.clip((q - low) / span, 0.0, None)).argmax(-1)


def refresh_path(t: TreeArrays, rows: Array, visits: Array, root_mask: Array, pb_c_base: float,
                 pb_c_init: float) -> None:
    """Recomputes the cached exploration term (channel PB), the pUCT action (`choice`) and the child it leads to
    (`next_row`, the node's own row while that edge is unexpanded) of the nodes just backed up through.

    rows [M] (the first B are the roots, in tree order; the scratch row may appear) and their visits [M];
    root_mask [B, A]: 0 for valid root actions, -inf for invalid ones, added to the root's scores so that they are
    never selected.
    """
    edges = t.edge[rows, :PRIOR + 1]  # [M, 4, A]: PB, Q, VISITS, PRIOR
    scores = prior_scores(edges[:, PRIOR], edges[:, EDGE_VISITS], visits, pb_c_base, pb_c_init)
    scores[:root_mask.shape[0]] += root_mask
    t.edge[rows, PB] = scores
    low, span = q_normaliser(t.min_q, t.max_q)
    trees = t.row_tree[rows]
    choice = puct_choices(scores, edges[:, Q], low[trees][:, None], span[trees][:, None])  # [M]
    t.choice[rows] = choice
    t.next_row[rows] = t.child_row[rows, choice]


def refresh_trees(t: TreeArrays, trees: Array, num_used: int) -> None:
    """Recomputes `choice` and `next_row` of nodes 0 .. num_used - 1 of `trees` [K, 1] int64 (the trees whose
    normalisation changed: every node's score moved) from the cached exploration terms and Q."""
    low, span = q_normaliser(t.min_q, t.max_q)
    nodes = t.node_number[:, :num_used]  # [1, num_used]
    edges = t.edges[trees, nodes, :Q + 1]  # [K, num_used, 2, A]: PB, Q
    choice = puct_choices(edges[..., PB, :], edges[..., Q, :], low[trees][..., None], span[trees][..., None])
    t.choices[trees, nodes] = choice
    t.next_rows[trees, nodes] = t.children[trees, nodes, choice]


def backup(t: TreeArrays, path: list[Array], leaf_rows: Array, leaf_value: Array) -> tuple[Array, Array, Array]:
    """Backs the new leaves' values up to the roots (MuZero pseudocode `backpropagate`), all depths at once.

    path: L arrays [B] int64, the rows visited by the selection, root first; a row repeated from one step to the
    next is where the descent stopped (it is padding). leaf_rows [B] int64, the new nodes, children of the last
    real row; leaf_value [B] their network values. Every node on the path gets one visit and the discounted return
    from it,

        G(leaf) = v,   G(parent) = r(child) + discount(child) * G(child),

    added to its value sum; the edge into each of them gets the child's visits, mean value and Q; the tree's
    min_q / max_q take in those Q. Returns the backed-up rows [M] (the roots first, in tree order, then each
    deeper level; on the host without the padding, elsewhere all (L + 1) * B with the scratch row), their visits [M],
    and whether each tree's min_q or max_q changed [B] bool.
    """
    xp = namespace(leaf_rows)
    scratch = t.scratch
    steps = xp.stack(path, 0)  # [L, B]
    inner = xp.where(steps[1:] == steps[:-1], scratch, steps[1:])
    rows = xp.concatenate((steps[:1], inner, leaf_rows[None]), 0)  # [L + 1, B]
    before = take_rows(t.node, rows)  # [L + 1, B, 5]
    rewards, discounts = before[..., REWARD], before[..., DISCOUNT]
    value = leaf_value
    values = [value]
    for j in range(rows.shape[0] - 1, 0, -1):  # scratch rows have reward 0, discount 1: the value passes through
        value = rewards[j] + discounts[j] * value
        values.append(value)
    values.reverse()
    visits = before[..., VISITS] + 1.0  # [L + 1, B]
    value_sums = before[..., VALUE_SUM] + xp.stack(values, 0)
    t.node[rows, VISITS] = visits  # rows repeat only at the scratch row, whose statistics nothing reads
    t.node[rows, VALUE_SUM] = value_sums

    children = rows[1:]  # [L, B]
    mean = value_sums[1:] / visits[1:]
    q = rewards[1:] + discounts[1:] * mean
    links = take_rows(t.node_index, children)  # [L, B, 3]
    t.edge[links[..., PARENT_ROW, None], t.backup_channels, links[..., ACTION, None]] = xp.stack((visits[1:], mean, q),
                                                                                              -1)
    q = xp.where(children != scratch, q, q[-1:])  # padding repeats the leaf's edge, always on the path
    low, high = amin(q, 0), amax(q, 0)
    rescaled = (low < t.min_q) | (high > t.max_q)
    xp.minimum(t.min_q, low, out=t.min_q)
    xp.maximum(t.max_q, high, out=t.max_q)
    if xp is np:  # a data-dependent size costs nothing on the host, and the refreshes then skip the padding
        real = rows != scratch
        return rows[real], visits[real], rescaled
    return rows.reshape(-1), visits.reshape(-1), rescaled
