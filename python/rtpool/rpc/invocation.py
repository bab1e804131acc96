"""Running a named remote call on a worker (:func:`invoke`) and delivering its result on the
client (:func:`deliver`), over the value format of ``encoding.py`` and ``decoding.py``.

A worker checks a call's arguments in full the first time it sees their sizes, dtypes and
scalar types (:meth:`Interface._bind_key`), and remembers a plan for the next calls alike
(:class:`_Plan`): they skip the argument checks and the checks of the outputs the worker
allocated, unless the function reshaped or retyped one in place; a return value is always
checked. An ``InOut`` array that arrives as a read-only view of shared memory is copied
before the call, which writes it.

A complex scalar travels as a 0-d ``complex128`` array (``schema.py``): :func:`invoke` and
:func:`deliver` turn it back into a ``complex`` for ``complex`` parameters and outputs.
:func:`deliver` copies a result array once, straight into the caller's buffer when there is
one.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from .. import _shm
from ..errors import CallError
from .decoding import decode_args, decode_list, numpy_module, owned
from .encoding import encode_results
from .interface import Interface, Param
from .schema import FEED_BYTES
from .values import dtype_matches, loaded_numpy, scalar_problem

__all__ = ["deliver", "invoke"]


class _Writable:
    writeable = True


_WRITABLE = _Writable()


def _from_wire(p: Param, value: Any) -> Any:
    # A complex scalar arrives as a 0-d array (module docstring).
    if p.type == "complex" and getattr(value, "ndim", None) == 0:
        return value.item()
    return value


def _output_problem(iface: Interface, spec: Param, value: Any) -> Any:
    """Why ``value`` does not fit the output ``spec`` (a concrete shape, from
    :meth:`BoundCall.output_specs`), or None."""
    if spec.type == "any":
        return None  # encode_results refuses what msgpack cannot carry
    if spec.type != "array":
        return scalar_problem(spec.type, value)
    np = loaded_numpy()
    if np is None or not isinstance(value, np.ndarray):
        return f"has type {type(value).__name__}, expected a numpy array of {spec.dtype}"
    if not dtype_matches(value.dtype, spec.dtype):
        return f"has dtype {value.dtype.name}, expected {spec.dtype}"
    if spec.shape is not None:
        expected = _concrete(spec.shape)
        if value.shape != expected:
            return f"has shape {value.shape}, expected {expected}"
    return None


@functools.lru_cache(maxsize=1024)
def _concrete(shape: str) -> tuple:
    # An output spec's shape, already evaluated ("8, 8").
    return tuple(int(d) for d in shape.split(",")) if shape else ()


class _Plan:
    """How to run a call whose arguments passed :func:`invoke`'s checks, for the next calls
    with the same :meth:`Interface._bind_key` (the same sizes, dtypes, shapes, scalar types):
    they skip the argument checks, and the outputs the worker made itself (``Out`` arrays it
    allocated, ``InOut`` arrays already checked) are not checked again; only a return value
    is (issue 16: dmmul's round trip)."""

    __slots__ = ("complex_at", "inout_at", "order", "returns", "out_params", "out_specs", "zeros")

    def __init__(self, iface: Interface, specs: list) -> None:
        inputs = iface._inputs
        #: Inputs that arrive as 0-d arrays and are complex scalars.
        self.complex_at = [i for i, p in enumerate(inputs) if p.type == "complex"]
        #: InOut inputs (a read-only view of shared memory is copied before the call).
        self.inout_at = [i for i, p in enumerate(inputs) if p.mode == "inout"]
        out_specs = {spec.name: spec for spec in specs}
        #: For each parameter: an input's index, or the (shape, dtype) of an Out array.
        order: list = []
        given = 0
        for p in iface.params:
            if p.mode == "out":
                order.append((_concrete(out_specs[p.name].shape), p.dtype))
            else:
                order.append(given)
                given += 1
        self.order = order
        #: The return value's concrete spec (checked on every call), or None.
        self.returns = specs[0] if iface.returns is not None else None
        #: Parameter positions of the Out and InOut outputs, in output order.
        position = {p.name: i for i, p in enumerate(iface.params)}
        self.out_params = [position[spec.name] for spec in specs if spec.name != "return"]
        #: Their specs: checked again only if the call changed their shape or dtype.
        self.out_specs = [spec for spec in specs if spec.name != "return"]
        self.zeros = numpy_module().zeros if iface._has_out else None


def invoke(fn: Callable, iface: Interface, args_payload: bytes, inputs: list) -> bytes:
    """Run one call on a worker: decode, check, allocate the ``Out`` arrays, call, encode.

    Args:
        fn: The served function.
        iface: Its interface.
        args_payload: The call's argument payload.
        inputs: The result payloads of its dependencies.

    Returns:
        The result payload (status 0).

    Raises:
        CallError: The payload is corrupt or does not match the interface, or an output does
            not match its spec (the message names it).
        Exception: Whatever ``fn`` raises, unchanged.
    """
    values = decode_args(args_payload, inputs)
    key = iface._bind_key(values) if len(values) == len(iface._inputs) else None
    plan = iface._plans.get(key) if key is not None else None
    if plan is None:
        return _invoke_checked(fn, iface, values, key)
    for i in plan.complex_at:
        values[i] = _from_wire(iface._inputs[i], values[i])
    for i in plan.inout_at:
        if not values[i].flags.writeable:
            values[i] = owned(values[i])  # a view of shared memory: the function writes it
    zeros = plan.zeros
    args = [values[x] if type(x) is int else zeros(x[0], dtype=x[1]) for x in plan.order]
    outputs = [args[i] for i in plan.out_params]
    before = [(a.shape, a.dtype) for a in outputs]
    result = fn(*args)
    for spec, a, (shape, dtype) in zip(plan.out_specs, outputs, before):
        if a.shape != shape or a.dtype is not dtype:  # reshaped or retyped in place
            problem = _output_problem(iface, spec, a)
            if problem:
                raise CallError(f"{iface.name}: output {spec.name} {problem}")
    spec = plan.returns
    if spec is not None:
        problem = _output_problem(iface, spec, result)
        if problem:
            raise CallError(f"{iface.name}: the return value {problem}")
        outputs.insert(0, result)
    return encode_results(outputs)


def _invoke_checked(fn: Callable, iface: Interface, values: list, key: Any) -> bytes:
    """:func:`invoke` with every check; remembers a :class:`_Plan` for ``key``."""
    inputs_spec = iface._inputs
    if len(values) != len(inputs_spec):
        raise CallError(
            f"{iface.name}: the call carries {len(values)} values, the interface has "
            f"{len(inputs_spec)} inputs ({', '.join(p.name for p in inputs_spec)})"
        )
    values = [_from_wire(p, v) for p, v in zip(inputs_spec, values)]
    for i, p in enumerate(inputs_spec):
        value = values[i]
        if p.mode == "inout" and not getattr(value, "flags", _WRITABLE).writeable:
            values[i] = owned(value)  # a view of shared memory: the function writes it
    bound = iface.bind(values)
    specs = bound.output_specs()
    out_specs = {spec.name: spec for spec in specs}
    given = iter(values)
    args = []
    for p in iface.params:
        if p.mode == "out":
            spec = out_specs[p.name]
            args.append(numpy_module().zeros(_concrete(spec.shape), dtype=p.dtype))
        else:
            args.append(next(given))
    result = fn(*args)
    outputs = [] if iface.returns is None else [result]
    by_name = {p.name: a for p, a in zip(iface.params, args)}
    outputs += [by_name[spec.name] for spec in specs if spec.name != "return"]
    for spec, value in zip(specs, outputs):
        problem = _output_problem(iface, spec, value)
        if problem:
            what = "the return value" if spec.name == "return" else f"output {spec.name}"
            raise CallError(f"{iface.name}: {what} {problem}")
    if key is not None:
        plans = iface._plans
        if len(plans) >= 256:
            plans.clear()
        plans[key] = _Plan(iface, specs)
    return encode_results(outputs)


def deliver(iface: Interface, payload: bytes, out_buffers: list) -> Any:
    """Turn a result payload into what the client's call returns.

    Each output with a buffer (:attr:`BoundCall.out_buffers`) is copied into it and the buffer
    returned in its place.

    Returns:
        None for no output, the output for one, a tuple for several.

    Raises:
        CallError: The payload is corrupt or does not match the interface's outputs.
    """
    # A small payload: msgpack's C decoder, whose arrays are already copies this call owns;
    # a large one: views of the payload, copied once below (into the caller's buffer).
    copied = len(payload) <= FEED_BYTES and payload[0] != _shm.SHM_TAG
    values = decode_list(payload, copy=copied)
    outputs = iface._outputs
    if len(values) != len(outputs):
        raise CallError(
            f"{iface.name}: the result has {len(values)} values, the interface "
            f"{len(outputs)} outputs"
        )
    np = loaded_numpy()
    results = []
    for i, (p, value) in enumerate(zip(outputs, values)):
        buffer = out_buffers[i] if i < len(out_buffers) else None
        is_array = np is not None and isinstance(value, np.ndarray)
        if buffer is not None and is_array:
            try:
                np.copyto(buffer, value)
            except (ValueError, TypeError) as exc:
                raise CallError(
                    f"{iface.name}: cannot fill the buffer of {p.name}: {exc}"
                ) from None
            value = buffer
        elif is_array and not copied:
            value = owned(value)
        results.append(_from_wire(p, value) if p.type == "complex" else value)
    if not results:
        return None
    return results[0] if len(results) == 1 else tuple(results)
