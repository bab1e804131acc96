"""The annotations of remote functions: ``Array[dtype, "shape"]``, ``In``, ``Out``, ``InOut``.

They evaluate to plain values (:class:`ArraySpec`, :class:`ModeSpec`) that ``interface.py``
turns into an interface. numpy is imported only when a dtype is given as a numpy object or a
non-canonical name, so a worker without numpy can import a module of scalar functions.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .shape import normalize_shape

MODE_NAMES = {"in": "In", "out": "Out", "inout": "InOut"}

# numpy's canonical names of the dtypes an interface may use (bool, integer, float, complex).
# They are accepted as they are without importing numpy; other spellings ("f8", "double")
# need numpy to be canonicalized.
DTYPE_NAMES = frozenset(
    ["bool"]
    + [f"{sign}int{bits}" for sign in ("", "u") for bits in (8, 16, 32, 64)]
    + ["float16", "float32", "float64", "float96", "float128"]
    + ["complex64", "complex128", "complex192", "complex256"]
)


class ArraySpec(NamedTuple):
    """What ``Array[dtype, "shape"]`` evaluates to.

    Attributes:
        dtype: numpy's canonical name of the element type (``"float64"``).
        shape: The shape expression, normalized to ``"n, n"`` form; None accepts any shape.
    """

    dtype: str
    shape: str | None

    def __repr__(self) -> str:
        if self.shape is None:
            return f"Array[{self.dtype}]"
        return f"Array[{self.dtype}, {self.shape!r}]"


class ModeSpec(NamedTuple):
    """What ``In[X]``, ``Out[X]`` and ``InOut[X]`` evaluate to."""

    mode: str
    inner: Any

    def __repr__(self) -> str:
        return f"{MODE_NAMES[self.mode]}[{type_repr(self.inner)}]"


class Array:
    """Annotation of a numpy array parameter: ``Array[dtype, "shape"]`` or ``Array[dtype]``.

    ``dtype`` is a numpy scalar type (``np.float64``), a numpy dtype or a name
    (``"float64"``); the shape is a comma-separated list of dimensions, each an integer literal,
    the name of a scalar ``int`` parameter, an expression of those with ``+ - * //`` and
    parentheses, or ``*`` (any size). ``""`` is a 0-d array; ``Array[dtype]`` accepts any shape.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Array:
        raise TypeError('Array is an annotation: write Array[dtype, "shape"]')

    def __class_getitem__(cls, item: Any) -> ArraySpec:
        if isinstance(item, tuple):
            if len(item) == 1:
                item = item[0]
            elif len(item) == 2:
                dtype, shape = item
                if not isinstance(shape, str):
                    raise TypeError(
                        f'Array[dtype, "shape"]: the shape must be a string like "n, n", '
                        f"got {shape!r}"
                    )
                return ArraySpec(canonical_dtype(dtype), normalize_shape(shape))
            else:
                raise TypeError(f'Array takes Array[dtype] or Array[dtype, "shape"], got {item!r}')
        return ArraySpec(canonical_dtype(item), None)


class _ModeAnnotation:
    _mode = "in"

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"{cls.__name__} is an annotation: write {cls.__name__}[type]")

    def __class_getitem__(cls, inner: Any) -> ModeSpec:
        if isinstance(inner, ModeSpec):
            raise TypeError(f"{cls.__name__}[{inner!r}]: modes do not nest")
        return ModeSpec(cls._mode, inner)


class In(_ModeAnnotation):
    """``In[X]``: an input parameter (the default for an unwrapped annotation)."""

    _mode = "in"


class Out(_ModeAnnotation):
    """``Out[Array[dtype, "shape"]]``: an output the worker allocates from the shape (which must
    be fully determined), the function fills, and the caller gets back."""

    _mode = "out"


class InOut(_ModeAnnotation):
    """``InOut[Array[...]]``: an array that is sent, modified in place by the function and sent
    back (the caller's array is updated in place when the result arrives)."""

    _mode = "inout"


def canonical_dtype(dtype: Any) -> str:
    """numpy's canonical name of ``dtype`` (``np.float64``, ``np.dtype("f8")``, ``"double"``...).

    Raises:
        TypeError: Not a dtype, or not a bool, integer, float or complex one.
    """
    if isinstance(dtype, str) and dtype in DTYPE_NAMES:
        return dtype
    try:
        import numpy as np
    except ImportError:
        raise TypeError(
            f"dtype {dtype!r} needs numpy to be understood, and this process has no numpy; "
            f"name it by its canonical name ({', '.join(sorted(DTYPE_NAMES))})"
        ) from None
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"{dtype!r} is not a numpy dtype ({exc})") from None
    if dt.kind not in "biufc" or dt.fields is not None:
        raise TypeError(
            f"dtype {dt.name} cannot be an array element: use a bool, integer, float or "
            "complex dtype"
        )
    return dt.name


def type_repr(ann: Any) -> str:
    """How an annotation reads in a message."""
    if isinstance(ann, type):
        return ann.__qualname__
    return repr(ann)
