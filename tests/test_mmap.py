"""``@task(mmap=True)``: numpy arrays in a task's result are stored as raw ``.npy`` images
and returned as read-only memory maps (issue #38, point 3); a hit checks the file without
reading the arrays, and a truncated or damaged file is never served."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import durably
from durably._keys import layouts
from durably._store.disk import blobs
from durably.exceptions import DefinitionError

N = 300_000  # 2.4 MB of float64 per array

KEY = b"k" * 32


@dataclasses.dataclass
class Fit:
    weights: Any
    name: str


def _result(n: int) -> dict[str, Any]:
    base = np.arange(n, dtype=np.float64)
    return {
        "c": base,
        "f": np.asfortranarray(base[: n // 4 * 4].reshape(4, -1)),
        "strided": base[::3],  # in neither order: stored as a C copy
        "pair": (np.ones((3, 5), dtype=np.int32), [np.array(7.5)]),
        "record": np.array([(1, 2.0)], dtype=[("a", "<i4"), ("b", "<f8")]),
        "when": np.array(["2024-01-01"], dtype="datetime64[D]"),
        "empty": np.empty((0, 3)),
        "objects": np.array([1, "a"], dtype=object),  # Python objects: pickled as before
        "fit": Fit(base[:10] * 2, "w"),
        "n": n,
    }


def _arrays(value: Any) -> list[Any]:
    if isinstance(value, np.ndarray):
        return [value]
    if isinstance(value, dict):
        return [a for v in value.values() for a in _arrays(v)]
    if isinstance(value, (list, tuple)):
        return [a for v in value for a in _arrays(v)]
    if isinstance(value, Fit):
        return _arrays(value.weights)
    return []


def _check(got: dict[str, Any], want: dict[str, Any], mapped: bool) -> None:
    assert got.keys() == want.keys() and got["n"] == want["n"]
    pairs = list(zip(_arrays(got), _arrays(want), strict=True))
    for a, b in pairs:
        assert a.dtype == b.dtype and a.shape == b.shape
        assert np.array_equal(a, b) if a.dtype != object else list(a) == list(b)
    for name in ("c", "f", "strided", "record", "when"):
        assert isinstance(got[name], np.memmap) is mapped, name
        assert not got[name].flags.writeable, name
    assert isinstance(got["fit"].weights, np.memmap) is mapped
    assert isinstance(got["pair"][0], np.memmap) is mapped
    assert got["f"].flags.f_contiguous and got["fit"].name == "w"
    assert not got["empty"].flags.writeable and got["empty"].shape == (0, 3)
    assert not isinstance(got["objects"], np.memmap)
    with pytest.raises(ValueError, match="read-only"):
        got["c"][0] = 1.0


def test_arrays_in_a_result_come_back_as_read_only_memory_maps(
        disk_store: durably.DiskStore) -> None:
    calls = []

    @durably.task(mmap=True)
    def make(n: int) -> dict[str, Any]:
        calls.append(n)
        return _result(n)

    first = make(N)  # the call that executes returns the maps too (as joblib does)
    _check(first, _result(N), mapped=True)
    hit = make(N)
    _check(hit, _result(N), mapped=True)
    assert calls == [N]
    # a plain array as the whole result, and an array of a result given back to a task
    @durably.task(mmap=True)
    def double(a: Any) -> Any:
        return a * 2

    again = double(hit["c"])
    assert isinstance(again, np.memmap) and np.array_equal(again, np.arange(N) * 2.0)
    assert isinstance(double(hit["c"]), np.memmap)


def test_a_hit_does_not_read_the_arrays(disk_store: durably.DiskStore,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    @durably.task(mmap=True)
    def make(n: int) -> Any:
        return np.full(n, 3.0)

    make(N)

    def no_scan(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a hit on a mapped value read its whole file")

    monkeypatch.setattr(blobs, "scan", no_scan)
    hit = make(N)
    assert isinstance(hit, np.memmap) and float(hit[-1]) == 3.0


def _value_file(store: durably.DiskStore) -> Path:
    [file] = sorted((store.path / "cache").glob("*/*/*.val"))
    return file


@pytest.mark.parametrize("damage", ["truncate", "extend", "header", "description"])
def test_a_truncated_or_damaged_file_is_a_miss(disk_store: durably.DiskStore,
                                               damage: str, caplog: Any) -> None:
    calls = []

    @durably.task(mmap=True)
    def make(n: int) -> Any:
        calls.append(n)
        return {"a": np.arange(n, dtype=np.float64), "b": np.ones(10)}

    make(N)
    file = _value_file(disk_store)
    size = file.stat().st_size
    raw = file.read_bytes()
    if damage == "truncate":
        with open(file, "r+b") as f:
            f.truncate(size - 1000)  # (the last array's end is gone)
    elif damage == "extend":
        with open(file, "ab") as f:
            f.write(b"\0" * 64)
    else:
        # the second array's .npy magic, or a byte of the pickle in the description
        at = raw.index(b"\x93NUMPY", raw.index(b"\x93NUMPY") + 1) if damage == "header" \
            else raw.index(b"\x80\x05", 64)
        with open(file, "r+b") as f:
            f.seek(at + 2)
            f.write(bytes([raw[at + 2] ^ 0xFF]))
    again = make(N)
    assert "is damaged" in caplog.text
    assert calls == [N, N]
    assert np.array_equal(again["a"], np.arange(N, dtype=np.float64))
    assert len(list((disk_store.path / "damaged").iterdir())) == 1


def test_a_signed_store_checks_every_byte_of_a_hit(tmp_path: Path, caplog: Any) -> None:
    store = durably.DiskStore(tmp_path / "s", key=KEY)
    durably.configure(store=store)
    calls = []

    @durably.task(mmap=True)
    def make(n: int) -> Any:
        calls.append(n)
        return np.arange(n, dtype=np.float64)

    make(N)
    assert isinstance(make(N), np.memmap) and calls == [N]
    file = _value_file(store)
    with open(file, "r+b") as f:  # a byte of the array's data, not of its header
        f.seek(file.stat().st_size - 8)
        f.write(b"\x01")
    again = make(N)
    assert "fails its checksum" in caplog.text
    assert calls == [N, N] and float(again[-1]) == N - 1


def test_steps_of_a_run_replay_as_memory_maps(disk_store: durably.DiskStore) -> None:
    calls = []
    fail = [True]

    @durably.task(mmap=True, cache=False)
    def make(n: int) -> Any:
        calls.append(n)
        return np.arange(n, dtype=np.float64)

    @durably.entrypoint
    def job(n: int) -> float:
        a = make(n)
        assert isinstance(a, np.memmap)
        if fail[0]:
            raise RuntimeError("crash after the step")
        return float(a.sum())

    with pytest.raises(RuntimeError):
        job(N)
    fail[0] = False
    assert job(N) == float(np.arange(N).sum())  # replayed from the journal: not executed
    assert calls == [N]


def test_a_truncated_journal_file_is_never_served(disk_store: durably.DiskStore) -> None:
    fail = [True]

    @durably.task(mmap=True, cache=False)
    def make(n: int) -> Any:
        return np.arange(n, dtype=np.float64)

    @durably.entrypoint
    def job(n: int) -> float:
        a = make(n)
        if fail[0]:
            raise RuntimeError("crash after the step")
        return float(a.sum())

    with pytest.raises(RuntimeError):
        job(N)
    [blob] = list((disk_store.path / "blobs").iterdir())
    with open(blob, "r+b") as f:
        f.truncate(blob.stat().st_size - 4096)
    fail[0] = False
    with pytest.raises(durably.CorruptJournalError, match="truncated"):
        job(N)


def test_every_store_gives_memory_maps_or_read_only_arrays_in_memory(
        store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A DiskStore keeps values in files: memory maps. The others hand a value of this size
    back as bytes (memory, minimal; PostgreSQL below 64 MiB or without a blob store):
    read-only arrays over them, with one warning a process."""
    files = isinstance(store, durably.DiskStore)
    monkeypatch.setattr(layouts, "_warned_unmapped", [False])
    calls = []

    @durably.task(mmap=True)
    def make(n: int) -> dict[str, Any]:
        calls.append(n)
        return _result(n)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = make(N)
        hit = make(N)
        again = make(N)
    said = [w for w in caught if "not memory maps" in str(w.message)]
    assert len(said) == (0 if files else 1), [str(w.message) for w in caught]
    assert len(caught) == len(said)
    # the call that executes maps the file it wrote when the store keeps large values in
    # files of its own (PostgreSQL, whose hits then read this size back as bytes)
    _check(first, _result(N), mapped="large_values" in store.capabilities)
    _check(hit, _result(N), mapped=files)
    _check(again, _result(N), mapped=files)
    assert calls == [N]


def test_entries_of_either_kind_load_for_either_definition(
        disk_store: durably.DiskStore) -> None:
    calls = []

    def define(mmap: bool) -> Any:
        @durably.task(name="shared", version="1", mmap=mmap)
        def make(n: int) -> Any:
            calls.append(n)
            return np.arange(n, dtype=np.float64)

        return make

    plain, mapped = define(False), define(True)
    assert not isinstance(plain(5), np.memmap)
    assert not isinstance(mapped(5), np.memmap)  # a pickled entry: served as it was stored
    assert isinstance(mapped(6), np.memmap)
    assert isinstance(plain(6), np.memmap)  # the value says how it was stored
    assert calls == [5, 6]


def test_bad_options_are_refused_with_the_fix() -> None:
    with pytest.raises(DefinitionError, match=r"mmap=True and compress=True.*choose one"):
        durably.task(mmap=True, compress=True)(lambda x: x)
    with pytest.raises(DefinitionError, match=r"mmap=\.\.\.\) of .* must be True or False"):
        durably.task(mmap="r")(lambda x: x)  # type: ignore[arg-type]
