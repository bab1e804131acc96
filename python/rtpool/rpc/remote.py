"""Named remote functions from Python functions (grid RPC, ``docs/rpc.md``): the
:func:`remote` decorator, which builds a function's :class:`~rtpool.Interface` from its
signature, annotations and docstring, and :func:`served_functions`, which lists what a module
serves (``rtpool worker --serve``).
"""

from __future__ import annotations

import importlib
import inspect
import typing
from typing import Any, Callable

from .annotations import ArraySpec, ModeSpec, type_repr
from .interface import Interface
from .params import MAX_INTERFACE_BYTES, Param, check_name_version

__all__ = ["interface_of", "remote", "served_functions", "version_key"]

_SCALAR_TYPES = {int: "int", float: "float", complex: "complex", bool: "bool", str: "str"}
_SCALAR_TYPES[bytes] = "bytes"


# --- building interfaces from functions -----------------------------------------------------


def _resolve(ann: Any, fn: Callable, where: str) -> Any:
    if not isinstance(ann, str):
        return ann
    # A string annotation (from __future__ import annotations) is evaluated in the function's
    # module, as typing.get_type_hints does; get_type_hints itself refuses non-type
    # annotations like Array[...] on Python < 3.11.
    globalns = getattr(inspect.unwrap(fn), "__globals__", {})
    try:
        return eval(ann, globalns, {})  # noqa: S307 - annotation text, as typing evaluates it
    except Exception as exc:
        raise TypeError(f"{where}: cannot resolve the annotation {ann!r} ({exc})") from None


def _param_from_annotation(name: str, ann: Any, fname: str, is_return: bool) -> Param:
    where = f"{fname}: the return value" if is_return else f"{fname}: parameter {name}"
    mode = "out" if is_return else "in"
    if isinstance(ann, ModeSpec):
        if is_return:
            raise TypeError(f"{where} is annotated {ann!r}: a return annotation takes no mode")
        mode, ann = ann.mode, ann.inner
    if isinstance(ann, ArraySpec):
        return Param(name, mode, "array", ann.dtype, ann.shape)
    if ann is inspect.Parameter.empty or ann is typing.Any or ann is object:
        type_name = "any"
    elif ann in _SCALAR_TYPES:
        type_name = _SCALAR_TYPES[ann]
    else:
        raise TypeError(
            f"{where} has an unsupported annotation {type_repr(ann)}: use int, float, "
            'complex, bool, str, bytes, Array[dtype, "shape"], In/Out/InOut[...] or none'
        )
    return Param(name, mode, type_name)


def interface_of(fn: Callable, name: str | None = None, version: str = "1") -> Interface:
    """Build the interface of ``fn`` (what :func:`remote` stores).

    Raises:
        TypeError: The signature cannot be served: ``*args``/``**kwargs``, keyword-only
            parameters, an unsupported annotation, an ``Out`` without a determined shape, a
            shape naming something other than an ``int`` parameter.
    """
    qualname = getattr(fn, "__qualname__", repr(fn))
    fname = name if name == getattr(fn, "__name__", None) else f"{name} ({qualname})"
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{fname}: cannot read the signature ({exc})") from None
    params = []
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            star = "*" if p.kind == p.VAR_POSITIONAL else "**"
            raise TypeError(
                f"{fname}: parameter {star}{p.name}: a remote function has a fixed list of "
                "positional parameters"
            )
        if p.kind == p.KEYWORD_ONLY:
            raise TypeError(
                f"{fname}: parameter {p.name} is keyword-only: remote calls are positional"
            )
        ann = _resolve(p.annotation, fn, f"{fname}: parameter {p.name}")
        params.append(_param_from_annotation(p.name, ann, fname, is_return=False))
    ret_ann = _resolve(sig.return_annotation, fn, f"{fname}: the return value")
    returns = None
    if ret_ann is not None and ret_ann is not type(None):
        # An unannotated return is "any", as an unannotated parameter is.
        returns = _param_from_annotation("return", ret_ann, fname, is_return=True)
    doc = inspect.cleandoc(fn.__doc__) if getattr(fn, "__doc__", None) else ""
    module = getattr(fn, "__module__", None) or ""
    iface = Interface(name, version, doc, module, params, returns, _label=fname)
    size = len(iface.to_bytes())
    if size > MAX_INTERFACE_BYTES:
        raise TypeError(f"{fname}: the interface takes {size} bytes, over 64 KiB (docstring?)")
    return iface


def remote(name: Any = None, *, version: str = "1") -> Any:
    """Mark a module-level function as a named remote function (``docs/rpc.md``).

    ``@remote``, ``@remote()``, ``@remote("dmmul")`` and ``@remote("dmmul", version="2")``
    all work. The interface is built from the signature, annotations and docstring at
    decoration time and stored as ``fn.__rtpool_remote__``; the function is returned unchanged,
    so it can still be called locally.

    Args:
        name: The registered name (default: the function's ``__name__``), 1 to 128 bytes.
        version: The version string, at most 64 bytes.

    Raises:
        TypeError: The function's signature cannot be served (the message names the function
            and the parameter), or the name or version is not a string.
    """
    if callable(name) and not isinstance(name, str):
        return remote(None, version=version)(name)
    if name is not None and not isinstance(name, str):
        raise TypeError(f"@rtpool.remote: the name must be a string, got {name!r}")

    def decorate(fn: Callable) -> Callable:
        fn_name = name if name is not None else getattr(fn, "__name__", None)
        check_name_version(fn_name, version)
        fn.__rtpool_remote__ = interface_of(fn, fn_name, version)
        return fn

    return decorate


def version_key(version: str) -> tuple:
    """Sort key of versions: dot-separated parts compare as numbers where they are numbers
    (``"1.10"`` after ``"1.9"``), as strings otherwise."""
    return tuple(
        (0, int(part), "") if part.isdigit() else (1, 0, part) for part in version.split(".")
    )


def served_functions(module_name: str) -> list:
    """Import ``module_name`` and list the functions it serves.

    Every module-level attribute marked with :func:`remote` is served (a function re-exported
    from another module too), sorted by name and version.

    Returns:
        ``[(fn, interface), ...]``.

    Raises:
        ImportError: The module cannot be imported (the message names it).
        ValueError: The module marks no function, or marks two with the same name and version.
    """
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        msg = f"cannot import module {module_name} to serve its functions: {exc}"
        raise type(exc)(msg, name=exc.name, path=exc.path) from exc
    found: dict = {}
    for attr in list(vars(module).values()):
        iface = getattr(attr, "__rtpool_remote__", None)
        if not isinstance(iface, Interface):
            continue
        key = (iface.name, iface.version)
        other = found.get(key)
        if other is not None and other[0] is not attr:
            raise ValueError(
                f"module {module_name} serves {iface.name} version {iface.version} twice "
                f"({_qualname(other[0])} and {_qualname(attr)})"
            )
        found[key] = (attr, iface)
    if not found:
        raise ValueError(f"module {module_name} serves no functions: mark them with @rtpool.remote")
    return [found[key] for key in sorted(found, key=lambda k: (k[0], version_key(k[1])))]


def _qualname(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
