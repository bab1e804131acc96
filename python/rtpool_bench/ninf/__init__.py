"""``rtpool bench ninf``: the Ninf paper's grid RPC benchmarks (entry point :mod:`.cli`).

``common`` holds what the sections share; ``linpack``, ``multi`` (also ``ep``) and ``bars`` are
the sections; ``client`` is the client process of ``multi`` and ``ep``; ``funcs`` the functions
the workers serve; ``render`` the tables.
"""
