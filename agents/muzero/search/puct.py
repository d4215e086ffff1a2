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
recomputed for the nodes of each backed-up path. After each backup every expanded node's choice is recomputed
under the tree's new normalisation (`refresh_puct_choices`: elementwise ops over [B, nodes so far, A], cheaper
than scoring during the descent), so the next descent is one gather per depth for all B trees.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from seed.agents.muzero.search.tree import (
    DISCOUNT,
    EDGE,
    EDGE_VISITS,
    PB,
    PRIOR,
    REWARD,
    VALUE_SUM,
    VISITS,
    Q,
    Tree,
)


def prior_scores(prior: Tensor, children_visits: Tensor, visits: Tensor, pb_c_base: float, pb_c_init: float) -> Tensor:
    """pUCT's exploration term (log((N + c2 + 1) / c2) + c1) * (sqrt(N) / (n + 1)) * P.

    prior, children_visits [..., A]; visits [...] (N of the parent). Returns [..., A].
    """
    pb_c = torch.log((visits + (pb_c_base + 1.0)) / pb_c_base) + pb_c_init
    return (pb_c.unsqueeze(-1) * (visits.sqrt().unsqueeze(-1) / (children_visits + 1.0))) * prior


def q_normaliser(tree: Tree) -> tuple[Tensor, Tensor]:
    """(low [B], span [B]) such that ((Q - low) / span).clamp_min(0) is the normalised Q of a visited child and 0 for
    an unvisited one (whose cached Q is -inf). Without a range (max_q <= min_q) low is +inf, so every normalised
    value is 0."""
    has_range = tree.max_q > tree.min_q
    return torch.where(has_range, tree.min_q, torch.inf), torch.where(has_range, tree.max_q - tree.min_q, 1.0)


def puct_choices(cache: Tensor, low: Tensor, span: Tensor) -> Tensor:
    """argmax_a PB(a) + Qn(a), the lowest index among ties. cache [..., 2, A] (channels PB = 0, Q = 1); low, span
    broadcast to [..., 1]. Returns [...] int64."""
    return (cache[..., PB, :] + ((cache[..., Q, :] - low) / span).clamp_min_(0.0)).argmax(-1)


def refresh_puct_choices(tree: Tree, num_used: int) -> None:
    """Recomputes the pUCT action (`Tree.choice`) and the child it leads to (`Tree.next_row`, the node's own row
    while that edge is unexpanded) of nodes 0 .. num_used - 1 of every tree under the tree's current normalisation:
    a few elementwise ops over [B, num_used, A] per simulation, after which the next descent is one gather per depth
    for all B trees."""
    b, n, a = tree.num_trees, tree.num_nodes, tree.num_actions
    low, span = q_normaliser(tree)
    caches = tree.edge[:-1, PB:Q + 1].view(b, n, 2, a)[:, :num_used]
    choice = puct_choices(caches, low.view(b, 1, 1), span.view(b, 1, 1))  # [B, num_used]
    tree.choice[:-1].view(b, n)[:, :num_used] = choice
    next_rows = tree.child_row[:-1].view(b, n, a)[:, :num_used].gather(2, choice.unsqueeze(2))
    tree.next_row[:-1].view(b, n)[:, :num_used] = next_rows.squeeze(2)


def backup(tree: Tree, path: Tensor, leaf_rows: Tensor, leaf_value: Tensor, host: bool = False) -> Tensor:
    """Backs the new leaves' values up to the roots (MuZero pseudocode `backpropagate`), all depths at once.

    path [B, L] int64: the rows visited by the selection, root first; a row repeated from one step to the next is
    where the descent stopped (it is padding). leaf_rows [B] int64, the new nodes, children of the last real row;
    leaf_value [B] their network values. Every node on the path gets one visit and the discounted return from it,

        G(leaf) = v,   G(parent) = r(child) + discount(child) * G(child),

    added to its value sum; the edge into each of them gets the child's visits, mean value and Q; the tree's
    min_q / max_q take in those Q. Returns the backed-up rows [B, L + 1] (root first, leaf last, scratch-padded).
    host: run the loop over depth on numpy views (CPU tensors only; the same arithmetic, fewer microseconds).
    """
    b, length = path.shape
    scratch = tree.scratch
    rows = torch.cat((path[:, :1], torch.where(path[:, 1:] == path[:, :-1], scratch, path[:, 1:]),
                      leaf_rows.unsqueeze(1)), 1)
    flat_rows = rows.view(-1)
    before = tree.node.index_select(0, flat_rows).view(b, length + 1, -1)
    if host:
        rewards, discounts = before[:, :, REWARD].numpy().T, before[:, :, DISCOUNT].numpy().T
        value = leaf_value.numpy()
    else:
        rewards, discounts = before[:, :, REWARD].unbind(1), before[:, :, DISCOUNT].unbind(1)
        value = leaf_value
    values = [value]
    for j in range(length, 0, -1):  # scratch rows have reward 0, discount 1: the value passes through
        value = rewards[j] + discounts[j] * value
        values.append(value)
    values.reverse()
    backed = torch.from_numpy(np.stack(values, 1)) if host else torch.stack(values, 1)  # [B, L + 1]
    tree.node[:, VISITS:VALUE_SUM + 1].index_add_(0, flat_rows, torch.stack((torch.ones_like(backed), backed), 2)
                                                  .view(-1, 2))

    children = rows[:, 1:]
    after = tree.node.index_select(0, children.reshape(-1)).view(b, length, -1)
    visits = after[:, :, VISITS]
    mean = after[:, :, VALUE_SUM] / visits
    q = before[:, 1:, REWARD] + before[:, 1:, DISCOUNT] * mean
    edge_offsets = tree.node_index[:, EDGE].index_select(0, children.reshape(-1)).view(b, length, 1)
    tree.edge.view(-1).index_put_((edge_offsets + tree.backup_offsets,), torch.stack((visits, mean, q), 2))
    q = torch.where(children != scratch, q, q[:, -1:])  # padding repeats the leaf's edge, always on the path
    low, high = torch.aminmax(q, dim=1)
    torch.minimum(tree.min_q, low, out=tree.min_q)
    torch.maximum(tree.max_q, high, out=tree.max_q)
    return rows


def refresh_prior_scores(tree: Tree, rows: Tensor, root_mask: Tensor, pb_c_base: float, pb_c_init: float) -> None:
    """Recomputes the cached exploration term (channel PB) of the children of rows [B, L] (root first: the nodes
    just backed up through, whose visits changed). root_mask [B, A]: 0 for valid root actions, -inf for invalid
    ones, added to the root's row so that they are never selected."""
    b, length = rows.shape
    flat_rows = rows.reshape(-1)
    edges = tree.edge[:, EDGE_VISITS:PRIOR + 1].index_select(0, flat_rows).view(b, length, 2, -1)
    visits = tree.node[:, VISITS].index_select(0, flat_rows).view(b, length)
    scores = prior_scores(edges[:, :, PRIOR - EDGE_VISITS], edges[:, :, 0], visits, pb_c_base, pb_c_init)
    scores[:, 0] += root_mask
    tree.edge[:, PB].index_copy_(0, flat_rows, scores.view(b * length, -1))
