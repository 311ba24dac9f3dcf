"""px.Array interop: NumPy (buffer protocol) and DLPack, zero-copy where the memory allows."""

from __future__ import annotations

import weakref

import numpy as np

from . import _core
from ._core import Array, DType, UserError

try:  # bf16 as a real NumPy dtype when ml_dtypes is installed
    import ml_dtypes as _ml_dtypes

    bfloat16 = np.dtype(_ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    _ml_dtypes = None
    bfloat16 = None

float32 = DType.f32
float16 = DType.f16
int32 = DType.i32
bool_ = DType.bool
bf16 = DType.bf16

_TO_NUMPY = {
    DType.f32: np.dtype(np.float32),
    DType.f16: np.dtype(np.float16),
    DType.i32: np.dtype(np.int32),
    DType.bool: np.dtype(np.bool_),
}
_FROM_NUMPY = {v: k for k, v in _TO_NUMPY.items()}
if bfloat16 is not None:
    _TO_NUMPY[DType.bf16] = bfloat16
    _FROM_NUMPY[bfloat16] = DType.bf16

_NAMES = {"float32": DType.f32, "f32": DType.f32, "bfloat16": DType.bf16, "bf16": DType.bf16,
          "float16": DType.f16, "f16": DType.f16, "int32": DType.i32, "i32": DType.i32,
          "bool": DType.bool}


def dtype(d) -> DType:
    """A px.DType from a px.DType, a NumPy dtype (or type) or a name ('float32', 'bf16', ...)."""
    if isinstance(d, DType):
        return d
    if isinstance(d, str) and d in _NAMES:
        return _NAMES[d]
    try:
        nd = np.dtype(d)
    except TypeError:
        nd = None
    if nd is not None and nd in _FROM_NUMPY:
        return _FROM_NUMPY[nd]
    raise UserError(f"unsupported dtype {d!r}: Parallax takes float32, bfloat16, float16, int32 and bool")


def numpy_dtype(d: DType) -> np.dtype:
    """The NumPy dtype of a px.DType (bf16: ml_dtypes.bfloat16, or uint16 bits without ml_dtypes)."""
    return _TO_NUMPY.get(d, np.dtype(np.uint16))


def _to_numpy(self: Array, dtype=None, copy=None):
    """A NumPy array over the same memory (no copy)."""
    if self.nbytes == 0:
        out = np.zeros(self.shape, numpy_dtype(self.dtype))
    else:
        out = np.frombuffer(self.view_bytes(), dtype=numpy_dtype(self.dtype)).reshape(self.shape)
    if copy:
        out = out.copy()
    if dtype is not None and np.dtype(dtype) != out.dtype:
        out = out.astype(dtype)
    return out


def _array_repr(self: Array) -> str:
    body = np.array2string(_to_numpy(self), separator=", ", prefix="px.Array(")
    return f"px.Array({body}, dtype={_core.dtype_name(self.dtype)})"


_dlpack_exports: dict[int, weakref.ref] = {}
_cpp_dlpack = Array.__dlpack__


def _dlpack(self: Array, stream=None, *, max_version=None, dl_device=None, copy=None):
    if not copy:
        ptr = self.data_ptr

        def forget(ref, ptr=ptr):
            if _dlpack_exports.get(ptr) is ref:
                del _dlpack_exports[ptr]

        _dlpack_exports[ptr] = weakref.ref(self, forget)
    return _cpp_dlpack(self, stream, max_version=max_version, dl_device=dl_device, copy=copy)


def _exported_owner(ptr: int):
    ref = _dlpack_exports.get(ptr)
    owner = ref() if ref is not None else None
    if ref is not None and owner is None:
        del _dlpack_exports[ptr]
    return owner


Array.numpy = _to_numpy
Array.__array__ = _to_numpy
Array.__repr__ = _array_repr
Array.__dlpack__ = _dlpack
Array.__len__ = lambda self: self.shape[0] if self.shape else _raise_len()
Array.tolist = lambda self: _to_numpy(self).tolist()
Array.item = lambda self: _to_numpy(self).item()
Array.__float__ = lambda self: float(_to_numpy(self))
Array.__int__ = lambda self: int(_to_numpy(self))


def _raise_len():
    raise TypeError("len() of a 0-d px.Array")


def _owner_of_numpy(x: np.ndarray):
    """The px.Array whose memory x is (a view made by np.asarray(px_array)), else None."""
    base = x
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    if isinstance(base, _core._Bytes):
        base = base.array
    if isinstance(base, Array) and base.data_ptr == x.__array_interface__["data"][0]:
        return base
    return None


def from_dlpack(x, *, copy=None) -> Array:
    """A px.Array from anything with __dlpack__ (torch, JAX, NumPy, px.Array) on the CPU.

    Without a copy where the layout allows: a px.Array's own memory comes back as that array, and
    other contiguous memory aligned to its element size is adopted (the px.Array holds the tensor
    alive). copy=True always copies; copy=False raises px.UserError where a copy would be needed."""
    if isinstance(x, Array):
        return x.copy() if copy else x
    if isinstance(x, np.ndarray):  # the buffer protocol also takes read-only arrays
        return asarray(x, copy=copy)
    if not hasattr(x, "__dlpack__"):
        raise UserError(f"px.from_dlpack: {type(x).__name__} has no __dlpack__ method")
    out = Array._from_dlpack_capsule(x.__dlpack__(), _exported_owner, adopt=not copy)
    if copy is False and not _shares(out, x):
        raise UserError("px.from_dlpack(copy=False): the tensor's memory cannot be used without a copy (it is not "
                        f"aligned to its {out.nbytes // max(out.size, 1)}-byte elements); pass copy=None to copy it")
    return out


def _data_ptr(x) -> int | None:
    if isinstance(x, np.ndarray):
        return x.__array_interface__["data"][0]
    ptr = getattr(x, "data_ptr", None)  # torch.Tensor.data_ptr()
    return ptr() if callable(ptr) else None


def _shares(a: Array, x) -> bool:
    return a.size == 0 or _data_ptr(x) in (None, a.data_ptr)


def asarray(x, dtype=None, *, copy=None) -> Array:
    """A px.Array from a px.Array, a NumPy array, anything with __dlpack__, or Python numbers.

    Without a copy where the layout allows (docs/python.md): a px.Array, a NumPy or DLPack view of
    one, and a contiguous NumPy array or DLPack tensor aligned to its element size (the px.Array
    adopts its memory and holds it alive; a read-only NumPy array stays read-only). Otherwise, or
    with copy=True, the values are copied; copy=False raises px.UserError where a copy would be
    needed. Non-contiguous arrays and unsupported dtypes raise px.UserError."""
    want = None if dtype is None else globals()["dtype"](dtype)
    if isinstance(x, Array):
        out = x.copy() if copy else x
    elif isinstance(x, np.ndarray) or np.isscalar(x) and isinstance(x, np.generic):
        x = np.asarray(x)
        d = _numpy_to_px(x, "px.asarray")
        owner = _owner_of_numpy(x) if x.flags.c_contiguous else None
        if owner is not None and owner.dtype == d and owner.size == x.size:
            out = owner if tuple(owner.shape) == x.shape else owner.reshape(list(x.shape))
            if copy:
                out = out.copy()
        else:
            if not x.flags.c_contiguous:
                raise UserError(f"px.asarray: the array is not C-contiguous (shape {x.shape}, strides {x.strides} "
                                "in bytes); pass np.ascontiguousarray(x) to copy it")
            out = Array._from_buffer(x.view(np.uint16) if d == DType.bf16 else x, d, adopt=not copy)
            if copy is False and not _shares(out, x):
                raise UserError(f"px.asarray(copy=False): the array's memory is not aligned to its "
                                f"{x.itemsize}-byte elements, so it cannot be used without a copy; pass copy=None "
                                "to copy it")
    elif hasattr(x, "__dlpack__") and not isinstance(x, (list, tuple)):
        out = from_dlpack(x, copy=copy)
    else:
        if copy is False:
            raise UserError(f"px.asarray(copy=False): a {type(x).__name__} has no array memory to use; pass "
                            "copy=None")
        arr = np.asarray(x)
        if arr.dtype == np.float64:
            arr = arr.astype(np.float32)
        elif arr.dtype.kind in "iu":
            arr = arr.astype(np.int32)
        # np.require keeps a 0-d array 0-d (np.ascontiguousarray would make it shape (1,)).
        return asarray(np.require(arr, requirements="C"), want)
    if want is not None and out.dtype != want:
        if copy is False:
            raise UserError(f"px.asarray(copy=False): converting {_core.dtype_name(out.dtype)} to "
                            f"{_core.dtype_name(want)} needs a copy; pass copy=None")
        out = out.astype(want)
    return out


def _numpy_to_px(x: np.ndarray, who: str) -> DType:
    if x.dtype in _FROM_NUMPY:
        return _FROM_NUMPY[x.dtype]
    hint = ""
    if x.dtype == np.float64:
        hint = "; cast with x.astype(np.float32)"
    elif x.dtype.kind in "iu":
        hint = "; cast with x.astype(np.int32)"
    raise UserError(f"{who}: unsupported dtype {x.dtype} (Parallax takes float32, bfloat16, float16, "
                    f"int32 and bool){hint}")


def zeros(shape, dtype=float32) -> Array:
    return Array.zeros(list(shape), globals()["dtype"](dtype))
