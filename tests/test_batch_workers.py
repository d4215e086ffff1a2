"""Batch workers (seed/training/batch_workers.py) with MuZero's reanalysis (--reanalyse_workers): a batch reanalysed
by a spawned worker with the target network from shared memory gets the policy targets the inline reanalysis gives;
a real learner logs the workers' staleness and the trainer's wait; a worker killed mid-run ends the learner naming
it, within seconds."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

import psutil
import pytest
import torch

from seed.contracts.training import TrainingBatch, Unroll
from seed.training.batch_workers import BatchWorkers, write_prepared
from seed.training.shared_parameters import SharedParameters
from tests.conftest import read_metrics, wait_for
from tests.test_muzero import Agent, _config, _hand_unrolls, _random_weights, _spec


def test_a_worker_reanalyses_a_batch_as_the_inline_reanalysis_does(tmp_path):
    """Root noise off (the pUCT search is then deterministic): the worker's policy targets and root values equal
    `reanalyse_batch`'s on the same batch with the same target network, though the worker's agent starts with
    other weights (it gets the target network from shared memory) and the learner's online network differs."""
    torch.set_num_threads(1)
    config = _config(tmp_path, num_simulations=8, reanalyse_ratio=0.5, exploration_fraction=0.0,
                     target_update_interval=10)
    agent = Agent(_spec(), config)
    _random_weights(agent.network, seed=3)
    agent.after_update(20)  # the target copy of update 20
    _random_weights(agent.network, seed=4)  # the online network moves on: the worker must not search with it
    unrolls = Unroll.stack(_hand_unrolls(config, count=4))
    expected, metrics = agent.reanalyse_batch(TrainingBatch(unrolls), train_steps=27)

    network, version = agent.preparation_network()
    assert version == 20
    parameters = SharedParameters(network.state_dict(), version)
    workers = BatchWorkers(config, _spec(), 1, parameters, multiprocessing.get_context("spawn"), timeout_s=60)
    slot = unrolls.map(lambda t: t.clone().share_memory_())
    workers.start()
    try:
        workers.send_slots([slot])
        assert workers.submit(0, 27, threading.Event())
        prepared = wait_for(lambda: workers.next_prepared(0.5), 120, "the worker's prepared batch")
    finally:
        workers.stop()
    index, prepared_version, values = prepared
    assert (index, prepared_version) == (0, 20)
    positions = config.unroll_length + config.unroll_steps
    assert not torch.equal(expected.unrolls.search_policy[:positions, :2], unrolls.search_policy[:positions, :2])
    assert torch.equal(slot.search_policy, expected.unrolls.search_policy)
    torch.testing.assert_close(slot.root_value, expected.unrolls.root_value)
    assert torch.equal(slot.observation, unrolls.observation)
    for key in ("reanalysis/searches", "reanalysis/staleness_updates", "reanalysis/stored_policy_age_updates"):
        assert values[key] == metrics[key], key
    assert values["reanalysis/staleness_updates"] == 7 and values["batch_workers/prepare_ms"] > 0


def _publish(parameters: SharedParameters, network: torch.nn.Module, version: int) -> None:
    """What the training process does at a target update: the network's parameters and their version into the
    shared copy."""
    with parameters.writing(version, lambda waited_s: None) as shared:
        state = network.state_dict()
        for name, tensor in shared.items():
            tensor.copy_(state[name])


class _TwoTargets:
    """A MuZero agent whose target network was copied at update 20, then at update 30 from other weights, and the
    policy targets the inline reanalysis gives a batch with each (root noise off: the search is deterministic)."""

    def __init__(self, tmp_path, count: int = 4, num_simulations: int = 8):
        torch.set_num_threads(1)
        self.config = _config(tmp_path, num_simulations=num_simulations, reanalyse_ratio=1.0,
                              exploration_fraction=0.0, target_update_interval=10)
        self.agent = Agent(_spec(), self.config)
        self.unrolls = Unroll.stack(_hand_unrolls(self.config, count=count))
        self.expected: dict[int, Unroll] = {}
        self.states: dict[int, dict[str, torch.Tensor]] = {}
        for version, seed in ((20, 3), (30, 5)):
            _random_weights(self.agent.network, seed=seed)
            self.agent.after_update(version)
            assert self.agent.preparation_network()[1] == version
            self.expected[version] = self.agent.reanalyse_batch(TrainingBatch(self.unrolls), version + 1)[0].unrolls
            self.states[version] = {k: v.clone() for k, v in self.agent.target_network.state_dict().items()}
        assert not torch.equal(self.expected[20].search_policy, self.expected[30].search_policy)

    def network(self, version: int) -> torch.nn.Module:
        self.agent.target_network.load_state_dict(self.states[version])
        return self.agent.target_network

    def slots(self, count: int) -> list[Unroll]:
        return [self.unrolls.map(lambda t: t.clone().share_memory_()) for _ in range(count)]

    def assert_prepared_with(self, slot: Unroll, version: int) -> None:
        assert torch.equal(slot.search_policy, self.expected[version].search_policy), f"not version {version}'s"
        torch.testing.assert_close(slot.root_value, self.expected[version].root_value)


def test_a_worker_prepares_the_next_batch_with_the_parameters_published_since(tmp_path):
    """Batch 1 with the target network of update 20; the training process then publishes update 30's; batch 2 is
    reported as prepared with version 30 and has version 30's policy targets. Seen failing with a worker that loads
    the parameters once and never again (it reported 20 and gave 20's targets)."""
    targets = _TwoTargets(tmp_path)
    parameters = SharedParameters(targets.network(20).state_dict(), 20)
    workers = BatchWorkers(targets.config, _spec(), 1, parameters, multiprocessing.get_context("spawn"), timeout_s=60)
    slots = targets.slots(2)
    workers.start()
    try:
        workers.send_slots(slots)
        assert workers.submit(0, 21, threading.Event())
        first = wait_for(lambda: workers.next_prepared(0.5), 120, "the worker's first prepared batch")
        _publish(parameters, targets.network(30), 30)
        assert workers.submit(1, 31, threading.Event())
        second = wait_for(lambda: workers.next_prepared(0.5), 120, "the worker's second prepared batch")
    finally:
        workers.stop()
    assert first[:2] == (0, 20) and second[:2] == (1, 30)
    targets.assert_prepared_with(slots[0], 20)
    targets.assert_prepared_with(slots[1], 30)
    assert second[2]["reanalysis/staleness_updates"] == 1


def _cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def test_a_version_published_during_a_preparation_is_not_the_one_reported(tmp_path):
    """The worker has loaded update 20's target network and is preparing a batch (its CPU time is moving) when the
    training process publishes update 30's: the batch is reported as prepared with version 20, the version whose
    policy targets it holds. Seen failing with a worker that reports the newest version written instead of the one
    it used (it reported 30 for 20's targets)."""
    targets = _TwoTargets(tmp_path, count=96, num_simulations=64)  # a preparation of about a second
    parameters = SharedParameters(targets.network(20).state_dict(), 20)
    workers = BatchWorkers(targets.config, _spec(), 1, parameters, multiprocessing.get_context("spawn"), timeout_s=60)
    slots = targets.slots(2)
    workers.start()
    try:
        workers.send_slots(slots)
        assert workers.submit(0, 21, threading.Event())  # the worker loads version 20 and warms up
        wait_for(lambda: workers.next_prepared(0.5), 120, "the worker's first prepared batch")
        pid = workers.processes[0].pid
        idle = _cpu_seconds(pid)
        assert workers.submit(1, 25, threading.Event())
        # The worker compares versions as soon as it reads the command; 50 ms of CPU later it is searching.
        wait_for(lambda: _cpu_seconds(pid) > idle + 0.05, 60, "the worker to start preparing", interval_s=0.01)
        assert workers.next_prepared(0) is None, "the preparation ended before the publish: the test proves nothing"
        _publish(parameters, targets.network(30), 30)
        prepared = wait_for(lambda: workers.next_prepared(0.5), 120, "the worker's second prepared batch")
    finally:
        workers.stop()
    assert prepared[:2] == (1, 20)
    targets.assert_prepared_with(slots[1], 20)
    assert prepared[2]["reanalysis/staleness_updates"] == 5
    assert parameters.version == 30


def test_write_prepared_copies_the_replaced_tensors_and_refuses_another_shape():
    steps = dict(a=torch.zeros(3), b=torch.zeros(3))
    slot = Unroll(dict(steps), {}, torch.tensor(0))
    replaced = torch.arange(3.0)
    write_prepared(slot, Unroll(dict(a=replaced, b=steps["b"]), {}, torch.tensor(0)))
    assert torch.equal(slot.steps["a"], replaced) and slot.steps["a"] is steps["a"]  # copied into the slot's own
    with pytest.raises(ValueError, match=r"prepared batch steps.b: got shape \(4,\), expected \(3,\)"):
        write_prepared(slot, Unroll(dict(a=replaced, b=torch.zeros(4)), {}, torch.tensor(0)))


def test_reanalyse_workers_need_the_training_process(tmp_path):
    with pytest.raises(ValueError, match=r"--training_process: got false with 1 batch worker\(s\) of --agent=muzero"):
        _config(tmp_path, reanalyse_ratio=1.0, reanalyse_workers=1)
    _config(tmp_path, reanalyse_ratio=0.0, reanalyse_workers=1)  # no reanalysis: no workers


def _worker_of(learner) -> psutil.Process:
    workers = [c for c in psutil.Process(learner.pid).children() if c.name().startswith("seed-prep-w")]
    assert len(workers) == 1, [(c.name(), c.cmdline()) for c in psutil.Process(learner.pid).children()]
    return workers[0]


def test_a_learner_with_a_reanalyse_worker_trains_logs_it_and_ends_naming_it_when_it_is_killed(processes, tmp_path):
    """--target_update_interval=2: the training process republishes the target network every 2 updates, so the
    worker's staleness (updates between the network that reanalysed a batch and the one it trains) stays within
    the interval plus the batches ahead of it, however many updates the run makes. Seen failing with a target network
    never republished to the workers (staleness 15.5 at update 20), and with a worker that loads it only once (14.5
    at update 17)."""
    logdir = str(tmp_path / "run")
    address = f"unix:{tmp_path}/learner.sock"
    interval = 2
    args = dict(preset="cartpole_muzero", logdir=logdir, server_address=address, log_interval_s=0.5,
                num_simulations=4, replay_min_size=4, checkpoint_interval_s=3600, torch_threads=1,
                reanalyse_ratio=1.0, reanalyse_workers=1, target_update_interval=interval)
    learner = processes.learner([f"--{k}={v}" for k, v in args.items()] + ["--training_process"])
    processes.actor(["--preset=cartpole_muzero", f"--server_address={address}", "--actor_index=0"], "actor0")

    def trained():
        rows = [row for row in read_metrics(logdir) if "batch_workers/staleness_updates" in row]
        return rows if rows and rows[-1]["train_steps"] >= 14 else None

    rows = wait_for(trained, 240, "14 updates on reanalysed batches", on_timeout=lambda: processes.output(learner))
    last = rows[-1]
    # The whole batch of 8 sequences, 20 positions each, reanalysed in the worker and logged with the update.
    assert last["reanalysis/searches"] == 8 * 20, last
    # A batch is prepared with the target network of the newest multiple of the interval written when it starts
    # (at most interval - 1 updates old), and trains after the batches in the other 2 slots (depth 2 + 1 worker).
    bound = interval - 1 + 2
    staleness = [(row["train_steps"], row["batch_workers/staleness_updates"], row["reanalysis/staleness_updates"])
                 for row in rows]
    assert all(0 <= trainer <= bound and 0 <= worker <= bound for _, trainer, worker in staleness), staleness
    assert last["training_process/batch_wait_ms"] >= 0 and last["batch_workers/prepare_ms"] > 0
    worker = _worker_of(learner)
    os.kill(worker.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    code = learner.wait(timeout=60)
    assert time.monotonic() - killed_at < 20
    output = processes.output(learner)
    assert code != 0, output[-3000:]
    assert f"batch worker 0 of 1 (pid {worker.pid}) exited with code -9" in output, output[-3000:]


def test_a_stopped_worker_is_killed_past_its_allowance_and_the_learner_ends_naming_it(processes, tmp_path):
    """SIGSTOP (a worker that never finishes its batch): after --training_process_timeout_s on one batch the learner
    kills it and exits non-zero naming it, instead of waiting for it forever."""
    logdir = str(tmp_path / "run")
    address = f"unix:{tmp_path}/learner.sock"
    args = dict(preset="cartpole_muzero", logdir=logdir, server_address=address, log_interval_s=0.5,
                num_simulations=4, replay_min_size=4, checkpoint_interval_s=3600, torch_threads=1,
                reanalyse_ratio=1.0, reanalyse_workers=1, training_process_timeout_s=10)
    learner = processes.learner([f"--{k}={v}" for k, v in args.items()] + ["--training_process"])
    processes.actor(["--preset=cartpole_muzero", f"--server_address={address}", "--actor_index=0"], "actor0")
    wait_for(lambda: any(row.get("train_steps", 0) >= 3 for row in read_metrics(logdir)), 150, "3 updates",
             on_timeout=lambda: processes.output(learner))
    worker = _worker_of(learner)
    os.kill(worker.pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    code = learner.wait(timeout=60)
    assert time.monotonic() - stopped_at < 30
    output = processes.output(learner)
    assert code != 0, output[-3000:]
    assert f"batch worker 0 of 1 (pid {worker.pid}) hung:" in output and "killed it" in output, output[-3000:]
