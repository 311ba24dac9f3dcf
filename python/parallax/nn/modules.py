"""px.nn.Module: models as plain Python objects whose array attributes are their params.

In the style of Equinox / Flax NNX: a Module is a pytree. Its children are the attributes that
hold arrays (px.Array, NumPy), Tensors, Modules, or lists / tuples / dicts of them; every other
attribute (sizes, flags) is static and part of the tree's structure. So a Module passes through
px.jit and px.grad like any tree (the gradient of a Module is a Module of gradients), and while
tracing its params are Tensors. Param paths follow the attributes: "blocks.0.attn.wq"."""

from __future__ import annotations

import contextlib
import math

import numpy as np

from .. import _core
from .. import numpy as pnp
from .._array import Array, asarray
from .._core import Tensor, UserError
from .._tree import register_pytree_node, tree_flatten, tree_unflatten
from . import functional as F


def _is_dynamic(v) -> bool:
    if isinstance(v, (Array, Tensor, np.ndarray, Module, Deferred)):
        return True
    if isinstance(v, (list, tuple)):
        return len(v) > 0 and all(_is_dynamic(x) or x is None for x in v) and any(x is not None for x in v)
    if isinstance(v, dict):
        return len(v) > 0 and all(_is_dynamic(x) for x in v.values())
    return False


class _Static:
    """A static attribute's value as part of a tree structure (hashable by repr when it is not)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def _key(self):
        try:
            hash(self.value)
            return self.value
        except TypeError:
            return repr(self.value)

    def __eq__(self, other):
        return isinstance(other, _Static) and type(self.value) is type(other.value) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())


class Module:
    """Base of models: assign params (arrays) and sub-modules as attributes in __init__, and
    define __call__ with px.numpy ops."""

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        register_pytree_node(cls, _flatten_module, lambda aux, ch, cls=cls: _unflatten_module(cls, aux, ch))

    def _children(self):
        names = sorted(k for k, v in vars(self).items() if _is_dynamic(v))
        static = tuple((k, _Static(v)) for k, v in sorted(vars(self).items()) if k not in names)
        return names, static

    def named_parameters(self, prefix: str = "") -> dict:
        """{path: array} for every param (arrays under this module), in tree order."""
        out = {}

        def walk(v, path):
            if isinstance(v, Module):
                for k in v._children()[0]:
                    walk(getattr(v, k), f"{path}.{k}" if path else k)
            elif isinstance(v, (list, tuple)):
                for i, x in enumerate(v):
                    if x is not None:
                        walk(x, f"{path}.{i}")
            elif isinstance(v, dict):
                for k in sorted(v):
                    walk(v[k], f"{path}.{k}")
            else:
                out[path] = v

        walk(self, prefix)
        walk = None  # the recursive closure is a cycle that would keep `out` (every param) until gc runs
        return out

    def parameters(self) -> list:
        return list(self.named_parameters().values())

    def param_count(self) -> int:
        return sum(int(np.prod(p.shape)) for p in self.parameters())

    def load_state_dict(self, values: dict, strict: bool = True):
        """Replaces params by path (values: {path: array}); returns self."""
        mine = self.named_parameters()
        if strict:
            missing = sorted(set(mine) - set(values))
            extra = sorted(set(values) - set(mine))
            if missing or extra:
                raise UserError(f"load_state_dict: missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
                                f"unexpected {extra[:5]}{'...' if len(extra) > 5 else ''}")
        leaves, treedef = tree_flatten(self)
        paths = list(mine)
        new = []
        for path, old in zip(paths, leaves):
            if path in values:
                v = asarray(values[path])
                if tuple(v.shape) != tuple(old.shape):
                    raise UserError(f"load_state_dict: '{path}' has shape {tuple(old.shape)}, got {tuple(v.shape)}")
                new.append(v)
            else:
                new.append(old)
        self.__dict__.update(vars(tree_unflatten(treedef, new)))
        return self

    def state_dict(self) -> dict:
        return {k: asarray(v) for k, v in self.named_parameters().items()}


def _flatten_module(m: Module):
    names, static = m._children()
    return [getattr(m, k) for k in names], (tuple(names), static)


def _unflatten_module(cls, aux, children):
    names, static = aux
    m = object.__new__(cls)
    for k, s in static:
        object.__setattr__(m, k, s.value)
    for k, c in zip(names, children):
        object.__setattr__(m, k, c)
    return m


# Every Module subclass registers itself as a pytree node (Module.__init_subclass__).
register_pytree_node(Module, _flatten_module, lambda aux, ch: _unflatten_module(Module, aux, ch))


# ---- initializers (NumPy, seeded; or deferred) --------------------------------------------------
class Deferred:
    """A param of a model built by a px.create_sharded_model factory: its shape, dtype and
    initializer (a px.nn.Init), without values. The TrainStep draws each shard on the device that
    holds it when it initializes (px::nn::init_box), so the whole param never exists."""

    __slots__ = ("shape", "dtype", "init")

    def __init__(self, shape, init, dtype=_core.DType.f32):
        self.shape, self.init, self.dtype = tuple(int(d) for d in shape), init, dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __array__(self, *args, **kwargs):
        raise UserError(f"{self!r} has no values: a create_sharded_model factory's params are drawn on their "
                        "devices by step.init(); make params with px.nn's initializers there, or pass a built model")

    def __repr__(self):
        return f"Deferred({_core.dtype_name(self.dtype)}[{','.join(map(str, self.shape))}], {self.init!r})"


_deferring = []  # non-empty while a create_sharded_model factory runs


@contextlib.contextmanager
def deferred_params():
    """While active, px.nn's initializers (normal, lecun_normal, zeros, ones) give Deferred params."""
    _deferring.append(True)
    try:
        yield
    finally:
        _deferring.pop()


def _rng(seed):
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def normal(seed, shape, std):
    if _deferring:
        return Deferred(shape, _core.Init.normal(std))
    return asarray((_rng(seed).standard_normal(shape) * std).astype(np.float32))


def lecun_normal(seed, shape):
    if _deferring:
        init = _core.Init.normal(1.0)
        init.fan_in_scaled = True  # 1/sqrt(prod(shape[:-1])), as below
        return Deferred(shape, init)
    fan_in = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    return normal(seed, shape, 1.0 / math.sqrt(fan_in))


def zeros(n):
    return Deferred((n,), _core.Init.zeros()) if _deferring else asarray(np.zeros(n, np.float32))


def ones(n):
    return Deferred((n,), _core.Init.ones()) if _deferring else asarray(np.ones(n, np.float32))


# ---- layers ------------------------------------------------------------------------------------------
class Linear(Module):
    """y = x @ w + b with w [in, out] and b [out] (px::nn::Linear's params and ops)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, seed=0, std=None):
        shape = (in_features, out_features)
        self.w = lecun_normal(seed, shape) if std is None else normal(seed, shape, std)
        self.b = zeros(out_features) if bias else None

    def __call__(self, x):
        y = pnp.matmul(x, self.w)
        return y + self.b if self.b is not None else y


class Embedding(Module):
    """A table [vocab, dim]: int32 tokens -> rows; attend() maps features back to vocabulary logits."""

    def __init__(self, vocab: int, dim: int, *, seed=0, std=0.02):
        self.table = normal(seed, (vocab, dim), std)

    def __call__(self, tokens):
        # Token ids outside [0, vocab) are an error: after a px.jit call, or at a TrainStep's batch.
        pnp.check_indices(tokens, self.table.shape[0], "px.nn.Embedding: token ids")
        return _core.take(pnp.asarray(self.table), pnp.asarray(tokens))

    def attend(self, x):
        x = pnp.asarray(x)
        return _core.dot_general(x, pnp.asarray(self.table), [x.ndim - 1], [1])


class LayerNorm(Module):
    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True):
        self.scale = ones(dim)
        self.bias = zeros(dim) if bias else None
        self.eps = eps

    def __call__(self, x):
        return F.layer_norm(x, self.scale, self.bias, self.eps)


class RMSNorm(Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        self.scale = ones(dim)
        self.eps = eps

    def __call__(self, x):
        return F.rms_norm(x, self.scale, self.eps)


class Mlp(Module):
    """proj(gelu(fc(x)))."""

    def __init__(self, dim: int, hidden: int, bias: bool = True, *, seed=0):
        rng = _rng(seed)
        self.fc = Linear(dim, hidden, bias, seed=rng)
        self.proj = Linear(hidden, dim, bias, seed=rng)

    def __call__(self, x):
        return self.proj(F.gelu(self.fc(x)))


class SwiGlu(Module):
    """down(silu(gate(x)) * up(x)) (Llama's feed-forward)."""

    def __init__(self, dim: int, hidden: int, bias: bool = False, *, seed=0):
        rng = _rng(seed)
        self.gate = Linear(dim, hidden, bias, seed=rng)
        self.up = Linear(dim, hidden, bias, seed=rng)
        self.down = Linear(hidden, dim, bias, seed=rng)

    def __call__(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class CausalSelfAttention(Module):
    """Causal multi-head (grouped-query when n_kv_heads < n_heads) self-attention on x [B, S, d],
    with rotary positions when rope is set. Params wq [d, H*hd], wk and wv [d, Hkv*hd],
    wo [H*hd, d], with bias bq, bk, bv, bo."""

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None, bias: bool = False, *,
                 rope: bool = False, rope_theta: float = 10000.0, seed=0):
        if d_model % n_heads:
            raise UserError(f"CausalSelfAttention: d_model {d_model} does not divide into {n_heads} heads")
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads or n_heads
        self.rope_theta = rope_theta if rope else None
        self.head_dim = d_model // n_heads
        rng = _rng(seed)
        hq, hkv = n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        self.wq = lecun_normal(rng, (d_model, hq))
        self.wk = lecun_normal(rng, (d_model, hkv))
        self.wv = lecun_normal(rng, (d_model, hkv))
        self.wo = lecun_normal(rng, (hq, d_model))
        self.bq, self.bk, self.bv, self.bo = (zeros(hq), zeros(hkv), zeros(hkv), zeros(d_model)) if bias else \
            (None, None, None, None)

    def _heads(self, x, w, b, n):
        y = pnp.matmul(x, w)
        if b is not None:
            y = y + b
        return pnp.transpose(pnp.reshape(y, (x.shape[0], x.shape[1], n, self.head_dim)), (0, 2, 1, 3))

    def __call__(self, x):
        batch, seq = x.shape[0], x.shape[1]
        q = self._heads(x, self.wq, self.bq, self.n_heads)
        k = self._heads(x, self.wk, self.bk, self.n_kv_heads)
        v = self._heads(x, self.wv, self.bv, self.n_kv_heads)
        if self.rope_theta is not None:
            q, k = F.apply_rope(q, self.rope_theta), F.apply_rope(k, self.rope_theta)
        o = F.dot_product_attention(q, k, v, causal=True)
        o = pnp.reshape(pnp.transpose(o, (0, 2, 1, 3)), (batch, seq, self.n_heads * self.head_dim))
        y = pnp.matmul(o, self.wo)
        return y + self.bo if self.bo is not None else y


def tag(x, name: str):
    """Names a value (remat policies save or recompute by name; layers end at "layer_input")."""
    return _core.tag(pnp.asarray(x), name)
