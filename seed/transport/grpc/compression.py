"""Observation compression for actors on other hosts (`--compression=none|lz4`).

The actor asks for a codec in its Handshake and the learner grants it in the HandshakeReply (only over TCP:
on a unix socket or the shared-memory path the bytes never cross a wire, so compressing can only cost). With
lz4 granted, every StepBatch's observation is compressed on its own (one lz4 block per message: no state
carried between messages, so a reconnect or a lost stream loses nothing) and decompressed once by the serving
process, before the observation is copied into the step slab. Rewards, dones and actions stay raw (a few
bytes per env).

Decompression is bounded before it starts: the tensor declares its decompressed size (Tensor.uncompressed_bytes),
which must equal what its dtype and the learner's expected shape give ([K, *observation_shape] x itemsize), and
the compressed payload must not be larger than lz4's worst case for that size. Only then is the block
decompressed, into a buffer of exactly that size: a small message that declares gigabytes is rejected naming
the field, and one that lies about its size fails to decompress, without allocating more than one observation
batch. Measured on messages of 16 84x84 frames of random-action play: Pong 65x smaller, MsPacman 14x, compressed
at 0.3-0.9 GB/s on one core of the development machine (docs/performance/cpu/network/).
"""

from __future__ import annotations

import lz4.block
import numpy as np

from seed._proto import seed_pb2
from seed.transport import wire

NONE, LZ4 = "none", "lz4"
CODECS = (NONE, LZ4)


def check_codec(name: str, field: str = "--compression") -> str:
    """`name` normalised ("" is none); raises ValueError naming `field` for an unknown codec."""
    codec = name or NONE
    if codec not in CODECS:
        raise ValueError(f"{field}: got {name!r}, expected one of {', '.join(CODECS)}")
    return codec


def max_compressed_bytes(uncompressed_bytes: int) -> int:
    """lz4's worst case for a block of `uncompressed_bytes` (LZ4_compressBound: incompressible input)."""
    return uncompressed_bytes + uncompressed_bytes // 255 + 16


def compress_tensor(array: np.ndarray) -> seed_pb2.Tensor:
    """`array` as a Tensor whose data is one lz4 block, with its dtype, shape and decompressed size."""
    array = np.ascontiguousarray(array)
    return seed_pb2.Tensor(dtype=array.dtype.name, shape=array.shape, compression=LZ4,
                           uncompressed_bytes=array.nbytes, data=lz4.block.compress(array, store_size=False))


def encode_tensor(array: np.ndarray, codec: str) -> seed_pb2.Tensor:
    """The Tensor of `array`: compressed with `codec` (lz4), or raw (none)."""
    return compress_tensor(array) if codec == LZ4 else wire.encode_tensor(array)


def decode_tensor(tensor: seed_pb2.Tensor, field: str, dtype: str, shape: tuple[int, ...], codec: str) -> np.ndarray:
    """`tensor` as a read-only array of `dtype` and `shape`, decompressed if it is compressed.

    `codec`: what the handshake agreed. A raw tensor is accepted under either codec (an actor may send a step
    raw); a compressed one only under the codec it names. Raises wire.WireError naming the field, the value
    received and the value expected; never decompresses more than `shape` x itemsize bytes.
    """
    if not tensor.compression:
        return wire.decode_tensor(tensor, field, dtype, shape)
    if tensor.compression != codec:
        raise wire.WireError(f"{field}.compression: got {tensor.compression!r}, expected {codec!r} (the codec "
                             f"agreed at the handshake) or '' (raw)")
    if tensor.dtype != dtype:
        raise wire.WireError(f"{field}.dtype: got {tensor.dtype!r}, expected {dtype!r}")
    if tuple(tensor.shape) != tuple(shape):
        raise wire.WireError(f"{field}.shape: got {list(tensor.shape)}, expected {list(shape)}")
    expected = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    if tensor.uncompressed_bytes != expected:
        raise wire.WireError(f"{field}.uncompressed_bytes: got {tensor.uncompressed_bytes}, expected {expected} "
                             f"({dtype} {list(shape)}); not decompressed")
    data = tensor.data  # one read: each access copies the payload (upb)
    if len(data) > max_compressed_bytes(expected):
        raise wire.WireError(f"{field}.data: got {len(data)} compressed bytes, expected at most "
                             f"{max_compressed_bytes(expected)} (lz4's worst case for {expected} bytes)")
    try:  # the output buffer is exactly `expected` bytes: lz4 stops at its end rather than write past it
        raw = lz4.block.decompress(data, uncompressed_size=expected)
    except lz4.block.LZ4BlockError as error:
        raise wire.WireError(f"{field}.data: got {len(data)} bytes that are not one lz4 block of {expected} "
                             f"bytes ({error})") from None
    if len(raw) != expected:
        raise wire.WireError(f"{field}.data: decompressed to {len(raw)} bytes, expected {expected} "
                             f"(uncompressed_bytes)")
    if dtype == "bool":
        wire.check_bool_bytes(f"{field}.data", np.frombuffer(raw, dtype=np.uint8))
    return np.frombuffer(raw, dtype=dtype).reshape(shape)
