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
score -inf, whatever the network gave, and are never chosen.

Network outputs that are not finite (a diverged network's NaN) follow numpy's arithmetic, the same in every
backend (compiled_puct.py, the numpy and the torch loops): a NaN propagates through the scores, min_q and max_q;
a NaN score is the argmax (numpy's and torch's argmax: the first NaN); a tree whose min_q or max_q is NaN, or whose
range is infinite, has no range (every Qn 0).

The first term only changes when the node is backed up through, so it is cached per child (edge channel PB) and
recomputed for the nodes of each backed-up path. After each backup the choice of every node whose score may have
changed is recomputed once (`refresh`: the backed-up nodes of the trees whose normalisation stayed, every node of
the trees whose normalisation changed), so the next descent is one gather per depth for all B trees. The scores
are compared actions first ([A, M]): numpy reduces over a short last axis at about 40 ns per row, over the first
axis at a few ns per element (tree.first_argmax0).

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
    clip_min,
    first_argmax0,
    namespace,
    new_empty,
    stack0,
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
    unvisited one (whose cached Q is -inf). Without a range (max_q <= min_q, either NaN, or an infinite span, which
    would make the unvisited children's (-inf - low) / span NaN) low is +inf, so every normalised value is 0.
    min_q, max_q [B]."""
    xp = namespace(min_q)
    span = max_q - min_q
    has_range = (span > 0) & (span < np.inf)
    return xp.where(has_range, min_q, np.inf), xp.where(has_range, span, 1.0)


def puct_choices(prior_score: Array, q: Array, low: Array, span: Array) -> Array:
    """argmax_a PB(a) + Qn(a), the lowest index among ties, actions first. prior_score, q [A, M]; low, span [M]
    (q_normaliser's, of each row's tree). Returns [M] int64."""
    normalised = q - low
    normalised /= span
    normalised = clip_min(normalised, 0.0)
    normalised += prior_score
    return first_argmax0(normalised)


def refresh(t: TreeArrays, rows: Array, visits: Array, rescaled: Array | None, num_used: int, root_invalid: Array,
            pb_c_base: float, pb_c_init: float) -> None:
    """After a backup: recomputes the cached exploration term (channel PB) of the nodes just backed up through,
    then the pUCT action (`choice`) and the child it leads to (`next_row`) of every node whose score moved: those
    nodes, and every node of the trees whose normalisation changed.

    rows [M] (the first B are the roots, in tree order; the scratch row may appear) and their visits [M];
    rescaled [B] bool, the trees whose min_q or max_q changed (None: refresh every node of every tree, as on
    devices where a data-dependent size would need a host sync); num_used: the nodes 0 .. num_used - 1 in use per
    tree; root_invalid [B, A] bool: the invalid root actions, whose cached term is -inf so that they are never
    selected (set, not added: a NaN prior plus -inf would be NaN, the argmax).
    """
    xp = namespace(rows)
    edges = t.edge[rows, EDGE_VISITS:PRIOR + 1]  # [M, 2, A]: VISITS, PRIOR
    scores = prior_scores(edges[:, 1], edges[:, 0], visits, pb_c_base, pb_c_init)
    roots = root_invalid.shape[0]
    scores[:roots] = xp.where(root_invalid, -np.inf, scores[:roots])
    t.edge[rows, PB] = scores
    nodes = t.rows[:, :num_used]  # [B, num_used]
    if rescaled is None:
        stale = nodes.reshape(-1)
    else:  # each node once: the backed-up ones of the other trees, then the rescaled trees whole
        stale = xp.concatenate((rows[~rescaled[t.row_tree[rows]]], nodes[rescaled].reshape(-1)))
    choose(t, stale)


def choose(t: TreeArrays, rows: Array) -> None:
    """Recomputes `choice` (argmax_a PB(a) + Qn(a)) and `next_row` (the child it leads to, the node's own row
    while that edge is unexpanded) of rows [M] from the cached exploration terms and Q."""
    low, span = q_normaliser(t.min_q, t.max_q)
    trees = t.row_tree[rows]
    edges = t.edge[rows, :Q + 1]  # [M, 2, A]: PB, Q
    # actions first (see first_argmax0): the arithmetic broadcasts along rows, the argmax reduces over the first axis
    edges = np.ascontiguousarray(edges.transpose(1, 2, 0)) if isinstance(edges, np.ndarray) else edges.permute(1, 2, 0)
    choice = puct_choices(edges[PB], edges[Q], low[trees], span[trees])  # [M]
    t.choice[rows] = choice
    t.next_row[rows] = t.child_flat[rows * t.child_row.shape[1] + choice]


def backup(t: TreeArrays, path: list[Array], leaf_rows: Array, leaf_value: Array, min_max: bool = True
           ) -> tuple[Array, Array, Array | None]:
    """Backs the new leaves' values up to the roots (MuZero pseudocode `backpropagate`), all depths at once.

    path: L arrays [B] int64, the rows visited by the selection, root first; a row repeated from one step to the
    next is where the descent stopped (it is padding). leaf_rows [B] int64, the new nodes, children of the last
    real row; leaf_value [B] their network values. Every node on the path gets one visit and the discounted return
    from it,

        G(leaf) = v,   G(parent) = r(child) + discount(child) * G(child),

    added to its value sum; the edge into each of them gets the child's visits, mean value and Q; the tree's
    min_q / max_q take in those Q. Returns the backed-up rows [M] (the roots first, in tree order, then each
    deeper level; on the host without the padding, elsewhere all (L + 1) * B with the scratch row), their visits [M],
    and whether each tree's min_q or max_q changed [B] bool (None with min_max False: Gumbel MuZero normalises
    per node and leaves min_q / max_q alone).
    """
    xp = namespace(leaf_rows)
    scratch = t.scratch
    rows = stack0([*path, leaf_rows])  # [L + 1, B]
    rows[1:-1] = xp.where(rows[1:-1] == rows[:-2], scratch, rows[1:-1])
    before = take_rows(t.node, rows)  # [L + 1, B, 5], a copy
    rewards, discounts = before[..., REWARD], before[..., DISCOUNT]
    returns = xp.empty_like(rewards)  # G of each row; scratch rows (reward 0, discount 1) pass the value through
    returns[-1] = leaf_value
    for j in range(rows.shape[0] - 1, 0, -1):
        xp.multiply(discounts[j], returns[j], out=returns[j - 1])
        returns[j - 1] += rewards[j]
    visits = before[..., VISITS] + 1.0  # [L + 1, B]
    value_sums = before[..., VALUE_SUM] + returns
    cells = rows * t.node.shape[1]  # flat (row, column 0); rows repeat only at the scratch row, which nothing reads
    t.node_flat[cells + VISITS] = visits
    t.node_flat[cells + VALUE_SUM] = value_sums

    children = rows[1:]  # [L, B]
    edge_statistics = new_empty(before, (3, *children.shape))  # [3, L, B]: t.backup_offsets' channels
    edge_statistics[0] = visits[1:]
    mean = edge_statistics[1]
    xp.divide(value_sums[1:], visits[1:], out=mean)
    q = edge_statistics[2]
    xp.multiply(discounts[1:], mean, out=q)
    q += rewards[1:]
    links = take_rows(t.node_index, children)  # [L, B, 3]
    edges = links[..., PARENT_ROW] * (t.edge.shape[1] * t.edge.shape[2]) + links[..., ACTION]  # flat (parent, 0, a)
    # channels first: numpy broadcasts over a last axis of 3 at a per-row cost
    t.edge_flat[edges[None] + t.backup_offsets[:, None, None]] = edge_statistics
    rescaled = None
    if min_max:  # padding repeats the leaf's edge, always on the path
        rescaled = _take_in_range(t, xp.where(children != scratch, q, q[-1:]))
    if xp is np:  # a data-dependent size costs nothing on the host, and the refreshes then skip the padding
        real = rows != scratch
        return rows[real], visits[real], rescaled
    return rows.reshape(-1), visits.reshape(-1), rescaled


def _take_in_range(t: TreeArrays, q: Array) -> Array:
    """Widens each tree's [min_q, max_q] to the backed-up Q [L, B]; returns whether it changed [B] bool (True
    wherever a NaN is involved: a NaN bound takes away the range)."""
    xp = namespace(q)
    low, high = amin(q, 0), amax(q, 0)
    rescaled = ~((low >= t.min_q) & (high <= t.max_q))
    xp.minimum(t.min_q, low, out=t.min_q)
    xp.maximum(t.max_q, high, out=t.max_q)
    return rescaled
