"""A helper thread of the learner that dies ends the learner (non-zero exit, traceback in the log) within
seconds instead of freezing it; a replay that cannot fit is refused at start."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from seed.runtime import checkpoint
from seed.runtime.supervised_thread import (
    EVENTS_FAULT_ENV,
    SINK_FAULT_ENV,
    InjectedFault,
    SupervisedThread,
    ThreadDied,
    Watchdog,
    episodes_fault_from_environment,
    sink_fault_from_environment,
)
from tests.conftest import read_metrics, wait_for


def test_watchdog_reports_a_thread_that_raised_or_returned_early():
    stop = threading.Event()
    watchdog = Watchdog(stop)
    assert watchdog.check() is None

    def fail():
        raise KeyError("boom")

    healthy = SupervisedThread(lambda: stop.wait(), "healthy")
    dead = SupervisedThread(fail, "dead")
    watchdog.watch(healthy, dead)
    healthy.start()
    dead.start()
    dead.join(5)
    failure = watchdog.check()
    assert failure.thread == "dead"
    assert "Traceback" in failure.traceback and "KeyError: 'boom'" in failure.traceback
    assert "thread 'dead' died" in failure.describe()
    # A thread that returns while the learner runs is a failure too; after stop it is not.
    early = Watchdog(stop)
    returned = SupervisedThread(lambda: None, "returned")
    early.watch(returned)
    returned.start()
    returned.join(5)
    assert early.check().thread == "returned" and early.check().traceback == ""
    stop.set()
    assert early.check() is None
    healthy.join(5)


def test_watchdog_reports_the_latest_replaced_thread_only_if_it_raised():
    """The serving-events thread ends with its serving process (a restart starts another): a return is no failure,
    an exception is."""
    stop = threading.Event()
    watchdog = Watchdog(stop)
    current = [None]
    watchdog.watch_latest(lambda: current[0])
    assert watchdog.check() is None  # before the first serving process
    current[0] = SupervisedThread(lambda: None, "serving-events")  # its process exited: EOF on the events pipe
    current[0].start()
    current[0].join(5)
    assert watchdog.check() is None

    def fail():
        raise InjectedFault("bad event")

    current[0] = SupervisedThread(fail, "serving-events")
    current[0].start()
    current[0].join(5)
    failure = watchdog.check()
    assert failure is not None and failure.thread == "serving-events"
    assert "InjectedFault: bad event" in failure.traceback


def test_episodes_fault_hook_raises_only_when_set():
    calls = []
    on_episodes = calls.append
    assert episodes_fault_from_environment(on_episodes, {}) is on_episodes
    with pytest.raises(InjectedFault, match=EVENTS_FAULT_ENV):
        episodes_fault_from_environment(calls.append, {EVENTS_FAULT_ENV: "1"})([(0, 1.0)])
    assert calls == []
    with pytest.raises(ValueError, match=f"{EVENTS_FAULT_ENV}: got 'yes', expected 1 or unset"):
        episodes_fault_from_environment(calls.append, {EVENTS_FAULT_ENV: "yes"})


def test_sink_fault_hook_raises_only_after_its_delay():
    calls = []
    sink = calls.append
    assert sink_fault_from_environment(sink, {}) is sink
    import psutil

    age_s = time.time() - psutil.Process().create_time()  # the delay counts from the process start
    faulty = sink_fault_from_environment(sink, {SINK_FAULT_ENV: f"{age_s + 1.0:.3f}"})
    faulty(1)
    time.sleep(1.1)
    with pytest.raises(InjectedFault, match=SINK_FAULT_ENV):
        faulty(2)
    assert calls == [1]
    with pytest.raises(ValueError, match=f"{SINK_FAULT_ENV}: got 'soon', expected seconds"):
        sink_fault_from_environment(calls.append, {SINK_FAULT_ENV: "soon"})


def _config(tmp_path, **overrides):
    from seed.learner.configuration import resolve_config

    values = dict(env="fake:vector", logdir=str(tmp_path / "run"), server_address=f"unix:{tmp_path}/s", num_actors=1,
                  envs_per_actor=2, batch_size=2, unroll_length=5, torch_threads=1, log_interval_s=0.5)
    values.update(overrides)
    return resolve_config(values)


def test_learner_whose_prefetcher_dies_stops_with_the_error_and_a_checkpoint(tmp_path):
    from seed.learner.learner import Learner

    learner = Learner(_config(tmp_path))

    def broken_next_unroll(timeout_s):
        raise OSError("prefetcher lost its queue")

    learner.parts.experience.prefetcher._next_unrolls = broken_next_unroll  # the fault, injected into the real thread
    raised = []

    def run():
        try:
            learner.run()
        except BaseException as error:  # noqa: BLE001 - inspected below
            raised.append(error)

    runner = threading.Thread(target=run)
    runner.start()
    runner.join(30)  # serving start and stop included
    if runner.is_alive():  # frozen: end it so the test fails instead of hanging
        learner.request_stop()
        runner.join(30)
        pytest.fail("the learner kept running with a dead prefetcher")
    assert len(raised) == 1 and isinstance(raised[0], ThreadDied), raised
    assert str(raised[0]).startswith("thread 'prefetcher' died (OSError: prefetcher lost its queue)")
    assert "broken_next_unroll" in raised[0].failure.traceback
    # The network and optimizer were whole: the learner checkpointed on the way out.
    assert checkpoint.latest(learner.config.logdir) is not None


def test_learner_whose_sink_raises_exits_non_zero_with_the_traceback(processes, tmp_path, monkeypatch):
    """Real learner and actor processes; the sink's injected exception used to leave the learner at 0 FPS
    forever with the actor waiting for an answer."""
    logdir = str(tmp_path / "run")
    address = f"unix:{tmp_path}/learner.sock"
    monkeypatch.setenv(SINK_FAULT_ENV, "12")
    learner = processes.learner([f"--logdir={logdir}", f"--server_address={address}", "--env=fake:vector",
                                 "--num_actors=1", "--envs_per_actor=4", "--batch_size=4", "--unroll_length=10",
                                 "--log_interval_s=0.5", "--torch_threads=1", "--checkpoint_interval_s=3600"])
    monkeypatch.delenv(SINK_FAULT_ENV)
    processes.actor([f"--server_address={address}", "--env=fake:vector", "--envs_per_actor=4", "--actor_index=0"],
                    "actor0")
    wait_for(lambda: read_metrics(logdir) and read_metrics(logdir)[-1]["env_frames"] > 0, 60,
             "the actor's steps to reach the learner", on_timeout=lambda: processes.output(learner))
    wait_for(lambda: "thread 'experience-sink' died" in processes.output(learner), 30, "the sink to fail",
             on_timeout=lambda: processes.output(learner))
    died_at = time.monotonic()
    code = learner.wait(timeout=45)
    # Stop, checkpoint, exit: seconds on a quiet machine; 15.2 s was seen beside two other test workers.
    assert time.monotonic() - died_at < 30
    output = processes.output(learner)
    assert code != 0, output
    assert "Traceback (most recent call last)" in output and "InjectedFault" in output, output
    assert "seed.runtime.supervised_thread.ThreadDied: thread 'experience-sink' died" in output, output
    assert checkpoint.latest(logdir) is not None, output


def test_learner_whose_serving_events_thread_raises_exits_non_zero_naming_it(processes, tmp_path, monkeypatch):
    """Real learner and actor processes; the serving-events thread raises at the first episodes the actor reports.
    Unsupervised, it died silently and the learner went on without the actors' episode returns."""
    logdir = str(tmp_path / "run")
    address = f"unix:{tmp_path}/learner.sock"
    monkeypatch.setenv(EVENTS_FAULT_ENV, "1")
    learner = processes.learner([f"--logdir={logdir}", f"--server_address={address}", "--env=fake:vector",
                                 "--num_actors=1", "--envs_per_actor=2", "--batch_size=2", "--unroll_length=5",
                                 "--fake_episode_length=3", "--log_interval_s=0.5", "--torch_threads=1",
                                 "--checkpoint_interval_s=3600"])
    monkeypatch.delenv(EVENTS_FAULT_ENV)
    processes.actor([f"--server_address={address}", "--env=fake:vector", "--envs_per_actor=2", "--actor_index=0",
                     "--fake_episode_length=3"], "actor0")
    wait_for(lambda: "listening on" in processes.output(learner), 120, "the learner to listen",
             on_timeout=lambda: processes.output(learner))
    wait_for(lambda: "thread 'serving-events' died" in processes.output(learner), 120,
             "the learner to report the serving-events thread's death", on_timeout=lambda: processes.output(learner))
    code = learner.wait(timeout=120)  # its stop took 51 s at load 16 (serving process, inference, checkpoint)
    output = processes.output(learner)
    assert code != 0, output
    assert "InjectedFault" in output and "thread 'serving-events' died" in output, output
    assert ("seed.runtime.supervised_thread.ThreadDied: thread 'serving-events' died "
            "(seed.runtime.supervised_thread.InjectedFault") in output, output


def test_learner_refuses_a_replay_that_cannot_fit_in_memory(tmp_path):
    from seed.experience.replay import ReplayDoesNotFit, available_memory_bytes
    from seed.learner.learner import Learner

    with pytest.raises(ReplayDoesNotFit) as info:
        Learner(_config(tmp_path, agent="r2d2", burn_in=2, replay_capacity=10**12, replay_min_size=1))
    message = str(info.value)
    assert message.startswith("--replay_capacity: got 1,000,000,000,000 sequences x ")
    assert "GiB) of memory are available" in message and "expected at most" in message
    # The figure it refuses with is what the replay really allocates per sequence.
    learner = Learner(_config(tmp_path, agent="r2d2", burn_in=2, replay_capacity=8, replay_min_size=1))
    try:
        learner.parts.channels.slab.live_run[:] = 1
        from tests.conftest import serve_steps

        for _ in range(learner.config.unroll_length + 1):
            serve_steps(learner.parts.inferences[0], [(0, 1, np.zeros((2, 8), np.float32), np.zeros(2, np.float32),
                                             np.zeros(2, bool), np.zeros(2, bool))])
        learner.parts.sink.start()
        replay = learner.parts.experience.replay
        wait_for(lambda: replay.size > 0, 10, "the unrolls to reach the replay")
        assert replay.nbytes == 8 * learner.parts.agent.replay_sequence_bytes()
        assert available_memory_bytes() > replay.nbytes
    finally:
        learner.parts.stop_event.set()
        learner._close()


def test_prefetcher_failure_is_recorded_for_the_watchdog():
    from seed.experience.training_batches import Prefetcher

    stop = threading.Event()
    calls = []

    def next_unroll(timeout_s):
        calls.append(timeout_s)
        raise RuntimeError("no unrolls")

    prefetcher = Prefetcher(next_unroll, 2, torch.device("cpu"), stop)
    watchdog = Watchdog(stop)
    watchdog.watch(prefetcher.thread)
    prefetcher.start()
    prefetcher.thread.join(5)
    assert watchdog.check().thread == "prefetcher" and "RuntimeError: no unrolls" in watchdog.check().traceback
    assert calls == [0.1]


def test_local_launcher_restarts_a_learner_whose_sink_died(tmp_path):
    """launch/local.sh restarts a learner that exits non-zero; the new one resumes and the actor reconnects."""
    import os
    import signal
    import subprocess
    import sys

    from tests.conftest import REPO, RESUMED

    logdir = str(tmp_path / "run")
    log_path = tmp_path / "local.log"
    env = dict(os.environ, PYTHON=sys.executable, PYTHONUNBUFFERED="1", **{SINK_FAULT_ENV: "15"})
    with open(log_path, "wb") as log:
        launcher = subprocess.Popen(
            [os.path.join(REPO, "launch", "local.sh"), f"--logdir={logdir}", "--env=fake:vector", "--num_actors=1",
             "--envs_per_actor=4", "--batch_size=4", "--unroll_length=10", "--log_interval_s=0.5",
             "--torch_threads=1", "--checkpoint_interval_s=3600"],
            stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env)
    output = lambda: log_path.read_text(errors="replace")  # noqa: E731
    try:
        wait_for(lambda: "[local] learner exited with 1; restarting it (1/5)" in output(), 120,
                 "the launcher to restart the learner", on_timeout=output)
        exited_at, rows_before = time.monotonic(), len(read_metrics(logdir))
        assert "thread 'experience-sink' died" in output() and "InjectedFault" in output()
        resumed = wait_for(lambda: RESUMED.search(output()), 60, "the restarted learner to resume", on_timeout=output)
        frames = int(resumed.group(2).replace(",", ""))
        assert frames > 0
        wait_for(lambda: any(r["env_frames"] > frames and r["env_frames_per_sec"] > 0
                             for r in read_metrics(logdir)[rows_before:]), 60,
                 "the restarted learner to serve the reconnected actor", on_timeout=output)
        print(f"recovery under launch/local.sh: {time.monotonic() - exited_at:.1f}s from the exit to new frames")
    finally:
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(timeout=60)
