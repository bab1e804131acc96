"""Shape expressions of array parameters (``Array[dtype, "n, m + 1"]``, ``docs/rpc.md``).

A shape is a comma-separated list of dimensions: an integer literal, the name of a scalar
``int`` parameter, an expression of those with ``+ - * //`` and parentheses, or ``*`` (any
size). Expressions are parsed with :mod:`ast` and checked against that whitelist, and evaluated
by walking the tree: never with ``eval``.
"""

from __future__ import annotations

import ast
import functools
from typing import Iterable

_BINOPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: lambda a, b: a // b,
}


def normalize_shape(shape: str) -> str:
    dims = [dim.strip() for dim in shape.split(",")]
    if len(dims) > 1 and dims[-1] == "":
        dims.pop()  # "n," is a 1-d shape, as a tuple would be
    if dims == [""]:
        return ""
    return ", ".join(dims)


def _check_dim_node(node: ast.AST) -> None:
    if isinstance(node, ast.Constant):
        if type(node.value) is not int:
            raise ValueError(f"{node.value!r} is not an integer")
    elif isinstance(node, ast.BinOp):
        if type(node.op) not in _BINOPS:
            raise ValueError("only + - * // are allowed")
        _check_dim_node(node.left)
        _check_dim_node(node.right)
    elif not isinstance(node, ast.Name):
        raise ValueError("a dimension is an integer, a parameter name, + - * // or ( )")


def _eval_dim(node: ast.AST, scalars: dict) -> int:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return scalars[node.id]
    assert isinstance(node, ast.BinOp)
    return _BINOPS[type(node.op)](_eval_dim(node.left, scalars), _eval_dim(node.right, scalars))


def _parse_dim(dim: str) -> ast.AST:
    if not dim:
        raise ValueError("empty dimension")
    try:
        node = ast.parse(dim, mode="eval").body
    except SyntaxError:
        raise ValueError("not an expression") from None
    _check_dim_node(node)
    return node


class Shape:
    """A parsed shape expression: its dimensions (an AST each, None for ``*``) and the names."""

    __slots__ = ("dims", "texts", "names", "_order", "_memo")

    def __init__(self, text: str) -> None:
        self.texts = tuple(text.split(", ")) if text else ()
        self.dims: list = []
        names: set = set()
        for dim in self.texts:
            if dim == "*":
                self.dims.append(None)
                continue
            try:
                node = _parse_dim(dim)
            except ValueError as exc:
                where = f" (dimension {dim!r})" if len(self.texts) > 1 else ""
                raise ValueError(f"{exc}{where}") from None
            names.update(n.id for n in ast.walk(node) if isinstance(n, ast.Name))
            self.dims.append(node)
        self.names = frozenset(names)
        self._order = tuple(sorted(names))
        # Evaluations by the values of the names: calls repeat the same sizes, and walking
        # the trees is most of the cost of checking a small array.
        self._memo: dict = {}

    @property
    def is_determined(self) -> bool:
        return None not in self.dims

    def evaluate(self, scalars: dict) -> tuple:
        """The dimensions with the scalars' values: an int each, None where unknown (``*``, or
        a name without a value).

        Raises:
            ZeroDivisionError: A ``//`` by zero.
        """
        key = tuple(scalars.get(n) for n in self._order)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        dims = self._evaluate(scalars)
        if len(self._memo) >= 256:
            self._memo.clear()
        self._memo[key] = dims
        return dims

    def _evaluate(self, scalars: dict) -> tuple:
        out = []
        for node in self.dims:
            if node is None:
                out.append(None)
            else:
                try:
                    out.append(_eval_dim(node, scalars))
                except KeyError:
                    out.append(None)
        return tuple(out)


@functools.lru_cache(maxsize=1024)
def parse_shape(text: str) -> Shape:
    return Shape(text)


def fmt_dims(dims: Iterable) -> str:
    items = [str(d) for d in dims]
    if len(items) == 1:
        return f"({items[0]},)"
    return "(" + ", ".join(items) + ")"


def concrete_dims(shape: str | None) -> tuple | None:
    # A producer's output spec carries an already-evaluated shape ("8, 8"); anything else
    # (None, a leftover expression) is unknown.
    if shape is None:
        return None
    if shape == "":
        return ()
    try:
        return tuple(int(d) for d in shape.split(","))
    except ValueError:
        return None
