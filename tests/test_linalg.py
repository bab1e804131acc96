"""rtpool.lib.linalg: the bundled numerical library (local calls and through the codec)."""

import numpy as np
import pytest
import scipy.linalg

from rtpool.lib import linalg
from rtpool.lib.linalg import (
    EP_VERIFY,
    dgefa,
    dgefa_unblocked,
    dgesl,
    dgesl_unblocked,
    dmmul,
    ep,
    ep_local,
    linpack,
    linpack_flops,
    linpack_local,
)
from rtpool.rpc.codec import deliver, encode_args, invoke
from rtpool.rpc.remote import served_functions


def system(n: int, seed: int = 1) -> tuple:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, n)), rng.standard_normal(n)


def test_served_functions_of_the_library():
    served = served_functions("rtpool.lib.linalg")
    assert [i.name for _, i in served] == ["dgefa", "dgesl", "dmmul", "ep", "linpack"]
    signatures = {i.name: i.signature for _, i in served}
    assert signatures["dmmul"] == (
        "dmmul(n: int, A: In[float64[n, n]], B: In[float64[n, n]]) -> C: Out[float64[n, n]]"
    )
    assert signatures["dgefa"] == (
        "dgefa(n: int, A: InOut[float64[n, n]]) -> "
        "(int, A: InOut[float64[n, n]], ipvt: Out[int32[n]])"
    )
    assert signatures["ep"] == (
        "ep(start: int, pairs: int) -> (sums: Out[float64[2]], counts: Out[float64[10]])"
    )
    assert dict((i.name, i) for _, i in served)["dmmul"].doc.startswith(
        "dmmul is double precision matrix multiply"
    )


def test_dmmul_matches_numpy():
    A, _ = system(30, seed=2)
    B, _ = system(30, seed=3)
    C = np.empty((30, 30))
    dmmul(30, A, B, C)
    np.testing.assert_allclose(C, A @ B, rtol=1e-12, atol=1e-12)


def test_dgefa_dgesl_solve():
    n = 50
    A, b = system(n)
    lu = A.copy()
    ipvt = np.empty(n, np.int32)
    info = dgefa(n, lu, ipvt)
    assert info == 0
    ref_lu, ref_piv = scipy.linalg.lu_factor(A)
    np.testing.assert_allclose(lu, ref_lu, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(ipvt, ref_piv)
    x = b.copy()
    dgesl(n, lu, ipvt, x)
    assert np.linalg.norm(A @ x - b) / np.linalg.norm(b) < 1e-10


def test_linpack_solves_and_leaves_a_alone():
    n = 60
    A, b = system(n, seed=4)
    A0 = A.copy()
    x = b.copy()
    linpack(n, A, x)
    np.testing.assert_array_equal(A, A0)
    assert np.linalg.norm(A @ x - b) / np.linalg.norm(b) < 1e-10
    np.testing.assert_allclose(linpack_local(A, b), x, rtol=1e-12)
    assert linpack_flops(100) == pytest.approx(2 / 3 * 1e6 + 2e4)


def test_singular_matrix_info():
    n = 4
    A = np.arange(16.0).reshape(4, 4)
    A[:, 2] = 0.0  # column 2 is zero: U[2, 2] == 0
    ipvt = np.empty(n, np.int32)
    assert dgefa(n, A.copy(), ipvt) == 3
    assert dgefa_unblocked(A)[2] == 3
    with pytest.raises(np.linalg.LinAlgError, match="singular"):
        linpack_local(A, np.ones(n))


def test_unblocked_agrees_with_scipy():
    n = 200
    A, b = system(n, seed=5)
    lu, ipvt, info = dgefa_unblocked(A)
    assert info == 0 and ipvt.dtype == np.int32
    ref_lu, ref_piv = scipy.linalg.lu_factor(A)
    np.testing.assert_array_equal(ipvt, ref_piv)
    np.testing.assert_allclose(lu, ref_lu, rtol=0, atol=1e-8)
    x = dgesl_unblocked(lu, ipvt, b)
    np.testing.assert_allclose(x, scipy.linalg.lu_solve((ref_lu, ref_piv), b), rtol=0, atol=1e-8)
    assert np.linalg.norm(A @ x - b) / np.linalg.norm(b) < 1e-10
    # The two are interchangeable: the unblocked solve with dgefa's factors.
    lu2 = A.copy()
    ipvt2 = np.empty(n, np.int32)
    dgefa(n, lu2, ipvt2)
    np.testing.assert_allclose(dgesl_unblocked(lu2, ipvt2, b), x, rtol=0, atol=1e-8)


def test_ep_vectorized_matches_the_python_reference():
    for start, pairs in [(0, 5), (12345, 300), (1 << 20, 70_000)]:
        sx, sy, counts = linalg._ep_range(start, pairs)
        rx, ry, rcounts = linalg._ep_reference(start, pairs)
        assert sx == pytest.approx(rx, rel=1e-12, abs=1e-12)
        assert sy == pytest.approx(ry, rel=1e-12, abs=1e-12)
        assert counts.tolist() == rcounts


def test_ep_class_s_verifies():
    sx, sy, counts = ep_local(24)
    vx, vy = EP_VERIFY[24]
    assert abs((sx - vx) / vx) < 1e-8
    assert abs((sy - vy) / vy) < 1e-8
    assert counts.sum() == pytest.approx(np.pi / 4 * 2**24, rel=1e-3)


def test_ep_class_w_verifies():
    sx, sy, _ = ep_local(25, chunks=4)
    vx, vy = EP_VERIFY[25]
    assert abs((sx - vx) / vx) < 1e-8
    assert abs((sy - vy) / vy) < 1e-8


def test_ep_chunked_equals_unchunked():
    sx, sy, counts = ep_local(18)
    cx, cy, ccounts = ep_local(18, chunks=7)
    assert cx == pytest.approx(sx, rel=1e-12) and cy == pytest.approx(sy, rel=1e-12)
    np.testing.assert_array_equal(ccounts, counts)
    # The remote function over ranges adds up the same way.
    total = np.zeros(2)
    total_counts = np.zeros(10)
    for start, pairs in [(0, 100_000), (100_000, 62_144), (162_144, 100_000)]:
        sums = np.empty(2)
        q = np.empty(10)
        ep(start, pairs, sums, q)
        total += sums
        total_counts += q
    assert total == pytest.approx([sx, sy], rel=1e-12)
    np.testing.assert_array_equal(total_counts, counts)


def test_ep_refuses_negative_ranges():
    with pytest.raises(ValueError, match="start and pairs must be >= 0"):
        ep(-1, 10, np.empty(2), np.empty(10))


def test_dmmul_through_the_codec():
    iface = dmmul.__rtpool_remote__
    n = 16
    A, _ = system(n, seed=6)
    B, _ = system(n, seed=7)
    bound = iface.bind((n, A, B))
    C = deliver(iface, invoke(dmmul, iface, encode_args(bound.values), []), bound.out_buffers)
    np.testing.assert_allclose(C, A @ B, rtol=1e-12, atol=1e-12)
    C2 = np.empty((n, n))
    bound = iface.bind((n, A, B, C2))
    out = deliver(iface, invoke(dmmul, iface, encode_args(bound.values), []), bound.out_buffers)
    assert out is C2
    np.testing.assert_array_equal(C2, C)


def test_dgefa_then_dgesl_through_the_codec():
    n = 40
    A, b = system(n, seed=8)
    fa = dgefa.__rtpool_remote__
    sl = dgesl.__rtpool_remote__
    A_call = A.copy()
    bound = fa.bind((n, A_call))
    info, lu, ipvt = deliver(
        fa, invoke(dgefa, fa, encode_args(bound.values), []), bound.out_buffers
    )
    assert info == 0 and lu is A_call and ipvt.dtype == np.int32
    x = b.copy()
    bound = sl.bind((n, lu, ipvt, x))
    assert deliver(sl, invoke(dgesl, sl, encode_args(bound.values), []), bound.out_buffers) is x
    assert np.linalg.norm(A @ x - b) / np.linalg.norm(b) < 1e-10
