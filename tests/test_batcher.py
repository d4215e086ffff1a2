"""Inference batcher and central inference, without gRPC: full batches, timeouts, sharing, dying actors."""

import threading
import time

import numpy as np
import pytest
import torch

from seed.batcher import InferenceBatcher, StaleRequest, StepRequest
from seed.config import LearnerConfig
from seed.envs import make_spec
from seed.inference import CentralInference


def _request(actor, run_id=1, k=4, obs_dim=8, done=False):
    return StepRequest(actor_index=actor, run_id=run_id, first_env_id=actor * k,
                       observation=np.zeros((k, obs_dim), np.float32), reward=np.ones(k, np.float32),
                       done=np.full(k, done), truncated=np.zeros(k, bool))


class _Recorder:
    def __init__(self):
        self.batches = []
        self.times = []

    def __call__(self, requests):
        self.batches.append([r.actor_index for r in requests])
        self.times.append(time.monotonic())
        for r in requests:
            r.future.set_result(np.zeros(r.num_envs, np.int64))


@pytest.fixture
def recorder():
    return _Recorder()


def _batcher(recorder, batch_size, timeout_s):
    batcher = InferenceBatcher(batch_size, timeout_s, recorder)
    batcher.start()
    return batcher


def test_full_batch_runs_without_waiting_for_timeout(recorder):
    batcher = _batcher(recorder, batch_size=8, timeout_s=30.0)
    try:
        start = time.monotonic()
        futures = [batcher.submit(_request(0)), batcher.submit(_request(1))]
        for f in futures:
            f.result(timeout=5)
        assert recorder.batches == [[0, 1]]  # two actors shared one batch
        assert time.monotonic() - start < 5.0
    finally:
        batcher.stop()


def test_timeout_flushes_partial_batch_with_one_live_actor(recorder):
    batcher = _batcher(recorder, batch_size=64, timeout_s=0.05)
    try:
        request = _request(0)
        actions = batcher.submit(request).result(timeout=5)
        assert actions.shape == (4,)
        assert recorder.batches == [[0]]
        assert recorder.times[0] - request.arrival_time >= 0.05 - 1e-3
    finally:
        batcher.stop()


def test_failing_batch_fails_its_requests_and_batcher_keeps_serving():
    calls = []

    def run_batch(requests):
        calls.append(len(requests))
        if len(calls) == 1:
            raise RuntimeError("boom")
        for r in requests:
            r.future.set_result(np.zeros(r.num_envs, np.int64))

    batcher = InferenceBatcher(4, 0.01, run_batch)
    batcher.start()
    try:
        with pytest.raises(RuntimeError, match="boom"):
            batcher.submit(_request(0)).result(timeout=5)
        assert batcher.submit(_request(1)).result(timeout=5).shape == (4,)
    finally:
        batcher.stop()


def _central_inference(unrolls):
    config = LearnerConfig(env="fake:vector", num_actors=2, envs_per_actor=4, use_lstm=True, lstm_size=8,
                           mlp_sizes="16", unroll_length=2)
    spec = make_spec("fake:vector")
    from seed.agents.vtrace.agent import Agent

    agent = Agent(spec, config)
    registry = {0: 1, 1: 1}
    episodes = []
    inference = CentralInference(agent, agent.network, torch.device("cpu"), 8, 2, 0, registry,
                                 sink=unrolls.extend, on_episodes=episodes.append, on_batch=lambda *a: None)
    return inference, registry


def test_actor_restart_while_batch_fills_drops_stale_request():
    unrolls = []
    inference, registry = _central_inference(unrolls)
    # Both actors step twice so env rows have state and partial unrolls.
    for _ in range(2):
        inference.run_batch([_request(0), _request(1)])
    assert (inference.unroll_store.write_index[:8] == 2).all()
    # Actor 1 dies while its request waits in a filling batch; its restarted process handshakes (run 2)
    # and sends its first step into the same batch.
    old = _request(1, run_id=1)
    registry[1] = 2
    new = _request(1, run_id=2)
    survivor = _request(0)
    inference.run_batch([old, survivor, new])
    with pytest.raises(StaleRequest):
        old.future.result(timeout=1)
    assert survivor.future.result(timeout=1).shape == (4,)
    assert new.future.result(timeout=1).shape == (4,)
    # The restarted actor's envs got fresh rows and their partial unroll was discarded.
    assert (inference.unroll_store.write_index[4:8] == 1).all()
    assert (inference.state_table.run_id[4:8] == 2).all()
    # Actor 0 completed an unroll (3 steps); actor 1 lost its 2 old steps instead of completing one.
    assert len(unrolls) == 4 and sorted(int(u.env_id) for u in unrolls) == [0, 1, 2, 3]


def test_first_contact_is_an_episode_start_with_zero_reward():
    unrolls = []
    inference, _ = _central_inference(unrolls)
    for _ in range(3):
        inference.run_batch([_request(0)])
    first = unrolls[0]
    assert first.done.tolist() == [True, False, False]
    assert first.reward.tolist() == [0.0, 1.0, 1.0]


def test_batcher_and_inference_threads_together():
    unrolls = []
    inference, _ = _central_inference(unrolls)
    batcher = InferenceBatcher(8, 0.005, inference.run_batch)
    batcher.start()
    results = []

    def actor(index):
        for _ in range(20):
            results.append(batcher.submit(_request(index)).result(timeout=5))

    threads = [threading.Thread(target=actor, args=(i,)) for i in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert len(results) == 40
        assert all(((a >= 0) & (a < 4)).all() for a in results)
        assert len(unrolls) > 0
    finally:
        batcher.stop()


def test_request_that_fills_a_batch_alone_runs_on_the_submitting_thread(recorder):
    threads = []

    def run_batch(requests):
        threads.append(threading.current_thread())
        recorder(requests)

    batcher = InferenceBatcher(4, 30.0, run_batch)
    batcher.start()
    try:
        batcher.submit(_request(0, k=4)).result(timeout=5)
        assert threads == [threading.current_thread()]
        assert recorder.batches == [[0]]
    finally:
        batcher.stop()
