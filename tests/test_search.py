"""The batched MuZero / Gumbel MuZero search (agents/muzero/search): the same visit counts as the scalar
reference search on fixed inputs, Gumbel MuZero's sequential halving and improved policy by hand, noise and
sampling under a generator, and the same trees on CUDA as on the CPU."""

from __future__ import annotations

import math

import pytest
import torch

from seed.agents.muzero.search import RecurrentOutput, RootInput, SearchConfig, dirichlet_noise, search
from seed.agents.muzero.search.gumbel import considered_visits_sequence
from seed.agents.muzero.search.reference import Node, reference_search
from seed.agents.muzero.search.tree import tree_map

MODULUS = 2_147_483_647


@pytest.fixture(autouse=True)
def one_torch_thread():
    """The search's tensors are tiny; with two OpenMP threads on a busy 2-core machine a small reduction can wait
    tens of milliseconds at a barrier (measured: 3.5 s instead of 0.13 s for one search), so these tests run on one
    thread, as the benchmark does."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def hashed_model(num_actions: int, dtype: torch.dtype = torch.float64, terminal_every: int = 5):
    """A deterministic stub model: the embedding is an integer hash of the path ([B, 1] int64); reward, value,
    discount (0 on every `terminal_every`-th hash) and logits come from the hash by integer arithmetic and one
    division, so a batch of 1 and a batch of B give bit-identical numbers. The logits of a node are a permutation
    of 0 .. A-1 (divided by 3): no two actions share a prior."""

    def recurrent_fn(embedding: torch.Tensor, actions: torch.Tensor) -> RecurrentOutput:
        h = (embedding * 1_000_003 + actions.unsqueeze(1).to(embedding.device) * 7919 + 12345) % MODULUS
        key = h[:, 0]
        reward = ((key % 100_003) - 50_001).to(dtype) / 50_001.0
        value = (((key // 7) % 99_991) - 49_995).to(dtype) / 24_997.0
        discount = torch.where(key % terminal_every == 0, 0.0, 0.95).to(dtype)
        logits = ((key.unsqueeze(1) + 7919 * torch.arange(num_actions, device=key.device)) % num_actions)
        return RecurrentOutput(reward, discount, logits.to(dtype) / 3.0, value, h)

    return recurrent_fn


def roots(batch: int, num_actions: int, seed: int, dtype: torch.dtype = torch.float64) -> RootInput:
    g = torch.Generator().manual_seed(seed)
    return RootInput(torch.randn(batch, num_actions, generator=g, dtype=dtype),
                     torch.randn(batch, generator=g, dtype=dtype),
                     torch.randint(0, MODULUS, (batch, 1), generator=g))


def random_invalid(batch: int, num_actions: int, seed: int) -> torch.Tensor:
    invalid = torch.rand(batch, num_actions, generator=torch.Generator().manual_seed(seed)) < 0.3
    invalid[:, seed % num_actions] = False  # at least one valid action per row
    return invalid


def assert_same_tree(out, b: int, node_index: int, ref: Node, path: str = "root") -> int:
    """Walks the reference tree and the batched tree b together; every child's visits must agree. Returns the
    number of nodes compared."""
    tree = out.tree
    compared = 1
    for action in range(tree.num_actions):
        child = tree.children_index[b, node_index, action].item()
        ref_child = ref.children.get(action)
        ref_visits = ref_child.visit_count if ref_child is not None else 0
        visits = int(tree.children_visits[b, node_index, action].item())
        assert visits == ref_visits, f"tree {b}, {path}/{action}: batched {visits} visits, reference {ref_visits}"
        assert (child >= 0) == (ref_visits > 0), f"tree {b}, {path}/{action}: expanded mismatch"
        if ref_visits > 0:
            assert int(tree.visit_count[b, child].item()) == ref_visits
            compared += assert_same_tree(out, b, child, ref_child, f"{path}/{action}")
    return compared


def run_reference(root: RootInput, recurrent_fn, config: SearchConfig, invalid: torch.Tensor | None):
    results = []
    for b in range(root.value.shape[0]):
        results.append(reference_search(
            root.prior_logits[b].tolist(), float(root.value[b]), tree_map(lambda x, b=b: x[b:b + 1], root.embedding),
            recurrent_fn, config, None if invalid is None else invalid[b].tolist()))
    return results


@pytest.mark.parametrize("batch, num_actions, simulations", [(1, 2, 6), (3, 4, 12), (5, 18, 50), (7, 6, 25),
                                                              (2, 9, 40)])
@pytest.mark.parametrize("with_invalid", [False, True])
def test_visit_counts_match_the_scalar_reference(batch, num_actions, simulations, with_invalid):
    root = roots(batch, num_actions, seed=batch * 100 + num_actions)
    invalid = random_invalid(batch, num_actions, seed=simulations) if with_invalid else None
    model = hashed_model(num_actions)
    config = SearchConfig(num_simulations=simulations, dirichlet_fraction=0.0)
    out = search(root, model, config, temperature=0.0, invalid_actions=invalid)
    references = run_reference(root, model, config, invalid)
    compared = 0
    for b, (visits, root_value, ref_root) in enumerate(references):
        assert out.visit_counts[b].tolist() == [float(v) for v in visits]
        assert out.root_value[b].item() == pytest.approx(root_value, rel=1e-12, abs=1e-12)
        compared += assert_same_tree(out, b, 0, ref_root)
        # temperature 0: the most visited action, the lowest index among ties
        assert out.action[b].item() == visits.index(max(visits))
    assert compared == batch * (simulations + 1)  # every node of every tree was compared
    assert out.tree.visit_count[:, 0].tolist() == [simulations + 1.0] * batch
    if invalid is not None:
        assert (out.visit_counts[invalid] == 0).all()
        assert (out.action_weights[invalid] == 0).all()


def test_the_test_data_are_discriminative():
    """The equality above would be vacuous if the trees did not depend on what the search is asked to get right:
    pb_c_init, the terminal discounts and the min-max normalisation all change the counts on these inputs."""
    root = roots(5, 18, seed=518)
    config = SearchConfig(num_simulations=50, dirichlet_fraction=0.0)
    counts = search(root, hashed_model(18), config).visit_counts
    assert (search(root, hashed_model(18), SearchConfig(num_simulations=50, dirichlet_fraction=0.0, pb_c_init=2.5))
            .visit_counts != counts).any()
    no_terminals = hashed_model(18, terminal_every=MODULUS + 1)
    assert (search(root, no_terminals, config).visit_counts != counts).any()
    # A wrong reference (unvisited children valued at the parent's mean instead of 0) disagrees with the search.
    import seed.agents.muzero.search.reference as reference

    original = reference.ucb_score

    def parent_mean_for_unvisited(config, parent, child, stats):
        score = original(config, parent, child, stats)
        return score if child.visit_count > 0 else score + stats.normalize(parent.value())

    reference.ucb_score = parent_mean_for_unvisited
    try:
        wrong = [visits for visits, _, _ in run_reference(root, hashed_model(18), config, None)]
    finally:
        reference.ucb_score = original
    assert wrong != counts.tolist()


def test_dirichlet_noise_is_deterministic_under_a_generator():
    invalid = random_invalid(8, 6, seed=3)
    a = dirichlet_noise(0.3, invalid, torch.float64, torch.Generator().manual_seed(7))
    b = dirichlet_noise(0.3, invalid, torch.float64, torch.Generator().manual_seed(7))
    c = dirichlet_noise(0.3, invalid, torch.float64, torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert (a[invalid] == 0).all() and torch.allclose(a.sum(-1), torch.ones(8, dtype=torch.float64))

    root = roots(6, 5, seed=1)
    config = SearchConfig(num_simulations=20, dirichlet_fraction=0.25)
    runs = [search(root, hashed_model(5), config, generator=torch.Generator().manual_seed(s)) for s in (1, 1, 2)]
    assert torch.equal(runs[0].tree.prior[:, 0], runs[1].tree.prior[:, 0])
    assert torch.equal(runs[0].visit_counts, runs[1].visit_counts)
    assert torch.equal(runs[0].action, runs[1].action)
    assert not torch.equal(runs[0].tree.prior[:, 0], runs[2].tree.prior[:, 0])
    # the root prior is (1 - 0.25) * softmax(logits) + 0.25 * noise: a distribution no lower than 0.75 * prior
    clean = torch.softmax(root.prior_logits, -1)
    assert torch.allclose(runs[0].tree.prior[:, 0].sum(-1), torch.ones(6, dtype=torch.float64))
    assert (runs[0].tree.prior[:, 0] >= 0.75 * clean - 1e-12).all()


def test_temperature_sampling():
    root = roots(4, 6, seed=2)
    config = SearchConfig(num_simulations=30, dirichlet_fraction=0.0)
    greedy = search(root, hashed_model(6), config, temperature=0.0)
    assert torch.equal(greedy.action, greedy.visit_counts.argmax(-1))
    draws = [search(root, hashed_model(6), config, temperature=torch.tensor([0.0, 1.0, 1.0, 0.0]),
                    generator=torch.Generator().manual_seed(s)).action for s in range(16)]
    draws = torch.stack(draws)  # [16, B]
    assert (draws[:, 0] == greedy.action[0]).all() and (draws[:, 3] == greedy.action[3]).all()
    for b in (1, 2):  # sampled in proportion to the visits: only visited actions, and more than one of them
        assert (greedy.visit_counts[b, draws[:, b]] > 0).all()
        assert len(set(draws[:, b].tolist())) > 1


def bandit(q: list[float]):
    """A one-step bandit: action a pays q[a] and ends the episode (discount 0); every value is 0."""
    payoff = torch.tensor(q, dtype=torch.float64)

    def recurrent_fn(embedding, actions):
        b = actions.shape[0]
        return RecurrentOutput(payoff[actions], torch.zeros(b, dtype=torch.float64),
                               torch.zeros(b, len(q), dtype=torch.float64), torch.zeros(b, dtype=torch.float64),
                               embedding)

    return recurrent_fn


def bandit_root(batch: int, num_actions: int, logits: list[float] | None = None) -> RootInput:
    prior_logits = torch.zeros(batch, num_actions, dtype=torch.float64)
    if logits is not None:
        prior_logits[:] = torch.tensor(logits, dtype=torch.float64)
    return RootInput(prior_logits, torch.zeros(batch, dtype=torch.float64), torch.zeros(batch, 1))


def test_sequential_halving_schedule_by_hand():
    # m = 4 actions, n = 8 simulations, log2(4) = 2 phases: first every action once (8 / (2 * 4) = 1 visit each),
    # then the best 2 get 8 / (2 * 2) = 2 more each.
    assert considered_visits_sequence(4, 8) == (0, 0, 0, 0, 1, 1, 2, 2)
    # m = 2, n = 5: one phase of max(1, 5 // 2) = 2 visits each, then the phase repeats with 2 actions.
    assert considered_visits_sequence(2, 5) == (0, 0, 1, 1, 2)
    # m = 3, n = 12: ceil(log2 3) = 2; 12 / (2 * 3) = 2 visits each (6), then 2 actions get 12 / (2 * 2) = 3 more.
    assert considered_visits_sequence(3, 12) == (0, 0, 0, 1, 1, 1, 2, 2, 3, 3, 4, 4)
    assert considered_visits_sequence(1, 3) == (0, 1, 2)

    # On a bandit with 6 actions, 4 considered, 8 simulations, no Gumbel noise: the 4 highest logits are considered
    # (actions 1, 2, 3, 4: 1 visit each); the 2 of them with the best logits + sigma(Q) (actions 3 and 4: Q 0.9
    # and 0.8 beat action 1 and 2's 0.1, the logits differ by 0.01) get 2 more each.
    logits = [0.0, 0.03, 0.02, 0.01, 0.04, -1.0]
    q = [1.0, 0.1, 0.1, 0.9, 0.8, 1.0]
    config = SearchConfig(num_simulations=8, algorithm="gumbel", max_num_considered_actions=4, gumbel_scale=0.0)
    out = search(bandit_root(2, 6, logits), bandit(q), config)
    assert out.visit_counts.tolist() == [[0, 1, 1, 3, 3, 0]] * 2
    assert out.action.tolist() == [3, 3]  # Q 0.9 beats 0.8 once sigma scales them


def test_gumbel_finds_the_best_arm_with_many_simulations():
    q = [0.1, 0.5, 0.2, 1.0, 0.4, 0.0, 0.3, 0.45]
    config = SearchConfig(num_simulations=200, algorithm="gumbel", max_num_considered_actions=8)
    out = search(bandit_root(32, 8), bandit(q), config, generator=torch.Generator().manual_seed(0))
    assert (out.action == 3).all()
    # the improved policy ranks the arms by their value and moves weight to the best one
    weights = out.action_weights[0]
    assert torch.argsort(weights).tolist() == sorted(range(8), key=lambda a: q[a])
    assert (out.action_weights[:, 3] > 1.0 / 8).all()
    assert torch.allclose(out.action_weights.sum(-1), torch.ones(32, dtype=torch.float64))


@pytest.mark.parametrize("simulations", [2, 3, 4])
def test_gumbel_with_few_simulations_returns_a_considered_valid_action(simulations):
    invalid = random_invalid(16, 8, seed=5)
    config = SearchConfig(num_simulations=simulations, algorithm="gumbel", max_num_considered_actions=4)
    root = roots(16, 8, seed=simulations, dtype=torch.float64)
    out = search(root, hashed_model(8), config, generator=torch.Generator().manual_seed(1), invalid_actions=invalid)
    assert not invalid.gather(1, out.action.unsqueeze(1)).any()
    chosen_visits = out.visit_counts.gather(1, out.action.unsqueeze(1)).squeeze(1)
    assert (chosen_visits > 0).all() and (chosen_visits == out.visit_counts.amax(-1)).all()
    assert (out.visit_counts[invalid] == 0).all() and (out.action_weights[invalid] == 0).all()
    assert (out.visit_counts.sum(-1) == simulations).all()


def test_gumbel_improved_policy_prefers_better_actions_deeper_too():
    """With a model whose rewards favour action 0 everywhere, the interior selection and the policy target both
    move towards it from a uniform prior."""

    def recurrent_fn(embedding, actions):
        b = actions.shape[0]
        reward = torch.where(actions == 0, 1.0, 0.0).to(torch.float64)
        return RecurrentOutput(reward, torch.full((b,), 0.9, dtype=torch.float64),
                               torch.zeros(b, 4, dtype=torch.float64), torch.zeros(b, dtype=torch.float64), embedding)

    config = SearchConfig(num_simulations=32, algorithm="gumbel", max_num_considered_actions=4, gumbel_scale=0.0)
    out = search(bandit_root(3, 4), recurrent_fn, config)
    assert (out.action == 0).all()
    assert (out.action_weights[:, 0] > out.action_weights[:, 1:].amax(-1)).all()
    assert (out.tree.depth.amax(-1) >= 2).all()  # it did search below the root


def test_every_output_has_the_documented_shape_and_dtype():
    root = roots(3, 5, seed=4, dtype=torch.float32)
    for algorithm in ("puct", "gumbel"):
        out = search(root, hashed_model(5, torch.float32), SearchConfig(num_simulations=7, algorithm=algorithm),
                     generator=torch.Generator().manual_seed(0))
        assert out.action.shape == (3,) and out.action.dtype == torch.int64
        assert out.action_weights.shape == (3, 5) and out.action_weights.dtype == torch.float32
        assert out.root_value.shape == (3,) and out.visit_counts.shape == (3, 5)
        assert out.tree.children_index.shape == (3, 8, 5) and out.tree.parent.shape == (3, 8)
        assert out.tree.embeddings.shape == (3, 8, 1)
        assert out.tree.parent[:, 0].tolist() == [-1, -1, -1] and (out.tree.parent[:, 1:] >= 0).all()
        out.action_weights.add_(0)  # ordinary tensors for the caller, not inference tensors
    with pytest.raises(ValueError, match="RootInput.value"):
        search(RootInput(root.prior_logits, root.value[:2], root.embedding), hashed_model(5), SearchConfig())
    with pytest.raises(ValueError, match="algorithm"):
        SearchConfig(algorithm="ucb")


def _search_on(device: torch.device, algorithm: str):
    root = roots(6, 7, seed=11)
    root = RootInput(root.prior_logits.to(device), root.value.to(device), root.embedding.to(device))
    config = SearchConfig(num_simulations=30, algorithm=algorithm, dirichlet_fraction=0.0, gumbel_scale=0.0)
    return search(root, hashed_model(7), config, temperature=0.0)


@pytest.mark.parametrize("algorithm", ["puct", "gumbel"])
def test_runs_on_the_cpu(algorithm):
    out = _search_on(torch.device("cpu"), algorithm)
    assert out.visit_counts.sum().item() == 6 * 30


def _numpy_loop_search(algorithm: str):
    """run() -> one search of 9 trees with invalid root actions and root noise, by the loop of numpy / torch calls
    (backend "numpy"), the same each call."""
    root = roots(9, 7, seed=12)
    invalid = random_invalid(9, 7, seed=3)
    config = SearchConfig(num_simulations=40, algorithm=algorithm, dirichlet_fraction=0.25, backend="numpy")
    return lambda: search(root, hashed_model(7), config, temperature=0.0, invalid_actions=invalid,
                          generator=torch.Generator().manual_seed(5))


@pytest.mark.parametrize("algorithm", ["puct", "gumbel"])
def test_the_tensor_code_path_gives_the_numpy_trees(monkeypatch, algorithm):
    """On the CPU the simulation loop runs on numpy views of the tree; every other device runs the same functions
    on the tensors (no data-dependent shapes, every tree's choices refreshed). Run that path on the CPU too: the
    same trees, so a GPU-only mistake in it shows here without a GPU."""
    import seed.agents.muzero.search as search_package

    run = _numpy_loop_search(algorithm)
    numpy_out = run()
    monkeypatch.setattr(search_package, "NUMPY_ON_CPU", False)
    tensor_out = run()
    assert torch.equal(tensor_out.visit_counts, numpy_out.visit_counts)
    assert torch.equal(tensor_out.tree.children_index, numpy_out.tree.children_index)
    assert torch.equal(tensor_out.tree.visit_count, numpy_out.tree.visit_count)
    assert torch.equal(tensor_out.action, numpy_out.action)
    assert torch.allclose(tensor_out.action_weights, numpy_out.action_weights, rtol=0, atol=1e-12)
    assert numpy_out.tree.depth.amax() >= 3  # deep enough that the descent and the backup loop over depth


@pytest.mark.parametrize("algorithm", ["puct", "gumbel"])
def test_the_fixed_depth_loop_of_a_cuda_graph_gives_the_same_trees(monkeypatch, algorithm):
    """While a CUDA graph is captured the search cannot read the trees' depth back, so the descent of simulation k
    runs k steps (DepthBound mode "none"), the steps past a tree's depth staying where they are, and the backup
    covers every step. Run that loop on the CPU's tensors: the same trees as the exact-depth loop."""
    import seed.agents.muzero.search as search_package

    class FixedDepth(search_package.DepthBound):
        def __init__(self, device):
            super().__init__(device)
            self.mode, self.exact = "none", False

    run = _numpy_loop_search(algorithm)
    exact = run()
    monkeypatch.setattr(search_package, "NUMPY_ON_CPU", False)
    monkeypatch.setattr(search_package, "DepthBound", FixedDepth)
    fixed = run()
    assert torch.equal(fixed.visit_counts, exact.visit_counts)
    assert torch.equal(fixed.tree.children_index, exact.tree.children_index)
    assert torch.equal(fixed.tree.visit_count, exact.tree.visit_count)
    assert torch.equal(fixed.action, exact.action)
    assert exact.tree.depth.amax() >= 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("algorithm", ["puct", "gumbel"])
def test_cuda_gives_the_cpu_trees(algorithm):
    cpu = _search_on(torch.device("cpu"), algorithm)
    cuda = _search_on(torch.device("cuda"), algorithm)
    assert cuda.visit_counts.device.type == "cuda"
    assert torch.equal(cuda.visit_counts.cpu(), cpu.visit_counts)
    assert torch.equal(cuda.tree.children_index.cpu(), cpu.tree.children_index)
    assert torch.equal(cuda.action.cpu(), cpu.action)


def test_seed_bench_search_writes_its_result(tmp_path):
    """`seed-bench search` (seed/bench/search_speed.py) on a tiny configuration: a result file with a rate per
    implementation (speed itself is not asserted)."""
    import json
    import subprocess
    import sys

    out = tmp_path / "search.json"
    subprocess.run([sys.executable, "-m", "seed.bench", "search", "--batch=3", "--simulations=4", "--actions=5",
                    "--warmup=1", "--repeats=2", f"--out={out}"], check=True, capture_output=True, timeout=300)
    result = json.loads(out.read_text())
    assert result["schema"] == "seed-bench-search/1"
    assert result["config"]["batch"] == 3 and result["config"]["simulations"] == 4
    for name in ("seed_puct", "seed_gumbel"):
        assert result["results"][name]["expansions_per_s"] > 0
        assert result["results"][name]["repeats"] == 2


def test_first_argmax0_takes_the_lowest_index_among_ties():
    """The numpy argmax over the first axis (tree.first_argmax0, an elementwise reduction in place of numpy's
    argmax) against numpy's and torch's argmax, on scores full of ties and -inf (masked actions), then NaN."""
    import numpy as np

    from seed.agents.muzero.search.tree import first_argmax0

    rng = np.random.default_rng(0)
    scores = rng.integers(0, 3, size=(7, 5, 40)).astype(np.float32)  # three values over 7 actions: many ties
    scores[:, :, :5] = -np.inf  # whole columns masked
    scores[rng.random(scores.shape) < 0.2] = -np.inf
    expected = scores.argmax(0)
    assert (expected > 0).any() and (expected == 0).any()
    got = first_argmax0(scores)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(first_argmax0(torch.from_numpy(scores)).numpy(), expected)
    # A NaN is the argmax, the first of them (numpy's and torch's); seen failing before: index 7, past the actions.
    scores[rng.random(scores.shape) < 0.1] = np.nan
    expected = scores.argmax(0)
    assert np.isnan(scores).any(0).sum() > 10 and (expected[np.isnan(scores).any(0)] > 0).any()
    np.testing.assert_array_equal(first_argmax0(scores), expected)
    np.testing.assert_array_equal(first_argmax0(torch.from_numpy(scores)).numpy(), expected)


def test_gumbel_q_differences_below_the_range_floor_barely_move_the_improved_policy():
    """Q values 1e-4 apart (the float32 read-out noise the value transform had) over a prior 98% sure of action 0:
    the min-max rescaling divides by max(range, MIN_Q_RANGE = 0.01), so sigma moves the logits by at most
    (maxvisit_init + max N) * value_scale * 0.01 and the target stays near the prior. Seen failing with the old
    1e-8 floor, which stretched the 1e-4 apart Q values to [0, 1]: a target of 0.15 for action 0."""
    from seed.agents.muzero.search.gumbel import MIN_Q_RANGE

    sure = torch.log(torch.tensor([0.98, 0.02 / 3, 0.02 / 3, 0.02 / 3], dtype=torch.float64))
    config = SearchConfig(num_simulations=16, algorithm="gumbel", max_num_considered_actions=4)
    out = search(bandit_root(8, 4, sure.tolist()), bandit([0.0, 1e-4, 1e-4, 1e-4]), config,
                 generator=torch.Generator().manual_seed(0))
    shift = (config.maxvisit_init + 16) * config.value_scale * 1e-4 / MIN_Q_RANGE  # at most, on actions 1-3
    expected = 0.98 / (0.98 + 0.02 * math.exp(shift))
    assert (out.action_weights[:, 0] >= expected - 1e-9).all() and expected > 0.97
    # A Q difference above the floor is rescaled to [0, 1] as before: action 1 (Q 1 higher) gains.
    out = search(bandit_root(8, 4, sure.tolist()), bandit([0.0, 1.0, 0.0, 0.0]), config,
                 generator=torch.Generator().manual_seed(0))
    assert (out.action_weights[:, 1] > 0.5).all()  # from a prior of 0.0067


# --- Gumbel MuZero against the scalar reference ---------------------------------------------------------------------


def _gumbel_draws(batch: int, num_actions: int, seed: int, scale: float) -> torch.Tensor:
    """The root Gumbel noise the batched search draws first from a generator seeded with `seed`."""
    uniform = torch.rand(batch, num_actions, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    return -torch.log(-torch.log(uniform.clamp_min(torch.finfo(torch.float64).tiny))) * scale


def _scalar_node(logits: list[float], visits: list[int], q: list[float], raw_value: float):
    """A hand-made expanded GumbelNode: children with these logits, visit counts and Q (reward q, discount 0)."""
    from seed.agents.muzero.search.reference import GumbelNode, _softmax

    node = GumbelNode(1.0, 0.0)
    node.raw_value = raw_value
    node.visit_count = 1 + sum(visits)
    for action, (logit, p) in enumerate(zip(logits, _softmax(logits), strict=True)):
        child = GumbelNode(p, logit)
        child.visit_count, child.reward, child.discount = visits[action], q[action], 0.0
        node.children[action] = child
    return node


def test_the_scalar_gumbel_reference_by_hand():
    """Completed Q, sigma, the improved policy and the interior rule of the scalar reference on numbers worked by
    hand. Node: 3 actions, uniform logits, visits (2, 1, 0), Q (1.0, 0.0, -), network value 0.3.
      v_mix = (0.3 + 3 * (1/3 * 1.0 + 1/3 * 0.0) / (2/3)) / 4 = (0.3 + 1.5) / 4 = 0.45
      completed = (1.0, 0.0, 0.45), rescaled over the range 1: (1, 0, 0.45)
      sigma = (50 + 2) * 0.1 * (1, 0, 0.45) = (5.2, 0, 2.34)
      improved = softmax(5.2, 0, 2.34) = (0.94092, 0.00519, 0.05389)
      interior: improved - N / 4 = (0.44092, -0.24481, 0.05389) -> action 0.
    Logits (0, 0, 2.5), visits (3, 1, 0), the same Q and value: v_mix = (0.3 + 4 * 0.5) / 5 = 0.46 (the visited
    priors are equal), sigma = 5.3 * (1, 0, 0.46) = (5.3, 0, 2.438), improved = softmax(5.3, 0, 4.938) = (0.5878,
    0.0029, 0.4093), whose argmax is action 0; improved - N / 5 = (-0.0122, -0.1971, 0.4093) picks action 2."""
    from seed.agents.muzero.search.reference import (
        completed_q_sigma_scalar,
        improved_policy_scalar,
        interior_action_scalar,
    )

    config = SearchConfig(algorithm="gumbel")
    node = _scalar_node([0.0, 0.0, 0.0], [2, 1, 0], [1.0, 0.0, 0.0], 0.3)
    assert completed_q_sigma_scalar(node, config) == pytest.approx([5.2, 0.0, 2.34])
    exps = [math.exp(5.2), 1.0, math.exp(2.34)]
    improved = improved_policy_scalar(node, config)
    assert improved == pytest.approx([e / sum(exps) for e in exps])
    assert improved == pytest.approx([0.94092, 0.00519, 0.05389], abs=1e-5)
    assert interior_action_scalar(node, config) == 0
    node = _scalar_node([0.0, 0.0, 2.5], [3, 1, 0], [1.0, 0.0, 0.0], 0.3)
    assert completed_q_sigma_scalar(node, config) == pytest.approx([5.3, 0.0, 2.438])
    assert improved_policy_scalar(node, config) == pytest.approx([0.5878, 0.0029, 0.4093], abs=1e-4)
    assert interior_action_scalar(node, config) == 2
    # Q values closer than MIN_Q_RANGE (0.01) are rescaled by the floor, not stretched to [0, 1].
    node = _scalar_node([0.0, 0.0], [1, 1], [0.001, 0.0], 0.0)
    assert completed_q_sigma_scalar(node, config) == pytest.approx([51 * 0.1 * 0.1, 0.0])


@pytest.mark.parametrize("batch, num_actions, simulations, considered", [(3, 4, 12, 4), (5, 9, 40, 8), (4, 6, 25, 16),
                                                                         (2, 18, 50, 16), (6, 3, 7, 2)])
@pytest.mark.parametrize("with_invalid", [False, True])
def test_gumbel_search_matches_the_scalar_reference(batch, num_actions, simulations, considered, with_invalid):
    """The batched Gumbel search (search/gumbel.py) and the scalar reference give the same trees (every node's
    children's visits), root values, actions and improved-policy targets on random roots and a hashed model, with
    the same Gumbel draws."""
    check_gumbel_against_the_scalar_reference(batch, num_actions, simulations, considered, with_invalid)


def test_the_gumbel_reference_comparison_is_discriminative():
    """The interior rule decides these trees: a reference without the visit-fraction term (argmax of the improved
    policy alone) builds other trees."""
    import seed.agents.muzero.search.reference as reference

    root = roots(5, 9, seed=509)
    config = SearchConfig(num_simulations=40, algorithm="gumbel", max_num_considered_actions=8)
    out = search(root, hashed_model(9), config, generator=torch.Generator().manual_seed(14))
    gumbel = _gumbel_draws(5, 9, 14, 1.0)
    original = reference.interior_action_scalar

    def improved_argmax_only(node, config):
        improved = reference.improved_policy_scalar(node, config)
        return improved.index(max(improved))

    reference.interior_action_scalar = improved_argmax_only
    try:
        wrong = [reference.reference_gumbel_search(root.prior_logits[b].tolist(), float(root.value[b]),
                                                   root.embedding[b:b + 1], hashed_model(9), config,
                                                   gumbel[b].tolist())[2] for b in range(5)]
    finally:
        reference.interior_action_scalar = original
    differing = 0
    for b in range(5):
        try:
            assert_same_tree(out, b, 0, wrong[b])
        except AssertionError:
            differing += 1
    assert differing >= 3, differing


def check_gumbel_against_the_scalar_reference(batch: int, num_actions: int, simulations: int, considered: int,
                                                with_invalid: bool, backend: str = "auto") -> None:
    """The batched Gumbel search (with `backend`) and reference.reference_gumbel_search, with the same Gumbel
    draws on random roots and a hashed model: every node's children's visits, the root values, the actions and the
    improved-policy targets."""
    from seed.agents.muzero.search.reference import reference_gumbel_search

    root = roots(batch, num_actions, seed=batch * 100 + num_actions)
    invalid = random_invalid(batch, num_actions, seed=simulations) if with_invalid else None
    model = hashed_model(num_actions)
    config = SearchConfig(num_simulations=simulations, algorithm="gumbel", max_num_considered_actions=considered,
                          backend=backend)
    seed = batch + num_actions
    out = search(root, model, config, invalid_actions=invalid, generator=torch.Generator().manual_seed(seed))
    gumbel = _gumbel_draws(batch, num_actions, seed, config.gumbel_scale)
    compared = 0
    for b in range(batch):
        visits, root_value, ref_root, action, improved = reference_gumbel_search(
            root.prior_logits[b].tolist(), float(root.value[b]), root.embedding[b:b + 1], model, config,
            gumbel[b].tolist(), None if invalid is None else invalid[b].tolist())
        assert out.visit_counts[b].tolist() == [float(v) for v in visits], b
        assert out.root_value[b].item() == pytest.approx(root_value, rel=1e-12, abs=1e-12)
        compared += assert_same_tree(out, b, 0, ref_root)
        assert out.action[b].item() == action, b
        torch.testing.assert_close(out.action_weights[b], torch.tensor(improved, dtype=torch.float64), rtol=1e-9,
                                   atol=1e-12)
    assert compared == batch * (simulations + 1)
    assert out.tree.depth.amax() >= 2  # the interior rule was used
