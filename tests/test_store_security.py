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
    from durably._store.disk.blobs import subdir

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


@durably.task
def _large_value(n: int) -> bytes:
    _LARGE_CALLS.append(n)
    return b"v" * n  # over diskcache's inline limit: a .val file


_LARGE_CALLS: list[int] = []


@pytest.mark.parametrize("plant", ["fifo", "symlink to a device", "symlink to a file"])
def test_a_cache_value_file_replaced_by_a_link_or_a_fifo_is_never_read(
        tmp_path: Path, plant: str, caplog: pytest.LogCaptureFixture) -> None:
    """A value file of the cache turned into a FIFO hung the call for ever; a symbolic link
    to /dev/zero read until memory ran out (and a link to any file was followed): such a
    file is a miss, set aside with a warning, and the task executes again."""
    store = durably.DiskStore(tmp_path / "store")
    durably.configure(store=store)
    _LARGE_CALLS.clear()
    assert len(_large_value(300_000)) == 300_000
    [value] = (tmp_path / "store" / "cache").rglob("*.val")
    value.unlink()
    if plant == "fifo":
        os.mkfifo(value)
    else:
        other = tmp_path / "other.bin"
        other.write_bytes(b"x" * 300_000)
        value.symlink_to("/dev/zero" if plant == "symlink to a device" else other)
    with caplog.at_level("WARNING", logger="durably"):
        assert _large_value(300_000) == b"v" * 300_000
    assert _LARGE_CALLS == [300_000, 300_000]
    assert "not a regular file" in caplog.text
    assert _large_value(300_000) == b"v" * 300_000 and len(_LARGE_CALLS) == 2  # stored anew


def test_open_regular_refuses_links_fifos_and_devices(tmp_path: Path) -> None:
    import errno

    from durably._keys.serde import open_regular

    plain = tmp_path / "plain"
    plain.write_bytes(b"ok")
    with open_regular(str(plain)) as f:
        assert f.read() == b"ok"
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link").symlink_to(plain)
    for path, code in ((tmp_path / "fifo", errno.EINVAL), (tmp_path / "link", errno.ELOOP),
                       (Path("/dev/zero"), errno.EINVAL)):
        with pytest.raises(OSError) as info:
            open_regular(str(path))
        assert info.value.errno == code
