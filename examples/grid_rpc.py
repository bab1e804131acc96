"""The README's grid RPC example: named functions of ``rtpool.lib.linalg``, called by name.

Run with ``python examples/grid_rpc.py`` (needs ``rtpool[linalg]``: numpy and scipy); it
prints the interface of ``dgesl`` and three checks::

    dmmul matches numpy: True
    transaction solves A x = b: True
    Ninf-style out buffer filled: True
"""

import numpy as np

import rtpool


def main():
    """Serve rtpool.lib.linalg on two workers, then call dmmul and a dgefa -> dgesl chain."""
    with rtpool.LocalCluster(workers=2, serve=["rtpool.lib.linalg"]) as cluster:
        cluster.wait_for_workers()  # until both serve the functions
        client = cluster.client()
        rng = np.random.default_rng(1)
        n = 200
        A, b = rng.random((n, n)), rng.random(n)
        # The client fetches dmmul's interface, checks n, A and B against it, then calls.
        C = client.call("dmmul", n, A, A)
        print(client.describe("dgesl"))
        print(f"dmmul matches numpy: {np.allclose(C, A @ A)}")
        # One frame: the LU factors and pivots stay on the master and go to the dgesl call.
        with client.transaction() as tx:
            f = tx.call("dgefa", n, A)  # futures of (info, LU, ipvt)
            x = tx.call("dgesl", n, f[1], f[2], b.copy())
        print(f"transaction solves A x = b: {np.allclose(A @ x.result(timeout=60), b)}")
        # Ninf_call style: pass the output buffer too, and it is filled in place.
        out = np.zeros((n, n))
        client.call("dmmul", n, A, A, out)
        print(f"Ninf-style out buffer filled: {np.allclose(out, C)}")


if __name__ == "__main__":
    main()
