"""lz4's bound on a compressed payload's length (seed/transport/grpc/compression.py decode_tensor): a payload
longer than lz4's worst case for the declared size is refused before anything is decompressed,
one exactly at the bound is not."""

from __future__ import annotations

import lz4.block
import numpy as np
import pytest

from seed._proto import seed_pb2
from seed.transport import wire
from seed.transport.grpc import compression

SHAPE = (4, 84, 84)  # 28,224 uint8 bytes; lz4's worst case 28,224 + 28,224 // 255 + 16 = 28,350 bytes
BOUND = 28_350


def _tensor(data: bytes) -> seed_pb2.Tensor:
    return seed_pb2.Tensor(dtype="uint8", shape=SHAPE, compression="lz4", uncompressed_bytes=int(np.prod(SHAPE)),
                           data=data)


def test_the_bound_is_lz4s_worst_case():
    assert compression.max_compressed_bytes(int(np.prod(SHAPE))) == BOUND
    assert compression.max_compressed_bytes(0) == 16 and compression.max_compressed_bytes(255) == 255 + 1 + 16
    rng = np.random.default_rng(0)
    for size in (1, 254, 255, 4096, 28_224, 100_003):  # incompressible input: lz4's longest output
        noise = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        assert len(lz4.block.compress(noise, store_size=False)) <= compression.max_compressed_bytes(size), size


def test_a_payload_longer_than_the_worst_case_is_refused_before_decompressing(monkeypatch):
    def no_decompress(*args, **kwargs):
        raise AssertionError("lz4.block.decompress called on a payload over lz4's bound")

    monkeypatch.setattr(lz4.block, "decompress", no_decompress)
    with pytest.raises(wire.WireError) as caught:
        compression.decode_tensor(_tensor(bytes(BOUND + 1)), "step.observation", "uint8", SHAPE, compression.LZ4)
    assert str(caught.value) == (f"step.observation.data: got {BOUND + 1} compressed bytes, expected at most "
                                 f"{BOUND} (lz4's worst case for 28224 bytes)")


def test_a_payload_exactly_at_the_bound_goes_on_to_lz4():
    """BOUND bytes of zeros are no lz4 block of 28,224 bytes: refused by lz4, not by the length check."""
    with pytest.raises(wire.WireError, match=f"step.observation.data: got {BOUND} bytes that are not one lz4 block"):
        compression.decode_tensor(_tensor(bytes(BOUND)), "step.observation", "uint8", SHAPE, compression.LZ4)
