"""Numerical libraries bundled with rtpool, served by name (grid RPC, ``docs/rpc.md``).

* :mod:`rtpool.lib.linalg`: ``dmmul``, ``dgefa``, ``dgesl``, ``linpack`` and the NAS ``ep``
  kernel (needs numpy and scipy: ``pip install 'rtpool[linalg]'``)::

      rtpool worker --master HOST:PORT --serve rtpool.lib.linalg

Nothing is imported here, so ``import rtpool.lib`` needs neither numpy nor scipy.
"""
