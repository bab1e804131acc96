"""Remote functions of ``rtpool bench ninf`` (served with ``--serve rtpool_bench.ninf.funcs``)
and the BLAS thread controls the benchmark uses on both sides.

* ``noop()``: nothing, the no-op remote call of the round-trip bar;
* ``work(ms, spin, x)`` and ``join(ms, spin, x, y)``: the calls of the diamond transaction
  A -> (B, C) -> D; each takes ``ms`` milliseconds (asleep, or with ``spin`` busy on the CPU)
  and returns an array derived from its inputs, so each dependency carries data;
* ``blas_info()``: the BLAS thread counts a worker really runs with, so the benchmark reports
  what the worker used rather than what it asked for.

No ``from __future__ import annotations`` here: the annotations are evaluated when the module is
imported, as the interface builder expects. numpy is imported inside the functions only, so
importing this module (on the client, to read the BLAS helpers) costs nothing.
"""

import ctypes
import json
import os
import time

from rtpool import Array, remote

# A named shape rather than AnyVector in each annotation: linters read a string in
# an annotation as a forward reference.
AnyVector = Array["float64", "*"]

# The environment variables the common BLAS libraries read their thread count from at load.
BLAS_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
# Thread-count entry points of OpenBLAS builds (plain, 64-bit interface, scipy's vendored ones).
_GET = (
    "openblas_get_num_threads",
    "openblas_get_num_threads64_",
    "scipy_openblas_get_num_threads64_",
    "scipy_openblas_get_num_threads",
)


@remote("noop")
def noop() -> None:
    """Do nothing: the no-op remote call of the round-trip bar."""
    return None


def _busy(ms: float, spin: bool) -> None:
    if not spin:
        time.sleep(ms / 1000)
        return
    end = time.thread_time() + ms / 1000
    while time.thread_time() < end:
        pass


@remote("work")
def work(ms: float, spin: bool, x: AnyVector) -> AnyVector:
    """Take ``ms`` milliseconds (asleep, or busy with ``spin``) and return ``x + 1``."""
    _busy(ms, spin)
    return x + 1.0


@remote("join")
def join(ms: float, spin: bool, x: AnyVector, y: AnyVector) -> AnyVector:
    """Take ``ms`` milliseconds (asleep, or busy with ``spin``) and return ``x + y``."""
    _busy(ms, spin)
    return x + y


@remote("blas_info")
def blas_info() -> str:
    """The BLAS thread counts of this process (JSON: ``libs`` and ``env``), after loading the
    libraries numpy and scipy's LAPACK use."""
    import numpy  # noqa: F401  (loads numpy's BLAS)

    try:
        import scipy.linalg  # noqa: F401  (loads scipy's own BLAS, if it has one)
    except ImportError:
        pass
    return json.dumps(blas_threads())


def _blas_libs() -> list:
    """Paths of the loaded shared libraries whose name says BLAS (from /proc/self/maps)."""
    paths = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rsplit(None, 1)[-1]
                name = os.path.basename(path).lower()
                # the libraries themselves, not the Python extensions that link them
                if name.startswith("lib") and ".so" in name and ("blas" in name or "mkl" in name):
                    paths.add(path)
    except OSError:
        pass
    return sorted(paths)


def _entry(lib, names):
    for name in names:
        fn = getattr(lib, name, None)
        if fn is not None:
            return fn
    return None


def blas_threads() -> dict:
    """What this process's BLAS libraries run with.

    Returns:
        ``{"libs": {file name: threads or None}, "env": {variable: value}}``; a library whose
        thread count cannot be read shows None.
    """
    libs = {}
    for path in _blas_libs():
        threads = None
        try:
            fn = _entry(ctypes.CDLL(path), _GET)
            if fn is not None:
                threads = int(fn())
        except OSError:
            pass
        libs[os.path.basename(path)] = threads
    env = {k: os.environ[k] for k in BLAS_ENV if k in os.environ}
    return {"libs": libs, "env": env}


def set_blas_threads(threads: int) -> None:
    """Run this process's BLAS with ``threads`` threads: the environment (for libraries not
    loaded yet and for child processes) and every loaded OpenBLAS (at once)."""
    for key in BLAS_ENV:
        os.environ[key] = str(threads)
    for path in _blas_libs():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        fn = _entry(lib, [name.replace("_get_", "_set_") for name in _GET])
        if fn is not None:
            fn(ctypes.c_int(threads))
