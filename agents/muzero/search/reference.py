"""A plain scalar MuZero search, one tree and one node at a time, written from the MuZero pseudocode
(Schrittwieser et al. 2020, `run_mcts`, `select_child`, `ucb_score`, `backpropagate`, `MinMaxStats`). It is the
test oracle of the batched search (tests/test_search.py), so it follows the same conventions, stated in
agents/muzero/search/__init__.py and puct.py:

  - the root, like every node, counts its own expansion as one visit with its network value (the pseudocode
    leaves the root at 0 visits, so its first selection would ignore the prior);
  - Q(s, a) = reward + discount * V(child) with the edge's own discount (0 after a terminal);
  - MinMaxStats take in the Q of every edge on a backed-up path (the root has no edge into it); a child's
    normalised Q is (Q - min) / (max - min) when max > min, else 0, and 0 while the child is unvisited;
  - ties go to the lowest action index; invalid root actions are never selected.

Slow by design: it is here to be obviously right, not fast.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from seed.agents.muzero.search.tree import tree_map
from seed.agents.muzero.search.types import RecurrentFn, SearchConfig


class MinMaxStats:
    def __init__(self) -> None:
        self.maximum = -math.inf
        self.minimum = math.inf

    def update(self, value: float) -> None:
        self.maximum = max(self.maximum, value)
        self.minimum = min(self.minimum, value)

    def normalize(self, value: float) -> float:
        if self.maximum > self.minimum:
            return (value - self.minimum) / (self.maximum - self.minimum)
        return 0.0


class Node:
    def __init__(self, prior: float):
        self.prior = prior
        self.visit_count = 0
        self.value_sum = 0.0
        self.reward = 0.0
        self.discount = 1.0
        self.children: dict[int, Node] = {}
        self.embedding: Any = None

    def expanded(self) -> bool:
        return len(self.children) > 0

    def value(self) -> float:
        return self.value_sum / self.visit_count if self.visit_count else 0.0


def _softmax(logits: list[float]) -> list[float]:
    top = max(logits)
    exps = [math.exp(x - top) for x in logits]
    total = sum(exps)
    return [e / total for e in exps]


def _expand(node: Node, logits: list[float], actions: list[int]) -> None:
    prior = _softmax([logits[a] for a in actions])
    for action, p in zip(actions, prior, strict=True):
        node.children[action] = Node(p)


def ucb_score(config: SearchConfig, parent: Node, child: Node, min_max_stats: MinMaxStats) -> float:
    pb_c = math.log((parent.visit_count + config.pb_c_base + 1) / config.pb_c_base) + config.pb_c_init
    pb_c *= math.sqrt(parent.visit_count) / (child.visit_count + 1)
    prior_score = pb_c * child.prior
    if child.visit_count > 0:
        value_score = min_max_stats.normalize(child.reward + child.discount * child.value())
    else:
        value_score = 0.0
    return prior_score + value_score


def select_child(config: SearchConfig, node: Node, min_max_stats: MinMaxStats) -> tuple[int, Node]:
    best_action, best_score = -1, -math.inf
    for action in sorted(node.children):  # strict > keeps the lowest action among ties
        score = ucb_score(config, node, node.children[action], min_max_stats)
        if score > best_score:
            best_action, best_score = action, score
    return best_action, node.children[best_action]


def backpropagate(search_path: list[Node], value: float, min_max_stats: MinMaxStats) -> None:
    for depth in range(len(search_path) - 1, -1, -1):
        node = search_path[depth]
        node.value_sum += value
        node.visit_count += 1
        if depth > 0:
            min_max_stats.update(node.reward + node.discount * node.value())
        value = node.reward + node.discount * value


def reference_search(prior_logits: list[float], value: float, embedding: Any, recurrent_fn: RecurrentFn,
                     config: SearchConfig, invalid: list[bool] | None = None) -> tuple[list[int], float, Node]:
    """pUCT search of one tree without noise. embedding: the root's pytree with a leading batch dimension of 1;
    recurrent_fn is called with batches of 1. Returns (root children's visit counts [A], root value, root)."""
    num_actions = len(prior_logits)
    valid = [a for a in range(num_actions) if not (invalid and invalid[a])]
    root = Node(1.0)
    root.embedding = embedding
    _expand(root, prior_logits, valid)
    root.visit_count, root.value_sum = 1, value
    min_max_stats = MinMaxStats()
    for _ in range(config.num_simulations):
        node = root
        search_path = [node]
        action = -1
        while node.expanded():
            action, node = select_child(config, node, min_max_stats)
            search_path.append(node)
        parent = search_path[-2]
        out = recurrent_fn(parent.embedding, torch.tensor([action]))
        node.embedding = out.embedding
        node.reward = float(out.reward[0])
        node.discount = float(out.discount[0])
        _expand(node, [float(x) for x in out.prior_logits[0]], list(range(num_actions)))
        backpropagate(search_path, float(out.value[0]), min_max_stats)
    visits = [root.children[a].visit_count if a in root.children else 0 for a in range(num_actions)]
    return visits, root.value(), root


def reference_batch(prior_logits: torch.Tensor, value: torch.Tensor, embedding: Any, recurrent_fn: RecurrentFn,
                    config: SearchConfig, invalid: torch.Tensor | None = None) -> tuple[list[list[int]], list[float]]:
    """reference_search on each of B trees in turn: ([B][A] visit counts, [B] root values)."""
    visits, values = [], []
    for b in range(prior_logits.shape[0]):
        v, root_value, _ = reference_search(
            [float(x) for x in prior_logits[b]], float(value[b]), tree_map(lambda x, b=b: x[b:b + 1], embedding),
            recurrent_fn, config, None if invalid is None else [bool(x) for x in invalid[b]])
        visits.append(v)
        values.append(root_value)
    return visits, values


# --- Gumbel MuZero ------------------------------------------------------------------------------------------------
# The same conventions as the batched search (search/gumbel.py), one node at a time, written from the Gumbel MuZero
# paper (Danihelka et al. 2022, eqs. 8, 14 and 33) and mctx's qtransform_completed_by_mix_value:
#   - completed Q(a) = Q(a) for a visited child, else v_mix = (v + sum_b N(b) * sum_{visited} pi(b) Q(b) /
#     sum_{visited} pi(b)) / (1 + sum_b N(b)) (v: the node's network value; pi: its prior, floored at the float64
#     tiny), over all A actions (a root's invalid ones too, as mctx);
#   - sigma(a) = (maxvisit_init + max_b N(b)) * value_scale * (completed Q(a) - min) / max(max - min, MIN_Q_RANGE);
#   - improved policy = softmax(logits + sigma), invalid root actions at 0;
#   - root: sequential halving, argmax of max(g + logits + sigma, LOW_LOGIT) over the valid actions with the
#     schedule's visit count; inside: argmax improved(a) - N(a) / (1 + sum_b N(b)); ties to the lowest index;
#   - after the search: the same root score over the most visited valid actions picks the action.


class GumbelNode(Node):
    def __init__(self, prior: float, logit: float):
        super().__init__(prior)
        self.logit = logit
        self.raw_value = 0.0
        self.children: dict[int, GumbelNode] = {}

    def q(self, action: int) -> float | None:
        """reward + discount * V(child) of a visited child, None for an unvisited one."""
        child = self.children.get(action)
        if child is None or child.visit_count == 0:
            return None
        return child.reward + child.discount * child.value()


def _gumbel_expand(node: GumbelNode, logits: list[float], invalid: list[bool]) -> None:
    valid = [a for a in range(len(logits)) if not invalid[a]]
    prior = dict(zip(valid, _softmax([logits[a] for a in valid]), strict=True))
    for action, logit in enumerate(logits):
        node.children[action] = GumbelNode(prior.get(action, 0.0), logit)


def completed_q_sigma_scalar(node: GumbelNode, config: SearchConfig) -> list[float]:
    """sigma(completed Q) of every action of an expanded node (see above)."""
    from seed.agents.muzero.search.gumbel import MIN_Q_RANGE, TINY

    actions = sorted(node.children)
    visits = [node.children[a].visit_count for a in actions]
    q = [node.q(a) for a in actions]
    prior = [max(node.children[a].prior, TINY[1]) for a in actions]
    visited_prior = sum(p for p, value in zip(prior, q, strict=True) if value is not None)
    weighted_q = (sum(p * value for p, value in zip(prior, q, strict=True) if value is not None) / visited_prior
                  if visited_prior > 0 else 0.0)
    sum_visits = sum(visits)
    mixed = (node.raw_value + sum_visits * weighted_q) / (1 + sum_visits)
    completed = [mixed if value is None else value for value in q]
    low, high = min(completed), max(completed)
    scale = (config.maxvisit_init + max(visits)) * config.value_scale
    return [scale * (value - low) / max(high - low, MIN_Q_RANGE) for value in completed]


def improved_policy_scalar(node: GumbelNode, config: SearchConfig, invalid: list[bool] | None = None) -> list[float]:
    """softmax(logits + sigma(completed Q)) over the node's valid actions, 0 on invalid ones."""
    sigma = completed_q_sigma_scalar(node, config)
    actions = sorted(node.children)
    valid = [a for a in actions if not (invalid and invalid[a])]
    policy = dict(zip(valid, _softmax([node.children[a].logit + sigma[a] for a in valid]), strict=True))
    return [policy.get(a, 0.0) for a in actions]


def interior_action_scalar(node: GumbelNode, config: SearchConfig) -> int:
    """argmax_a improved(a) - N(a) / (1 + sum_b N(b)), the lowest index among ties (the paper's eq. 14)."""
    improved = improved_policy_scalar(node, config)
    total = 1 + sum(child.visit_count for child in node.children.values())
    scores = [improved[a] - node.children[a].visit_count / total for a in sorted(node.children)]
    return scores.index(max(scores))


def _root_score(node: GumbelNode, gumbel: list[float], sigma: list[float], action: int) -> float:
    from seed.agents.muzero.search.gumbel import LOW_LOGIT

    return max(gumbel[action] + node.children[action].logit + sigma[action], LOW_LOGIT)


def root_action_scalar(node: GumbelNode, config: SearchConfig, gumbel: list[float], invalid: list[bool],
                       visits_needed: int | None) -> int:
    """Sequential halving's pick among the valid root actions with `visits_needed` visits (None: the most
    visited ones, after the search): argmax max(g + logits + sigma, LOW_LOGIT), the lowest index among ties."""
    sigma = completed_q_sigma_scalar(node, config)
    valid = [a for a in sorted(node.children) if not invalid[a]]
    if visits_needed is None:
        visits_needed = max(node.children[a].visit_count for a in valid)
    best_action, best_score = -1, -math.inf
    for action in valid:
        score = _root_score(node, gumbel, sigma, action)
        if node.children[action].visit_count == visits_needed and score > best_score:
            best_action, best_score = action, score
    return best_action


def reference_gumbel_search(prior_logits: list[float], value: float, embedding: Any, recurrent_fn: RecurrentFn,
                            config: SearchConfig, gumbel: list[float], invalid: list[bool] | None = None
                            ) -> tuple[list[int], float, GumbelNode, int, list[float]]:
    """Gumbel MuZero search of one tree. gumbel [A]: the root's Gumbel draws, already times gumbel_scale;
    embedding: the root's pytree with a batch dimension of 1. Returns (root children's visit counts [A], root
    value, root, the action played, the improved policy [A])."""
    from seed.agents.muzero.search.gumbel import considered_visits_sequence

    num_actions = len(prior_logits)
    invalid = list(invalid) if invalid else [False] * num_actions
    top = max(x for x, bad in zip(prior_logits, invalid, strict=True) if not bad)
    logits = [x - top for x in prior_logits]  # the batched search keeps the root's logits less their maximum
    root = GumbelNode(1.0, 0.0)
    root.embedding = embedding
    _gumbel_expand(root, logits, invalid)
    root.visit_count, root.value_sum, root.raw_value = 1, value, value
    considered = min(config.max_num_considered_actions, num_actions - sum(invalid))
    schedule = considered_visits_sequence(considered, config.num_simulations)
    for k in range(config.num_simulations):
        node, search_path = root, [root]
        action = root_action_scalar(root, config, gumbel, invalid, schedule[k])
        while node.children[action].visit_count > 0:
            node = node.children[action]
            search_path.append(node)
            action = interior_action_scalar(node, config)
        parent, node = node, node.children[action]
        search_path.append(node)
        out = recurrent_fn(parent.embedding, torch.tensor([action]))
        node.embedding = out.embedding
        node.reward = float(out.reward[0])
        node.discount = float(out.discount[0])
        node.raw_value = float(out.value[0])
        _gumbel_expand(node, [float(x) for x in out.prior_logits[0]], [False] * num_actions)
        value_up = node.raw_value
        for depth in range(len(search_path) - 1, -1, -1):
            path_node = search_path[depth]
            path_node.value_sum += value_up
            path_node.visit_count += 1
            value_up = path_node.reward + path_node.discount * value_up
    visits = [root.children[a].visit_count for a in range(num_actions)]
    action = root_action_scalar(root, config, gumbel, invalid, None)
    return visits, root.value(), root, action, improved_policy_scalar(root, config, invalid)
