"""Ops on symbolic Tensors under NumPy / jax.numpy names (px.numpy, usually imported as pnp).

Each works while tracing (inside px.jit, px.grad, ...); arguments that are arrays or Python
numbers become constants (numbers take the other operand's dtype)."""

from __future__ import annotations

import builtins

import numpy as _np

from . import _core
from ._array import asarray as _px_asarray, dtype as _dtype
from ._core import Tensor, UserError

__all__ = [
    "add", "subtract", "multiply", "divide", "true_divide", "power", "maximum", "minimum", "negative",
    "exp", "log", "tanh", "sqrt", "abs", "absolute", "square", "sign", "equal", "not_equal", "less",
    "less_equal", "greater", "greater_equal", "logical_and", "logical_or", "logical_not", "where",
    "astype", "reshape", "transpose", "swapaxes", "expand_dims", "squeeze", "broadcast_to",
    "concatenate", "split", "pad", "sum", "mean", "max", "min", "argmax", "argmin", "matmul", "dot", "einsum", "take",
    "arange", "zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "softmax",
    "log_softmax", "logsumexp", "rsqrt", "sigmoid", "asarray",
]


def _tensor(x, like: Tensor | None = None) -> Tensor:
    if isinstance(x, Tensor):
        return x
    if like is not None and isinstance(x, (int, float, bool, _np.generic)) and not isinstance(x, _np.ndarray):
        return _core.full_like(like, float(x))
    return _core.constant(_px_asarray(x))


def _type(t: Tensor) -> str:
    """'f32[4,8]', as errors print a Tensor's type."""
    return f"{_core.dtype_name(t.dtype)}[{','.join(map(str, t.shape))}]"


def asarray(x) -> Tensor:
    """x as a Tensor of the current trace (arrays become constants)."""
    return _tensor(x)


def _pair(a, b):
    if isinstance(a, Tensor):
        return a, _tensor(b, a)
    if isinstance(b, Tensor):
        return _tensor(a, b), b
    return _tensor(a), _tensor(b)


def _binary(op):
    def f(a, b):
        return op(*_pair(a, b))

    f.__name__ = op.__name__
    return f


add = _binary(_core.add)
subtract = _binary(_core.sub)
multiply = _binary(_core.mul)
divide = true_divide = _binary(_core.div)
power = _binary(_core.pow)
maximum = _binary(_core.maximum)
minimum = _binary(_core.minimum)
equal = _binary(_core.equal)
not_equal = _binary(_core.not_equal)
less = _binary(_core.less)
less_equal = _binary(_core.less_equal)
greater = _binary(_core.greater)
greater_equal = _binary(_core.greater_equal)
logical_and = _binary(_core.logical_and)
logical_or = _binary(_core.logical_or)


def negative(x): return _core.neg(_tensor(x))
def exp(x): return _core.exp(_tensor(x))
def log(x): return _core.log(_tensor(x))
def tanh(x): return _core.tanh(_tensor(x))
def sqrt(x): return _core.sqrt(_tensor(x))
def rsqrt(x): return _core.rsqrt(_tensor(x))
def abs(x): return _core.abs(_tensor(x))  # noqa: A001
absolute = abs
def square(x): return _core.square(_tensor(x))
def sigmoid(x): return _core.sigmoid(_tensor(x))
def logical_not(x): return _core.logical_not(_tensor(x))


def sign(x):
    x = _tensor(x)
    zero = _core.zeros_like(x)
    return _core.sub(_core.cast(_core.greater(x, zero), x.dtype), _core.cast(_core.less(x, zero), x.dtype))


def where(cond, a, b):
    cond = _tensor(cond)
    a, b = _pair(a, b)
    return _core.where(cond, a, b)


def astype(x, dtype):
    return _core.cast(_tensor(x), _dtype(dtype))


def _axes(axis, ndim):
    if axis is None:
        return []
    axes = [axis] if isinstance(axis, int) else list(axis)
    return [a + ndim if a < 0 else a for a in axes]


def sum(x, axis=None, keepdims=False):  # noqa: A001
    x = _tensor(x)
    return _core.sum(x, _axes(axis, x.ndim), keepdims)


def mean(x, axis=None, keepdims=False):
    x = _tensor(x)
    return _core.mean(x, _axes(axis, x.ndim), keepdims)


def _nonempty(name, x, axes):
    """Like NumPy: a reduction without an identity (max, argmax, ...) of no elements raises."""
    for a in axes or range(x.ndim):
        if x.shape[a] == 0:
            raise UserError(f"px.numpy.{name}: reduces axis {a} of size 0 ({_type(x)}); an empty "
                            "array has no maximum or minimum (NumPy raises too): reduce a non-empty axis")


def max(x, axis=None, keepdims=False):  # noqa: A001
    x = _tensor(x)
    axes = _axes(axis, x.ndim)
    _nonempty("max", x, axes)
    return _core.max(x, axes, keepdims)


def min(x, axis=None, keepdims=False):  # noqa: A001
    x = _tensor(x)
    axes = _axes(axis, x.ndim)
    _nonempty("min", x, axes)
    return _core.neg(_core.max(_core.neg(x), axes, keepdims))


def _arg_extreme(name, x, axis, keepdims, pick):
    x = _tensor(x)
    _nonempty(name, x, _axes(axis, x.ndim))
    if axis is None:
        x, axis = reshape(x, [-1]), 0
    axis = axis + x.ndim if axis < 0 else axis
    best = pick(x, axis, keepdims=True)
    hit = equal(x, best)
    if x.dtype not in (_core.DType.i32, _core.DType.bool):
        hit = logical_or(hit, not_equal(x, x))  # NaN wins, as in NumPy
    n = x.shape[axis]
    pos = _core.iota(list(x.shape), axis, _core.DType.i32)
    first = negative(max(negative(where(hit, pos, full_like(pos, n))), axis, keepdims))
    return first


def argmax(x, axis=None, keepdims=False):
    """The index of the first maximum along axis (None: of the flattened x), int32."""
    return _arg_extreme("argmax", x, axis, keepdims, max)


def argmin(x, axis=None, keepdims=False):
    """The index of the first minimum along axis (None: of the flattened x), int32."""
    return _arg_extreme("argmin", x, axis, keepdims, min)


def reshape(x, shape):
    shape = [shape] if isinstance(shape, int) else list(shape)
    return _core.reshape(_tensor(x), shape)


def transpose(x, axes=None):
    x = _tensor(x)
    perm = list(reversed(range(x.ndim))) if axes is None else [a % x.ndim for a in axes]
    return _core.transpose(x, perm)


def swapaxes(x, a, b): return _core.swap_axes(_tensor(x), a, b)
def expand_dims(x, axis): return _core.expand_dims(_tensor(x), axis)
def broadcast_to(x, shape): return _core.broadcast_to(_tensor(x), list(shape))


def squeeze(x, axis=None):
    x = _tensor(x)
    axes = [i for i, d in enumerate(x.shape) if d == 1] if axis is None else _axes(axis, x.ndim)
    for a in sorted(axes, reverse=True):
        x = _core.squeeze(x, a)
    return x


def concatenate(xs, axis=0): return _core.concat([_tensor(x) for x in xs], axis)


def split(x, indices_or_sections, axis=0):
    x = _tensor(x)
    n = x.shape[axis]
    if isinstance(indices_or_sections, int):
        if n % indices_or_sections:
            raise UserError(f"px.numpy.split: dim {n} does not divide into {indices_or_sections} sections")
        sizes = [n // indices_or_sections] * indices_or_sections
    else:
        bounds = [0, *indices_or_sections, n]
        sizes = [bounds[i + 1] - bounds[i] for i in range(len(bounds) - 1)]
    return _core.split(x, sizes, axis)


def pad(x, pad_width, constant_values=0.0):
    x = _tensor(x)
    pw = [(pad_width, pad_width)] * x.ndim if isinstance(pad_width, int) else [tuple(p) for p in pad_width]
    return _core.pad(x, [p[0] for p in pw], [p[1] for p in pw], float(constant_values))


def matmul(a, b): return _core.matmul(*_pair(a, b))


def dot(a, b):
    a, b = _pair(a, b)
    if a.ndim == 1 and b.ndim == 1:
        return _core.dot_general(a, b, [0], [0])
    return _core.matmul(a, b)


def _parse_einsum(spec: str, n: int):
    spec = spec.replace(" ", "")
    if "..." in spec:
        raise UserError("px.numpy.einsum: '...' is not supported; name every axis")
    if "->" in spec:
        ins, out = spec.split("->")
    else:
        ins = spec
        letters = ins.replace(",", "")
        out = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    ins = ins.split(",")
    if len(ins) != n:
        raise UserError(f"px.numpy.einsum: '{spec}' names {len(ins)} operands, got {n}")
    for s in [*ins, out]:
        if len(set(s)) != len(s):
            raise UserError(f"px.numpy.einsum: '{spec}' repeats an axis within one operand (diagonals are not "
                            "supported)")
    return ins, out


def _reduce_unused(x, s, keep):
    """Sums the axes of x whose letters are not in keep; returns (x, remaining letters)."""
    drop = [i for i, c in enumerate(s) if c not in keep]
    if drop:
        x = _core.sum(x, drop, False)
        s = "".join(c for c in s if c in keep)
    return x, s


def einsum(spec: str, *operands):
    """Einstein sums of one or two operands, lowered to sum, transpose and dot_general
    (e.g. 'bij,bjk->bik', 'bhqd,bhkd->bhqk', 'ij->ji', 'ij->')."""
    if len(operands) not in (1, 2):
        raise UserError(f"px.numpy.einsum: one or two operands are supported, got {len(operands)}")
    ins, out = _parse_einsum(spec, len(operands))
    xs = [_tensor(o) for o in operands]
    for s, x in zip(ins, xs):
        if len(s) != x.ndim:
            raise UserError(f"px.numpy.einsum: '{s}' names {len(s)} axes of an operand of shape {x.shape}")
    if len(xs) == 1:
        x, s = _reduce_unused(xs[0], ins[0], out)
    else:
        (a, sa), (b, sb) = [_reduce_unused(x, s, set(out) | set(other))
                            for x, s, other in ((xs[0], ins[0], ins[1]), (xs[1], ins[1], ins[0]))]
        batch = [c for c in sa if c in sb and c in out]
        contract = [c for c in sa if c in sb and c not in out]
        x = _core.dot_general(a, b, [sa.index(c) for c in contract], [sb.index(c) for c in contract],
                              [sa.index(c) for c in batch], [sb.index(c) for c in batch])
        s = "".join(batch) + "".join(c for c in sa if c not in sb) + "".join(c for c in sb if c not in sa)
    missing = [c for c in out if c not in s]
    if missing:
        raise UserError(f"px.numpy.einsum: output axes {missing} of '{spec}' are not in any operand")
    perm = [s.index(c) for c in out]
    return x if perm == list(range(len(perm))) else _core.transpose(x, perm)


def _count(bad) -> Tensor:
    """The number of true elements of a bool Tensor (an int32 scalar)."""
    return _core.sum(_core.cast(bad, _core.DType.i32), [], False)


def _outside(indices, n, allowed=None):
    """Where int32 indices lie outside [0, n) (and are not `allowed`)."""
    bad = logical_or(less(indices, 0), greater_equal(indices, n))
    return bad if allowed is None else logical_and(bad, not_equal(indices, allowed))


def check_indices(indices, n, where: str, allowed=None):
    """Inside px.jit: px.UserError after the run when an index lies outside [0, n) (other than
    `allowed`); the message names `where` (docs/python.md, "Edges")."""
    from ._transforms import checking, runtime_check

    if not checking():
        return
    indices = _tensor(indices)
    also = "" if allowed is None else f" and are not {allowed} (the ignore index)"
    runtime_check(_count(_outside(indices, n, allowed)),
                  f"{where}: {{count}} of the indices ({_type(indices)}) lie outside [0, {n}){also}")


_TAKE_MODES = ("fill", "clip", "raise")


def take(a, indices, axis=0, mode=None, fill_value=None):
    """a's entries along `axis` (default 0; None: of the flattened a) at int32 indices, shaped
    a.shape[:axis] + indices.shape + a.shape[axis + 1:]. Indices in [-n, 0) count from the end.
    Out-of-range ones follow `mode` (JAX's): "fill" (default) gives fill_value (NaN for floats, the
    lowest int32, True), "clip" clamps to [0, n - 1], "raise" is a px.UserError after a px.jit call."""
    mode = mode or "fill"
    if mode not in _TAKE_MODES:
        raise UserError(f"px.numpy.take: mode={mode!r}; expected one of {', '.join(_TAKE_MODES)}")
    a, indices = _tensor(a), _tensor(indices)
    if indices.dtype != _core.DType.i32:
        raise UserError(f"px.numpy.take: indices must be int32, got {_type(indices)}")
    if axis is None:
        a, axis = reshape(a, [-1]), 0
    axis = axis + a.ndim if axis < 0 else axis
    if not 0 <= axis < a.ndim:
        raise UserError(f"px.numpy.take: axis {axis} is out of range for {_type(a)}")
    n = a.shape[axis]
    if mode != "clip":  # negative indices count from the end
        indices = where(less(indices, 0), add(indices, n), indices)
    if mode == "raise":
        check_indices(indices, n, "px.numpy.take(mode='raise')")
    moved = a if axis == 0 else _core.transpose(a, [axis, *range(axis), *range(axis + 1, a.ndim)])
    out = _core.take(moved, indices)
    if mode == "fill":
        if fill_value is None:
            fill_value = {_core.DType.i32: -2**31, _core.DType.bool: True}.get(a.dtype, float("nan"))
        valid = logical_not(_outside(indices, n))
        valid = reshape(valid, [*indices.shape, *[1] * (out.ndim - indices.ndim)])
        out = where(valid, out, full_like(out, fill_value))
    if axis == 0:
        return out
    k = indices.ndim  # out is indices.shape + a.shape[:axis] + a.shape[axis + 1:]
    return _core.transpose(out, [*range(k, k + axis), *range(k), *range(k + axis, out.ndim)])


def arange(n: int, dtype=_core.DType.i32):
    return _core.iota([n], 0, _dtype(dtype))


def full(shape, value, dtype=_core.DType.f32):
    return _core.full([shape] if isinstance(shape, int) else list(shape), float(value), _dtype(dtype))


def zeros(shape, dtype=_core.DType.f32): return full(shape, 0.0, dtype)
def ones(shape, dtype=_core.DType.f32): return full(shape, 1.0, dtype)
def zeros_like(x): return _core.zeros_like(_tensor(x))
def ones_like(x): return _core.ones_like(_tensor(x))
def full_like(x, value): return _core.full_like(_tensor(x), float(value))
def softmax(x, axis=-1): return _core.softmax(_tensor(x), axis)
def log_softmax(x, axis=-1): return _core.log_softmax(_tensor(x), axis)
def logsumexp(x, axis=-1, keepdims=False): return _core.logsumexp(_tensor(x), axis, keepdims)


# ---- Tensor methods and operators ---------------------------------------------------------------
def _getitem(x: Tensor, key):
    """Basic indexing: ints, slices with positive steps, None and one Ellipsis."""
    key = key if isinstance(key, tuple) else (key,)
    if builtins.sum(k is Ellipsis for k in key) > 1:
        raise UserError("Tensor indexing: at most one '...'")
    n_real = builtins.sum(1 for k in key if k is not None and k is not Ellipsis)
    if n_real > x.ndim:
        raise UserError(f"Tensor indexing: {n_real} indices for a Tensor of rank {x.ndim}")
    if Ellipsis in key:
        i = key.index(Ellipsis)
        key = key[:i] + (slice(None),) * (x.ndim - n_real) + key[i + 1:]
    starts, limits, strides, squeeze_axes, new_axes = [], [], [], [], []
    dim = 0
    out_pos = 0
    for k in key:
        if k is None:
            new_axes.append(out_pos)
            out_pos += 1
            continue
        size = x.shape[dim]
        if isinstance(k, (int, _np.integer)):
            i = int(k) + size if k < 0 else int(k)
            if not 0 <= i < size:
                raise UserError(f"Tensor indexing: index {k} out of range for dim {dim} of size {size}")
            starts.append(i), limits.append(i + 1), strides.append(1)
            squeeze_axes.append(dim)
        elif isinstance(k, slice):
            start, stop, step = k.indices(size)
            if step <= 0:
                raise UserError("Tensor indexing: slices need a positive step")
            stop = builtins.max(stop, start)
            starts.append(start), limits.append(stop), strides.append(step)
            out_pos += 1
        else:
            raise UserError(f"Tensor indexing: unsupported index {type(k).__name__} (ints, slices, None, ...)")
        dim += 1
    for d in range(dim, x.ndim):
        starts.append(0), limits.append(x.shape[d]), strides.append(1)
        out_pos += 1
    if starts != [0] * x.ndim or limits != list(x.shape) or builtins.any(s != 1 for s in strides):
        x = _core.slice(x, starts, limits, strides)
    for a in sorted(squeeze_axes, reverse=True):
        x = _core.squeeze(x, a)
    for a in new_axes:
        x = _core.expand_dims(x, a)
    return x


def _install_tensor_methods():
    T = Tensor
    cpp = {n: getattr(T, n) for n in ("__add__", "__sub__", "__mul__", "__truediv__", "__radd__", "__rsub__",
                                         "__rmul__", "__rtruediv__")}

    def arith(name, fallback):
        op = cpp[name]

        def f(a, b):
            if isinstance(b, (Tensor, int, float)) and not isinstance(b, bool):
                return op(a, b)
            if isinstance(b, _np.generic) and _np.ndim(b) == 0 and not isinstance(b, _np.bool_):
                return op(a, float(b))
            return fallback(a, b)

        f.__name__ = name
        return f

    T.__add__ = arith("__add__", add)
    T.__sub__ = arith("__sub__", subtract)
    T.__mul__ = arith("__mul__", multiply)
    T.__truediv__ = arith("__truediv__", divide)
    T.__radd__ = arith("__radd__", lambda a, b: add(b, a))
    T.__rsub__ = arith("__rsub__", lambda a, b: subtract(b, a))
    T.__rmul__ = arith("__rmul__", lambda a, b: multiply(b, a))
    T.__rtruediv__ = arith("__rtruediv__", lambda a, b: divide(b, a))
    T.__matmul__ = lambda a, b: matmul(a, b)
    T.__rmatmul__ = lambda a, b: matmul(b, a)
    T.__pow__ = lambda a, b: power(a, b)
    T.__rpow__ = lambda a, b: power(b, a)
    T.__lt__ = lambda a, b: less(a, b)
    T.__le__ = lambda a, b: less_equal(a, b)
    T.__gt__ = lambda a, b: greater(a, b)
    T.__ge__ = lambda a, b: greater_equal(a, b)
    T.__and__ = lambda a, b: logical_and(a, b)
    T.__or__ = lambda a, b: logical_or(a, b)
    T.__invert__ = lambda a: logical_not(a)
    T.__abs__ = lambda a: abs(a)
    T.__getitem__ = _getitem
    T.__len__ = lambda a: a.shape[0]
    T.__bool__ = _no_bool
    T.reshape = lambda a, *shape: reshape(a, shape[0] if len(shape) == 1 and not isinstance(shape[0], int)
                                           else shape)
    T.transpose = lambda a, *axes: transpose(a, (axes[0] if len(axes) == 1 and not isinstance(axes[0], int)
                                                 else axes) or None)
    T.T = property(lambda a: transpose(a))
    T.astype = astype
    T.sum = sum
    T.mean = mean
    T.max = max
    T.min = min
    T.squeeze = squeeze
    T.swapaxes = swapaxes


def _no_bool(t):
    raise UserError(f"the truth value of a traced {t!r} is unknown while tracing; use px.numpy.where")


_install_tensor_methods()
