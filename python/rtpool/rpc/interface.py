"""Interfaces of named remote functions (grid RPC, ``docs/rpc.md``).

A provider marks a module-level function with :func:`~rtpool.remote` (``remote.py``); the
function's signature, annotations and docstring become an :class:`Interface`, which a worker
sends to the master in ``SERVE`` (:meth:`Interface.to_bytes`) and a client fetches back
(:meth:`Interface.from_bytes`) to check a call's arguments before sending anything
(:meth:`Interface.bind`)::

    @rtpool.remote("dmmul", version="1")
    def dmmul(n: int, A: Array[np.float64, "n, n"], B: Array[np.float64, "n, n"],
              C: Out[Array[np.float64, "n, n"]]) -> None:
        np.matmul(A, B, out=C)

This module owns the interface and argument checking (:meth:`Interface.bind`); the
annotation vocabulary (:class:`Array`, :class:`In`, :class:`Out`, :class:`InOut`) is in
``annotations.py``, shape expressions in ``shape.py``, scalar checks in ``values.py``, and the
wire format of the values is ``codec.py``'s. numpy is never imported here unless an
annotation names a dtype by a numpy object or a non-canonical name: a worker without numpy can
import a module of scalar functions, and ``import rtpool`` stays light.
"""

from __future__ import annotations

import keyword
from dataclasses import dataclass
from typing import Any, Iterable

import msgpack

from ..errors import CallError, ProtocolError
from .annotations import MODE_NAMES, Array, ArraySpec, In, InOut, Out
from .shape import concrete_dims, fmt_dims, normalize_shape, parse_shape
from .values import dtype_matches, loaded_numpy, scalar_problem

__all__ = [
    "Array",
    "ArraySpec",
    "BoundCall",
    "In",
    "InOut",
    "Interface",
    "Out",
    "Param",
]

#: Parameter modes, as they appear on the wire.
MODES = ("in", "out", "inout")
#: Value types, as they appear on the wire.
TYPES = ("int", "float", "complex", "bool", "str", "bytes", "any", "array")

# Sizes the wire format allows (docs/protocol.md, SERVE).
_MAX_NAME_BYTES = 128
_MAX_VERSION_BYTES = 64
MAX_INTERFACE_BYTES = 64 * 1024


# --- interface -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    """One parameter (or the return value, named ``"return"``) of an interface.

    Attributes:
        name: The parameter's name.
        mode: ``"in"``, ``"out"`` or ``"inout"`` (the return value is ``"out"``).
        type: ``"int" "float" "complex" "bool" "str" "bytes" "any"`` or ``"array"``.
        dtype: numpy's name of the element type for an array, else None.
        shape: The shape expression for an array (``"n, n"``), None for any shape (and for
            scalars).
    """

    name: str
    mode: str = "in"
    type: str = "any"
    dtype: str | None = None
    shape: str | None = None

    @property
    def is_array(self) -> bool:
        return self.type == "array"

    def type_text(self) -> str:
        """``int``, ``float64[n, n]``, ``float64[...]`` (any shape)."""
        if self.type != "array":
            return self.type
        if self.shape is None:
            return f"{self.dtype}[...]"
        return f"{self.dtype}[{self.shape}]"

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "mode": self.mode,
            "type": self.type,
            "dtype": self.dtype,
            "shape": self.shape,
        }


class Interface:
    """The interface of a named remote function: its parameters, outputs and description.

    Built by :func:`remote` from a function, or by :meth:`from_bytes` from what the master
    hands out. ``str(iface)`` (and ``help(iface)``) show the signature and the docstring.

    Attributes:
        name: The function's registered name.
        version: Its version string.
        doc: Its docstring (cleaned), or ``""``.
        module: The module that defines it.
        params: Every parameter, in order.
        returns: The return value's spec (a :class:`Param` named ``"return"``), or None.
        servers: How many connected workers serve it (filled in by the client from the
            registry; 0 when unknown).
    """

    def __init__(
        self,
        name: str,
        version: str,
        doc: str,
        module: str,
        params: Iterable[Param],
        returns: Param | None = None,
        servers: int = 0,
        *,
        _label: str | None = None,
    ) -> None:
        self.name = name
        self.version = version
        self.doc = doc
        self.module = module
        self.params = list(params)
        self.returns = returns
        self.servers = servers
        self._check(_label or name)
        self._inputs = [p for p in self.params if p.mode != "out"]
        self._outputs = ([returns] if returns is not None else []) + [
            p for p in self.params if p.mode != "in"
        ]
        self._has_out = any(p.mode == "out" for p in self.params)
        self._int_names = frozenset(p.name for p in self.params if p.type == "int")
        # Calls that passed bind()'s checks, by what the checks depend on (_bind_key): a call
        # repeated with the same sizes, dtypes and scalar types skips them (issue 16, dmmul).
        self._bound: dict = {}
        # output_specs() by the int scalars' values.
        self._specs: dict = {}
        # How a worker runs a call whose checks passed, by _bind_key (invocation.invoke).
        self._plans: dict = {}
        self._bytes: bytes | None = None
        # help(iface) documents the instance's __doc__.
        self.__doc__ = str(self)

    # -- construction checks

    def _check(self, fname: str) -> None:
        """Raise TypeError naming the function and parameter if the interface is unusable."""
        seen: set = set()
        int_params = set()
        for p in self.params:
            if not isinstance(p, Param):
                raise TypeError(f"{fname}: params must be Param objects, got {p!r}")
            if p.name in seen:
                raise TypeError(f"{fname}: parameter {p.name} appears twice")
            if keyword.iskeyword(p.name):
                raise TypeError(f"{fname}: parameter name {p.name!r} is a Python keyword")
            seen.add(p.name)
            _check_param(fname, p)
            if p.type == "int" and p.mode == "in":
                int_params.add(p.name)
        if self.returns is not None:
            if not isinstance(self.returns, Param) or self.returns.name != "return":
                raise TypeError(f"{fname}: returns must be a Param named 'return'")
            _check_param(fname, self.returns)
        for p in self.params + ([self.returns] if self.returns is not None else []):
            if p.shape is None:
                continue
            where = "the return value" if p.name == "return" else f"parameter {p.name}"
            for ref in sorted(parse_shape(p.shape).names):
                if ref not in seen:
                    raise TypeError(
                        f"{fname}: the shape of {where} ({p.shape!r}) names {ref}, which is "
                        "not a parameter"
                    )
                if ref not in int_params:
                    raise TypeError(
                        f"{fname}: the shape of {where} ({p.shape!r}) names {ref}, which is "
                        "not an int input parameter"
                    )

    # -- views

    @property
    def inputs(self) -> list:
        """The ``In`` and ``InOut`` parameters, in order: what a call's payload carries."""
        return list(self._inputs)

    @property
    def outputs(self) -> list:
        """The return value's spec (if any), then the ``Out`` and ``InOut`` parameters."""
        return list(self._outputs)

    @property
    def signature(self) -> str:
        """``dmmul(n: int, A: In[float64[n, n]], B: In[float64[n, n]]) -> C: Out[float64[n, n]]``:
        the inputs, then the outputs (the return value shown by its type alone)."""
        args = ", ".join(_param_text(p) for p in self._inputs)
        outs = [_param_text(p) for p in self._outputs]
        if not outs:
            ret = "None"
        elif len(outs) == 1:
            ret = outs[0]
        else:
            ret = "(" + ", ".join(outs) + ")"
        return f"{self.name}({args}) -> {ret}"

    def __str__(self) -> str:
        if self.doc:
            return f"{self.signature}\n\n{self.doc}"
        return self.signature

    def __repr__(self) -> str:
        return f"<Interface {self.name} version {self.version!r}>"

    def _key(self) -> tuple:
        return (self.name, self.version, self.doc, self.module, tuple(self.params), self.returns)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Interface):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    # -- wire format

    def to_dict(self) -> dict:
        """The interface as the map of ``docs/rpc.md`` ("Interface"), keys in its order."""
        returns = None
        if self.returns is not None:
            r = self.returns
            returns = {"type": r.type, "dtype": r.dtype, "shape": r.shape}
        return {
            "name": self.name,
            "version": self.version,
            "doc": self.doc,
            "module": self.module,
            "params": [p.to_dict() for p in self.params],
            "returns": returns,
        }

    def to_bytes(self) -> bytes:
        """The msgpack map a worker sends in ``SERVE`` (``docs/rpc.md``, "Interface")."""
        if self._bytes is None:
            self._bytes = msgpack.packb(self.to_dict(), use_bin_type=True)
        return self._bytes

    @classmethod
    def from_bytes(cls, data: bytes, servers: int = 0) -> Interface:
        """Rebuild an interface from :meth:`to_bytes`' output.

        Raises:
            ProtocolError: ``data`` is not a valid interface.
        """
        try:
            d = msgpack.unpackb(data, raw=False)
        except Exception as exc:
            raise ProtocolError(f"an interface is not valid msgpack: {exc}") from None
        try:
            return cls._from_dict(d, servers)
        except KeyError as exc:
            raise ProtocolError(f"invalid interface: no {exc} key") from None
        except (TypeError, ValueError) as exc:
            raise ProtocolError(f"invalid interface: {exc}") from None

    @classmethod
    def _from_dict(cls, d: Any, servers: int) -> Interface:
        if not isinstance(d, dict):
            raise TypeError(f"expected a map, got {type(d).__name__}")
        for key in ("name", "version", "doc", "module"):
            if not isinstance(d[key], str):
                raise TypeError(f"{key} must be a string")
        if not isinstance(d["params"], list):
            raise TypeError("params must be a list")
        params = []
        for item in d["params"]:
            if not isinstance(item, dict):
                raise TypeError("a param must be a map")
            params.append(_param_from_dict(item["name"], item))
        returns = None
        if d["returns"] is not None:
            if not isinstance(d["returns"], dict):
                raise TypeError("returns must be a map or nil")
            returns = _param_from_dict("return", d["returns"], mode="out")
        check_name_version(d["name"], d["version"])
        return cls(d["name"], d["version"], d["doc"], d["module"], params, returns, servers)

    # -- calls

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
        self, interface: Interface, args: tuple, full: bool, scalars: dict, shape_scalars: dict
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


def _param_text(p: Param) -> str:
    prefix = "" if p.name == "return" else f"{p.name}: "
    if p.type != "array":
        return prefix + p.type
    return f"{prefix}{MODE_NAMES[p.mode]}[{p.type_text()}]"


def _check_param(fname: str, p: Param) -> None:
    where = "the return value" if p.name == "return" else f"parameter {p.name}"
    if not isinstance(p.name, str) or not p.name.isidentifier():
        raise TypeError(f"{fname}: parameter name {p.name!r} is not an identifier")
    if p.mode not in MODES:
        raise TypeError(f"{fname}: {where} has mode {p.mode!r}, not one of {MODES}")
    if p.type not in TYPES:
        raise TypeError(f"{fname}: {where} has type {p.type!r}, not one of {TYPES}")
    if p.type != "array":
        if p.dtype is not None or p.shape is not None:
            raise TypeError(f"{fname}: {where} is a scalar with a dtype or shape")
        if p.mode != "in" and p.name != "return":
            raise TypeError(
                f"{fname}: {where} is {MODE_NAMES[p.mode]}[{p.type}]: only arrays can be "
                f"{MODE_NAMES[p.mode]} (return a scalar instead)"
            )
        return
    if not isinstance(p.dtype, str) or not p.dtype:
        raise TypeError(f"{fname}: {where} is an array without a dtype")
    determined = False
    if p.shape is not None:
        if not isinstance(p.shape, str):
            raise TypeError(f"{fname}: {where} has a shape that is not a string: {p.shape!r}")
        try:
            determined = parse_shape(p.shape).is_determined
        except ValueError as exc:
            raise TypeError(f"{fname}: {where} has an invalid shape {p.shape!r}: {exc}") from None
    if p.mode == "out" and p.name != "return" and not determined:
        raise TypeError(
            f"{fname}: {where} is Out[{p.type_text()}]: an Out array needs a fully determined "
            "shape (no '*', not Array[dtype] alone) for the worker to allocate it"
        )


def _param_from_dict(name: Any, d: dict, mode: str | None = None) -> Param:
    fields = {"name": name, "mode": d["mode"] if mode is None else mode}
    fields.update(type=d["type"], dtype=d["dtype"], shape=d["shape"])
    for key, value in fields.items():
        if not (isinstance(value, str) or (value is None and key in ("dtype", "shape"))):
            raise TypeError(f"{key} of a param must be a string, got {value!r}")
    if fields["shape"] is not None and normalize_shape(fields["shape"]) != fields["shape"]:
        raise ValueError(f"shape {fields['shape']!r} is not normalized")
    return Param(**fields)


def check_name_version(name: Any, version: Any) -> None:
    if not isinstance(name, str) or not 1 <= len(name.encode()) <= _MAX_NAME_BYTES:
        raise TypeError(f"a function name is a string of 1 to 128 bytes, got {name!r}")
    if not isinstance(version, str) or len(version.encode()) > _MAX_VERSION_BYTES:
        raise TypeError(f'a version is a string of at most 64 bytes (like "1"), got {version!r}')
