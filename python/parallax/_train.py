"""px.TrainStep (one compiled training step, on one device or sharded over a mesh) and
px.create_sharded_model (the seed's entry point: a model, sample inputs and a strategy)."""

from __future__ import annotations

import inspect
import os

from . import _core
from ._array import Array, asarray, dtype as _dtype
from ._core import Mesh, ShardingStrategy, Tensor, TransformerLm, UserError
from ._tree import tree_flatten, tree_unflatten


class PartitionSpec:
    """How each dim of a value is split over mesh axes: PartitionSpec('data', None),
    PartitionSpec(('data', 'fsdp'), 'model'). Printed and parsed like px::PartitionSpec."""

    def __init__(self, *dims):
        for d in dims:
            ok = d is None or isinstance(d, str) or isinstance(d, tuple) and all(isinstance(a, str) for a in d)
            if not ok:
                raise UserError(f"PartitionSpec: a dim is None, an axis name or a tuple of names; got {d!r}")
        self.dims = dims
        self._cpp = _core._PartitionSpec.parse(self._text())

    def _text(self):
        def dim(d):
            if d is None:
                return "None"
            if isinstance(d, str):
                return repr(d)
            return "(" + ", ".join(map(repr, d)) + ("," if len(d) == 1 else "") + ")"

        return "P(" + ", ".join(dim(d) for d in self.dims) + ")"

    @staticmethod
    def parse(text: str) -> "PartitionSpec":
        spec = PartitionSpec()
        spec._cpp = _core._PartitionSpec.parse(text)
        return spec

    def __str__(self):
        return str(self._cpp)

    __repr__ = __str__

    def __eq__(self, other):
        return isinstance(other, PartitionSpec) and self._cpp == other._cpp


def strategy(s) -> ShardingStrategy:
    """A ShardingStrategy from itself or its name ('auto', 'FSDP_TP', ...)."""
    if isinstance(s, ShardingStrategy):
        return s
    names = {m.name: m for m in ShardingStrategy}
    if isinstance(s, str) and s.upper() in names:
        return names[s.upper()]
    raise UserError(f"unknown sharding strategy {s!r}; expected one of {', '.join(names)}")


def _batch_types(batch):
    out = []
    for b in batch:
        if isinstance(b, tuple) and len(b) == 2 and not hasattr(b, "shape"):
            out.append((_dtype(b[0]), list(b[1])))
        else:
            a = asarray(b)
            out.append((a.dtype, list(a.shape)))
    return out


class Offloaded:
    """A model whose params (globs of their paths) and optimizer state a TrainStep keeps in pinned
    host memory, fetched a layer ahead of use (px.offload_model)."""

    def __init__(self, model, params, optimizer_state):
        self.model, self.params, self.optimizer_state = model, list(params), bool(optimizer_state)


def offload_model(model, params=("*",), optimizer_state: bool = True) -> Offloaded:
    """`model` trained with its params matching `params` (globs of param paths, "*": all) and,
    with optimizer_state, the optimizer state in pinned host memory (px::OffloadOptions): a
    TrainStep or create_sharded_model of the result fetches them to the device a layer ahead of
    use and runs the update on the host. The results are the same bits; the device holds less."""
    if isinstance(model, Offloaded):
        raise UserError("offload_model: the model is already offloaded; give the settings in one call")
    if isinstance(params, str):
        params = [params]
    return Offloaded(model, params, optimizer_state)


class TrainStep:
    """One training step (forward, loss, backward, clipping, optimizer update) traced and
    compiled as one program (px::TrainStep).

    model: a px.nn.Module (or any tree of arrays) with loss_fn(model, *batch) -> scalar Tensor,
    or a built-in px.nn.TransformerLm (loss_fn None: next-token loss over (tokens, targets)).
    batch: sample arrays or (dtype, shape) pairs. mesh and strategy shard it (see
    px.create_sharded_model); other keywords: clip_norm, microbatches, skip_nonfinite, compile,
    data_axis, model_axis, auto_time_limit_s, auto_cluster, remat, remat_budget_bytes,
    offload_params, offload_optimizer_state, and rules / activation_rules: [(glob,
    PartitionSpec or its text)], first match wins (MANUAL, or overrides of any strategy)."""

    def __init__(self, model, loss_fn, optimizer, batch, *, mesh: Mesh | None = None,
                 strategy=ShardingStrategy.DDP, **options):
        if isinstance(model, Offloaded):
            for key in ("offload_params", "offload_optimizer_state"):
                if key in options:
                    raise UserError(f"TrainStep: the model comes from px.offload_model; drop {key}=")
            options["offload_params"] = model.params
            options["offload_optimizer_state"] = model.optimizer_state
            model = model.model
        types = _batch_types(batch)
        for key in ("rules", "activation_rules"):
            if key in options:
                options[key] = [(glob, str(spec)) for glob, spec in options[key]]
        opts = dict(mesh=mesh, strategy=globals()["strategy"](strategy), **options)
        self._model = model
        if isinstance(model, TransformerLm):
            if loss_fn is not None:
                raise UserError("TrainStep: a px.nn.TransformerLm trains on its next-token loss; pass loss_fn=None")
            self._cpp = _core.TrainStep.for_lm(model, optimizer, types, **opts)
            self._treedef = None
            self.paths = model.store.paths()
            return
        from .nn.modules import Deferred, Module

        leaves, self._treedef = tree_flatten(model)
        if isinstance(model, Module):
            self.paths = list(model.named_parameters())
        else:
            self.paths = [f"p{i}" for i in range(len(leaves))]
        self._scope = _core.Scope()
        # A factory's params (Deferred) are declared with their initializers and drawn by init().
        self._initial = [None if isinstance(x, Deferred) else asarray(x) for x in leaves]
        for path, leaf, a in zip(self.paths, leaves, self._initial):
            if a is None:
                self._scope.declare(path, leaf.dtype, list(leaf.shape), leaf.init)
            else:
                self._scope.declare(path, a.dtype, list(a.shape))
        store = self._scope.store
        treedef = self._treedef

        def traced_loss(batch_tensors):
            m = tree_unflatten(treedef, store.values())
            return loss_fn(m, *batch_tensors)

        self._cpp = _core.TrainStep(store, optimizer, traced_loss, types, **opts)

    def init(self, seed_or_params=None) -> _core.TrainState:
        """The state from the model's current params (default), a seed (the built-in LMs'
        initializers), or a list of arrays in param order. A model built by a
        create_sharded_model factory draws its params from a seed (default 0), each shard on the
        device that holds it; params the factory gave values keep them."""
        if self._treedef is not None and any(a is None for a in self._initial) and \
                (seed_or_params is None or isinstance(seed_or_params, int)):
            return self._cpp.init_partly(self._scope.store, seed_or_params or 0, self._initial)
        if seed_or_params is None:
            if self._treedef is None:
                return self._cpp.init(0)
            return self._cpp.init(self._initial)
        if isinstance(seed_or_params, int):
            return self._cpp.init(seed_or_params)
        return self._cpp.init([asarray(x) for x in seed_or_params])

    def __call__(self, state, *batch) -> _core.StepMetrics:
        """Applies one update to state in place; returns the metrics (loss, grad_norm, lr)."""
        return self._cpp(state, [asarray(b) for b in batch])

    def gather_params(self, state) -> list[Array]:
        return self._cpp.gather_params(state)

    def model(self, state):
        """The model (a new Module of the same structure) holding the state's params."""
        if self._treedef is None:
            raise UserError("TrainStep.model: a built-in TransformerLm's params are gather_params(state)")
        return tree_unflatten(self._treedef, self._cpp.gather_params(state))

    def named_params(self, state) -> dict:
        return dict(zip(self.paths, self._cpp.gather_params(state)))

    def save(self, path: str, state) -> None:
        """Writes a checkpoint directory (each process its own shards; docs/checkpoints.md), or one
        file of full arrays when the path ends in ".safetensors"."""
        self._cpp.save(os.fspath(path), state)

    def load(self, path: str):
        """The state from a checkpoint directory (or the newest in a directory of them) or a
        ".safetensors" file, on this step's mesh and shardings."""
        return self._cpp.load(os.fspath(path))

    def plan(self) -> _core.ShardingPlan:
        return self._cpp.plan()

    def table(self) -> str:
        return self._cpp.table()

    def explain(self) -> str:
        """AUTO's account of its plan (empty for the recipes)."""
        return self._cpp.plan().explain()

    def peak_bytes(self) -> int:
        return self._cpp.peak_bytes()

    def num_kernels(self) -> int:
        """The kernels the compiled step runs (after the first call compiled it)."""
        return self._cpp.num_kernels()

    @property
    def devices(self) -> int:
        """The devices the plan's mesh has (1: one device, a mesh of one device)."""
        return self._cpp.plan().mesh.size


def _model_loss(model, *inputs):
    """Without loss_fn, a model's call on the inputs is its loss."""
    out = model(*inputs)
    if not (isinstance(out, Tensor) and out.ndim == 0):
        what = f"a Tensor of shape {tuple(out.shape)}" if isinstance(out, Tensor) else type(out).__name__
        raise UserError(f"create_sharded_model: without loss_fn, the model's call on sample_inputs must return the "
                        f"scalar loss; it returned {what}: pass loss_fn(model, *inputs) -> scalar")
    return out


def _built(model_or_fn):
    """The model itself, or what a zero-argument factory builds (with deferred params)."""
    from .nn.modules import Module, deferred_params

    if isinstance(model_or_fn, (Module, TransformerLm)) or not callable(model_or_fn):
        return model_or_fn
    try:
        required = [p for p in inspect.signature(model_or_fn).parameters.values()
                    if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        required = []
    if required:
        raise UserError(f"create_sharded_model: model_or_fn is a callable taking {[p.name for p in required]}; pass "
                        "a zero-argument factory (lambda: Model(...)), a model, or (fn, params) with "
                        "fn(params, *inputs) -> loss")
    with deferred_params():
        model = model_or_fn()
    if callable(model) and not isinstance(model, (Module, TransformerLm)):
        raise UserError(f"create_sharded_model: the factory returned a {type(model).__name__}; it must return the "
                        "model (a px.nn.Module, a px.nn.TransformerLm or a tree of params)")
    return model


def create_sharded_model(model_or_fn, sample_inputs, *, loss_fn=None, optimizer=None,
                         strategy=ShardingStrategy.AUTO, data_axis_name: str = "data",
                         model_axis_name: str = "model", mesh: Mesh | None = None, **options) -> TrainStep:
    """The seed's entry point: a training step for model_or_fn sharded over a mesh.

    model_or_fn: a px.nn.Module (with loss_fn(model, *inputs); without it, model(*inputs) is the
    loss), a built-in px.nn.TransformerLm,
    a zero-argument factory of either (lambda: Model(...): run with its px.nn params deferred, so
    that init() draws each shard on its own device and the whole model never exists), or a
    callable (params, *inputs) -> loss together with params passed as model_or_fn=(fn, params).
    mesh: default Mesh.create([(data_axis_name, -1), (model_axis_name, 1)]) over PX_DEVICES
    (cpu:4 gives 4 devices); strategy: AUTO, DDP, FSDP, TP, FSDP_TP or MANUAL (or their names).
    Returns a px.TrainStep (init, __call__, plan(), explain(), table())."""
    from .optim import adamw

    strat = globals()["strategy"](strategy)
    if isinstance(model_or_fn, tuple) and len(model_or_fn) == 2 and callable(model_or_fn[0]):
        fn, params = model_or_fn
        model, loss_fn = params, (lambda p, *xs: fn(p, *xs))
    else:
        model = _built(model_or_fn)
    if loss_fn is None and not isinstance(model, TransformerLm):
        if not callable(model):
            raise UserError("create_sharded_model: pass loss_fn(model, *inputs) -> scalar for a Python model")
        loss_fn = _model_loss
    if mesh is None:
        mesh = Mesh.create([(data_axis_name, -1), (model_axis_name, 1)])
    return TrainStep(model, loss_fn, optimizer or adamw(), sample_inputs, mesh=mesh, strategy=strat,
                     data_axis=data_axis_name, model_axis=model_axis_name, **options)
