"""Which of a host's GPUs each running task holds (``docs/resources.md``, "Accounting").

The master counts a worker's GPUs; the worker picks which ones: a task whose ``ASSIGN`` entry
asks ``gpu=k`` (its ``res`` field) gets ``k`` free device ids of its host, in its
``CUDA_VISIBLE_DEVICES``, until its result is sent (or it is returned, aborted, or its process
dies). Who allocates: the relay for a host connection (``--connection host``: it hands the ids
to the child with the task), else the worker process itself (one process, one connection).

A task prefers the devices its process had last: a process whose CUDA runtime is already
initialised keeps its context (the executor process is started again only when its devices
change, ``_executor.py``).
"""

from __future__ import annotations

import logging
from typing import Dict, Hashable, List, Sequence, Tuple

from ._common import log

#: The request key whose count is a number of devices.
GPU = "gpu"


class DevicePool:
    """The free and held device ids of one host.

    Args:
        ids: Every device id (``CUDA_VISIBLE_DEVICES`` entries), in order.
    """

    def __init__(self, ids: Sequence[str]) -> None:
        self.ids: Tuple[str, ...] = tuple(ids)
        self._free: List[str] = list(self.ids)
        self._held: Dict[Hashable, Tuple[str, ...]] = {}
        #: Who had which devices last (a slot, a process): preferred next time.
        self._last: Dict[Hashable, Tuple[str, ...]] = {}
        self._warned = False

    def __len__(self) -> int:
        return len(self.ids)

    def free_count(self) -> int:
        """Devices no task holds."""
        return len(self._free)

    def take(self, key: Hashable, count: int, owner: Hashable = None) -> Tuple[str, ...]:
        """Hold ``count`` devices for task ``key`` (preferring what ``owner`` had last).

        More than are free is a mismatch with the master's accounting (an aborted task that
        still runs): the task then shares busy devices rather than wait, with one warning.
        """
        if count <= 0:
            return ()
        last = self._last.get(owner, ()) if owner is not None else ()
        picked = [d for d in last if d in self._free][:count]
        picked += [d for d in self._free if d not in picked][: count - len(picked)]
        for d in picked:
            self._free.remove(d)
        if len(picked) < count:
            if not self._warned:
                self._warned = True
                log(
                    f"a task asks for {count} GPUs and only {len(picked)} of this host's "
                    f"{len(self.ids)} are free (a task the master aborted may still run); it "
                    "shares busy ones",
                    logging.WARNING,
                )
            busy = [d for d in self.ids if d not in picked]
            picked += busy[: count - len(picked)]
        held = tuple(picked)
        self._held[key] = held
        if owner is not None:
            self._last[owner] = held
        return held

    def free(self, key: Hashable) -> None:
        """Release what task ``key`` holds (nothing: no-op)."""
        held = self._held.pop(key, None)
        if not held:
            return
        still = {d for ds in self._held.values() for d in ds}
        for d in held:
            if d not in self._free and d not in still:
                self._free.append(d)
        self._free.sort(key=self.ids.index)

    def clear(self) -> None:
        """Release everything (the session ended: the master forgot every task)."""
        self._held.clear()
        self._free = list(self.ids)

    def held(self, key: Hashable) -> Tuple[str, ...]:
        """What task ``key`` holds."""
        return self._held.get(key, ())


def gpu_count(res: Dict[str, int] | None) -> int:
    """The GPUs an ``ASSIGN`` entry's ``res`` asks for (0: none or no request)."""
    if not res:
        return 0
    count = res.get(GPU, 0)
    return count if isinstance(count, int) and count > 0 else 0
