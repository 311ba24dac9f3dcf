"""Parallax from Python: arrays, tracing (jit, grad), compiled programs, modules and training.

    import parallax as px
    import parallax.numpy as pnp

    @px.jit
    def f(x, w):
        return pnp.sum(pnp.tanh(x @ w))

    f(np.ones((4, 8), np.float32), np.ones((8, 2), np.float32))
"""

from ._native import _core  # names the Debian packages of missing system libraries
from ._core import (
    Array,
    CompileOptions,
    DType,
    Error,
    Executable,
    Graph,
    InternalError,
    IoError,
    Tensor,
    UserError,
)
from ._array import (
    asarray,
    bf16,
    bfloat16,
    bool_,
    dtype,
    float16,
    float32,
    from_dlpack,
    int32,
    numpy_dtype,
    zeros,
)
from ._transforms import grad, jit, remat, remat_model, value_and_grad, vjp
from ._tree import register_pytree_node, tree_flatten, tree_leaves, tree_map, tree_unflatten
from . import numpy
from . import nn
from . import optim
from . import pax
from . import data
from . import random
from . import text


def stop_gradient(x):
    """x, with no gradient flowing back through it."""
    return _core.stop_gradient(numpy.asarray(x))
from ._core import Mesh, ShardingPlan, ShardingStrategy, StepMetrics, TrainState
from ._core import memory_stats, platform_memory_stats, reset_peak_memory, reset_platform_peak_memory
from ._train import PartitionSpec, TrainStep, create_sharded_model, offload_model, strategy
from .from_torch import from_torch

__version__ = _core.__version__


def trace(fn, *types, names=None) -> Graph:
    """The Graph of fn(*Tensors) for inputs of the given (dtype, shape) types."""

    def body(tensors):
        out = fn(*tensors)
        return list(out) if isinstance(out, (tuple, list)) else [out]

    return _core.trace(body, [(dtype(d), list(s)) for d, s in types], list(names or []))
