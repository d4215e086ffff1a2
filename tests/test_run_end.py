"""The end of a run, told to the actors (seed/learner/run_end.py): real learner and actor processes over gRPC
(TCP) and the shared-memory path.

An actor exits 0 when the learner says its run is over (its --total_environment_frames reached), also one that
was reconnecting when the run ended, and one that dials a learner restarted on the finished logdir; a learner that
is merely restarting (SIGTERM, then a new one) is waited for; --noexit_when_done keeps the old behaviour.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.conftest import free_tcp_port, read_metrics, wait_for

FINISHED = "run finished: the learner reached its end"


def learner_args(logdir: str, address: str, **overrides) -> list[str]:
    args = dict(env="fake:vector", logdir=logdir, server_address=address, num_actors=2, envs_per_actor=4,
                batch_size=4, unroll_length=10, log_interval_s=0.5, checkpoint_interval_s=3600,
                total_environment_frames=int(1e12), torch_threads=1, fake_episode_length=20, finished_linger_s=60)
    args.update(overrides)
    return [f"--{k}={v}" for k, v in args.items()]


def actor_args(address: str, index: int, **overrides) -> list[str]:
    args = dict(env="fake:vector", server_address=address, actor_index=index, envs_per_actor=4,
                fake_episode_length=20, reconnect_max_backoff_s=1)
    args.update(overrides)
    return [f"--{k}={v}" for k, v in args.items()]


def frames(logdir: str) -> int:
    rows = read_metrics(logdir)
    return rows[-1]["env_frames"] if rows else 0


@pytest.mark.parametrize("transport", ["grpc", "shm"])
def test_actors_exit_0_when_the_run_is_over_and_the_learner_does_not_linger(processes, tmp_path, transport):
    logdir = str(tmp_path / "run")
    if transport == "shm":
        listen = dial = f"unix:{tmp_path}/learner.sock"
    else:
        listen = dial = f"127.0.0.1:{free_tcp_port()}"
    learner = processes.learner(learner_args(logdir, listen, total_environment_frames=3000))
    actors = [processes.actor(actor_args(dial, i, transport=transport), f"actor{i}") for i in range(2)]
    start = time.monotonic()
    codes = [actor.wait(timeout=120) for actor in actors]
    assert codes == [0, 0], [processes.output(a)[-2000:] for a in actors]
    for actor in actors:
        output = processes.output(actor)
        assert f"connected to {dial} over {transport}" in output and FINISHED in output, output[-2000:]
    assert learner.wait(timeout=60) == 0, processes.output(learner)[-3000:]
    # Every slot heard it, so the learner stopped at once rather than after --finished_linger_s (60 s).
    assert time.monotonic() - start < 50, processes.output(learner)[-3000:]
    assert "2/2 actor slots told the run is finished" in processes.output(learner)


def test_a_reconnecting_actor_and_a_restarted_learner_tell_the_end(processes, tmp_path):
    logdir, address = str(tmp_path / "run"), f"127.0.0.1:{free_tcp_port()}"
    learner = processes.learner(learner_args(logdir, address, total_environment_frames=20_000, num_actors=2))
    first = processes.actor(actor_args(address, 0), "actor0")
    gone = processes.actor(actor_args(address, 1), "actor1")
    wait_for(lambda: "actor 1 connected" in processes.output(learner) and frames(logdir) > 0, 90, "both actors",
             on_timeout=lambda: processes.output(learner))
    gone.kill()  # actor 1 is away (restarting, reconnecting) when the run ends
    assert first.wait(timeout=120) == 0, processes.output(first)[-2000:]
    assert learner.poll() is None, "the learner must linger for the slot whose actor was away"
    # Back after the end (as after a reconnection backoff): it hears the end at its handshake.
    late = processes.actor(actor_args(address, 1), "late")
    assert late.wait(timeout=60) == 0, processes.output(late)[-2000:]
    assert FINISHED in processes.output(late) and "connected to" not in processes.output(late)
    assert learner.wait(timeout=60) == 0, processes.output(learner)[-3000:]
    assert "2/2 actor slots told the run is finished" in processes.output(learner)

    # A learner restarted on the finished logdir tells every actor that dials in, then exits.
    again = processes.learner(learner_args(logdir, address, num_actors=1, total_environment_frames=3000),
                              name="restarted")
    actor = processes.actor(actor_args(address, 0), "after_restart")
    assert actor.wait(timeout=120) == 0, processes.output(actor)[-2000:]
    assert FINISHED in processes.output(actor)
    assert again.wait(timeout=60) == 0, processes.output(again)[-3000:]
    assert "1/1 actor slots told the run is finished" in processes.output(again)


def test_a_restarting_learner_is_waited_for(processes, tmp_path):
    logdir, address = str(tmp_path / "run"), f"127.0.0.1:{free_tcp_port()}"
    learner = processes.learner(learner_args(logdir, address, num_actors=1))
    actor = processes.actor(actor_args(address, 0), "actor0")
    wait_for(lambda: frames(logdir) > 0, 90, "training", on_timeout=lambda: processes.output(learner))
    learner.send_signal(signal.SIGTERM)  # a stop, not the end of the run: the learner checkpoints and exits 0
    assert learner.wait(timeout=60) == 0
    time.sleep(3)  # the actor retries meanwhile
    assert actor.poll() is None, processes.output(actor)[-2000:]
    assert FINISHED not in processes.output(actor)
    done_at = frames(logdir) + 2000
    resumed = processes.learner(learner_args(logdir, address, num_actors=1, total_environment_frames=done_at),
                                name="resumed")
    assert actor.wait(timeout=120) == 0, processes.output(actor)[-2000:]
    output = processes.output(actor)
    assert output.count("connected to") == 2 and FINISHED in output, output[-2000:]
    assert resumed.wait(timeout=60) == 0
    assert "resumed from" in processes.output(resumed)


def test_noexit_when_done_keeps_reconnecting(processes, tmp_path):
    logdir, address = str(tmp_path / "run"), f"127.0.0.1:{free_tcp_port()}"
    learner = processes.learner(learner_args(logdir, address, num_actors=1, total_environment_frames=3000,
                                             finished_linger_s=3))
    actor = processes.actor(actor_args(address, 0, exit_when_done="false"), "actor0")
    assert learner.wait(timeout=120) == 0, processes.output(learner)[-3000:]
    time.sleep(2)
    assert actor.poll() is None, processes.output(actor)[-2000:]
    assert f"learner unavailable over grpc ({FINISHED}" in processes.output(actor)
    actor.send_signal(signal.SIGTERM)
    assert actor.wait(timeout=30) == 0


def test_an_actor_of_env_groups_exits_0_too(processes, tmp_path):
    logdir, address = str(tmp_path / "run"), f"127.0.0.1:{free_tcp_port()}"
    learner = processes.learner(learner_args(logdir, address, num_actors=1, envs_per_actor=4, env_groups=2,
                                             total_environment_frames=3000))
    actor = processes.actor(actor_args(address, 0, env_groups=2), "actor0")
    assert actor.wait(timeout=120) == 0, processes.output(actor)[-2000:]
    assert FINISHED in processes.output(actor)
    assert learner.wait(timeout=60) == 0
    assert "2/2 actor slots told the run is finished" in processes.output(learner)
    assert os.path.exists(os.path.join(logdir, "summary.json"))
