"""The request pipe's packet-size check (seed/transport/notify.py RequestBatcher): a packet of any size that is not
a whole number of 16-byte notifications is dropped alone, and the notifications around it arrive whole and in
order. Sizes 17-31 are the ones a check of the form `n >= 16` would take (and so misalign every later message);
32 bytes are two notifications one writer wrote at once, which a check of the form `n == 16` would drop."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

from seed.transport import notify
from seed.transport.slab import StepSlab

K = 4


@pytest.fixture
def slab():
    slab = StepSlab.create(num_actors=3, envs_per_actor=K, observation_shape=(8,), observation_dtype="float32")
    yield slab
    slab.release()


def _message(actor: int, seq: int) -> bytes:
    return np.array([(actor, seq)], notify.REQUEST_DTYPE).tobytes()


def test_packets_of_17_to_31_bytes_are_dropped_alone_and_later_messages_stay_aligned(slab, caplog):
    read_fd, write_fd = notify.new_request_channel()
    try:
        batcher = notify.RequestBatcher(read_fd, slab, batch_rows=1000 * K, timeout_s=0.0)
        expected, seq = [], 0
        for size in range(17, 32):
            # A bad packet whose bytes, if taken, would shift the next message: filled with a plausible actor 1.
            os.write(write_fd, (_message(1, 999) * 2)[:size])
            seq += 1
            os.write(write_fd, _message(size % 3, seq))
            expected.append((size % 3, seq))
        os.write(write_fd, _message(2, seq + 1) + _message(0, seq + 2))  # two notifications in one packet
        expected += [(2, seq + 1), (0, seq + 2)]
        received = []
        with caplog.at_level(logging.WARNING, logger="seed.transport.notify"):
            while len(received) < len(expected):
                batch = batcher.next_batch(1.0)
                assert batch is not None, f"got {len(received)} of {len(expected)} notifications: {received}"
                received += [(int(a), int(s)) for a, s in zip(*batch, strict=True)]
    finally:
        os.close(read_fd), os.close(write_fd)
    assert sorted(received, key=lambda r: r[1]) == expected
    assert batcher.rejected == 15
    sizes = ", ".join(f"1 of {size} bytes" for size in range(17, 32))
    assert f"dropped malformed notifications ({sizes}), expected packets of 16 bytes" in caplog.text, caplog.text
