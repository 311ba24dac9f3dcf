"""px.from_torch: a PyTorch nn.Module, captured by torch.export, as a px.nn.Module.

    model = transformers.GPT2LMHeadModel(config)
    pm = px.from_torch(model, (tokens,), {"use_cache": False})
    logits = pm(tokens)                                  # px.Array, equal to model(tokens).logits
    step = px.create_sharded_model(pm, (tokens, targets), loss_fn=loss_fn, strategy="auto")

torch.export captures the forward for the example inputs' shapes; run_decompositions() lowers it
to the core ATen opset (scaled_dot_product_attention is kept whole, so attention runs as Parallax's
fused attention). Ops whose inputs are all constants (masks, position ids, rotary tables) are
evaluated once by torch here; the rest are replayed with Parallax ops whenever the module is
traced. The module's params are the torch module's parameters under their torch names (tied ones
once), sharing the torch tensors' memory; buffers are constants. torch is imported lazily: it is
an optional dependency (pip install 'parallax[torch]')."""

from __future__ import annotations

import operator

import numpy as np

from . import _core
from . import numpy as pnp
from ._array import Array, asarray, numpy_dtype
from ._core import Tensor, UserError
from .nn import functional as F
from .nn.modules import Module

_OPS: dict = {}  # "aten.view.default" -> handler(node, *args, **kwargs)


def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise UserError("px.from_torch needs PyTorch: pip install 'parallax[torch]' (or pip install torch)") from e
    return torch


def _op(*names):
    def register(fn):
        for n in names:
            _OPS["aten." + n] = fn
        return fn

    return register


def _origin(node) -> str:
    """Where the node comes from in the model's code: the innermost frame of its stack trace."""
    trace = (node.meta.get("stack_trace") or "").strip().splitlines()
    frames = [i for i, line in enumerate(trace) if line.lstrip().startswith("File ")]
    if not frames:
        return f"  (no stack trace recorded for node '{node.name}')"
    return "\n".join(trace[frames[-1]:frames[-1] + 2])


def _unsupported(node, why: str):
    raise UserError(f"px.from_torch: {why}; it comes from the model's code at:\n{_origin(node)}\n"
                    "(docs/python.md, 'From PyTorch', lists the ops Parallax takes)")


# ---- dtypes and constants ----------------------------------------------------------------------
def _dtype_of(tdtype):
    torch = _torch()
    if tdtype in (torch.float32, torch.float64):
        return _core.DType.f32
    if tdtype == torch.bfloat16:
        return _core.DType.bf16
    if tdtype == torch.float16:
        return _core.DType.f16
    if tdtype == torch.bool:
        return _core.DType.bool
    if tdtype in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        return _core.DType.i32
    raise UserError(f"px.from_torch: torch dtype {tdtype} has no Parallax counterpart (float32, bfloat16, "
                    "float16, int32 and bool; int64 becomes int32, float64 float32)")


def _numpy_of(t) -> np.ndarray:
    """A torch constant as a NumPy array of a Parallax dtype."""
    torch = _torch()
    t = t.detach().cpu()
    if t.dtype in (torch.bfloat16, torch.float16, torch.float64):
        return t.float().numpy()
    if t.dtype == torch.bool:
        return t.numpy()
    if t.is_floating_point():
        return t.numpy().astype(np.float32)
    a = t.numpy()
    if a.size and (a.min() < -2**31 or a.max() >= 2**31):
        raise UserError("px.from_torch: an integer constant of the model does not fit in int32")
    return a.astype(np.int32)


def _t(x, dtype=None) -> Tensor:
    """x (a Tensor, a torch constant or a Python number) as a Tensor, cast to dtype if given."""
    if not isinstance(x, Tensor):
        torch = _torch()
        if isinstance(x, torch.Tensor):
            x = pnp.asarray(_numpy_of(x))
        elif dtype is not None:
            return pnp.full([], x, dtype)
        else:
            x = pnp.asarray(x)
    return x if dtype is None or x.dtype == dtype else pnp.astype(x, dtype)


def _shape(node) -> list[int]:
    return [int(s) for s in node.meta["val"].shape]


def _out_dtype(node):
    return _dtype_of(node.meta["val"].dtype)


def _axis(a: int, ndim: int) -> int:
    return a + ndim if a < 0 else a


# ---- elementwise -------------------------------------------------------------------------------
def _elementwise(fn):
    def handler(node, *args, **kwargs):
        d = _out_dtype(node)
        return fn(*[_t(a, d) for a in args], **kwargs)

    return handler


def _common(args):
    """The dtype a comparison compares in (PyTorch's promotion among Parallax's dtypes)."""
    dts = [_t(a).dtype if isinstance(a, Tensor) else _dtype_of(a.dtype) for a in args if hasattr(a, "dtype")]
    floats = [d for d in dts if d in (_core.DType.f32, _core.DType.bf16, _core.DType.f16)]
    if floats:
        return floats[0]
    if any(isinstance(a, float) for a in args):
        return _core.DType.f32
    scalars = [a for a in args if not hasattr(a, "dtype")]
    if dts and all(d == _core.DType.bool for d in dts) and all(isinstance(a, bool) for a in scalars):
        return _core.DType.bool
    return _core.DType.i32


def _compare(fn):
    def handler(node, a, b):
        d = _common([a, b])
        return fn(_t(a, d), _t(b, d))

    return handler


for _names, _fn in [(("mul.Tensor", "mul.Scalar"), pnp.multiply), (("div.Tensor", "div.Scalar"), pnp.divide),
                    (("maximum.default",), pnp.maximum), (("minimum.default",), pnp.minimum)]:
    _op(*_names)(_elementwise(_fn))
for _names, _fn in [(("eq.Tensor", "eq.Scalar"), pnp.equal), (("ne.Tensor", "ne.Scalar"), pnp.not_equal),
                    (("lt.Tensor", "lt.Scalar"), pnp.less), (("le.Tensor", "le.Scalar"), pnp.less_equal),
                    (("gt.Tensor", "gt.Scalar"), pnp.greater), (("ge.Tensor", "ge.Scalar"), pnp.greater_equal),
                    (("logical_and.default", "bitwise_and.Tensor"), pnp.logical_and),
                    (("logical_or.default", "bitwise_or.Tensor"), pnp.logical_or)]:
    _op(*_names)(_compare(_fn))
for _names, _fn in [("neg.default", pnp.negative), ("exp.default", pnp.exp), ("log.default", pnp.log),
                    ("tanh.default", pnp.tanh), ("sqrt.default", pnp.sqrt), ("rsqrt.default", pnp.rsqrt),
                    ("sigmoid.default", pnp.sigmoid), ("abs.default", pnp.abs), ("silu.default", F.silu),
                    ("relu.default", F.relu), ("reciprocal.default", lambda x: 1.0 / x)]:
    _op(_names)(_elementwise(_fn))


@_op("sub.Tensor", "sub.Scalar")
def _sub(node, a, b, alpha=1):
    d = _out_dtype(node)
    b = _t(b, d)
    return pnp.subtract(_t(a, d), b if alpha == 1 else b * float(alpha))


@_op("add.Tensor", "add.Scalar")
def _add(node, a, b, alpha=1):
    d = _out_dtype(node)
    b = _t(b, d)
    return pnp.add(_t(a, d), b if alpha == 1 else b * float(alpha))


@_op("rsub.Scalar", "rsub.Tensor")
def _rsub(node, a, b, alpha=1):
    return _sub(node, b, a if alpha == 1 else _t(a, _out_dtype(node)) * float(alpha))


@_op("logical_not.default", "bitwise_not.default")
def _not(node, x):
    if _t(x).dtype != _core.DType.bool:
        _unsupported(node, f"{node.target} of a non-bool tensor (bitwise ops on integers) is not supported")
    return pnp.logical_not(_t(x))


@_op("where.self")
def _where(node, cond, a, b):
    d = _out_dtype(node)
    return pnp.where(_t(cond, _core.DType.bool), _t(a, d), _t(b, d))


@_op("masked_fill.Scalar", "masked_fill.Tensor")
def _masked_fill(node, x, mask, value):
    d = _out_dtype(node)
    return pnp.where(_t(mask, _core.DType.bool), _t(value, d), _t(x, d))


@_op("pow.Tensor_Scalar")
def _pow(node, x, e):
    x = _t(x, _out_dtype(node))
    if float(e) == int(e) and 1 <= int(e) <= 4:  # exact for negative bases, like torch
        y = x
        for _ in range(int(e) - 1):
            y = y * x
        return y
    if e == 0.5:
        return pnp.sqrt(x)
    if e == -0.5:
        return pnp.rsqrt(x)
    if e == -1:
        return 1.0 / x
    return pnp.power(x, float(e))


@_op("pow.Tensor_Tensor")
def _pow_tensor(node, x, e):
    d = _out_dtype(node)
    return pnp.power(_t(x, d), _t(e, d))


@_op("clamp.default")
def _clamp(node, x, lo=None, hi=None):
    x = _t(x, _out_dtype(node))
    if lo is not None:
        x = pnp.maximum(x, float(lo))
    if hi is not None:
        x = pnp.minimum(x, float(hi))
    return x


@_op("gelu.default")
def _gelu(node, x, approximate="none"):
    return F.gelu(_t(x), approximate == "tanh")


@_op("_to_copy.default")
def _to_copy(node, x, **kwargs):
    return _t(x, _out_dtype(node))


@_op("clone.default", "alias.default", "detach.default", "lift_fresh_copy.default", "contiguous.default")
def _identity(node, x, **kwargs):
    return _t(x)


@_op("native_dropout.default", "dropout.default")
def _dropout(node, x, p, train=None):
    if p and train is not False:
        _unsupported(node, f"dropout with p={p} in training mode is random; call model.eval() before "
                           "px.from_torch (or set the dropout probabilities to 0)")
    x = _t(x)
    return (x, pnp.ones(x.shape, _core.DType.bool)) if "native" in str(node.target) else x


@_op("full_like.default", "zeros_like.default", "ones_like.default", "empty_like.default")
def _full_like(node, x, value=0.0, **kwargs):
    if "ones" in str(node.target):
        value = 1.0
    return pnp.full(_shape(node), float(value), _out_dtype(node))


# ---- shapes ------------------------------------------------------------------------------------
@_op("view.default", "_unsafe_view.default", "reshape.default")
def _view(node, x, shape):
    return pnp.reshape(_t(x), _shape(node))


@_op("expand.default")
def _expand(node, x, shape, implicit=False):
    return pnp.broadcast_to(_t(x), _shape(node))


@_op("permute.default")
def _permute(node, x, perm):
    x = _t(x)
    return pnp.transpose(x, [_axis(p, x.ndim) for p in perm])


@_op("transpose.int")
def _transpose(node, x, a, b):
    x = _t(x)
    return pnp.swapaxes(x, _axis(a, x.ndim), _axis(b, x.ndim))


@_op("t.default")
def _t2(node, x):
    return pnp.transpose(_t(x))


@_op("unsqueeze.default")
def _unsqueeze(node, x, dim):
    x = _t(x)
    return pnp.expand_dims(x, _axis(dim, x.ndim + 1))


@_op("squeeze.dim", "squeeze.dims", "squeeze.default")
def _squeeze(node, x, dims=None):
    x = _t(x)
    return pnp.reshape(x, _shape(node)) if list(x.shape) != _shape(node) else x


@_op("slice.Tensor")
def _slice(node, x, dim=0, start=None, end=None, step=1):
    x = _t(x)
    d = _axis(dim, x.ndim)
    start, stop, step = slice(start, end, step).indices(x.shape[d])
    starts, limits, strides = [0] * x.ndim, list(x.shape), [1] * x.ndim
    starts[d], limits[d], strides[d] = start, max(stop, start), step
    return _core.slice(x, starts, limits, strides)


@_op("select.int")
def _select(node, x, dim, index):
    x = _t(x)
    d = _axis(dim, x.ndim)
    i = index + x.shape[d] if index < 0 else index
    return pnp.squeeze(_core.slice_axis(x, d, i, i + 1), d)


@_op("cat.default")
def _cat(node, xs, dim=0):
    d = _out_dtype(node)
    xs = [_t(x, d) for x in xs]
    xs = [x for x in xs if x.size != 0] or xs[:1]  # torch skips empty inputs
    return xs[0] if len(xs) == 1 else pnp.concatenate(xs, _axis(dim, xs[0].ndim))


@_op("split_with_sizes.default", "split.Tensor")
def _split(node, x, sizes, dim=0):
    x = _t(x)
    d = _axis(dim, x.ndim)
    if isinstance(sizes, int):
        n = x.shape[d]
        sizes = [min(sizes, n - i) for i in range(0, n, sizes)]
    return list(_core.split(x, list(sizes), d))


@_op("constant_pad_nd.default")
def _pad(node, x, pad, value=0.0):
    x = _t(x)
    lo, hi = [0] * x.ndim, [0] * x.ndim
    for i in range(len(pad) // 2):
        lo[x.ndim - 1 - i], hi[x.ndim - 1 - i] = pad[2 * i], pad[2 * i + 1]
    if min(lo + hi) < 0:
        _unsupported(node, "constant_pad_nd with a negative pad (cropping) is not supported")
    return _core.pad(x, lo, hi, float(value))


# ---- contractions, reductions, gathers ---------------------------------------------------------
def _matmul(a, b, b_node, transposed):
    """a @ b, contracting b's untransposed source directly when b is permute(w, [1, 0])."""
    src = transposed.get(b_node.name) if hasattr(b_node, "name") else None
    if src is not None:
        return _core.dot_general(a, src, [a.ndim - 1], [1])
    return pnp.matmul(a, _t(b))


@_op("mm.default", "bmm.default")
def _mm(node, a, b, *, _ctx):
    return _matmul(_t(a), b, node.args[1], _ctx.transposed)


@_op("addmm.default")
def _addmm(node, bias, a, b, beta=1, alpha=1, *, _ctx):
    y = _matmul(_t(a), b, node.args[2], _ctx.transposed)
    if alpha != 1:
        y = y * float(alpha)
    bias = _t(bias, y.dtype)
    return y + (bias if beta == 1 else bias * float(beta))


def _reduce(fn):
    def handler(node, x, dims=None, keepdim=False, **kwargs):
        x = _t(x, _out_dtype(node) if node.meta["val"].dtype.is_floating_point else None)
        axes = None if not dims else [_axis(a, x.ndim) for a in dims]
        return fn(x, axes, keepdims=keepdim)

    return handler


_op("sum.dim_IntList", "sum.default")(_reduce(pnp.sum))
_op("mean.dim", "mean.default")(_reduce(pnp.mean))
_op("amax.default")(_reduce(pnp.max))
_op("amin.default")(_reduce(pnp.min))


@_op("_softmax.default")
def _softmax(node, x, dim, half_to_float=False):
    x = _t(x)
    return pnp.softmax(x, _axis(dim, x.ndim))


@_op("_log_softmax.default")
def _log_softmax(node, x, dim, half_to_float=False):
    x = _t(x)
    return pnp.log_softmax(x, _axis(dim, x.ndim))


@_op("embedding.default")
def _embedding(node, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    if scale_grad_by_freq:
        _unsupported(node, "embedding(scale_grad_by_freq=True) is not supported")
    weight = _t(weight)
    span = _constant_range(indices, weight.shape[0])
    if span is not None:  # learned positions: rows start..stop, a slice (its gradient a pad, no scatter)
        rows = pnp.reshape(_core.slice_axis(weight, 0, *span), [*indices.shape, weight.shape[1]])
        return rows
    idx = _t(indices, _core.DType.i32)
    pnp.check_indices(idx, weight.shape[0], "px.from_torch: embedding indices")  # torch raises on these too
    rows = _core.take(weight, idx)
    if padding_idx is not None and padding_idx >= 0:  # the padding row gets no gradient, as in torch
        pad = pnp.broadcast_to(pnp.expand_dims(pnp.equal(idx, int(padding_idx)), idx.ndim), rows.shape)
        rows = pnp.where(pad, _core.stop_gradient(rows), rows)
    return rows


def _constant_range(indices, n):
    """(start, stop) when indices is a torch constant holding start, start + 1, ... (< n)."""
    torch = _torch()
    if not isinstance(indices, torch.Tensor) or indices.numel() == 0 or indices.numel() > n:
        return None
    flat = indices.reshape(-1)
    start = int(flat[0])
    if start < 0 or not torch.equal(flat, torch.arange(start, start + flat.numel(), dtype=flat.dtype)):
        return None
    return start, start + flat.numel()


@_op("index.Tensor")
def _index(node, x, indices):
    used = [i for i, t in enumerate(indices) if t is not None]
    if len(used) != 1:
        _unsupported(node, "index.Tensor with several index tensors (advanced indexing on more than one dim) "
                           "is not supported")
    # torch's x[..., idx, ...] with one index tensor is NumPy's take; out-of-range indices raise in both
    return pnp.take(_t(x), _t(indices[used[0]], _core.DType.i32), axis=used[0], mode="raise")


@_op("native_layer_norm.default")
def _layer_norm(node, x, normalized_shape, weight, bias, eps):
    x = _t(x)
    n = len(normalized_shape)
    lead = list(x.shape[:x.ndim - n])
    flat = x if n == 1 else pnp.reshape(x, lead + [int(np.prod(normalized_shape))])
    dim = flat.shape[-1]
    w = pnp.ones([dim], x.dtype) if weight is None else pnp.reshape(_t(weight), [dim])
    b = None if bias is None else pnp.reshape(_t(bias), [dim])
    out = F.layer_norm(flat, w, b, eps)
    if n > 1:
        out = pnp.reshape(out, list(x.shape))
    needs_stats = any(u.target is operator.getitem and u.args[1] in (1, 2) for u in node.users)
    if not needs_stats:
        return out, None, None
    mean = pnp.mean(flat, -1, keepdims=True)
    rstd = pnp.rsqrt(pnp.mean(pnp.square(flat - mean), -1, keepdims=True) + eps)
    stat_shape = lead + [1] * n
    return out, pnp.reshape(mean, stat_shape), pnp.reshape(rstd, stat_shape)


@_op("scaled_dot_product_attention.default")
def _sdpa(node, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):
    if dropout_p:
        _unsupported(node, f"scaled_dot_product_attention with dropout_p={dropout_p} is random; call "
                           "model.eval() before px.from_torch (or set the attention dropout to 0)")
    q, k, v = _t(q), _t(k), _t(v)
    if q.ndim != 4:
        _unsupported(node, f"scaled_dot_product_attention on rank-{q.ndim} queries (Parallax takes [B, H, S, D])")
    sq, sk = q.shape[2], k.shape[2]
    torch = _torch()
    if is_causal:
        attn_mask = torch.ones(sq, sk, dtype=torch.bool).tril()
    if attn_mask is None:
        return F.dot_product_attention(q, k, v, causal=False, scale=scale)
    if isinstance(attn_mask, torch.Tensor):
        kind, mask = _classify_mask(attn_mask, q.shape[0], q.shape[1], sq, sk)
        if kind is not None:
            return F.dot_product_attention(q, k, v, causal=kind, scale=scale,
                                           key_padding=None if mask is None else pnp.asarray(mask))
        attn_mask = mask
    return _attention(q, k, v, _t(attn_mask), scale)


def _classify_mask(mask, b, h, sq, sk):
    """A constant mask as (causal, key padding or None) for the fused attention, or
    (None, mask) when it is neither: bool (True attends) or an additive float mask."""
    m = mask.detach().cpu()
    if m.is_floating_point():
        vals = m.float()
        if not bool(((vals == 0) | (vals <= -1e30)).all()):
            return None, _numpy_of(m)
        m = vals == 0
    allowed = np.broadcast_to(m.numpy(), (b, h, sq, sk))
    rows, cols = np.arange(sq)[:, None], np.arange(sk)[None, :]
    causal = cols <= rows + (sk - sq)  # queries aligned to the end of the keys, as Parallax does
    pad = allowed[:, 0, -1, :]
    for is_causal, base in ((True, causal), (False, np.ones_like(causal))):
        if np.array_equal(allowed, np.broadcast_to(base, allowed.shape)):
            return is_causal, None
        if np.array_equal(allowed, base[None, None] & pad[:, None, None, :]):
            return is_causal, np.ascontiguousarray(pad)
    return None, np.ascontiguousarray(allowed)


def _attention(q, k, v, mask, scale):
    """softmax(q k^T * scale + mask) v written out, for masks the fused attention has no form for."""
    b, h, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    if hkv != h:  # grouped-query: each key/value head serves h // hkv query heads
        k, v = [pnp.reshape(pnp.broadcast_to(pnp.expand_dims(t, 2), [b, hkv, h // hkv, sk, d]), [b, h, sk, d])
                for t in (k, v)]
    s = _core.dot_general(q, k, [3], [3], [0, 1], [0, 1], _core.DType.f32)
    s = s * float(scale if scale is not None else d ** -0.5)
    if mask.dtype == _core.DType.bool:
        s = pnp.where(pnp.broadcast_to(mask, s.shape), s, -1e30)
    else:
        s = s + pnp.astype(mask, _core.DType.f32)
    p = pnp.astype(pnp.softmax(s, -1), v.dtype)
    return _core.dot_general(p, v, [3], [2], [0, 1], [0, 1])


@_op("_assert_tensor_metadata.default", "_assert_scalar.default", "sym_constrain_range_for_size.default")
def _no_value(node, *args, **kwargs):
    return None


_OPS["<built-in function getitem>"] = lambda node, seq, i: seq[i]


def _defer_transpose(node, x, perm, *, _ctx):
    """permute(w, [1, 0]) that only feeds matmuls: they contract w directly (no transpose op)."""
    _ctx.transposed[node.name] = _t(x)


class _Ctx:
    __slots__ = ("transposed",)

    def __init__(self):
        self.transposed = {}


def _feeds_only_matmuls(node) -> bool:
    rhs = {"aten.mm.default": 1, "aten.addmm.default": 2}
    return bool(node.users) and all(rhs.get(str(u.target)) is not None and u.args[rhs[str(u.target)]] is node
                                    and list(u.args).count(node) == 1 for u in node.users)


# ---- decomposed activations, recognized -------------------------------------------------------
def _call(node, *targets):
    return getattr(node, "op", None) == "call_function" and str(node.target) in targets


def _scaled(node, x, value) -> bool:
    """node is x * value (either order), value a number within 1e-6."""
    if not _call(node, "aten.mul.Tensor", "aten.mul.Scalar") or len(node.args) != 2:
        return False
    a, b = node.args
    return any(p is x and isinstance(q, (int, float)) and abs(q - value) <= 1e-6 * abs(value)
               for p, q in ((a, b), (b, a)))


def _other(node, known):
    """The operand of a binary node that is not `known` (None when neither is)."""
    a, b = node.args[0], node.args[1]
    return b if a is known else a if b is known else None


def _match_gelu_tanh(node):
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as GPT-2's gelu_new decomposes: returns x."""
    if not _call(node, "aten.mul.Tensor") or len(node.args) != 2:
        return None
    for half, one_plus in (node.args, node.args[::-1]):
        if not (_call(half, "aten.mul.Tensor") and _call(one_plus, "aten.add.Tensor")):
            continue
        x = half.args[0] if _scaled(half, half.args[0], 0.5) else half.args[1]
        th = one_plus.args[0] if one_plus.args[1] == 1.0 else one_plus.args[1]
        if not (_scaled(half, x, 0.5) and 1.0 in one_plus.args and _call(th, "aten.tanh.default")):
            continue
        inner = th.args[0]
        if not _call(inner, "aten.mul.Tensor"):
            continue
        total = next((a for a in inner.args if _call(a, "aten.add.Tensor")), None)
        if total is None or not _scaled(inner, total, 0.7978845608028654) or len(total.args) != 2:
            continue
        cubic = _other(total, x)
        cube = next((a for a in getattr(cubic, "args", ()) if _call(a, "aten.pow.Tensor_Scalar")), None)
        if cube is not None and _scaled(cubic, cube, 0.044715) and cube.args[0] is x and cube.args[1] == 3:
            return x
    return None


def _match_silu(node):
    """x * sigmoid(x) (silu as it decomposes): returns x."""
    if not _call(node, "aten.mul.Tensor") or len(node.args) != 2:
        return None
    for x, sig in (node.args, node.args[::-1]):
        if _call(sig, "aten.sigmoid.default") and sig.args[0] is x:
            return x
    return None


_FUSED = ((lambda node, x: F.gelu(_t(x), True), _match_gelu_tanh), (lambda node, x: F.silu(_t(x)), _match_silu))


# ---- projections and reshape chains, written as px.nn writes them -----------------------------
# torch's Linear and GPT-2's Conv1D on x [B, S, d] export as view(x, [B*S, d]) -> addmm -> view to
# [B, S, n]. Replayed op for op, the reshapes around every matmul cost copy kernels that px.nn's
# x @ w does not have (two reshapes in a row compile to a copy, and so does a reshape fused next to
# the unreshaped value, as the residual stream's gradient is). So a projection runs as x @ w on x's
# own leading dims, a chain of reshapes as one reshape, and GPT-2's fused q/k/v projection
# (split(x @ w + b) into three) as three projections on columns of w, as px.nn's attention has
# them: their gradients pad [d, d] weight pieces instead of [B*S, d] activation pieces.
_RESHAPES = ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.unsqueeze.default",
             "aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default")
_PASS_THROUGH = _RESHAPES + ("aten.clone.default", "aten.alias.default", "aten.contiguous.default")


def _reshape_root(x, consts):
    """The value a chain of reshapes (and value-preserving copies) ending at x starts from."""
    while _call(x, *_PASS_THROUGH) and x.name not in consts:
        x = x.args[0]
    return x


def _dims(n) -> list[int]:
    return [int(s) for s in n.meta["val"].shape]


def _reshaped(node, x):
    return pnp.reshape(_t(x), _shape(node))


def _matmul_parts(mm):
    """(bias or None, a, w) of mm(a, w) or addmm(bias, a, w) with alpha = beta = 1 and a bias of
    one dim, else None."""
    if not _call(mm, "aten.addmm.default", "aten.mm.default") or mm.kwargs:
        return None
    if str(mm.target) == "aten.mm.default":
        return (None, *mm.args) if len(mm.args) == 2 else None
    bias = mm.args[0]
    if len(mm.args) != 3 or not hasattr(bias, "meta") or len(_dims(bias)) != 1:
        return None
    return tuple(mm.args)


def _projection(node, consts):
    """(bias, x, w, shape) when node is view(addmm(bias, view(x), w)) that flattens leading dims for
    the matmul and restores them after (the matmul used only there): x reshaped to shape (its
    leading dims, the contracted dim; often x's own shape) is what w multiplies. Else None."""
    mm = node.args[0]
    parts = _matmul_parts(mm)
    if parts is None or len(mm.users) != 1 or not _call(parts[1], *_RESHAPES) or parts[1].name in consts:
        return None
    x = _reshape_root(parts[1], consts)
    out = _dims(node)
    if not hasattr(x, "meta") or len(out) < 2 or out[-1] != _dims(mm)[-1]:
        return None
    return parts[0], x, parts[2], out[:-1] + [_dims(parts[1])[-1]]


def _split_projection(node, consts):
    """(bias, x, w, shape, sizes, piece dims) when node splits the last dim of a projection (as
    _projection finds it) that nothing else uses: GPT-2's q/k/v. A piece whose one use reshapes its
    last dim into heads [H, hd] gets those dims (the weight's columns are reshaped instead: the
    activation is never reshaped); else None in its place. None when node is no such split."""
    if not _call(node, "aten.split_with_sizes.default", "aten.split.Tensor"):
        return None
    src, sizes = node.args[0], node.args[1]
    dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
    lead = _dims(src)[:-1]
    if not _call(src, *_RESHAPES) or len(src.users) != 1 or _axis(dim, len(lead) + 1) != len(lead):
        return None
    proj = _projection(src, consts)
    if proj is None:
        return None
    total = _dims(src)[-1]
    if isinstance(sizes, int):
        sizes = [min(sizes, total - i) for i in range(0, total, sizes)]
    sizes = [int(s) for s in sizes]
    dims = [None] * len(sizes)
    for item in node.users:
        uses = list(item.users)
        if item.target is operator.getitem and len(uses) == 1 and _call(uses[0], *_RESHAPES):
            out = _dims(uses[0])
            if out[:len(lead)] == lead and len(out) > len(lead) and int(np.prod(out[len(lead):])) == sizes[item.args[1]]:
                dims[item.args[1]] = out[len(lead):]
    return (*proj, sizes, dims)


def _project(node, bias, x, w, *, shape, w_name, pieces=None, piece_dims=None, _ctx):
    """reshape(x, shape) @ w + bias contracting its last dim (w may be a deferred transpose: then
    its source), or with pieces (split sizes) the list of x @ w[:, piece] + bias[piece], each with
    its columns as piece_dims (e.g. [H, hd]) where given."""
    x, src = pnp.reshape(_t(x), shape), _ctx.transposed.get(w_name)
    k = x.ndim - 1

    def one(start=None, stop=None, dims=None):
        cut = (lambda t, axis: t) if start is None else (lambda t, axis: _core.slice_axis(t, axis, start, stop))
        if src is not None:  # [n, K]: rows are the output's columns
            ws = cut(src, 0)
            if dims:
                ws = pnp.reshape(ws, [*dims, ws.shape[1]])
            y = _core.dot_general(x, ws, [k], [ws.ndim - 1])
        else:  # [K, n]
            ws = cut(_t(w), 1)
            y = pnp.matmul(x, ws) if not dims else _core.dot_general(x, pnp.reshape(ws, [ws.shape[0], *dims]), [k], [0])
        if bias is None:
            return y
        b = cut(_t(bias, y.dtype), 0)
        return y + (pnp.reshape(b, dims) if dims else b)

    if pieces is None:
        return one()
    out, start = [], 0
    for size, dims in zip(pieces, piece_dims or [None] * len(pieces)):
        out.append(one(start, start + size, dims))
        start += size
    return out


_NEEDS_CTX = (_mm, _addmm, _defer_transpose, _project)


# ---- the program: the exported graph, its constant part evaluated ------------------------------
class _Program:
    """What a TorchModule replays: the exported graph's steps, with every op whose inputs are all
    constants evaluated once here by torch (masks, position ids, rotary tables)."""

    def __init__(self, ep, canonical: dict[str, str], what: str):
        torch = _torch()
        from torch.export.graph_signature import InputKind, OutputKind, TensorArgument

        self.what = what
        self.consts: dict = {}  # node name -> a torch value
        self.params: dict[str, str] = {}  # placeholder -> param path
        self.inputs: list = []  # (placeholder, px dtype, shape) of the tensor inputs, in call order
        for spec in ep.graph_signature.input_specs:
            name = spec.arg.name
            if spec.kind == InputKind.PARAMETER:
                self.params[name] = canonical[spec.target]
            elif spec.kind in (InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                store = ep.state_dict if spec.target in ep.state_dict else ep.constants
                self.consts[name] = store[spec.target]
            elif spec.kind == InputKind.USER_INPUT and isinstance(spec.arg, TensorArgument):
                val = next(n for n in ep.graph.nodes if n.name == name).meta["val"]
                self.inputs.append((name, _dtype_of(val.dtype), [int(s) for s in val.shape]))
            elif spec.kind == InputKind.USER_INPUT:
                self.consts[name] = getattr(spec.arg, "value", None)
            else:
                raise UserError(f"px.from_torch: {what} takes an input of kind {spec.kind.name} ('{spec.target}'), "
                                "which Parallax does not support")
        for spec in ep.graph_signature.output_specs:
            if spec.kind != OutputKind.USER_OUTPUT:
                raise UserError(f"px.from_torch: {what}'s forward writes to '{spec.target}' ({spec.kind.name}): "
                                "Parallax programs are pure; compute the new state outside the model")
        self.steps = []  # (node, handler, args, kwargs): args and kwargs hold fx Nodes
        with torch.no_grad():
            for node in ep.graph.nodes:
                if node.op == "call_function":
                    self._add(node)
                elif node.op == "output":
                    self.outputs = list(node.args[0])
        self._drop_dead_steps()

    def _add(self, node):
        torch = _torch()
        random = torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ())
        if not random and all(n.name in self.consts for n in node.all_input_nodes):
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: self.consts[n.name])
            self.consts[node.name] = node.target(*args, **kwargs)
            return
        name = str(node.target)
        handler = _OPS.get(name)
        if handler is None:
            _unsupported(node, f"the ATen op {name} is not supported")
        if name == "aten.permute.default" and list(node.args[1]) == [1, 0] and _feeds_only_matmuls(node):
            handler = _defer_transpose
        for fused, match in _FUSED:
            x = match(node)
            if x is not None:  # one fused op for the decomposed activation: its inner ops go dead
                self.steps.append((node, fused, (x,), {}))
                return
        rewritten = self._projection_step(node) if name in _RESHAPES or "split" in name else None
        if rewritten is not None:
            self.steps.append(rewritten)
            return
        if name in _RESHAPES:  # one reshape for the chain: its inner reshapes go dead
            self.steps.append((node, _reshaped, (_reshape_root(node.args[0], self.consts),), {}))
            return
        self.steps.append((node, handler, node.args, node.kwargs))

    def _projection_step(self, node):
        """The step of a projection on x's own leading dims (or of its split into pieces), whose
        reshapes and whole-width matmul go dead; None where node is neither."""
        found = _split_projection(node, self.consts)
        if found is not None:
            bias, x, w, shape, sizes, dims = found
            return node, _project, (bias, x, w), {"shape": shape, "w_name": getattr(w, "name", None),
                                                   "pieces": sizes, "piece_dims": dims}
        found = None if "split" in str(node.target) else _projection(node, self.consts)
        if found is None:
            return None
        bias, x, w, shape = found
        return node, _project, (bias, x, w), {"shape": shape, "w_name": getattr(w, "name", None)}

    def _drop_dead_steps(self):
        """Steps no output depends on (the insides of fused activations) are not replayed."""
        torch = _torch()
        live = {o.name for o in self.outputs if isinstance(o, torch.fx.Node)}
        kept = []
        for step in reversed(self.steps):
            if step[0].name in live:
                kept.append(step)
                torch.fx.node.map_arg((step[2], step[3]), lambda n: live.add(n.name))
        self.steps = kept[::-1]

    def run(self, params: dict, inputs: list):
        """The outputs (a Tensor, or a tuple of them) for param and input Tensors."""
        torch = _torch()
        env = {name: params[path] for name, path in self.params.items()}
        env.update((spec[0], x) for spec, x in zip(self.inputs, inputs))

        def value(n):
            return env[n.name] if n.name in env else self.consts[n.name]

        ctx = _Ctx()
        for node, handler, node_args, node_kwargs in self.steps:
            args, kwargs = torch.fx.node.map_arg((node_args, node_kwargs), value)
            kwargs = dict(kwargs)
            if handler in _NEEDS_CTX:
                kwargs["_ctx"] = ctx
            try:
                env[node.name] = handler(node, *args, **kwargs)
            except UserError:
                raise
            except Exception as e:  # a px.Error from an op: say which torch op and where
                raise UserError(f"px.from_torch: {node.target} failed: {e}\nat:\n{_origin(node)}") from e
        outs = [_t(value(o)) if isinstance(o, torch.fx.Node) else _t(o) for o in self.outputs]
        return outs[0] if len(outs) == 1 else tuple(outs)

    def bind(self, args, kwargs) -> list:
        """The call's inputs in order, checked against the exported signature."""
        names = [n for n, _, _ in self.inputs]
        if len(args) > len(names) or set(kwargs) - set(names):
            raise UserError(f"px.from_torch module: takes the inputs ({', '.join(names)}); got {len(args)} "
                            f"positional and {sorted(kwargs)}")
        given = dict(zip(names, args))
        for k, v in kwargs.items():
            if k in given:
                raise UserError(f"px.from_torch module: input '{k}' given twice")
            given[k] = v
        missing = [n for n in names if n not in given]
        if missing:
            raise UserError(f"px.from_torch module: missing inputs {missing} (it takes {names})")
        out = []
        for name, dt, shape in self.inputs:
            x = given[name]
            if not isinstance(x, Tensor):
                x = _input_array(x, dt)
            if list(x.shape) != shape or x.dtype != dt:
                raise UserError(f"px.from_torch module: input '{name}' is {_type_text(x.dtype, x.shape)}, but "
                                f"{self.what} was exported for {_type_text(dt, shape)}; torch.export "
                                "fixes the shapes: call px.from_torch with example inputs of the shapes you use")
            out.append(x)
        return out


def _type_text(dt, shape) -> str:
    return f"{_core.dtype_name(dt)}[{','.join(map(str, shape))}]"


def _input_array(x, dt) -> Array:
    """An eager input as a px.Array: torch tensors and int64 arrays are converted (int64 -> int32)."""
    torch = _torch()
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    if isinstance(x, np.ndarray) and x.dtype != numpy_dtype(dt):
        x = x.astype(numpy_dtype(dt))
    return asarray(x)


class TorchModule(Module):
    """A PyTorch module as a px.nn.Module (made by px.from_torch): its params are the torch
    parameters under their torch paths ("transformer.h.0.attn.c_attn.weight"), nested as dicts,
    and calling it replays the exported graph with Parallax ops. Called with arrays (outside a
    trace) it compiles itself with px.jit; `graph` is the forward as a px.Graph; `input_names`
    are the exported tensor inputs, positional in that order or by name."""

    def __init__(self, program: _Program, params: dict):
        tree: dict = {}
        for path, a in params.items():
            *parents, leaf = path.split(".")
            node = tree
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = a
        for k, v in tree.items():
            if hasattr(TorchModule, k) or k.startswith("_px_"):
                raise UserError(f"px.from_torch: the torch attribute '{k}' collides with a px.nn.Module attribute; "
                                "rename it in the torch model")
            setattr(self, k, v)
        self._px_program = program

    @property
    def input_names(self) -> list[str]:
        return [n for n, _, _ in self._px_program.inputs]

    def __call__(self, *args, **kwargs):
        prog = self._px_program
        params = self.named_parameters()
        xs = prog.bind(args, kwargs)
        if any(isinstance(x, Tensor) for x in [*xs, *params.values()]):
            return prog.run(params, xs)
        if getattr(prog, "jitted", None) is None:
            from ._transforms import jit

            prog.jitted = jit(lambda m, *inputs: m(*inputs))
        return prog.jitted(self, *xs)

    @property
    def graph(self):
        """The forward as a px.Graph whose inputs are the params (in named_parameters() order),
        then the tensor inputs."""
        prog = self._px_program
        params = self.named_parameters()
        types = [(asarray(p).dtype, list(p.shape)) for p in params.values()] + [(d, s) for _, d, s in prog.inputs]

        def body(tensors):
            out = prog.run(dict(zip(params, tensors)), tensors[len(params):])
            return list(out) if isinstance(out, tuple) else [out]

        return _core.trace(body, types, list(params) + self.input_names)


def _param_array(p) -> Array:
    """A torch parameter as a px.Array over the same memory where it can be (contiguous, a
    Parallax dtype), else a converted copy."""
    torch = _torch()
    t = p.detach()
    if t.dtype == torch.float64:
        t = t.float()
    if not t.is_contiguous():
        t = t.contiguous()
    return asarray(t)


def from_torch(module, args=(), kwargs=None) -> TorchModule:
    """A torch.nn.Module as a px.nn.Module, through torch.export for the example inputs
    (args, kwargs: their shapes and dtypes become the module's; non-tensor kwargs such as
    use_cache=False are fixed). Ops Parallax lacks raise px.UserError naming the op and the line
    of the model's code it comes from."""
    torch = _torch()
    if not isinstance(module, torch.nn.Module):
        raise UserError(f"px.from_torch: expected a torch.nn.Module, got {type(module).__name__}")
    args = tuple(args) if isinstance(args, (tuple, list)) else (args,)
    what = type(module).__name__
    try:
        ep = torch.export.export(module, args, kwargs=dict(kwargs or {}))
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise UserError(f"px.from_torch: torch.export could not capture {what}: {type(e).__name__}: {first}") from e
    table = torch.export.default_decompositions()
    table.pop(torch.ops.aten.scaled_dot_product_attention.default, None)  # kept whole: fused attention
    ep = ep.run_decompositions(table)
    canonical: dict[str, str] = {}
    first_name: dict[int, str] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        canonical[name] = first_name.setdefault(id(p), name)
    program = _Program(ep, canonical, what)
    named = dict(module.named_parameters())
    used = sorted(set(program.params.values()), key=list(named).index)
    pm = TorchModule(program, {path: _param_array(named[path]) for path in used})
    pm.graph  # traces once: an op Parallax cannot take fails here, not at the first call
    return pm
