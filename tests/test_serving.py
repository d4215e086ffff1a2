"""The serving path without actors: the step slab, request batching over real pipes, batch assembly in central
inference (rows of several actors, a replaced actor, a failing batch) and the slab service over real gRPC."""

import contextlib
import functools
import os
import threading
import time

import grpc
import numpy as np
import pytest
import torch

from seed._proto import seed_pb2, seed_pb2_grpc
from seed.envs import make_spec
from seed.learner.configuration import resolve_config
from seed.learner.learner import Learner
from seed.transport import notify, start_grpc_server, wire
from seed.transport.grpc.service import SlabService
from seed.transport.slab import REPLY_FAILED, REPLY_OK, REPLY_STALE, StepSlab
from tests.conftest import serve_steps, wait_for

K = 4


def _step(actor, run_id=1, reward=1.0, done=False, observation=None):
    observation = np.full((K, 8), float(actor), np.float32) if observation is None else observation
    return (actor, run_id, observation, np.full(K, reward, np.float32), np.full(K, done), np.zeros(K, bool))


@pytest.fixture
def slab():
    slab = StepSlab.create(num_actors=3, envs_per_actor=K, observation_shape=(8,), observation_dtype="float32")
    yield slab
    slab.release()


@pytest.fixture
def learner(tmp_path):
    config = resolve_config(dict(env="fake:vector", logdir=str(tmp_path), server_address=f"unix:{tmp_path}/s",
                                 num_actors=3, envs_per_actor=K, use_lstm=True, lstm_size=8, mlp_sizes="16",
                                 unroll_length=2, torch_threads=1))
    learner = Learner(config)
    learner.parts.channels.slab.live_run[:] = 1
    learner.unrolls = []
    learner.replies = []
    learner.parts.inferences[0].sink = lambda batch: learner.unrolls.extend(batch.unbind())
    learner.parts.inferences[0].reply = learner.replies.append
    yield learner
    learner._close()


def test_slab_layout_is_shared_between_mappings(slab):
    other = StepSlab.attach(slab.layout)
    seq = slab.write_request(1, 77, np.arange(K * 8, dtype=np.float32).reshape(K, 8), np.ones(K, np.float32),
                             np.array([True, False, False, True]), np.zeros(K, bool))
    assert seq == 1 and int(other.request_seq[1]) == 1 and int(other.request_run[1]) == 77
    np.testing.assert_array_equal(other.observation[K:2 * K], slab.observation[K:2 * K])
    assert other.done[K:2 * K].tolist() == [True, False, False, True]
    assert not other.observation[:K].any() and not other.observation[2 * K:].any()  # other actors' rows untouched
    other.action[K:2 * K] = [3, 2, 1, 0]
    assert slab.action[K:2 * K].tolist() == [3, 2, 1, 0]
    other.close()


def test_slot_is_marked_while_its_rows_are_written(slab):
    """request_seq is negative from before the first row is written until the request is published, so a reader
    that copied rows meanwhile sees that its slot changed."""
    seen = []

    class Watched(np.ndarray):
        def __setitem__(self, index, value):
            seen.append(int(slab.request_seq[1]))
            super().__setitem__(index, value)

    slab.observation = slab.observation.view(Watched)
    seq = slab.write_request(1, 7, *_step(1)[2:])
    assert seen == [-seq] and int(slab.request_seq[1]) == seq == 1
    assert slab.write_request(1, 7, *_step(1)[2:]) == 2 and seen == [-1, -2]


def test_batcher_takes_a_full_batch_without_waiting_for_the_timeout(slab):
    read_fd, write_fd = notify.new_request_channel()
    # A full batch returns at once; the partial one after it waits out the timeout (6 s) from its arrival.
    batcher = notify.RequestBatcher(read_fd, slab, batch_rows=2 * K, timeout_s=6.0)
    for actor in (2, 0, 1):
        notify.send_request(write_fd, actor, slab.write_request(actor, 1, *_step(actor)[2:]))
    start = time.monotonic()
    actors, seqs = batcher.next_batch(1.0)
    assert actors.tolist() == [2, 0] and seqs.tolist() == [1, 1]  # arrival order; the third waits
    assert time.monotonic() - start < 3.0
    actors, _ = batcher.next_batch(0.0)  # the surplus request starts the next batch (timeout from its arrival)
    assert actors.tolist() == [1]
    assert time.monotonic() - float(slab.arrival_s[1]) >= 6.0 - 1e-3
    os.close(read_fd), os.close(write_fd)


def test_batcher_flushes_a_partial_batch_at_the_timeout(slab):
    read_fd, write_fd = notify.new_request_channel()
    batcher = notify.RequestBatcher(read_fd, slab, batch_rows=64, timeout_s=0.05)
    notify.send_request(write_fd, 0, slab.write_request(0, 1, *_step(0)[2:]))
    actors, _ = batcher.next_batch(1.0)
    assert actors.tolist() == [0]
    assert time.monotonic() - float(slab.arrival_s[0]) >= 0.05 - 1e-3
    assert batcher.next_batch(0.05) is None  # nothing waiting
    os.close(read_fd), os.close(write_fd)


def test_rows_from_several_actors_are_served_in_one_batch(learner):
    inference = learner.parts.inferences[0]
    replies = serve_steps(inference, [_step(2), _step(0)])
    assert {a: s for a, (s, _) in replies.items()} == {2: REPLY_OK, 0: REPLY_OK}
    assert [r.tolist() for r in learner.replies] == [[2, 0]]  # one reply notification for the batch
    num_actions = learner.parts.spec.num_actions
    for actor, (_, actions) in replies.items():
        assert ((actions >= 0) & (actions < num_actions)).all()
        np.testing.assert_array_equal(inference.prev_action[actor * K:(actor + 1) * K], actions)
    # Actor 1 sent nothing: its rows were neither served nor given state.
    assert inference.actor_run.tolist() == [1, 0, 1]
    assert inference.unroll_store.write_index[K:2 * K].tolist() == [0] * K
    write_index = inference.unroll_store.write_index
    assert (write_index[:K] == 1).all() and (write_index[2 * K:] == 1).all()
    # The step went into the unroll store with the actor's own observation rows.
    observation = inference.unroll_store.steps["observation"]
    assert (observation[0, 2 * K:3 * K] == 2.0).all() and (observation[0, :K] == 0.0).all()  # time-major


def test_actor_replaced_while_its_request_waits_gets_stale_and_fresh_rows(learner):
    inference = learner.parts.inferences[0]
    for _ in range(2):  # both actors step twice: their rows have state and partial unrolls
        serve_steps(inference, [_step(0), _step(1)])
    assert (inference.unroll_store.write_index[:2 * K] == 2).all()
    # Actor 1's request is in its slot when its restarted process handshakes (run 2).
    slab = learner.parts.channels.slab
    old_seq = slab.write_request(1, 1, *_step(1)[2:])
    slab.live_run[1] = 2
    survivor_seq = slab.write_request(0, 1, *_step(0)[2:])
    inference.run_batch(np.array([1, 0]), np.array([old_seq, survivor_seq]))
    assert int(slab.reply_status[1]) == REPLY_STALE and int(slab.reply_seq[1]) == old_seq
    assert int(slab.reply_status[0]) == REPLY_OK
    assert inference.unroll_store.write_index[K:2 * K].tolist() == [2] * K  # untouched by the stale request
    # The new run's first step (the serving process sends it once the stale reply freed the slot).
    replies = serve_steps(inference, [_step(1, run_id=2, reward=5.0)])
    assert replies[1][0] == REPLY_OK
    assert inference.actor_run.tolist() == [1, 2, 0]
    assert (inference.unroll_store.write_index[K:2 * K] == 1).all()  # fresh rows: partial unroll discarded
    # First contact of the new run is an episode start with reward 0.
    assert inference.unroll_store.steps["done"][0, K:2 * K].all()
    assert (inference.unroll_store.steps["reward"][0, K:2 * K] == 0).all()


def test_outdated_notification_is_ignored(learner):
    slab, inference = learner.parts.channels.slab, learner.parts.inferences[0]
    seq = slab.write_request(0, 1, *_step(0)[2:])
    inference.run_batch(np.array([0, 0]), np.array([seq - 1, seq]))  # a leftover notification and the real one
    assert [r.tolist() for r in learner.replies] == [[0]]
    assert int(slab.reply_seq[0]) == seq


def test_first_contact_is_an_episode_start_with_zero_reward(learner):
    for _ in range(3):
        serve_steps(learner.parts.inferences[0], [_step(0)])
    first = learner.unrolls[0]
    assert first.done.tolist() == [True, False, False]
    assert first.reward.tolist() == [0.0, 1.0, 1.0]


def test_failing_batch_fails_its_requests_and_the_next_batch_works(learner):
    inference = learner.parts.inferences[0]
    act = inference.agent.act
    inference.agent.act = lambda *a: (_ for _ in ()).throw(RuntimeError("boom"))
    with pytest.raises(RuntimeError, match="boom"):
        serve_steps(inference, [_step(0), _step(1)])
    reply_status = learner.parts.channels.slab.reply_status
    assert int(reply_status[0]) == REPLY_FAILED and int(reply_status[1]) == REPLY_FAILED
    inference.agent.act = act
    replies = serve_steps(inference, [_step(0), _step(1)])
    assert all(status == REPLY_OK for status, _ in replies.values())


@pytest.mark.parametrize("in_progress", [False, True])
def test_slot_rewritten_while_inference_reads_it_is_dropped(learner, in_progress):
    """A new serving process writes a new run into actor 0's slot between inference's check of the request and
    its copy of the rows (or is half-way through that write): the copy is dropped, never recorded as a step of
    either run nor answered, and the new run's own request is then served as its first step."""
    inference, slab = learner.parts.inferences[0], learner.parts.channels.slab
    for _ in range(2):
        serve_steps(inference, [_step(0, observation=np.full((K, 8), 1.0, np.float32))])
    old_seq = slab.write_request(0, 1, *_step(0, observation=np.full((K, 8), 1.0, np.float32))[2:])
    gather = inference._gather

    def new_run_writes_meanwhile(actors, env_ids):
        slab.live_run[0] = 2  # the new serving process's handshake
        if in_progress:  # a writer between its mark and its publish
            slab.request_seq[0] = -(old_seq + 1)
            slab.observation[:K // 2] = 9.0
        else:
            slab.write_request(0, 2, *_step(0, run_id=2, reward=5.0, observation=np.full((K, 8), 2.0, np.float32))[2:])
        inference._gather = gather
        return gather(actors, env_ids)

    inference._gather = new_run_writes_meanwhile
    learner.replies.clear()
    inference.run_batch(np.array([0]), np.array([old_seq]))
    assert learner.replies == [] and int(slab.reply_seq[0]) == old_seq - 1  # dropped, not answered
    assert inference.actor_run.tolist() == [1, 0, 0]
    assert (inference.unroll_store.write_index[:K] == 2).all()  # nothing recorded
    assert (inference.unroll_store.steps["observation"][:2, :K] == 1.0).all()
    if in_progress:
        slab.write_request(0, 2, *_step(0, run_id=2, reward=5.0, observation=np.full((K, 8), 2.0, np.float32))[2:])
    inference.run_batch(np.array([0]), np.array([int(slab.request_seq[0])]))  # the new run's own notification
    assert int(slab.reply_status[0]) == REPLY_OK and int(slab.reply_seq[0]) == int(slab.request_seq[0]) > old_seq
    assert inference.actor_run.tolist() == [2, 0, 0]
    store = inference.unroll_store
    assert (store.write_index[:K] == 1).all()  # the new run's first step, on fresh rows
    assert (store.steps["observation"][0, :K] == 2.0).all()  # time-major: [step, env]
    assert store.steps["done"][0, :K].all() and (store.steps["reward"][0, :K] == 0).all()


def test_unroll_store_failure_leaves_no_unroll_across_the_missing_step(learner):
    """The unroll store raises once after the actors were answered: the step is missing, so the actor's next
    step starts over (done, reward 0, zero state) and no emitted unroll spans the hole."""
    inference = learner.parts.inferences[0]
    append = inference.unroll_store.append
    failures = []

    def fails_at_step_2(env_ids, step, state_before):
        if (step["observation"][:, 0] == 2.0).all() and not failures:
            failures.append(1)
            raise MemoryError("unroll store full")
        return append(env_ids, step, state_before)

    inference.unroll_store.append = fails_at_step_2
    for t in range(9):
        observation = np.full((K, 8), float(t), np.float32)
        with contextlib.suppress(MemoryError):  # the code before this fix raised it out of run_batch
            replies = serve_steps(inference, [_step(0, reward=float(t), observation=observation)])
        assert replies[0][0] == REPLY_OK
    assert failures and learner.unrolls
    for unroll in learner.unrolls:
        steps = unroll.observation[:, 0][unroll.valid].tolist()
        assert steps == list(np.arange(steps[0], steps[0] + len(steps))), f"an unroll across the hole: {steps}"
    after = [u for u in learner.unrolls if u.observation[0, 0] >= 3]
    assert after[0].observation[:, 0].tolist() == [3.0, 4.0, 5.0]
    assert after[0].done[0] and after[0].reward[0] == 0 and not after[0].done[1:].any()
    assert all(v.abs().sum() == 0 for v in after[0].initial_state.values())


def _reply_fds(slab) -> list[int]:
    return [notify.new_reply_fd() for _ in range(slab.layout.num_actors)]


class _FakeInference:
    """Stands in for the learner's inference thread: answers every notified slot with action = actor index
    (`wake=False`: writes the reply into the slab but never notifies the serving side)."""

    def __init__(self, slab, request_fd, reply, wake=True):
        self.slab, self.served, self.wake = slab, [], wake
        self.batcher = notify.RequestBatcher(request_fd, slab, 1, 0.0)
        self.reply = reply
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self):
        while not self.stop.is_set():
            batch = self.batcher.next_batch(0.05)
            if batch is None:
                continue
            for actor, seq in zip(*batch, strict=True):
                self.served.append(int(actor))
                self.slab.action[self.slab.rows(actor)] = actor
                self.slab.reply_status[actor] = REPLY_OK
                self.slab.reply_seq[actor] = seq
            if self.wake:
                self.reply(batch[0])


def test_malformed_request_is_rejected_without_touching_the_slab(slab, tmp_path):
    """The slab service over a real unix socket: good steps land in their rows; a malformed one ends its stream
    with INVALID_ARGUMENT naming the field, writes no row and notifies nobody."""
    spec = make_spec("fake:vector")
    request_read, request_write = notify.new_request_channel()
    stop = threading.Event()
    reply_fds = _reply_fds(slab)
    service = SlabService(spec, slab, [request_write], reply_fds, lambda returns: None, stop)
    fake = _FakeInference(slab, request_read, functools.partial(notify.send_replies, reply_fds))
    server, _, (address,) = start_grpc_server(service, [f"unix:{tmp_path}/s.sock"], 8)

    def handshake(actor):
        return seed_pb2.ActorMessage(handshake=seed_pb2.Handshake(actor_index=actor, run_id=5, num_envs=K,
                                                                   spec=wire.spec_to_proto(spec)))

    def step(observation):
        return seed_pb2.ActorMessage(step=seed_pb2.StepBatch(
            observation=wire.encode_tensor(observation), reward=wire.encode_tensor(np.ones(K, np.float32)),
            done=wire.encode_tensor(np.zeros(K, bool)), truncated=wire.encode_tensor(np.zeros(K, bool))))

    try:
        with grpc.insecure_channel(address) as channel:
            stub = seed_pb2_grpc.LearnerStub(channel)
            replies = list(stub.Stream(iter([handshake(2), step(np.full((K, 8), 7.0, np.float32))])))
            assert replies[1].actions.action.shape == [K]
            assert wire.decode_tensor(replies[1].actions.action, "a", "int32", (K,)).tolist() == [2] * K
            assert (slab.observation[2 * K:] == 7.0).all() and int(slab.live_run[2]) == 5
            before = slab.observation.copy()
            with pytest.raises(grpc.RpcError) as caught:
                list(stub.Stream(iter([handshake(1), step(np.zeros((K, 9), np.float32))])))
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "step.observation.shape: got [4, 9], expected [4, 8]" in caught.value.details()
            np.testing.assert_array_equal(slab.observation, before)
            assert int(slab.request_seq[1]) == 0 and fake.served == [2]
    finally:
        stop.set()
        fake.stop.set()
        fake.thread.join(timeout=5)
        server.stop(0)
        os.close(request_read), os.close(request_write)


def _handshake(spec, actor, run_id):
    return seed_pb2.ActorMessage(handshake=seed_pb2.Handshake(actor_index=actor, run_id=run_id, num_envs=K,
                                                               spec=wire.spec_to_proto(spec)))


def _step_message(observation):
    return seed_pb2.ActorMessage(step=seed_pb2.StepBatch(
        observation=wire.encode_tensor(observation), reward=wire.encode_tensor(np.ones(K, np.float32)),
        done=wire.encode_tensor(np.zeros(K, bool)), truncated=wire.encode_tensor(np.zeros(K, bool))))


def _stream_in_thread(address, messages):
    """Runs one Stream call on its own thread; returns (replies list, errors list, thread)."""
    replies, errors = [], []

    def run():
        try:
            with grpc.insecure_channel(address) as channel:
                for reply in seed_pb2_grpc.LearnerStub(channel).Stream(iter(messages), timeout=30):
                    replies.append(reply)
        except grpc.RpcError as error:
            errors.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return replies, errors, thread


def test_reply_is_read_only_after_its_wake_up(slab, tmp_path):
    """The stream trusts the slab's reply only after it took a wake-up from the actor's reply eventfd (the
    eventfd read that orders inference's slab writes before the stream's reads on weakly ordered CPUs), never by
    polling reply_seq on a timeout: a reply written into the slab without a wake-up is not returned; the wake-up
    releases it at once. (On x86 a CPU test cannot show a reordering; it shows which path the stream takes.)"""
    spec = make_spec("fake:vector")
    request_read, request_write = notify.new_request_channel()
    stop = threading.Event()
    reply_fds = _reply_fds(slab)
    service = SlabService(spec, slab, [request_write], reply_fds, lambda returns: None, stop)
    fake = _FakeInference(slab, request_read, functools.partial(notify.send_replies, reply_fds), wake=False)
    server, _, (address,) = start_grpc_server(service, [f"unix:{tmp_path}/s.sock"], 8)
    try:
        replies, errors, thread = _stream_in_thread(
            address, [_handshake(spec, 2, 5), _step_message(np.full((K, 8), 7.0, np.float32))])
        wait_for(lambda: int(slab.reply_seq[2]) == 1, 10, "the reply in the slab")
        time.sleep(1.6)  # three of the stream's 0.5 s wait timeouts
        assert len(replies) == 1 and not errors  # the handshake reply only
        notify.send_replies(reply_fds, np.array([2]))
        thread.join(timeout=10)
        assert len(replies) == 2 and not errors
        assert wire.decode_tensor(replies[1].actions.action, "a", "int32", (K,)).tolist() == [2] * K
    finally:
        stop.set()
        fake.stop.set()
        fake.thread.join(timeout=5)
        server.stop(0)
        os.close(request_read), os.close(request_write)


@pytest.mark.parametrize("notified", [True, False])
def test_new_serving_process_waits_for_the_request_its_predecessor_left(learner, tmp_path, notified):
    """The serving process died with actor 1's request in its slot (notified, or not yet). The new serving
    process's first write for that actor waits until inference answered the old request (stale: a new run
    handshook), so inference never reads rows being overwritten; the new run's step is then its first step."""
    slab, inference = learner.parts.channels.slab, learner.parts.inferences[0]
    for _ in range(2):
        serve_steps(inference, [_step(1, observation=np.full((K, 8), 1.0, np.float32))])
    request_read, request_write = notify.new_request_channel()
    old_seq = slab.write_request(1, 1, *_step(1, observation=np.full((K, 8), 11.0, np.float32))[2:])
    if notified:
        notify.send_request(request_write, 1, old_seq)
    stop = threading.Event()
    reply_fds = _reply_fds(slab)
    # A new serving process:
    service = SlabService(learner.parts.spec, slab, [request_write], reply_fds, lambda returns: None, stop)
    inference.reply = functools.partial(notify.send_replies, reply_fds)
    server, _, (address,) = start_grpc_server(service, [f"unix:{tmp_path}/s.sock"], 8)
    batcher = notify.RequestBatcher(request_read, slab, batch_rows=1, timeout_s=0.0)
    try:
        replies, errors, thread = _stream_in_thread(
            address, [_handshake(learner.parts.spec, 1, 2), _step_message(np.full((K, 8), 22.0, np.float32))])
        wait_for(lambda: int(slab.live_run[1]) == 2, 10, "the new run's handshake")
        time.sleep(1.0)
        # The old request is still in the slot, unanswered: nothing overwrote it.
        assert int(slab.request_seq[1]) == old_seq and (slab.observation[K:2 * K] == 11.0).all()
        statuses = {}
        while thread.is_alive():
            batch = batcher.next_batch(0.1)
            if batch is not None:
                inference.run_batch(*batch)
                statuses.update({int(s): int(slab.reply_status[1]) for s in batch[1] if int(slab.reply_seq[1]) == s})
        assert not errors and len(replies) == 2
        assert statuses == {old_seq: REPLY_STALE, old_seq + 1: REPLY_OK}
        store = inference.unroll_store
        assert inference.actor_run.tolist() == [0, 2, 0] and (store.write_index[K:2 * K] == 1).all()
        assert (store.steps["observation"][K:2 * K, 0] == 22.0).all() and store.steps["done"][K:2 * K, 0].all()
        np.testing.assert_array_equal(inference.prev_action[K:2 * K],
                                      wire.decode_tensor(replies[1].actions.action, "a", "int32", (K,)))
    finally:
        stop.set()
        server.stop(0)
        os.close(request_read), os.close(request_write)


def test_publish_reaches_the_inference_network_between_batches(learner):
    inference = learner.parts.inferences[0]
    trained = {k: v + 1.0 if v.is_floating_point() else v for k, v in learner.parts.agent.network.state_dict().items()}
    inference.publish(trained)
    before = {k: v.clone() for k, v in inference.network.state_dict().items()}
    serve_steps(inference, [_step(0)])
    after = inference.network.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in after)
    assert all(torch.equal(after[k], trained[k]) for k in after)
