"""Wrongly typed uses of the client: mypy must report exactly the error code that ends each
marked line (``# E: code``) and nothing else (tests/test_typing.py)."""

from __future__ import annotations

import rtpool


def square(x: int) -> int:
    return x * x


def use(client: rtpool.Client) -> None:
    client.submit(square, "three")  # E: arg-type
    client.submit(square, 3, 4)  # E: call-arg
    text: str = client.submit(square, 3).result()  # E: assignment
    client.map(square, ["a", "b"])  # E: arg-type
    client.options(priorty=3)  # E: call-arg
    client.options(on_miss="later")  # E: arg-type
    client.options(timeout="2s")  # E: arg-type
    client.options(resources={"gpu": "one"})  # E: dict-item
    client.options(unschedulable="later")  # E: arg-type
    print(text)
