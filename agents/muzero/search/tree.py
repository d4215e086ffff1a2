"""The search tree of B trees as tensors, and expansion (one batched `recurrent_fn` call per simulation).

Storage. Every tree has N = num_simulations + 1 nodes; node 0 is the root and simulation k (from 0) creates node
k + 1 in every tree, so node indices are known on the host and never read back. The tensors are kept as flat
*rows*: row b * N + n is node n of tree b, and one extra row, `scratch = B * N`, absorbs the padding of search
paths (paths of different lengths are padded with it, so a backup is one scatter for all depths; its reward 0
and discount 1 pass a backed-up value through unchanged).

  node        [B * N + 1, 5] float   VISITS, VALUE_SUM, RAW_VALUE (the network's value), REWARD and DISCOUNT of the
                                     edge into the node
  node_index  [B * N + 1, 4] int64   PARENT_ROW, ACTION (from the parent), DEPTH (root 0), EDGE (the flat offset
                                     parent_row * 8A + action of the edge into the node in `edge`)
  edge        [B * N + 1, 8, A] float  per child: PB (pUCT's prior score, a cache), Q (reward + discount * value,
                                     -inf while unvisited), VISITS, PRIOR, LOGITS, VALUES (the child's mean value),
                                     REWARD, DISCOUNT; ordered so that what one step reads is adjacent
  child_row   [B * N + 1, A] int64   the child's row; an unexpanded edge points at its own row, so a descent that
                                     reaches an unexpanded edge stays where it is without a branch
  choice      [B * N + 1] int64      the action the next descent takes at each node (recomputed after each backup)
  next_row    [B * N + 1] int64      the row that action leads to (the node's own row while it is unexpanded)
  embeddings  pytree of [B * N + 1, ...]

`Tree` gives the per-tree views of the API ([B, N], [B, N, A]); `finished_tree` adds the per-tree indices
(children_index with -1 for unexpanded, parent with -1 for the root) once, after the search.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from seed.agents.muzero.search.types import RecurrentFn

# node columns
VISITS, VALUE_SUM, RAW_VALUE, REWARD, DISCOUNT = range(5)
# node_index columns
PARENT_ROW, ACTION, DEPTH, EDGE = range(4)
# edge channels
PB, Q, EDGE_VISITS, PRIOR, LOGITS, EDGE_VALUES, EDGE_REWARD, EDGE_DISCOUNT = range(8)
EDGE_CHANNELS = 8


def tree_map(fn: Any, tree: Any) -> Any:
    """Applies fn to every tensor of a pytree of tensors, tuples, lists and dicts."""
    if isinstance(tree, Tensor):
        return fn(tree)
    if isinstance(tree, dict):
        return {key: tree_map(fn, value) for key, value in tree.items()}
    if isinstance(tree, (tuple, list)):
        return type(tree)(tree_map(fn, value) for value in tree)
    raise TypeError(f"embedding: got a {type(tree).__name__} leaf, expected tensors in tuples, lists or dicts")


def tree_map2(fn: Any, a: Any, b: Any) -> None:
    """Calls fn(x, y) on matching tensors of two pytrees of the same structure."""
    if isinstance(a, Tensor):
        fn(a, b)
    elif isinstance(a, dict):
        for key in a:
            tree_map2(fn, a[key], b[key])
    else:
        for x, y in zip(a, b, strict=True):
            tree_map2(fn, x, y)


@dataclass
class Tree:
    """B search trees of N nodes over A actions. The per-tree fields are views of the flat rows (see the module
    docstring); all float fields have the search's dtype."""

    num_trees: int  # B
    num_nodes: int  # N = num_simulations + 1
    num_actions: int  # A
    visit_count: Tensor  # [B, N] visits of each node (its own expansion counts as one)
    value_sum: Tensor  # [B, N] sum of the values backed up into the node (its network value included)
    raw_value: Tensor  # [B, N] the network's value of the node
    prior: Tensor  # [B, N, A] policy of the node's children (root: masked, with exploration noise)
    prior_logits: Tensor  # [B, N, A] the network's logits (root: invalid actions masked)
    children_reward: Tensor  # [B, N, A] reward of the edge to each child (0 while unexpanded)
    children_discount: Tensor  # [B, N, A] discount of the edge to each child
    children_visits: Tensor  # [B, N, A] visits of each child
    children_values: Tensor  # [B, N, A] mean value of each child (0 while unvisited)
    depth: Tensor  # [B, N] int64, the root is at depth 0
    min_q: Tensor  # [B] smallest Q = reward + discount * value seen in the tree's backups (+inf before any)
    max_q: Tensor  # [B] largest such Q (-inf before any)
    root_invalid: Tensor  # [B, A] bool, actions that may not be taken at the root
    embeddings: Any  # pytree of [B, N, ...], node latent states
    node: Tensor  # [B * N + 1, 5] flat rows (see the module docstring)
    node_index: Tensor  # [B * N + 1, 4] int64
    edge: Tensor  # [B * N + 1, 8, A]
    child_row: Tensor  # [B * N + 1, A] int64
    choice: Tensor  # [B * N + 1] int64
    next_row: Tensor  # [B * N + 1] int64
    flat_embeddings: Any  # pytree of [B * N + 1, ...]
    base: Tensor  # [B] int64, the row of each root (b * N)
    reward_discount_offsets: Tensor  # [2] int64, the offsets of EDGE_REWARD and EDGE_DISCOUNT in an edge row
    backup_offsets: Tensor  # [3] int64, the offsets of EDGE_VISITS, EDGE_VALUES and Q in an edge row
    children_index: Tensor | None = None  # [B, N, A] int64, the child's node index, -1 = unexpanded (set at the end)
    parent: Tensor | None = None  # [B, N] int64, -1 for the root and unused nodes (set at the end)
    action_from_parent: Tensor | None = None  # [B, N] int64, -1 for the root and unused nodes (set at the end)

    @property
    def scratch(self) -> int:
        """The padding row."""
        return self.num_trees * self.num_nodes

    def node_view(self, column: int) -> Tensor:
        return self.node[:-1, column].view(self.num_trees, self.num_nodes)

    def edge_view(self, channel: int) -> Tensor:
        return self.edge[:-1, channel].view(self.num_trees, self.num_nodes, self.num_actions)


def new_tree(num_trees: int, num_nodes: int, num_actions: int, embedding: Any, dtype: torch.dtype,
             device: torch.device) -> Tree:
    """An empty tree: nothing visited, every edge unexpanded (pointing at its own row), embeddings zero with the
    root embedding's trailing shapes and dtypes."""
    rows = num_trees * num_nodes + 1
    node = torch.zeros(rows, 5, dtype=dtype, device=device)
    node[-1, DISCOUNT] = 1.0  # the scratch row passes values through
    node_index = torch.zeros(rows, 4, dtype=torch.int64, device=device)
    node_index[:, EDGE] = (rows - 1) * EDGE_CHANNELS * num_actions  # scratch edge until expanded
    edge = torch.zeros(rows, EDGE_CHANNELS, num_actions, dtype=dtype, device=device)
    edge[:, Q] = -torch.inf
    child_row = torch.arange(rows, device=device).unsqueeze(1).expand(rows, num_actions).contiguous()
    choice = torch.zeros(rows, dtype=torch.int64, device=device)
    next_row = torch.arange(rows, device=device)
    flat_embeddings = tree_map(lambda x: x.new_zeros((rows, *x.shape[1:])), embedding)
    shape = (num_trees, num_nodes)

    def nodes(column: int) -> Tensor:
        return node[:-1, column].view(shape)

    def edges(channel: int) -> Tensor:
        return edge[:-1, channel].view(*shape, num_actions)

    return Tree(
        num_trees=num_trees, num_nodes=num_nodes, num_actions=num_actions,
        visit_count=nodes(VISITS), value_sum=nodes(VALUE_SUM), raw_value=nodes(RAW_VALUE),
        prior=edges(PRIOR), prior_logits=edges(LOGITS), children_reward=edges(EDGE_REWARD),
        children_discount=edges(EDGE_DISCOUNT), children_visits=edges(EDGE_VISITS), children_values=edges(EDGE_VALUES),
        depth=node_index[:-1, DEPTH].view(shape),
        min_q=torch.full((num_trees,), torch.inf, dtype=dtype, device=device),
        max_q=torch.full((num_trees,), -torch.inf, dtype=dtype, device=device),
        root_invalid=torch.zeros(num_trees, num_actions, dtype=torch.bool, device=device),
        embeddings=tree_map(lambda x: x[:-1].view(*shape, *x.shape[1:]), flat_embeddings),
        node=node, node_index=node_index, edge=edge, child_row=child_row, choice=choice, next_row=next_row,
        flat_embeddings=flat_embeddings, base=torch.arange(num_trees, device=device) * num_nodes,
        reward_discount_offsets=torch.tensor([EDGE_REWARD * num_actions, EDGE_DISCOUNT * num_actions], device=device),
        backup_offsets=torch.tensor([EDGE_VISITS * num_actions, EDGE_VALUES * num_actions, Q * num_actions],
                                    device=device))


def expand(tree: Tree, parent_rows: Tensor, actions: Tensor, edge_offsets: Tensor, new_node: int,
           recurrent_fn: RecurrentFn) -> tuple[Tensor, Tensor]:
    """Expands edge (parent_rows[b], actions[b]) of every tree b into node `new_node` with one `recurrent_fn` call.

    parent_rows [B] int64 rows; actions [B] int64; edge_offsets [B] int64 = parent_rows * A + actions (the offsets
    into `child_row`, already computed by the selection). Writes the new node's row (visits and value sum stay 0:
    the backup adds the node's own value), its prior and logits, the parent's edge reward and discount, the links
    and the embedding. Returns the new nodes' values [B] (in the tree's dtype) and depths [B] int64.
    """
    b, n, a = tree.num_trees, tree.num_nodes, tree.num_actions
    parent_embeddings = tree_map(lambda x: x.index_select(0, parent_rows), tree.flat_embeddings)
    out = recurrent_fn(parent_embeddings, actions)
    dtype = tree.node.dtype
    reward, discount, value = out.reward.to(dtype), out.discount.to(dtype), out.value.to(dtype)
    logits = out.prior_logits.to(dtype)
    tree.node[:-1].view(b, n, 5)[:, new_node, RAW_VALUE:] = torch.stack((value, reward, discount), 1)
    depth = tree.node_index[:, DEPTH].index_select(0, parent_rows).add_(1)
    edge_offset = torch.add(actions, parent_rows, alpha=EDGE_CHANNELS * a)
    tree.node_index[:-1].view(b, n, 4)[:, new_node] = torch.stack((parent_rows, actions, depth, edge_offset), 1)
    leaf_edges = tree.edge[:-1].view(b, n, EDGE_CHANNELS, a)[:, new_node]
    leaf_edges[:, PRIOR] = torch.softmax(logits, -1)
    leaf_edges[:, LOGITS] = logits
    offsets = edge_offset.unsqueeze(1) + tree.reward_discount_offsets
    tree.edge.view(-1).index_put_((offsets,), torch.stack((reward, discount), 1))
    tree.child_row.view(-1).index_put_((edge_offsets,), tree.base + new_node)
    tree_map2(lambda store, x: store[:-1].view(b, n, *store.shape[1:])[:, new_node].copy_(x), tree.flat_embeddings,
              out.embedding)
    return value, depth


def finished_tree(tree: Tree) -> Tree:
    """Adds the per-tree index fields (children_index, parent, action_from_parent) to a searched tree."""
    b, n, a = tree.num_trees, tree.num_nodes, tree.num_actions
    base = tree.base
    rows = torch.arange(b * n, device=base.device)
    child_row = tree.child_row[:-1]
    children_index = torch.where(child_row == rows.unsqueeze(1), -1, child_row - base.repeat_interleave(n)[:, None])
    index = tree.node_index[:-1].view(b, n, 4)
    expanded = tree.visit_count > 0
    expanded[:, 0] = False
    parent = torch.where(expanded, index[..., PARENT_ROW] - base[:, None], -1)
    action = torch.where(expanded, index[..., ACTION], -1)
    return Tree(**{**tree.__dict__, "children_index": children_index.view(b, n, a), "parent": parent,
                   "action_from_parent": action})
