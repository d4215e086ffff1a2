"""--training_process: the optimizer steps in a spawned process, with batches and parameters in shared memory.

Real learner, real training process, real actor processes over the real transports."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import psutil
import pytest
import torch

from seed.contracts.training import TrainingBatch, Unroll
from seed.runtime import checkpoint
from seed.training.liveness import FAULT_ENV, TrainingFault, step_allowance_s
from tests.conftest import assert_optimizer_continued, read_metrics, wait_for


def _config(tmp_path, **overrides):
    from seed.learner.configuration import resolve_config

    values = dict(env="fake:vector", logdir=str(tmp_path / "run"), server_address=f"unix:{tmp_path}/s", num_actors=1,
                  envs_per_actor=4, batch_size=4, unroll_length=5, torch_threads=1, log_interval_s=0.5,
                  fake_episode_length=20, training_process=True)
    values.update(overrides)
    return resolve_config(values)


def _run_in_thread(learner) -> tuple[threading.Thread, list[BaseException]]:
    raised: list[BaseException] = []

    def run():
        try:
            learner.run()
        except BaseException as error:  # noqa: BLE001 - inspected by the test
            raised.append(error)

    runner = threading.Thread(target=run)
    runner.start()
    return runner, raised


def _run_to_max_train_steps(processes, tmp_path, learner) -> None:
    """Runs `learner` beside one actor until it stops by itself at --max_train_steps; fails if it does not."""
    runner, raised = _run_in_thread(learner)
    _actor(processes, f"unix:{tmp_path}/s")
    runner.join(120)
    if runner.is_alive():
        learner.request_stop()
        runner.join(30)
        pytest.fail("the learner did not stop at --max_train_steps")
    assert not raised, raised


def _actor(processes, address, **overrides):
    args = dict(env="fake:vector", server_address=address, actor_index=0, envs_per_actor=4, fake_episode_length=20)
    args.update(overrides)
    return processes.actor([f"--{k}={v}" for k, v in args.items()], "actor0")


@pytest.mark.parametrize("transport", ["shm", "grpc"])
def test_training_process_makes_exactly_max_train_steps_updates_and_inference_serves_them(processes, tmp_path,
                                                                                         transport):
    _check_exact_updates_served_and_checkpointed(processes, tmp_path, shm_actors=transport == "shm")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
def test_training_process_on_a_gpu_makes_exactly_max_train_steps_updates_and_inference_serves_them(processes,
                                                                                                  tmp_path):
    _check_exact_updates_served_and_checkpointed(processes, tmp_path, training_process=True,
                                                 training_device="cuda:0", inference_device="cuda:0")


def _check_exact_updates_served_and_checkpointed(processes, tmp_path, **overrides):
    from seed.learner.learner import Learner

    # Checkpoints every 0.2 s while the training process goes on updating: each must be one update's state.
    learner = Learner(_config(tmp_path, max_train_steps=25, checkpoint_interval_s=0.2, keep_checkpoints=100,
                              **overrides))
    initial = {k: v.clone() for k, v in learner.parts.inferences[0].network.state_dict().items()}
    _run_to_max_train_steps(processes, tmp_path, learner)
    assert learner.parts.metrics.train_steps == 25
    assert not learner.parts.training_process.alive()
    _, saved = checkpoint.latest(learner.config.logdir)
    assert saved["counters"]["train_steps"] == 25
    assert_optimizer_continued(learner.config.logdir)  # Adam's step count (from the child) == 25
    trained = saved["agent"]["network"]
    assert any(not torch.equal(trained[k].cpu(), initial[k].cpu()) for k in initial), "untrained weights saved"
    # Inference applied the last update's parameters, and they are the checkpoint's.
    learner.parts.inferences[0].parameters.refresh()
    assert learner.parts.inferences[0].parameters.applied == 25
    served = learner.parts.inferences[0].network.state_dict()
    for name, tensor in trained.items():
        assert torch.equal(served[name].cpu(), tensor.cpu()), name
    files = sorted(f for f in os.listdir(learner.config.logdir) if f.startswith("checkpoint-"))
    assert len(files) >= 2, files
    for name in files:  # Adam's step count is the checkpoint's train_steps in every one, mid-run ones included
        state = torch.load(os.path.join(learner.config.logdir, name), weights_only=False)
        steps = {int(moments["step"]) for moments in state["optimizer"]["state"].values()}
        assert steps <= {state["counters"]["train_steps"]}, (name, steps, state["counters"])
    rows = read_metrics(learner.config.logdir)
    assert rows[-1]["train_steps"] == 25
    assert any(r.get("training_process/step_ms") for r in rows), rows[-1]
    assert any(r.get("losses/total") is not None for r in rows)


def test_inference_is_told_the_version_of_the_parameters_it_got(processes, tmp_path):
    """The label of each publish is the version of the weights published, also when the child has written the
    next update since it reported the last one the learner received. Ground truth: a thread here copies the shared
    parameters whenever the child has written a new version (kept only if no write began or ended during the
    copy). Each receive is followed by a 30 ms pause, so that the child, fed by the actor, is often an update ahead
    when the learner reads the parameters (labelled with the last update received, they were the next update's)."""
    from seed.learner.learner import Learner

    learner = Learner(_config(tmp_path, max_train_steps=30, checkpoint_interval_s=3600))
    inference, process = learner.parts.inferences[0], learner.parts.training_process
    shared, header = process.parameters, process.parameters._header  # (version, writing) as the child wrote them
    written: dict[int, dict[str, torch.Tensor]] = {}
    published: list[tuple[int, dict[str, torch.Tensor]]] = []
    stop = threading.Event()

    def watch_writes():
        while not stop.wait(0.0005):
            version, writing = header.tolist()
            if writing or version in written:
                continue
            copy = {name: tensor.clone() for name, tensor in shared.tensors.items()}
            if header.tolist() == [version, 0]:
                written[version] = copy

    publish, receive = inference.publish, process.receive

    def recording_publish(parameters, version=None):
        published.append((version, {name: tensor.clone() for name, tensor in parameters.items()}))
        publish(parameters, version)

    def slow_receive(timeout_s):
        updates = receive(timeout_s)
        if updates:
            time.sleep(0.03)
        return updates

    inference.publish, process.receive = recording_publish, slow_receive
    watcher = threading.Thread(target=watch_writes)
    watcher.start()
    try:
        _run_to_max_train_steps(processes, tmp_path, learner)
    finally:
        stop.set()
        watcher.join()
    compared = [version for version, _ in published if version in written]
    assert len(compared) >= 10, (sorted(written), [version for version, _ in published])
    for version, parameters in published:
        for name, tensor in written.get(version, {}).items():
            assert torch.equal(parameters[name], tensor), f"published as version {version}, {name} is not its"
    assert published[-1][0] == 30


def test_a_killed_training_process_ends_the_learner_loudly(processes, tmp_path):
    logdir = str(tmp_path / "run")
    address = f"unix:{tmp_path}/learner.sock"
    learner = processes.learner([f"--logdir={logdir}", f"--server_address={address}", "--env=fake:vector",
                                 "--num_actors=1", "--envs_per_actor=4", "--batch_size=4", "--unroll_length=5",
                                 "--log_interval_s=0.5", "--torch_threads=1", "--fake_episode_length=20",
                                 "--checkpoint_interval_s=3600", "--training_process"])
    _actor(processes, address)
    wait_for(lambda: read_metrics(logdir) and read_metrics(logdir)[-1]["train_steps"] >= 5, 90, "5 updates",
             on_timeout=lambda: processes.output(learner))
    children = [c for c in psutil.Process(learner.pid).children()
                if any("spawn_main" in part for part in c.cmdline())]
    assert len(children) == 1, [c.cmdline() for c in psutil.Process(learner.pid).children()]
    os.kill(children[0].pid, signal.SIGKILL)
    killed_at = time.monotonic()
    code = learner.wait(timeout=30)
    assert time.monotonic() - killed_at < 15
    output = processes.output(learner)
    assert code != 0, output
    assert "TrainingProcessDied: training process exited with code -9" in output, output


def test_a_killed_learner_takes_its_training_process_along(processes, tmp_path):
    logdir = str(tmp_path / "run")
    address = f"unix:{tmp_path}/learner.sock"
    learner = processes.learner([f"--logdir={logdir}", f"--server_address={address}", "--env=fake:vector",
                                 "--num_actors=1", "--envs_per_actor=4", "--batch_size=4", "--unroll_length=5",
                                 "--log_interval_s=0.5", "--torch_threads=1", "--fake_episode_length=20"])
    _actor(processes, address)
    wait_for(lambda: read_metrics(logdir) and read_metrics(logdir)[-1]["train_steps"] >= 3, 90, "3 updates",
             on_timeout=lambda: processes.output(learner))
    children = [c for c in psutil.Process(learner.pid).children()
                if any("spawn_main" in part for part in c.cmdline())]
    assert len(children) == 1, "--training_process is the default for vtrace on the CPU"
    learner.kill()
    learner.wait(timeout=10)
    gone, alive = psutil.wait_procs(children, timeout=15)  # its command pipe reads end of file
    assert not alive, [c.pid for c in alive]


def _learner_with_fault(processes, tmp_path, monkeypatch, fault: str, *flags: str):
    """A learner process (with its training process) armed with SEED_FAULT_TRAINING_PROCESS=`fault`, and one
    actor (unarmed)."""
    logdir = str(tmp_path / "run")
    address = f"unix:{tmp_path}/learner.sock"
    monkeypatch.setenv(FAULT_ENV, fault)
    learner = processes.learner([f"--logdir={logdir}", f"--server_address={address}", "--env=fake:vector",
                                 "--num_actors=1", "--envs_per_actor=4", "--batch_size=4", "--unroll_length=5",
                                 "--log_interval_s=0.5", "--torch_threads=1", "--fake_episode_length=20",
                                 "--checkpoint_interval_s=3600", "--training_process", *flags])
    monkeypatch.delenv(FAULT_ENV)
    _actor(processes, address)
    return learner


def _training_child(learner) -> psutil.Process:
    children = [c for c in psutil.Process(learner.pid).children()
                if any("spawn_main" in part for part in c.cmdline())]
    assert len(children) == 1, [c.cmdline() for c in psutil.Process(learner.pid).children()]
    return children[0]


def _wait_for_line(processes, learner, line: str) -> None:
    wait_for(lambda: line in processes.output(learner), 90, repr(line), on_timeout=lambda: processes.output(learner))


def test_a_training_process_killed_holding_the_parameter_lock_ends_the_learner_naming_it(processes, tmp_path,
                                                                                        monkeypatch):
    """The child reports update 3 and dies (SIGKILL) while it holds the parameter lock, halfway through writing
    update 3's parameters, with the learner waiting for that lock: the kernel releases the lock (a semaphore
    stayed taken: the learner waited in `with lock:` forever), and the learner sees the copy was never finished."""
    learner = _learner_with_fault(processes, tmp_path, monkeypatch, "child_dies_writing@3")
    _wait_for_line(processes, learner, f"[training process] test fault {FAULT_ENV}=child_dies_writing@3")
    child = _training_child(learner)
    time.sleep(1.0)  # the learner reads update 3's message and waits for the lock
    assert learner.poll() is None, processes.output(learner)
    child.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    code = learner.wait(timeout=30)
    assert time.monotonic() - killed_at < 15
    output = processes.output(learner)
    assert code != 0, output
    assert "died while writing the parameters of update 3 (exit code -9)" in output, output


def test_a_learner_killed_holding_the_parameter_lock_takes_its_training_process_along(processes, tmp_path,
                                                                                     monkeypatch):
    """The learner is SIGKILLed (as by the OOM killer) while it holds the parameter lock and its training
    process waits for it to write the next update: the child must not outlive it."""
    learner = _learner_with_fault(processes, tmp_path, monkeypatch, "learner_holds_lock@3")
    _wait_for_line(processes, learner, f"[learner] test fault {FAULT_ENV}=learner_holds_lock@3")
    child = _training_child(learner)
    time.sleep(2.0)  # the actor goes on, so the child trains the next batch and waits for the lock
    learner.kill()
    learner.wait(timeout=10)
    gone, alive = psutil.wait_procs([child], timeout=10)
    assert not alive, processes.output(learner)


def test_a_killed_learner_takes_its_hung_training_process_along(processes, tmp_path, monkeypatch):
    """A child stuck in an update (it reads no command, so it never sees its pipe close) dies with its learner:
    the kernel's parent-death signal."""
    learner = _learner_with_fault(processes, tmp_path, monkeypatch, "step_hangs@3")
    _wait_for_line(processes, learner, f"[training process] test fault {FAULT_ENV}=step_hangs@3")
    child = _training_child(learner)
    learner.kill()
    learner.wait(timeout=10)
    gone, alive = psutil.wait_procs([child], timeout=10)
    assert not alive, processes.output(learner)


def test_a_hung_training_process_ends_the_learner_within_its_timeout(processes, tmp_path, monkeypatch):
    """Update 3 never returns (its main thread sleeps): past its deadline the learner prints the child's stacks,
    kills it and exits non-zero naming the update, without waiting for a checkpoint."""
    learner = _learner_with_fault(processes, tmp_path, monkeypatch, "step_hangs@3", "--training_process_timeout_s=5")
    _wait_for_line(processes, learner, f"[training process] test fault {FAULT_ENV}=step_hangs@3")
    child = _training_child(learner)
    hung_at = time.monotonic()
    code = learner.wait(timeout=60)
    assert time.monotonic() - hung_at < 30  # its deadline: 5 s (the timeout; 10x the slowest update is less)
    output = processes.output(learner)
    assert code != 0, output
    assert "TrainingProcessHung: training process" in output, output
    assert "hung: training update 3 for" in output, output
    assert "in sleep_forever" in output, output  # the child's stack, dumped by faulthandler before the kill
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE


def test_update_allowance_and_fault_parsing():
    assert step_allowance_s(60.0, 0.0) == 300.0  # nothing measured yet: the first update may initialise CUDA
    assert step_allowance_s(60.0, 2.0) == 60.0
    assert step_allowance_s(60.0, 9.0) == 90.0  # 10x the slowest update
    assert TrainingFault.from_environment({FAULT_ENV: "step_hangs@4"}) == TrainingFault("step_hangs", 4)
    assert TrainingFault.from_environment({}).due("step_hangs", 10**9) is False
    with pytest.raises(ValueError, match=f"{FAULT_ENV}: got 'hang@x', expected <fault>@<update>"):
        TrainingFault.from_environment({FAULT_ENV: "hang@x"})


def test_learner_restarted_with_a_training_process_resumes_its_optimizer(processes, tmp_path):
    from seed.learner.learner import Learner

    first = Learner(_config(tmp_path, max_train_steps=10))
    runner, raised = _run_in_thread(first)
    # The first learner's run ends at its --max_train_steps; this actor keeps reconnecting rather than exit 0 on
    # that end, so the second learner (more steps, same logdir) finds it.
    actor = _actor(processes, f"unix:{tmp_path}/s", exit_when_done="false")
    runner.join(120)
    assert not runner.is_alive() and not raised, raised
    second = Learner(_config(tmp_path, max_train_steps=20))
    assert second.parts.metrics.train_steps == 10
    runner, raised = _run_in_thread(second)
    runner.join(120)  # the same actor reconnects by itself
    assert not runner.is_alive() and not raised, raised
    assert second.parts.metrics.train_steps == 20
    assert_optimizer_continued(second.config.logdir)  # Adam's step 20: the child resumed the first one's state
    assert actor.poll() is None


def test_r2d2_trains_in_its_process_and_the_learner_writes_the_priorities(processes, tmp_path):
    """The feeder samples the replay; the child trains (and copies the target every 4 updates); each update's
    priorities come back and are written into the learner's replay for the slots sampled."""
    from seed.learner.learner import Learner

    learner = Learner(_config(tmp_path, agent="r2d2", burn_in=2, replay_capacity=64, replay_min_size=8,
                              target_update_interval=4, max_train_steps=12, checkpoint_interval_s=3600))
    assert learner.parts.training_process is not None
    _run_to_max_train_steps(processes, tmp_path, learner)
    assert learner.parts.metrics.train_steps == 12
    stats = learner.parts.experience.replay.stats()
    # Every sampled sequence of every update got its new priority back (or was overwritten in between).
    assert stats["replay_priority_updates"] + stats["replay_stale_priority_updates"] == 12 * 4, stats
    assert stats["replay_priority_updates"] > 0, stats
    _, saved = checkpoint.latest(learner.config.logdir)
    assert saved["counters"]["train_steps"] == 12
    assert_optimizer_continued(learner.config.logdir)  # Adam's step count (from the child) == 12
    network, target = saved["agent"]["network"], saved["agent"]["target_network"]
    for name, tensor in network.items():  # the child copied the target at update 12 (a multiple of 4)
        assert torch.equal(target[name], tensor), name
    learner.parts.inferences[0].parameters.refresh()
    assert learner.parts.inferences[0].parameters.applied == 12
    served = learner.parts.inferences[0].network.state_dict()
    for name, tensor in network.items():
        assert torch.equal(served[name].cpu(), tensor.cpu()), name
    rows = read_metrics(learner.config.logdir)
    assert any(r.get("training_process/step_ms") for r in rows), rows[-1]
    assert rows[-1]["replay_priority_updates"] > 0, rows[-1]


def test_r2d2_each_update_s_priorities_reach_the_replay_slots_its_batch_was_sampled_from(processes, tmp_path):
    """Update k's priorities are written to exactly the slots and generations of the k-th batch the feeder sampled
    (the count of priority updates alone would not see them go to the previous batch's slots), and they are that
    batch's: with a learning rate too small to move any float32 weight (1e-30), the child's network stays the
    learner's, so the learner's agent computes the same priorities from the batch."""
    from seed.learner.learner import Learner

    learner = Learner(_config(tmp_path, agent="r2d2", burn_in=2, replay_capacity=64, replay_min_size=8,
                              target_update_interval=4, max_train_steps=12, checkpoint_interval_s=3600,
                              learning_rate=1e-30))
    initial = {name: tensor.clone() for name, tensor in learner.parts.agent.network.state_dict().items()}
    replay = learner.parts.experience.replay
    sampled, written = [], []
    sample, update_priorities = replay.sample, replay.update_priorities

    def recording_sample(timeout_s):
        batch = sample(timeout_s)
        if batch is not None:
            sampled.append(batch)
        return batch

    def recording_update_priorities(indices, priorities, generations):
        written.append((np.array(indices), np.array(priorities), np.array(generations)))
        update_priorities(indices, priorities, generations)

    replay.sample, replay.update_priorities = recording_sample, recording_update_priorities
    _run_to_max_train_steps(processes, tmp_path, learner)
    assert len(written) == 12 and len(sampled) >= 12, (len(written), len(sampled))
    trained = learner.parts.agent.network.state_dict()  # the child's, loaded by the final checkpoint
    for name, tensor in initial.items():
        torch.testing.assert_close(trained[name], tensor, rtol=0, atol=1e-20)
    pairs = zip(written, sampled[:12], strict=True)  # the feeder samples its next batch before it may send it
    for update, ((indices, priorities, generations), batch) in enumerate(pairs, start=1):
        np.testing.assert_array_equal(indices, batch.indices, err_msg=f"update {update}: replay slots")
        np.testing.assert_array_equal(generations, batch.generations, err_msg=f"update {update}: generations")
        expected = learner.parts.agent.loss(TrainingBatch(batch.unrolls, batch.importance_weights)).priorities
        np.testing.assert_allclose(priorities, expected.detach().double().numpy(), rtol=1e-5,
                                   err_msg=f"update {update}: priorities")


@pytest.mark.parametrize("overrides, message", [
    (dict(agent="ppo", sync="hts", sync_every=5, deterministic=True),
     "--training_process: got true with --deterministic, expected false"),
])
def test_training_process_refuses_what_it_cannot_run(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        _config(tmp_path, **overrides)


def test_a_batch_unlike_the_first_is_refused_naming_the_field():
    from seed.training.process import _copy_into

    def batch(length, extra=()):
        steps = {"reward": torch.zeros(length, 2), "done": torch.zeros(length, 2, dtype=torch.bool)}
        steps.update({name: torch.zeros(length, 2) for name in extra})
        return Unroll(steps, {}, torch.arange(2))

    slot = batch(6)
    source = batch(6)
    source.steps["reward"] += 1.5
    _copy_into(slot, source)
    assert torch.equal(slot.steps["reward"], source.steps["reward"])
    with pytest.raises(ValueError, match=r"training batch steps.reward: got shape \(7, 2\), expected \(6, 2\)"):
        _copy_into(slot, batch(7))
    with pytest.raises(ValueError, match=r"training batch steps: got fields \['done', 'q', 'reward'\]"):
        _copy_into(slot, batch(6, extra=("q",)))


def test_state_returns_before_the_updates_the_child_made_after_it(tmp_path):
    """The child may finish more updates right after answering "state": a checkpoint records only the updates
    before the state (its counters must be the state's), the later ones arrive with the next receive. The
    child's side of the pipes is played here, so the order is exact (a real child shows it only sometimes)."""
    from seed.agents import agent_class
    from seed.envs import make_spec
    from seed.training.optimizers import make_optimizer
    from seed.training.process import TrainingProcess, to_bytes

    config = _config(tmp_path)
    spec = make_spec(config.env, config.env_options())
    agent = agent_class(config.agent)(spec, config)
    optimizer = make_optimizer(agent, config)
    process = TrainingProcess(config, spec, agent, optimizer, 0, lambda timeout_s: None, threading.Event())
    _, child_results = process._child_ends
    process._replay_keys.update({0: (None, None), 1: (None, None)})
    child_results.send(("step", 0, 1, {"losses/total": 1.0}, None))
    child_results.send(("state", to_bytes(agent.state_dict(), optimizer.state_dict())))
    child_results.send(("step", 1, 2, {"losses/total": 2.0}, None))
    recorded = []
    process.state(recorded.extend)
    assert [update.version for update in recorded] == [1]
    assert [update.version for update in process.receive(0.5)] == [2]


@pytest.mark.parametrize("optimizer", ["adam", "clipped_lars"])
def test_a_resumed_training_process_steps_at_the_configured_learning_rate(processes, tmp_path, optimizer):
    """A checkpoint made at --learning_rate=1e-3 resumed with 1e-4: the training process builds its optimizer
    from the checkpoint's state and steps at 1e-4 (its state after the updates says so, with the step count
    continued from the checkpoint's), not at the 1e-3 that torch's load_state_dict restores."""
    from seed.learner.learner import Learner

    first = Learner(_config(tmp_path, training_process=False, optimizer=optimizer, learning_rate=1e-3))
    network = first.parts.agent.network
    for _ in range(2):  # two real optimizer steps in the learner's process: the checkpoint holds their state
        first.parts.optimizer.zero_grad()
        sum((p * p).sum() for p in network.parameters()).backward()
        first.parts.optimizer.step()
    first.checkpoint()
    first._close()
    _, saved = checkpoint.latest(first.config.logdir)
    assert {group["lr"] for group in saved["optimizer"]["param_groups"]} == {1e-3}

    second = Learner(_config(tmp_path, optimizer=optimizer, learning_rate=1e-4, max_train_steps=2))
    _run_to_max_train_steps(processes, tmp_path, second)
    _, resumed = checkpoint.latest(second.config.logdir)
    assert resumed["counters"]["train_steps"] == 2
    assert {group["lr"] for group in resumed["optimizer"]["param_groups"]} == {1e-4}
    state = resumed["optimizer"]["state"]
    steps = {state["steps"]} if optimizer == "clipped_lars" else {int(s["step"]) for s in state.values()}
    assert steps == {4}, steps  # 2 before the checkpoint + 2 in the training process
