"""The compiled (Numba) MuZero search (agents/muzero/search/compiled*.py): the same visit counts as the scalar
reference search and the numpy batched search, whole searches and each small function (the pUCT and Gumbel
selections against the numpy refreshes on random trees, the backup against puct.backup), the backend flag, and the
search package's imports (no cycle; types.py imports nothing of the search).

Numba compiles each function on its first call (seconds; then cached on disk): the trees here are small."""

from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest
import torch

from seed.agents.muzero.search import RecurrentOutput, RootInput, SearchConfig, search
from seed.agents.muzero.search.compiled_gumbel import completed_q_sigma, gumbel_params, interior_action, root_action
from seed.agents.muzero.search.compiled_puct import puct_action, visit_terms
from seed.agents.muzero.search.compiled_tree import backup_leaves, expand_leaves
from seed.agents.muzero.search.gumbel import LOW_LOGIT, MIN_Q_RANGE, refresh_choices
from seed.agents.muzero.search.puct import backup, refresh
from seed.agents.muzero.search.reference import (
    GumbelNode,
    MinMaxStats,
    Node,
    completed_q_sigma_scalar,
    interior_action_scalar,
    root_action_scalar,
    select_child,
)
from seed.agents.muzero.search.tree import (
    DEPTH,
    DISCOUNT,
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
    new_tree,
)
from tests.test_search import (
    MODULUS,
    assert_same_tree,
    check_gumbel_against_the_scalar_reference,
    hashed_model,
    random_invalid,
    roots,
    run_reference,
)


@pytest.fixture(autouse=True)
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tied_roots(batch: int, num_actions: int, seed: int, dtype: torch.dtype = torch.float64) -> RootInput:
    """Roots whose logits take three values (many equal priors: ties for the lowest index to break)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randint(0, 3, (batch, num_actions), generator=g).to(dtype)
    return RootInput(logits, torch.randn(batch, generator=g, dtype=dtype),
                     torch.randint(0, MODULUS, (batch, 1), generator=g))


def tied_model(num_actions: int, dtype: torch.dtype = torch.float64, terminal_every: int = 3):
    """hashed_model with rewards and values in {-1, 0, 1} and logits in {0, 1}: equal Q values and equal priors
    everywhere, and a terminal edge (discount 0) every `terminal_every`-th hash."""
    model = hashed_model(num_actions, dtype, terminal_every)

    def recurrent_fn(embedding, actions):
        out = model(embedding, actions)
        return type(out)(torch.sign(out.reward), out.discount, (out.prior_logits * 3 % 2).floor(),
                         torch.sign(out.value), out.embedding)

    return recurrent_fn


def search_with(backend: str, root: RootInput, model, config: SearchConfig, invalid, seed: int = 0):
    config = SearchConfig(**{**config.__dict__, "backend": backend})
    return search(root, model, config, temperature=0.0, invalid_actions=invalid,
                  generator=torch.Generator().manual_seed(seed))


def assert_same_search(numba_out, numpy_out) -> None:
    """The same trees: shape, visits, and (backed up from the same network outputs in the same order) the same
    value sums and edge statistics, bit for bit; the priors up to rounding (softmax by Numba against torch)."""
    a, b = numba_out.tree, numpy_out.tree
    assert torch.equal(numba_out.visit_counts, numpy_out.visit_counts)
    assert torch.equal(a.children_index, b.children_index)
    assert torch.equal(a.visit_count, b.visit_count)
    assert torch.equal(a.value_sum, b.value_sum)
    assert torch.equal(a.children_values, b.children_values)
    assert torch.equal(a.children_visits, b.children_visits)
    assert torch.equal(a.depth, b.depth) and torch.equal(a.parent, b.parent)
    assert torch.equal(a.action_from_parent, b.action_from_parent)
    assert torch.equal(a.min_q, b.min_q) and torch.equal(a.max_q, b.max_q)
    torch.testing.assert_close(a.prior, b.prior, rtol=0, atol=1e-12)
    assert torch.equal(numba_out.action, numpy_out.action)
    torch.testing.assert_close(numba_out.action_weights, numpy_out.action_weights, rtol=0, atol=1e-12)
    torch.testing.assert_close(numba_out.root_value, numpy_out.root_value, rtol=0, atol=0)


@pytest.mark.parametrize("backend", ["numba", "numpy"])
@pytest.mark.parametrize("batch, num_actions, simulations", [(1, 2, 6), (3, 4, 12), (4, 18, 40), (5, 6, 25)])
@pytest.mark.parametrize("with_invalid", [False, True])
def test_puct_visit_counts_match_the_scalar_reference(backend, batch, num_actions, simulations, with_invalid):
    """Both backends against reference.reference_search, every node of every tree (tests/test_search.py runs the
    default backend, the compiled one on the CPU)."""
    root = roots(batch, num_actions, seed=batch * 100 + num_actions)
    invalid = random_invalid(batch, num_actions, seed=simulations) if with_invalid else None
    model = hashed_model(num_actions)
    config = SearchConfig(num_simulations=simulations, dirichlet_fraction=0.0, backend=backend)
    out = search(root, model, config, temperature=0.0, invalid_actions=invalid)
    compared = 0
    for b, (visits, root_value, ref_root) in enumerate(run_reference(root, model, config, invalid)):
        assert out.visit_counts[b].tolist() == [float(v) for v in visits]
        assert out.root_value[b].item() == pytest.approx(root_value, rel=1e-12, abs=1e-12)
        compared += assert_same_tree(out, b, 0, ref_root)
    assert compared == batch * (simulations + 1)


@pytest.mark.parametrize("backend", ["numba", "numpy"])
@pytest.mark.parametrize("batch, num_actions, simulations, considered", [(3, 4, 12, 4), (2, 18, 40, 16),
                                                                         (4, 6, 25, 16), (6, 3, 7, 2)])
@pytest.mark.parametrize("with_invalid", [False, True])
def test_gumbel_visit_counts_match_the_scalar_reference(backend, batch, num_actions, simulations, considered,
                                                        with_invalid):
    """Both backends against reference.reference_gumbel_search with the same Gumbel draws: every node's visits,
    the root values, the actions and the improved-policy targets."""
    check_gumbel_against_the_scalar_reference(batch, num_actions, simulations, considered, with_invalid, backend)


@pytest.mark.parametrize("algorithm", ["puct", "gumbel"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_compiled_search_gives_the_numpy_trees(algorithm, seed):
    """Random roots with and without invalid actions, root noise (pUCT) and Gumbel noise drawn from the same
    generator, a terminal edge every 5th hash."""
    num_actions = 7 + seed
    root = roots(6, num_actions, seed=seed)
    invalid = random_invalid(6, num_actions, seed=seed) if seed else None
    config = SearchConfig(num_simulations=30, algorithm=algorithm, dirichlet_fraction=0.25 if seed < 2 else 0.0,
                          max_num_considered_actions=4 + seed)
    model = hashed_model(num_actions)
    numba_out = search_with("numba", root, model, config, invalid, seed)
    assert_same_search(numba_out, search_with("numpy", root, model, config, invalid, seed))
    assert numba_out.tree.depth.amax() >= 3  # deep enough that the descent and the backup walk several levels


@pytest.mark.parametrize("algorithm", ["puct", "gumbel"])
@pytest.mark.parametrize("seed", [3, 4])
def test_compiled_search_breaks_ties_and_terminals_as_numpy_does(algorithm, seed):
    """Three logit values at the roots, rewards and values in {-1, 0, 1}, a terminal edge every 3rd hash: many
    exactly equal scores, which both searches must give to the lowest action."""
    root = tied_roots(5, 6, seed)
    config = SearchConfig(num_simulations=24, algorithm=algorithm, dirichlet_fraction=0.0, gumbel_scale=0.0)
    model = tied_model(6)
    numba_out = search_with("numba", root, model, config, None)
    assert_same_search(numba_out, search_with("numpy", root, model, config, None))
    assert (numba_out.tree.children_discount == 0).any()


def broken_model(num_actions: int, field: str, bad: float):
    """hashed_model whose outputs are `bad` (NaN, inf) in `field` ("value", "reward", "discount" or "logits") for
    every third hash: a network that diverged on some of the positions the search reaches."""
    model = hashed_model(num_actions)

    def recurrent_fn(embedding, actions):
        out = model(embedding, actions)
        hit = out.embedding[:, 0] % 3 == 0
        fields = dict(reward=out.reward, discount=out.discount, value=out.value,
                      prior_logits=torch.where(hit[:, None], bad, out.prior_logits) if field == "logits"
                      else out.prior_logits)
        if field != "logits":
            fields[field] = torch.where(hit, bad, fields[field])
        return RecurrentOutput(embedding=out.embedding, **fields)

    return recurrent_fn


def assert_same_broken_search(out, expected) -> None:
    """assert_same_search where the trees hold NaN: the same NaN in the same places."""
    assert torch.equal(out.visit_counts, expected.visit_counts) and torch.equal(out.action, expected.action)
    a, b = out.tree, expected.tree
    assert torch.equal(a.children_index, b.children_index) and torch.equal(a.visit_count, b.visit_count)
    for name in ("value_sum", "children_values", "min_q", "max_q"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), rtol=0, atol=0, equal_nan=True, msg=name)
    torch.testing.assert_close(out.root_value, expected.root_value, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(out.action_weights, expected.action_weights, rtol=0, atol=1e-12, equal_nan=True)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # numpy on the NaN and inf
@pytest.mark.parametrize("algorithm", ["puct", "gumbel"])
@pytest.mark.parametrize("broken", ["value", "reward", "discount", "logits", "root value", "root logits",
                                    "value inf", "value -inf"])
def test_a_broken_network_never_gets_an_invalid_root_action_and_every_backend_agrees(monkeypatch, algorithm,
                                                                                     broken):
    """NaN (or an infinity) in the network's outputs, at the roots or at a third of the leaves, with actions 0 and 3
    invalid at every root: no backend visits or returns an invalid action, and the compiled search, the numpy loop
    and the torch loop (the path of other devices) build the same trees. Seen failing before the fix: the
    compiled search chose the invalid action 0 once a NaN reached a tree (NaN never beat its -inf), and the numpy
    loop's pUCT argmax gave index A (out of range) for a row holding a NaN."""
    import seed.agents.muzero.search as search_package

    num_actions, batch = 6, 5
    bad = float("-inf") if broken.endswith("-inf") else float("inf") if broken.endswith("inf") else float("nan")
    field = broken.split()[-1] if broken.startswith("root") else broken.split()[0]
    root = roots(batch, num_actions, seed=1)
    if broken == "root value":
        root = RootInput(root.prior_logits, torch.full_like(root.value, bad), root.embedding)
    elif broken == "root logits":
        logits = root.prior_logits.clone()
        logits[:, 2] = bad
        root = RootInput(logits, root.value, root.embedding)
    model = hashed_model(num_actions) if broken.startswith("root") else broken_model(num_actions, field, bad)
    invalid = torch.zeros(batch, num_actions, dtype=torch.bool)
    invalid[:, [0, 3]] = True
    config = SearchConfig(num_simulations=16, algorithm=algorithm, dirichlet_fraction=0.0)
    numba_out = search_with("numba", root, model, config, invalid)
    numpy_out = search_with("numpy", root, model, config, invalid)
    monkeypatch.setattr(search_package, "NUMPY_ON_CPU", False)
    torch_out = search_with("numpy", root, model, config, invalid)
    for name, out in (("numba", numba_out), ("numpy", numpy_out), ("torch", torch_out)):
        assert not out.visit_counts[invalid].any(), (name, out.visit_counts)
        assert not invalid.gather(1, out.action[:, None]).any(), (name, out.action)
    assert_same_broken_search(numba_out, numpy_out)
    assert_same_broken_search(torch_out, numpy_out)
    tree = numpy_out.tree
    assert not (tree.value_sum.isfinite().all() and tree.prior.isfinite().all())  # the broken outputs got in


def test_compiled_search_gives_the_numpy_visit_counts_in_float32():
    """float32 trees: the compiled arithmetic runs in float32 in numpy's order; the transcendental functions
    (log, exp) are Numba's, so only the counts are compared."""
    for algorithm in ("puct", "gumbel"):
        root = roots(8, 9, seed=7, dtype=torch.float32)
        config = SearchConfig(num_simulations=30, algorithm=algorithm)
        model = hashed_model(9, torch.float32)
        numba_out = search_with("numba", root, model, config, None, seed=3)
        numpy_out = search_with("numpy", root, model, config, None, seed=3)
        assert torch.equal(numba_out.visit_counts, numpy_out.visit_counts)
        assert torch.equal(numba_out.tree.children_index, numpy_out.tree.children_index)


def test_compiled_search_stores_pytree_embeddings_as_numpy_does():
    """A dict embedding whose recurrent outputs list their keys in another order than the root's: every node's
    embedding lands in its own leaf, as in the numpy search."""
    model = hashed_model(5)

    def recurrent_fn(embedding, actions):
        out = model(embedding["hash"], actions)
        return type(out)(out.reward, out.discount, out.prior_logits, out.value,
                         {"scaled": out.embedding.to(torch.float64).repeat(1, 2) / MODULUS, "hash": out.embedding})

    plain = roots(4, 5, seed=9)
    root = RootInput(plain.prior_logits, plain.value,
                     {"hash": plain.embedding, "scaled": torch.zeros(4, 2, dtype=torch.float64)})
    config = SearchConfig(num_simulations=12, dirichlet_fraction=0.0)
    numba_out = search_with("numba", root, recurrent_fn, config, None)
    numpy_out = search_with("numpy", root, recurrent_fn, config, None)
    assert_same_search(numba_out, numpy_out)
    for key in ("hash", "scaled"):
        assert torch.equal(numba_out.tree.embeddings[key], numpy_out.tree.embeddings[key])
    assert (numba_out.tree.embeddings["scaled"][:, 1:] > 0).all()


def test_compiled_searches_in_two_threads_give_the_sequential_trees():
    """The compiled steps release the GIL; searches in two threads at once (as the learner's inference and
    reanalysis threads run them) each keep to their own tree."""
    import threading

    configs = [SearchConfig(num_simulations=20, algorithm=algorithm, backend="numba") for algorithm in ("puct",
                                                                                                        "gumbel")]
    root = roots(6, 7, seed=5)
    expected = [search_with("numba", root, hashed_model(7), config, None, seed=2) for config in configs]
    results: list = [None, None]

    def run(i: int) -> None:
        results[i] = [search_with("numba", root, hashed_model(7), configs[i], None, seed=2) for _ in range(3)]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i in range(2):
        for out in results[i]:
            assert_same_search(out, expected[i])


def test_an_embedding_of_another_shape_is_refused():
    """The compiled step copies a one-tensor embedding row by row: one of another width would be read past its
    end, so it is refused naming the field."""
    model = hashed_model(3)

    def wider(embedding, actions):
        out = model(embedding, actions)
        return type(out)(out.reward, out.discount, out.prior_logits, out.value, out.embedding.repeat(1, 2))

    with pytest.raises(ValueError, match=r"RecurrentOutput.embedding: got \(2, 2\), expected .* \(2, 1\)"):
        search(roots(2, 3, seed=0), wider, SearchConfig(num_simulations=3, backend="numba"))


# --- the small functions, one node at a time, on random trees --------------------------------------------------


def random_tree(seed: int, batch: int = 4, num_actions: int = 5, nodes: int = 12, expanded: int | None = None,
                dtype=torch.float64):
    """B trees of N = `nodes` nodes, of which the first `expanded` (all by default) are grown by random expansions
    (random_expansion) and backed up by the numpy backup (puct.backup), so that their statistics are consistent;
    the roots' prior is uniform."""
    rng = np.random.default_rng(seed)
    tree = new_tree(batch, nodes, num_actions, torch.zeros(batch, 1), dtype, torch.device("cpu"), True)
    t = tree.arrays
    t.node[t.base, VISITS] = 1.0
    t.node[t.base, VALUE_SUM] = t.node[t.base, RAW_VALUE] = rng.integers(-2, 3, batch)
    t.edge[t.base, PRIOR] = np.full(num_actions, 1.0 / num_actions)
    for new_node in range(1, nodes if expanded is None else expanded):
        value = random_expansion(t, rng, nodes, new_node)
        backup(t, path_to(t, t.base + new_node, nodes), t.base + new_node, value)
    return tree


def random_expansion(t, rng: np.random.Generator, nodes: int, new_node: int) -> np.ndarray:
    """Expands node `new_node` of every tree (compiled_tree.expand_leaves) under a random expanded node and a
    random unexpanded action, with rewards and values in {-1, -0.5, 0, 0.5, 1}, logits in {0, 1, 2} (ties) and a
    quarter of the edges terminal (discount 0). Returns the new nodes' values [B]."""
    batch, num_actions = t.base.shape[0], t.edge.shape[2]
    parents, actions = np.empty(batch, np.int64), np.empty(batch, np.int64)
    for b in range(batch):
        while True:
            parent, action = b * nodes + rng.integers(0, new_node), rng.integers(0, num_actions)
            if t.child_row[parent, action] == parent and (parent == b * nodes or t.node[parent, VISITS] > 0):
                break
        parents[b], actions[b] = parent, action
    reward = rng.integers(-2, 3, batch).astype(t.node.dtype) / 2
    discount = np.where(rng.random(batch) < 0.25, 0.0, 0.9).astype(t.node.dtype)
    value = rng.integers(-2, 3, batch).astype(t.node.dtype) / 2
    logits = rng.integers(0, 3, (batch, num_actions)).astype(t.node.dtype)
    expand_leaves(t.node, t.node_index, t.edge, t.child_row, nodes, new_node, parents, actions, reward, discount,
                  value, logits)
    return value


def path_to(t, leaves: np.ndarray, nodes: int) -> list[np.ndarray]:
    """The numpy backup's path: the rows from each root to each leaf's parent, [B] arrays, root first, padded by
    repeating the last row."""
    chains = []
    for leaf in leaves:
        chain, row = [], leaf
        while t.node_index[row, DEPTH] > 0:
            row = t.node_index[row, PARENT_ROW]
            chain.append(row)
        chains.append(chain[::-1])
    length = max(len(chain) for chain in chains)
    return [np.array([chain[min(j, len(chain) - 1)] for chain in chains]) for j in range(length)]


@pytest.mark.parametrize("seed", range(4))
def test_backup_leaves_gives_the_numpy_backup(seed):
    """A random tree's last node expanded, then backed up by both: node and edge statistics and the min-max
    bounds, bit for bit (terminal edges, discount 0, included)."""
    nodes = 14
    tree = random_tree(seed, nodes=nodes, expanded=nodes - 1)
    t = tree.arrays
    value = random_expansion(t, np.random.default_rng(seed + 100), nodes, nodes - 1)
    leaves = t.base + nodes - 1
    before = t.node[leaves, VISITS].copy()
    node, node_index, edge, min_q, max_q = (x.copy() for x in (t.node, t.node_index, t.edge, t.min_q, t.max_q))
    backup_leaves(node, node_index, edge, nodes, nodes - 1, min_q, max_q, True)
    backup(t, path_to(t, leaves, nodes), leaves, value)
    np.testing.assert_array_equal(node[:-1], t.node[:-1])
    np.testing.assert_array_equal(edge[:-1, Q:EDGE_VISITS + 1], t.edge[:-1, Q:EDGE_VISITS + 1])
    np.testing.assert_array_equal(edge[:-1, EDGE_VALUES], t.edge[:-1, EDGE_VALUES])
    np.testing.assert_array_equal(min_q, t.min_q)
    np.testing.assert_array_equal(max_q, t.max_q)
    assert (node[leaves, VISITS] == before + 1).all()
    assert (t.node_index[:-1, DEPTH] >= 3).any() and (t.node[:-1, DISCOUNT] == 0).any()  # deep, with terminals


def gumbel_reference_node(t, row: int) -> GumbelNode:
    """The scalar Gumbel reference's view of tree row `row`: its visits and network value, and its children's
    prior, logit, visits, value sum, reward and discount."""
    node = GumbelNode(1.0, 0.0)
    node.visit_count, node.raw_value = int(t.node[row, VISITS]), float(t.node[row, RAW_VALUE])
    for action in range(t.edge.shape[2]):
        child = GumbelNode(float(t.edge[row, PRIOR, action]), float(t.edge[row, LOGITS, action]))
        child_row = t.child_row[row, action]
        if child_row != row:
            child.visit_count = int(t.node[child_row, VISITS])
            child.value_sum = float(t.node[child_row, VALUE_SUM])
            child.reward, child.discount = float(t.node[child_row, REWARD]), float(t.node[child_row, DISCOUNT])
        node.children[action] = child
    return node


def reference_node(t, row: int) -> Node:
    """The scalar reference's view of tree row `row`: its visits and its children's prior, visits, value sum,
    reward and discount."""
    node = Node(1.0)
    node.visit_count = int(t.node[row, VISITS])
    for action in range(t.edge.shape[2]):
        child = Node(float(t.edge[row, PRIOR, action]))
        child_row = t.child_row[row, action]
        if child_row != row:
            child.visit_count = int(t.node[child_row, VISITS])
            child.value_sum = float(t.node[child_row, VALUE_SUM])
            child.reward, child.discount = float(t.node[child_row, REWARD]), float(t.node[child_row, DISCOUNT])
        node.children[action] = child
    return node


@pytest.mark.parametrize("seed", range(4))
def test_puct_action_gives_the_scalar_and_numpy_choices(seed):
    """Every node of a random tree with ties (equal priors, values and visits): the compiled choice, the scalar
    reference's select_child and the numpy refresh agree, with and without a normalisation range and with an
    invalid root action."""
    config = SearchConfig()
    tree = random_tree(seed)
    t = tree.arrays
    rows = np.concatenate((t.base, np.setdiff1d(np.flatnonzero(t.node[:-1, VISITS] > 0), t.base)))
    invalid = np.zeros((tree.num_trees, tree.num_actions), bool)
    invalid[:, seed % tree.num_actions] = seed % 2 == 1
    terms = visit_terms(config.pb_c_base, config.pb_c_init, tree.num_nodes, t.node.dtype)
    scores = np.empty(tree.num_actions)
    for with_range in (True, False):
        if not with_range:
            t.min_q[:], t.max_q[:] = np.inf, -np.inf
        refresh(t, rows, t.node[rows, VISITS], None, tree.num_nodes, invalid, config.pb_c_base, config.pb_c_init)
        chosen = []
        for row in rows:
            b = t.row_tree[row]
            low, high = t.min_q[b], t.max_q[b]
            low, span = (low, high - low) if high > low else (np.inf, 1.0)
            is_root = row == t.base[b]
            action = puct_action(t.edge, row, int(t.node[row, VISITS]), low, span, invalid, b, is_root, terms, scores)
            assert action == t.choice[row], f"row {row}: compiled {action}, numpy {t.choice[row]}"
            stats = MinMaxStats()
            stats.minimum, stats.maximum = float(t.min_q[b]), float(t.max_q[b])
            node = reference_node(t, row)
            if is_root:
                for a in np.flatnonzero(invalid[b]):
                    del node.children[a]
            assert select_child(config, node, stats)[0] == action, f"row {row}: reference disagrees"
            chosen.append(action)
        assert len(set(chosen)) > 1  # not a degenerate tree where every node picks the same action


@pytest.mark.parametrize("seed", range(4))
def test_gumbel_actions_give_the_scalar_and_numpy_choices(seed):
    """Every node of a random tree: the compiled root pick (sequential halving over the actions with the
    considered visits) and interior pick agree with gumbel.refresh_choices and with the scalar reference's
    root_action_scalar and interior_action_scalar, and the compiled sigma(completed Q) with
    completed_q_sigma_scalar's."""
    config = SearchConfig(algorithm="gumbel")
    tree = random_tree(seed, num_actions=6)
    t = tree.arrays
    b, a = tree.num_trees, tree.num_actions
    rows = np.concatenate((t.base, np.setdiff1d(np.flatnonzero(t.node[:-1, VISITS] > 0), t.base)))
    rng = np.random.default_rng(seed)
    gumbel_logits = rng.integers(-1, 2, (b, a)).astype(np.float64)  # ties
    invalid = np.zeros((b, a), bool)
    invalid[:, 0] = seed % 2 == 1
    params = gumbel_params(config.maxvisit_init, config.value_scale, MIN_Q_RANGE, LOW_LOGIT, t.node.dtype)
    sigma = np.empty(a)
    compared_roots = 0
    for considered in (0.0, 1.0, 2.0):
        considered_visit = np.full(b, considered)
        refresh_choices(t, rows, gumbel_logits.T.copy(), considered_visit, invalid.T.copy(), config)
        for row in rows:
            tree_index = t.row_tree[row]
            completed_q_sigma(t.edge, row, t.node[row, VISITS], t.node[row, RAW_VALUE], params, sigma)
            node = gumbel_reference_node(t, row)
            np.testing.assert_allclose(sigma, completed_q_sigma_scalar(node, config), rtol=1e-12, atol=1e-12)
            if row == t.base[tree_index]:
                action = root_action(t.edge, row, sigma, gumbel_logits, considered, invalid, tree_index, params)
            else:
                action = interior_action(t.edge, row, t.node[row, VISITS], sigma)
            assert action == t.choice[row], f"row {row}, considered {considered}: compiled {action}, numpy " \
                                            f"{t.choice[row]}"
            if row != t.base[tree_index]:
                assert interior_action_scalar(node, config) == action, f"row {row}: the scalar reference disagrees"
                continue
            logits = t.edge[row, LOGITS]
            reference = root_action_scalar(node, config, list(gumbel_logits[tree_index] - logits),
                                           list(invalid[tree_index]), int(considered))
            if reference >= 0:  # -1: no valid action has the considered visits (the searches never ask then)
                assert reference == action, f"root {row}, considered {considered}: the scalar reference disagrees"
                compared_roots += 1
    assert compared_roots >= b  # most roots have actions with the visits asked


# --- the backend flag and the package's imports --------------------------------------------------------------


def test_the_backend_flag_picks_the_loop(monkeypatch):
    import seed.agents.muzero.search as search_package
    import seed.agents.muzero.search.compiled as compiled

    calls = []
    original = compiled.run_simulations
    monkeypatch.setattr(compiled, "run_simulations", lambda *args: calls.append(1) or original(*args))
    root = roots(2, 3, seed=0)
    for backend, expected in (("auto", 1), ("numba", 2), ("numpy", 2)):
        search(root, hashed_model(3), SearchConfig(num_simulations=4, backend=backend))
        assert len(calls) == expected, backend
    with pytest.raises(ValueError, match="SearchConfig.backend: got 'jax'"):
        SearchConfig(backend="jax")
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    with pytest.raises(ValueError, match="SearchConfig.backend: got 'numba' for torch.float32 tensors on cuda"):
        search_package._compiled(SearchConfig(backend="numba"), cuda, torch.float32)
    with pytest.raises(ValueError, match="SearchConfig.backend: got 'numba' for torch.float16 tensors on cpu"):
        search_package._compiled(SearchConfig(backend="numba"), cpu, torch.float16)
    assert not search_package._compiled(SearchConfig(), cuda, torch.float32)
    assert not search_package._compiled(SearchConfig(), cpu, torch.float16)  # auto: the numpy loop
    assert search_package._compiled(SearchConfig(), cpu, torch.float64)


def _imports(path: pathlib.Path) -> set[str]:
    """The modules of the search package that a module of it imports, anywhere in its code (functions
    included): "__init__" for the package itself."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("seed.agents.muzero.search"):
            if node.module == "seed.agents.muzero.search":
                found.update(alias.name if (path.parent / f"{alias.name}.py").exists() else "__init__"
                             for alias in node.names)
            else:
                found.add(node.module.rsplit(".", 1)[-1])
    return found


def test_the_search_modules_import_no_cycle():
    """types.py is the data contract: it imports nothing of the search; and no module of the package imports,
    directly or not, one that imports it (`from seed.agents.muzero.search.tree import Tree` put back in types.py,
    even under TYPE_CHECKING, fails here)."""
    package = pathlib.Path(__import__("seed.agents.muzero.search", fromlist=["types"]).__file__).parent
    graph = {path.stem: _imports(path) - {path.stem} for path in package.glob("*.py")}
    assert graph["types"] == set(), f"types.py imports {graph['types']}"
    assert graph["tree"] and graph["compiled"]  # the parse sees imports
    for start in graph:
        seen, stack = set(), [start]
        while stack:
            for module in graph.get(stack.pop(), set()):
                assert module != start, f"an import cycle through {start}.py"
                if module not in seen:
                    seen.add(module)
                    stack.append(module)
