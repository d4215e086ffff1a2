"""How the learner stores observations in torch: numpy's dtype as the actors send it -> torch's.

torch has no indexing kernels for some unsigned types; the learner keeps their bits in the signed type of the same
width (a zero-copy reinterpretation), and networks read them back (e.g. football's unpacking). Both the transport
(seed/transport/wire.py, the slab's tensors) and the agents' networks use this, so it lives with the contracts,
where neither imports the other (a network never imports grpc).
"""

from __future__ import annotations

import numpy as np
import torch

_SIGNED_STORAGE = {"uint16": "int16", "uint32": "int32", "uint64": "int64"}


def torch_dtype(numpy_dtype: str) -> torch.dtype:
    """The torch dtype the learner stores observations of `numpy_dtype` in."""
    return getattr(torch, _SIGNED_STORAGE.get(numpy_dtype, numpy_dtype))


def to_torch(array: np.ndarray) -> torch.Tensor:
    """numpy -> torch without a copy, reinterpreting unsigned types torch cannot index (see torch_dtype)."""
    signed = _SIGNED_STORAGE.get(array.dtype.name)
    return torch.from_numpy(array.view(signed) if signed else array)
