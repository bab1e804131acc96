"""Task functions of the benchmarks, importable by workers.

This module imports nothing, so a worker that receives one of these functions by reference
(cloudpickle pickles module-level functions of an importable module by name) loads it in
microseconds and the first measured task does not pay for an import.
"""


def noop(*args, **kwargs):
    """Do nothing and return ``None``: the task of the latency and throughput benchmarks."""
    return None


def echo(payload):
    """Return ``payload`` unchanged: the task of the payload benchmark.

    Args:
        payload: Any picklable value (the benchmark sends ``bytes``).

    Returns:
        ``payload`` itself.
    """
    return payload
