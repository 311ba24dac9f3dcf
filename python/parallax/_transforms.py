"""px.jit, px.grad, px.value_and_grad, px.vjp: tracing Python functions of symbolic Tensors.

A transformed function called with Tensors (inside another trace) emits its ops into that trace;
called with arrays, it is traced once per input signature (tree structure, dtypes and shapes),
compiled, and the compiled px::Executable runs."""

from __future__ import annotations

import functools

import numpy as np

from . import _core
from ._array import Array, asarray
from ._core import Tensor, UserError
from ._tree import tree_flatten, tree_unflatten


def _is_tracing(leaves) -> bool:
    return any(isinstance(x, Tensor) for x in leaves)


def _as_output(x, where: str) -> Tensor:
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (Array, np.ndarray, int, float, bool, np.generic)):
        return _core.constant(asarray(x))
    raise UserError(f"{where}: a traced function must return Tensors (or trees of them), got {type(x).__name__}")


# The run-time checks of the px.jit traces in progress (innermost last): a list of (count,
# message) pairs, or None for a jit made with check_indices=False.
_checks: list = []


def checking() -> bool:
    """Whether the trace in progress is px.jit's with run-time checks (see runtime_check)."""
    return bool(_checks) and _checks[-1] is not None


def runtime_check(count: Tensor, message: str) -> None:
    """Inside px.jit's trace: after the compiled program runs, px.UserError(message.format(count=n))
    when the int32 scalar `count` is n != 0 (values only known at run time: labels, indices).
    Elsewhere a no-op (px.TrainStep checks its batch's indices at its boundary)."""
    if checking():
        _checks[-1].append((count, message))


def _raise_failed(checks, outs):
    """outs without the check counts at their end; raises the first failed check's message."""
    n = len(checks)
    for (_, message), count in zip(checks, outs[len(outs) - n:]):
        found = int(count.numpy())
        if found:
            raise UserError(message.format(count=found))
    return outs[:len(outs) - n]


def _sig_text(sig) -> str:
    return "(" + ", ".join(f"{_core.dtype_name(d)}[{','.join(map(str, s))}]" for d, s in sig) + ")"


class _Compiled:
    __slots__ = ("graph", "exe", "out_tree", "checks")

    def __init__(self, graph, exe, out_tree, checks):
        self.graph, self.exe, self.out_tree, self.checks = graph, exe, out_tree, checks


class jit:
    """Traces fn once per input signature and runs the compiled program.

    Arguments are arrays (px.Array, NumPy, DLPack, Python numbers) or trees of them (tuples,
    lists, dicts, px.nn.Module). `max_traces` (default: unlimited) caps the signatures: a call
    with a new one past the cap raises px.UserError naming the signatures. `cache_size()` and
    `trace_count` show the retracing. `check_indices` (default True): labels, token ids and
    take(mode="raise") indices out of range raise px.UserError after the call (one count per
    checked op is an extra output); False leaves the graph exactly the ops fn emits."""

    def __init__(self, fn, *, max_traces: int | None = None, compile_options=None, check_indices: bool = True):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.max_traces = max_traces
        self.check_indices = check_indices
        self.compile_options = compile_options if compile_options is not None else _core.CompileOptions()
        self.trace_count = 0
        self._cache: dict = {}

    def __get__(self, obj, objtype=None):  # used as a method: bind like a function
        return self if obj is None else functools.partial(self, obj)

    def cache_size(self) -> int:
        return len(self._cache)

    def _signature(self, args):
        leaves, treedef = tree_flatten(args)
        arrays = [asarray(x) for x in leaves]
        sig = tuple((a.dtype, tuple(a.shape)) for a in arrays)
        return arrays, treedef, sig

    def _compile(self, treedef, sig) -> _Compiled:
        if self.max_traces is not None and len(self._cache) >= self.max_traces:
            seen = "; ".join(_sig_text(k[1]) for k in self._cache)
            raise UserError(f"px.jit({getattr(self.fn, '__name__', 'fn')}): new input signature {_sig_text(sig)} "
                            f"(traced for: {seen}) and max_traces={self.max_traces}")
        out_tree, checks = [], []

        def body(tensors):
            _checks.append(checks if self.check_indices else None)
            try:
                out = self.fn(*tree_unflatten(treedef, tensors))
            finally:
                _checks.pop()
            flat, tree = tree_flatten(out)
            out_tree.append(tree)
            return [_as_output(x, "px.jit") for x in flat] + [count for count, _ in checks]

        graph = _core.trace(body, [(d, list(s)) for d, s in sig])
        self.trace_count += 1
        exe = _core.Executable.compile(graph, self.compile_options)
        return _Compiled(graph, exe, out_tree[0], checks)

    def _entry(self, args):
        arrays, treedef, sig = self._signature(args)
        key = (treedef, sig)
        entry = self._cache.get(key)
        if entry is None:
            entry = self._compile(treedef, sig)
            self._cache[key] = entry
        return entry, arrays

    def __call__(self, *args):
        if _is_tracing(tree_flatten(args)[0]):
            return self.fn(*args)
        entry, arrays = self._entry(args)
        outs = entry.exe.run(arrays)
        return tree_unflatten(entry.out_tree, _raise_failed(entry.checks, outs) if entry.checks else outs)

    def lower(self, *args) -> _core.Graph:
        """The traced Graph for these arguments (traced and compiled if new)."""
        return self._entry(args)[0].graph

    def executable(self, *args) -> _core.Executable:
        return self._entry(args)[0].exe


def _eager(transformed):
    """Makes `transformed` (which needs Tensors) callable on arrays through a private jit."""
    compiled = jit(transformed)

    @functools.wraps(transformed)
    def call(*args):
        if _is_tracing(tree_flatten(args)[0]):
            return transformed(*args)
        return compiled(*args)

    call.jit = compiled
    return call


def _norm_argnums(argnums, nargs):
    many = not isinstance(argnums, int)
    nums = tuple(argnums) if many else (argnums,)
    for a in nums:
        if not -nargs <= a < nargs:
            raise UserError(f"px.grad: argnums {argnums} out of range for {nargs} arguments")
    return tuple(a % nargs for a in nums), many


def _value_and_grad_traced(fn, argnums, has_aux, args):
    nums, many = _norm_argnums(argnums, len(args))
    out = fn(*args)
    if has_aux:
        if not (isinstance(out, tuple) and len(out) == 2):
            raise UserError("px.grad(has_aux=True): the function must return (value, aux)")
        value, aux = out
    else:
        value, aux = out, None
    if not isinstance(value, Tensor) or value.ndim != 0:
        what = f"Tensor of shape {value.shape}" if isinstance(value, Tensor) else type(value).__name__
        raise UserError(f"px.grad: the function must return a scalar Tensor to differentiate, got {what}")
    wrt_leaves, wrt_trees = [], []
    for a in nums:
        leaves, tree = tree_flatten(args[a])
        wrt_leaves.append(leaves)
        wrt_trees.append(tree)
    flat = [x for leaves in wrt_leaves for x in leaves]
    for x in flat:
        if not isinstance(x, Tensor):
            raise UserError(f"px.grad: can only differentiate with respect to Tensors, got {type(x).__name__}")
    grads = _core.gradients([value], flat)
    out_grads, i = [], 0
    for leaves, tree in zip(wrt_leaves, wrt_trees):
        out_grads.append(tree_unflatten(tree, grads[i:i + len(leaves)]))
        i += len(leaves)
    g = tuple(out_grads) if many else out_grads[0]
    return ((value, aux) if has_aux else value), g


def value_and_grad(fn, argnums=0, has_aux=False):
    """fn's value and its gradient with respect to args[argnums] (trees of Tensors allowed)."""
    return _eager(functools.wraps(fn)(lambda *args: _value_and_grad_traced(fn, argnums, has_aux, args)))


def grad(fn, argnums=0, has_aux=False):
    """The gradient of scalar fn with respect to args[argnums] (with has_aux: (grad, aux))."""

    def traced(*args):
        v, g = _value_and_grad_traced(fn, argnums, has_aux, args)
        return (g, v[1]) if has_aux else g

    return _eager(functools.wraps(fn)(traced))


def _vjp_traced(fn, primals, cotangents):
    out = fn(*primals)
    out_flat, out_tree = tree_flatten(out)
    ct_flat, ct_tree = tree_flatten(cotangents)
    if ct_tree != out_tree:
        raise UserError(f"px.vjp: cotangents have structure {ct_tree}, the outputs {out_tree}")
    for o, c in zip(out_flat, ct_flat):
        if tuple(o.shape) != tuple(c.shape) or o.dtype != c.dtype:
            raise UserError(f"px.vjp: a cotangent is {c!r}, its output {o!r}")
    leaves, tree = tree_flatten(tuple(primals))
    return out, tree_unflatten(tree, _core.gradients(out_flat, leaves, ct_flat))


def vjp(fn, *primals):
    """(fn(*primals), vjp_fn) where vjp_fn(cotangents) gives one cotangent per primal (a tuple)."""
    if _is_tracing(tree_flatten(primals)[0]):
        out = fn(*primals)

        def vjp_fn(ct):
            return _vjp_traced(lambda *p: out, primals, ct)[1]

        return out, vjp_fn

    out = jit(fn)(*primals)
    back = jit(lambda p, c: _vjp_traced(fn, p, c)[1])
    return out, lambda ct: back(tuple(primals), ct)


def remat(fn, policy: str = "full", names=()):
    """fn(*Tensors) (e.g. one block of a model) whose forward values follow `policy` in a
    training step: "full" saves only its inputs and recomputes the rest in the backward pass,
    "dots_saveable" keeps matmul outputs, "names" keeps the values tagged with `names`
    (px::remat; the results are the same bits, the memory is less)."""
    single = []

    def flat(tensors):
        out = fn(*tensors)
        single.append(isinstance(out, Tensor))
        return [out] if single[-1] else list(out)

    wrapped = _core.remat(flat, policy, list(names))

    @functools.wraps(fn)
    def call(*args):
        from .numpy import asarray as as_tensor

        outs = wrapped([as_tensor(a) for a in args])
        return outs[0] if single[-1] else tuple(outs)

    return call


def remat_model(blocks, policy: str = "full"):
    """The blocks (callables of one Tensor, e.g. a model's list of layers) run in order, each
    rematerialized on its own by `policy` (px::remat_model)."""
    wrapped = [remat(b, policy) for b in blocks]

    def call(x):
        for b in wrapped:
            x = b(x)
        return x

    return call
