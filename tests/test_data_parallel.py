"""--training_devices: data-parallel training (seed/training/data_parallel.py) gives the parameters one trainer gets on
the
whole batch, and runs in a real learner beside a real actor.

The equality checks run real ranks: two spawned processes in a gloo process group, each training on its half of
the same 20 fixed batches, against one trainer (this process) on the whole batches."""

from __future__ import annotations

import os
import signal
import subprocess

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from seed.config import burn_in_steps
from seed.contracts.training import TrainingBatch, Unroll

UPDATES = 20
UPDATES_MUZERO = 8


def _agent_and_config(agent_name: str):
    from seed.agents import agent_class
    from seed.envs import make_spec
    from seed.learner.configuration import resolve_config

    values = dict(agent=agent_name, env="fake:vector", num_actors=2, envs_per_actor=5, batch_size=10, unroll_length=5,
                  use_lstm=True, lstm_size=16, seed=3, learning_rate=1e-3, grad_clip_norm=1.0, torch_threads=1,
                  max_policy_lag=0)
    if agent_name == "r2d2":
        values.update(burn_in=2, target_update_interval=5)
    if agent_name == "ppo":  # minibatches of 4, 3 and 3 columns: shares of 2 + 2 and 2 + 1 (unequal, scaled)
        values.update(ppo_epochs=2, ppo_minibatches=3, sync="async")
    if agent_name == "muzero":  # 5 starts per sequence, each unrolled K = 5 steps with n = 5 step targets;
        # Adam's epsilon 1e-3: at 1e-7 Adam turns the rounding noise of gradients that are 0 in exact arithmetic
        # (the biases before the projection's BatchNorm) into steps of a tenth of the learning rate.
        values.update(burn_in=9, num_simulations=2, target_update_interval=5, td_age_updates=0, adam_epsilon=1e-3)
    config = resolve_config(values)
    torch.manual_seed(0)
    spec = make_spec(config.env)
    agent = agent_class(agent_name)(spec, config)
    if agent_name == "muzero":
        # Every weight moved off its initialisation (MuZero's heads start at zero). Even so MuZero's loss amplifies
        # rounding after some updates: one trainer on 1 and on 2 threads ends 4e-3 apart after 20 updates, so
        # MuZero compares UPDATES_MUZERO updates (where two ranks and one trainer agree to 6e-7).
        generator = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for parameter in agent.network.parameters():
                parameter.add_(0.2 * torch.randn(parameter.shape, generator=generator))
        agent.target_network.load_state_dict(agent.network.state_dict())
    return agent, spec, config


def _batches(spec, config, agent_name: str) -> list[TrainingBatch]:
    """UPDATES fixed random batches [L, B, ...] (the same in every process)."""
    rng = np.random.default_rng(7)
    length, b = burn_in_steps(config) + config.unroll_length + 1, config.batch_size
    from seed.agents import agent_class

    state_template = agent_class(agent_name)(spec, config).initial_state(b)
    batches = []
    for _ in range(UPDATES_MUZERO if agent_name == "muzero" else UPDATES):
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
        if agent_name == "muzero":
            steps["search_policy"] = torch.softmax(outputs, -1)
            steps["root_value"] = torch.from_numpy(rng.normal(size=(length, b)).astype(np.float32))
            steps["policy_version"] = torch.zeros(length, b, dtype=torch.int64)
            # Uneven padding: fresh envs' first sequences start with invalid steps, in rank 0's share only, so
            # the ranks' shares have different numbers of trained starts (the loss's mean runs over those).
            for column in range(b // 2):
                steps["valid"][:int(rng.integers(0, 6)), column] = False
        state = {k: torch.from_numpy(rng.normal(size=v.shape).astype(np.float32)) if v.is_floating_point() else v
                 for k, v in state_template.items()}
        weights = (torch.from_numpy(rng.uniform(0.2, 1.0, b).astype(np.float32)) if agent_name in ("r2d2", "muzero")
                   else None)
        batches.append(TrainingBatch(Unroll(steps, state, torch.arange(b)), weights))
    return batches


def _train(agent_name: str, shard=None) -> tuple[dict[str, torch.Tensor], list]:
    """(network parameters after UPDATES updates, each update's priorities or None)."""
    from seed.training.optimizers import make_optimizer
    from seed.training.update import train_on_batch

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
    from seed.training.data_parallel import Shard

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    try:
        parameters, priorities = _train(agent_name, Shard(rank, world))
        torch.save({"parameters": parameters, "priorities": priorities}, f"{out_path}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("agent_name", ["vtrace", "r2d2", "ppo", "muzero"])
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
    if agent_name in ("r2d2", "muzero"):  # the whole batch's priorities, in batch order, every update
        for step, priorities in enumerate(expected_priorities):
            torch.testing.assert_close(ranks[0]["priorities"][step], priorities, rtol=1e-4, atol=1e-5,
                                       msg=f"update {step}")


def _learner_args(tmp_path, **overrides) -> dict:
    values = dict(env="gym:CartPole-v1", logdir=str(tmp_path / "run"), server_address=f"unix:{tmp_path}/s",
                  num_actors=1, envs_per_actor=4, batch_size=4, unroll_length=8, torch_threads=1,
                  log_interval_s=0.5, training_devices="cpu,cpu")
    values.update(overrides)
    return values


def _actor(processes, tmp_path):
    args = dict(env="gym:CartPole-v1", server_address=f"unix:{tmp_path}/s", actor_index=0, envs_per_actor=4)
    return processes.actor([f"--{k}={v}" for k, v in args.items()], "actor0")


@pytest.mark.parametrize("agent_name", ["vtrace", "r2d2"])
def test_learner_with_two_cpu_training_devices_trains_publishes_and_checkpoints(processes, tmp_path, agent_name):
    """R2D2: rank 0 hands the learner the whole batch's priorities, which it writes into the replay."""
    import threading

    from seed.learner.configuration import resolve_config
    from seed.learner.learner import Learner
    from seed.runtime import checkpoint

    extra = dict(replay_min_size=16, replay_capacity=256, burn_in=2) if agent_name == "r2d2" else {}
    learner = Learner(resolve_config(_learner_args(tmp_path, agent=agent_name, max_train_steps=12,
                                                   checkpoint_interval_s=3600, **extra)))
    assert len(learner.parts.training_process.ranks) == 2
    raised: list[BaseException] = []

    def run():
        try:
            learner.run()
        except BaseException as error:  # noqa: BLE001 - inspected below
            raised.append(error)

    runner = threading.Thread(target=run)
    runner.start()
    _actor(processes, tmp_path)
    runner.join(180)
    if runner.is_alive():
        learner.request_stop()
        runner.join(30)
        pytest.fail("the learner did not stop at --max_train_steps")
    assert not raised, raised
    assert learner.parts.metrics.train_steps == 12
    assert not learner.parts.training_process.alive(), "a training rank outlived the learner's stop"
    _, saved = checkpoint.latest(learner.config.logdir)  # rank 0's state, the 12th update's
    assert saved["counters"]["train_steps"] == 12
    learner.parts.inferences[0].parameters.refresh()
    assert learner.parts.inferences[0].parameters.applied == 12
    served = learner.parts.inferences[0].network.state_dict()
    for name, tensor in saved["agent"]["network"].items():
        assert torch.equal(served[name].cpu(), tensor.cpu()), name
    if agent_name == "r2d2":  # every slot of every batch got its new priority (or was written since)
        replay = learner.parts.experience.replay
        assert replay.priority_updates + replay.stale_priority_updates == 12 * learner.config.batch_size
        assert replay.priority_updates > 0


def _rank_pid(learner_pid: int, rank: int) -> int | None:
    """The learner's child process named seed-train-r<rank> (seed/training/process.py names its ranks)."""
    for task in os.listdir(f"/proc/{learner_pid}/task"):
        with open(f"/proc/{learner_pid}/task/{task}/children") as f:
            for child in f.read().split():
                try:
                    with open(f"/proc/{child}/comm") as comm:
                        if comm.read().strip() == f"seed-train-r{rank}":
                            return int(child)
                except OSError:  # it just exited
                    pass
    return None


def test_killing_training_rank_1_ends_the_learner_naming_it(processes, tmp_path):
    from tests.conftest import read_metrics, wait_for

    args = _learner_args(tmp_path, checkpoint_interval_s=3600)
    learner = processes.learner([f"--{k}={v}" for k, v in args.items()])
    _actor(processes, tmp_path)
    logdir = args["logdir"]
    wait_for(lambda: os.path.exists(os.path.join(logdir, "metrics.jsonl")) and any(
        row.get("train_steps", 0) >= 3 for row in read_metrics(logdir)), 120, "3 data-parallel updates",
        on_timeout=lambda: processes.output(learner))
    pid = _rank_pid(learner.pid, 1)
    assert pid is not None, "no process named seed-train-r1 under the learner"
    os.kill(pid, signal.SIGKILL)
    try:
        code = learner.wait(timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the learner went on after training rank 1 was killed\n{processes.output(learner)[-3000:]}")
    output = processes.output(learner)
    assert code != 0, output[-3000:]
    assert f"training rank 1 of 2 (pid {pid}" in output, output[-3000:]


def test_training_devices_are_refused_with_a_batch_size_they_do_not_divide_or_without_the_training_process():
    from seed.learner.configuration import resolve_config

    with pytest.raises(ValueError, match=r"--batch_size: got 5 with --training_devices=cpu,cpu \(2 devices\), "
                                         "expected a multiple of 2"):
        resolve_config(dict(env="fake:vector", batch_size=5, training_devices="cpu,cpu"))
    with pytest.raises(ValueError, match="--training_devices: got 'cpu,cpu' with --notraining_process"):
        resolve_config(dict(env="fake:vector", batch_size=4, training_devices="cpu,cpu", training_process=False))
    config = resolve_config(dict(env="fake:vector", batch_size=4, training_devices="cpu,cpu"))
    assert config.training_process and config.training_device == "cpu"
