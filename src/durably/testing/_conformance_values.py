"""The conformance tests of the values a store keeps (:class:`ValuesConformance`): cache
entries and key records, values from 0 bytes to ``large_value_bytes`` (large ones streamed
as :class:`~durably.store.LargeValue`), damaged and foreign (signed with another key)
values read as misses, and the collection of unreferenced values.

They are the part of :class:`durably.testing.StoreConformance` that checks the
:class:`durably.store.Values` and :class:`durably.store.KeyRecords` sides of the protocol
(and the values kept in the journal: a step's value, a run's result), apart from the tests of
the journal (:mod:`durably.testing._conformance_journal`), whose records they write.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import xxhash

import durably
from durably._keys import serde as _serde
from durably._store.integrity import _process_key_set as _process_key
from durably.exceptions import StoreError
from durably.store import KeyRecord, LargeValue, Store
from durably.testing._conformance_journal import _id, _refused, _run, _step

__all__ = ["ValuesConformance"]

#: the sizes of the values every store keeps (bytes), besides ``large_value_bytes``
_SIZES = (0, 1, 64 << 10, 1 << 20, _serde.SPILL_BYTES + 1)
#: the two signing keys of the signing test (at least 16 bytes each)
_KEY_A = b"durably-conformance-key-A-0123456789"
_KEY_B = b"durably-conformance-key-B-0123456789"


def _or_key_refused(read: Callable[[], Any]) -> Callable[[], Any]:
    """``read``, None when the store refuses to open with another key than the one its
    values are signed with (a :class:`~durably.StoreError` that says so)."""
    def reading() -> Any:
        try:
            return read()
        except StoreError as exc:
            if "another key" not in str(exc):
                raise
            return None
    return reading


def _pattern(n: int, seed: int = 0) -> bytes:
    """``n`` bytes that are not all alike, made in one allocation."""
    block = xxhash.xxh3_128_digest(seed.to_bytes(8, "little")) * 256  # 4 KiB
    whole, tail = divmod(n, len(block))
    return b"".join([block] * whole + [block[:tail]])


def _digest(value: bytes) -> bytes:
    """xxh3-128 of a value's bytes: a :class:`~durably.store.LargeValue` streamed from its
    file (never read whole), any other value as it is."""
    if not isinstance(value, _serde.Spilled):
        return xxhash.xxh3_128_digest(value)
    hasher = xxhash.xxh3_128()
    with value.open() as f:
        left = value.size
        while left:
            chunk = f.read(min(left, 8 << 20))
            assert chunk, f"the large value in {value.path} is cut short"
            hasher.update(chunk)
            left -= len(chunk)
    return hasher.digest()


def _large(n: int, seed: int) -> tuple[LargeValue, bytes]:
    """A :class:`~durably.store.LargeValue` holding the pickle of ``n`` bytes, and the
    digest of those bytes."""
    payload = _pattern(n, seed)
    wanted = xxhash.xxh3_128_digest(payload)
    value = _serde.dumps(payload, what="a conformance test's value")
    del payload
    assert isinstance(value, LargeValue), (
        f"a pickle of {n:,} bytes should be a LargeValue (larger than "
        f"{_serde.SPILL_BYTES:,} bytes)")
    return value, wanted


def _size_id(n: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        whole, rest = divmod(n, 1 << shift)
        if whole:
            return f"{whole}{unit}" + (f"+{rest}" if rest else "")
    return f"{n}B"


class ValuesConformance:
    """The tests of values: cache entries, key records, values of every size, damage,
    signing, collection. A part of :class:`~durably.testing.StoreConformance`, which gives
    them its fixtures and harness (and the sizes of ``value_size``)."""

    if TYPE_CHECKING:  # StoreConformance's harness, which these tests use
        def damage_value(self, store: Store, key: str) -> None: ...

        def make_store_with_key(self, path: Path, key: bytes) -> Store: ...

    # -- cache entries and key records -----------------------------------------------------
    def test_key_records_are_listed_newest_first(self, store: Store) -> None:
        """``list_keys`` returns a task's key records (as written) newest first, at most
        ``limit``; a key record stays when its entry is deleted."""
        task = "conformance:double"
        records = [KeyRecord(task, _id(), "code-1", {"x": "ab" * 16}, {"helper": "cd" * 16},
                             created) for created in (1000.0, 3000.0, 2000.0)]
        store.cache_put_many([(r.cache_key, b"v", r) for r in records])
        store.cache_put(_id(), b"v", KeyRecord("conformance:other", _id(), "c", {}, {}, 9e3))
        assert store.list_keys(task) == [records[1], records[2], records[0]]
        assert store.list_keys(task, limit=2) == [records[1], records[2]]
        assert store.list_keys("conformance:none") == []
        assert store.cache_delete([records[1].cache_key]) == 1
        assert store.list_keys(task)[0] == records[1]

    def test_a_key_record_is_found_by_its_key(self, store: Store) -> None:
        """``find_key`` returns the key record of a cache key of that task (the latest
        written for it), None for another task's key or a key without one."""
        task = "conformance:found"
        first = KeyRecord(task, _id(), "code-1", {"x": "ab" * 16}, {}, 1000.0)
        store.cache_put_many([(first.cache_key, b"v", first)])
        assert store.find_key(task, first.cache_key) == first
        again = KeyRecord(task, first.cache_key, "code-1", {"x": "ab" * 16}, {}, 2000.0)
        store.cache_put(first.cache_key, b"w", again)  # written again: its newer record
        assert store.find_key(task, first.cache_key) == again
        assert store.find_key("conformance:other", first.cache_key) is None
        plain = _id()
        store.cache_put(plain, b"v")
        assert store.find_key(task, plain) is None
        assert store.find_key(task, _id()) is None

    def test_a_key_record_keeps_the_duration_of_its_execution(self, store: Store) -> None:
        """A key record's ``duration`` (seconds the execution that produced the entry took)
        is kept: ``find_key`` and ``list_keys`` give it back; ``cache_get_timed`` gives the
        value with it (0.0 for an entry without a key record, or whose record has none;
        the protocol's default, for a backend that does not override it, is always 0.0),
        None for a key without an entry."""
        task = "conformance:timed"
        timed = KeyRecord(task, _id(), "code-1", {"x": "ab" * 16}, {}, 1000.0, 1.25)
        untimed = KeyRecord(task, _id(), "code-1", {"x": "cd" * 16}, {}, 2000.0)
        plain = _id()
        store.cache_put_many([(timed.cache_key, b"t", timed), (untimed.cache_key, b"u", untimed)])
        store.cache_put(plain, b"p")
        assert store.find_key(task, timed.cache_key) == timed
        assert [r.duration for r in store.list_keys(task)] == [0.0, 1.25]
        keeps = type(store).cache_get_timed is not Store.cache_get_timed
        assert store.cache_get_timed(timed.cache_key) == (b"t", 1.25 if keeps else 0.0)
        assert store.cache_get_timed(untimed.cache_key) == (b"u", 0.0)
        assert store.cache_get_timed(plain) == (b"p", 0.0)
        assert store.cache_get_timed(_id()) is None
        again = KeyRecord(task, timed.cache_key, "code-1", {"x": "ab" * 16}, {}, 3000.0, 0.5)
        store.cache_put(timed.cache_key, b"t2", again)  # executed again: its new duration
        assert store.cache_get_timed(timed.cache_key) == (b"t2", 0.5 if keeps else 0.0)
        assert store.find_key(task, timed.cache_key) == again

    def test_a_step_record_keeps_the_time_the_cache_saved(self, store: Store) -> None:
        """A step record's ``saved`` (a step served from the cache: seconds its entry's
        execution took) is journaled and read back by ``list_steps`` and ``page_steps``;
        a record without it reads 0.0."""
        run_id = _id()
        store.put_run(_run(run_id))
        hit = dataclasses.replace(_step(run_id, 0, status="cached", cache_key=_id()),
                                  saved=2.5)
        ran = _step(run_id, 1, cache_key=_id())
        store.append_steps([(hit, b"v"), (ran, b"w")])
        assert [s.saved for s in store.list_steps(run_id)] == [2.5, 0.0]
        assert store.list_steps(run_id)[0] == hit
        assert [s.saved for s in store.page_steps(run_id, 1)] == [2.5, 0.0]

    def test_cache_entries_are_put_got_and_deleted(self, store: Store) -> None:
        """``cache_get`` returns what ``cache_put``/``cache_put_many`` stored (the last value
        written for a key), None for a miss; ``cache_delete`` removes entries and returns
        how many of them existed."""
        one, two, three = _id(), _id(), _id()
        assert store.cache_get(one) is None
        store.cache_put(one, b"first")
        assert store.cache_get(one) == b"first"
        store.cache_put(one, b"second")
        store.cache_put_many([(two, b"two", None), (three, b"", None)])
        assert (store.cache_get(one), store.cache_get(two), store.cache_get(three)) == (
            b"second", b"two", b"")
        assert store.cache_delete([one, _id(), three]) == 2
        assert (store.cache_get(one), store.cache_get(two), store.cache_get(three)) == (
            None, b"two", None)
        assert store.cache_delete([one]) == 0

    def test_clear_task_removes_that_task_entries(self, store: Store) -> None:
        """``clear_task`` removes the cache entries of the task of that identity, returns how
        many, and keeps the entries of other tasks."""
        mine = [KeyRecord("conformance:mine", _id(), "c", {}, {}, 1000.0 + i)
                for i in range(3)]
        theirs = KeyRecord("conformance:theirs", _id(), "c", {}, {}, 1000.0)
        store.cache_put_many([(r.cache_key, b"v", r) for r in (*mine, theirs)])
        assert store.cache_delete([mine[0].cache_key]) == 1
        assert store.clear_task("conformance:mine") == 2
        assert all(store.cache_get(r.cache_key) is None for r in mine)
        assert store.cache_get(theirs.cache_key) == b"v"
        assert store.clear_task("conformance:mine") == 0
        assert store.clear_task("conformance:none") == 0
    # -- values ----------------------------------------------------------------------------
    @pytest.mark.parametrize("place", ["cache", "step", "result"])
    def test_values_round_trip(self, store: Store, place: str, value_size: int) -> None:
        """A value of every size from 0 bytes to ``large_value_bytes``, stored as a cache
        entry, a step's value or a run's result, reads back with the same bytes; one larger
        than 64 MiB is given as a :class:`~durably.store.LargeValue` and stored as its
        content, never as its description (it loads back as the original)."""
        large = value_size > _serde.SPILL_BYTES
        value: bytes
        if large:
            value, original = _large(value_size, seed=value_size)
        else:
            value, original = _pattern(value_size, seed=value_size), b""
        wanted, size = _digest(value), len(value)
        got = self._store_and_read(store, place, value)
        del value
        assert got is not None, f"the value stored as {place} reads as missing"
        assert len(got) == size, (f"the value stored as {place} reads back with {len(got):,} "
                                  f"bytes, not {size:,}")
        assert _digest(got) == wanted, f"the value stored as {place} reads back changed"
        if large:
            loaded = _serde.loads(got)
            del got
            assert isinstance(loaded, bytes) and len(loaded) == value_size
            assert xxhash.xxh3_128_digest(loaded) == original

    @staticmethod
    def _store_and_read(store: Store, place: str, value: bytes) -> bytes | None:
        run_id, key = _id(), _id()
        if place == "cache":
            store.cache_put(key, value)
            return store.cache_get(key)
        if place == "step":
            store.put_run(_run(run_id))
            step = _step(run_id, 0, cache_key=key)
            store.append_steps([(step, value)])
            return store.find_step(run_id, step.step_id)
        store.put_run(_run(run_id, status="finished", result=value))
        found = store.find_run(run_id)
        assert found is not None
        return found.result

    @pytest.mark.parametrize("size", [100, 1 << 20, _serde.SPILL_BYTES + 1],
                             ids=["small", "1MiB", "large"])
    def test_a_damaged_cache_value_is_a_miss(self, store: Store, size: int) -> None:
        """A cache value whose stored bytes were damaged (:meth:`damage_value`) reads as a
        miss (``cache_get`` returns None, and raises nothing), small or large; the key is
        written again afterwards as any other."""
        key = _id()
        value: bytes = _large(size, seed=7)[0] if size > _serde.SPILL_BYTES else _pattern(size)
        store.cache_put(key, value)
        del value
        self.damage_value(store, key)
        got = store.cache_get(key)
        assert got is None, (f"a damaged cache value of {size:,} bytes was served "
                             f"({len(got):,} bytes) instead of read as a miss")
        assert store.cache_get(key) is None
        store.cache_put(key, b"again")
        assert store.cache_get(key) == b"again"

    def test_a_value_signed_with_another_key_is_not_served(self, tmp_path: Path) -> None:
        """A value written by a store signing with one key (a cache entry, a step's value,
        a run's result) is served to a handle with the same key, and never to a handle on
        the same data with another key (a miss, or for a journal value, None or
        :class:`~durably.CorruptJournalError`; or a :class:`~durably.StoreError` saying
        the store's values are signed with another key, from a store that checks the key
        when it opens)."""
        path = tmp_path / "signed"
        run_id, key = _id(), _id()
        step = _step(run_id, 0, cache_key=_id())  # (cacheable: a damaged value is a miss)
        value = b"a value signed with key A"
        key_before = _process_key()
        writer = self.make_store_with_key(path, _KEY_A)
        handles = [writer]
        try:
            writer.cache_put(key, value)
            writer.put_run(_run(run_id, status="finished", result=value))
            writer.append_steps([(step, value)])
            same = self.make_store_with_key(path, _KEY_A)
            handles.append(same)
            assert same.cache_get(key) == value
            assert same.find_step(run_id, step.step_id) == value
            found = same.find_run(run_id)
            assert found is not None and found.result == value
            foreign = self.make_store_with_key(path, _KEY_B)
            handles.append(foreign)
            served = [what for what, read in (
                ("the cache entry", lambda: foreign.cache_get(key)),
                ("the step's value", lambda: foreign.find_step(run_id, step.step_id)),
                ("the run's result", lambda: _result(foreign, run_id)),
            ) if not _refused(_or_key_refused(read))]
            assert not served, f"signed with another key, yet served: {', '.join(served)}"
        finally:
            closed: list[Store] = []
            for handle in handles:
                if all(handle is not c for c in closed):
                    closed.append(handle)
                    handle.close()
            if key_before is None and _process_key() is not None:
                durably.configure(key=None)  # (a harness that configured a key: undone)

    def test_collect_values_removes_only_unreferenced_values(self, store: Store) -> None:
        """``collect_values(grace=0)`` (capability ``"maintenance"``) removes the large
        values no row refers to (of deleted runs, prepared by ``seal_ahead`` for a write
        never made) and keeps those a run or a cache entry refers to."""
        if "maintenance" not in store.capabilities:
            pytest.skip(f"{type(store).__name__} does not declare the capability "
                        "\"maintenance\" (collect_values)")
        kept, doomed, cache_key = _id(), _id(), _id()
        size = _serde.SPILL_BYTES + 1
        store.find_run(kept)  # (opened: large values are prepared where it keeps them)
        value, _ = _large(size, seed=1)
        wanted = _digest(value)
        store.put_run(_run(kept, status="finished", result=value))
        value, _ = _large(size, seed=2)
        store.put_run(_run(doomed, status="finished", result=value))
        value, _ = _large(size, seed=3)
        cached = _digest(value)
        store.cache_put(cache_key, value)
        value, _ = _large(size, seed=4)
        orphan = store.seal_ahead(value, "result", _id())  # (a write that is never made)
        prepared = orphan is not value
        del value
        assert store.delete_runs([doomed]) == [doomed]
        removed, freed = store.collect_values(grace=0)
        if prepared:
            assert removed >= 1 and freed > 0, (
                "the value prepared by seal_ahead() for a write never made was not removed")
        found = store.find_run(kept)
        assert found is not None and found.result is not None
        assert _digest(found.result) == wanted
        got = store.cache_get(cache_key)
        assert got is not None and _digest(got) == cached
        assert store.collect_values(grace=0)[0] == 0


def _result(store: Store, run_id: str) -> bytes | None:
    found = store.find_run(run_id)
    return None if found is None else found.result
