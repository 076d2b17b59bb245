"""The store conformance suite (:class:`durably.testing.StoreConformance`) on every store
durably ships: the disk store (raced by processes), the memory store, the minimal store
(only the protocol's abstract methods), and the PostgreSQL store with its values in its rows,
in a directory and in S3."""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import durably
from durably._store.postgres import PostgresStore
from durably.store import LargeValue, Store
from durably.testing import MemoryStore, StoreConformance

from .minimal_store import MinimalStore
from .postgres_server import drop_schemas, fresh_schema, s3_server, server_url, with_schema


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


class TestPostgresStore(StoreConformance):
    """The PostgreSQL store, its values in its rows; raced by processes (each opening the
    store from its URL). The server: ``$DURABLY_TEST_POSTGRES`` (see postgres_server.py)."""

    processes = True

    @pytest.fixture(autouse=True)
    def _schemas(self) -> Iterator[None]:
        self._by_path: dict[Path, str] = {}
        yield
        drop_schemas(server_url(), list(self._by_path.values()))

    def blobs(self) -> dict[str, Any]:
        return {}

    def _url(self, path: Path) -> str:
        schema = self._by_path.setdefault(path, fresh_schema())
        return with_schema(server_url(), schema)

    def make_store(self, path: Path) -> Store:
        return PostgresStore(self._url(path), allow_unsigned=True, **self.blobs())

    def reopen(self, store: Store) -> Store:
        url, options = store.location()  # type: ignore[misc]
        return durably.open_store(url, **options)

    def damage_value(self, store: Store, key: str) -> None:
        assert isinstance(store, PostgresStore)
        row = store._one("read", store._sql("SELECT value, blob FROM {s}.cache WHERE key = %s"),
                         (key,))
        assert row is not None, f"no cache entry {key}"
        if row[1] is None:
            store._write("damage", store._sql("UPDATE {s}.cache SET value = %s WHERE key = %s"),
                         (_flip(bytes(row[0])), key))
        else:  # a blob: changed where it is kept
            assert store.blobs is not None
            path = store.blobs.path(row[1])
            store.blobs.fs.pipe_file(path, _flip(store.blobs.fs.cat_file(path)))

    def make_store_with_key(self, path: Path, key: bytes) -> Store:
        return PostgresStore(self._url(path), key=key, **self.blobs())

    def set_clock(self, store: Store, when: float, monkeypatch: pytest.MonkeyPatch) -> None:
        # leases are timed by the server's clock: shifted as the process's is
        assert isinstance(store, PostgresStore)
        monkeypatch.setattr(store, "_shift", when - time.time())
        super().set_clock(store, when, monkeypatch)


class TestPostgresStoreWithFileBlobs(TestPostgresStore):
    """Values over 1 MiB in a shared directory (fsspec's local files)."""

    @pytest.fixture(autouse=True)
    def _blob_dir(self, tmp_path: Path) -> None:
        self._blob_url = (tmp_path / "blobs").as_uri()

    def blobs(self) -> dict[str, Any]:
        return {"blobs": self._blob_url}


class TestPostgresStoreWithS3Blobs(TestPostgresStore):
    """Values over 1 MiB in S3 (a local moto server, through s3fs)."""

    def blobs(self) -> dict[str, Any]:
        s3 = s3_server()
        url = self.__dict__.setdefault("_blob_url", s3.url())
        return {"blobs": url, "blob_options": s3.options}
