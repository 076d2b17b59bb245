"""``compress=`` on a task or a DiskStore (issue #38, point 4): results are stored as
zstandard frames and loaded back transparently; a value records whether it is compressed, so
entries written either way load for a task defined either way, on every store."""

from __future__ import annotations

import pickle
import random
import sys
from pathlib import Path
from typing import Any

import pytest
import zstandard

import durably
from durably._keys import serde as _serde
from durably._keys.layouts import ZSTD
from durably.exceptions import DefinitionError

TEXT = ("the quick brown fox jumps over the lazy dog " * 20_000).encode()  # 880 kB
NOISE = random.Random(0).randbytes(50_000)  # (compresses to about as many bytes)


def _bytes(value: Any) -> bytes:
    from durably.store import value_bytes

    assert value is not None
    return value_bytes(value)


def test_a_compressed_result_is_smaller_and_loads_back(store: Any) -> None:
    calls = []

    @durably.task(compress=True)
    def text(n: int) -> bytes:
        calls.append(n)
        return TEXT * n

    assert text(1) == TEXT
    assert text(1) == TEXT and calls == [1]
    data = _bytes(store.cache_get(text.cache_key(1)))
    assert data.startswith(ZSTD) and len(data) < len(TEXT) // 20
    assert zstandard.ZstdDecompressor().decompress(data[4:]) == pickle.dumps(TEXT, protocol=5)


def test_a_level_is_a_zstandard_level(disk_store: durably.DiskStore) -> None:
    @durably.task(compress=1)
    def fast(n: int) -> bytes:
        return TEXT * n

    @durably.task(compress=19)
    def small(n: int) -> bytes:
        return TEXT * n

    assert fast(1) == small(1) == TEXT
    fast_size = len(_bytes(disk_store.cache_get(fast.cache_key(1))))
    small_size = len(_bytes(disk_store.cache_get(small.cache_key(1))))
    assert small_size < fast_size


def test_steps_of_a_run_replay_compressed(store: Any) -> None:
    calls = []
    fail = [True]

    @durably.task(compress=True, cache=False)
    def text(n: int) -> bytes:
        calls.append(n)
        return TEXT * n

    @durably.entrypoint
    def job(n: int) -> int:
        out = len(text(n))
        if fail[0]:
            raise RuntimeError("crash after the step")
        return out

    with pytest.raises(RuntimeError):
        job(2)
    fail[0] = False
    assert job(2) == 2 * len(TEXT) and calls == [2]


def test_a_large_value_is_compressed_as_a_stream(
        disk_store: durably.DiskStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_serde, "SPILL_BYTES", 100_000)  # TEXT * 3 is spilled to a file
    calls = []

    @durably.task(compress=True)
    def text(n: int) -> bytes:
        calls.append(n)
        return TEXT * n

    assert text(3) == TEXT * 3
    assert text(3) == TEXT * 3 and calls == [3]
    data = _bytes(disk_store.cache_get(text.cache_key(3)))
    assert data.startswith(ZSTD) and len(data) < len(TEXT)
    monkeypatch.setattr(_serde, "SPILL_BYTES", 10_000)  # the compressed value too

    @durably.task(compress=True)
    def noisy(n: int) -> bytes:
        calls.append(-n)
        return TEXT * n + NOISE

    assert noisy(3) == TEXT * 3 + NOISE
    value = disk_store.cache_get(noisy.cache_key(3))
    assert isinstance(value, _serde.Spilled) and value.size < len(TEXT)
    assert noisy(3) == TEXT * 3 + NOISE and calls == [3, -3]


def test_entries_of_either_kind_load_for_either_definition(store: Any) -> None:
    calls = []

    def define(compress: bool) -> Any:
        @durably.task(name="shared", version="1", compress=compress)
        def text(n: int) -> bytes:
            calls.append(n)
            return TEXT * n

        return text

    plain, packed = define(False), define(True)
    assert plain(1) == TEXT and packed(1) == TEXT  # written plain, read by a compressing task
    assert packed(2) == TEXT * 2 and plain(2) == TEXT * 2  # and the other way round
    assert calls == [1, 2]
    assert not _bytes(store.cache_get(plain.cache_key(1))).startswith(ZSTD)
    assert _bytes(store.cache_get(plain.cache_key(2))).startswith(ZSTD)


def test_a_value_of_this_format_loads_in_later_releases() -> None:
    # the format, pinned: b"DRZ1" and one zstandard frame of the pickle
    frame = zstandard.ZstdCompressor(level=3).compress(pickle.dumps({"a": [1, 2]}, protocol=5))
    assert _serde.loads(ZSTD + frame) == {"a": [1, 2]}


def test_a_store_compresses_the_tasks_that_do_not_say(tmp_path: Path) -> None:
    store = durably.DiskStore(tmp_path / "s", compress=True)
    durably.configure(store=store)

    @durably.task
    def text(n: int) -> bytes:
        return TEXT * n

    @durably.task(compress=False)
    def plain(n: int) -> bytes:
        return TEXT * n

    assert text(1) == plain(1) == TEXT
    assert _bytes(store.cache_get(text.cache_key(1))).startswith(ZSTD)
    assert not _bytes(store.cache_get(plain.cache_key(1))).startswith(ZSTD)
    # a worker reopens the store with its option
    again = pickle.loads(pickle.dumps(store))
    assert again.compress_level == 3
    assert durably.DiskStore(tmp_path / "s", compress=7).compress_level == 7
    assert durably.open_store(f"{store.url}?compress=9").compress_level == 9
    assert durably.open_store(f"{store.url}?compress=true").compress_level == 3
    assert durably.open_store(f"{store.url}?compress=false").compress_level is None
    assert durably.open_store(f"{store.url}?compress=1").compress_level == 1
    assert durably.open_store(f"{store.url}?compress=0").compress_level is None


def test_bad_levels_are_refused_with_the_fix(tmp_path: Path) -> None:
    for bad in (0, 23, -1, 2.5, "high"):
        with pytest.raises(DefinitionError, match=r"compress=True"):
            durably.task(compress=bad)(lambda x: x)  # type: ignore[arg-type]
    with pytest.raises(DefinitionError, match=r"DiskStore\(compress=\.\.\.\) takes True"):
        durably.DiskStore(tmp_path, compress=99)


def test_without_zstandard_the_error_names_the_pip_command(
        disk_store: durably.DiskStore, monkeypatch: pytest.MonkeyPatch) -> None:
    @durably.task(compress=True, name="t", version="1")
    def text(n: int) -> bytes:
        return TEXT * n

    text(1)
    monkeypatch.setitem(sys.modules, "zstandard", None)  # (import zstandard: ImportError)
    with pytest.raises(DefinitionError, match=r"pip install 'durably\[compress\]'"):
        durably.task(compress=True)(lambda x: x)
    with pytest.raises(DefinitionError, match=r"pip install 'durably\[compress\]'"):
        durably.DiskStore(disk_store.path, compress=True)
    # a compressed value met without it: the entry cannot be loaded here, so the task
    # executes again (with a warning that says why and how to fix it); the entry is kept
    with pytest.raises(ImportError, match=r"pip install 'durably\[compress\]'"):
        _serde.loads(_bytes(disk_store.cache_get(text.cache_key(1))))

    @durably.task(name="t", version="1")  # (the same task, defined without compress=)
    def again(n: int) -> bytes:
        return TEXT * n

    with pytest.warns(UserWarning, match=r"cannot be loaded in this process.*pip install"):
        assert again(1) == TEXT
    monkeypatch.delitem(sys.modules, "zstandard")
    assert _serde.loads(_bytes(disk_store.cache_get(text.cache_key(1)))) == TEXT


def test_a_postgres_store_compresses_the_tasks_that_do_not_say() -> None:
    from .postgres_server import drop_schemas, fresh_schema, server_url, with_schema

    store = durably.open_store(with_schema(server_url(), fresh_schema()),
                               allow_unsigned=True, compress=5)
    try:
        durably.configure(store=store)

        @durably.task
        def text(n: int) -> bytes:
            return TEXT * n

        assert text(2) == TEXT * 2 and text(2) == TEXT * 2
        assert _bytes(store.cache_get(text.cache_key(2))).startswith(ZSTD)
        again = pickle.loads(pickle.dumps(store))  # (as a worker reopens it)
        assert again.compress_level == 5
        again.close()
    finally:
        durably.configure()
        store.close()
        drop_schemas(server_url(), [store.schema])


def test_a_signed_store_signs_the_compressed_bytes(tmp_path: Path) -> None:
    store = durably.DiskStore(tmp_path / "s", key=b"k" * 32, compress=True)
    durably.configure(store=store)
    calls = []

    @durably.task
    def text(n: int) -> bytes:
        calls.append(n)
        return TEXT * n

    assert text(1) == TEXT and text(1) == TEXT and calls == [1]
    assert _bytes(store.cache_get(text.cache_key(1))).startswith(ZSTD)


def test_a_hit_on_a_compressible_value_holds_it_once(tmp_path: Path) -> None:
    """A compressed entry is unpickled as it is decompressed: a hit on a very compressible
    array never holds its decompressed pickle beside the array (it held both: twice the
    array)."""
    import tracemalloc

    np = pytest.importorskip("numpy")
    store = durably.DiskStore(tmp_path / "cz")

    @durably.task(compress=True)
    def runs_of_ints() -> Any:
        return np.repeat(np.arange(5_000), 1_000)  # 40 MB, a few hundred kB compressed

    first = runs_of_ints.__wrapped__()
    durably.configure(store=store)
    try:
        runs_of_ints()
        tracemalloc.start()
        try:
            again = runs_of_ints()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    finally:
        durably.configure()
    assert (again == first).all()
    assert peak < 1.5 * first.nbytes, f"a hit on {first.nbytes:,} bytes peaked at {peak:,}"
