"""``rtpool status``'s view of resources (``docs/resources.md``): each worker's resources (in
use of total) and labels, and the resource classes' queues, with the unschedulable ones
marked. The fields are the master's snapshot's (``docs/protocol.md``, ``CLUSTER_STATUS``)."""

from __future__ import annotations

from typing import Any, Dict, List

__all__ = ["class_rows", "worker_resources", "CLASS_COLUMNS"]

#: The columns of the classes table.
CLASS_COLUMNS = ["class", "queued", "running", "workers", "state"]


def _pairs(values: Dict[str, Any] | None) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted((values or {}).items()))


def worker_resources(w: Dict[str, Any]) -> str:
    """``gpu 1/2, mem_gb 8/64; zone=a``: what a worker's running tasks hold of its totals,
    then its labels ("" for a worker with neither)."""
    total = w.get("resources") or {}
    used = w.get("in_use") or {}
    res = ", ".join(f"{n} {used.get(n, 0)}/{v}" for n, v in sorted(total.items()))
    labels = _pairs(w.get("labels"))
    return "; ".join(p for p in (res, labels) if p)


def class_name(c: Dict[str, Any]) -> str:
    """A class as ``/metrics`` names it: ``gpu=1,zone=a``."""
    parts = (_pairs(c.get("resources")), _pairs(c.get("labels")))
    return c.get("name") or ",".join(p for p in parts if p)


def class_rows(classes: List[Dict[str, Any]]) -> List[List[Any]]:
    """One row per resource class: its request, its queue, the workers able to serve it, and
    ``unschedulable`` (in red) when none of them is connected."""
    from rich.text import Text

    rows = []
    for c in classes:
        stuck = bool(c.get("unschedulable"))
        rows.append(
            [
                class_name(c) or "default",
                f"{c.get('queued') or 0:,}",
                f"{c.get('running') or 0:,}",
                f"{c.get('workers') or 0:,}",
                Text("unschedulable", "bold red") if stuck else Text("ok"),
            ]
        )
    return rows
