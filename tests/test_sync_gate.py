"""The HTS sync gate (`--sync=hts`, seed/inference/rollout_gate.py) across actor runs: a new run of an actor index (a
restarted
actor, a reconnect, a new serving process) never leaves a rollout that cannot complete, and a gate that waits says
for whom.

Three levels: `RolloutGate` driven by hand; a real `CentralInference` with its step slab and the learner's FIFO
experience (prefetcher thread), driven from this thread the way the serving process and the training thread drive
them, so that each interleaving is reproduced exactly; and a learner process with a real actor and a scripted gRPC
actor that holds the window (publication between a new run's handshake and its first step) open.
"""

import contextlib
import logging
import re
import signal
import threading
import time
from collections.abc import Callable

import grpc
import numpy as np
import pytest
import torch

from seed._proto import seed_pb2, seed_pb2_grpc
from seed.contracts.training import Unroll
from seed.envs import make_spec
from seed.envs.base import BatchStep
from seed.experience.training_batches import Prefetcher
from seed.inference.rollout_gate import RolloutGate
from seed.learner.configuration import resolve_config
from seed.learner.learner import Learner
from seed.transport import wire
from seed.transport.grpc.link import Stream, step_message
from seed.transport.slab import REPLY_OK, REPLY_STALE
from tests.conftest import read_metrics, wait_for

T = 2  # --sync_every of the hand-driven tests
K = 2  # envs per actor


# ------------------------------------------------------------------------------------------------ the gate alone


def _serve(gate, actors, seqs, run=1):
    """Admits requests of `run`, counts the admitted ones as served; the served actors."""
    kept, _, _ = gate.admit(np.array(actors), np.array(seqs), np.full(len(actors), run))
    gate.stepped(kept)
    return kept.tolist()


def _served_until_held(gate, actor, run, first_seq=100, limit=20):
    """How many requests of `run` the gate serves before it holds one."""
    for n in range(limit):
        if not _serve(gate, [actor], [first_seq + n], run):
            return n
    raise AssertionError(f"actor {actor} never held in {limit} requests")


def test_a_held_request_of_a_superseded_run_is_not_counted_at_the_sync_point():
    gate = RolloutGate(np.array([0, 1]), 2, rollout_steps=T)
    live = np.array([1, 1])
    for step in range(T):
        assert _serve(gate, [0, 1], [step, step]) == [0, 1]
    assert _serve(gate, [1], [T]) == []  # actor 1 waits at the sync point
    live[1] = 2  # its restarted process handshook; the new run's first step is not there yet
    assert _serve(gate, [0], [T]) == []
    actors, seqs = gate.drop_superseded(live)  # to be answered stale
    assert actors.tolist() == [1] and seqs.tolist() == [T] and set(gate.held) == {0}
    assert gate.try_open(0, live) is None  # the version is there, but actor 1's new run has not played rollout 0
    # The new run plays rollout 0 from its start (its unroll ends at the same sync point as actor 0's).
    assert _served_until_held(gate, 1, run=2) == T
    batches = gate.try_open(0, live)
    assert [a.tolist() for a, _ in batches] == [[0, 1]] and [s.tolist() for _, s in batches] == [[T, 100 + T]]


def test_a_run_answered_stale_at_the_opening_is_replayed_by_its_successor():
    """The gate counted actor 1's held request and opened; the request was then answered stale (a new run
    handshook in between), so actor 1's unroll of rollout 0 never completed. Its next run plays rollout 0 again
    (T + 1 steps complete that unroll) and then rollout 1: 2T steps before the next sync point, not T."""
    gate = RolloutGate(np.array([0, 1]), 2, rollout_steps=T)
    live = np.array([1, 1])
    for step in range(T + 1):
        _serve(gate, [0, 1], [step, step])
    assert gate.try_open(0, live) is not None
    assert _serve(gate, [0], [T]) == [0]  # actor 0's held request is served; actor 1's is not (stale)
    live[1] = 2
    assert _served_until_held(gate, 0, run=1, first_seq=T + 1) == T - 1
    assert _served_until_held(gate, 1, run=2) == 2 * T
    assert gate.try_open(0, live) is None  # rollout 2 needs the update on rollout 0, which actor 1 just completed
    assert [a.tolist() for a, _ in gate.try_open(1, live)] == [[0, 1]]


def test_actors_whose_unrolls_were_lost_play_again_from_the_rollout_they_owe():
    """`start_over`: the unroll store failed on the step just served. An actor whose step completed its unroll
    replays that rollout; one in the middle of a rollout replays it from its start."""
    gate = RolloutGate(np.array([0, 1]), 2, rollout_steps=T)
    for step in range(T + 1):
        _serve(gate, [0, 1], [step, step])
    gate.try_open(0, np.array([1, 1]))
    completed = gate.stepped(np.array([0, 1]))  # the opening: both steps complete their unroll of rollout 0
    assert completed.tolist() == [True, True]
    gate.start_over(np.array([1]), completed[1:])
    assert _served_until_held(gate, 0, run=1) == T - 1
    assert _served_until_held(gate, 1, run=1) == 2 * T  # rollout 0 again, then rollout 1
    gate.try_open(1, np.array([1, 1]))
    for actor in (0, 1):
        assert gate.stepped(np.array([actor])).tolist() == [True]
    completed = gate.stepped(np.array([0]))
    assert completed.tolist() == [False]
    gate.start_over(np.array([0]), completed)  # in the middle of rollout 2: from its start again
    assert _served_until_held(gate, 0, run=1) == T
    assert _served_until_held(gate, 1, run=1) == T - 1


def test_a_waiting_gate_logs_whom_it_waits_for_rate_limited(caplog):
    gate = RolloutGate(np.array([0, 1, 2]), 3, rollout_steps=T, wait_log_s=5.0, wait_log_every_s=30.0)
    live = np.array([1, 1, 0])  # actor 2 never connected
    _serve(gate, [0, 1], [0, 0])
    _serve(gate, [0], [1])
    assert _serve(gate, [0], [2]) == []  # actor 0 waits at the sync point; actor 1 is one step short of it
    with caplog.at_level(logging.WARNING, logger="seed.inference.rollout_gate"):
        for now in (100.0, 104.0):
            assert gate.try_open(0, live, now=now) is None
        assert not caplog.records
        gate.try_open(0, live, now=105.5)
        assert len(caplog.records) == 1
        message = caplog.records[0].getMessage()
        assert "waited 5.5 s" in message and "for actors 1, 2" in message, message
        assert "actor 1 at step 1 of 2" in message and "actor 2 not connected" in message, message
        gate.try_open(0, live, now=120.0)
        assert len(caplog.records) == 1  # rate-limited
        gate.try_open(0, live, now=136.0)
        assert len(caplog.records) == 2 and "waited 36.0 s" in caplog.records[1].getMessage()


def test_a_gate_waiting_for_the_update_names_the_version(caplog):
    gate = RolloutGate(np.array([0]), 1, rollout_steps=1, wait_log_s=5.0)
    live = np.array([1])
    _serve(gate, [0], [0])
    assert _serve(gate, [0], [1]) == []
    assert gate.try_open(0, live, now=10.0) is not None  # rollout 1 is played with the initial parameters
    _serve(gate, [0], [1])
    assert _serve(gate, [0], [2]) == []
    with caplog.at_level(logging.WARNING, logger="seed.inference.rollout_gate"):
        assert gate.try_open(0, live, now=20.0) is None  # the clock starts at this sync point, not the last one
        assert not caplog.records
        gate.try_open(0, live, now=26.0)
    message = caplog.records[0].getMessage()
    assert "every actor is at the sync point" in message and "policy version 1 (published: 0)" in message, message


def test_lag_0_stages_the_boundary_step_and_opens_with_the_update_on_that_rollout():
    """--sync_lag=0: a request at the sync point is staged (stored, counted as served: it completes the unroll)
    and answered at the opening, which needs the update on the rollout just played, not the one before."""
    gate = RolloutGate(np.array([0, 1]), 2, rollout_steps=T, lag=0)
    assert gate.needed_version == 1  # rollout 1 is played with the update on rollout 0
    for step in range(T):
        assert _serve(gate, [0, 1], [step, step]) == [0, 1]
    assert _serve(gate, [0, 1], [T, T]) == []
    actors, seqs = gate.take_held()
    assert actors.tolist() == [0, 1] and seqs.tolist() == [T, T] and not gate.held
    assert gate.try_open(1) is None  # nothing staged yet: the inference side has not stored the steps
    assert gate.stage(actors, seqs, np.array([1, 1])).tolist() == [True, True]  # both unrolls of rollout 0 complete
    assert gate.try_open(0, np.array([1, 1])) is None  # the update on rollout 0 is not published
    batches = gate.try_open(1, np.array([1, 1]))
    assert [a.tolist() for a, _ in batches] == [[0, 1]] and [s.tolist() for _, s in batches] == [[T, T]]
    assert gate.needed_version == 2 and not gate.staged
    for actor in (0, 1):  # the staged step was the first of rollout 1
        assert _served_until_held(gate, actor, run=1, first_seq=T + 1) == T - 1
    gate.stage(*gate.take_held(), np.array([1, 1]))
    with pytest.raises(RuntimeError, match="expected 2"):
        gate.try_open(3, np.array([1, 1]))  # the learner cannot be ahead of the rollouts it was given


def test_lag_0_a_staged_request_notified_again_is_not_staged_twice_and_a_superseded_one_is_answered_stale():
    gate = RolloutGate(np.array([0, 1]), 2, rollout_steps=T, lag=0)
    live = np.array([1, 1])
    for step in range(T + 1):
        _serve(gate, [0, 1], [step, step])
    gate.stage(*gate.take_held(), np.array([1, 1]))
    assert _serve(gate, [0], [T]) == [] and not gate.held  # a new serving process notifies actor 0's request again
    live[1] = 2  # actor 1 restarted while its boundary step waits for the update
    actors, seqs = gate.drop_superseded(live)
    assert actors.tolist() == [1] and seqs.tolist() == [T] and set(gate.staged) == {0}
    assert gate.try_open(1, live) is None  # actor 1's new run has not reached the sync point
    # Its unroll of rollout 0 is complete (the staged step was stored): the new run plays rollout 1 from its
    # start, so its first step is the one at this sync point.
    assert _serve(gate, [1], [0], run=2) == [] and set(gate.held) == {1}
    actors, seqs = gate.take_held()
    assert gate.stage(actors, seqs, np.array([2])).tolist() == [False]  # a run's first step completes nothing
    assert [a.tolist() for a, _ in gate.try_open(1, live)] == [[0, 1]]


# ------------------------------------------------------------------------------- central inference, hand-driven


def _learner(tmp_path, **flags):
    config = resolve_config(dict(agent="ppo", env="fake:vector", logdir=str(tmp_path), num_actors=2,
                                 envs_per_actor=K, sync_every=T, mlp_sizes="16", inference_batch_size=K,
                                 server_address=f"unix:{tmp_path}/s", torch_threads=1, **flags))
    learner = Learner(config)
    yield learner
    learner.parts.stop_event.set()
    learner._close()


@pytest.fixture
def hts_learner(tmp_path):
    yield from _learner(tmp_path)


@pytest.fixture
def lag0_learner(tmp_path):
    yield from _learner(tmp_path, sync_lag=0)


class _Run:
    """One actor run as its serving-process stream drives it: one request in flight; the next step is written
    once the reply came (up to `pause_after` requests, when set)."""

    def __init__(self, actor: int, run_id: int):
        self.actor, self.run_id = actor, run_id
        self.seq: int | None = None
        self.sent = 0
        self.statuses: list[int] = []
        self.pause_after: int | None = None

    @property
    def paused(self) -> bool:
        """It sent `pause_after` requests and has the last one's reply."""
        return self.sent == self.pause_after and len(self.statuses) == self.sent


class _Harness:
    """The serving process and the training thread around one real CentralInference with a gate, in this thread.

    Each `pump`: the inference thread's sync-point poll (`release_held`), then every run whose reply came writes
    its next step into the slab, one batch of those, and the training side: a batch from the real FIFO
    experience (the prefetcher builds it on its thread) is "trained" by publishing the next version. As in
    SlabService, a run whose slot holds a predecessor's unanswered request waits while that predecessor's stream
    waits (it holds the slot's locks until its reply, whether its actor is alive or not), and notifies it again
    if its stream is gone (a new serving process).
    """

    def __init__(self, learner: Learner):
        self.learner, self.slab, self.inference = learner, learner.parts.channels.slab, learner.parts.inferences[0]
        self.gate = self.inference.gate
        self.experience = learner.parts.experience
        self.inference.sink = self.experience.sink
        self.experience.start()
        self.runs: list[_Run] = []
        self.training = True
        self.version = 0
        self.batches: list[list[int]] = []  # env ids of each trained batch
        self.acted_with: list[list[int]] = []  # the policy versions of each trained batch's steps [:-1]
        self.parameters = {k: v.clone() for k, v in learner.parts.agent.network.state_dict().items()}

    def handshake(self, actor: int, run_id: int) -> _Run:
        self.slab.live_run[actor] = run_id  # what SlabService.register does
        return _Run(actor, run_id)

    def start(self, run: _Run) -> _Run:
        self.runs.append(run)
        return run

    def pump(self) -> None:
        self.inference.release_held()
        actors, seqs = [], []
        for run in self.runs:
            if run.seq is not None:
                if not self.slab.answered(run.actor, run.seq):
                    continue
                if len(run.statuses) < run.sent:
                    run.statuses.append(int(self.slab.reply_status[run.actor]))
                if run.statuses[-1] != REPLY_OK or run.sent == run.pause_after:
                    continue
            left = self.slab.unanswered(run.actor)
            if left is not None:
                if any(other.actor == run.actor and other.seq == left for other in self.runs):
                    continue  # the predecessor's stream waits for that reply and holds the slot meanwhile
                actors.append(run.actor)  # a dead serving process's request: notified again, answered first
                seqs.append(left)
                continue
            observation = np.full((K, 8), float(run.sent), np.float32)
            run.seq = self.slab.write_request(run.actor, run.run_id, observation, np.ones(K, np.float32),
                                              np.zeros(K, bool), np.zeros(K, bool))
            run.sent += 1
            actors.append(run.actor)
            seqs.append(run.seq)
        if actors:
            self.inference.run_batch(np.array(actors, np.int64), np.array(seqs, np.int64))
        if self.training:
            batch = self.experience.next_batch(0.0 if actors else 0.01)
            if batch is not None:
                self.batches.append(batch.unrolls.env_id.tolist())
                unrolls = batch.unrolls
                self.acted_with.append(sorted(set(unrolls.policy_version[:-1][unrolls.valid[:-1]].tolist())))
                self.version += 1
                self.inference.publish(self.parameters, self.version)

    def run_until(self, predicate, what: str, timeout_s: float = 15.0) -> None:
        """Pumps until `predicate()`; fails naming the gate's state if the run stops making progress."""
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                gate = self.gate
                raise AssertionError(
                    f"stuck waiting for {what}: gate at rollout {gate.rollout}, held {sorted(gate.held)}, steps "
                    f"{gate.steps.tolist()}, version needed {gate.needed_version}, published {self.version}, "
                    f"trained batches {len(self.batches)}")
            self.pump()

    def held(self, *actors: int) -> bool:
        return set(self.gate.held) == set(actors)

    def staged(self, *actors: int) -> bool:
        return set(self.gate.staged) == set(actors)


def _assert_batches_hold_every_env_once(batches: list[list[int]]) -> None:
    for env_ids in batches:
        assert sorted(env_ids) == list(range(2 * K)), batches


def test_held_actor_restarted_across_a_publication_the_run_goes_on(hts_learner):
    """The issue's deadlock: actor 1 waits at sync point 2 (it needs version 1, the update on rollout 0) when its
    restarted process handshakes; actor 0 arrives and version 1 is published before the new run's first step.
    Before the fix the gate counted the old run's held request, opened, answered it stale, the new run joined
    rollout 2, rollout 1's batch lacked actor 1's unrolls and sync point 3 waited forever for the update on it."""
    h = _Harness(hts_learner)
    old, other = h.start(h.handshake(1, 1)), h.start(h.handshake(0, 1))
    other.pause_after = 2 * T  # actor 0 stops one step short of sync point 2
    h.training = False  # the update on rollout 0 is still being computed
    h.run_until(lambda: h.held(1) and other.paused, "actor 1 held at sync point 2")
    new = h.handshake(1, 2)  # actor 1's restarted process: handshake done, first step not sent yet
    other.pause_after = None
    h.training = True
    h.run_until(lambda: h.version == 1 and 0 in h.gate.held, "actor 0 at sync point 2 and version 1 published")
    for _ in range(20):
        h.pump()
    # The gate has not opened for the superseded request; it answered it stale, freeing the slot for the new run.
    assert h.gate.rollout == 1 and old.statuses == [REPLY_OK] * (2 * T) + [REPLY_STALE]
    h.start(new)
    h.run_until(lambda: len(h.batches) >= 5, "three more rollouts trained after the restart")
    _assert_batches_hold_every_env_once(h.batches)
    assert old.statuses == [REPLY_OK] * (2 * T) + [REPLY_STALE]
    assert set(new.statuses) == {REPLY_OK} and set(other.statuses) == {REPLY_OK}


def test_handshake_between_the_opening_and_the_held_reply_the_run_goes_on(hts_learner):
    """The race the live-run check cannot close: the gate counted actor 1's held request as live and opened;
    the new run's handshake lands while the held requests are being served (after actor 0's reply, before
    actor 1's). Its request is answered stale; the new run replays rollout 1 so that its batch completes."""
    h = _Harness(hts_learner)
    old, other = h.start(h.handshake(1, 1)), h.start(h.handshake(0, 1))
    other.pause_after = 2 * T
    h.run_until(lambda: h.version == 1 and h.held(1) and other.paused,
                "actor 1 held at sync point 2, version 1 published")
    reply = h.inference.reply
    handshakes = []

    def reply_then_handshake(actors):
        reply(actors)
        if not handshakes and h.gate.rollout == 2 and 0 in actors.tolist():
            handshakes.append(h.handshake(1, 2))  # the serving process registers actor 1's new run meanwhile

    h.inference.reply = reply_then_handshake
    other.pause_after = None
    h.run_until(lambda: handshakes, "the opening of sync point 2")
    new = h.start(handshakes[0])
    h.run_until(lambda: len(h.batches) >= 5, "three more rollouts trained after the restart")
    _assert_batches_hold_every_env_once(h.batches)
    assert old.statuses[-1] == REPLY_STALE and set(new.statuses) == {REPLY_OK}


def test_serving_process_restart_at_the_sync_point_the_run_goes_on(hts_learner):
    """A new serving process: every actor is a new run at once, all of them held at a sync point whose update
    is published before any new run's first step."""
    h = _Harness(hts_learner)
    first = [h.start(h.handshake(a, 1)) for a in (0, 1)]
    h.training = False
    h.run_until(lambda: h.held(0, 1) and h.gate.rollout == 1, "both actors held at sync point 2")
    second = [h.handshake(a, 2) for a in (0, 1)]
    h.runs.clear()  # the old serving process is gone with its streams
    h.training = True
    h.run_until(lambda: h.version == 1, "version 1 published")
    for run in second:
        h.start(run)
    h.run_until(lambda: len(h.batches) >= 4, "three more rollouts trained after the restart")
    _assert_batches_hold_every_env_once(h.batches)
    assert all(set(run.statuses) == {REPLY_OK} for run in first + second)


def test_unroll_store_failure_at_the_opening_the_run_goes_on(hts_learner):
    """The unroll store fails on the step that opens sync point 1 for actor 1: its unrolls of rollout 0 are lost
    (see CentralInference._serve). It plays rollout 0 again instead of leaving the batch one actor short."""
    h = _Harness(hts_learner)
    append = h.inference.unroll_store.append
    failures = []

    def fails_once_at_the_opening(env_ids, step, state_before):
        if h.gate.rollout == 1 and env_ids.tolist() == [2, 3] and not failures:
            failures.append(1)
            raise MemoryError("unroll store full")
        return append(env_ids, step, state_before)

    h.inference.unroll_store.append = fails_once_at_the_opening
    for a in (0, 1):
        h.start(h.handshake(a, 1))
    h.run_until(lambda: len(h.batches) >= 3, "three rollouts trained")
    assert failures
    _assert_batches_hold_every_env_once(h.batches)


def _assert_trained_with_the_parameters_that_played_it(h: _Harness) -> None:
    """--sync_lag=0: batch i's actions were all chosen by version i, the parameters it trains (so also the steps
    answered at each opening, which the unroll store completed after storing them)."""
    assert h.acted_with == [[i] for i in range(len(h.acted_with))], h.acted_with


def test_lag_0_every_batch_is_trained_with_the_parameters_that_played_it(lag0_learner):
    h = _Harness(lag0_learner)
    runs = [h.start(h.handshake(a, 1)) for a in (0, 1)]
    h.run_until(lambda: len(h.batches) >= 4, "four rollouts trained")
    _assert_batches_hold_every_env_once(h.batches)
    _assert_trained_with_the_parameters_that_played_it(h)
    assert all(set(run.statuses) == {REPLY_OK} for run in runs)


def test_lag_0_staged_actor_restarted_before_the_opening_the_run_goes_on(lag0_learner):
    """Both actors' boundary steps are staged (their unrolls of rollout 0 complete) when actor 1's restarted
    process handshakes; the update is published before the new run's first step. The old run is answered
    stale and the new run plays rollout 1 (not rollout 0 again: its unroll was complete)."""
    h = _Harness(lag0_learner)
    old, other = h.start(h.handshake(1, 1)), h.start(h.handshake(0, 1))
    h.training = False
    h.run_until(lambda: h.staged(0, 1), "both boundary steps staged")
    new = h.handshake(1, 2)
    h.training = True
    h.run_until(lambda: h.version == 1, "the update on rollout 0 published")
    for _ in range(20):
        h.pump()
    assert h.gate.rollout == 0 and old.statuses == [REPLY_OK] * T + [REPLY_STALE]
    h.start(new)
    h.run_until(lambda: len(h.batches) >= 5, "four more rollouts trained after the restart")
    _assert_batches_hold_every_env_once(h.batches)
    _assert_trained_with_the_parameters_that_played_it(h)
    assert set(new.statuses) == {REPLY_OK} and set(other.statuses) == {REPLY_OK}


def test_lag_0_serving_process_restart_at_the_sync_point_the_run_goes_on(lag0_learner):
    h = _Harness(lag0_learner)
    for a in (0, 1):
        h.start(h.handshake(a, 1))
    h.run_until(lambda: h.version == 1, "the update on rollout 0 published")
    h.training = False
    h.run_until(lambda: h.staged(0, 1) and h.gate.rollout == 1, "both actors staged at sync point 2")
    second = [h.handshake(a, 2) for a in (0, 1)]
    h.runs.clear()  # the old serving process is gone with its streams
    h.training = True
    h.run_until(lambda: h.version == 2, "the update on rollout 1 published")
    for run in second:
        h.start(run)
    h.run_until(lambda: len(h.batches) >= 5, "three more rollouts trained after the restart")
    _assert_batches_hold_every_env_once(h.batches)
    _assert_trained_with_the_parameters_that_played_it(h)
    assert all(set(run.statuses) == {REPLY_OK} for run in second)


def test_lag_0_unroll_store_failure_at_staging_the_run_goes_on(lag0_learner):
    """The unroll store fails on the staged steps at sync point 1 that include actor 1's: their unrolls of rollout
    0 are lost. Those steps are served at once as the first of new runs of rows, which play rollout 0 again."""
    h = _Harness(lag0_learner)
    append = h.inference.unroll_store.append
    failures = []

    def fails_once_at_staging(env_ids, step, state_before, complete=True):
        if not complete and 2 in env_ids.tolist() and not failures:
            failures.append(1)
            raise MemoryError("unroll store full")
        return append(env_ids, step, state_before, complete=complete)

    h.inference.unroll_store.append = fails_once_at_staging
    runs = [h.start(h.handshake(a, 1)) for a in (0, 1)]
    h.run_until(lambda: len(h.batches) >= 3, "three rollouts trained")
    assert failures
    _assert_batches_hold_every_env_once(h.batches)
    _assert_trained_with_the_parameters_that_played_it(h)
    assert all(set(run.statuses) == {REPLY_OK} for run in runs)


def test_an_hts_batch_with_a_second_unroll_of_one_env_is_refused():
    """The experience side's check: with `sort_by_env` (HTS) a batch holds one unroll of each env; a second unroll
    of an env before the batch is complete ends the prefetcher (and so the learner) naming it, instead of a batch
    that mixes two rollouts of env 0."""
    stop = threading.Event()
    env_ids = [1, 0, 0, 2]

    def next_unroll(timeout_s):
        if not env_ids:
            time.sleep(timeout_s)
            return None
        return Unroll({"reward": torch.zeros(3, 1)}, {}, torch.tensor([env_ids.pop(0)]))  # a batch of one

    prefetcher = Prefetcher(next_unroll, 3, torch.device("cpu"), stop, sort_by_env=True)
    prefetcher.start()
    prefetcher.thread.join(5)
    stop.set()
    assert prefetcher.thread.failure is not None, "the prefetcher accepted two unrolls of env 0 in one batch"
    failure = prefetcher.thread.failure.traceback
    expected = "second unroll of env 0 at position 2 of 3 (the first at 1; env ids in arrival order [1, 0, 0])"
    assert expected in failure, failure


# ------------------------------------------------------------------------------------------- learner process


def _train_steps(logdir: str) -> int:
    rows = read_metrics(logdir)
    return rows[-1]["train_steps"] if rows else 0


def _scripted_run(address: str, spec, run_id: int, channels: list) -> Callable[[], object]:
    """A run of actor 1 over gRPC whose steps the test sends: handshakes, returns send() (one step, its reply;
    raises grpc.RpcError once the learner ends the stream). Its channel is appended to `channels`."""
    channel = grpc.insecure_channel(address)
    channels.append(channel)
    stream = Stream(seed_pb2_grpc.LearnerStub(channel))
    stream.call(seed_pb2.ActorMessage(handshake=seed_pb2.Handshake(
        actor_index=1, run_id=run_id, num_envs=K, spec=wire.spec_to_proto(spec))))
    step = BatchStep(np.zeros((K, *spec.observation_shape), np.float32), np.ones(K, np.float32),
                     np.zeros(K, bool), np.zeros(K, bool), [])
    return lambda: stream.call(step_message(step))


def test_learner_with_a_restarted_held_actor_keeps_training(processes, tmp_path):
    """HTS PPO on CartPole with two actors: actor 0 a real actor process, actor 1 scripted over gRPC.

    1. Actor 1 waits at the first sync point (actor 0 is not there yet: the learner says so) when a new run of
       actor 1 handshakes and sends nothing yet; then actor 0 arrives (the version this sync point needs is there
       from the start). Before the fix the gate opened counting the old run, the first batch lacked actor 1's
       unrolls and training never started.
    2. Actor 0 is SIGKILLed while it waits at a sync point (actor 1 pauses, so the gate says it waits for actor 1)
       and restarted; its new run handshakes before the sync point can open. Before the fix the dead run's stream
       kept the slot until the gate opened counting it, the new run joined the next rollout and training stopped.
    """
    logdir, address = str(tmp_path / "run"), f"unix:{tmp_path}/learner.sock"
    common = [f"--envs_per_actor={K}", "--env=gym:CartPole-v1"]
    learner = processes.learner([*common, "--agent=ppo", "--sync=hts", "--sync_every=8", "--num_actors=2",
                                 f"--logdir={logdir}", f"--server_address={address}", "--log_interval_s=0.5",
                                 "--torch_threads=1", "--checkpoint_interval_s=3600", "--shm_actors=false"])
    spec = make_spec("gym:CartPole-v1")
    wait_for(lambda: "listening on" in processes.output(learner), 60, "the learner",
             on_timeout=lambda: processes.output(learner))
    channels = []
    send_old = _scripted_run(address, spec, run_id=1, channels=channels)
    held = threading.Event()

    def old_run():
        for _ in range(8):
            send_old()
        held.set()
        with contextlib.suppress(grpc.RpcError):  # superseded: answered stale, the stream ends
            send_old()  # the first step of rollout 1: held at the sync point

    threading.Thread(target=old_run, daemon=True).start()
    stop, paused = threading.Event(), threading.Event()
    try:
        assert held.wait(30)
        wait_for(lambda: "for actors 0: actor 0 not connected" in processes.output(learner), 30,
                 "the gate's waiting message", on_timeout=lambda: processes.output(learner))
        send_new = _scripted_run(address, spec, run_id=2, channels=channels)
        actor_args = [f"--server_address={address}", "--actor_index=0", *common, "--transport=grpc"]
        actor = processes.actor(actor_args, "actor0")
        wait_for(lambda: "[actor 0] connected" in processes.output(actor), 60, "actor 0's connection",
                 on_timeout=lambda: processes.output(actor))
        time.sleep(1.0)  # actor 0 reaches the sync point

        def new_run():
            while not stop.is_set():
                if paused.is_set():
                    time.sleep(0.01)
                    continue
                try:
                    send_new()
                except grpc.RpcError:
                    return  # the learner ended the stream

        threading.Thread(target=new_run, daemon=True).start()
        wait_for(lambda: _train_steps(logdir) >= 3, 60, "training after actor 1's restart",
                 on_timeout=lambda: processes.output(learner))
        paused.set()
        sync_point = re.compile(r"HTS sync point \d+ \(step \d+\) has waited [\d.]+ s for actors 1: actor 1 at step")
        wait_for(lambda: sync_point.search(processes.output(learner)), 30, "actor 0 held, waiting for actor 1",
                 on_timeout=lambda: processes.output(learner))
        actor.send_signal(signal.SIGKILL)
        actor.wait(timeout=10)
        before = _train_steps(logdir)
        restarted = processes.actor(actor_args, "actor0-restarted")
        wait_for(lambda: "[actor 0] connected" in processes.output(restarted), 60, "actor 0's new run",
                 on_timeout=lambda: processes.output(restarted))
        paused.clear()
        wait_for(lambda: _train_steps(logdir) >= before + 3, 60, "training after actor 0's restart",
                 on_timeout=lambda: processes.output(learner))
        assert learner.poll() is None and restarted.poll() is None
    finally:
        stop.set()
        for channel in channels:
            channel.close()
