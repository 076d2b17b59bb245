"""The active run and step of the current thread or asyncio task (contextvars)."""

from __future__ import annotations

import itertools
import logging
import math
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import xxhash

from durably._keys.origin import PACKAGE_DIR
from durably._store.lease import RENEW_SECONDS, Owner, _pid
from durably._store.records import KeyRecord, Replay, ReplayRange, StepRecord
from durably._trace.producers import Producers
from durably.exceptions import RunStateError
from durably.store import ReadAhead, Store

if TYPE_CHECKING:
    from durably._trace.tracer import Event

log = logging.getLogger("durably")

__all__ = ["RUNS", "Cutoff", "Executing", "RunContext", "StopRun", "current_run", "current_step",
           "cutoff", "in_worker", "joined_run", "live_run", "user_stacklevel"]


class StopRun(BaseException):
    """Stops a run at its next step boundary (the consumer of ``stream()`` went away). The
    run is recorded as ``stopped`` and stays resumable."""

_FLUSH_EVERY = 2048  # replay records buffered before a write
#: a journal row holding more bytes than this is written on its own, outside a batch
LARGE_ROW = 1 << 20
_PENDING_BYTES = 8 << 20  # ... and buffered journal rows holding this many bytes are written
#: ... and buffered rows of cached steps once the oldest is this old (seconds), at the next
#: one: the dashboard counts a run's cached steps from its journal as it executes
_PENDING_SECONDS = 1.0
CACHE_BATCH = 2048  # cache writes queued before a batch write
_CACHE_BYTES = 32 << 20  # ... or this many bytes of results
_CACHE_SECONDS = 1.0  # ... or when the oldest queued write is this old


#: what :meth:`RunContext.take_pending` hands over: step records with their results, and
#: replay records (one step each, or ranges)
Taken = tuple[list[tuple[StepRecord, bytes | None]], list[Replay | ReplayRange]]


class RunContext:
    """One execution (attempt) of a run: its store, counters and buffered replay records."""

    __slots__ = (
        "__weakref__",
        "_cache_bytes",
        "_cache_since",
        "_cache_writes",
        "_claiming",
        "_counters",
        "_lock",
        "_occurrences",
        "_pending",
        "_pending_bytes",
        "_pending_since",
        "_replays",
        "ahead",
        "answers",
        "asked",
        "asked_code",
        "attempt",
        "cancelled_by",
        "codes",
        "consumed",
        "counts",
        "deferred",
        "ended",
        "entry",
        "failed_before",
        "failures",
        "foreign",
        "halting",
        "inflight",
        "interrupts",
        "items",
        "keep",
        "listener",
        "lost",
        "marked",
        "marking",
        "name",
        "open",
        "owner",
        "past_journal",
        "pid",
        "positions",
        "producers",
        "raised",
        "read_cache",
        "renew_at",
        "replaying",
        "run_id",
        "spent",
        "stop",
        "store",
        "stored_result",
        "threads",
        "uncacheable",
        "unjournaled",
        "unreadable",
        "unwaited",
        "warned",
        "watchers",
    )

    def __init__(self, run_id: str, store: Store, attempt: int, owner: Owner, *,
                 name: str = "", listener: Callable[[Event], Any] | None = None,
                 answers: dict[str, bytes] | None = None, read_cache: bool = True) -> None:
        self.run_id = run_id
        self.name = name
        #: receives live events (Entrypoint.stream); None when nobody listens
        self.listener = listener
        #: set to stop the run at its next step boundary
        self.stop = False
        #: why the run was told to stop by :func:`durably.cancel_run` or its ``timeout=``
        #: (said by the error the call raises and by the run's record); None otherwise
        self.cancelled_by: str | None = None
        #: called (no arguments) when the run is cancelled: what stops the code a flag
        #: cannot reach (an async node's task, an async entrypoint's task): see _cancel
        self.watchers: set[Callable[[], object]] = set()
        #: the attempt's lease was found taken over by another process (or removed): it
        #: stops at its next step boundary, and its end is not journaled
        self.lost = False
        #: the attempt ended (its lease released): steps still called from threads the user
        #: started are journaled, but the released lease is not renewed, nor found lost
        self.ended = False
        #: the steps of the items whose map is stopping (Ctrl-C, a failed store) while their
        #: bodies, which cannot be stopped, end: nothing inside them starts meanwhile (see
        #: :meth:`halted`)
        self.halting: set[str] = set()
        #: answers to interrupts by interrupt id (pickled), read when the attempt starts
        self.answers: dict[str, bytes] = answers or {}
        #: interrupt() calls so far under each parent step, for stable interrupt ids
        self.interrupts: dict[str | None, int] = {}
        #: digest of the payload each interrupt id was last asked with (an answer is used
        #: only while the question is the same)
        self.asked: dict[str, str] = {}
        #: the code version of the step that asked each answered interrupt (when known): a
        #: question that changed while the code did not is not from an edit
        self.asked_code: dict[str, str] = {}
        #: the entrypoint's Spec (the code of interrupt() calls in its own body)
        self.entry: Any = None
        #: interrupt ids reached in this attempt (an answer is used by one call only)
        self.consumed: set[str] = set()
        #: steps that depend on an answer and were replayed in this attempt: the answers
        #: they and the steps they called used are spent (interrupt() is not reached again)
        self.spent: set[str] = set()
        #: the items of a fan-out executing on threads now, by step id (steps whose body
        #: runs in this process without Call.enter: what interrupt() finds the asker by)
        self.items: Executing = Executing()
        #: interrupts raised (not answered) in this attempt, in order: the run ends
        #: interrupted even if user code caught the signal
        self.raised: list[Any] = []
        #: the exception of each step that failed in an earlier attempt and whose failure
        #: the run went on from (``step_raised`` events, pickled; see _failures): raised
        #: again where the step is called, instead of executing it
        self.failed_before: dict[str, bytes] = {}
        #: the steps that failed in this attempt, by the id of their exception (kept
        #: alive): those whose exception ends the attempt are executed again by the next
        self.failures: dict[int, tuple[BaseException, list[str]]] = {}
        #: asyncio tasks running a step body now (an async run waits for them before it ends)
        self.inflight: set[Any] = set()
        #: submitted calls that failed: (task, the future's "asked" cell, the error), so that
        #: a run finishing without anyone seeing their failure says so
        self.unwaited: list[tuple[str, Any, str]] = []
        #: steps whose body runs now, by step id; and those journaled as "started" (a step
        #: is marked started when its first nested step begins, so a crash inside it still
        #: shows where the run was)
        self.open: Executing = Executing()
        self.marked: set[str] = set()
        #: held while a step's "started" row is journaled (reentrant: a task called from a
        #: signal handler meanwhile does not wait for itself)
        self.marking = threading.RLock()
        #: the objects this attempt's steps returned, with the step that returned each:
        #: the data-flow edges of its graph (see durably._trace.producers)
        self.producers = Producers()
        #: False for the first attempt of a fork: steps after the checkpoint execute again
        self.read_cache = read_cache
        #: keep_finished=True: the steps it may keep from older code (a keep.Keeper)
        self.keep: Any = None
        #: the code version each task (by its Spec) last cached a result under in this
        #: attempt (its first one is written at once: see Call.succeeded)
        self.codes: dict[Any, str] = {}
        #: the process executing the attempt: a process forked inside the run (whose copy of
        #: this context may still be on its stack) never writes the run's journal
        self.pid = _pid[0]
        #: the run has a journal from an earlier attempt (else no step can be replayed, and
        #: the journal is not searched)
        self.replaying = True
        #: a step of this attempt was not in the journal: the attempt is past what the
        #: earlier ones did (its next steps are most likely executed, not replayed)
        self.past_journal = False
        #: the journaling of the attempt's start, until it first writes (see
        #: _runtime._Deferred: an attempt of a run that ended, which has only replayed so
        #: far); None once done, or for an attempt that journaled its start at once
        self.deferred: Any = None
        #: the run's large result as journaled when the attempt started (its file in
        #: blobs/), if any: an end with the same bytes refers to it instead of a new copy
        self.stored_result: bytes | None = None
        #: an attempt that only replayed was refused when it was to journal its replays
        #: (another process has the run): it goes on replaying without journaling them (a
        #: step it must execute is refused), and its end journals nothing
        self.unjournaled = False
        #: the store errors raised while this process read a replayed step's journaled
        #: value (a blob store not named here, a value signed with another key): an
        #: attempt that only replayed and ends with one of them journals nothing
        self.unreadable: list[BaseException] = []
        #: steps whose result depends on an answer to interrupt() (theirs or a nested
        #: step's): journaled, never written to the cross-run cache
        self.uncacheable: set[str] = set()
        self.owner = owner
        #: when the lease is due for renewal (time.monotonic()): see keep_lease
        self.renew_at = time.monotonic() + RENEW_SECONDS
        self.store = store
        self.attempt = attempt
        #: per xxh3-64 of a step's parent and key (see step_id): the mark of its first call
        #: (its position), and of the heads called again, the count of their next calls
        self._occurrences: dict[int, object] = {}
        self._counters: dict[int, itertools.count[int]] = {}
        #: the position of the next step in this attempt (``next(ctx.positions)``)
        self.positions = itertools.count()
        self._pending: list[tuple[StepRecord, bytes | None]] = []
        self._replays: list[Replay] = []
        #: the journal read ahead for this attempt by the thread that began it, which
        #: records the steps it replays from there (as ranges); None in other threads' use
        self.ahead: ReadAhead | None = None
        self._pending_bytes = 0  # of the results in _pending
        #: when the oldest cached step in _pending ended (seconds since the epoch; inf: none)
        self._pending_since = math.inf
        self._lock = threading.Lock()
        self._claiming = threading.Lock()  # (claim() does I/O: not under _lock)
        #: steps of this attempt by status: ran, cached, failed (replayed steps are counted
        #: in the journal)
        self.counts = {"ran": 0, "cached": 0, "failed": 0}
        self._cache_writes: dict[str, tuple[bytes, KeyRecord | None]] = {}
        self._cache_bytes = 0
        self._cache_since = 0.0
        #: the threads alive when the attempt began: a task called from a thread started
        #: since, without the run in its context, may join the run (see _threads)
        #: (weakly: a thread object kept alive here kept a process pool's manager thread
        #: alive past the interpreter's exit, whose callback then failed)
        self.threads: weakref.WeakSet[threading.Thread] = weakref.WeakSet(threading.enumerate())
        #: such a thread joined the run (its calls check that they still belong to it)
        self.foreign = False
        #: a task called from a thread the run does not know was said to be outside it
        self.warned = False
        RUNS.add(weakref.ref(self, RUNS.discard))

    def keep_lease(self) -> None:
        """Renew the run's lease every RENEW_SECONDS (a long run keeps it from expiring).
        A lease found lost stops the attempt (see :attr:`lost`)."""
        t = time.monotonic()
        if t >= self.renew_at and not self.ended:
            self.renew_at = t + RENEW_SECONDS
            if self.store.renew_run(self.run_id, self.owner) is False and not self.ended:
                self.lose_lease()

    def halted(self, step: str | None) -> bool:
        """Whether a step starting under ``step`` (its parent) is inside an item of a map
        that is stopping (:attr:`halting`): that step, or one of its callers."""
        halting, open_ = self.halting, self.open
        for _ in range(10_000):  # (a parent chain is never that long: no cycle can hang it)
            if step is None:
                return False
            if step in halting:
                return True
            caller = open_.get(step)
            step = caller.parent if caller is not None else None
        return False

    def claim(self, replays: bool = False) -> bool:
        """Journal the attempt's start now if it was deferred (:attr:`deferred`), before
        anything else of it is journaled or executed; once, whichever thread asks first.
        A refusal (another process holds the run, or resumed it meanwhile) stops the attempt
        (:meth:`lose_lease`): nothing of it is journaled. With ``replays`` (what is to be
        journaled is only replay records), a refusal does not stop it: False, the replays
        are not journaled (nor any later ones: :attr:`unjournaled`), and the attempt goes
        on replaying (every step from the journal: its result is the run's).

        Raises:
            RunStateError: the run is another process's now (not with ``replays``)."""
        if self.deferred is None:
            return True
        if replays and self.unjournaled:
            return False
        with self._claiming:
            deferred = self.deferred
            if deferred is None:
                return True
            try:
                deferred(self)
            except RunStateError:
                if replays:
                    self.unjournaled = True
                    return False
                self.lose_lease()
                raise
        return True

    def journal(self, steps: list[tuple[StepRecord, bytes | None]]) -> None:
        """Journal step records of this attempt, only while the run is still its own (with a
        store that can tell: ``append_steps_if_current``). A process whose run another took over
        writes none: a late record of a step the other attempt executed again would be
        served on replay instead of that one, and what followed it would not match. The
        attempt then stops (see :meth:`lose_lease`)."""
        if self._pending and steps:
            # the rows of cache hits buffered before these go in with them, in the same
            # write (one transaction): an executed step's record is never in the journal
            # without the hits that came before it (a dashboard counts them as they happen;
            # a crash after it loses none of them)
            with self._lock:
                pending, self._pending = self._pending, []
                self._pending_bytes = 0
                self._pending_since = math.inf
            steps = pending + steps
        if self.deferred is not None and steps:
            self.claim()
        if not self.store.append_steps_if_current(steps):
            if not self.lost:
                log.warning("durably: run %r: a later attempt of it has started (another "
                            "process took it over, or a new call); attempt %d's steps are no "
                            "longer journaled", self.run_id, self.attempt)
            self.lose_lease()

    def lose_lease(self) -> None:
        """The attempt's lease is no longer its own (another process took the run over, or
        the lease was removed): stop at the next step boundary, never journal its end."""
        self.lost = True
        self.stop = True

    def step_id(self, parent: str | None, key: str) -> str:
        """The identity of the next call with this cache key under this parent: an xxh3-128
        of parent, key and occurrence (the n-th such call in the run, from 0), so it never
        depends on timing.

        Occurrences are counted by an xxh3-64 of parent and key (the same in every
        process: a collision would be the same in every attempt); see :meth:`occurrence`."""
        head = f"{parent or ''}/{key}".encode()
        n = self.occurrence(xxhash.xxh3_64_intdigest(head), object())
        return xxhash.xxh3_128_hexdigest(b"%s/%d" % (head, n))

    def occurrence(self, slot: int, mark: object) -> int:
        """The occurrence of a call (from 0) among the calls counted under ``slot``;
        ``mark``: an object no other call passes (the call path passes its position).

        Without a lock (a task called from a signal handler, or a ``__del__``, while its
        thread counts: a lock would wait for itself): a first call costs one
        ``dict.setdefault``, a single step under the GIL (of two threads, one stores its
        mark, the other gets it back), and keeps only its mark, not a counter (a run's steps
        mostly have inputs of their own: one slot each); a slot called again gets a counter
        in a second dict, put there by ``setdefault`` too (of two made at once, both use the
        one kept), and ``next`` on it is a single step as well."""
        got = self._occurrences.setdefault(slot, mark)
        return 0 if got is mark else self.occurrence_again(slot)

    def occurrence_again(self, slot: int) -> int:
        """The occurrence of a call counted under ``slot``, which was called before (see
        :meth:`occurrence`): 1, 2, ..."""
        counter = self._counters.get(slot)
        if counter is None:
            counter = self._counters.setdefault(slot, itertools.count(1))
        return next(counter)

    def next_interrupt(self, parent: str | None) -> int:
        """The n-th ``interrupt()`` call under this parent in this attempt, from 0."""
        with self._lock:
            n = self.interrupts.get(parent, 0)
            self.interrupts[parent] = n + 1
        return n

    def emit(self, event: Event) -> None:
        """Give a live event to the listener, if any."""
        listener = self.listener
        if listener is not None:
            listener(event)

    def count(self, status: str) -> None:
        with self._lock:
            self.counts[status] += 1

    def note_replayed(self, replay: Replay) -> None:
        """Buffer the record of a replayed step: ``(position, started, ended, step_id,
        parent_id, cache_key, task)``. It is informational, so it is written in batches.
        (No lock: ``list.append`` is one step under the GIL, and :meth:`take_pending` takes
        the records it copied, never the list.)"""
        replays = self._replays
        replays.append(replay)
        if len(replays) >= _FLUSH_EVERY:
            self.flush()

    def note_replayed_record(self, record: StepRecord) -> None:
        """Buffer the whole record of a replayed step, when it has more than
        :meth:`note_replayed` keeps (the inputs a listener was shown)."""
        with self._lock:
            self._pending.append((record, None))
            full = len(self._pending) >= _FLUSH_EVERY
        if full:
            self.flush()

    def note_cached(self, record: StepRecord, data: bytes) -> None:
        """Buffer the journal row of a step served from the cross-run cache: written in
        batches like replay rows, at the first hit a second after the oldest row buffered
        (by the steps' own times: the dashboard, which counts an executing run's steps from
        its journal, is at most that late), and with the next step record journaled (an
        executed step's: in the same write, see :meth:`journal`). A row lost in a crash
        costs little: on resume the cache serves the step again, or (its entry gone:
        expired, pruned) it executes again; the rows are written before a ``cache=False``
        step executes, so that a side effect never sees inputs other than the ones it saw
        before the crash."""
        if type(data) is not bytes or len(data) > LARGE_ROW:
            # a large value is journaled at once: never held in memory for a batch, nor
            # written inside the transaction that ends the attempt
            self.journal([(record, data)])
            with self._lock:
                self.counts["cached"] += 1
            return
        ended = record.ended  # (its time, read once: no clock read on the hit path)
        with self._lock:
            self._pending.append((record, data))
            self._pending_bytes += len(data)
            self.counts["cached"] += 1
            if ended < self._pending_since:
                self._pending_since = ended
            full = (len(self._pending) >= _FLUSH_EVERY or self._pending_bytes >= _PENDING_BYTES
                    or ended - self._pending_since >= _PENDING_SECONDS)
        if full:
            self.flush()

    def cache_later(self, key: str, data: bytes, info: KeyRecord | None) -> None:
        """Queue a cache write. Inside a run the journal already holds the result durably, so
        cache writes (shared with other runs) are batched: a crash loses only cache entries
        that the journal still has."""
        t = time.monotonic()
        with self._lock:
            if not self._cache_writes:
                self._cache_since = t
            self._cache_writes[key] = (data, info)
            self._cache_bytes += len(data)
            full = (len(self._cache_writes) >= CACHE_BATCH or self._cache_bytes >= _CACHE_BYTES
                    or t - self._cache_since >= _CACHE_SECONDS)
        if full:
            self.flush_cache()

    @property
    def queued_cache(self) -> bool:
        """Whether cache writes are queued (:meth:`cache_later`)."""
        return bool(self._cache_writes)

    def pending_cache(self, key: str) -> tuple[bytes, float] | None:
        """A queued cache write for this key, if any (so the run sees its own results),
        with the seconds its execution took (its key record's duration)."""
        found = self._cache_writes.get(key)
        if found is None:
            return None
        info = found[1]
        return found[0], info.duration if info is not None else 0.0

    def flush_cache(self) -> None:
        with self._lock:
            writes, self._cache_writes, self._cache_bytes = self._cache_writes, {}, 0
        try:
            self.store.cache_put_many([(k, d, i) for k, (d, i) in writes.items()])
        except BaseException:
            with self._lock:  # queued again (a later write, or the attempt's end, retries)
                for key, entry in writes.items():
                    if key not in self._cache_writes:
                        self._cache_writes[key] = entry
                        self._cache_bytes += len(entry[0])
            raise

    def take_pending(self) -> Taken:
        """The buffered step records and replays, handed over to :meth:`write` (the buffers
        are emptied). The replay ranges of the read-ahead only in the thread that uses it
        (the others leave them for it)."""
        with self._lock:
            pending, self._pending = self._pending, []
            self._pending_bytes = 0
            self._pending_since = math.inf
            # copied, then deleted by count: a replay appended meanwhile (without the lock)
            # stays for the next time
            replays: list[Replay | ReplayRange] = self._replays[:]  # type: ignore[assignment]
            del self._replays[:len(replays)]
        ahead = self.ahead
        if ahead is not None and ahead.thread == threading.get_ident():
            replays += ahead.take_ranges()
        return pending, replays

    @property
    def replays_buffered(self) -> bool:
        """Whether replay records are buffered (in this thread's view)."""
        ahead = self.ahead
        return bool(self._replays) or (ahead is not None and ahead.buffered)

    def write(self, taken: Taken) -> None:
        """Journal what :meth:`take_pending` handed over: replays many to a row in a store
        that keeps them so (``append_replays``), as step records in any other."""
        pending, replays = taken
        if self.deferred is not None and (pending or replays) and not self.claim(
                replays=not pending):
            return  # (replays of an attempt refused: another process has the run)
        self.journal(pending)
        if replays and not self.lost and not self.store.append_replays(
                self.run_id, self.attempt, replays):
            self.lose_lease()

    def executing(self, step_id: str | None) -> Any:
        """The Call of a step whose body runs now in this process (a plain call, or a
        fan-out item on a thread or the event loop), or None."""
        if step_id is None:
            return None
        return self.open.get(step_id) or self.items.get(step_id)

    def flush(self) -> None:
        """Write buffered replay records and queued cache writes."""
        taken = self.take_pending()
        try:
            self.write(taken)
        finally:
            self.flush_cache()


def user_stacklevel() -> int:
    """The ``stacklevel`` of a warning that names the first frame outside durably (the
    user's call), counted from the caller of ``warnings.warn``."""
    here = PACKAGE_DIR + os.sep  # (not a package named durably_something)
    frame = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(here):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return level


class Executing(dict[str, Any]):
    """The steps executing now, by step id (:attr:`RunContext.open`, :attr:`RunContext.items`).
    Those entered by a thread that joined the run from outside it (see _threads) are also in
    :attr:`joined`, for good (step ids are never reused in a run): a thread the run does not
    know finds the run's innermost step without them."""

    __slots__ = ("joined",)

    def __init__(self) -> None:
        super().__init__()
        self.joined: set[str] = set()

    def enter(self, ctx: RunContext, step_id: str, call: Any) -> None:
        """``self[step_id] = call``, noting a step entered by a joined thread (checked only
        once a thread joined the run: a plain dict store otherwise, no Python call on the
        step's path)."""
        if ctx.foreign and joined_run.get() is not None:
            self.joined.add(step_id)  # (before the entry: a reader copies the entries first)
        self[step_id] = call


#: weak references to the attempts created in this process (an attempt is active while its
#: owner is held and it has not ended: see _threads); their truth is all a call outside a
#: run pays
RUNS: set[weakref.ref[RunContext]] = set()


class Cutoff:
    """Set on the context of a body that timed out: it runs on (Python cannot stop a
    thread), but the tasks it calls from then on raise StopRun instead of joining the run, so
    an abandoned try cannot repeat a side effect the retry already did."""

    __slots__ = ("cut",)

    def __init__(self) -> None:
        self.cut = False


cutoff: ContextVar[Cutoff | None] = ContextVar("durably_cutoff", default=None)
#: set while a fan-out item's body runs in a worker process or on Dask (it has no run)
in_worker: ContextVar[bool] = ContextVar("durably_in_worker", default=False)
current_run: ContextVar[RunContext | None] = ContextVar("durably_run", default=None)
current_step: ContextVar[str | None] = ContextVar("durably_step", default=None)
#: set in a thread the run did not start that joined it (see _threads): the run, and the
#: parent its calls join under (that thread's current_step between its calls)
joined_run: ContextVar[tuple[RunContext, str | None] | None] = ContextVar(
    "durably_joined", default=None)


def live_run() -> RunContext | None:
    """The run of this thread or task, if this process executes it: a process forked inside
    a run may still hold its parent's context (in a context other than the one that forked,
    or on its stack), which is no run here."""
    ctx = current_run.get()
    if ctx is None:
        return None
    if ctx.foreign and ctx.ended:
        mark = joined_run.get()
        if mark is not None and mark[0] is ctx and current_step.get() == mark[1]:
            return None  # a thread that joined the run from outside (see _threads), between
            # its calls: the run has ended since
    return ctx if ctx.pid == _pid[0] else None


def _flush_before_fork() -> None:
    """The run's queued cache writes are written before a process forks from inside it, so
    a forked worker finds the results the run computed instead of executing them again."""
    ctx = live_run()
    if ctx is not None:
        try:
            ctx.flush_cache()
        except Exception as exc:  # noqa: BLE001 - the fork goes on; the journal has them
            log.warning("durably: could not write the run's queued cache entries before a "
                        "fork: %s", exc)


def _leave_run_in_child() -> None:
    """A process forked inside a run (a fork-start ``multiprocessing`` pool created in an
    entrypoint, or ``Process(start_method="fork")``) is not part of the run: its journal
    writes would interleave with the parent's under the parent's step positions, and its
    replay records would be lost when it exits. Its task calls are cached calls outside a run,
    as in a spawn or forkserver worker (on resume they are served from the cache), and
    ``interrupt()`` there says it runs in a worker. (A copy of the run's context still on the
    child's stack writes nothing either: see ``RunContext.pid``.)"""
    RUNS.clear()  # (the parent's attempts: none is active here)
    if current_run.get() is not None:
        current_run.set(None)
        current_step.set(None)
        cutoff.set(None)
        joined_run.set(None)
        in_worker.set(True)


os.register_at_fork(before=_flush_before_fork, after_in_child=_leave_run_in_child)
