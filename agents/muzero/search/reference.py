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
