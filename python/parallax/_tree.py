"""Minimal pytrees: nested tuples, lists, dicts and registered classes (px.nn.Module)."""

from __future__ import annotations

from typing import Any, Callable

_registry: dict[type, tuple[Callable, Callable]] = {}


def register_pytree_node(cls: type, flatten: Callable, unflatten: Callable) -> None:
    """flatten(obj) -> (children, aux); unflatten(aux, children) -> obj."""
    _registry[cls] = (flatten, unflatten)


class TreeDef:
    """The structure of a pytree without its leaves; hashable, so it can key a cache."""

    __slots__ = ("kind", "aux", "children", "num_leaves")

    def __init__(self, kind, aux, children):
        self.kind = kind
        self.aux = aux
        self.children = children
        self.num_leaves = 1 if kind == "leaf" else sum(c.num_leaves for c in children)

    def _key(self):
        return (self.kind, self.aux, tuple(c._key() for c in self.children))

    def __eq__(self, other):
        return isinstance(other, TreeDef) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        if self.kind == "leaf":
            return "*"
        return f"{self.kind}({', '.join(map(repr, self.children))})"


_LEAF = TreeDef("leaf", None, ())


def _find(cls):
    for base in cls.__mro__:
        if base in _registry:
            return _registry[base]
    return None


def tree_flatten(tree: Any) -> tuple[list, TreeDef]:
    leaves: list = []

    def walk(x):
        if x is None:
            return TreeDef("none", None, ())
        if isinstance(x, tuple) and not hasattr(x, "_fields"):
            return TreeDef("tuple", None, tuple(walk(c) for c in x))
        if isinstance(x, list):
            return TreeDef("list", None, tuple(walk(c) for c in x))
        if isinstance(x, dict):
            keys = tuple(sorted(x))
            return TreeDef("dict", keys, tuple(walk(x[k]) for k in keys))
        reg = _find(type(x))
        if reg is not None:
            children, aux = reg[0](x)
            return TreeDef(type(x), aux, tuple(walk(c) for c in children))
        leaves.append(x)
        return _LEAF

    treedef = walk(tree)
    return leaves, treedef


def tree_unflatten(treedef: TreeDef, leaves) -> Any:
    it = iter(leaves)

    def build(t):
        if t.kind == "leaf":
            return next(it)
        if t.kind == "none":
            return None
        children = [build(c) for c in t.children]
        if t.kind == "tuple":
            return tuple(children)
        if t.kind == "list":
            return children
        if t.kind == "dict":
            return dict(zip(t.aux, children))
        return _find(t.kind)[1](t.aux, children)

    return build(treedef)


def tree_leaves(tree: Any) -> list:
    return tree_flatten(tree)[0]


def tree_map(fn: Callable, tree: Any, *rest: Any) -> Any:
    leaves, treedef = tree_flatten(tree)
    others = [tree_flatten(r)[0] for r in rest]
    return tree_unflatten(treedef, [fn(*xs) for xs in zip(leaves, *others)])
