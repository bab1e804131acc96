"""The client's live connection to the master (socket, reader and heartbeat threads, routing
of answers to futures, reconnection); opening and authenticating a socket is ``_dial.py``'s.

Modules: ``connection.py`` (:class:`_Connection`: state, sending, hooks, closing),
``packages.py`` (submitting, cancelling, waiting), ``receive.py`` (the reader thread),
``reconnect.py``, ``segment.py`` (:class:`_Segment`: one frame's tasks) and ``outcomes.py``
(the exception of each task status).
"""

from .connection import _Connection
from .outcomes import task_error
from .segment import ALL, _Segment

__all__ = ["ALL", "_Connection", "_Segment", "task_error"]
