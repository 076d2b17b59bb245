"""The store conformance suite (:class:`durably.testing.StoreConformance`) on every store
durably ships: the disk store (raced by processes), the memory store and the minimal store
(only the protocol's abstract methods)."""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import durably
from durably.store import LargeValue, Store
from durably.testing import MemoryStore, StoreConformance

from .minimal_store import MinimalStore


def _flip(data: bytes) -> bytes:
    """``data`` with its last byte changed (in a value's payload: after any header)."""
    if not data:
        return b"\x01"
    return data[:-1] + bytes([data[-1] ^ 0xFF])


def _flip_file(path: str | Path, at: int) -> None:
    """Change the byte at ``at`` of a file, in a copy put in its place: the file's other
    names (hard links) keep the original."""
    temp = f"{path}.damaged"
    shutil.copyfile(path, temp)
    with open(temp, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.replace(temp, path)


class TestDiskStore(StoreConformance):
    processes = True

    def make_store(self, path: Path) -> Store:
        return durably.DiskStore(path)

    def damage_value(self, store: Store, key: str) -> None:
        assert isinstance(store, durably.DiskStore)
        folder = store.path / "cache"
        with sqlite3.connect(folder / "cache.db", isolation_level=None) as db:
            row = db.execute("SELECT rowid, value, filename FROM Cache WHERE key=? AND raw=1",
                             (key,)).fetchone()
            assert row is not None, f"no cache entry {key}"
            rowid, value, filename = row
            if value is not None:  # kept in the index
                db.execute("UPDATE Cache SET value=? WHERE rowid=?", (_flip(bytes(value)),
                                                                      rowid))
            else:  # a value file: its last byte is the payload's
                path = folder / filename
                _flip_file(path, path.stat().st_size - 1)
        db.close()
        store.forget_memo([key])

    def make_store_with_key(self, path: Path, key: bytes) -> Store:
        return durably.DiskStore(path, key=key)


class TestMemoryStore(StoreConformance):
    def make_store(self, path: Path) -> Store:
        return MemoryStore()

    def damage_value(self, store: Store, key: str) -> None:
        assert isinstance(store, MemoryStore)
        _damage_in(store._cache, key)

    def make_store_with_key(self, path: Path, key: bytes) -> Store:
        # the process's key (the conftest fixture restores it after the test); the same
        # store for the same path, as a directory would be
        durably.configure(key=key)
        stores: dict[Path, Store] = self.__dict__.setdefault("_by_path", {})
        return stores.setdefault(path, MemoryStore())


class TestMinimalStore(StoreConformance):
    def make_store(self, path: Path) -> Store:
        return MinimalStore()

    def damage_value(self, store: Store, key: str) -> None:
        assert isinstance(store, MinimalStore)
        _damage_in(store._values, key)

    def make_store_with_key(self, path: Path, key: bytes) -> Store:
        durably.configure(key=key)
        stores: dict[Path, Store] = self.__dict__.setdefault("_by_path", {})
        return stores.setdefault(path, MinimalStore())


def _damage_in(values: dict[str, Any], key: str) -> None:
    """Damage the value a store in memory keeps under ``key``: its bytes, or the file of a
    large value it keeps as a handle."""
    value = values[key]
    if isinstance(value, LargeValue):
        _flip_file(value.path, value.offset + value.size - 1)
    else:
        values[key] = _flip(bytes(value))
