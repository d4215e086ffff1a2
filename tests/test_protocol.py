"""The wire protocol against a real learner over a unix socket: handshake validation and malformed steps."""

import threading

import grpc
import numpy as np
import pytest

from seed._proto import seed_pb2, seed_pb2_grpc
from seed.actor.loop import Actor
from seed.config import ActorConfig
from seed.envs import make_spec
from seed.learner.configuration import resolve_config
from seed.learner.learner import Learner
from seed.transport import wire
from tests.conftest import wait_for


@pytest.fixture
def learner(tmp_path):
    address = f"unix:{tmp_path}/learner.sock"
    config = resolve_config(dict(env="fake:vector", logdir=str(tmp_path), server_address=address, num_actors=3,
                                 envs_per_actor=4, batch_size=4, unroll_length=5, log_interval_s=0.5,
                                 total_environment_frames=1e12, torch_threads=1))
    learner = Learner(config)
    thread = threading.Thread(target=learner.run, daemon=True)
    thread.start()
    wait_for(lambda: learner.bound_addresses, 30, "the learner to listen")
    yield learner, address
    learner.request_stop()
    thread.join(timeout=30)


def _handshake(actor_index=0, num_envs=4, spec=None):
    spec = spec or make_spec("fake:vector")
    return seed_pb2.ActorMessage(handshake=seed_pb2.Handshake(
        actor_index=actor_index, run_id=7, num_envs=num_envs, spec=wire.spec_to_proto(spec)))


def _open(address, messages):
    channel = grpc.insecure_channel(address)
    return channel, seed_pb2_grpc.LearnerStub(channel).Stream(iter(messages))


def _error_of(address, messages) -> grpc.RpcError:
    channel, responses = _open(address, messages)
    with channel, pytest.raises(grpc.RpcError) as caught:
        for _ in responses:
            pass
    return caught.value


def test_mismatched_spec_is_rejected_with_the_field_named(learner):
    _, address = learner
    wrong = make_spec("fake:atari")
    error = _error_of(address, [_handshake(spec=wrong)])
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "spec.name: got 'fake:atari', expected 'fake:vector'" in error.details()
    assert "spec.observation_shape: got (84, 84), expected (8,)" in error.details()


@pytest.mark.parametrize("kwargs,expected", [
    (dict(actor_index=3), "actor_index: got 3, expected 0 <= actor_index < 3"),
    (dict(num_envs=5), "num_envs: got 5, expected 4"),
])
def test_bad_handshake_fields(learner, kwargs, expected):
    _, address = learner
    error = _error_of(address, [_handshake(**kwargs)])
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert expected in error.details()


def test_step_before_handshake_is_rejected(learner):
    _, address = learner
    error = _error_of(address, [seed_pb2.ActorMessage(step=seed_pb2.StepBatch())])
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "expected handshake" in error.details()


def _step(observation, reward=None):
    k = observation.shape[0]
    return seed_pb2.ActorMessage(step=seed_pb2.StepBatch(
        observation=wire.encode_tensor(observation),
        reward=wire.encode_tensor(np.zeros(k, np.float32) if reward is None else reward),
        done=wire.encode_tensor(np.zeros(k, bool)), truncated=wire.encode_tensor(np.zeros(k, bool))))


@pytest.mark.parametrize("observation,reward,expected", [
    (np.zeros((4, 9), np.float32), None, "step.observation.shape: got [4, 9], expected [4, 8]"),
    (np.zeros((4, 8), np.float64), None, "step.observation.dtype: got 'float64', expected 'float32'"),
    (np.zeros((4, 8), np.float32), np.zeros(4, np.int32), "step.reward.dtype: got 'int32', expected 'float32'"),
    (np.zeros((4, 8), np.float32), np.full(4, np.nan, np.float32), "step.reward: got a non-finite value"),
])
def test_malformed_step_fails_that_actor_only(learner, observation, reward, expected):
    server, address = learner
    # A well-behaved actor keeps training through the other actor's bad message.
    stop = threading.Event()
    good = Actor(ActorConfig(env="fake:vector", envs_per_actor=4, actor_index=1, server_address=address), stop)
    thread = threading.Thread(target=good.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: good.agent_steps > 40, 30, "the good actor to step")
        error = _error_of(address, [_handshake(actor_index=0), _step(observation, reward)])
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert expected in error.details()
        steps = good.agent_steps
        wait_for(lambda: good.agent_steps > steps + 40, 30, "the good actor to keep stepping")
        assert good.connections == 1  # never disconnected
        # And a correct actor can still join afterwards on the index of the bad one.
        channel, responses = _open(address, [_handshake(actor_index=0), _step(np.zeros((4, 8), np.float32))])
        with channel:
            replies = list(zip(range(2), responses, strict=False))
        assert replies[1][1].actions.action.shape == [4]
    finally:
        stop.set()
        thread.join(timeout=10)


@pytest.mark.parametrize("field", ["done", "truncated"])
def test_bool_tensor_with_a_byte_other_than_0_or_1_is_rejected(learner, field):
    """NumPy reads byte 2 as True, but it is no bool the actor could have sent: the stream ends with
    INVALID_ARGUMENT naming the field, the byte and what is expected, and nothing is served."""
    server, address = learner
    message = _step(np.zeros((4, 8), np.float32))
    getattr(message.step, field).data = bytes([0, 2, 1, 0])
    error = _error_of(address, [_handshake(actor_index=2), message])
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"step.{field}.data: got byte value 2 at index 1" in error.details()
    assert "expected 0 or 1 for dtype 'bool'" in error.details()
    assert int(server.parts.channels.slab.request_seq[2]) == 0  # never written into the slab
