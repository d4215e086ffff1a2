"""Real learner and actor processes over real gRPC (unix socket and TCP)."""

import os
import signal
import time

import pytest
import torch

from seed.runtime import checkpoint
from tests.conftest import (
    assert_optimizer_continued,
    assert_resumed,
    free_tcp_port,
    read_metrics,
    serving_pid,
    wait_for,
)

REQUIRED_KEYS = {
    "time_s", "env_frames", "env_frames_per_sec", "train_steps", "train_steps_per_sec", "episodes",
    "episode_return_mean", "inference_batch_size_mean", "inference_latency_ms_p50", "queue_size",
    "losses/policy", "losses/V", "losses/entropy", "losses/total",
}


def _learner_args(logdir, address, **overrides):
    args = dict(env="fake:vector", logdir=logdir, server_address=address, num_actors=2, envs_per_actor=4,
                batch_size=4, unroll_length=10, log_interval_s=0.5, checkpoint_interval_s=3600,
                total_environment_frames=int(1e12), torch_threads=1, fake_episode_length=20)
    args.update(overrides)
    return [f"--{k}={v}" for k, v in args.items()]


def _actor_args(address, index, **overrides):
    args = dict(env="fake:vector", server_address=address, actor_index=index, envs_per_actor=4,
                fake_episode_length=20)
    args.update(overrides)
    return [f"--{k}={v}" for k, v in args.items()]


def _trained(logdir, min_steps):
    rows = read_metrics(logdir)
    return rows if rows and rows[-1]["train_steps"] >= min_steps else None


@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_learner_and_two_actors_train(processes, tmp_path, transport):
    logdir = str(tmp_path / "run")
    if transport == "unix":
        listen = dial = f"unix:{tmp_path}/learner.sock"
    else:
        port = free_tcp_port()
        listen, dial = f"127.0.0.1:{port}", f"127.0.0.1:{port}"
    # Batches of up to both actors' 8 rows, waiting up to 50 ms for the second actor.
    learner = processes.learner(_learner_args(logdir, listen, inference_batch_size=8, batch_timeout_ms=50))
    for i in range(2):
        processes.actor(_actor_args(dial, i), f"actor{i}")
    rows = wait_for(lambda: _trained(logdir, 20), 90, "20 training steps",
                    on_timeout=lambda: processes.output(learner))
    assert REQUIRED_KEYS <= set(rows[-1]), REQUIRED_KEYS - set(rows[-1])
    last = rows[-1]
    assert last["env_frames"] > 0 and last["episodes"] > 0
    # One actor's request is 4 rows: a mean above 4 means inference batched the two actors together.
    assert max(r["inference_batch_size_mean"] or 0 for r in rows) > 4, [r["inference_batch_size_mean"] for r in rows]
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(logdir))
    learner.send_signal(signal.SIGTERM)
    assert learner.wait(timeout=30) == 0
    found = checkpoint.latest(logdir)
    assert found is not None and found[1]["counters"]["train_steps"] >= 20


def test_two_inference_devices_share_the_actors(processes, tmp_path):
    logdir = str(tmp_path / "run")
    address = f"unix:{tmp_path}/learner.sock"
    learner = processes.learner(_learner_args(logdir, address, inference_devices="cpu,cpu"))
    for i in range(2):
        processes.actor(_actor_args(address, i), f"actor{i}")
    wait_for(lambda: _trained(logdir, 10), 90, "training", on_timeout=lambda: processes.output(learner))
    # Both actors are served (actor a by device a % 2); test_trained_parameters_reach_every_inference_device
    # checks that each device's network follows training.
    for i in range(2):
        wait_for(lambda i=i: f"actor {i} connected" in processes.output(learner), 30, f"actor {i} to connect")
    steps = read_metrics(logdir)[-1]["train_steps"]
    wait_for(lambda: _trained(logdir, steps + 5), 60, "training with both actors connected")
    learner.send_signal(signal.SIGTERM)
    assert learner.wait(timeout=30) == 0


def test_killed_actor_is_replaced_and_learner_keeps_training(processes, tmp_path):
    logdir = str(tmp_path / "run")
    address = f"unix:{tmp_path}/learner.sock"
    learner = processes.learner(_learner_args(logdir, address))
    actors = [processes.actor(_actor_args(address, i), f"actor{i}") for i in range(2)]
    wait_for(lambda: _trained(logdir, 10), 90, "training", on_timeout=lambda: processes.output(learner))
    # Actor 0 alone can provide the training steps: make sure actor 1 is connected before killing it.
    wait_for(lambda: "actor 1 connected" in processes.output(learner), 60, "actor 1 to connect")
    actors[1].send_signal(signal.SIGKILL)
    actors[1].wait(timeout=10)
    steps_after_kill = read_metrics(logdir)[-1]["train_steps"]
    # The survivor alone keeps the learner training (partial batches flush on the timeout).
    wait_for(lambda: _trained(logdir, steps_after_kill + 10), 60, "training with one actor")
    processes.actor(_actor_args(address, 1), "actor1-restarted")
    wait_for(lambda: processes.output(learner).count("actor 1 connected") == 2, 60, "the new actor 1 to connect")
    steps = read_metrics(logdir)[-1]["train_steps"]
    wait_for(lambda: _trained(logdir, steps + 10), 60, "training after the replacement")
    assert learner.poll() is None


def test_restarted_learner_resumes_from_checkpoint(processes, tmp_path):
    logdir = str(tmp_path / "run")
    address = f"unix:{tmp_path}/learner.sock"
    first = processes.learner(_learner_args(logdir, address), "learner1")
    actors = [processes.actor(_actor_args(address, i), f"actor{i}") for i in range(2)]
    wait_for(lambda: _trained(logdir, 20), 90, "training", on_timeout=lambda: processes.output(first))
    start = time.monotonic()
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=30) == 0
    assert time.monotonic() - start < 20  # SIGTERM: stop serving, checkpoint, exit; well inside a pod's grace period
    before = read_metrics(logdir)[-1]
    saved = checkpoint.latest(logdir)
    assert saved[1]["counters"]["train_steps"] >= before["train_steps"]
    rows_before = len(read_metrics(logdir))
    # The same actors reconnect by themselves to the new learner on the same logdir.
    second = processes.learner(_learner_args(logdir, address), "learner2")
    wait_for(lambda: "resumed from" in processes.output(second), 60, "the resume message")
    wait_for(lambda: _trained(logdir, before["train_steps"] + 5), 90, "training after the restart",
             on_timeout=lambda: processes.output(second))
    assert_resumed(processes.output(second), logdir, saved, rows_before)
    # A new learner is not a newer actor: no live actor was told it is superseded.
    for actor in actors:
        assert actor.poll() is None and "superseded" not in processes.output(actor), processes.output(actor)
    second.send_signal(signal.SIGTERM)
    assert second.wait(timeout=30) == 0
    assert_optimizer_continued(logdir)


def test_each_inference_device_serves_its_actors(tmp_path):
    """Actor a is served by inference device a % n: its env rows live only in that device's tables."""
    import numpy as np

    from seed.learner.configuration import resolve_config
    from seed.learner.learner import Learner
    from seed.transport.slab import REPLY_OK
    from tests.conftest import serve_steps

    config = resolve_config(dict(env="fake:vector", logdir=str(tmp_path), server_address=f"unix:{tmp_path}/s",
                                 num_actors=2, envs_per_actor=4, inference_devices="cpu,cpu", torch_threads=1))
    learner = Learner(config)
    assert len(learner.parts.inferences) == 2 and len(learner.parts.batchers) == 2
    learner.parts.channels.slab.live_run[:] = 1
    for actor in (0, 1):
        inference = learner.parts.inferences[actor % 2]
        step = (actor, 1, np.zeros((4, 8), np.float32), np.zeros(4, np.float32), np.zeros(4, bool), np.zeros(4, bool))
        status, actions = serve_steps(inference, [step])[actor]
        assert status == REPLY_OK and actions.shape == (4,)
    assert learner.parts.inferences[0].actor_run.tolist() == [1, 0]
    assert learner.parts.inferences[1].actor_run.tolist() == [0, 1]


def test_trained_parameters_reach_every_inference_device(tmp_path):
    """After a training step, each inference device's network holds the trained parameters."""
    import numpy as np

    from seed.learner.configuration import resolve_config
    from seed.learner.learner import Learner
    from tests.conftest import serve_steps

    config = resolve_config(dict(env="fake:vector", logdir=str(tmp_path), server_address=f"unix:{tmp_path}/s",
                                 num_actors=2, envs_per_actor=2, batch_size=4, unroll_length=3,
                                 inference_devices="cpu,cpu", torch_threads=1))
    learner = Learner(config)
    try:
        learner.parts.channels.slab.live_run[:] = 1

        def serve_each_actor():
            for actor in (0, 1):
                step = (actor, 1, np.zeros((2, 8), np.float32), np.zeros(2, np.float32), np.zeros(2, bool),
                        np.zeros(2, bool))
                serve_steps(learner.parts.inferences[actor % 2], [step])

        for _ in range(config.unroll_length + 1):  # each env completes one unroll: 4 unrolls, one batch
            serve_each_actor()
        learner.parts.sink.start()
        learner.parts.experience.start()
        before = {k: v.clone() for k, v in learner.parts.agent.network.state_dict().items()}
        wait_for(learner.train_step, 20, "a training step on the served unrolls")
        trained = learner.parts.agent.network.state_dict()
        assert any(not torch.equal(before[k], trained[k]) for k in trained)
        serve_each_actor()  # inference picks up published parameters between batches
        for device, inference in enumerate(learner.parts.inferences):
            for name, value in inference.network.state_dict().items():
                assert torch.equal(value, trained[name]), (device, name)
    finally:
        learner.parts.stop_event.set()
        learner._close()


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_killed_serving_process_is_restarted_and_a_killed_learner_takes_it_along(processes, tmp_path):
    logdir = str(tmp_path / "run")
    port = free_tcp_port()
    address = f"127.0.0.1:{port}"
    learner = processes.learner(_learner_args(logdir, address))
    actors = [processes.actor(_actor_args(address, i), f"actor{i}") for i in range(2)]
    wait_for(lambda: _trained(logdir, 10), 90, "training", on_timeout=lambda: processes.output(learner))
    for i in range(2):  # actor 0 alone can provide the training steps: both must be connected before the kill
        wait_for(lambda i=i: f"actor {i} connected" in processes.output(learner), 60, f"actor {i} to connect")
    first = serving_pid(learner.pid)
    assert first is not None
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: "restarting it" in processes.output(learner), 30, "the learner to restart its serving process",
             on_timeout=lambda: processes.output(learner))
    second = wait_for(lambda: serving_pid(learner.pid) not in (None, first) and serving_pid(learner.pid), 30,
                      "a new serving process")
    # Actors reconnect to the new serving process by themselves and training goes on.
    for i, actor in enumerate(actors):
        wait_for(lambda i=i, a=actor: processes.output(a).count(f"[actor {i}] connected to") >= 2, 60,
                 f"actor {i} to reconnect", on_timeout=lambda a=actor: processes.output(a) + processes.output(learner))
        assert actor.poll() is None
    steps = read_metrics(logdir)[-1]["train_steps"]
    wait_for(lambda: _trained(logdir, steps + 10), 90, "training after the serving restart",
             on_timeout=lambda: processes.output(learner) + processes.output(actors[0]))
    # A SIGKILLed learner leaves no serving process holding its port: a new learner binds the same address.
    learner.kill()
    learner.wait(timeout=10)
    wait_for(lambda: not _alive(second), 10, "the orphaned serving process to exit")
    again = processes.learner(_learner_args(logdir, address), "learner2")
    wait_for(lambda: "listening on" in processes.output(again), 60, "the new learner to listen",
             on_timeout=lambda: processes.output(again))
