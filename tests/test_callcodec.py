"""The value format of named remote calls (docs/rpc.md, "Values"), invoke() and deliver()."""

import random
import struct
import subprocess
import sys
import textwrap

import msgpack
import numpy as np
import pytest

import tasks.rpc
from rtpool import Array, CallError, InOut, Out, remote
from rtpool.rpc.codec import (
    Ref,
    decode_args,
    decode_error,
    decode_results,
    deliver,
    encode_args,
    encode_error,
    encode_results,
    invoke,
)

Vec = Array[np.float64, "n"]
Mat = Array[np.float64, "n, n"]


def iface_of(fn):
    return fn.__rtpool_remote__


def ext1_payload(arr: np.ndarray) -> bytes:
    dtype = arr.dtype.str.encode()
    dims = b"".join(struct.pack("<Q", d) for d in arr.shape)
    return bytes([len(dtype)]) + dtype + bytes([arr.ndim]) + dims + arr.tobytes()


# --- arrays ---------------------------------------------------------------------------------


def test_exact_bytes_of_a_small_array():
    arr = np.array([1, 2, 3], dtype="<i4")
    payload = (
        b"\x03<i4"  # dtype string
        + b"\x01"  # ndim
        + b"\x03\x00\x00\x00\x00\x00\x00\x00"  # dims, u64 little-endian
        + b"\x01\x00\x00\x00\x02\x00\x00\x00\x03\x00\x00\x00"  # data, C order
    )
    assert ext1_payload(arr) == payload
    # msgpack list of 1: ext 8 (0xc7), 25 bytes, type 1
    assert encode_args([arr]) == b"\x91\xc7\x19\x01" + payload
    assert encode_args([arr]) == msgpack.packb([msgpack.ExtType(1, payload)])


def test_ext_sizes_use_msgpack_forms():
    # 16 bytes: fixext 16 (0xd8); 300 bytes: ext 16 (0xc8); 70000 bytes: ext 32 (0xc9)
    for arr in (np.zeros(3, np.uint8).reshape(3), np.zeros(286, np.uint8), np.zeros(70000, "u1")):
        data = encode_results([arr])
        assert data == msgpack.packb([msgpack.ExtType(1, ext1_payload(arr))])
    assert encode_results([np.zeros(3, np.uint8)])[1] == 0xD8


@pytest.mark.parametrize(
    "arr",
    [
        np.arange(12, dtype=np.float64).reshape(3, 4),
        np.arange(5, dtype=np.float32),
        np.arange(-3, 3, dtype=np.int32),
        np.arange(6, dtype=np.int64).reshape(1, 2, 3),
        np.array([1 + 2j, -3j], dtype=np.complex128),
        np.array([True, False, True]),
        np.array(2.5),  # 0-d
        np.zeros((0, 4)),  # empty
        np.arange(12.0).reshape(3, 4).T,  # not contiguous
        np.arange(20, dtype=np.int16)[::3],  # strided
    ],
    ids=["f8", "f4", "i4", "i8-3d", "c16", "bool", "0d", "empty", "transposed", "strided"],
)
def test_array_round_trips(arr):
    (back,) = decode_results(encode_results([arr]))
    assert back.dtype == arr.dtype and back.shape == arr.shape
    np.testing.assert_array_equal(back, arr)
    assert back.flags.writeable and back.flags.c_contiguous and back.flags.aligned
    back[...] = 0  # writable, and not a view of anything of the caller's
    np.testing.assert_array_equal(decode_results(encode_results([arr]))[0], arr)


def test_big_endian_arrays_arrive_little_endian():
    arr = np.arange(4, dtype=">f8")
    data = encode_args([arr])
    assert b"<f8" in data and b">f8" not in data
    (back,) = decode_results(data)
    assert back.dtype.isnative and back.dtype.name == "float64"
    np.testing.assert_array_equal(back, arr)


def test_object_and_structured_arrays_are_refused():
    with pytest.raises(CallError, match="object and structured dtypes are refused"):
        encode_args([np.array([1, "a"], dtype=object)])
    with pytest.raises(CallError, match="object and structured dtypes are refused"):
        encode_results([np.zeros(2, dtype=[("a", "i4")])])
    data = msgpack.packb([msgpack.ExtType(1, b"\x03|O8\x01" + struct.pack("<Q", 1) + bytes(8))])
    with pytest.raises(CallError, match="cannot be received"):
        decode_results(data)


# --- scalars, containers, refs --------------------------------------------------------------


def test_scalars_and_containers_round_trip_as_plain_msgpack():
    values = [0, -1, 2**64 - 1, 1.5, "é", b"\x00", None, True, [1, [2]], {"k": 1, 2: "v"}]
    data = encode_args(values)
    assert data == msgpack.packb(values, use_bin_type=True)
    assert decode_results(data) == values


def test_numpy_scalars_and_tuples_encode_as_plain_values():
    data = encode_args([np.float64(1.5), np.int64(-2), np.bool_(True), np.float32(0.5), (1, 2)])
    assert data == msgpack.packb([1.5, -2, True, 0.5, [1, 2]])
    back = decode_results(data)
    assert [type(v) for v in back] == [float, int, bool, float, list]


def test_complex_scalars_travel_as_0d_arrays():
    (back,) = decode_results(encode_args([1 + 2j]))
    assert back.shape == () and back.dtype == np.complex128 and back.item() == 1 + 2j
    assert encode_args([np.complex128(1 + 2j)]) == encode_args([1 + 2j])


def test_arrays_nested_in_containers_and_large_lists():
    big = list(range(50_000))  # over the first piece fed to msgpack
    arr = np.arange(10.0)
    values = [big, {"a": arr}, arr, "tail"]
    back = decode_results(encode_results(values))
    assert back[0] == big and back[3] == "tail"
    np.testing.assert_array_equal(back[1]["a"], arr)
    np.testing.assert_array_equal(back[2], arr)
    assert back[1]["a"].flags.writeable


def test_ref_bytes():
    assert encode_args([Ref(0, 1)]) == b"\x91\xc7\x03\x02\x92\x00\x01"
    assert encode_args([Ref(3, -1)]) == b"\x91\xc7\x03\x02\x92\x03\xff"
    assert decode_results(encode_args([Ref(3, -1)])) == [Ref(3, -1)]


def test_decode_args_resolves_refs_from_inputs():
    lu = np.arange(4.0).reshape(2, 2)
    piv = np.array([1, 1], dtype=np.int32)
    inputs = [encode_results([0, lu, piv]), encode_results(["other"])]
    values = decode_args(encode_args([2, Ref(0, 1), Ref(0, 2), Ref(1, -1)]), inputs)
    assert values[0] == 2
    np.testing.assert_array_equal(values[1], lu)
    np.testing.assert_array_equal(values[2], piv)
    assert values[2].dtype == np.int32
    assert values[3] == ["other"]


def test_decode_args_does_not_alias_two_uses_of_one_output():
    inputs = [encode_results([np.ones(3)])]
    a, b = decode_args(encode_args([Ref(0, 0), Ref(0, 0)]), inputs)
    a[0] = 5
    assert b[0] == 1


def test_decode_args_decodes_each_input_once(monkeypatch):
    import rtpool.rpc.decoding as decoding

    calls = []
    real = decoding.decode_results
    monkeypatch.setattr(decoding, "decode_results", lambda p: calls.append(p) or real(p))
    inputs = [encode_results([1, 2, 3])]
    assert decode_args(encode_args([Ref(0, 0), Ref(0, 2), Ref(0, 1)]), inputs) == [1, 3, 2]
    assert calls == inputs


def test_decode_args_bad_refs():
    inputs = [encode_results([1])]
    with pytest.raises(CallError, match="argument 0 refers to input 1, but the call has 1"):
        decode_args(encode_args([Ref(1, 0)]), inputs)
    with pytest.raises(CallError, match="refers to output 1 of input 0, which has 1"):
        decode_args(encode_args([Ref(0, 1)]), inputs)
    bad = msgpack.packb([msgpack.ExtType(2, msgpack.packb([0, -2]))])
    with pytest.raises(CallError, match=r"a reference must be \[input >= 0, output >= -1\]"):
        decode_args(bad, inputs)


# --- corrupt payloads -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"", "corrupt call payload"),
        (b"\x01", "the payload is not a msgpack list"),
        (b"\x92\x01", "truncated"),
        (encode_args([np.ones(4)])[:-3], "truncated payload"),
        (encode_args([1]) + b"\x00", "1 bytes past the end of the list"),
        (b"\x91\xc1", "corrupt call payload"),
        (msgpack.packb([msgpack.ExtType(7, b"x")]), "unknown msgpack extension type 7"),
        (
            msgpack.packb([msgpack.ExtType(1, b"\x03<f8\x01" + struct.pack("<Q", 4) + bytes(8))]),
            "needs 32 bytes, its payload has 8",
        ),
        (msgpack.packb([msgpack.ExtType(1, b"\x03<zz\x00")]), "corrupt call payload"),
        (b"\x91\x92\x01", "truncated payload"),
    ],
    ids=[
        "empty",
        "not-a-list",
        "short-list",
        "short-array",
        "trailing",
        "bad-byte",
        "ext-7",
        "short-data",
        "bad-dtype",
        "short-nested",
    ],
)
def test_corrupt_payloads_raise_call_error(payload, reason):
    with pytest.raises(CallError) as info:
        decode_results(payload)
    assert reason in str(info.value)


def test_mutated_payloads_decode_or_raise_call_error():
    valid = encode_args([3, np.arange(6.0).reshape(2, 3), "x", [1, {"a": np.ones(2)}], Ref(0, 0)])
    inputs = [encode_results([1])]
    rng = random.Random(7)
    outcomes = set()
    for _ in range(2000):
        data = bytearray(valid)
        if rng.random() < 0.5:
            data[rng.randrange(len(data))] = rng.randrange(256)
        else:
            del data[rng.randrange(len(data)) :]
        try:
            decode_args(bytes(data), inputs)
            outcomes.add("decoded")
        except CallError:
            outcomes.add("refused")
    assert outcomes == {"decoded", "refused"}


def test_corrupt_args_in_invoke_raise_call_error():
    iface = iface_of(tasks.rpc.add)
    with pytest.raises(CallError, match="corrupt call payload"):
        invoke(tasks.rpc.add, iface, b"\x92\x01\xc1", [])
    with pytest.raises(CallError) as info:
        invoke(tasks.rpc.add, iface, encode_args([1]), [])
    assert str(info.value) == "add: the call carries 1 values, the interface has 2 inputs (a, b)"
    with pytest.raises(CallError) as info:
        invoke(tasks.rpc.add, iface, encode_args([1, "2"]), [])
    assert str(info.value) == "add: argument b has type str, expected int"
    scale = iface_of(tasks.rpc.scale)
    with pytest.raises(CallError) as info:
        invoke(tasks.rpc.scale, scale, encode_args([3, np.ones(2), 2.0]), [])
    assert str(info.value) == "scale: argument x has shape (2,), expected (n,) = (3,)"


# --- invoke and deliver ---------------------------------------------------------------------


def test_invoke_scalar_return():
    iface = iface_of(tasks.rpc.add)
    result = invoke(tasks.rpc.add, iface, encode_args([2, 3]), [])
    assert decode_results(result) == [5]
    assert deliver(iface, result, [None]) == 5


def test_invoke_and_deliver_with_out_and_return():
    @remote("solve_like")
    def solve_like(n: int, A: InOut[Mat], piv: Out[Array[np.int32, "n"]]) -> int:  # noqa: F821
        A *= 2
        piv[:] = np.arange(n)
        return 7

    iface = iface_of(solve_like)
    A = np.ones((3, 3))
    bound = iface.bind((3, A))
    result = invoke(solve_like, iface, encode_args(bound.values), [])
    np.testing.assert_array_equal(A, np.ones((3, 3)))  # the caller's A is untouched so far
    info, A2, piv = deliver(iface, result, bound.out_buffers)
    assert info == 7
    assert A2 is A  # InOut: updated in place, as Ninf does
    np.testing.assert_array_equal(A, 2 * np.ones((3, 3)))
    assert piv.dtype == np.int32 and piv.tolist() == [0, 1, 2] and piv.flags.writeable


def test_deliver_fills_ninf_style_out_buffers():
    @remote("fill")
    def fill(n: int, x: Out[Vec]) -> None:
        x[:] = 4.0

    iface = iface_of(fill)
    x = np.zeros(5)
    bound = iface.bind((5, x))
    result = invoke(fill, iface, encode_args(bound.values), [])
    assert deliver(iface, result, bound.out_buffers) is x
    np.testing.assert_array_equal(x, np.full(5, 4.0))
    fresh = deliver(iface, result, [None])
    assert fresh is not x and fresh.flags.writeable and fresh.tolist() == [4.0] * 5


def test_deliver_no_output_and_wrong_count():
    noop = iface_of(tasks.rpc.noop)
    assert deliver(noop, invoke(tasks.rpc.noop, noop, encode_args([]), []), []) is None
    with pytest.raises(CallError, match="noop: the result has 1 values, the interface 0 outputs"):
        deliver(noop, encode_results([1]), [])


def test_invoke_inout_and_array_return():
    scale = iface_of(tasks.rpc.scale)
    x = np.arange(3.0)
    result = invoke(tasks.rpc.scale, scale, encode_args([3, x, 2.0]), [])
    np.testing.assert_array_equal(deliver(scale, result, [x]), [0.0, 2.0, 4.0])
    shape_of = iface_of(tasks.rpc.shape_of)
    result = invoke(tasks.rpc.shape_of, shape_of, encode_args([2, 5, np.zeros((2, 5))]), [])
    out = deliver(shape_of, result, [None])
    assert out.dtype == np.int64 and out.tolist() == [2, 5]


def test_invoke_with_refs_to_inputs():
    scale = iface_of(tasks.rpc.scale)
    inputs = [encode_results([np.arange(4.0)])]
    result = invoke(tasks.rpc.scale, scale, encode_args([4, Ref(0, 0), 0.5]), inputs)
    assert decode_results(result)[0].tolist() == [0.0, 0.5, 1.0, 1.5]


def test_invoke_checks_outputs_against_their_spec():
    @remote("wrong_dtype")
    def wrong_dtype(n: int) -> Vec:
        return np.zeros(n, dtype=np.float32)

    @remote("wrong_shape")
    def wrong_shape(n: int) -> Vec:
        return np.zeros(n + 1)

    @remote("wrong_type")
    def wrong_type(n: int) -> int:
        return "n"

    with pytest.raises(CallError) as info:
        invoke(wrong_dtype, iface_of(wrong_dtype), encode_args([2]), [])
    assert str(info.value) == "wrong_dtype: the return value has dtype float32, expected float64"
    with pytest.raises(CallError) as info:
        invoke(wrong_shape, iface_of(wrong_shape), encode_args([2]), [])
    assert str(info.value) == "wrong_shape: the return value has shape (3,), expected (2,)"
    with pytest.raises(CallError) as info:
        invoke(wrong_type, iface_of(wrong_type), encode_args([2]), [])
    assert str(info.value) == "wrong_type: the return value has type str, expected int"


def test_a_repeated_call_runs_from_its_plan_and_still_checks_what_can_change():
    # The first call with given sizes and dtypes is checked in full and leaves a plan; the next
    # ones skip the argument checks, but an output reshaped or retyped in place, a wrong return
    # value, or other sizes (another plan) are still refused.
    calls = []

    @remote("plan_probe")
    def plan_probe(n: int, A: InOut[Mat], C: Out[Mat]) -> int:  # noqa: F821
        calls.append(n)
        C[...] = A
        A *= 2
        if len(calls) == 3:
            C.shape = (n * n,)  # in place: the array the worker allocated
        if len(calls) == 4:
            A.dtype = np.int64  # same itemsize, another dtype
        return "bad" if len(calls) == 5 else n

    iface = iface_of(plan_probe)
    A = np.arange(4.0).reshape(2, 2)
    payload = encode_args([2, A])
    for _ in range(2):  # the full check, then the plan
        info, A2, C = decode_results(invoke(plan_probe, iface, payload, []))
        assert info == 2 and A2.tolist() == [[0, 2], [4, 6]] and C.tolist() == A.tolist()
    assert len(iface._plans) == 1
    with pytest.raises(CallError) as err:
        invoke(plan_probe, iface, payload, [])
    assert str(err.value) == "plan_probe: output C has shape (4,), expected (2, 2)"
    with pytest.raises(CallError) as err:
        invoke(plan_probe, iface, payload, [])
    assert str(err.value) == "plan_probe: output A has dtype int64, expected float64"
    with pytest.raises(CallError) as err:
        invoke(plan_probe, iface, payload, [])
    assert str(err.value) == "plan_probe: the return value has type str, expected int"
    with pytest.raises(CallError) as err:  # n=3 with a 2 x 2 array: not the plan of n=2
        invoke(plan_probe, iface, encode_args([3, A]), [])
    assert str(err.value) == "plan_probe: argument A has shape (2, 2), expected (n, n) = (3, 3)"
    assert len(calls) == 5 and len(iface._plans) == 1


def test_repeated_array_headers_decode_to_the_same_arrays():
    # The decoder remembers headers it has seen; an equal header with other data, or data of
    # another length after it, must not be taken for the remembered array.
    a = np.arange(6.0).reshape(2, 3)
    for _ in range(2):
        out = decode_results(encode_results([a, a.T.copy(), a.astype(np.int32)]))
        assert [x.tolist() for x in out] == [a.tolist(), a.T.tolist(), a.tolist()]
        assert out[0].flags.writeable and out[2].dtype == np.int32
    short = ext1_payload(a)[:-8]
    with pytest.raises(CallError, match="needs 48 bytes, its payload has 40"):
        decode_results(msgpack.packb([msgpack.ExtType(1, short)]))


def test_invoke_lets_the_function_exception_through():
    iface = iface_of(tasks.rpc.fail)
    with pytest.raises(ValueError, match="^boom$"):
        invoke(tasks.rpc.fail, iface, encode_args(["boom"]), [])


def test_invoke_complex_scalar_parameter():
    @remote("mul")
    def mul(z: complex, k: float) -> complex:
        assert type(z) is complex
        return z * k

    iface = iface_of(mul)
    result = invoke(mul, iface, encode_args([1 + 1j, 2.0]), [])
    assert deliver(iface, result, [None]) == 2 + 2j


# --- errors ---------------------------------------------------------------------------------


def test_error_payload_round_trip():
    try:
        raise ValueError("bad value")
    except ValueError as exc:
        data = encode_error(exc)
    assert list(msgpack.unpackb(data)) == ["type", "message", "traceback"]
    report = decode_error(data)
    assert report["type"] == "ValueError" and report["message"] == "bad value"
    assert (
        "Traceback" in report["traceback"]
        and 'raise ValueError("bad value")' in report["traceback"]
    )
    assert decode_error(encode_error(CallError("x")))["type"] == "rtpool.errors.CallError"


def test_unreadable_error_payload():
    report = decode_error(b"\xc1")
    assert report["type"] == "" and report["traceback"] == ""
    assert report["message"].startswith("the call's error report is unreadable")


# --- without numpy --------------------------------------------------------------------------


def test_codec_without_numpy():
    code = textwrap.dedent(
        """
        import sys
        sys.modules["numpy"] = None
        from rtpool.rpc.codec import decode_results, encode_args
        from rtpool.errors import CallError
        print(decode_results(encode_args([1, "a", [2.5]])))
        print(decode_results(encode_args([1 + 2j])))
        array = bytes.fromhex("91c7190103") + b"<i4" + bytes.fromhex("01") + bytes(8 + 12)
        try:
            decode_results(array)
        except CallError as exc:
            print(exc)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "[1, 'a', [2.5]]",
        "[(1+2j)]",
        "this process has no numpy; it cannot decode array arguments",
    ]
