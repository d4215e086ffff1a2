"""seed/transport/wire.py's tensor decoding on its own: every check `decode_tensor` makes, each seen by itself (at the
serving call sites `check_step_values` repeats the bool check, so a stream test cannot tell whether this one
works)."""

from __future__ import annotations

import numpy as np
import pytest

from seed._proto import seed_pb2
from seed.transport import wire


def _tensor(dtype: str, shape: list[int], data: bytes) -> seed_pb2.Tensor:
    return seed_pb2.Tensor(dtype=dtype, shape=shape, data=data)


def test_bool_bytes_other_than_0_or_1_are_rejected():
    """NumPy would read byte 2 as True and hand it on unchanged: decode_tensor names the field, the first bad
    byte, its index and how many there are."""
    with pytest.raises(wire.WireError, match=r"^x\.done\.data: got byte value 2 at index 1 \(2 such bytes\), "
                                             r"expected 0 or 1 for dtype 'bool'$"):
        wire.decode_tensor(_tensor("bool", [2, 2], bytes([0, 2, 1, 255])), "x.done", "bool", (2, 2))
    decoded = wire.decode_tensor(_tensor("bool", [4], bytes([0, 1, 1, 0])), "x.done", "bool", (4,))
    assert decoded.dtype == np.bool_ and decoded.tolist() == [False, True, True, False]


def test_dtype_shape_and_size_are_checked_and_the_array_is_read_only():
    values = np.arange(6, dtype=np.float32).reshape(2, 3)
    decoded = wire.decode_tensor(wire.encode_tensor(values), "x.obs", "float32", (2, 3))
    assert np.array_equal(decoded, values) and not decoded.flags.writeable
    with pytest.raises(wire.WireError, match=r"^x\.obs\.dtype: got 'float64', expected 'float32'$"):
        wire.decode_tensor(wire.encode_tensor(values.astype(np.float64)), "x.obs", "float32", (2, 3))
    with pytest.raises(wire.WireError, match=r"^x\.obs\.shape: got \[3, 2\], expected \[2, 3\]$"):
        wire.decode_tensor(wire.encode_tensor(values.reshape(3, 2)), "x.obs", "float32", (2, 3))
    with pytest.raises(wire.WireError, match=r"^x\.obs\.data: got 20 bytes, expected 24$"):
        wire.decode_tensor(_tensor("float32", [2, 3], values.tobytes()[:20]), "x.obs", "float32", (2, 3))
