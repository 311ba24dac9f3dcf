"""Counter-based random numbers while tracing (px::random_*): values depend only on the key and
the element index, so they are the same whatever the sharding.

    key = px.random.key(0)                      # an int32[2] Tensor
    noise = px.random.normal(px.random.fold_in(key, 1), (4, 8))
"""

from __future__ import annotations

from . import _core
from ._array import dtype as _dtype
from .numpy import _tensor


def key(seed: int):
    """A constant key from a seed (emitted into the current trace)."""
    return _core.random_key(seed)


def fold_in(key, data: int):
    return _core.fold_in(_tensor(key), data)


def uniform(key, shape, dtype=_core.DType.f32, minval=0.0, maxval=1.0):
    return _core.random_uniform(_tensor(key), list(shape), _dtype(dtype), minval, maxval)


def normal(key, shape, dtype=_core.DType.f32):
    return _core.random_normal(_tensor(key), list(shape), _dtype(dtype))
