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

This module owns the interface: its construction checks, views and wire form. A parameter
(:class:`Param`) is ``params.py``'s, checking a call's arguments (:meth:`Interface.bind`)
``binding.py``'s; the annotation vocabulary (:class:`Array`, :class:`In`, :class:`Out`,
:class:`InOut`) is in ``annotations.py``, shape expressions in ``shape.py``, scalar checks in
``values.py``, and the wire format of the values is ``codec.py``'s. numpy is never imported
here unless an annotation names a dtype by a numpy object or a non-canonical name: a worker
without numpy can import a module of scalar functions, and ``import rtpool`` stays light.
"""

from __future__ import annotations

import keyword
from typing import Any, Iterable

import msgpack

from ..errors import ProtocolError
from .annotations import Array, ArraySpec, In, InOut, Out
from .binding import Binding, BoundCall
from .params import Param, check_name_version, check_param, param_from_dict, param_text
from .shape import parse_shape

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


class Interface(Binding):
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
            check_param(fname, p)
            if p.type == "int" and p.mode == "in":
                int_params.add(p.name)
        if self.returns is not None:
            if not isinstance(self.returns, Param) or self.returns.name != "return":
                raise TypeError(f"{fname}: returns must be a Param named 'return'")
            check_param(fname, self.returns)
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
        args = ", ".join(param_text(p) for p in self._inputs)
        outs = [param_text(p) for p in self._outputs]
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
            params.append(param_from_dict(item["name"], item))
        returns = None
        if d["returns"] is not None:
            if not isinstance(d["returns"], dict):
                raise TypeError("returns must be a map or nil")
            returns = param_from_dict("return", d["returns"], mode="out")
        check_name_version(d["name"], d["version"])
        return cls(d["name"], d["version"], d["doc"], d["module"], params, returns, servers)
