"""The search tree of B trees as tensors, and expansion (one batched `recurrent_fn` call per simulation).

Storage. Every tree has N = num_simulations + 1 nodes; node 0 is the root and simulation k (from 0) creates node
k + 1 in every tree, so node indices are known on the host and never read back. The tensors are kept as flat
*rows*: row b * N + n is node n of tree b, and one extra row, `scratch = B * N`, absorbs the padding of search
paths (paths of different lengths are padded with it, so a backup is one scatter for all depths; its reward 0
and discount 1 pass a backed-up value through unchanged, and its parent is itself).

  node        [B * N + 1, 5] float   VISITS, VALUE_SUM, RAW_VALUE (the network's value), REWARD and DISCOUNT of the
                                     edge into the node
  node_index  [B * N + 1, 3] int64   PARENT_ROW, ACTION (from the parent), DEPTH (root 0)
  edge        [B * N + 1, 8, A] float  per child: PB (pUCT's prior score, a cache), Q (reward + discount * value,
                                     -inf while unvisited), VISITS, PRIOR, LOGITS, VALUES (the child's mean value),
                                     REWARD, DISCOUNT; ordered so that what one step reads is adjacent
  child_row   [B * N + 1, A] int64   the child's row; an unexpanded edge points at its own row, so a descent that
                                     reaches an unexpanded edge stays where it is without a branch
  choice      [B * N + 1] int64      the action the next descent takes at each node (recomputed after each backup)
  next_row    [B * N + 1] int64      the row that action leads to (the node's own row while it is unexpanded)
  embeddings  pytree of [B * N + 1, ...]

The simulation loop works on `TreeArrays`: the same memory as numpy arrays on the CPU (numpy costs about a quarter
of torch's time per call on arrays of tens to thousands of numbers, and the search is mostly such calls), the
tensors themselves on other devices. The functions that take them use only what numpy and torch spell the same
(arithmetic, fancy indexing, `xp.where`, `xp.exp`, `.argmax`, `.sum`, ...; `xp` is the array's module) and the
two helpers below, so one function serves both.

`Tree` gives the per-tree views of the API ([B, N], [B, N, A]); `finished_tree` adds the per-tree indices
(children_index with -1 for unexpanded, parent with -1 for the root) once, after the search.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
import torch
from torch import Tensor

from seed.agents.muzero.search.types import RecurrentFn

# node columns
VISITS, VALUE_SUM, RAW_VALUE, REWARD, DISCOUNT = range(5)
NODE_COLUMNS = 5
# node_index columns
PARENT_ROW, ACTION, DEPTH = range(3)
# edge channels
PB, Q, EDGE_VISITS, PRIOR, LOGITS, EDGE_VALUES, EDGE_REWARD, EDGE_DISCOUNT = range(8)
EDGE_CHANNELS = 8

Array = Any  # numpy.ndarray on the CPU (a view of a tensor's memory), torch.Tensor elsewhere


def namespace(array: Array) -> ModuleType:
    """numpy for a numpy array, torch for a tensor."""
    return np if isinstance(array, np.ndarray) else torch


def take_rows(array: Array, rows: Array) -> Array:
    """array[rows] along the first axis (the fastest gather of each library). array [R, ...], rows [...] int64 ->
    [..., ...]."""
    if isinstance(array, np.ndarray):
        return array.take(rows, 0)
    return array.index_select(0, rows.reshape(-1)).view(*rows.shape, *array.shape[1:])


def amax(array: Array, axis: int) -> Array:
    """The maximum over one axis (numpy's method skips the Python wrapper of np.amax; torch's max returns indices
    too)."""
    return array.max(axis) if isinstance(array, np.ndarray) else array.amax(axis)


def amin(array: Array, axis: int) -> Array:
    """The minimum over one axis."""
    return array.min(axis) if isinstance(array, np.ndarray) else array.amin(axis)


def clip_min(array: Array, low: float) -> Array:
    """max(array, low) elementwise (np.clip's Python wrapper costs more than the operation at these sizes)."""
    return np.maximum(array, low) if isinstance(array, np.ndarray) else array.clamp_min(low)


def new_empty(like: Array, shape: tuple[int, ...]) -> Array:
    """An uninitialised array of `shape` with like's dtype (and device)."""
    return np.empty(shape, like.dtype) if isinstance(like, np.ndarray) else like.new_empty(shape)


def stack0(arrays: list[Array]) -> Array:
    """Stacks [B] arrays into [len, B] (np.array is a quarter of np.stack's time for a list of short arrays)."""
    return np.array(arrays) if isinstance(arrays[0], np.ndarray) else torch.stack(arrays, 0)


_DESCENDING: dict[int, np.ndarray] = {}


def first_argmax0(array: Array) -> Array:
    """The index of the maximum over the first axis, the lowest among ties, a NaN counting as the maximum (numpy's
    and torch's argmax): [A, ...] -> [...] int64.

    numpy's argmax over any axis but the last, and any reduction over a short last axis, cost about 40 ns per row;
    an elementwise reduction over the first axis costs a few ns per element. So on numpy: the maximum over the
    first axis (NaN where a row holds one), then the lowest index that reaches it, or is NaN, as a maximum of
    (A - a) over the rows that do."""
    if not isinstance(array, np.ndarray):
        return array.argmax(0)  # torch returns the first maximal index, the first NaN if there is one
    a = array.shape[0]
    weights = _DESCENDING.get(a)
    if weights is None:
        weights = _DESCENDING[a] = np.arange(a, 0, -1, dtype=np.int64)
    weights = weights.reshape(a, *(1,) * (array.ndim - 1))
    # NaN != NaN: a NaN is nobody's maximum, yet it is the argmax (without this, a column with one gave index A)
    return a - (((array == array.max(0)) | (array != array)) * weights).max(0)


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
class TreeArrays:
    """The storage the simulation loop reads and writes (numpy views on the CPU, the tensors elsewhere), with the
    per-tree views the loop uses at each simulation made once."""

    node: Array  # [B * N + 1, 5]
    node_index: Array  # [B * N + 1, 3] int64
    edge: Array  # [B * N + 1, 8, A]
    child_row: Array  # [B * N + 1, A] int64
    choice: Array  # [B * N + 1] int64
    next_row: Array  # [B * N + 1] int64
    min_q: Array  # [B]
    max_q: Array  # [B]
    base: Array  # [B] int64, the row of each root (b * N)
    tree_index: Array  # [B, 1] int64, b
    row_tree: Array  # [B * N + 1] int64, the tree of each row (0 for the scratch row)
    node_flat: Array  # [(B * N + 1) * 5] view of node
    edge_flat: Array  # [(B * N + 1) * 8 * A] view of edge: element (row, channel, a) at (row * 8 + channel) * A + a
    child_flat: Array  # [(B * N + 1) * A] view of child_row
    backup_offsets: Array  # [3] int64: channel * A of EDGE_VISITS, EDGE_VALUES, Q (what a backup writes)
    node_number: Array  # [1, N] int64, n
    rows: Array  # [B, N] int64, the row of each node (b * N + n)
    nodes: Array  # [B, N, 5] view of node
    node_indices: Array  # [B, N, 3] view of node_index
    edges: Array  # [B, N, 8, A] view of edge
    children: Array  # [B, N, A] view of child_row
    choices: Array  # [B, N] view of choice
    next_rows: Array  # [B, N] view of next_row

    @property
    def scratch(self) -> int:
        """The padding row."""
        return self.node.shape[0] - 1


def small_tensor(values: tuple[int, ...], device: torch.device) -> Tensor:
    """An int64 tensor of a few known values made on `device` without a host-to-device copy (one fill per value),
    so that a search can be captured in a CUDA graph (a copy from pageable host memory may not be captured)."""
    out = torch.empty(len(values), dtype=torch.int64, device=device)
    for i, value in enumerate(values):
        out[i:i + 1].fill_(value)  # `out[i] = value` copies a CPU scalar tensor, which a capture refuses
    return out


def tree_arrays(node: Tensor, node_index: Tensor, edge: Tensor, child_row: Tensor, choice: Tensor,
                next_row: Tensor, min_q: Tensor, max_q: Tensor, num_trees: int, num_nodes: int,
                host: bool) -> TreeArrays:
    """host: numpy views of the tensors (CPU tensors only), else the tensors themselves."""

    def array(x: Tensor) -> Array:
        return x.numpy() if host else x

    b, n = num_trees, num_nodes
    node_a, index_a, edge_a, child_a, choice_a, next_a = map(array, (node, node_index, edge, child_row, choice,
                                                                     next_row))
    base = array(torch.arange(b, device=node.device) * n)
    return TreeArrays(
        node=node_a, node_index=index_a, edge=edge_a, child_row=child_a, choice=choice_a, next_row=next_a,
        min_q=array(min_q), max_q=array(max_q), base=base, tree_index=base[:, None] // n,
        row_tree=array(torch.arange(b * n + 1, device=node.device) // n % b),
        node_flat=node_a.reshape(-1), edge_flat=edge_a.reshape(-1), child_flat=child_a.reshape(-1),
        backup_offsets=array(small_tensor((EDGE_VISITS, EDGE_VALUES, Q), node.device) * edge.shape[-1]),
        node_number=array(torch.arange(n, device=node.device))[None, :],
        rows=array(torch.arange(b * n, device=node.device).view(b, n)),
        nodes=node_a[:-1].reshape(b, n, NODE_COLUMNS), node_indices=index_a[:-1].reshape(b, n, 3),
        edges=edge_a[:-1].reshape(b, n, *edge_a.shape[1:]), children=child_a[:-1].reshape(b, n, -1),
        choices=choice_a[:-1].reshape(b, n), next_rows=next_a[:-1].reshape(b, n))


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
    min_q: Tensor  # [B] smallest Q = reward + discount * value seen in the tree's backups (+inf before any; pUCT only)
    max_q: Tensor  # [B] largest such Q (-inf before any)
    root_invalid: Tensor  # [B, A] bool, actions that may not be taken at the root
    embeddings: Any  # pytree of [B, N, ...], node latent states
    node: Tensor  # [B * N + 1, 5] flat rows (see the module docstring)
    node_index: Tensor  # [B * N + 1, 3] int64
    edge: Tensor  # [B * N + 1, 8, A]
    child_row: Tensor  # [B * N + 1, A] int64
    choice: Tensor  # [B * N + 1] int64
    next_row: Tensor  # [B * N + 1] int64
    flat_embeddings: Any  # pytree of [B * N + 1, ...]
    base: Tensor  # [B] int64, the row of each root (b * N)
    arrays: TreeArrays | None  # the same storage for the numpy / torch loop (None for the compiled loop)
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
             device: torch.device, host: bool, loop_arrays: bool = True) -> Tree:
    """An empty tree: nothing visited, every edge unexpanded (pointing at its own row), embeddings zero with the
    root embedding's trailing shapes and dtypes. host: its `arrays` are numpy views (CPU only); loop_arrays False:
    no `arrays` (the compiled loop makes its own few views; tree_arrays' 25 calls are a fifth of new_tree's time)."""
    rows = num_trees * num_nodes + 1
    node = torch.zeros(rows, NODE_COLUMNS, dtype=dtype, device=device)
    # fills, not `x[i] = number` (a copy from a CPU scalar tensor, which a CUDA-graph capture refuses)
    node[-1, DISCOUNT:DISCOUNT + 1].fill_(1.0)  # the scratch row passes values through
    node_index = torch.zeros(rows, 3, dtype=torch.int64, device=device)
    # padding writes its edge statistics into the scratch row's own edges
    node_index[-1, PARENT_ROW:PARENT_ROW + 1].fill_(rows - 1)
    edge = torch.zeros(rows, EDGE_CHANNELS, num_actions, dtype=dtype, device=device)
    edge[:, Q].fill_(-torch.inf)
    child_row = torch.arange(rows, device=device).unsqueeze(1).expand(rows, num_actions).contiguous()
    choice = torch.zeros(rows, dtype=torch.int64, device=device)
    next_row = torch.arange(rows, device=device)
    min_q = torch.full((num_trees,), torch.inf, dtype=dtype, device=device)
    max_q = torch.full((num_trees,), -torch.inf, dtype=dtype, device=device)
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
        depth=node_index[:-1, DEPTH].view(shape), min_q=min_q, max_q=max_q,
        root_invalid=torch.zeros(num_trees, num_actions, dtype=torch.bool, device=device),
        embeddings=tree_map(lambda x: x[:-1].view(*shape, *x.shape[1:]), flat_embeddings),
        node=node, node_index=node_index, edge=edge, child_row=child_row, choice=choice, next_row=next_row,
        flat_embeddings=flat_embeddings, base=torch.arange(num_trees, device=device) * num_nodes,
        arrays=tree_arrays(node, node_index, edge, child_row, choice, next_row, min_q, max_q, num_trees, num_nodes,
                           host) if loop_arrays else None)


def _as_array(x: Tensor, dtype: torch.dtype, host: bool) -> Array:
    """A recurrent output [B, ...] in the tree's dtype, as a numpy array on the host."""
    x = x if x.dtype == dtype else x.to(dtype)
    return x.numpy() if host else x


def expand(tree: Tree, parent_rows: Array, actions: Array, new_node: int, recurrent_fn: RecurrentFn
           ) -> tuple[Array, Array]:
    """Expands edge (parent_rows[b], actions[b]) of every tree b into node `new_node` with one `recurrent_fn` call.

    parent_rows [B] int64 rows; actions [B] int64 (arrays of `tree.arrays`' library). Writes the new node's row
    (visits and value sum stay 0: the backup adds the node's own value), its prior and logits, the parent's edge
    reward and discount, the links and the embedding. Returns the new nodes' values [B] (in the tree's dtype) and
    depths [B] int64, as arrays.
    """
    t = tree.arrays
    host = isinstance(parent_rows, np.ndarray)
    parent_tensor = torch.from_numpy(parent_rows) if host else parent_rows
    parent_embeddings = tree_map(lambda x: x.index_select(0, parent_tensor), tree.flat_embeddings)
    out = recurrent_fn(parent_embeddings, torch.from_numpy(actions) if host else actions)
    dtype = tree.node.dtype
    # torch's softmax is one call where numpy's takes five
    prior = torch.softmax(out.prior_logits if out.prior_logits.dtype == dtype else out.prior_logits.to(dtype), -1)
    reward, discount, value, logits, prior = (_as_array(x, dtype, host) for x in (out.reward, out.discount, out.value,
                                                                                 out.prior_logits, prior))
    new = t.nodes[:, new_node]  # [B, 5]
    new[:, RAW_VALUE] = value
    new[:, REWARD] = reward
    new[:, DISCOUNT] = discount
    depth = t.node_index.take(parent_rows * 3 + DEPTH) + 1 if host else t.node_index[parent_rows, DEPTH] + 1
    index = t.node_indices[:, new_node]  # [B, 3]
    index[:, PARENT_ROW] = parent_rows
    index[:, ACTION] = actions
    index[:, DEPTH] = depth
    leaf_edges = t.edges[:, new_node]  # [B, 8, A]
    leaf_edges[:, PRIOR] = prior
    leaf_edges[:, LOGITS] = logits
    a = tree.num_actions
    edge = parent_rows * (EDGE_CHANNELS * a) + actions  # flat (parent, channel 0, action)
    t.edge_flat[edge + EDGE_REWARD * a] = reward
    t.edge_flat[edge + EDGE_DISCOUNT * a] = discount
    t.child_flat[parent_rows * a + actions] = t.base + new_node
    tree_map2(lambda store, x: store[:, new_node].copy_(x), tree.embeddings, out.embedding)
    return value, depth


def finished_tree(tree: Tree) -> Tree:
    """Adds the per-tree index fields (children_index, parent, action_from_parent) to a searched tree."""
    b, n, a = tree.num_trees, tree.num_nodes, tree.num_actions
    base = tree.base
    rows = torch.arange(b * n, device=base.device)
    child_row = tree.child_row[:-1]
    root_row = rows - rows % n  # the row of each row's root (base[rows // n]; no repeat_interleave, which may sync)
    children_index = torch.where(child_row == rows.unsqueeze(1), -1, child_row - root_row[:, None])
    index = tree.node_index[:-1].view(b, n, 3)
    expanded = tree.visit_count > 0
    expanded[:, 0].fill_(False)  # a fill: `x[i] = number` copies a CPU scalar tensor, which a capture refuses
    parent = torch.where(expanded, index[..., PARENT_ROW] - base[:, None], -1)
    action = torch.where(expanded, index[..., ACTION], -1)
    return Tree(**{**tree.__dict__, "children_index": children_index.view(b, n, a), "parent": parent,
                   "action_from_parent": action})
