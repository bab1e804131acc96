"""Checking a call's arguments against an interface (grid RPC, ``docs/rpc.md``): the
:class:`Binding` half of :class:`~rtpool.rpc.interface.Interface` (``bind``, the shapes its
int scalars give), and :class:`BoundCall`, a checked call.

A call repeated with the same sizes, dtypes and scalar types skips the checks
(:meth:`Binding._bind_key`, issue 16: dmmul's round trip); the memos are bounded.
"""

from __future__ import annotations

from typing import Any, FrozenSet, Iterable, List

from ..errors import CallError
from .params import Param
from .shape import concrete_dims, fmt_dims, parse_shape
from .values import dtype_matches, loaded_numpy, scalar_problem

__all__ = ["Binding", "BoundCall"]


class Binding:
    """What :class:`~rtpool.rpc.interface.Interface` does to check a call: :meth:`bind` and
    the shape checks. The interface sets the attributes below."""

    name: str
    params: List[Param]
    _inputs: List[Param]
    _outputs: List[Param]
    _has_out: bool
    _int_names: FrozenSet[str]
    # Calls that passed bind()'s checks, by what the checks depend on (_bind_key).
    _bound: dict
    # output_specs() by the int scalars' values.
    _specs: dict

    def bind(self, args: Iterable) -> BoundCall:
        """Check a call's positional arguments against the interface.

        Accepted: the ``In`` and ``InOut`` arguments in order (``Out`` ones omitted), or every
        parameter in order, the ``Out`` ones being writable arrays of the exact dtype and shape
        to fill in place. An object with a ``__rtpool_ref__`` attribute (a transaction's
        future) stands for an ``In``/``InOut`` value produced by another call.

        Returns:
            The checked call.

        Raises:
            CallError: Wrong count, type, dtype or shape; the message names the argument.
        """
        args = tuple(args)
        key = self._bind_key(args)
        if key is not None and key in self._bound:
            return self._bound_again(args)
        bound = self._bind(args)
        if key is not None:
            if len(self._bound) >= _BIND_MEMO:
                self._bound.clear()
            self._bound[key] = True
        return bound

    def _bind_key(self, args: tuple) -> tuple | None:
        """What :meth:`_bind`'s checks of ``args`` depend on, or None when it is not cheap to
        say (a reference, a subclass, a type other than the common ones): ints by value (their
        range and the shapes they size), floats by type, arrays by dtype, shape and whether
        they are writable."""
        key: list = [len(args)]
        ndarray = _ndarray()
        for value in args:
            t = type(value)
            if t is int:
                key.append(value)
            elif t is float or t is bool or t is str or t is bytes:
                key.append(t)
            elif ndarray is not None and t is ndarray:
                key.append((value.dtype, value.shape, value.flags.writeable))
            else:
                return None
        return tuple(key)

    def _bound_again(self, args: tuple) -> BoundCall:
        """:meth:`_bind` of arguments whose checks passed before (the same :meth:`_bind_key`)."""
        full = len(args) != len(self._inputs)
        slots = self.params if full else self._inputs
        scalars = {p.name: v for p, v in zip(slots, args) if p.type != "array"}
        ints = self._int_names
        shape_scalars = {k: int(v) for k, v in scalars.items() if k in ints}
        return BoundCall(self, args, full, scalars, shape_scalars)

    def _bind(self, args: tuple) -> BoundCall:
        n = len(args)
        if n == len(self._inputs):
            slots = self._inputs
        elif n == len(self.params):
            slots = self.params
        else:
            raise CallError(self._count_message(n))
        scalars: dict = {}
        refs: dict = {}
        for p, value in zip(slots, args):
            ref = getattr(value, "__rtpool_ref__", None)
            if ref is not None:
                if p.mode == "out":
                    raise CallError(
                        f"{self.name}: argument {p.name} is an output buffer; a call's result "
                        "cannot stand for it (pass an array, or leave the outputs out)"
                    )
                refs[p.name] = ref
            elif p.type != "array":
                problem = scalar_problem(p.type, value)
                if problem:
                    raise CallError(f"{self.name}: argument {p.name} {problem}")
                scalars[p.name] = value
        shape_scalars = {k: int(v) for k, v in scalars.items() if k in self._int_names}
        for p, value in zip(slots, args):
            ref = refs.get(p.name)
            if ref is not None:
                self._check_ref(p, ref, shape_scalars)
            elif p.type == "array":
                self._check_array(p, value, shape_scalars)
        if slots is not self.params:
            for p in self._outputs:
                if p.mode == "out" and p.shape is not None:
                    self.expected_shape(p, shape_scalars)  # a negative size fails here already
        return BoundCall(self, args, slots is self.params, scalars, shape_scalars)

    def _count_message(self, n: int) -> str:
        def count(params: list) -> str:
            names = ", ".join(p.name for p in params)
            word = "argument" if len(params) == 1 else "arguments"
            return f"{len(params)} {word} ({names})"

        if not self.params:
            return f"{self.name} takes no arguments, got {n}"
        if not self._has_out:
            return f"{self.name} takes {count(self.params)}, got {n}"
        return (
            f"{self.name} takes {count(self._inputs)} or {len(self.params)} with the outputs "
            f"({', '.join(p.name for p in self.params)}), got {n}"
        )

    def expected_shape(self, p: Param, shape_scalars: dict) -> tuple | None:
        """``p``'s shape evaluated with the int scalars (None for an unconstrained shape).

        Raises:
            CallError: The expression divides by zero or gives a negative size.
        """
        if p.shape is None:
            return None
        try:
            dims = parse_shape(p.shape).evaluate(shape_scalars)
        except ZeroDivisionError:
            raise CallError(
                f"{self.name}: the shape of {_what(p)} ({p.shape}) divides by zero"
            ) from None
        if any(d is not None and d < 0 for d in dims):
            raise CallError(
                f"{self.name}: the shape of {_what(p)} ({p.shape}) is {fmt_dims(dims)}, "
                "a negative size"
            )
        return dims

    def shape_problem(self, p: Param, shape: tuple, shape_scalars: dict) -> str | None:
        """Why an array of ``shape`` does not fit ``p``, or None if it does."""
        expected = self.expected_shape(p, shape_scalars)
        if expected is None:
            return None
        if len(shape) == len(expected) and all(
            e is None or e == s for e, s in zip(expected, shape)
        ):
            return None
        texts = parse_shape(p.shape).texts
        values = [t if t == "*" else "?" if e is None else e for e, t in zip(expected, texts)]
        want = fmt_dims(texts)
        if fmt_dims(values) != want:
            want = f"{want} = {fmt_dims(values)}"
        return f"has shape {fmt_dims(shape)}, expected {want}"

    def _check_array(self, p: Param, value: Any, shape_scalars: dict) -> None:
        np = loaded_numpy()
        if np is None or not isinstance(value, np.ndarray):
            raise CallError(
                f"{self.name}: argument {p.name} has type {type(value).__name__}, expected a "
                f"numpy array of {p.dtype}"
            )
        if not dtype_matches(value.dtype, p.dtype):
            raise CallError(
                f"{self.name}: argument {p.name} has dtype {value.dtype.name}, expected {p.dtype}"
            )
        problem = self.shape_problem(p, value.shape, shape_scalars)
        if problem:
            raise CallError(f"{self.name}: argument {p.name} {problem}")
        if p.mode != "in" and not value.flags.writeable:
            role = "an output buffer" if p.mode == "out" else "an InOut array, updated in place,"
            raise CallError(f"{self.name}: argument {p.name} is read-only; {role} must be writable")

    def _check_ref(self, p: Param, ref: Any, shape_scalars: dict) -> None:
        try:
            call_index, output_index, spec = ref
        except (TypeError, ValueError):
            raise CallError(
                f"{self.name}: argument {p.name} has a malformed __rtpool_ref__ {ref!r}"
            ) from None
        if spec is None:
            return
        origin = f"{self.name}: argument {p.name} (output {output_index} of call #{call_index})"
        if not _types_compatible(p, spec):
            raise CallError(f"{origin} has type {spec.type_text()}, expected {p.type_text()}")
        if p.type != "array" or spec.type != "array":
            return
        if spec.dtype != p.dtype:
            raise CallError(f"{origin} has dtype {spec.dtype}, expected {p.dtype}")
        given = concrete_dims(spec.shape)
        if given is not None:
            problem = self.shape_problem(p, given, shape_scalars)
            if problem:
                raise CallError(f"{origin} {problem}")


#: Entries of an interface's memo of checked calls (and of output specs) at most.
_BIND_MEMO = 256


def _ndarray() -> Any:
    np = loaded_numpy()
    return None if np is None else np.ndarray


class BoundCall:
    """A call checked by :meth:`Interface.bind`.

    Attributes:
        interface: The interface it was checked against.
        values: The ``In`` and ``InOut`` values in order (what the argument payload carries);
            references (objects with ``__rtpool_ref__``) are kept as they are.
        out_buffers: One entry per output (:attr:`Interface.outputs`): the caller's array to
            fill in place (an ``Out`` buffer passed by the caller, or the ``InOut`` array
            itself), or None.
        scalars: The scalar arguments by name (references left out).
    """

    def __init__(
        self, interface: Binding, args: tuple, full: bool, scalars: dict, shape_scalars: dict
    ) -> None:
        self.interface = interface
        self.scalars = scalars
        self._shape_scalars = shape_scalars
        slots = interface.params if full else interface._inputs
        by_name = dict(zip((p.name for p in slots), args))
        self.values = [by_name[p.name] for p in interface._inputs]
        buffers = []
        for p in interface._outputs:
            value = by_name.get(p.name) if p.name != "return" else None
            if value is not None and getattr(value, "__rtpool_ref__", None) is not None:
                value = None
            buffers.append(value)
        self.out_buffers = buffers

    def output_specs(self) -> list:
        """The outputs' specs with concrete shapes (``"8, 8"``) where the scalars determine
        them, else a shape of None."""
        memo = self.interface._specs
        key = tuple(sorted(self._shape_scalars.items()))
        specs = memo.get(key)
        if specs is None:
            specs = self._output_specs()
            if len(memo) >= _BIND_MEMO:
                memo.clear()
            memo[key] = specs
        return list(specs)

    def _output_specs(self) -> list:
        specs = []
        for p in self.interface._outputs:
            shape = None
            if p.type == "array" and p.shape is not None:
                dims = self.interface.expected_shape(p, self._shape_scalars)
                if None not in dims:
                    shape = ", ".join(str(d) for d in dims)
            specs.append(Param(p.name, p.mode, p.type, p.dtype, shape))
        return specs

    def __repr__(self) -> str:
        return f"<BoundCall {self.interface.name} with {len(self.values)} values>"


def _what(p: Param) -> str:
    return "the return value" if p.name == "return" else p.name


def _types_compatible(p: Param, spec: Param) -> bool:
    if p.type == "any" or spec.type == "any" or p.type == spec.type:
        return True
    return (p.type, spec.type) in {("float", "int"), ("complex", "int"), ("complex", "float")}
