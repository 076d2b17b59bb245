"""The conformance suite of the store protocol: :class:`StoreConformance`.

A backend author subclasses it in a test module, says how to make a store, and pytest runs
every behaviour the runtime relies on against that store::

    from pathlib import Path

    from durably.store import Store
    from durably.testing import StoreConformance

    class TestMyStore(StoreConformance):
        def make_store(self, path: Path) -> Store:
            return MyStore(path)

This module imports pytest; :mod:`durably.testing` imports it only when
``StoreConformance`` is asked for, so ``durably.testing`` (and its ``MemoryStore``) stays
importable without pytest.

The tests are split by part of the protocol into mixins, combined here:
:mod:`durably.testing._conformance_journal` (records, leases, fencing, transactions) and
:mod:`durably.testing._conformance_values` (cache entries, values, damage, signing,
collection); the harness and the fixtures they share are on :class:`StoreConformance`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from durably._store import lease as _lease
from durably.store import Owner, Store
from durably.testing._conformance_journal import JournalConformance
from durably.testing._conformance_values import _SIZES, ValuesConformance, _size_id

__all__ = ["StoreConformance"]


def _open_store(url: str) -> Store:
    """``durably.open_store(url)``."""
    import durably

    opener: Callable[[str], Store] | None = getattr(durably, "open_store", None)
    if opener is None:  # (not exported by this version of durably: its implementation)
        from durably._store.urls import open_store

        opener = open_store
    return opener(url)


# (pytest collects the tests of base classes in reverse MRO order: with the values' mixin
# first here, the journal's tests run first and the values' (the slowest) last, as before)
class StoreConformance(ValuesConformance, JournalConformance):
    """The behaviour every :class:`durably.store.Store` has, as a pytest base class.

    Subclass it in a test module (a name starting with ``Test``) and implement
    :meth:`make_store`; pytest then runs each ``test_...`` method against your store: the
    records of runs, steps, events and keys; leases (acquire, renew, release, takeover of a
    dead owner, an acquire raced by several contenders); fencing (the writes of a holder
    whose run was taken over are refused); transactions and snapshots; values from 0 bytes
    to ``large_value_bytes`` (large ones streamed as :class:`~durably.store.LargeValue`);
    damaged and foreign (signed with another key) values read as misses; collection of
    unreferenced values (capability ``"maintenance"``).

    The harness, overridden as needed:

    - :meth:`make_store` (required): a new, empty store kept under a path.
    - :meth:`reopen`: another handle on the same data, as another process would open it.
    - :meth:`damage_value`: flip bytes of a stored cache value (default: those tests skip).
    - :meth:`make_store_with_key`: a store whose values are signed with a key (default: the
      signing test skips).
    - :meth:`set_clock`: move the clock leases are timed by (default: the process's).
    - :meth:`open_in_process` (a staticmethod): how a contender process opens the store
      from its URL.
    - :attr:`processes`: whether the acquire race is run by processes (each opening
      ``store.url``) rather than threads.
    - :attr:`large_value_bytes`: the largest value tried.

    The tests of values of 100 MiB or more carry the ``slow`` marker when the project
    registers one (then ``-m "not slow"`` leaves them out).
    """

    #: True: the store is shared by processes, and the acquire race is run by real
    #: processes, each opening the store from ``store.url`` (:meth:`open_in_process`);
    #: False: by threads sharing the store object.
    processes: ClassVar[bool] = False
    #: the largest value stored and read back (bytes; a LargeValue)
    large_value_bytes: ClassVar[int] = 100 * 2**20 + 1
    #: how many contenders race for one lease
    contenders: ClassVar[int] = 8

    # -- the harness -----------------------------------------------------------------------
    def make_store(self, path: Path) -> Store:
        """A new, empty store keeping its data under ``path`` (a directory that does not
        exist yet; a store in memory may ignore it)."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement make_store(self, path) -> Store")

    def reopen(self, store: Store) -> Store:
        """Another handle on the same data, as another process would open it. Default:
        ``durably.open_store(store.url)``, or the same object for a store without a URL."""
        url = store.url
        return _open_store(url) if url else store

    def damage_value(self, store: Store, key: str) -> None:
        """Change bytes of the value stored under cache key ``key`` where the store keeps
        it (as a bit flip on disk would). Default: the tests that need it skip."""
        pytest.skip(f"{type(self).__name__} does not implement damage_value(store, key): "
                    "implement it (flip a byte of the stored value) to check that a damaged "
                    "cache value reads as a miss")

    def make_store_with_key(self, path: Path, key: bytes) -> Store:
        """A store on the data kept under ``path`` (the same data for the same path), whose
        values are signed with ``key`` and checked before they are served. A backend without
        the capability ``"integrity"`` is signed above it with the process's key: set it
        with ``durably.configure(key=key)`` and return the store kept for ``path``.
        Default: the signing test skips (a store that does not sign)."""
        pytest.skip(f"{type(self).__name__} does not implement make_store_with_key(path, "
                    "key): a store that signs its values implements it to check that a "
                    "value signed with another key is never served")

    def set_clock(self, store: Store, when: float, monkeypatch: pytest.MonkeyPatch) -> None:
        """Make the clock the store's leases are timed by read ``when`` (seconds since the
        epoch) for the rest of the test: the tests of lease expiry move it forward. Default:
        the process's clock (``time.time``). A store that times leases by a server's clock
        moves that one too (and calls this default)."""
        monkeypatch.setattr(time, "time", lambda: when)

    @staticmethod
    def open_in_process(url: str) -> Store:
        """How a contender process of the acquire race opens the store from its URL (a
        function importable by name: it is pickled to the process). Default:
        ``durably.open_store(url)``."""
        return _open_store(url)

    # -- fixtures --------------------------------------------------------------------------
    @pytest.fixture
    def store(self, tmp_path: Path) -> Iterator[Store]:
        """A new, empty store, closed after the test."""
        made = self.make_store(tmp_path / "store")
        yield made
        made.close()

    @pytest.fixture
    def other(self, store: Store) -> Iterator[Store]:
        """Another handle on the store's data (:meth:`reopen`), closed after the test."""
        handle = self.reopen(store)
        yield handle
        if handle is not store:
            handle.close()

    @pytest.fixture
    def owners(self) -> Iterator[Callable[[], Owner]]:
        """Makes live owners of this process (each with a fresh token, held until the test
        ends)."""
        made: list[Owner] = []

        def make() -> Owner:
            owner = _lease.me()
            _lease.hold(owner)
            made.append(owner)
            return owner

        yield make
        for owner in made:
            _lease.let_go(owner)

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """The sizes of values tried: :data:`_SIZES` and ``large_value_bytes`` (marked
        ``slow`` when the project registers that marker)."""
        if "value_size" not in metafunc.fixturenames:
            return
        cls = metafunc.cls if metafunc.cls is not None else type(self)
        sizes = sorted({*_SIZES, cls.large_value_bytes})
        slow = any(line.partition(":")[0].strip() == "slow"
                   for line in metafunc.config.getini("markers"))
        metafunc.parametrize("value_size", [
            pytest.param(n, id=_size_id(n),
                         marks=[pytest.mark.slow] if slow and n >= 100 << 20 else [])
            for n in sizes])

    # -- the protocol ----------------------------------------------------------------------
    def test_the_store_implements_the_protocol(self, store: Store) -> None:
        """A store is a :class:`durably.store.Store` and declares its capabilities as a
        frozenset of names."""
        assert isinstance(store, Store)
        assert isinstance(store.capabilities, frozenset)
        assert all(isinstance(name, str) for name in store.capabilities)
