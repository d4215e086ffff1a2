"""lz4 observation compression (seed/transport/grpc/compression.py): the round trip, the size checked before anything is
decompressed, the codec agreed at the handshake (TCP only), and a training run with --compression=lz4."""

from __future__ import annotations

import queue
import threading

import grpc
import lz4.block
import numpy as np
import pytest

from seed._proto import seed_pb2, seed_pb2_grpc
from seed.envs import make_spec
from seed.learner.configuration import resolve_config
from seed.learner.learner import Learner
from seed.transport import wire
from seed.transport.grpc import compression
from tests.conftest import free_tcp_port, read_metrics, wait_for

K = 4
FRAMES = (K, 84, 84)  # fake:atari: one uint8 84x84 frame per env


def _frames(seed: int = 0) -> np.ndarray:
    """Atari-like frames: a flat background with a few objects (compressible, not trivially)."""
    rng = np.random.default_rng(seed)
    frames = np.full(FRAMES, 87, np.uint8)
    for k in range(K):
        y, x = rng.integers(0, 70, 2)
        frames[k, y:y + 12, x:x + 4] = rng.integers(0, 255)
    return frames


def test_round_trip_compresses_and_restores_every_byte():
    frames = _frames()
    tensor = compression.encode_tensor(frames, compression.LZ4)
    assert tensor.compression == "lz4" and tensor.uncompressed_bytes == frames.nbytes
    assert len(tensor.data) * 10 < frames.nbytes  # it did compress
    decoded = compression.decode_tensor(tensor, "step.observation", "uint8", FRAMES, compression.LZ4)
    np.testing.assert_array_equal(decoded, frames)
    noise = np.random.default_rng(1).integers(0, 256, FRAMES, dtype=np.uint8)  # incompressible: lz4's worst case
    decoded = compression.decode_tensor(compression.compress_tensor(noise), "o", "uint8", FRAMES, compression.LZ4)
    np.testing.assert_array_equal(decoded, noise)
    raw = compression.encode_tensor(frames, compression.NONE)  # none: the plain wire encoding, accepted either way
    assert raw.compression == "" and raw.data == frames.tobytes()
    np.testing.assert_array_equal(compression.decode_tensor(raw, "o", "uint8", FRAMES, compression.LZ4), frames)


def _bomb(declared: int) -> seed_pb2.Tensor:
    """A small message that would inflate to `declared` bytes of zeros."""
    zeros = lz4.block.compress(bytes(1 << 20), store_size=False)  # 1 MiB of zeros in ~4 KB
    return seed_pb2.Tensor(dtype="uint8", shape=FRAMES, compression="lz4", uncompressed_bytes=declared, data=zeros)


def test_a_declared_size_beyond_the_observation_is_rejected_before_decompressing():
    expected = int(np.prod(FRAMES))
    with pytest.raises(wire.WireError) as caught:
        compression.decode_tensor(_bomb(4 << 30), "step.observation", "uint8", FRAMES, compression.LZ4)
    assert str(caught.value).startswith(
        f"step.observation.uncompressed_bytes: got {4 << 30}, expected {expected}"), caught.value
    # A message that declares the right size but holds more (or other) data fails inside the bounded buffer.
    with pytest.raises(wire.WireError, match=r"step.observation.data: got \d+ bytes that are not one lz4 block"):
        compression.decode_tensor(_bomb(expected), "step.observation", "uint8", FRAMES, compression.LZ4)
    short = compression.compress_tensor(_frames()[:2])  # half the frames, claiming all of them
    short.uncompressed_bytes, short.shape[:] = expected, FRAMES
    with pytest.raises(wire.WireError, match="decompressed to 14112 bytes, expected 28224"):
        compression.decode_tensor(short, "step.observation", "uint8", FRAMES, compression.LZ4)
    with pytest.raises(wire.WireError, match=r"step.observation.compression: got 'lz4', expected 'none'"):
        compression.decode_tensor(compression.compress_tensor(_frames()), "step.observation", "uint8", FRAMES,
                                  compression.NONE)
    with pytest.raises(ValueError, match="--compression: got 'zstd', expected one of none, lz4"):
        compression.check_codec("zstd")


@pytest.fixture
def tcp_learner(tmp_path):
    """An in-process learner for fake:atari listening on TCP loopback and on a unix socket."""
    tcp = f"127.0.0.1:{free_tcp_port()}"
    unix = f"unix:{tmp_path}/learner.sock"
    config = resolve_config(dict(env="fake:atari", logdir=str(tmp_path / "run"), server_address=f"{unix},{tcp}",
                                 num_actors=2, envs_per_actor=K, batch_size=2, unroll_length=5, log_interval_s=0.5,
                                 total_environment_frames=1e12, torch_threads=1, network="nature", use_lstm=False,
                                 shm_actors=False))
    learner = Learner(config)
    thread = threading.Thread(target=learner.run, daemon=True)
    thread.start()
    wait_for(lambda: learner.bound_addresses, 60, "the learner to listen")
    yield tcp, unix
    learner.request_stop()
    thread.join(timeout=30)


def _open(address: str, codec: str, actor_index: int = 0):
    """A raw stream: (channel, request queue, responses, handshake reply)."""
    channel = grpc.insecure_channel(address)
    requests: queue.SimpleQueue = queue.SimpleQueue()
    send = requests.put
    responses = seed_pb2_grpc.LearnerStub(channel).Stream(iter(requests.get, None), timeout=60)
    send(seed_pb2.ActorMessage(handshake=seed_pb2.Handshake(
        actor_index=actor_index, run_id=7 + actor_index, num_envs=K, spec=wire.spec_to_proto(make_spec("fake:atari")),
        compression=codec)))
    return channel, send, responses, next(responses).handshake_reply


def _step(observation: seed_pb2.Tensor) -> seed_pb2.ActorMessage:
    return seed_pb2.ActorMessage(step=seed_pb2.StepBatch(
        observation=observation, reward=wire.encode_tensor(np.zeros(K, np.float32)),
        done=wire.encode_tensor(np.zeros(K, bool)), truncated=wire.encode_tensor(np.zeros(K, bool))))


def test_learner_grants_lz4_over_tcp_and_rejects_a_bomb_naming_the_field(tcp_learner):
    tcp, unix = tcp_learner
    channel, send, responses, reply = _open(tcp, "lz4")
    assert reply.compression == "lz4"
    send(_step(compression.compress_tensor(_frames())))
    assert wire.decode_tensor(next(responses).actions.action, "action", "int32", (K,)).shape == (K,)
    send(_step(_bomb(4 << 30)))
    with pytest.raises(grpc.RpcError) as caught:
        next(responses)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"step.observation.uncompressed_bytes: got {4 << 30}, expected {K * 84 * 84}" in caught.value.details()
    channel.close()
    # The learner survived: another actor is served, and the unix socket grants no compression.
    channel, send, responses, reply = _open(unix, "lz4", actor_index=1)
    assert reply.compression == ""
    send(_step(wire.encode_tensor(_frames())))
    assert next(responses).WhichOneof("message") == "actions"
    channel.close()
    with pytest.raises(grpc.RpcError) as caught:
        _open(tcp, "zstd")
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "compression: got 'zstd', expected one of none, lz4" in caught.value.details()


def test_training_with_lz4_over_tcp(processes, tmp_path):
    address = f"127.0.0.1:{free_tcp_port()}"
    logdir = str(tmp_path / "run")
    learner = processes.learner([f"--logdir={logdir}", "--env=fake:atari", f"--server_address={address}",
                                 "--num_actors=1", f"--envs_per_actor={K}", "--batch_size=2", "--unroll_length=5",
                                 "--network=nature", "--use_lstm=false", "--log_interval_s=0.5", "--torch_threads=1",
                                 "--total_environment_frames=1e12"])
    actor = processes.actor(["--env=fake:atari", f"--server_address={address}", "--actor_index=0",
                             f"--envs_per_actor={K}", "--compression=lz4"], "actor0")
    logs = lambda: processes.output(learner)[-3000:] + processes.output(actor)[-3000:]  # noqa: E731
    wait_for(lambda: (read_metrics(logdir) or [{}])[-1].get("train_steps", 0) >= 5, 120, "5 training steps",
             on_timeout=logs)
    assert f"connected to {address} over grpc+lz4" in processes.output(actor)
    assert "actor 0 connected over grpc+lz4" in processes.output(learner)
