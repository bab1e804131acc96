"""Dense linear algebra and the NAS EP kernel, served by name (``docs/rpc.md``).

Serve it with ``rtpool worker --serve rtpool.lib.linalg`` (needs numpy and scipy,
``pip install 'rtpool[linalg]'``) and call it from a client::

    C = client.call("dmmul", n, A, B)
    info, LU, ipvt = client.call("dgefa", n, A)
    x = client.call("dgesl", n, LU, ipvt, b)

The remote functions are the classic Ninf library entries:

* ``dmmul``: double precision matrix multiply (numpy's BLAS);
* ``dgefa`` / ``dgesl``: LU factorization with partial pivoting and the solve with its
  factors, LINPACK's names over LAPACK's ``getrf``/``getrs`` (through scipy). The factors are in
  LAPACK's layout: ``A`` holds ``U`` on and above the diagonal and the multipliers of the unit
  lower triangular ``L`` below it (positive, rows interchanged as a whole); ``ipvt[k]`` is the
  0-based row that row ``k`` was interchanged with at step ``k`` (LINPACK's ``ipvt`` is 1-based,
  with negated multipliers);
* ``linpack``: factor and solve in one call, the Linpack benchmark kernel
  (:func:`linpack_flops` floating-point operations);
* ``ep``: the NAS Parallel Benchmarks' embarrassingly parallel kernel over a range of pairs
  of its random stream, so a run splits into calls whose sums add up.

Next to them, plain local helpers: :func:`linpack_local`, :func:`ep_local` and the unblocked
LINPACK baseline :func:`dgefa_unblocked` / :func:`dgesl_unblocked` that the Ninf paper
compares against.
"""

from __future__ import annotations

import functools
import math
from typing import Tuple

import numpy as np
import scipy.linalg
from numpy import float64, int32

from ..rpc.annotations import Array, InOut, Out
from ..rpc.remote import remote

__all__ = [
    "EP_VERIFY",
    "dgefa",
    "dgefa_unblocked",
    "dgesl",
    "dgesl_unblocked",
    "dmmul",
    "ep",
    "ep_local",
    "linpack",
    "linpack_flops",
    "linpack_local",
]


# --- dense linear algebra ------------------------------------------------------------------

# Named shapes rather than Array[float64, "n, n"] in each annotation: linters read a string in
# an annotation as a forward reference ("n" undefined), and `ruff --fix` would unquote it.
Matrix = Array[float64, "n, n"]
Vector = Array[float64, "n"]
Pivots = Array[int32, "n"]


@remote("dmmul", version="1")
def dmmul(n: int, A: Matrix, B: Matrix, C: Out[Matrix]) -> None:
    """dmmul is double precision matrix multiply: C = A B for n x n matrices."""
    np.matmul(A, B, out=C)


def _getrf(A: np.ndarray) -> tuple:
    # LAPACK's getrf directly: scipy.linalg.lu_factor warns on a singular matrix, and a warning
    # filter (process-wide) is no way to silence it in a worker running calls in threads.
    (getrf,) = scipy.linalg.get_lapack_funcs(("getrf",), (A,))
    lu, piv, info = getrf(A, overwrite_a=False)
    if info < 0:
        raise ValueError(f"getrf: argument {-info} is invalid")
    return lu, piv, int(info)


@remote("dgefa", version="1")
def dgefa(n: int, A: InOut[Matrix], ipvt: Out[Pivots]) -> int:
    """dgefa factors a double precision matrix by Gaussian elimination with partial pivoting.

    On return A holds U on and above the diagonal and the multipliers of the unit lower
    triangular L below it (LAPACK layout); ipvt[k] is the 0-based row interchanged with row k
    at step k. Returns info: 0, or k > 0 if U[k-1, k-1] is exactly zero (the first such k; the
    factors are complete but dgesl would divide by zero).
    """
    lu, piv, info = _getrf(A)
    A[...] = lu
    ipvt[...] = piv
    return info


@remote("dgesl", version="1")
def dgesl(n: int, A: Matrix, ipvt: Pivots, b: InOut[Vector]) -> None:
    """dgesl solves A x = b with the factors computed by dgefa; x replaces b."""
    b[...] = scipy.linalg.lu_solve((A, ipvt), b, check_finite=False)


@remote("linpack", version="1")
def linpack(n: int, A: Matrix, b: InOut[Vector]) -> None:
    """linpack solves A x = b (LU factorization with partial pivoting, then the solve); x
    replaces b. The Linpack benchmark kernel: 2/3 n^3 + 2 n^2 floating-point operations.
    Raises LinAlgError for an exactly singular A."""
    b[...] = linpack_local(A, b)


def linpack_local(A: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Solve ``A x = b`` here, as the remote ``linpack`` does; returns x (A and b untouched).

    Raises:
        numpy.linalg.LinAlgError: A is exactly singular.
    """
    lu, piv, info = _getrf(A)
    if info > 0:
        raise np.linalg.LinAlgError(
            f"linpack: the matrix is singular (U[{info - 1}, {info - 1}] = 0)"
        )
    return scipy.linalg.lu_solve((lu, piv), b, check_finite=False)


def linpack_flops(n: int) -> float:
    """The floating-point operations the Linpack benchmark counts for order n: 2/3 n^3 + 2 n^2."""
    return 2.0 / 3.0 * n**3 + 2.0 * n**2


def dgefa_unblocked(A: np.ndarray, overwrite: bool = False) -> Tuple[np.ndarray, np.ndarray, int]:
    """LU factorization by the classic unblocked column algorithm (no blocking, no BLAS 3).

    The "standard Linpack without blocking optimizations" baseline: for each column k, find the
    pivot (idamax), interchange the rows, scale the multipliers (dscal) and update the trailing
    columns with them (LINPACK's daxpy loop, done as one numpy rank-1 update per column). The
    result is in the layout of :func:`dgefa` (and scipy's ``lu_factor``), so the two agree.

    Args:
        A: A square float64 matrix.
        overwrite: Factor ``A`` in place rather than a copy.

    Returns:
        ``(lu, ipvt, info)`` as :func:`dgefa` gives them.
    """
    a = A if overwrite else np.array(A, dtype=np.float64)
    n = a.shape[0]
    ipvt = np.arange(n, dtype=np.int32)
    info = 0
    for k in range(n - 1):
        p = k + int(np.argmax(np.abs(a[k:, k])))
        ipvt[k] = p
        if a[p, k] == 0.0:
            info = info or k + 1
            continue
        if p != k:
            a[[k, p], :] = a[[p, k], :]
        a[k + 1 :, k] *= 1.0 / a[k, k]
        a[k + 1 :, k + 1 :] -= np.multiply.outer(a[k + 1 :, k], a[k, k + 1 :])
    if n and a[n - 1, n - 1] == 0.0:
        info = info or n
    return a, ipvt, info


def dgesl_unblocked(
    lu: np.ndarray, ipvt: np.ndarray, b: np.ndarray, overwrite: bool = False
) -> np.ndarray:
    """Solve ``A x = b`` with the factors of :func:`dgefa_unblocked` (or :func:`dgefa`), column
    by column: the row interchanges, then forward and back substitution with daxpy steps.

    Returns:
        x (``b`` itself when ``overwrite``).
    """
    x = b if overwrite else np.array(b, dtype=np.float64)
    n = x.shape[0]
    for k in range(n):
        p = int(ipvt[k])
        if p != k:
            x[[k, p]] = x[[p, k]]
    for k in range(n - 1):
        x[k + 1 :] -= x[k] * lu[k + 1 :, k]
    for k in range(n - 1, -1, -1):
        x[k] /= lu[k, k]
        x[:k] -= x[k] * lu[:k, k]
    return x


# --- NAS EP --------------------------------------------------------------------------------

#: The NAS random stream: x_{k+1} = a x_k mod 2^46, x_0 = s, u_k = x_k / 2^46.
EP_A = 5**13
EP_SEED = 271828183
_MOD46 = 1 << 46
_MASK46 = np.uint64(_MOD46 - 1)
_R46 = 0.5**46
EpSums = Array[float64, "2"]
EpCounts = Array[float64, "10"]
# Pairs per vectorized block: bounds the memory of a call (about 10 MiB) whatever its size.
_EP_BLOCK = 1 << 16

#: NAS EP verification values (sx, sy) by m (2^m pairs): class S (24) and W (25).
EP_VERIFY = {
    24: (-3.247834652034740e3, -6.958407078382297e3),
    25: (-2.863319731645753e3, -6.320053679109499e3),
}


@functools.lru_cache(maxsize=2)
def _ep_powers(count: int) -> np.ndarray:
    """a^1 .. a^count mod 2^46, as uint64."""
    powers = np.empty(count, dtype=np.uint64)
    powers[0] = EP_A
    done = 1
    while done < count:
        step = min(done, count - done)
        # uint64 products wrap mod 2^64, and 2^46 divides 2^64: the low 46 bits are exact.
        powers[done : done + step] = (powers[:step] * np.uint64(pow(EP_A, done, _MOD46))) & _MASK46
        done += step
    powers.flags.writeable = False  # cached and shared by every call
    return powers


def _ep_range(start: int, pairs: int) -> Tuple[float, float, np.ndarray]:
    """EP over pairs [start, start + pairs): pair i takes u_{2i+1} and u_{2i+2}."""
    if start < 0 or pairs < 0:
        raise ValueError(f"ep: start and pairs must be >= 0, got {start} and {pairs}")
    powers = _ep_powers(2 * min(pairs, _EP_BLOCK) or 1)
    sx = sy = 0.0
    counts = np.zeros(10, dtype=np.float64)
    for first in range(start, start + pairs, _EP_BLOCK):
        m = min(_EP_BLOCK, start + pairs - first)
        x0 = np.uint64(EP_SEED * pow(EP_A, 2 * first, _MOD46) % _MOD46)  # x_{2 first}
        u = ((powers[: 2 * m] * x0) & _MASK46).astype(np.float64) * _R46
        x = 2.0 * u[0::2] - 1.0
        y = 2.0 * u[1::2] - 1.0
        t = x * x + y * y
        keep = (t <= 1.0) & (t > 0.0)
        x, y, t = x[keep], y[keep], t[keep]
        f = np.sqrt(-2.0 * np.log(t) / t)
        gx, gy = x * f, y * f
        sx += float(gx.sum())
        sy += float(gy.sum())
        # A deviate of 10 or more (probability about 1e-22 a pair) counts in the last bin.
        ring = np.minimum(np.maximum(np.abs(gx), np.abs(gy)).astype(np.int64), 9)
        counts += np.bincount(ring, minlength=10)
    return sx, sy, counts


@remote("ep", version="1")
def ep(start: int, pairs: int, sums: Out[EpSums], counts: Out[EpCounts]) -> None:
    """ep is the NAS embarrassingly parallel kernel over pairs [start, start + pairs) of the NAS
    random stream: the sums of the Gaussian deviates (sx, sy) and their counts by annulus
    (counts[l] for l <= max(|X|, |Y|) < l + 1). Calls over disjoint ranges add up."""
    sx, sy, q = _ep_range(start, pairs)
    sums[0], sums[1] = sx, sy
    counts[...] = q


def ep_local(m: int, chunks: int = 1) -> Tuple[float, float, np.ndarray]:
    """Run EP over 2^m pairs here, in ``chunks`` ranges as that many calls would.

    Returns:
        ``(sx, sy, counts)``; :data:`EP_VERIFY` has the expected sums for m = 24 and 25.
    """
    total = 1 << m
    bounds = [total * i // chunks for i in range(chunks + 1)]
    sx = sy = 0.0
    counts = np.zeros(10, dtype=np.float64)
    for lo, hi in zip(bounds, bounds[1:]):
        x, y, q = _ep_range(lo, hi - lo)
        sx, sy = sx + x, sy + y
        counts += q
    return sx, sy, counts


def _ep_reference(start: int, pairs: int) -> Tuple[float, float, list]:
    """EP with Python ints and floats, one pair at a time: the check of the vectorized one."""
    x_k = EP_SEED * pow(EP_A, 2 * start, _MOD46) % _MOD46
    sx = sy = 0.0
    counts = [0] * 10
    for _ in range(pairs):
        x_k = EP_A * x_k % _MOD46
        x = 2.0 * (x_k * _R46) - 1.0
        x_k = EP_A * x_k % _MOD46
        y = 2.0 * (x_k * _R46) - 1.0
        t = x * x + y * y
        if 0.0 < t <= 1.0:
            f = math.sqrt(-2.0 * math.log(t) / t)
            sx += x * f
            sy += y * f
            counts[min(int(max(abs(x * f), abs(y * f))), 9)] += 1
    return sx, sy, counts
