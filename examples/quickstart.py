"""The README's example: a LocalCluster with two workers, one task, then a map in input order.

Run with ``python examples/quickstart.py``; it takes a few seconds and prints::

    smallest_factor(1000003 * 1000033) = 1000003
    map: [7, 97, 7]
"""

import rtpool


def smallest_factor(n):
    """Return the smallest factor of ``n`` (``n`` itself if prime) by trial division."""
    f = 2
    while f * f <= n:
        if n % f == 0:
            return f
        f += 1
    return n


def main():
    """Start a LocalCluster, run one task and one map, print the results."""
    # An embedded master plus two worker processes, stopped when the block ends. The function
    # is defined in __main__, so it travels by value (cloudpickle): workers need not import it.
    with rtpool.LocalCluster(workers=2) as cluster:
        client = cluster.client()  # a concurrent.futures.Executor
        fut = client.submit(smallest_factor, 1000003 * 1000033)
        print(f"smallest_factor(1000003 * 1000033) = {fut.result(timeout=60)}")
        # map yields the results in input order, whatever order the tasks finish in.
        factors = list(client.map(smallest_factor, [91, 97, 1001]))
        print(f"map: {factors}")


if __name__ == "__main__":
    main()
