"""Gumbel MuZero (Danihelka et al., ICLR 2022): sequential halving with Gumbel at the root, the deterministic
improved-policy selection inside the tree, and the improved policy as the policy target.

    sigma(q)       = (c_visit + max_b N(b)) * c_scale * q                        c_visit = maxvisit_init,
                                                                                  c_scale = value_scale
    completed Q    = Q(a) for visited a, else v_mix                              (the paper's eq. 33: v_mix mixes
                     the network value with the prior-weighted Q of the visited actions), then min-max rescaled
                     over the node's actions: (Q - min) / max(max - min, MIN_Q_RANGE)
    improved pi    = softmax(logits + sigma(completed Q))

Root, simulation k: among the actions whose visits equal the schedule's considered_visit(k) (sequential halving:
`considered_visits_sequence`), pick argmax g(a) + logits(a) + sigma(completed Q(a)), g ~ Gumbel(0, gumbel_scale).
Inside: pick argmax improved_pi(a) - N(a) / (1 + sum_b N(b)) (the paper's eq. 14). Inside the tree the selected
action of a node only changes when the node is backed up through, so it is cached per node (`Tree.choice`,
`Tree.next_row`) and recomputed for the nodes of each backed-up path, the root's (for the next simulation's
considered visits) with them: one sigma(completed Q) per simulation for all of them (`refresh_choices`).
After the search: the most visited actions compete once more on g + logits + sigma(completed Q); the policy
target is improved pi at the root. Ties go to the lowest action index.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from seed.agents.muzero.search.tree import (
    EDGE_VISITS,
    LOGITS,
    PRIOR,
    RAW_VALUE,
    VISITS,
    Array,
    Q,
    Tree,
    TreeArrays,
    amax,
    amin,
    clip_min,
    namespace,
)
from seed.agents.muzero.search.types import SearchConfig

# The smallest Q range the min-max rescaling of completed Q divides by (EfficientZero floors its min-max
# normalisation at 0.01; mctx at 1e-8): a node whose Q values differ by less than this (e.g. by the float32 noise of
# the value read-out, about 1e-6) gets rescaled differences below 1 in proportion, not stretched to [0, 1].
MIN_Q_RANGE = 0.01
LOW_LOGIT = -1e9  # floor of g + logits + sigma, so that the considered-visits penalty (-inf) always dominates
TINY = (float(np.finfo(np.float32).tiny), float(np.finfo(np.float64).tiny))  # floor of a prior: float32, float64


def considered_visits_sequence(max_num_considered: int, num_simulations: int) -> tuple[int, ...]:
    """Sequential halving's schedule: the visit count an action must have to be selected at each simulation.

    Phases over m, m/2, ..., 2 actions (m = max_num_considered); each phase gives every remaining action
    max(1, floor(n / (ceil(log2 m) * remaining))) more visits. E.g. m = 4, n = 8: (0, 0, 0, 0, 1, 1, 2, 2).
    """
    if max_num_considered <= 1:
        return tuple(range(num_simulations))
    log2max = int(math.ceil(math.log2(max_num_considered)))
    sequence: list[int] = []
    visits = [0] * max_num_considered
    considered = max_num_considered
    while len(sequence) < num_simulations:
        extra = max(1, int(num_simulations / (log2max * considered)))
        for _ in range(extra):
            sequence.extend(visits[:considered])
            for i in range(considered):
                visits[i] += 1
        considered = max(2, considered // 2)
    return tuple(sequence[:num_simulations])


def considered_visits_table(max_num_considered: int, num_simulations: int) -> list[tuple[int, ...]]:
    """Row m: the schedule with m considered actions, for m = 0 .. max_num_considered."""
    return [considered_visits_sequence(m, num_simulations) for m in range(max_num_considered + 1)]


def completed_q_sigma(prior: Array, cached_q: Array, visits: Array, node_visits: Array, raw_value: Array,
                      config: SearchConfig) -> Array:
    """sigma(completed Q), rescaled to [0, 1] over the node's actions before sigma (mctx's
    qtransform_completed_by_mix_value: (Q - min) / max(max - min, MIN_Q_RANGE), the floor EfficientZero's), actions
    first: every reduction is over the first axis.

    prior, cached_q (reward + discount * value, -inf while unvisited), visits [A, M] for M nodes; node_visits [M]
    the node's own visits, 1 + the sum of its children's (its expansion counts as one; given, since it saves a
    sum); raw_value [M] the network's value of the node. Returns [A, M].
    """
    xp = namespace(prior)
    visited = visits > 0
    q = xp.where(visited, cached_q, 0.0)
    sum_visits = node_visits - 1.0
    prior = clip_min(prior, TINY[prior.dtype == xp.float64])
    visited_prior = xp.where(visited, prior, 0.0)
    sum_prior = visited_prior.sum(0)
    weighted_q = (visited_prior * q / xp.where(sum_prior > 0, sum_prior, 1.0)).sum(0)
    mixed = (raw_value + sum_visits * weighted_q) / node_visits
    completed = xp.where(visited, q, mixed)
    low = amin(completed, 0)
    high = amax(completed, 0)
    rescaled = (completed - low) / clip_min(high - low, MIN_Q_RANGE)
    return (config.maxvisit_init + amax(visits, 0)) * config.value_scale * rescaled


def root_choices(gumbel_logits: Array, sigma: Array, visits: Array, considered_visit: Array,
                 invalid: Array) -> Array:
    """argmax g + logits + sigma(completed Q) (floored at LOW_LOGIT) over the valid root actions with
    `considered_visit` [B] visits, actions first. gumbel_logits [A, B]: g + logits - max(logits); sigma, visits
    [A, B]; invalid [A, B] bool. Returns [B] int64."""
    xp = namespace(gumbel_logits)
    score = clip_min(gumbel_logits + sigma, LOW_LOGIT)
    return xp.where((visits != considered_visit) | invalid, -np.inf, score).T.argmax(-1)


def refresh_choices(t: TreeArrays, rows: Array, gumbel_logits: Array, considered_visit: Array, invalid: Array,
                    config: SearchConfig) -> None:
    """Recomputes the action (`choice`) and the child it leads to (`next_row`) of rows [M] (the nodes just backed
    up through; the first B are the roots, in tree order), with one sigma(completed Q) for all of them.

    Roots: the sequential-halving choice of the next simulation (root_choices; considered_visit [B] from the
    schedule, gumbel_logits and invalid [A, B]). Inside: argmax softmax(logits + sigma(completed Q)) - N(a) /
    (1 + sum_b N(b)).

    The edge statistics are copied actions first ([4, A, M]) once: numpy reduces over a short last axis at about
    40 ns per row, over the first axis at a few ns per element, and sigma takes seven reductions.
    """
    xp = namespace(rows)
    b = considered_visit.shape[0]
    edges = t.edge[rows, Q:LOGITS + 1]  # [M, 4, A]: Q, VISITS, PRIOR, LOGITS
    edges = np.ascontiguousarray(edges.transpose(1, 2, 0)) if xp is np else edges.permute(1, 2, 0)  # [4, A, M]
    q, visits, prior, logits = edges[0], edges[1], edges[2], edges[3]
    node = t.node[rows, :RAW_VALUE + 1]  # [M, 3]: VISITS, VALUE_SUM, RAW_VALUE
    node_visits = node[:, VISITS]
    sigma = completed_q_sigma(prior, q, visits, node_visits, node[:, RAW_VALUE], config)  # [A, M]
    choice = root_choices(gumbel_logits, sigma[:, :b], visits[:, :b], considered_visit, invalid)
    if rows.shape[0] > b:
        improved = logits[:, b:] + sigma[:, b:]
        improved = xp.exp(improved - amax(improved, 0))
        improved /= improved.sum(0)
        inside = (improved - visits[:, b:] / node_visits[b:]).T.argmax(-1)  # N(s) = 1 + sum_b N(s, b)
        choice = xp.concatenate((choice, inside))
    t.choice[rows] = choice
    t.next_row[rows] = t.child_flat[rows * t.child_row.shape[1] + choice]


def gumbel_outcome(tree: Tree, gumbel_logits: Tensor, config: SearchConfig) -> tuple[Tensor, Tensor]:
    """(action [B] int64, improved policy [B, A]) after the search: the best of the most visited root actions on
    g + logits + sigma(completed Q), and softmax(logits + sigma(completed Q)) with invalid actions at 0."""
    edges = tree.edge[:-1].view(tree.num_trees, tree.num_nodes, *tree.edge.shape[1:])[:, 0]
    visits = edges[:, EDGE_VISITS]
    sigma = completed_q_sigma(edges[:, PRIOR].T, edges[:, Q].T, visits.T, tree.visit_count[:, 0],
                              tree.raw_value[:, 0], config).T
    score = torch.clip(gumbel_logits + sigma, LOW_LOGIT, None)
    action = score.masked_fill((visits != visits.amax(-1, keepdim=True)) | tree.root_invalid, -torch.inf).argmax(1)
    weights = torch.softmax((edges[:, LOGITS] + sigma).masked_fill(tree.root_invalid, -torch.inf), -1)
    return action, weights
