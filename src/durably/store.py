"""The store protocol: what durably needs from a place that keeps caches and journals.

A store has three parts, each an abstract base class here, and :class:`Store` is all three:

- :class:`Journal` — runs, their steps and events, in **transactions** (:meth:`~Journal.batch`)
  and read **snapshots**; run **leases** (acquire, renew, release, and takeover of an owner
  that died) with **fencing**: every write made for an attempt whose lease another process
  took over is refused, atomically, by the statement that would have made it
  (:meth:`~Journal.put_run_if_current`, :meth:`~Journal.append_steps_if_current`).
- :class:`Values` — the cache: values by cache key, written in batches; a large value arrives
  as a :class:`LargeValue` (a file) that a backend which declares ``"large_values"`` streams
  to where it keeps values, and which is read into memory for every other backend.
  Checksums and signatures are applied above the backends (see ``"integrity"`` below).
- :class:`KeyRecords` — what each cache key was made of (task, code, inputs), to explain a
  miss and to clear a task's entries.

The runtime, the CLI and the workers call stores only through these methods. A backend
implements the abstract methods; the others have defaults built on them, which a backend
overrides when it can do better (:meth:`~Journal.read_ahead`, :meth:`~Journal.append_replays`).
What a backend can do beyond the protocol is declared in :attr:`Store.capabilities`, never
found by looking for attributes:

- ``"integrity"``: it checks and signs the values it keeps itself. Without it, the base class
  does, for it: every value is sealed on its way in (a checksum, and with a signing key a
  signature bound to the value's slot, see :attr:`Store.signing_key`) and checked on its way
  out — a damaged cache value is a miss (and removed, with a warning), a damaged journal
  value an error naming its run, a value signed otherwise is never served.
- ``"large_values"``: its value-taking methods accept :class:`LargeValue` handles and keep
  their content (never their description); without it, the base class reads them into
  bytes before the backend sees them.
- ``"maintenance"``: it implements :meth:`Store.cache_stats`, :meth:`Store.prune`,
  :meth:`Store.clear`, :meth:`Store.collect_values` and :meth:`Store.repair_run` (the CLI's
  ``cache`` commands).

Every backend passes one conformance suite, :class:`durably.testing.StoreConformance`, and
the whole behaviour suite runs on each backend durably ships.

Example:
    >>> import durably
    >>> from durably.store import Store
    >>> from durably.testing import MemoryStore
    >>> isinstance(MemoryStore(), Store), isinstance(durably.DiskStore("unused"), Store)
    (True, True)
    >>> sorted(durably.DiskStore.capabilities)
    ['integrity', 'large_values', 'maintenance']
"""

from __future__ import annotations

import abc
import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar, cast

from durably._keys.serde import Spilled, Unreadable, spill_bytes, spill_stream
from durably._store.integrity import (
    DAMAGED,
    LARGE_HEADER,
    OTHER_KEY,
    UNSIGNED,
    SigningKey,
    check_large_header,
    large_header,
    open_seal,
    process_key,
    read_large_header,
    scan,
    seal,
)
from durably._store.lease import Owner
from durably._store.records import (
    FINISHED_STEP,
    EventRecord,
    KeyRecord,
    Replay,
    ReplayRange,
    RunRecord,
    StepRecord,
)
from durably.exceptions import CorruptJournalError, DefinitionError, StoreError

__all__ = ["FINISHED_STEP", "EventRecord", "Journal", "KeyRecord", "KeyRecords", "LargeValue",
           "Owner", "ReadAhead", "Replay", "ReplayRange", "RunRecord", "StepRecord", "Store",
           "Values"]

log = logging.getLogger("durably")

#: A value too large to hold twice in memory (larger than 64 MiB pickled): kept in a file.
#: It is a ``bytes`` whose bytes are a short description, never the value: read the value with
#: :func:`value_bytes` (or stream ``open(v.path, "rb")`` from ``v.offset`` for ``v.size``
#: bytes). Only a backend that declares ``"large_values"`` receives one.
LargeValue = Spilled


def value_bytes(value: bytes) -> bytes:
    """The bytes of a value as a store receives it: a :class:`LargeValue` read from its file,
    any other value as it is.

    Raises:
        StoreError: a large value's file cannot be read.

    Example:
        >>> value_bytes(b"abc")
        b'abc'
    """
    if type(value) is bytes or not isinstance(value, Spilled):
        return value
    try:
        with value.open() as f:
            data = f.read(value.size)
    except OSError as exc:
        raise StoreError(f"the large value kept in {value.path} cannot be read ({exc}). Fix: "
                         "check that the file still exists and is readable.") from exc
    if len(data) != value.size:
        raise StoreError(f"the large value kept in {value.path} is cut short ({len(data)} of "
                         f"{value.size} bytes). Fix: check the disk it is on.")
    return data


class ReadAhead(abc.ABC):
    """The first finished steps of a run being resumed, read before its first step asks (see
    :meth:`Journal.read_ahead`). The runtime asks it for each replayed step's value in call
    order, from the thread that made it (:attr:`thread`), and journals the replays it
    recorded (:meth:`take_ranges`) with :meth:`Journal.append_replays`.

    Attributes:
        thread: The ``threading.get_ident()`` of the thread that made it: the only one that
            uses it.
        due: Whether it holds as many replays as should be journaled now (the runtime then
            takes them).
    """

    __slots__ = ()
    thread: int
    due: bool

    @property
    @abc.abstractmethod
    def buffered(self) -> bool:
        """Whether it holds replays not yet taken by :meth:`take_ranges`."""

    @abc.abstractmethod
    def replay(self, step_id: str, position: int, started: float) -> bytes | None:
        """The value of finished step ``step_id``, replayed at ``position``, or None when
        the run has no finished record of it (it executes). A step outside what was read
        ahead is looked up here (as :meth:`Journal.find_step` would): the runtime does not
        ask again."""

    @abc.abstractmethod
    def find(self, step_id: str) -> bytes | None:
        """The value of finished step ``step_id`` if it was read ahead, else None."""

    @abc.abstractmethod
    def retract(self) -> None:
        """Forget the last replay: it was not journaled."""

    @abc.abstractmethod
    def take_ranges(self) -> list[ReplayRange]:
        """The ranges of consecutive replays to journal (then forgotten)."""


class Journal(abc.ABC):
    """Runs, steps and events; transactions, snapshots, leases and fencing."""

    # -- transactions --------------------------------------------------------------------
    @abc.abstractmethod
    def batch(self) -> contextlib.AbstractContextManager[None]:
        """A transaction: the journal writes this thread makes inside the block commit
        together when it ends, or none of them when it raises; other writers wait. Reads
        inside it see the block's writes. Cache writes need not be part of it.

        Raises:
            StoreError: the journal cannot be written (nothing of the block is kept).
        """

    def snapshot(self) -> contextlib.AbstractContextManager[None]:
        """A read snapshot: the journal reads this thread makes inside the block see one
        state of the journal. Nothing is written inside it. Default: :meth:`batch`."""
        return self.batch()

    def abandon(self) -> None:  # noqa: B027 - a default that does nothing, on purpose
        """Roll back a transaction this thread left open (a KeyboardInterrupt landed as its
        block ended). Default: nothing (a store whose blocks always end)."""

    def stopping(self) -> contextlib.AbstractContextManager[None]:
        """A block in which this thread's statements wait a few seconds at most for another
        connection's lock, then raise StoreError: Ctrl-C's stop path (its end unjournaled,
        the run resumes as after a crash). Default: a block that changes nothing."""
        return contextlib.nullcontext()

    # -- runs ----------------------------------------------------------------------------
    @abc.abstractmethod
    def find_run(self, run_id: str) -> RunRecord | None:
        """The run's record, or None."""

    @abc.abstractmethod
    def find_latest_run(self, entrypoint: str, input_digest: str) -> RunRecord | None:
        """The most recently updated run of that entrypoint with those inputs, or None."""

    @abc.abstractmethod
    def list_runs(self, entrypoint: str | None = None) -> list[RunRecord]:
        """Runs, most recently updated first (ties in one order of the store's choice);
        ``entrypoint`` filters by identity or name. A record keeps every field it was put
        with, :attr:`~durably.store.RunRecord.thread` included."""

    def list_thread_runs(self, thread: str) -> list[RunRecord]:
        """The runs on a conversation thread (their records' ``thread``), most recently
        updated first. Default: :meth:`list_runs` filtered; a store that indexes runs by
        thread answers without reading every run."""
        return [rec for rec in self.list_runs() if rec.thread == thread]

    @abc.abstractmethod
    def put_run(self, record: RunRecord) -> None:
        """Insert or replace a run's record, durably."""

    @abc.abstractmethod
    def put_run_if_current(self, record: RunRecord, previous: int | None = None) -> bool:
        """:meth:`put_run`, only while the stored record of the run has ``record.attempt``
        (with ``previous``: that attempt instead), checked and written atomically. Returns
        False, and writes nothing, otherwise (a later attempt took the run over: **fencing**).
        """

    @abc.abstractmethod
    def delete_runs(self, run_ids: Iterable[str], *, dry_run: bool = False,
                    skip_executing: bool = False) -> list[str]:
        """Delete runs with their steps, events and lease; the cache is kept. Returns the ids
        deleted (with ``dry_run``: that would be). A run a live process executes is refused
        with :class:`~durably.exceptions.RunStateError`, or left out with
        ``skip_executing``."""

    # -- leases --------------------------------------------------------------------------
    @abc.abstractmethod
    def acquire_run(self, run_id: str, owner: Owner) -> Owner | None:
        """Take the run's lease for ``owner`` unless another live owner holds it: return
        that holder (and take nothing), else None. A lease whose owner died
        (:meth:`Owner.alive <durably._store.lease.Owner.alive>` is false) is taken over. Atomic
        across processes: of several acquiring at once, exactly one gets None."""

    @abc.abstractmethod
    def run_holder(self, run_id: str) -> Owner | None:
        """The live owner of the run's lease, else None."""

    @abc.abstractmethod
    def renew_run(self, run_id: str, owner: Owner) -> bool:
        """Refresh the heartbeat of the lease ``owner`` holds; False if it holds none (taken
        over, or removed)."""

    @abc.abstractmethod
    def release_run(self, run_id: str, owner: Owner) -> bool:
        """Give up the lease ``owner`` holds; False if it held none."""

    def check_run(self, run_id: str, owner: Owner) -> Owner | None:
        """The live holder of the run's lease other than ``owner``, else None, without taking
        the lease (an attempt that only replays writes its start and end in one
        transaction). Default: from :meth:`run_holder`."""
        holder = self.run_holder(run_id)
        return None if holder is None or holder.token == owner.token else holder

    def renew_run_apart(self, run_id: str, owner: Owner) -> bool:
        """:meth:`renew_run` from the heartbeat thread, which does nothing else. Default:
        :meth:`renew_run`."""
        return self.renew_run(run_id, owner)

    # -- steps ---------------------------------------------------------------------------
    @abc.abstractmethod
    def find_step(self, run_id: str, step_id: str) -> bytes | None:
        """The value of a finished (ran or cached) step of the run, or None."""

    @abc.abstractmethod
    def append_steps(self, steps: Sequence[tuple[StepRecord, bytes | None]]) -> None:
        """Append step records (with the values of finished ones), in one transaction."""

    @abc.abstractmethod
    def append_steps_if_current(self, steps: Sequence[tuple[StepRecord, bytes | None]]
                                ) -> bool:
        """:meth:`append_steps` of the steps whose run's stored record still has the step's
        attempt, checked and written atomically; False if any was refused (**fencing**)."""

    @abc.abstractmethod
    def list_steps(self, run_id: str, attempt: int | None = None) -> list[StepRecord]:
        """A run's step records in call order (attempt, then position); ``attempt`` selects
        one."""

    def page_steps(self, run_id: str, attempt: int, *, after: int = -1,
                   limit: int = 100) -> list[StepRecord]:
        """One page of an attempt's step records in call order: those at positions greater
        than ``after`` (``-1``: from the first), at most ``limit`` records (a call with
        several records, such as a try that failed and was retried, may be cut between two
        pages: the next page starts ``after`` the last whole call). For the dashboard, which
        opens a 100,000-step run without reading it whole. Default: from :meth:`list_steps`
        (the whole attempt read); a backend overrides it with a query that stops at
        ``limit``.

        Raises:
            ValueError: ``limit`` is less than 1.

        Example:
            >>> from durably.testing import MemoryStore
            >>> MemoryStore().page_steps("no-such-run", 1, after=9, limit=10)
            []
        """
        if limit < 1:
            raise ValueError(f"page_steps: limit must be at least 1, got {limit!r}")
        found = [s for s in self.list_steps(run_id, attempt) if s.position > after]
        return found[:limit]

    def count_steps(self, run_id: str, attempt: int) -> dict[str, dict[str, int]]:
        """An attempt's steps counted by task name and status: ``{task: {status: steps}}``,
        each step once, by its last record other than ``"started"`` (a try that failed and
        was retried into a result counts as ``"ran"``, as :meth:`durably.Run.counts` does);
        a step with only a ``"started"`` record is not counted. Default: from
        :meth:`list_steps`; a backend overrides it with an aggregate query.

        Example:
            >>> from durably.testing import MemoryStore
            >>> MemoryStore().count_steps("no-such-run", 1)
            {}
        """
        last: dict[str, StepRecord] = {}
        for s in self.list_steps(run_id, attempt):
            if s.status != "started":
                last[s.step_id] = s
        counts: dict[str, dict[str, int]] = {}
        for s in last.values():
            by_status = counts.setdefault(s.task, {})
            by_status[s.status] = by_status.get(s.status, 0) + 1
        return counts

    def step_outline(self, run_id: str) -> list[tuple[str, str, str, float]]:
        """``(step_id, task, status, ended)`` of each of the run's records whose status is
        ``ran``, ``cached`` or ``interrupted``, in call order (attempt, then position): what
        the run's history (:meth:`durably.Run.history`) is ordered and counted by, without
        the records' inputs and outputs, which a page of it reads for the checkpoints it
        shows only (:meth:`finished_steps`). Default: from :meth:`list_steps`; a backend
        overrides it with a query of these columns.

        Example:
            >>> from durably.testing import MemoryStore
            >>> MemoryStore().step_outline("no-such-run")
            []
        """
        return [(s.step_id, s.task, s.status, s.ended) for s in self.list_steps(run_id)
                if s.status in ("ran", "cached", "interrupted")]

    def finished_steps(self, run_id: str, step_ids: Iterable[str]) -> dict[str, StepRecord]:
        """The record that finished each of these steps of the run (its first ``ran`` or
        ``cached`` record, of any attempt: for a fork, the one copied from its source), for
        those that have one: what a replayed step's record, which carries no inputs,
        output or duration of its own, shows them from. Read for the steps named only (the
        dashboard's page of a step table), never the whole journal, by a backend that
        overrides it. Default: from :meth:`list_steps`.

        Example:
            >>> from durably.testing import MemoryStore
            >>> MemoryStore().finished_steps("no-such-run", ["a" * 32])
            {}
        """
        wanted = set(step_ids)
        found: dict[str, StepRecord] = {}
        if wanted:
            for rec in self.list_steps(run_id):
                if rec.step_id in wanted and rec.status in ("ran", "cached"):
                    found.setdefault(rec.step_id, rec)
        return found

    def parents_of(self, run_id: str, step_ids: Iterable[str]) -> dict[str, str | None]:
        """The parent of each of these steps of the run that has a record. Default: from
        :meth:`list_steps`."""
        wanted = set(step_ids)
        found: dict[str, str | None] = {}
        for rec in self.list_steps(run_id):
            if rec.step_id in wanted:
                found.setdefault(rec.step_id, rec.parent_id)
        return found

    def append_replays(self, run_id: str, attempt: int,
                       replays: Sequence[Replay | ReplayRange]) -> bool:
        """Journal steps of ``attempt`` replayed from the run's journal: each a
        :class:`Replay` tuple ``(position, started, ended, step_id, parent_id, cache_key,
        task)`` (a :class:`ReplayRange` only comes from this store's own
        :meth:`read_ahead`). :meth:`list_steps` returns them as records of status
        ``"replayed"``. Fenced like :meth:`append_steps_if_current`. Default: one record each.
        """
        each = cast("list[Replay]", [r for r in replays if type(r) is not ReplayRange])
        records: list[tuple[StepRecord, bytes | None]] = [
            (StepRecord(run_id, step, parent, task, "replayed", attempt, position, started,
                        ended, None, key), None)
            for position, started, ended, step, parent, key, task in each
        ]
        return self.append_steps_if_current(records)

    def read_ahead(self, run_id: str) -> ReadAhead | None:
        """Start reading the first finished steps of a run being resumed, for the replay
        that follows; None (the default): each replayed step asks :meth:`find_step`."""
        return None

    # -- events --------------------------------------------------------------------------
    @abc.abstractmethod
    def append_events(self, events: Sequence[EventRecord]) -> None:
        """Append events of runs, durably, in one transaction."""

    @abc.abstractmethod
    def list_events(self, run_id: str, kinds: Sequence[str] | None = None) -> list[EventRecord]:
        """A run's events in the order they were appended; ``kinds`` filters by kind."""


class Values(abc.ABC):
    """The cache: values by cache key."""

    @abc.abstractmethod
    def cache_get(self, key: str) -> bytes | None:
        """The value under a cache key, or None (a miss, or an entry found damaged)."""

    def cache_get_timed(self, key: str) -> tuple[bytes, float] | None:
        """The value under a cache key with the seconds the execution that produced it took
        (the :attr:`KeyRecord.duration` it was stored with, 0.0 when unknown), or None as
        :meth:`cache_get`. The runtime asks it for each hit inside a run (the step record of
        a hit keeps the time the cache saved, :attr:`StepRecord.saved`). Default: from
        :meth:`cache_get`, the duration 0.0; a backend that keeps key records overrides it
        to read the duration with the value, in the same read."""
        data = self.cache_get(key)
        return None if data is None else (data, 0.0)

    @abc.abstractmethod
    def cache_put_many(self, items: Sequence[tuple[str, bytes, KeyRecord | None]]) -> None:
        """Store several entries, each atomically, with what each key was made of (its
        :class:`KeyRecord`, whose ``duration`` :meth:`cache_get_timed` gives back)."""

    @abc.abstractmethod
    def cache_delete(self, keys: Iterable[str]) -> int:
        """Remove these entries; returns how many there were. Their key records stay (an
        explanation then says the entry was removed, not that there never was one)."""

    def cache_put(self, key: str, value: bytes, info: KeyRecord | None = None) -> None:
        """Store one entry (see :meth:`cache_put_many`)."""
        self.cache_put_many(((key, value, info),))

    def discard_cache(self, key: str, why: str, data: bytes | None = None) -> None:
        """Take out an entry that must not be served (its value does not load back): removed,
        with a warning naming the key and ``why``. A backend may keep a copy aside."""
        self.cache_delete((key,))
        log.warning("durably: cache entry %s is removed: %s", key, why)

    def seal_ahead(self, value: bytes, *context: str, reuse: bytes | None = None) -> bytes:
        """``value`` prepared for a journal write that follows (a large one written out now,
        outside the transaction). ``context``: where it goes (``"result", run_id``); ``reuse``:
        the value stored there before. Default: the value as it is."""
        return value

    def discard_ahead(self, sealed: bytes) -> None:  # noqa: B027 - does nothing, on purpose
        """Undo :meth:`seal_ahead` for a write that was not made. Default: nothing."""


class KeyRecords(abc.ABC):
    """What each cache key was made of."""

    @abc.abstractmethod
    def list_keys(self, task: str, limit: int = 100) -> list[KeyRecord]:
        """Key records of a task's cache entries, newest first."""

    def find_key(self, task: str, key: str) -> KeyRecord | None:
        """The key record of cache key ``key`` of task ``task`` (its identity), or None.
        A task with ``expires_after=`` asks it on each hit, for when its entry was written
        (:attr:`KeyRecord.created`). Default: from :meth:`list_keys` (every record of the
        task read); a backend overrides it with a look-up by key."""
        return next((r for r in self.list_keys(task, limit=1 << 62) if r.cache_key == key),
                    None)

    @abc.abstractmethod
    def clear_task(self, task: str) -> int:
        """Remove the cache entries of the task of this identity; returns how many."""

    @abc.abstractmethod
    def task_identities(self) -> list[str]:
        """The identities (``module:name``) of the tasks that have key records, sorted."""


def match_tasks(identities: Iterable[str], task: str) -> list[str]:
    """The task identities ``task`` names: itself when it is an identity (``module:name``),
    else every identity whose name is ``task``.

    Example:
        >>> match_tasks(["m:parse", "n:parse", "m:load"], "parse")
        ['m:parse', 'n:parse']
    """
    if ":" in task:
        return [t for t in identities if t == task]
    return [t for t in identities if t.rpartition(":")[2] == task]


class Store(Journal, Values, KeyRecords):
    """A store: :class:`Journal`, :class:`Values` and :class:`KeyRecords`.

    Subclass it and implement the abstract methods; run
    :class:`durably.testing.StoreConformance` against it. Thread-safe: the runtime calls a
    store from several threads at once.

    Attributes:
        capabilities: What the backend does beyond the protocol (see the module docstring).
        compress_level: The zstandard level the results of tasks without ``compress=`` are
            compressed with (``DiskStore(compress=...)``), None: not compressed. A value
            records whether it is compressed, so entries of either kind load whatever it is.
    """

    capabilities: ClassVar[frozenset[str]] = frozenset()
    compress_level: int | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "integrity" not in cls.capabilities:
            # values checked and signed here, for every backend that does not itself
            layers = _SEALING
        elif "large_values" not in cls.capabilities:
            # a backend that does not stream large values gets their bytes: the description
            # a LargeValue is made of never reaches it
            layers = dict.fromkeys(_TAKING, _read_large)
        else:
            return
        for name, wrap in layers.items():
            # the backend's own method, wherever it is defined: in the class, or in a part
            # it is built from (class MyStore(MyJournal, MyValues, Store)); not a default of
            # the protocol's (built on the backend's methods, wrapped already)
            owner = next((c for c in cls.__mro__ if name in c.__dict__), None)
            if owner is None or owner in _PROTOCOL:
                continue
            method = owner.__dict__[name]
            if not getattr(method, "_durably_layer", False):
                setattr(cls, name, _layer(method, wrap))

    def __reduce__(self) -> tuple[Any, ...]:
        """A store pickles as the URL and options that open it again
        (:meth:`location`), as a worker reopens it.

        Raises:
            TypeError: the store has no location (``location()`` is None).
        """
        location = self.location()
        if location is None:
            raise TypeError(
                f"cannot pickle {type(self).__qualname__}: a store pickles as the URL that "
                "opens it again, and this one has none (its url and location() are None). "
                "Fix: give the store a url (a memory store: memory://NAME), or pass the store's "
                "URL instead of the store.")
        from durably._store.urls import open_store_for_pickle  # (urls imports this module)

        return (open_store_for_pickle, location)

    @property
    def signing_key(self) -> SigningKey | None:
        """The key values are signed with (``durably.configure(key=...)``, else
        ``$DURABLY_KEY`` / ``$DURABLY_KEY_FILE``), or None: checksums only."""
        return process_key()

    @property
    def url(self) -> str | None:
        """The URL that opens this store again in another process (see
        :func:`durably.open_store`), or None if it cannot be."""
        return None

    def location(self) -> tuple[str, dict[str, Any]] | None:
        """The URL and options that open this store again in another process (its workers
        do), or None if it cannot be. Default: :attr:`url`, without options."""
        url = self.url
        return None if url is None else (url, {})

    def found(self) -> bool:
        """Whether the store is where :meth:`location` points, as opened here: False for a
        store that would be created empty (a worker on a machine without the caller's
        directory). Default: True."""
        return True

    def check(self) -> None:
        """Open the store now, so that a store that cannot be used here fails at once.

        Raises:
            StoreError: the store cannot be opened or written here. Default: nothing.
        """

    @property
    def where(self) -> str:
        """Where the store is, as messages name it (a directory, a URL)."""
        return self.url or repr(self)

    def close(self) -> None:
        """Release files and connections; the store reopens on next use."""

    # -- maintenance (capability "maintenance") -------------------------------------------
    def cache_size(self) -> int:
        """Bytes the cache takes where it is kept."""
        raise self._unsupported("cache_size")

    def cache_entry_bytes(self) -> int:
        """Bytes the cache's entries take, their own sizes summed: what
        :meth:`cache_stats` counts as ``entry_bytes`` (and, by task, as ``bytes``), and what
        :func:`durably.prune` says it removed. Default: :meth:`cache_size`, for a store whose
        size is its entries' (a backend whose files take more, such as an index, overrides
        it)."""
        return self.cache_size()

    def large_value_bytes(self) -> int:
        """Bytes the journal's large values take apart from it (0: none kept apart)."""
        return 0

    def cache_stats(self) -> dict[str, Any]:
        """What the cache holds, per task (``durably cache stats``)."""
        raise self._unsupported("cache_stats")

    def prune(self, older_than: float | None = None, max_size: int | None = None, *,
              max_entries: int | None = None, task: str | None = None,
              dry_run: bool = False) -> int:
        """Remove cache entries stored more than ``older_than`` seconds ago, then the oldest
        until at most ``max_entries`` are left and the cache fits ``max_size`` bytes; with
        ``task`` (an identity or a name), only that task's entries, counted and sized
        alone. Returns how many. Raises :class:`ValueError` when no limit is given or one
        is negative, :class:`~durably.exceptions.NotFoundError` when ``task`` never wrote to
        the cache."""
        raise self._unsupported("prune")

    def clear(self, task: str | None = None, *, dry_run: bool = False) -> int:
        """Remove every cache entry, or those of one task (its identity or name); returns how
        many. Raises :class:`~durably.exceptions.NotFoundError` when no task of that name
        ever wrote to the cache."""
        raise self._unsupported("clear")

    def collect_values(self, grace: float = 3600.0) -> tuple[int, int]:
        """Remove stored large values no journal row refers to, unless changed less than
        ``grace`` seconds ago; returns (values removed, bytes freed)."""
        raise self._unsupported("collect_values")

    def repair_run(self, run_id: str) -> list[str]:
        """Set a run's damaged journal rows aside; returns what was set aside."""
        raise self._unsupported("repair_run")

    def _unsupported(self, what: str) -> StoreError:
        if "maintenance" in self.capabilities:
            return StoreError(
                f"{type(self).__name__} declares the capability \"maintenance\" but does not "
                f"implement {what}(). Fix (for its author): implement {what}() "
                f"(see durably.store.Store.{what}), or leave \"maintenance\" out of its "
                "capabilities.")
        return StoreError(f"{type(self).__name__} does not support {what}() (its capabilities: "
                          f"{sorted(self.capabilities) or 'none'}). Fix: use a store that "
                          "declares \"maintenance\", such as durably.DiskStore.")



def _not_a_store(value: Any, where: str, fix: str) -> DefinitionError:
    """The error for ``value`` given where a store is needed: for an object written to the
    protocol of durably 0.1 (``durably.Store`` was a ``typing.Protocol`` of 17 methods), what
    it lacks and how to port it."""
    got = type(value).__qualname__
    old = ("find_run", "put_run", "find_step", "append_steps", "cache_get", "cache_put_many")
    if all(callable(getattr(value, name, None)) for name in old):
        missing = sorted(name for name in Store.__abstractmethods__
                         if not callable(getattr(value, name, None)))
        return DefinitionError(
            f"{where} got a {got}, which looks like a store written for durably 0.1's "
            "durably.Store protocol. A store now subclasses durably.store.Store and "
            "implements its abstract methods" + (f" (it lacks {', '.join(missing)})"
                                                 if missing else "")
            + ": the runtime relies on them for leases, fencing and transactions. Fix: "
            f"class {got}(durably.store.Store) with those methods (see the how-to 'Write a "
            "store'), and check it with durably.testing.StoreConformance.")
    return DefinitionError(
        f"{where} needs a durably store (DiskStore, MemoryStore, or a subclass of "
        f"durably.store.Store) or its URL, got {got}. Fix: {fix}.")

#: the methods that take values
#: the protocol's own classes: their methods are defaults built on the backend's methods
_PROTOCOL: tuple[type, ...] = ()

_TAKING = ("cache_put_many", "append_steps", "append_steps_if_current", "put_run",
           "put_run_if_current", "append_events")

_inside = threading.local()


def _layer(method: Callable[..., Any], wrap: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` of a backend with ``wrap`` around it: only for the outermost call (a
    backend's method calling another of its own is not wrapped twice)."""
    name = method.__name__

    @functools.wraps(method)
    def layered(self: Store, *args: Any, **kwargs: Any) -> Any:
        if getattr(_inside, "on", False):
            return method(self, *args, **kwargs)
        _inside.on = True
        try:
            return wrap(name, self, method, *args, **kwargs)
        finally:
            _inside.on = False

    layered._durably_layer = True  # type: ignore[attr-defined]
    return layered


def _read_large(name: str, store: Store, method: Callable[..., Any], items: Any,
                *args: Any, **kwargs: Any) -> Any:
    return method(store, _bytes_of(name, items), *args, **kwargs)


def _bytes_of(name: str, items: Any) -> Any:
    if name in ("put_run", "put_run_if_current"):
        rec: RunRecord = items
        if isinstance(rec.result, Spilled) or isinstance(rec.args, Spilled):
            rec = rec.copy()
            rec.args = None if rec.args is None else value_bytes(rec.args)
            rec.result = None if rec.result is None else value_bytes(rec.result)
        return rec
    if name == "cache_put_many":
        return [(k, value_bytes(v), i) if isinstance(v, Spilled) else (k, v, i)
                for k, v, i in items]
    if name == "append_events":
        return [e if not isinstance(e.data, Spilled) else
                EventRecord(e.run_id, e.kind, e.time, e.attempt, e.step_id, e.key,
                            value_bytes(e.data)) for e in items]
    return [(r, d) if not isinstance(d, Spilled) else (r, value_bytes(d)) for r, d in items]



# -- integrity above the backends ---------------------------------------------------------------
# For a backend without "integrity", every value is sealed (a checksum, and a signature bound to
# its slot when a key is set: see _seal) on its way in, and checked on its way out: a damaged
# cache value is a miss, a damaged journal value an error that names its run, and a value
# signed with another key (or none, when a key is set) is not served.


def _context(key: SigningKey | None, *parts: str) -> bytes:
    return "\x00".join(parts).encode() if key is not None else b""


def _sealed(value: bytes | None, key: SigningKey | None, large: bool, *parts: str
            ) -> bytes | None:
    if value is None:
        return None
    if type(value) is not bytes:
        if isinstance(value, Unreadable):  # (a damaged value read back: never written again)
            raise value.error
        if isinstance(value, Spilled):
            sealed = _seal_large(value, key, _context(key, *parts))
            return sealed if large else value_bytes(sealed)
    if large and len(value) > _SEAL_IN_FILE:
        # (a backend that streams files: sealed in one, never a second copy in memory)
        return _seal_large(spill_bytes(value, "a value"), key, _context(key, *parts))
    return seal(value, key, _context(key, *parts))


#: bytes above which a value for a backend that takes large values is sealed in a file
_SEAL_IN_FILE = 1 << 20


def _seal_large(value: Spilled, key: SigningKey | None, context: bytes) -> Spilled:
    """A :class:`LargeValue` sealed without holding it in memory: a large-file header (the
    pickle's xxh3-128 and, with a key, a MAC of ``context`` and the pickle's HMAC) put before
    the pickle: in the bytes its spill file reserves there, else in a copy of the file."""
    try:
        mac = None
        if key is not None:
            mac = value.macs.get(key.id)
            if mac is None:
                with value.open() as f:
                    digest, mac, n = scan(f, value.offset, key, limit=value.size)
                if digest != value.digest or n != value.size or mac is None:
                    raise StoreError(f"the large value kept in {value.path} changed while it "
                                     "was being stored. Fix: rerun.")
                value.macs[key.id] = mac
        head = large_header(value.digest, key, context, mac)
        if not (value.header_free and value.offset >= LARGE_HEADER):
            with value.open() as f:  # (the bytes before it are not ours: a copy)
                return spill_stream(f, value.size, "a large value", head)
        with open(value.path, "r+b") as f:  # (a spill file of this process's)
            f.seek(value.offset - LARGE_HEADER)
            f.write(head)
            f.flush()
            digest, _, n = scan(f, value.offset, None, limit=value.size, head=head)
    except OSError as exc:
        raise StoreError(f"the large value kept in {value.path} cannot be read ({exc}). Fix: "
                         "check that the file still exists and is readable.") from exc
    if n != value.size:
        raise StoreError(f"the large value kept in {value.path} is cut short ({n:,} of "
                         f"{value.size:,} bytes). Fix: check the disk it is on.")
    sealed = Spilled(value.path, value.offset - LARGE_HEADER, value.size + LARGE_HEADER, digest)
    sealed.keep = value  # (the owner of the file: deletes it when dropped)
    return sealed


def _open_value(data: bytes, key: SigningKey | None, context: bytes) -> tuple[bytes | None, str]:
    """``(payload, "")`` for a sound sealed value, else ``(None, why)``; a sealed
    :class:`LargeValue` is checked reading its file a chunk at a time and its payload is a
    :class:`LargeValue` too (never read into memory)."""
    if type(data) is bytes or not isinstance(data, Spilled):
        return open_seal(data, key, context)
    try:
        with data.open() as f:
            head = f.read(LARGE_HEADER)
            if read_large_header(head) is None:  # (sealed inline, then kept as a file)
                return open_seal(value_bytes(data), key, context)
            digest, mac, n = scan(f, data.offset + LARGE_HEADER, key,
                                  limit=data.size - LARGE_HEADER)
    except OSError as exc:
        raise StoreError(f"the large value kept in {data.path} cannot be read ({exc}). Fix: "
                         "check that the file still exists and is readable.") from exc
    if n != data.size - LARGE_HEADER:
        return None, DAMAGED
    why = check_large_header(head, digest, mac, key, context)
    if why:
        return None, why
    payload = Spilled(data.path, data.offset + LARGE_HEADER, n, digest)
    payload.keep = data
    if key is not None and mac is not None:
        payload.macs[key.id] = mac
    return payload, ""


def _seal_in(name: str, store: Store, method: Callable[..., Any], items: Any, *args: Any,
             **kwargs: Any) -> Any:
    key = store.signing_key
    large = "large_values" in store.capabilities
    if name in ("put_run", "put_run_if_current"):
        rec: RunRecord = items.copy()
        rec.args = _sealed(rec.args, key, large, "args", rec.run_id)
        rec.result = _sealed(rec.result, key, large, "result", rec.run_id)
        items = rec
    elif name == "cache_put_many":
        items = [(k, _sealed(v, key, large, "cache", k), i) for k, v, i in items]
    elif name == "append_events":
        items = [EventRecord(e.run_id, e.kind, e.time, e.attempt, e.step_id, e.key,
                             _sealed(e.data, key, large, "event", e.run_id, e.kind, e.key))
                 for e in items]
    else:
        items = [(r, _sealed(d, key, large, "step", r.run_id, r.step_id)) for r, d in items]
    return method(store, items, *args, **kwargs)


def _corrupt(store: Store, run_id: str, what: str, why: str, fix: str = "") -> CorruptJournalError:
    if why in (OTHER_KEY, UNSIGNED):  # not damage: a key that is not the store's
        fix = ("Fix: use the signing key the run was written with (durably.configure(key=...), "
               "$DURABLY_KEY or $DURABLY_KEY_FILE)" + (", or none" if why == UNSIGNED else "")
               + "; with the right key nothing is lost.")
    state = "is damaged" if why not in (OTHER_KEY, UNSIGNED) else "does not match the key"
    return CorruptJournalError(
        f"the journal of run {run_id!r} at {store.where} {state}: {what} cannot be trusted: "
        f"{why}. " + (fix or "Fix: start a new run with fresh=True, or delete the run "
                      f"(durably.delete_runs([{run_id!r}]))."))


def _opened_run(store: Store, rec: RunRecord | None) -> RunRecord | None:
    if rec is None:
        return None
    key = store.signing_key
    for field in ("args", "result"):
        data = getattr(rec, field)
        if data is None:
            continue
        payload, why = _open_value(data, key, _context(key, field, rec.run_id))
        setattr(rec, field, payload if payload is not None else Unreadable(
            _corrupt(store, rec.run_id, f"its {'arguments' if field == 'args' else 'result'}",
                     why)))
    return rec


def _open_cache(name: str, store: Store, method: Callable[..., Any], key: str) -> Any:
    data = method(store, key)
    if data is None:
        return None
    signer = store.signing_key
    payload, why = _open_value(data, signer, _context(signer, "cache", key))
    if payload is None:
        store.discard_cache(key, why)
    return payload


def _open_cache_timed(name: str, store: Store, method: Callable[..., Any], key: str) -> Any:
    found = method(store, key)
    if found is None:
        return None
    signer = store.signing_key
    payload, why = _open_value(found[0], signer, _context(signer, "cache", key))
    if payload is None:
        store.discard_cache(key, why)
        return None
    return payload, found[1]


def _open_step(name: str, store: Store, method: Callable[..., Any], run_id: str,
               step_id: str) -> Any:
    data = method(store, run_id, step_id)
    if data is None:
        return None
    key = store.signing_key
    payload, why = _open_value(data, key, _context(key, "step", run_id, step_id))
    if payload is not None:
        return payload
    rec = next((r for r in store.list_steps(run_id) if r.step_id == step_id), None)
    task = rec.task if rec is not None else "?"
    what = f"the recorded result of step {step_id} (task {task!r})"
    if rec is not None and rec.cache_key:
        log.warning("durably: the journal of run %r at %s is damaged: %s cannot be trusted "
                    "(%s); the task is cacheable, so it is taken from the cache or executed "
                    "again", run_id, store.where, what, why)
        return None
    raise _corrupt(store, run_id, what, why, (
        f"durably will not execute {task!r} again by itself: it finished in this run, and a "
        "cache=False task may have side effects. Fix: start a new run with fresh=True."))


def _open_run(name: str, store: Store, method: Callable[..., Any], *args: Any,
              **kwargs: Any) -> Any:
    return _opened_run(store, method(store, *args, **kwargs))


def _open_runs(name: str, store: Store, method: Callable[..., Any], *args: Any,
               **kwargs: Any) -> Any:
    return [_opened_run(store, rec) for rec in method(store, *args, **kwargs)]


def _open_events(name: str, store: Store, method: Callable[..., Any], run_id: str,
                 *args: Any, **kwargs: Any) -> Any:
    key = store.signing_key
    found = []
    for e in method(store, run_id, *args, **kwargs):
        if e.data is not None:
            payload, why = _open_value(e.data, key, _context(key, "event", e.run_id, e.kind,
                                                           e.key))
            if payload is None:
                payload = Unreadable(_corrupt(store, e.run_id, f"a {e.kind!r} event", why))
            e = EventRecord(e.run_id, e.kind, e.time, e.attempt, e.step_id, e.key, payload)
        found.append(e)
    return found


class _OpenedAhead(ReadAhead):
    """A backend's read-ahead, its values checked here (a backend without "integrity"): a
    damaged one is not served from it, but asked of :meth:`Journal.find_step`, which says
    what is wrong."""

    __slots__ = ("ahead", "run_id", "store", "thread")

    def __init__(self, ahead: ReadAhead, store: Store, run_id: str) -> None:
        self.ahead, self.store, self.run_id = ahead, store, run_id
        self.thread = ahead.thread

    @property
    def due(self) -> bool:  # type: ignore[override]
        return self.ahead.due

    @property
    def buffered(self) -> bool:
        return self.ahead.buffered

    def _opened(self, step_id: str, data: bytes | None) -> bytes | None:
        if data is None:
            return None
        key = self.store.signing_key
        payload, _why = _open_value(data, key, _context(key, "step", self.run_id, step_id))
        return payload

    def replay(self, step_id: str, position: int, started: float) -> bytes | None:
        data = self.ahead.replay(step_id, position, started)
        payload = self._opened(step_id, data)
        if data is not None and payload is None:
            # not replayed from here: find_step says what is wrong (a cacheable step is
            # computed again; a cache=False one raises, never executed twice by itself)
            self.ahead.retract()
            return self.store.find_step(self.run_id, step_id)
        return payload

    def find(self, step_id: str) -> bytes | None:
        return self._opened(step_id, self.ahead.find(step_id))

    def retract(self) -> None:
        self.ahead.retract()

    def take_ranges(self) -> list[ReplayRange]:
        return self.ahead.take_ranges()


def _open_ahead(name: str, store: Store, method: Callable[..., Any], run_id: str) -> Any:
    ahead = method(store, run_id)
    return None if ahead is None else _OpenedAhead(ahead, store, run_id)


_SEALING: dict[str, Callable[..., Any]] = {
    "read_ahead": _open_ahead,
    **dict.fromkeys(_TAKING, _seal_in),
    "cache_get": _open_cache,
    "cache_get_timed": _open_cache_timed,
    "find_step": _open_step,
    "find_run": _open_run,
    "find_latest_run": _open_run,
    "list_runs": _open_runs,
    "list_thread_runs": _open_runs,
    "list_events": _open_events,
}

_PROTOCOL = (Journal, Values, KeyRecords, Store)
