"""Type-checked by mypy (tests/test_typing.py), never run: decorated functions keep their
signatures for type checkers."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, assert_type

import durably


@durably.task
def add(x: int, y: int = 2) -> int:
    return x + y


@durably.task(version="1", ignore=("verbose",))
def scale(x: float, verbose: bool = False) -> float:
    return 2 * x


@durably.task
async def fetch(url: str) -> bytes:
    return url.encode()


@durably.entrypoint
def pipeline(n: int) -> list[int]:
    return [add(i) for i in range(n)]


@durably.entrypoint(name="nightly")
async def apipeline(n: int) -> int:
    return len(await fetch(str(n)))


class Model:
    @durably.task
    def predict(self, x: int) -> str:
        return str(x)


assert_type(add(1), int)
assert_type(add(1, y=3), int)
assert_type(scale(1.0, verbose=True), float)
assert_type(fetch("u"), Coroutine[Any, Any, bytes]).close()
assert_type(pipeline(3), list[int])
assert_type(pipeline.run(3), durably.Run[list[int]])
assert_type(pipeline.run(3).result, list[int])
assert_type(Model().predict(1), str)
assert_type(add.cache_key(1), str)
assert_type(add.refresh(1, y=3), int)
assert_type(fetch.refresh("u"), Coroutine[Any, Any, bytes]).close()
assert_type(add.clear(), durably.Removed)
assert_type(durably.prune(max_entries=10, task=add), durably.Removed)


@durably.task(expires_after=3600, cache_if=lambda result, duration: duration > 1.0)
def expiring(x: int) -> int:
    return x


assert_type(expiring(1), int)

add("one")  # type: ignore[arg-type]
add(1, z=2)  # type: ignore[call-arg]
pipeline()  # type: ignore[call-arg]
Model().predict("x")  # type: ignore[arg-type]
add.refresh("one")  # type: ignore[arg-type]


@durably.entrypoint(timeout=600)
def bounded(n: int) -> int:
    return n


assert_type(bounded(1), int)
assert_type(durably.cancelled(), bool)
assert_type(durably.cancel_run("run-1"), bool)
durably.entrypoint(timeout="10")  # type: ignore[call-overload]
