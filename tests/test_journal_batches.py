"""The journal rows of steps served from the cache are buffered (written in batches), and
never later than the next step record of the attempt: they go in with it, in the same write,
on every store."""

from __future__ import annotations

from typing import Any

import durably
from durably.store import Store

_SEEN: dict[str, Any] = {}


@durably.task
def served(i: int) -> int:
    return i * 3


@durably.task
def executed(i: int) -> int:
    store: Store = _SEEN["store"]
    _SEEN["journal"].append([(s.task, s.status) for s in store.list_steps("mixed-run")])
    return -i


@durably.task
def looked(i: int) -> int:
    return i


@durably.entrypoint
def mixed(n: int) -> int:
    total = sum(served(i) for i in range(n))
    total += executed(0)
    looked(0)  # (the journal as this step starts: read by executed(1))
    total += executed(1)
    return total


def test_hits_are_journaled_with_the_next_executed_step(store: durably.Store) -> None:
    for i in range(5):
        served(i)  # (the cache alone)
    _SEEN.update(store=store, journal=[])
    run = mixed.run(5, run_id="mixed-run")
    assert run.counts() == {"ran": 3, "cached": 5, "replayed": 0, "failed": 0}
    first, second = _SEEN["journal"]
    assert first == []  # (while executed(0) runs: nothing journaled yet, hits included)
    # executed(0) went in with the five hits before it; looked(0) with nothing buffered
    assert second == [("served", "cached")] * 5 + [("executed", "ran"), ("looked", "ran")]
