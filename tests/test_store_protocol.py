"""What the ``Store`` base class does for a backend, however the backend is written: a
backend's own read-ahead serves checked values, a backend built from parts (a journal class,
a values class) gets integrity and large values like one written as a single class, and a
store pickles as its URL."""

from __future__ import annotations

import pickle
import threading
from pathlib import Path

import pytest

import durably
from durably.exceptions import DefinitionError
from durably.store import ReadAhead, ReplayRange, Store
from durably.testing import MemoryStore

from .minimal_store import MinimalStore

EXECUTED: list[int] = []


@durably.task
def double(x: int) -> int:
    EXECUTED.append(x)
    return 2 * x


@durably.task(cache=False)
def side_effect(x: int) -> int:
    EXECUTED.append(-x)
    return x + 1


def _pipeline(n: int) -> int:
    return sum(double(i) + side_effect(i) for i in range(n))


def pipeline(store: Store) -> durably.Entrypoint[[int], int]:
    return durably.entrypoint(store=store, name="pipeline")(_pipeline)


class _RawAhead(ReadAhead):
    """A backend's read-ahead: the stored bytes of every finished step, served as they are."""

    __slots__ = ("ahead", "last", "thread")

    def __init__(self, values: dict[str, bytes | None]) -> None:
        self.ahead = values
        self.last: str | None = None
        self.thread = threading.get_ident()

    due = False

    @property
    def buffered(self) -> bool:
        return False

    def replay(self, step_id: str, position: int, started: float) -> bytes | None:
        self.last = step_id
        return self.ahead.get(step_id)

    def find(self, step_id: str) -> bytes | None:
        return self.ahead.get(step_id)

    def retract(self) -> None:
        self.last = None

    def take_ranges(self) -> list[ReplayRange]:
        return []


class ReadingAhead(MinimalStore):
    """A store without "integrity" that reads ahead: its read-ahead serves what it stored."""

    def __init__(self) -> None:
        super().__init__()
        self.read_aheads = 0

    def read_ahead(self, run_id: str) -> ReadAhead | None:
        self.read_aheads += 1
        with self._lock:
            return _RawAhead({rec.step_id: data for rec, data in self._steps.get(run_id, ())})


def _failed_after_its_steps(store: MinimalStore, run_id: str) -> None:
    """The run as if its attempt had died after journaling every step: resumed next."""
    with store._lock:
        store._runs[run_id].status = "failed"


def test_a_backend_s_read_ahead_serves_checked_values() -> None:
    store = ReadingAhead()
    job = pipeline(store)
    EXECUTED.clear()
    assert job.run(3, run_id="r").result == 12 and len(EXECUTED) == 6
    _failed_after_its_steps(store, "r")
    EXECUTED.clear()
    before = store.read_aheads
    assert job.run(3, run_id="r").result == 12
    assert store.read_aheads > before, "the runtime did not ask the backend to read ahead"
    assert EXECUTED == []  # every step replayed, its value read ahead and checked


def test_a_damaged_value_read_ahead_is_not_served() -> None:
    store = ReadingAhead()
    job = pipeline(store)
    job.run(2, run_id="r")
    with store._lock:  # flip a byte of every journaled value
        store._steps["r"] = [(rec, None if data is None else data[:-1] + bytes([data[-1] ^ 1]))
                             for rec, data in store._steps["r"]]
    _failed_after_its_steps(store, "r")
    EXECUTED.clear()
    with pytest.raises(durably.CorruptJournalError, match="side_effect"):
        job.run(2, run_id="r")  # a cache=False step is never executed again by itself
    assert all(x >= 0 for x in EXECUTED)  # (a cacheable step may be computed again)


#: MinimalStore's own methods, as written (not as the base class wrapped them for it)
_METHODS = {name: value.__wrapped__ if getattr(value, "_durably_layer", False) else value
            for name, value in vars(MinimalStore).items()
            if not name.startswith("__") or name == "__init__"}


class Parts:
    """A store's methods in a class of its own (not a Store): the part a backend's author
    writes once and builds stores from."""


for _name, _value in _METHODS.items():
    setattr(Parts, _name, _value)


class FromParts(Parts, Store):
    """A store whose methods all come from its parts."""


def test_a_store_built_from_parts_gets_integrity_and_large_values(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from durably._keys import serde

    store = FromParts()
    assert getattr(FromParts.cache_get, "_durably_layer", False)  # (wrapped for it)
    key = "k" * 32
    store.cache_put_many([(key, b"value", durably.store.KeyRecord(
        "m:t", key, "c", {}, {}, 1.0))])
    assert store._values[key] != b"value"  # sealed above the backend
    assert store.cache_get(key) == b"value"
    store._values[key] = store._values[key][:-1] + b"X"
    assert store.cache_get(key) is None  # damaged: a miss
    monkeypatch.setattr(serde, "SPILL_BYTES", 64)
    big = serde.spill_bytes(b"x" * 1000, "a test value")
    store.cache_put_many([(key, big, durably.store.KeyRecord("m:t", key, "c", {}, {}, 1.0))])
    assert store.cache_get(key) == b"x" * 1000  # its bytes, not the description of a file


def test_a_store_pickles_as_its_url(tmp_path: Path) -> None:
    disk = durably.DiskStore(tmp_path / "s")
    again = pickle.loads(pickle.dumps(disk))
    assert isinstance(again, durably.DiskStore) and again.path == disk.path
    named = durably.open_store("memory://pickled")
    assert pickle.loads(pickle.dumps(named)) is named
    with pytest.raises(TypeError, match="memory://NAME"):
        pickle.dumps(MemoryStore())  # (no URL: lives in this process only)


@pytest.mark.parametrize("url", ["memory:/x", "memory:x", "MEMORY:/x"])
def test_a_url_without_its_slashes_is_refused(url: str) -> None:
    with pytest.raises(DefinitionError, match="memory://x"):
        durably.open_store(url)


def test_a_file_url_in_its_short_form_is_a_disk_store(tmp_path: Path) -> None:
    store = durably.open_store(f"file:{tmp_path}/s")
    assert isinstance(store, durably.DiskStore) and store.path == tmp_path / "s"
    assert isinstance(durably.open_store("C:/data"), durably.DiskStore)  # (a Windows path)


def test_a_disk_store_names_the_key_it_signs_with(tmp_path: Path) -> None:
    own = durably.DiskStore(tmp_path / "own", key=b"k" * 32)
    assert own.signed and own.signing_key is not None
    plain = durably.DiskStore(tmp_path / "plain")
    assert (plain.signing_key is None) == (not plain.signed)


class OldProtocolStore:
    """A store as durably 0.1's durably.Store protocol described it: duck-typed methods."""

    def find_run(self, run_id: str) -> None: ...
    def put_run(self, record: object) -> None: ...
    def find_step(self, run_id: str, step_id: str) -> None: ...
    def append_steps(self, steps: object) -> None: ...
    def cache_get(self, key: str) -> None: ...
    def cache_put_many(self, items: object) -> None: ...


def test_a_store_of_the_old_protocol_is_told_how_to_port() -> None:
    with pytest.raises(DefinitionError, match=r"durably 0\.1.*lacks .*acquire_run.*"
                                              r"StoreConformance"):
        durably.entrypoint(store=OldProtocolStore())  # type: ignore[call-overload]
    with pytest.raises(DefinitionError, match=r"durably 0\.1"):
        durably.configure(store=OldProtocolStore())  # type: ignore[arg-type]
    with pytest.raises(DefinitionError, match="needs a durably store"):
        durably.configure(store=object())  # type: ignore[arg-type]
    from durably.testing import EventRecord, KeyRecord, RunRecord, StepRecord  # (as in 0.1)

    assert StepRecord is durably.store.StepRecord and RunRecord is durably.store.RunRecord
    assert (EventRecord, KeyRecord) == (durably.store.EventRecord, durably.store.KeyRecord)
