"""Correctly typed uses of the client: mypy must accept every line (tests/test_typing.py)."""

from __future__ import annotations

import concurrent.futures as cf
import datetime
from typing import Iterator

import rtpool


def square(x: int) -> int:
    return x * x


def label(name: str, n: int, *, sep: str = ":") -> str:
    return f"{name}{sep}{n}"


def use(client: rtpool.Client) -> None:
    fut: cf.Future[int] = client.submit(square, 3)
    total: int = client.submit(square, 3).result() + 1
    text: str = client.submit(label, "a", 1, sep="-").result(timeout=5).upper()
    squares: Iterator[int] = client.map(square, [1, 2, 3])
    labels: Iterator[str] = client.map(label, ["a", "b"], [1, 2], timeout=10)
    sums: Iterator[int] = client.map(lambda a, b, c: a + b + c, [1], [2], [3], chunksize=2)
    view = client.options(
        priority=3,
        timeout=2.5,
        deadline=datetime.datetime.now() + datetime.timedelta(seconds=5),
        on_miss="drop",
        max_attempts=None,
        keep=True,
    )
    again: int = view.options(hedge=True).submit(square, 4).result()
    gpu = client.options(resources={"gpu": 1, "mem_gb": 8}, labels={"zone": "a"})
    waits: int = gpu.options(unschedulable="wait").submit(square, 5).result()
    running: bool = fut.running()
    print(fut, total, text, list(squares), list(labels), list(sums), again, running, waits)
