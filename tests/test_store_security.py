"""A store never reads or writes through links, and a private store accepts only parts its
owner alone can write (found by a reviewer planting a symlink and a writable cache)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import durably


def _used_store(root: Path) -> durably.DiskStore:
    store = durably.DiskStore(root)
    store.cache_put("k", b"value")
    store.close()
    return store


def test_a_symlinked_part_is_refused_even_for_a_shared_store(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _used_store(root)
    elsewhere = tmp_path / "victim"
    elsewhere.mkdir()
    (root / "damaged").symlink_to(elsewhere)
    for shared in (False, True):
        store = durably.DiskStore(root, allow_shared=shared)
        with pytest.raises(durably.StoreError, match="damaged is a symbolic link"):
            store.cache_get("k")
    assert list(elsewhere.iterdir()) == []


def test_a_link_created_after_the_store_opened_is_not_followed(tmp_path: Path) -> None:
    from durably._blobs import subdir

    root = tmp_path / "store"
    _used_store(root)
    elsewhere = tmp_path / "victim"
    elsewhere.mkdir()
    (root / "damaged").symlink_to(elsewhere)
    with pytest.raises(durably.StoreError, match="symbolic link"):
        subdir(root, "damaged")


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX permissions")
def test_a_private_store_refuses_parts_others_can_write(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _used_store(root)
    os.chmod(root / "cache", 0o777)
    with pytest.raises(durably.StoreError, match="cache can be written by other users"):
        durably.DiskStore(root).cache_get("k")
    os.chmod(root / "cache", 0o700)
    assert durably.DiskStore(root).cache_get("k") == b"value"


def test_a_lost_journal_is_noticed_not_silently_started_over(tmp_path: Path) -> None:
    root = tmp_path / "store"

    @durably.entrypoint(store=durably.DiskStore(root))
    def job() -> str:
        return "done"

    job()
    job.spec.store.close()  # type: ignore[union-attr]
    (root / "journal.sqlite3").write_bytes(b"")  # emptied (or its -wal deleted after a crash)
    for extra in ("journal.sqlite3-wal", "journal.sqlite3-shm"):
        (root / extra).unlink(missing_ok=True)
    with pytest.raises(durably.StoreError, match="missing or empty, but this store had one"):
        durably.DiskStore(root).list_runs()
    (root / "JOURNAL").unlink()  # starting a new journal on purpose
    assert durably.DiskStore(root).list_runs() == []


def test_a_damaged_lease_row_is_taken_over_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import sqlite3

    root = tmp_path / "store"
    store = durably.DiskStore(root)

    @durably.entrypoint(store=store)
    def job() -> int:
        return 1

    job()
    store.close()
    con = sqlite3.connect(root / "journal.sqlite3")
    con.execute("INSERT OR REPLACE INTO leases VALUES (?, 'otherhost', 1, NULL, 't', 'hb')",
                (durably.list_runs(job, store=durably.DiskStore(root))[0].id,))
    con.commit()
    con.close()
    assert job.run().result == 1
    assert "is damaged" in caplog.text
