"""Actor reconnection: the backoff policy, and one live actor per actor index (a newer run takes the index over,
a still-live older one is told it is superseded and exits instead of evicting it back)."""

import functools
import signal
import threading
import time

import grpc
import pytest

from seed.actor.loop import Actor, ReconnectBackoff
from seed.actor.main import SUPERSEDED_EXIT_CODE
from seed.config import ActorConfig
from seed.transport.grpc.link import link_error
from seed.transport.link import SupersededError
from tests.conftest import read_metrics, wait_for
from tests.test_end_to_end import _actor_args as _any_actor_args
from tests.test_end_to_end import _learner_args


def test_backoff_doubles_up_to_the_maximum_and_starts_over_after_a_connection_that_streamed():
    backoff = ReconnectBackoff(0.1, 0.5)
    assert [backoff.after_failure(streamed=False) for _ in range(5)] == pytest.approx([0.1, 0.2, 0.4, 0.5, 0.5])
    assert backoff.after_failure(streamed=True) == pytest.approx(0.1)  # the learner was healthy: start over
    assert backoff.after_failure(streamed=False) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="initial_s: got 0"):
        ReconnectBackoff(0.0, 5.0)


class _Failure(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str = "scripted failure"):
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class _RecordingStop(threading.Event):
    """The actor's stop event: records every reconnection wait instead of sleeping; set after `limit` waits."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit, self.waits = limit, []

    def wait(self, timeout=None):
        self.waits.append(timeout)
        if len(self.waits) >= self.limit:
            self.set()
        return self.is_set()


def _scripted_actor(outcomes, stop):
    """An actor whose connections end as scripted: (steps answered before it failed, status code)."""
    actor = Actor(ActorConfig(env="fake:vector", envs_per_actor=2, actor_index=3, reconnect_max_backoff_s=5.0), stop)
    script = iter(outcomes)

    def run_connection():
        steps, code = next(script)
        actor.agent_steps += steps * 2
        raise link_error(_Failure(code))  # as the gRPC link translates it

    actor._run_connection = run_connection
    return actor


def test_actor_waits_briefly_again_after_a_healthy_connection():
    unavailable = grpc.StatusCode.UNAVAILABLE
    outcomes = [(0, unavailable)] * 4 + [(100, unavailable), (0, unavailable), (5, grpc.StatusCode.INTERNAL)]
    stop = _RecordingStop(limit=len(outcomes))
    _scripted_actor(outcomes, stop).run()
    assert stop.waits == pytest.approx([0.1, 0.2, 0.4, 0.8, 0.1, 0.2, 0.1])


def test_superseded_actor_stops_without_reconnecting():
    stop = _RecordingStop(limit=10)
    actor = _scripted_actor([(3, grpc.StatusCode.FAILED_PRECONDITION)], stop)
    with pytest.raises(SupersededError):
        actor.run()
    assert stop.waits == []


def _train_steps(logdir):
    rows = read_metrics(logdir)
    return rows[-1]["train_steps"] if rows else 0


def _connects(processes, process, index):
    return processes.output(process).count(f"[actor {index}] connected to")


@pytest.mark.parametrize("transport,later", [("grpc", "grpc"), ("shm", "shm"), ("grpc", "shm")])
def test_second_live_actor_with_one_index_supersedes_the_first_which_exits(processes, tmp_path, transport, later):
    """`transport`: the first actors'; `later`: the duplicate's and the restarted actor's (--transport)."""
    logdir = str(tmp_path / "run")
    address = f"unix:{tmp_path}/learner.sock"
    learner = processes.learner(_learner_args(logdir, address))
    _actor_args = functools.partial(_any_actor_args, transport=transport)
    first = processes.actor(_actor_args(address, 0), "actor0")
    other = processes.actor(_actor_args(address, 1), "actor1")
    _actor_args = functools.partial(_any_actor_args, transport=later)
    wait_for(lambda: _train_steps(logdir) >= 5, 90, "training", on_timeout=lambda: processes.output(learner))
    wait_for(lambda: _connects(processes, first, 0) == 1, 30, "actor 0 to connect")
    wait_for(lambda: _connects(processes, other, 1) == 1, 30, "actor 1 to connect")  # training needs only one
    assert f"over {transport}" in processes.output(first)
    # A second live actor claims index 0: the newer run wins, the older one is told and exits.
    duplicate = processes.actor(_actor_args(address, 0), "actor0-duplicate")
    wait_for(lambda: first.poll() is not None, 60, "the superseded actor to exit",
             on_timeout=lambda: processes.output(first) + processes.output(duplicate))
    assert first.returncode == SUPERSEDED_EXIT_CODE
    output = processes.output(first)
    assert "--actor_index=0" in output and "actor_index 0: superseded by a newer actor run" in output
    assert _connects(processes, first, 0) == 1  # it never reconnected
    # The newer one keeps its index (no eviction back and forth) and the learner keeps training.
    steps = _train_steps(logdir)
    wait_for(lambda: _train_steps(logdir) >= steps + 10, 60, "training after the duplicate exited",
             on_timeout=lambda: processes.output(learner) + processes.output(duplicate))
    assert duplicate.poll() is None and other.poll() is None
    assert f"over {later}" in processes.output(duplicate)
    assert _connects(processes, duplicate, 0) == 1 and _connects(processes, other, 1) == 1
    assert processes.output(learner).count("actor 0 connected") == 2
    # A SIGKILLed actor restarted with its index is a replacement, not a duplicate: it reconnects and stays.
    duplicate.send_signal(signal.SIGKILL)
    duplicate.wait(timeout=10)
    restarted = processes.actor(_actor_args(address, 0), "actor0-restarted")
    wait_for(lambda: processes.output(learner).count("actor 0 connected") == 3, 60, "the restarted actor 0",
             on_timeout=lambda: processes.output(restarted))
    steps = _train_steps(logdir)
    wait_for(lambda: _train_steps(logdir) >= steps + 10, 60, "training after the restart")
    time.sleep(1.0)  # long enough for a superseded status to have reached it
    assert restarted.poll() is None and other.poll() is None, processes.output(restarted)
    assert "superseded" not in processes.output(restarted) + processes.output(other)
