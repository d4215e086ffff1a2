"""GPU checks: CUDA-graph inference equals eager inference; a training step on CUDA equals one on the CPU.

Skipped without a CUDA device (the CPU suite covers the same code paths eagerly).
"""

import copy

import numpy as np
import pytest
import torch

from seed.config import burn_in_steps
from seed.contracts.training import TrainingBatch, Unroll
from seed.learner.configuration import resolve_config

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() "
                                                                       "is False)")


def _agent(agent_name: str, **overrides):
    from seed.agents import agent_class
    from seed.envs import make_spec

    if agent_name == "r2d2":
        overrides = {"burn_in": 2, **overrides}  # an R2D2 flag: other agents refuse it
    config = resolve_config(dict(agent=agent_name, env="fake:atari", num_actors=4, envs_per_actor=4, network="nature",
                                 use_lstm=True, lstm_size=64, unroll_length=6, batch_size=4, **overrides))
    spec = make_spec("fake:atari")
    return agent_class(agent_name)(spec, config), spec, config


@pytest.fixture(autouse=True)
def exact_float32():
    """TF32 would make CPU/GPU and graph/eager comparisons loose; these checks compare float32 math."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _random_inference_batch(spec, config, rng, first: bool):
    """The envs of a random set of actors, in actor order, with random frames, actions and rewards; every env
    starts an episode on the `first` batch, 20% of them later."""
    from seed.contracts import InferenceBatch

    actors = rng.choice(config.num_actors, size=rng.integers(1, config.num_actors + 1), replace=False)
    env_ids = (actors[:, None] * config.envs_per_actor + np.arange(config.envs_per_actor)).reshape(-1)
    b = len(env_ids)
    return InferenceBatch(
        observation=torch.from_numpy(rng.integers(0, 256, (b, *spec.observation_shape), dtype=np.uint8)),
        env_ids=torch.from_numpy(env_ids), prev_action=torch.from_numpy(rng.integers(0, spec.num_actions, b)),
        reward=torch.from_numpy(rng.normal(size=b).astype(np.float32)),
        done=torch.from_numpy(np.ones(b, bool) if first else rng.random(b) < 0.2))


def test_graphed_inference_matches_eager_actions_and_state():
    from seed.inference.forward_pass import EagerPolicy, GraphedPolicy
    from seed.inference.state_table import StateTable

    device = torch.device("cuda:0")
    agent, spec, config = _agent("r2d2")
    agent.epsilons = torch.zeros(config.num_envs)  # greedy: actions are a function of the Q-values alone
    network = copy.deepcopy(agent.network).to(device).eval()
    tables = [StateTable(agent.initial_state, config.num_envs, device) for _ in range(2)]
    eager = EagerPolicy(agent, network, tables[0], device)
    graphed = GraphedPolicy(agent, network, tables[1], device, config.envs_per_actor)
    rng = np.random.default_rng(0)
    for step in range(12):
        inputs = _random_inference_batch(spec, config, rng, first=step == 0)
        a_eager, out_eager, _ = eager(inputs)
        a_graph, out_graph, _ = graphed(inputs)
        torch.testing.assert_close(out_graph["q_values"], out_eager["q_values"], rtol=1e-5, atol=1e-5)
        assert torch.equal(a_graph, a_eager), f"step {step}"
    for key in tables[0].agent_state:
        real = slice(0, config.num_envs)  # the scratch row differs by design (padding writes there)
        torch.testing.assert_close(tables[1].agent_state[key][real], tables[0].agent_state[key][real],
                                   rtol=1e-5, atol=1e-5)
    assert len(graphed.graphs) >= 2  # several padded sizes were captured and replayed


def _random_batch(spec, config, agent_name: str, rng) -> Unroll:
    length = burn_in_steps(config) + config.unroll_length + 1
    b = config.batch_size
    steps = {
        "observation": torch.from_numpy(rng.integers(0, 256, (length, b, *spec.observation_shape), dtype=np.uint8)),
        "reward": torch.from_numpy(rng.normal(size=(length, b)).astype(np.float32)),
        "done": torch.from_numpy(rng.random((length, b)) < 0.1),
        "truncated": torch.zeros(length, b, dtype=torch.bool),
        "prev_action": torch.from_numpy(rng.integers(0, spec.num_actions, (length, b))),
        "action": torch.from_numpy(rng.integers(0, spec.num_actions, (length, b))),
        "valid": torch.ones(length, b, dtype=torch.bool),
    }
    outputs = torch.from_numpy(rng.normal(size=(length, b, spec.num_actions)).astype(np.float32))
    steps["q_values" if agent_name == "r2d2" else "policy_logits"] = outputs
    return steps


@pytest.mark.parametrize("agent_name", ["vtrace", "r2d2"])
def test_training_step_on_cuda_matches_cpu(agent_name):
    cpu_agent, spec, config = _agent(agent_name)
    gpu_agent = _agent(agent_name)[0]  # a second agent, not a deep copy: agents hold locks (R2D2's epsilons)
    gpu_agent.load_state_dict(cpu_agent.state_dict())
    gpu_agent.to(torch.device("cuda:0"))
    rng = np.random.default_rng(1)
    steps = _random_batch(spec, config, agent_name, rng)
    state = {k: torch.from_numpy(rng.normal(size=v.shape).astype(np.float32)) if v.is_floating_point() else v
             for k, v in cpu_agent.initial_state(config.batch_size).items()}
    unrolls = Unroll(steps, state, torch.arange(config.batch_size))
    weights = torch.ones(config.batch_size) if agent_name == "r2d2" else None
    results = []
    for agent, device in ((cpu_agent, "cpu"), (gpu_agent, "cuda:0")):
        batch = TrainingBatch(unrolls.to(device), None if weights is None else weights.to(device))
        # Plain SGD: the update is proportional to the gradient (Adam's first step is sign(grad) and would
        # amplify rounding differences of near-zero gradients).
        optimizer = torch.optim.SGD(agent.network.parameters(), lr=0.1)
        out = agent.loss(batch)
        optimizer.zero_grad()
        out.loss.backward()
        grads = [p.grad.detach().cpu() for p in agent.network.parameters()]
        optimizer.step()
        results.append((out.loss.item(), grads, [p.detach().cpu() for p in agent.network.parameters()]))
    (cpu_loss, cpu_grads, cpu_params), (gpu_loss, gpu_grads, gpu_params) = results
    assert gpu_loss == pytest.approx(cpu_loss, rel=1e-4, abs=1e-5)
    for cpu_grad, gpu_grad in zip(cpu_grads, gpu_grads, strict=True):
        torch.testing.assert_close(gpu_grad, cpu_grad, rtol=1e-3, atol=1e-5)
    for cpu_param, gpu_param in zip(cpu_params, gpu_params, strict=True):
        torch.testing.assert_close(gpu_param, cpu_param, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(torch.cuda.device_count() < 2,
                    reason=f"needs two CUDA GPUs (torch.cuda.device_count() is {torch.cuda.device_count()})")
def test_r2d2_graph_on_one_device_survives_inference_on_another():
    """One agent serves two GPUs. A graph captured on cuda:0 keeps reading cuda:0's epsilons after cuda:1
    acted and cuda:0's freed memory was reused: greedy epsilons (all zero) keep its actions equal to eager."""
    from seed.inference.forward_pass import EagerPolicy, GraphedPolicy, PolicyInputs
    from seed.inference.state_table import StateTable

    agent, spec, config = _agent("r2d2")
    agent.epsilons = torch.zeros(config.num_envs)  # greedy everywhere
    devices = [torch.device("cuda:0"), torch.device("cuda:1")]
    networks = [copy.deepcopy(agent.network).to(d).eval() for d in devices]
    tables = [StateTable(agent.initial_state, config.num_envs, d) for d in devices]
    graphed = GraphedPolicy(agent, networks[0], tables[0], devices[0], config.envs_per_actor)
    eager_first = EagerPolicy(agent, networks[0], StateTable(agent.initial_state, config.num_envs, devices[0]),
                              devices[0])
    other = EagerPolicy(agent, networks[1], tables[1], devices[1])
    rng = np.random.default_rng(0)
    env_ids = torch.arange(config.num_envs)

    def inputs(first: bool) -> PolicyInputs:
        b = config.num_envs
        return PolicyInputs(
            observation=torch.from_numpy(rng.integers(0, 256, (b, *spec.observation_shape), dtype=np.uint8)),
            env_ids=env_ids, prev_action=torch.from_numpy(rng.integers(0, spec.num_actions, b)),
            reward=torch.from_numpy(rng.normal(size=b).astype(np.float32)),
            done=torch.ones(b, dtype=torch.bool) if first else torch.zeros(b, dtype=torch.bool))

    step = inputs(True)
    assert torch.equal(graphed(step)[0], eager_first(step)[0])  # captured on cuda:0
    on_first = agent.epsilons_on(devices[0])
    other(inputs(True))  # cuda:1 acts: it must not move or free cuda:0's epsilons
    torch.cuda.synchronize(devices[0])
    torch.cuda.empty_cache()
    filler = [torch.ones(config.num_envs, device=devices[0]) for _ in range(64)]  # reuse freed blocks
    assert agent.epsilons_on(devices[0]) is on_first and on_first.device == devices[0]
    assert agent.epsilons_on(devices[1]).device == devices[1]
    for _ in range(4):
        step = inputs(False)
        assert torch.equal(graphed(step)[0], eager_first(step)[0])
    del filler


def _muzero(algorithm: str, device: torch.device, **overrides):
    """A small MuZero agent on fake:atari (Nature torso, 8 simulations) whose envs but env 0 are evaluation envs: no
    root noise and greedy actions, so eager and graphed searches must build the same trees for them."""
    from seed.agents import agent_class
    from seed.envs import make_spec

    config = resolve_config(dict(agent="muzero", env="fake:atari", num_actors=4, envs_per_actor=4, num_eval_envs=15,
                                 network="nature", search=algorithm, num_simulations=8, **overrides))
    spec = make_spec("fake:atari")
    agent = agent_class("muzero")(spec, config).to(device)
    agent.network.eval()
    return agent, spec, config


@pytest.mark.parametrize("algorithm", ["puct", "gumbel"])
def test_graphed_muzero_search_matches_eager(algorithm):
    """agents/muzero/graphed_search.py: one CUDA-graph replay of the whole search (representation, simulations with
    the capture's fixed depth bound, outcome) gives the eager search's trees, and replays again on new inputs."""
    import dataclasses

    from seed.agents.muzero.graphed_search import GraphedSearch

    device = torch.device("cuda:0")
    agent, spec, _ = _muzero(algorithm, device)
    agent.search_config = dataclasses.replace(agent.search_config, gumbel_scale=0.0)  # no Gumbel noise either
    graphed = GraphedSearch(agent._search)
    evaluate = torch.ones(12, dtype=torch.bool, device=device)
    rng = np.random.default_rng(1)
    with torch.no_grad():
        for _ in range(3):
            stacked = torch.from_numpy(rng.integers(0, 256, (12, spec.frame_stack, *spec.observation_shape),
                                                    dtype=np.uint8)).to(device)
            eager = agent._search(agent.network, stacked, evaluate)
            replayed = graphed(agent.network, stacked, evaluate)
            assert torch.equal(replayed.visit_counts, eager.visit_counts)
            torch.testing.assert_close(replayed.root_value, eager.root_value, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(replayed.action_weights, eager.action_weights, rtol=1e-5, atol=1e-5)
    assert len(graphed.graphs) == 1


def test_graphed_policy_captures_muzero_act():
    """The framework's CUDA-graph inference (GraphedPolicy) captures MuZero's `act` whole, search included: the
    same actions and search policies as eager inference, on several padded batch sizes."""
    from seed.inference.forward_pass import EagerPolicy, GraphedPolicy
    from seed.inference.state_table import StateTable

    device = torch.device("cuda:0")
    agent, spec, config = _muzero("puct", device)
    assert agent.cuda_graphs
    tables = [StateTable(agent.initial_state, config.num_envs, device) for _ in range(2)]
    eager = EagerPolicy(agent, agent.network, tables[0], device)
    graphed = GraphedPolicy(agent, agent.network, tables[1], device, config.envs_per_actor)
    rng = np.random.default_rng(0)
    for step in range(6):
        inputs = _random_inference_batch(spec, config, rng, first=step == 0)
        a_eager, out_eager, _ = eager(inputs)
        a_graph, out_graph, _ = graphed(inputs)
        evaluating = inputs.env_ids >= config.num_envs - config.num_eval_envs  # env 0 explores
        assert torch.equal(a_graph[evaluating], a_eager[evaluating]), f"step {step}"
        torch.testing.assert_close(out_graph["search_policy"][evaluating], out_eager["search_policy"][evaluating],
                                   rtol=1e-5, atol=1e-5)
    assert len(graphed.graphs) >= 2


def test_captures_in_one_thread_while_another_replays_for_200_rounds():
    """The race that killed the learner on an H200 (inference captured `act` while training replayed reanalysis's
    graphed search): one thread captures a graph of a new shape each round, another replays its graph, a third
    draws random numbers eagerly, for 200 rounds, with every draw going through the process's graph lock
    (seed/runtime/cuda_graphs.py). No thread may fail, and each replayed graph still draws fresh numbers."""
    import threading

    from seed.runtime.cuda_graphs import capture_graph, graph_use

    device = torch.device("cuda:0")
    rounds, failures = 200, []

    def guarded(fn):
        def run():
            try:
                fn()
            except BaseException as error:  # noqa: BLE001 - reported by the assertion below
                failures.append(f"{threading.current_thread().name}: {type(error).__name__}: {error}")
        return threading.Thread(target=run, name=fn.__name__)

    def make_graph(n: int):
        static = torch.zeros(n, device=device)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with graph_use(), torch.cuda.stream(side):
            (static + torch.rand(n, device=device)).sum()  # warm-up
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with capture_graph(graph):
            out = (static + torch.rand(n, device=device)) * 2
        return graph, out

    replay_graph, replay_out = make_graph(1024)
    draws = []

    def replayer():
        for _ in range(rounds):
            with graph_use():
                replay_graph.replay()
                draws.append(replay_out[:4].clone())
            torch.cuda.current_stream(device).synchronize()

    def capturer():
        for k in range(rounds):
            graph, _ = make_graph(64 + k)  # a new shape: a new capture every round
            with graph_use():
                graph.replay()

    def eager_sampler():
        for _ in range(rounds):
            with graph_use():
                torch.randn(256, device=device).sum().item()

    threads = [guarded(f) for f in (replayer, capturer, eager_sampler)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
        assert not t.is_alive(), f"{t.name} still runs after 300 s"
    assert failures == []
    assert len(draws) == rounds
    assert not torch.equal(draws[0], draws[-1]), "replays drew the same random numbers every time"
