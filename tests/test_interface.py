"""Interfaces of named remote functions: extraction, wire format, text, checks (no network)."""

import pydoc
import subprocess
import sys
import textwrap
import typing

import msgpack
import numpy as np
import pytest

import rtpool
from rtpool import Array, CallError, In, InOut, Interface, Out, remote
from rtpool.errors import ProtocolError
from rtpool.rpc.interface import Param
from rtpool.rpc.remote import served_functions, version_key

# Shapes named outside the annotations, so linters do not read "n" as a forward reference.
Mat = Array[np.float64, "n, n"]
Vec = Array[np.float64, "n"]
IVec = Array[np.int32, "n"]
AnyShape = Array[np.float64]
Rows = Array[np.float64, "n, *"]
Wide = Array[np.float64, "n, m + 1"]


@remote("dmmul", version="1")
def dmmul(n: int, A: Mat, B: Mat, C: Out[Mat]) -> None:
    """dmmul is double precision matrix multiply"""
    np.matmul(A, B, out=C)


@remote("dgefa")
def dgefa(n: int, A: InOut[Mat], ipvt: Out[IVec]) -> int:
    return 0


@remote
def kinds(
    i: int,
    f: float,
    c: complex,
    b: bool,
    s: str,
    by: bytes,
    anything,
    typed_any: typing.Any,
    n: int,
    m: int,
    arr: In[Wide],
    free: AnyShape,
    rows: Rows,
    io: InOut[Vec],
    out: Out[IVec],
) -> Vec:
    return np.zeros(n)


def iface_of(fn) -> Interface:
    return fn.__rtpool_remote__


def write_module(tmp_path, monkeypatch, name: str, source: str) -> str:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


# --- extraction ------------------------------------------------------------------------------


def test_every_param_kind_and_mode_is_extracted():
    iface = iface_of(kinds)
    assert [(p.name, p.mode, p.type, p.dtype, p.shape) for p in iface.params] == [
        ("i", "in", "int", None, None),
        ("f", "in", "float", None, None),
        ("c", "in", "complex", None, None),
        ("b", "in", "bool", None, None),
        ("s", "in", "str", None, None),
        ("by", "in", "bytes", None, None),
        ("anything", "in", "any", None, None),
        ("typed_any", "in", "any", None, None),
        ("n", "in", "int", None, None),
        ("m", "in", "int", None, None),
        ("arr", "in", "array", "float64", "n, m + 1"),
        ("free", "in", "array", "float64", None),
        ("rows", "in", "array", "float64", "n, *"),
        ("io", "inout", "array", "float64", "n"),
        ("out", "out", "array", "int32", "n"),
    ]
    assert iface.returns == Param("return", "out", "array", "float64", "n")
    assert iface.name == "kinds" and iface.version == "1"
    assert iface.module == __name__
    assert [p.name for p in iface.inputs][-3:] == ["free", "rows", "io"]
    assert [p.name for p in iface.outputs] == ["return", "io", "out"]


def test_remote_returns_the_function_unchanged_and_callable():
    n = 3
    A = np.eye(n)
    C = np.empty((n, n))
    assert dmmul(n, A, 2 * A, C) is None
    np.testing.assert_array_equal(C, 2 * A)
    assert dmmul.__name__ == "dmmul" and dmmul.__doc__.startswith("dmmul is")
    iface = iface_of(dmmul)
    assert iface.doc == "dmmul is double precision matrix multiply"
    assert iface.servers == 0


def test_name_defaults_to_the_function_name_and_version_to_1():
    @remote()
    def plain(a: int) -> int:
        return a

    @remote(version="2.1")
    def other(a: int) -> int:
        return a

    assert (iface_of(plain).name, iface_of(plain).version) == ("plain", "1")
    assert (iface_of(other).name, iface_of(other).version) == ("other", "2.1")


def test_unannotated_return_is_any_and_none_return_is_no_output():
    @remote
    def untyped(x):
        return x

    @remote
    def nothing(x: int) -> None:
        pass

    assert iface_of(untyped).returns == Param("return", "out", "any")
    assert iface_of(nothing).returns is None
    assert iface_of(nothing).outputs == []


def test_dtype_spellings_are_canonical_numpy_names():
    for dtype in (np.float64, np.dtype("f8"), "float64", "double", float):
        assert Array[dtype, "n"].dtype == "float64"
    assert Array[np.int32].dtype == "int32" and Array[np.int32].shape is None
    assert Array["complex128", " n ,m "].shape == "n, m"
    assert Array["bool", ""].shape == ""
    assert Array["uint8", "n,"].shape == "n"


def test_unsupported_dtypes_are_refused():
    with pytest.raises(TypeError, match="dtype object cannot be an array element"):
        Array[object, "n"]
    with pytest.raises(TypeError, match="'nonsense' is not a numpy dtype"):
        Array["nonsense", "n"]
    with pytest.raises(TypeError, match="the shape must be a string"):
        Array[np.float64, 3]
    with pytest.raises(TypeError, match="Array is an annotation"):
        Array()


def test_string_annotations_are_resolved_in_the_module(tmp_path, monkeypatch):
    name = write_module(
        tmp_path,
        monkeypatch,
        "rpc_strings",
        """
        from __future__ import annotations

        import numpy as np
        from rtpool import Array, InOut, Out, remote

        @remote("dgefa")
        def dgefa(n: int, A: InOut[Array[np.float64, "n, n"]],
                  ipvt: Out[Array["int32", "n"]]) -> int:
            return 0

        @remote("scalars", version="3")
        def scalars(a: int, b: float, c) -> str:
            "Doc of scalars."
            return ""
        """,
    )
    served = served_functions(name)
    assert [(i.name, i.version) for _, i in served] == [("dgefa", "1"), ("scalars", "3")]
    assert served[0][1].params == iface_of(dgefa).params
    assert served[0][1].returns == Param("return", "out", "int")
    assert served[1][1].signature == "scalars(a: int, b: float, c: any) -> str"
    assert served[1][1].doc == "Doc of scalars."
    assert served[1][1].module == "rpc_strings"


def test_a_process_without_numpy_imports_scalar_and_named_dtype_modules():
    code = textwrap.dedent(
        """
        import sys
        sys.modules["numpy"] = None  # import numpy fails from here on
        import rtpool
        from rtpool import Array, Out, remote

        @remote
        def add(a: int, b: int) -> int:
            return a + b

        V = Array["float64", "n"]

        @remote
        def fill(n: int, x: Out[V]) -> None:
            pass

        print(fill.__rtpool_remote__.signature)
        try:
            Array["double", "n"]
        except TypeError as exc:
            print("refused:", exc)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "fill(n: int) -> x: Out[float64[n]]"
    assert lines[1].startswith("refused: dtype 'double' needs numpy to be understood")


def test_import_rtpool_does_not_import_numpy_or_the_interface_module():
    code = (
        "import sys, rtpool; assert 'numpy' not in sys.modules; "
        "assert 'rtpool.rpc.interface' not in sys.modules; rtpool.remote; "
        "assert 'numpy' not in sys.modules; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "ok", out.stderr


def test_public_names_are_exported():
    for name in ("Array", "In", "Out", "InOut", "Interface", "remote", "CallError"):
        assert name in rtpool.__all__ and getattr(rtpool, name) is not None
    assert issubclass(rtpool.CallError, rtpool.errors.RtpoolError)
    assert issubclass(rtpool.CallError, TypeError)
    assert issubclass(rtpool.UnknownFunctionError, LookupError)


# --- decoration-time errors ------------------------------------------------------------------


def decoration_error(fn_factory) -> str:
    with pytest.raises(TypeError) as info:
        fn_factory()
    return str(info.value)


def test_out_needs_a_fully_determined_array_shape():
    def no_shape():
        @remote
        def f(n: int, x: Out[AnyShape]) -> None: ...

    def star():
        @remote
        def g(n: int, x: Out[Rows]) -> None: ...

    def scalar_out():
        @remote
        def h(n: Out[int]) -> None: ...

    def scalar_inout():
        @remote
        def k(n: InOut[float]) -> None: ...

    assert decoration_error(no_shape) == (
        "f: parameter x is Out[float64[...]]: an Out array needs a fully determined shape "
        "(no '*', not Array[dtype] alone) for the worker to allocate it"
    )
    assert "g: parameter x is Out[float64[n, *]]" in decoration_error(star)
    assert decoration_error(scalar_out) == (
        "h: parameter n is Out[int]: only arrays can be Out (return a scalar instead)"
    )
    assert "k: parameter n is InOut[float]: only arrays can be InOut" in decoration_error(
        scalar_inout
    )


def test_shape_names_must_be_int_parameters():
    def unknown():
        @remote
        def f(x: Vec) -> None: ...

    def not_int():
        @remote
        def g(n: float, x: Vec) -> None: ...

    def in_return():
        @remote
        def h(m: int) -> Vec: ...

    assert decoration_error(unknown) == (
        "f: the shape of parameter x ('n') names n, which is not a parameter"
    )
    assert decoration_error(not_int) == (
        "g: the shape of parameter x ('n') names n, which is not an int input parameter"
    )
    assert decoration_error(in_return) == (
        "h: the shape of the return value ('n') names n, which is not a parameter"
    )


@pytest.mark.parametrize(
    ("shape", "reason"),
    [
        ("n n", "'n n': not an expression"),
        ("n ** 2", "'n ** 2': only + - * // are allowed"),
        ("n / 2", "'n / 2': only + - * // are allowed"),
        ("f(n)", "'f(n)': a dimension is an integer, a parameter name, + - * // or ( )"),
        ("1.5", "'1.5': 1.5 is not an integer"),
        ("n, , n", "'n, , n': empty dimension (dimension '')"),
        (
            "n, -n",
            "'n, -n': a dimension is an integer, a parameter name, + - * // or ( ) "
            "(dimension '-n')",
        ),
        ("__import__('os')", "a dimension is an integer, a parameter name, + - * // or ( )"),
    ],
)
def test_invalid_shape_expressions_are_refused(shape, reason):
    spec = Array[np.float64, shape]

    def make():
        @remote
        def bad(n: int, x: spec) -> None: ...

    message = decoration_error(make)
    assert message.startswith("bad: parameter x has an invalid shape "), message
    assert message.endswith(reason)


def test_signatures_that_cannot_be_served_are_refused():
    def star_args():
        @remote
        def f(*args: int) -> None: ...

    def star_kwargs():
        @remote
        def g(a: int, **kw: int) -> None: ...

    def keyword_only():
        @remote
        def h(a: int, *, b: int) -> None: ...

    def unsupported():
        @remote
        def k(a: list) -> None: ...

    def mode_on_return():
        @remote
        def r(n: int) -> Out[Vec]: ...

    def renamed():
        @remote("public_name")
        def local_name(a: dict) -> None: ...

    def nested_modes():
        Out[In[Vec]]

    assert "f: parameter *args: a remote function has a fixed list" in decoration_error(star_args)
    assert "g: parameter **kw" in decoration_error(star_kwargs)
    assert decoration_error(keyword_only) == (
        "h: parameter b is keyword-only: remote calls are positional"
    )
    assert decoration_error(unsupported).startswith(
        "k: parameter a has an unsupported annotation list: use int, float"
    )
    assert "r: the return value is annotated Out[" in decoration_error(mode_on_return)
    # Registered under another name: the message gives both.
    assert decoration_error(renamed).startswith("public_name (")
    assert "local_name): parameter a has an unsupported annotation dict" in decoration_error(
        renamed
    )
    assert "modes do not nest" in decoration_error(nested_modes)


def test_unresolvable_string_annotation_names_the_parameter():
    def make():
        @remote
        def f(a: "NoSuchType") -> None: ...  # noqa: F821

    assert decoration_error(make).startswith(
        "f: parameter a: cannot resolve the annotation 'NoSuchType'"
    )


def test_name_and_version_must_be_strings():
    with pytest.raises(TypeError, match="a version is a string"):
        remote("f", version=2)(lambda: None)
    with pytest.raises(TypeError, match="the name must be a string"):
        remote(3)
    with pytest.raises(TypeError, match="a function name is a string of 1 to 128 bytes"):
        remote("x" * 129)(lambda: None)


# --- wire format ----------------------------------------------------------------------------


def test_to_bytes_is_the_documented_msgpack_map_in_order():
    data = iface_of(dgefa).to_bytes()
    decoded = msgpack.unpackb(data, raw=False)
    assert decoded == {
        "name": "dgefa",
        "version": "1",
        "doc": "",
        "module": __name__,
        "params": [
            {"name": "n", "mode": "in", "type": "int", "dtype": None, "shape": None},
            {"name": "A", "mode": "inout", "type": "array", "dtype": "float64", "shape": "n, n"},
            {"name": "ipvt", "mode": "out", "type": "array", "dtype": "int32", "shape": "n"},
        ],
        "returns": {"type": "int", "dtype": None, "shape": None},
    }
    assert list(decoded) == ["name", "version", "doc", "module", "params", "returns"]
    assert list(decoded["params"][0]) == ["name", "mode", "type", "dtype", "shape"]
    assert list(decoded["returns"]) == ["type", "dtype", "shape"]
    # str and bin are distinct in msgpack: the strings are str (0xa0..0xbf / 0xd9), not bin.
    assert data[0] == 0x86 and data[1:6] == b"\xa4name"


def test_from_bytes_round_trips():
    for fn in (dmmul, dgefa, kinds):
        iface = iface_of(fn)
        back = Interface.from_bytes(iface.to_bytes(), servers=3)
        assert back == iface
        assert back.servers == 3
        assert back.to_bytes() == iface.to_bytes()
        assert str(back) == str(iface)


def good_dict() -> dict:
    return msgpack.unpackb(iface_of(dgefa).to_bytes(), raw=False)


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda d: d.pop("params"), "no 'params' key"),
        (lambda d: d.update(name=3), "name must be a string"),
        (lambda d: d.update(name=""), "a function name is a string of 1 to 128 bytes"),
        (lambda d: d["params"][1].update(mode="both"), "has mode 'both'"),
        (lambda d: d["params"][1].update(type="matrix"), "has type 'matrix'"),
        (lambda d: d["params"][1].update(shape="m, m"), "names m, which is not a parameter"),
        (lambda d: d["params"][2].update(shape=None), "an Out array needs a fully determined"),
        (lambda d: d["params"][0].update(dtype="float64"), "is a scalar with a dtype or shape"),
        (lambda d: d["params"][1].update(shape="n,n"), "shape 'n,n' is not normalized"),
        (lambda d: d.update(returns=[1]), "returns must be a map or nil"),
        (lambda d: d["params"].append(d["params"][0]), "parameter n appears twice"),
        (lambda d: d["params"][0].update(name="return"), "'return' is a Python keyword"),
        (lambda d: d["params"][0].update(name="a b"), "'a b' is not an identifier"),
    ],
)
def test_from_bytes_refuses_invalid_interfaces(mutate, reason):
    d = good_dict()
    mutate(d)
    with pytest.raises(ProtocolError, match="invalid interface") as info:
        Interface.from_bytes(msgpack.packb(d))
    assert reason in str(info.value)


def test_from_bytes_refuses_garbage():
    with pytest.raises(ProtocolError, match="not valid msgpack"):
        Interface.from_bytes(b"\xc1")
    with pytest.raises(ProtocolError, match="expected a map, got list"):
        Interface.from_bytes(msgpack.packb([1, 2]))


# --- text ------------------------------------------------------------------------------------


def test_signature_text():
    assert iface_of(dmmul).signature == (
        "dmmul(n: int, A: In[float64[n, n]], B: In[float64[n, n]]) -> C: Out[float64[n, n]]"
    )
    assert iface_of(dgefa).signature == (
        "dgefa(n: int, A: InOut[float64[n, n]]) -> "
        "(int, A: InOut[float64[n, n]], ipvt: Out[int32[n]])"
    )
    assert iface_of(kinds).signature == (
        "kinds(i: int, f: float, c: complex, b: bool, s: str, by: bytes, anything: any, "
        "typed_any: any, n: int, m: int, arr: In[float64[n, m + 1]], free: In[float64[...]], "
        "rows: In[float64[n, *]], io: InOut[float64[n]]) -> "
        "(Out[float64[n]], io: InOut[float64[n]], out: Out[int32[n]])"
    )

    @remote
    def noop() -> None:
        pass

    assert iface_of(noop).signature == "noop() -> None"
    assert str(iface_of(noop)) == "noop() -> None"


def test_str_repr_and_help_show_signature_and_doc():
    iface = iface_of(dmmul)
    assert str(iface) == (
        "dmmul(n: int, A: In[float64[n, n]], B: In[float64[n, n]]) -> C: Out[float64[n, n]]"
        "\n\ndmmul is double precision matrix multiply"
    )
    assert repr(iface) == "<Interface dmmul version '1'>"
    text = pydoc.render_doc(iface, renderer=pydoc.plaintext)
    assert "dmmul is double precision matrix multiply" in text
    assert "-> C: Out[float64[n, n]]" in text


# --- bind ------------------------------------------------------------------------------------


def call_error(iface: Interface, *args) -> str:
    with pytest.raises(CallError) as info:
        iface.bind(args)
    return str(info.value)


def test_bind_accepts_inputs_and_reports_values_buffers_and_specs():
    iface = iface_of(dmmul)
    A, B = np.ones((8, 8)), np.eye(8)
    bound = iface.bind((np.int64(8), A, B.T))
    assert bound.values[0] == 8 and bound.values[1] is A
    assert bound.values[2].base is B  # not made contiguous here: the codec does that
    assert bound.out_buffers == [None]
    assert bound.scalars == {"n": 8}
    assert bound.output_specs() == [Param("C", "out", "array", "float64", "8, 8")]


def test_bind_accepts_ninf_style_output_buffers():
    iface = iface_of(dmmul)
    A = np.ones((8, 8))
    C = np.empty((8, 8))
    bound = iface.bind((8, A, A, C))
    assert len(bound.values) == 3
    assert bound.out_buffers[0] is C


def test_bind_inout_buffer_is_the_input_array_itself():
    iface = iface_of(dgefa)
    A = np.ones((4, 4))
    bound = iface.bind((4, A))
    assert bound.out_buffers[0] is None  # the return value
    assert bound.out_buffers[1] is A
    assert bound.out_buffers[2] is None
    specs = bound.output_specs()
    assert [(s.name, s.type, s.shape) for s in specs] == [
        ("return", "int", None),
        ("A", "array", "4, 4"),
        ("ipvt", "array", "4"),
    ]
    ipvt = np.zeros(4, np.int32)
    assert iface.bind((4, A, ipvt)).out_buffers == [None, A, ipvt]


def test_bind_rejects_wrong_shape_dtype_and_count():
    iface = iface_of(dmmul)
    A = np.ones((8, 8))
    assert call_error(iface, 8, A, np.ones((8, 9))) == (
        "dmmul: argument B has shape (8, 9), expected (n, n) = (8, 8)"
    )
    assert call_error(iface, 8, A, np.ones(8)) == (
        "dmmul: argument B has shape (8,), expected (n, n) = (8, 8)"
    )
    assert call_error(iface, 8, A.astype(np.int64), A) == (
        "dmmul: argument A has dtype int64, expected float64"
    )
    assert call_error(iface, 8, A.astype(np.float32), A) == (
        "dmmul: argument A has dtype float32, expected float64"
    )
    assert call_error(iface, 8, A) == (
        "dmmul takes 3 arguments (n, A, B) or 4 with the outputs (n, A, B, C), got 2"
    )
    assert call_error(iface, 8, A, A, A, A) == (
        "dmmul takes 3 arguments (n, A, B) or 4 with the outputs (n, A, B, C), got 5"
    )
    assert call_error(iface, 8, A.tolist(), A) == (
        "dmmul: argument A has type list, expected a numpy array of float64"
    )
    add = Interface("add", "1", "", "m", [Param("a", type="int"), Param("b", type="int")])
    assert call_error(add, 1) == "add takes 2 arguments (a, b), got 1"
    one = Interface("one", "1", "", "m", [Param("a", type="int")])
    assert call_error(one) == "one takes 1 argument (a), got 0"
    none = Interface("none", "1", "", "m", [])
    assert call_error(none, 1) == "none takes no arguments, got 1"


def test_bind_checks_output_buffers():
    iface = iface_of(dmmul)
    A = np.ones((8, 8))
    assert call_error(iface, 8, A, A, np.empty((8, 7))) == (
        "dmmul: argument C has shape (8, 7), expected (n, n) = (8, 8)"
    )
    assert call_error(iface, 8, A, A, np.empty((8, 8), np.float32)) == (
        "dmmul: argument C has dtype float32, expected float64"
    )
    frozen = np.empty((8, 8))
    frozen.flags.writeable = False
    assert call_error(iface, 8, A, A, frozen) == (
        "dmmul: argument C is read-only; an output buffer must be writable"
    )
    assert "argument A is read-only; an InOut array" in call_error(iface_of(dgefa), 8, frozen)


def test_bind_checks_again_whatever_it_accepted_before():
    # bind() remembers the calls that passed its checks (by dtype, shape, int values): a call
    # that differs in any of them is checked in full.
    iface = iface_of(dmmul)
    A, C = np.ones((8, 8)), np.empty((8, 8))
    for _ in range(2):
        bound = iface.bind((8, A, A, C))
        assert bound.out_buffers[0] is C and bound.scalars == {"n": 8}
        assert bound.output_specs() == [Param("C", "out", "array", "float64", "8, 8")]
    frozen = np.empty((8, 8))
    frozen.flags.writeable = False
    assert "argument C is read-only" in call_error(iface, 8, A, A, frozen)
    assert "has shape (8, 8), expected (n, n) = (9, 9)" in call_error(iface, 9, A, A)
    assert "has dtype float32" in call_error(iface, 8, A, A.astype(np.float32))
    assert "out of the 64-bit integer range" in call_error(iface, 1 << 70, A, A)
    assert iface.bind((4, np.ones((4, 4)), np.ones((4, 4)))).output_specs()[0].shape == "4, 4"


@pytest.mark.parametrize(
    ("type_name", "good", "bad"),
    [
        ("int", [3, np.int64(3), np.uint8(3), 2**64 - 1], [True, 3.0, "3", np.float64(3), None]),
        ("float", [3, 3.5, np.float32(1), np.int32(2)], [True, "3", 1j, None]),
        ("complex", [1, 1.5, 2j, np.complex64(1j)], [True, "1", None]),
        ("bool", [True, False, np.bool_(True)], [1, 0, "yes", None]),
        ("str", ["", "x"], [b"x", 1]),
        ("bytes", [b"", bytearray(b"x")], ["x", 1]),
        ("any", [None, 1, [1, {"a": b"x"}], (1.5, np.ones(2)), np.float32(1)], [{1, 2}]),
    ],
)
def test_bind_checks_scalar_types(type_name, good, bad):
    iface = Interface("f", "1", "", "m", [Param("x", type=type_name)])
    for value in good:
        assert iface.bind((value,)).values == [value]
    for value in bad:
        message = call_error(iface, value)
        assert message.startswith("f: argument x "), message
    if type_name != "any":
        assert call_error(iface, object()) == f"f: argument x has type object, expected {type_name}"


def test_bind_scalar_messages():
    add = Interface("add", "1", "", "m", [Param("a", type="int"), Param("b", type="int")])
    assert call_error(add, 1, "2") == "add: argument b has type str, expected int"
    assert call_error(add, True, 2) == "add: argument a has type bool, expected int"
    assert call_error(add, 2**64, 2) == (
        "add: argument a is 18446744073709551616, out of the 64-bit integer range"
    )
    anyf = Interface("g", "1", "", "m", [Param("x")])
    assert call_error(anyf, [1, {2}]).startswith(
        "g: argument x contains a set, which cannot be sent"
    )


def test_bind_shapes_with_expressions_wildcards_and_any_shape():
    iface = iface_of(kinds)
    n, m = 3, 4
    args = [1, 1.0, 1j, True, "s", b"b", None, None, n, m]
    good = args + [np.zeros((3, 5)), np.zeros((2, 2, 2)), np.zeros((3, 17)), np.zeros(3)]
    bound = iface.bind(good)
    assert [s.shape for s in bound.output_specs()] == ["3", "3", "3"]
    bad = args + [np.zeros((3, 4)), np.zeros(1), np.zeros((3, 1)), np.zeros(3)]
    assert call_error(iface, *bad) == (
        "kinds: argument arr has shape (3, 4), expected (n, m + 1) = (3, 5)"
    )
    bad = args + [np.zeros((3, 5)), np.zeros(1), np.zeros((2, 1)), np.zeros(3)]
    assert call_error(iface, *bad) == (
        "kinds: argument rows has shape (2, 1), expected (n, *) = (3, *)"
    )


def test_bind_literal_shape_message_has_no_values_part():
    lit = Interface("lit", "1", "", "m", [Param("x", "in", "array", "float64", "2, 3")])
    assert call_error(lit, np.zeros(6)) == "lit: argument x has shape (6,), expected (2, 3)"
    zero_d = Interface("z", "1", "", "m", [Param("x", "in", "array", "float64", "")])
    assert zero_d.bind((np.array(1.0),)).values[0].shape == ()
    assert call_error(zero_d, np.zeros(1)) == "z: argument x has shape (1,), expected ()"


def test_bind_negative_or_undefined_shapes_are_call_errors():
    iface = Interface(
        "f",
        "1",
        "",
        "m",
        [Param("n", type="int"), Param("x", "out", "array", "float64", "n - 2, 4 // n")],
    )
    assert call_error(iface, 1) == "f: the shape of x (n - 2, 4 // n) is (-1, 4), a negative size"
    assert call_error(iface, 0) == "f: the shape of x (n - 2, 4 // n) divides by zero"
    assert iface.bind((4,)).output_specs()[0].shape == "2, 1"
    assert call_error(iface, 1, np.zeros((1, 1))).endswith("a negative size")


class FakeRef:
    """What a transaction future looks like to bind()."""

    def __init__(self, call: int, output: int, spec) -> None:
        self.__rtpool_ref__ = (call, output, spec)


def test_bind_keeps_refs_without_spec():
    iface = iface_of(dgefa)
    ref = FakeRef(0, 1, None)
    bound = iface.bind((4, ref))
    assert bound.values[1] is ref
    assert bound.out_buffers == [None, None, None]
    n_ref = FakeRef(2, 0, None)
    bound = iface.bind((n_ref, np.ones((5, 5))))
    assert bound.values[0] is n_ref
    assert bound.scalars == {}
    # n comes from another call: the shapes it determines are unknown here.
    assert [s.shape for s in bound.output_specs()] == [None, None, None]


def test_bind_checks_refs_against_their_spec():
    iface = iface_of(dmmul)
    A = np.ones((8, 8))
    good = FakeRef(0, 2, Param("C", "out", "array", "float64", "8, 8"))
    assert iface.bind((8, A, good)).values[2] is good
    wrong_shape = FakeRef(0, 2, Param("C", "out", "array", "float64", "8, 9"))
    assert call_error(iface, 8, A, wrong_shape) == (
        "dmmul: argument B (output 2 of call #0) has shape (8, 9), expected (n, n) = (8, 8)"
    )
    wrong_dtype = FakeRef(1, 0, Param("x", "out", "array", "int32", "8, 8"))
    assert call_error(iface, 8, wrong_dtype, A) == (
        "dmmul: argument A (output 0 of call #1) has dtype int32, expected float64"
    )
    scalar = FakeRef(1, 0, Param("return", "out", "int"))
    assert call_error(iface, 8, scalar, A) == (
        "dmmul: argument A (output 0 of call #1) has type int, expected float64[n, n]"
    )
    unknown_shape = FakeRef(0, 2, Param("C", "out", "array", "float64", None))
    assert iface.bind((8, A, unknown_shape)).values[2] is unknown_shape
    int_for_float = FakeRef(0, 0, Param("return", "out", "int"))
    f = Interface("f", "1", "", "m", [Param("x", type="float")])
    assert f.bind((int_for_float,)).values == [int_for_float]
    assert call_error(f, FakeRef(0, 0, Param("return", "out", "str"))) == (
        "f: argument x (output 0 of call #0) has type str, expected float"
    )


def test_bind_refuses_a_ref_for_an_output_buffer():
    iface = iface_of(dmmul)
    A = np.ones((2, 2))
    assert call_error(iface, 2, A, A, FakeRef(0, 0, None)).startswith(
        "dmmul: argument C is an output buffer; a call's result cannot stand for it"
    )


# --- served_functions ------------------------------------------------------------------------


def test_served_functions_of_the_test_modules():
    import tasks.rpc
    import tasks.rpc_v2

    served = served_functions("tasks.rpc")
    assert [i.name for _, i in served] == ["add", "fail", "noop", "scale", "shape_of", "slow"]
    fn, iface = served[0]
    assert fn is tasks.rpc.add and iface is tasks.rpc.add.__rtpool_remote__
    assert iface.signature == "add(a: int, b: int) -> int"
    shape_of = dict((i.name, i) for _, i in served)["shape_of"]
    assert shape_of.signature == "shape_of(n: int, m: int, A: In[float64[n, m]]) -> Out[int64[2]]"
    ((fn2, iface2),) = served_functions("tasks.rpc_v2")
    assert fn2 is tasks.rpc_v2.add and (iface2.name, iface2.version) == ("add", "2")
    assert fn2(1, 2) == 1003


def test_served_functions_errors(tmp_path, monkeypatch):
    empty = write_module(tmp_path, monkeypatch, "rpc_empty", "def f(): pass\n")
    with pytest.raises(ValueError) as info:
        served_functions(empty)
    assert str(info.value) == (
        "module rpc_empty serves no functions: mark them with @rtpool.remote"
    )
    with pytest.raises(ImportError, match="cannot import module rpc_missing_mod to serve"):
        served_functions("rpc_missing_mod")
    broken = write_module(tmp_path, monkeypatch, "rpc_broken", "import no_such_dependency_x\n")
    with pytest.raises(ImportError) as info:
        served_functions(broken)
    assert "module rpc_broken" in str(info.value) and "no_such_dependency_x" in str(info.value)
    twice = write_module(
        tmp_path,
        monkeypatch,
        "rpc_twice",
        """
        from rtpool import remote

        @remote("f")
        def f1(): pass

        @remote("f")
        def f2(): pass
        """,
    )
    with pytest.raises(ValueError, match="module rpc_twice serves f version 1 twice"):
        served_functions(twice)


def test_served_functions_sort_versions_numerically(tmp_path, monkeypatch):
    name = write_module(
        tmp_path,
        monkeypatch,
        "rpc_versions",
        """
        from rtpool import remote

        @remote("f", version="1.10")
        def f10(): pass

        @remote("f", version="1.9")
        def f9(): pass

        @remote("a", version="beta")
        def a(): pass

        alias = f9  # the same function under two names is served once
        """,
    )
    served = served_functions(name)
    assert [(i.name, i.version) for _, i in served] == [("a", "beta"), ("f", "1.9"), ("f", "1.10")]
    assert version_key("2") > version_key("1.10") > version_key("1.9")
