"""--training_devices: data-parallel training (seed/data_parallel.py) gives the parameters one trainer gets on the
whole batch, and runs in a real learner beside a real actor.

The equality checks run real ranks: two spawned processes in a gloo process group, each training on its half of
the same 20 fixed batches, against one trainer (this process) on the whole batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from seed.unroll import TrainingBatch, Unroll

UPDATES = 20


def _agent_and_config(agent_name: str):
    from seed.agents import agent_module
    from seed.envs import make_spec
    from seed.learner_main import resolve_config

    values = dict(agent=agent_name, env="fake:vector", num_actors=2, envs_per_actor=5, batch_size=10, unroll_length=5,
                  use_lstm=True, lstm_size=16, seed=3, learning_rate=1e-3, grad_clip_norm=1.0, torch_threads=1,
                  max_policy_lag=0)
    if agent_name == "r2d2":
        values.update(burn_in=2, target_update_interval=5)
    if agent_name == "ppo":  # minibatches of 4, 3 and 3 columns: shares of 2 + 2 and 2 + 1 (unequal, scaled)
        values.update(ppo_epochs=2, ppo_minibatches=3, sync="async")
    config = resolve_config(values)
    torch.manual_seed(0)
    spec = make_spec(config.env)
    return agent_module(agent_name).Agent(spec, config), spec, config


def _batches(spec, config, agent_name: str) -> list[TrainingBatch]:
    """UPDATES fixed random batches [L, B, ...] (the same in every process)."""
    rng = np.random.default_rng(7)
    length, b = config.burn_in + config.unroll_length + 1, config.batch_size
    from seed.agents import agent_module

    state_template = agent_module(agent_name).Agent(spec, config).initial_state(b)
    batches = []
    for _ in range(UPDATES):
        steps = {
            "observation": torch.from_numpy(rng.normal(size=(length, b, *spec.observation_shape)).astype(np.float32)),
            "reward": torch.from_numpy(rng.normal(size=(length, b)).astype(np.float32)),
            "done": torch.from_numpy(rng.random((length, b)) < 0.1),
            "truncated": torch.zeros(length, b, dtype=torch.bool),
            "prev_action": torch.from_numpy(rng.integers(0, spec.num_actions, (length, b))),
            "action": torch.from_numpy(rng.integers(0, spec.num_actions, (length, b))),
            "valid": torch.ones(length, b, dtype=torch.bool),
        }
        outputs = torch.from_numpy(rng.normal(size=(length, b, spec.num_actions)).astype(np.float32))
        steps["q_values" if agent_name == "r2d2" else "policy_logits"] = outputs
        if agent_name == "ppo":
            steps["baseline"] = torch.from_numpy(rng.normal(size=(length, b)).astype(np.float32))
        state = {k: torch.from_numpy(rng.normal(size=v.shape).astype(np.float32)) if v.is_floating_point() else v
                 for k, v in state_template.items()}
        weights = (torch.from_numpy(rng.uniform(0.2, 1.0, b).astype(np.float32)) if agent_name == "r2d2" else None)
        batches.append(TrainingBatch(Unroll(steps, state, torch.arange(b)), weights))
    return batches


def _train(agent_name: str, shard=None) -> tuple[dict[str, torch.Tensor], list]:
    """(network parameters after UPDATES updates, each update's priorities or None)."""
    from seed.training import make_optimizer, train_on_batch

    agent, spec, config = _agent_and_config(agent_name)
    optimizer = make_optimizer(agent, config)
    priorities = []
    for step, batch in enumerate(_batches(spec, config, agent_name)):
        result = train_on_batch(agent, optimizer, batch, config, step, shard)
        assert result.trained
        agent.after_update(step + 1)
        priorities.append(None if result.priorities is None else result.priorities.detach().clone())
    return {k: v.detach().clone() for k, v in agent.network.state_dict().items()}, priorities


def _rank(rank: int, world: int, store_path: str, agent_name: str, out_path: str) -> None:
    from seed.data_parallel import Shard

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    try:
        parameters, priorities = _train(agent_name, Shard(rank, world))
        torch.save({"parameters": parameters, "priorities": priorities}, f"{out_path}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("agent_name", ["vtrace", "r2d2", "ppo"])
def test_two_cpu_ranks_train_the_same_parameters_as_one_trainer_on_the_whole_batch(tmp_path, agent_name):
    torch.set_num_threads(1)
    expected, expected_priorities = _train(agent_name)
    initial = _agent_and_config(agent_name)[0].network.state_dict()
    assert any(not torch.equal(expected[k], initial[k]) for k in initial), "20 updates left the network unchanged"
    out = str(tmp_path / "trained")
    mp.start_processes(_rank, args=(2, str(tmp_path / "store"), agent_name, out), nprocs=2, start_method="spawn")
    ranks = [torch.load(f"{out}.{rank}", weights_only=True) for rank in range(2)]
    for name, tensor in expected.items():
        # Every rank holds the same parameters (the same averaged gradient, stepped alike) ...
        assert torch.equal(ranks[0]["parameters"][name], ranks[1]["parameters"][name]), name
        # ... and they are one trainer's on the whole batches, to float rounding.
        torch.testing.assert_close(ranks[0]["parameters"][name], tensor, rtol=1e-4, atol=1e-5, msg=name)
    if agent_name == "r2d2":  # the whole batch's priorities, in batch order, every update
        for step, priorities in enumerate(expected_priorities):
            torch.testing.assert_close(ranks[0]["priorities"][step], priorities, rtol=1e-4, atol=1e-5,
                                       msg=f"update {step}")
