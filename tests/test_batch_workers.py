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
    logdir = str(tmp_path / "run")
    address = f"unix:{tmp_path}/learner.sock"
    args = dict(preset="cartpole_muzero", logdir=logdir, server_address=address, log_interval_s=0.5,
                num_simulations=4, replay_min_size=4, checkpoint_interval_s=3600, torch_threads=1,
                reanalyse_ratio=1.0, reanalyse_workers=1)
    learner = processes.learner([f"--{k}={v}" for k, v in args.items()] + ["--training_process"])
    processes.actor(["--preset=cartpole_muzero", f"--server_address={address}", "--actor_index=0"], "actor0")

    def trained():
        rows = [row for row in read_metrics(logdir) if "batch_workers/staleness_updates" in row]
        return rows if rows and rows[-1]["train_steps"] >= 5 else None

    rows = wait_for(trained, 150, "5 updates on reanalysed batches", on_timeout=lambda: processes.output(learner))
    last = rows[-1]
    # The whole batch of 8 sequences, 20 positions each, reanalysed in the worker and logged with the update.
    assert last["reanalysis/searches"] == 8 * 20, last
    assert 0 <= last["batch_workers/staleness_updates"] <= 100 + 2  # target_update_interval + the slots ahead
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
