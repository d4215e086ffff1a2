"""Gumbel MuZero (Danihelka et al., ICLR 2022): sequential halving with Gumbel at the root, the deterministic
improved-policy selection inside the tree, and the improved policy as the policy target.

    sigma(q)       = (c_visit + max_b N(b)) * c_scale * q                        c_visit = maxvisit_init,
                                                                                  c_scale = value_scale
    completed Q    = Q(a) for visited a, else v_mix                              (the paper's eq. 33: v_mix mixes
                     the network value with the prior-weighted Q of the visited actions), then min-max rescaled
                     over the node's actions
    improved pi    = softmax(logits + sigma(completed Q))

Root, simulation k: among the actions whose visits equal the schedule's considered_visit(k) (sequential halving:
`considered_visits_sequence`), pick argmax g(a) + logits(a) + sigma(completed Q(a)), g ~ Gumbel(0, gumbel_scale).
Inside: pick argmax improved_pi(a) - N(a) / (1 + sum_b N(b)) (the paper's eq. 14). Inside the tree the selected
action of a node only changes when the node is backed up through, so it is cached per node (`Tree.choice`,
`Tree.next_row`) and recomputed for the nodes of each backed-up path; the root's is set at each simulation.
After the search: the most visited actions compete once more on g + logits + sigma(completed Q); the policy
target is improved pi at the root. Ties go to the lowest action index.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from seed.agents.muzero.search.tree import EDGE_VISITS, LOGITS, PRIOR, RAW_VALUE, Q, Tree
from seed.agents.muzero.search.types import SearchConfig

LOW_LOGIT = -1e9  # floor of g + logits + sigma, so that the considered-visits penalty (-inf) always dominates


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


def completed_q_sigma(prior: Tensor, cached_q: Tensor, visits: Tensor, raw_value: Tensor,
                      config: SearchConfig) -> Tensor:
    """sigma(completed Q), rescaled to [0, 1] over the node's actions before sigma (mctx's
    qtransform_completed_by_mix_value).

    prior, cached_q (reward + discount * value, -inf while unvisited), visits [..., A];
    raw_value [...] the network's value of the node. Returns [..., A].
    """
    visited = visits > 0
    q = torch.where(visited, cached_q, 0.0)
    sum_visits = visits.sum(-1)
    prior = prior.clamp_min(torch.finfo(prior.dtype).tiny)
    visited_prior = torch.where(visited, prior, 0.0)
    sum_prior = visited_prior.sum(-1, keepdim=True)
    weighted_q = (visited_prior * q / torch.where(sum_prior > 0, sum_prior, 1.0)).sum(-1)
    mixed = (raw_value + sum_visits * weighted_q) / (sum_visits + 1.0)
    completed = torch.where(visited, q, mixed.unsqueeze(-1))
    low = completed.amin(-1, keepdim=True)
    high = completed.amax(-1, keepdim=True)
    rescaled = (completed - low) / (high - low).clamp_min(1e-8)
    return (config.maxvisit_init + visits.amax(-1, keepdim=True)) * config.value_scale * rescaled


def _root(tree: Tree) -> tuple[Tensor, Tensor, Tensor]:
    """The roots' edge rows [B, 8, A], visits [B, A] and network values [B]."""
    edges = tree.edge[:-1].view(tree.num_trees, tree.num_nodes, *tree.edge.shape[1:])[:, 0]
    return edges, edges[:, EDGE_VISITS], tree.node[:-1, RAW_VALUE].view(tree.num_trees, tree.num_nodes)[:, 0]


def _considered_scores(considered_visit: Tensor, gumbel: Tensor, logits: Tensor, sigma: Tensor,
                       visits: Tensor, invalid: Tensor) -> Tensor:
    """g + logits + sigma (floored at LOW_LOGIT) for valid actions with `considered_visit` [B, 1] visits, else
    -inf. All [B, A]."""
    logits = logits - logits.amax(-1, keepdim=True)
    score = (gumbel + logits + sigma).clamp_min(LOW_LOGIT)
    return score.masked_fill((visits != considered_visit) | invalid, -torch.inf)


def select_gumbel_root(tree: Tree, considered_visit: Tensor, gumbel: Tensor, config: SearchConfig) -> None:
    """Sets the roots' choice and next row for one simulation; considered_visit [B] from the schedule, gumbel
    [B, A]."""
    edges, visits, raw_value = _root(tree)
    sigma = completed_q_sigma(edges[:, PRIOR], edges[:, Q], visits, raw_value, config)
    score = _considered_scores(considered_visit.unsqueeze(1), gumbel, edges[:, LOGITS], sigma, visits,
                               tree.root_invalid)
    choice = score.argmax(1)
    tree.choice.index_copy_(0, tree.base, choice)
    tree.next_row.index_copy_(0, tree.base, tree.child_row.view(-1).index_select(
        0, torch.add(choice, tree.base, alpha=tree.num_actions)))


def refresh_choices(tree: Tree, rows: Tensor, config: SearchConfig) -> None:
    """Recomputes the interior action of rows [...] (any shape; the nodes just backed up through):
    argmax softmax(logits + sigma(completed Q)) - N(a) / (1 + sum_b N(b))."""
    flat_rows = rows.reshape(-1)
    edges = tree.edge[:, Q:LOGITS + 1].index_select(0, flat_rows)  # [R, 4, A]: Q, VISITS, PRIOR, LOGITS
    q, visits, prior, logits = edges.unbind(1)
    raw_value = tree.node[:, RAW_VALUE].index_select(0, flat_rows)
    sigma = completed_q_sigma(prior, q, visits, raw_value, config)
    improved = torch.softmax(logits + sigma, -1)
    choice = (improved - visits / (1.0 + visits.sum(-1, keepdim=True))).argmax(1)
    tree.choice.index_copy_(0, flat_rows, choice)
    tree.next_row.index_copy_(0, flat_rows, tree.child_row.view(-1).index_select(
        0, torch.add(choice, flat_rows, alpha=tree.num_actions)))


def gumbel_outcome(tree: Tree, gumbel: Tensor, config: SearchConfig) -> tuple[Tensor, Tensor]:
    """(action [B] int64, improved policy [B, A]) after the search: the best of the most visited root actions on
    g + logits + sigma(completed Q), and softmax(logits + sigma(completed Q)) with invalid actions at 0."""
    edges, visits, raw_value = _root(tree)
    sigma = completed_q_sigma(edges[:, PRIOR], edges[:, Q], visits, raw_value, config)
    considered = visits.amax(-1, keepdim=True)
    action = _considered_scores(considered, gumbel, edges[:, LOGITS], sigma, visits, tree.root_invalid).argmax(1)
    weights = torch.softmax((edges[:, LOGITS] + sigma).masked_fill(tree.root_invalid, -torch.inf), -1)
    return action, weights
