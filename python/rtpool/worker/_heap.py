"""The worker process's C heap: keep freed memory for the next task (``--heap-keep-mb``).

glibc returns a freed block of 128 KiB or more to the kernel at once (it was ``mmap``ped, or it
tops the heap past the trim threshold), and its thresholds only adapt to what one process
frees. A worker that receives a large ``bytes`` argument, or builds a large result, then
asks the kernel for fresh zeroed pages on every task: a 16 MiB ``bytes`` echo faulted in
4,064 pages on the worker side, 10 ms a round trip where the copies take 4.5 ms
(``rtpool bench payload``, docs/benchmarks.md).

:func:`keep_freed_heap` sets two ``mallopt`` knobs once, in the worker's parent before it forks
(the children inherit them): blocks up to half the bound (at most 32 MiB, glibc's ceiling)
come from the heap, and up to the bound of free memory at the heap's top stays mapped. The cost
is that much resident memory a worker keeps between large tasks; 0 keeps the C library's own
policy. On a C library without ``mallopt`` (musl) nothing changes.
"""

from __future__ import annotations

import ctypes

#: Default of ``--heap-keep-mb``.
DEFAULT_HEAP_KEEP_MB = 64
#: glibc's ``mallopt`` parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: The largest mmap threshold glibc accepts on 64-bit hosts (half its heap size, 64 MiB).
MMAP_THRESHOLD_MAX = 32 << 20


def thresholds(keep_mb: int) -> tuple[int, int]:
    """``(mmap threshold, trim threshold)`` in bytes for a bound of ``keep_mb`` MiB."""
    keep = keep_mb << 20
    return min(MMAP_THRESHOLD_MAX, keep // 2), keep


def keep_freed_heap(keep_mb: int) -> str | None:
    """Make this process (and the processes it forks) keep up to ``keep_mb`` MiB of freed heap
    for reuse. Returns None when set (or when ``keep_mb`` is 0), else why it could not be."""
    if keep_mb <= 0:
        return None
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return "this C library has no mallopt: --heap-keep-mb has no effect"
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    mmap_at, trim_at = thresholds(keep_mb)
    if not mallopt(M_MMAP_THRESHOLD, mmap_at) or not mallopt(M_TRIM_THRESHOLD, trim_at):
        return f"mallopt refused the thresholds of --heap-keep-mb {keep_mb}"
    return None
