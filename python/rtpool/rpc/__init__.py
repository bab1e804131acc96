"""Grid RPC (``docs/rpc.md``): named remote functions, their interfaces, and calls of them.

The public names are re-exported by ``rtpool`` (``rtpool.remote``, ``rtpool.Interface``,
``rtpool.Array``, ``rtpool.In``/``Out``/``InOut``, ``rtpool.CallFuture``,
``rtpool.Transaction``). This package imports nothing on its own, so ``import rtpool`` and a
worker without ``--serve`` stay light; import the module you need.

Modules, from the bottom up:

* ``shape.py``: shape expressions (``"n, n"``, ``"2*n"``).
* ``annotations.py``: the annotation vocabulary (``Array``, ``In``, ``Out``, ``InOut``).
* ``values.py``: scalar checks and numpy lookups shared by the interface and the codec.
* ``params.py``: :class:`Param`, one parameter, and the checks of its wire form.
* ``binding.py``: ``bind`` (checks a call's arguments) and :class:`BoundCall`.
* ``interface.py``: :class:`Interface` (construction checks, wire form; ``bind`` from
  ``binding.py``).
* ``remote.py``: the ``@remote`` decorator and ``served_functions`` (what a worker serves).
* ``schema.py``: the values' extension types (arrays, references, kept results).
* ``encoding.py``, ``decoding.py``: the values' wire format, both ways.
* ``invocation.py``: ``invoke`` (a worker runs a call) and ``deliver`` (the client's result).
* ``codec.py``: the one import of the four above.
* ``channel.py``: the grid-RPC state of a client connection (interface cache, ``FUNCTIONS``,
  ``CALL`` frames, retry after ``unknown_function``), plugged into the connection's hooks.
* ``calls.py``: ``Client.call``/``call_async`` and :class:`CallFuture`.
* ``transaction.py``: :class:`Transaction`, a graph of calls in one frame.
"""
