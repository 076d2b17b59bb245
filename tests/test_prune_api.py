"""Pruning and clearing the cache from Python: ``durably.prune(...)`` and ``task.clear()``
do what ``durably cache prune`` / ``durably cache clear`` do, and say what they removed."""

from __future__ import annotations

import datetime
import os
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import durably
from durably.cli import cli
from durably.testing import MemoryStore


def _age(store: durably.DiskStore, keys: list[str], seconds: float) -> None:
    """Make these entries look stored ``seconds`` ago (diskcache's store_time)."""
    cache = store.cache
    for key in keys:
        cache._sql("UPDATE Cache SET store_time = ? WHERE key = ?",
                   (time.time() - seconds, key))


def _tasks(maintained: Any) -> tuple[Any, Any]:
    @durably.task(name="square")
    def square(x: int) -> int:
        return x * x

    @durably.task(name="big")
    def big(x: int) -> bytes:
        return os.urandom(200_000) + bytes([x])

    return square, big


@pytest.fixture(params=["disk", "postgres"])
def maintained(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """The stores with the capability "maintenance"."""
    from .conftest import make_store
    from .postgres_server import drop_schemas, server_url

    s = make_store(request.param, tmp_path)
    durably.configure(store=s)
    yield s
    durably.configure()
    s.close()
    if request.param == "postgres":
        drop_schemas(server_url(), [s.schema])


def test_prune_by_count_of_one_task_keeps_its_newest(maintained: Any) -> None:
    square, big = _tasks(maintained)
    for x in range(6):
        square(x)
        time.sleep(0.002)  # (distinct times of storing: "oldest" is well defined)
    big(1)
    removed = durably.prune(max_entries=2, task=square)
    assert removed.entries == 4
    assert [square.explain(x).hit for x in range(6)] == [False] * 4 + [True] * 2
    assert big.explain(1).hit  # another task's entries are not looked at
    assert durably.prune(max_entries=2, task="square").entries == 0  # by its name too


def test_prune_by_size_says_the_bytes_it_freed(maintained: Any) -> None:
    square, big = _tasks(maintained)
    for x in range(4):
        big(x)
        time.sleep(0.002)
    square(1)
    would = durably.prune(max_size=250_000, task=big, dry_run=True)
    assert would == durably.Removed(entries=3, bytes=None)
    assert all(big.explain(x).hit for x in range(4))  # a dry run removes nothing
    removed = durably.prune(max_size=250_000, task=big)
    assert removed.entries == 3 and removed.bytes is not None and removed.bytes >= 3 * 200_000
    assert [big.explain(x).hit for x in range(4)] == [False, False, False, True]
    assert square.explain(1).hit


def test_the_bytes_a_prune_removed_are_those_the_cache_statistics_counted(
        maintained: Any) -> None:
    """The bytes a prune or a clear says it removed are the bytes the cache's statistics
    counted for those entries (a task's ``bytes``): small entries too, kept in the cache's
    database, whose files do not shrink when they go (their pages are kept for reuse)."""
    square, big = _tasks(maintained)
    for x in range(50):
        square(10**40 + x)  # (small entries: in the database)
    big(1)  # (a large one: a file of its own)
    for name in ("square", "big"):
        tasks = {t["task"].rpartition(":")[2]: t for t in maintained.cache_stats()["tasks"]}
        counted = tasks[name]["bytes"]
        assert counted > 0
        removed = durably.prune(max_entries=0, task=name)
        assert removed == durably.Removed(tasks[name]["entries"], counted)
    square(1)
    counted = maintained.cache_stats()["entry_bytes"]
    assert counted == maintained.cache_entry_bytes() > 0
    assert square.clear() == durably.Removed(1, counted)


def test_prune_by_age_takes_seconds_or_a_timedelta(disk_store: durably.DiskStore) -> None:
    square, _ = _tasks(disk_store)
    for x in range(3):
        square(x)
    _age(disk_store, [square.cache_key(0), square.cache_key(1)], 40 * 86400)
    assert durably.prune(older_than=datetime.timedelta(days=30), dry_run=True).entries == 2
    assert durably.prune(older_than=30 * 86400).entries == 2
    assert [square.explain(x).hit for x in range(3)] == [False, False, True]


def test_prune_leaves_the_journal_so_runs_still_replay(disk_store: durably.DiskStore) -> None:
    square, _ = _tasks(disk_store)
    calls: list[int] = []

    @durably.entrypoint(name="job")
    def job(n: int) -> int:
        calls.append(n)
        return sum(square(i) for i in range(n))

    run = job.run(3)
    assert durably.prune(max_entries=0).entries == 3
    again = job.run(3)
    assert again.id == run.id and again.result == 5 and calls == [3, 3]
    assert [s.status for s in again.steps if s.attempt == again.attempt] == ["replayed"] * 3


def test_task_clear_says_what_it_removed(disk_store: durably.DiskStore) -> None:
    square, big = _tasks(disk_store)
    square(1), square(2), big(1)
    removed = big.clear()
    assert removed.entries == 1 and removed.bytes is not None and removed.bytes >= 200_000
    assert square.clear().entries == 2 and square.clear() == durably.Removed(0, 0)


def test_task_clear_works_on_every_store_prune_needs_maintenance() -> None:
    store = MemoryStore()
    durably.configure(store=store)
    square, _ = _tasks(store)
    square(1)
    assert square.clear() == durably.Removed(entries=1, bytes=None)
    with pytest.raises(durably.StoreError, match=r"MemoryStore.*cannot prune.*maintenance.*Fix"):
        durably.prune(older_than=0)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({}, "needs older_than"),
    ({"older_than": -1}, "older_than=...\\) must be seconds >= 0"),
    ({"older_than": "30d"}, "older_than=...\\) must be seconds"),
    ({"max_size": 1.5}, "max_size=...\\) must be a whole number of bytes"),
    ({"max_entries": -2}, "max_entries=...\\) must be a whole number of entries"),
    ({"max_entries": 1, "task": 3}, "task=...\\) takes a task"),
])
def test_bad_limits_are_refused(disk_store: durably.DiskStore, kwargs: dict[str, Any],
                                message: str) -> None:
    with pytest.raises(durably.DefinitionError, match=message):
        durably.prune(**kwargs)


def test_an_unknown_task_is_not_found(disk_store: durably.DiskStore) -> None:
    square, _ = _tasks(disk_store)
    square(1)
    with pytest.raises(durably.NotFoundError, match=r"no task 'nope'.*square"):
        durably.prune(max_entries=0, task="nope")


def test_prune_on_another_store_than_the_default(tmp_path: Path) -> None:
    other = durably.DiskStore(tmp_path / "other")

    @durably.entrypoint(store=other, name="fill")
    def fill() -> int:
        square, _ = _tasks(other)
        return sum(square(i) for i in range(3))

    assert fill() == 5
    assert durably.prune(max_entries=0).entries == 0  # the default store: empty
    assert durably.prune(max_entries=1, store=other).entries == 2


def test_the_command_prunes_by_count_and_task(disk_store: durably.DiskStore) -> None:
    square, big = _tasks(disk_store)
    for x in range(3):
        square(x)
        time.sleep(0.002)
    big(1)
    disk_store.close()
    runner = CliRunner()
    out = runner.invoke(cli, ["--dir", str(disk_store.path), "cache", "prune",
                              "--max-entries", "1", "--task", "square"])
    assert out.exit_code == 0, out.output
    assert "removed 2 cache entries" in out.output
    assert [square.explain(x).hit for x in range(3)] == [False, False, True]
    assert big.explain(1).hit


def test_store_arguments_take_a_path_or_url_as_elsewhere(tmp_path: Path) -> None:
    """store= of durably.prune, recover, list_runs, get_run and delete_runs opens a path or
    a URL, as @entrypoint(store=...) does (a str raised AttributeError)."""
    where = tmp_path / "by-path"

    @durably.entrypoint(store=str(where))
    def job(n: int) -> int:
        return n

    run = job.run(3)
    assert [r.id for r in durably.list_runs(store=str(where))] == [run.id]
    assert durably.get_run(run.id, store=where).result == 3
    assert durably.recover(store=f"file://{where}") == []
    assert durably.prune(older_than=0, store=str(where)).entries == 0
    assert durably.delete_runs([run.id], store=str(where)) == [run.id]
