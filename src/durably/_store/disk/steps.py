"""Steps in the journal: a step's records (with the results of finished steps), found by
``(run_id, step_id)`` through a short integer hash (``sid``); the steps an attempt replayed,
many to a row (:class:`~durably.store.ReplayRange` for those replayed from consecutive
records); and :class:`ReadAhead`, the finished steps of a run being resumed read ahead in
journal order, 512 at a time.

Apart from the runs (:mod:`~durably._store.disk.runs`): this is the per-call path of a run
(a step's record is written, or found, at every call of a task), kept short on purpose.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import xxhash

from durably import store as store_api
from durably._store.disk import signing
from durably._store.disk.base import DiskBase
from durably._store.disk.blobs import BLOB_REF
from durably._store.disk.rows import (
    STEP_COLS,
    STEP_TYPES,
    PackedRange,
    compact_replay,
    garbage,
    immediate,
    pack_ranges,
    pack_replays,
    replayed_counts,
    replayed_in_ranges,
    replayed_page,
    step_from_row,
    step_row,
    step_sid,
    unpack_ranges,
    unpack_replays,
)
from durably._store.integrity import _PLAIN, MAGIC_PLAIN, open_seal, seal
from durably._store.records import Replay, ReplayRange, StepRecord

__all__ = ["ReadAhead", "StepJournal"]

log = logging.getLogger("durably")


#: the types of the columns of :meth:`StepJournal.step_outline`'s rows (step id, task, status,
#: end), as :data:`STEP_TYPES` has them
_OUTLINE_TYPES = (STEP_TYPES[1], STEP_TYPES[3], STEP_TYPES[4], STEP_TYPES[8])


def _in_call_order(record: StepRecord) -> tuple[int, int]:
    return record.attempt, record.position


_AHEAD_BYTES = 8 << 20  # the results a replay's read-ahead keeps in memory, at most
#: a step's result as read: as its bytes whatever its type (a TEXT value that is not UTF-8,
#: written by a tool or a hand, would fail the whole read; as bytes it is damage said for
#: its step, and repair_run can set it aside)
_RESULT = "CAST(result AS BLOB)"
_REF_LEN = len(BLOB_REF)  # (a payload that starts with BLOB_REF names a file in blobs/)
_AHEAD_LARGEST = 65536  # the largest result the read-ahead keeps (larger: read alone)
_AHEAD_MISS: Any = object()  # a step the read-ahead's window has no entry for
_AHEAD_ROWS = 512  # the rows a read-ahead reads at once
#: replay ranges an attempt buffers before they are journaled
_AHEAD_RANGES = 2048
_new_range = tuple.__new__
_INSERT_STEP = f"INSERT INTO steps ({STEP_COLS}, result, sid) VALUES ({', '.join('?' * 18)})"
#: the same, only while the run is still the step's attempt's (its record has that attempt)
_INSERT_STEP_IF_CURRENT = (f"INSERT INTO steps ({STEP_COLS}, result, sid) SELECT "
                           f"{', '.join('?' * 18)} WHERE (SELECT attempt FROM runs WHERE "
                           "run_id=?) = ?")


class ReadAhead(store_api.ReadAhead):
    """The finished steps of a run being resumed, read ahead in journal order (512 at a
    time, at most 8 MB of results), and the steps replayed from them, recorded as ranges.

    A resumed run calls its steps in the order it journaled them, so most replayed steps
    are the record after the one replayed before, at the position after it: such steps are
    recorded together, as one :class:`ReplayRange` (each step's ids, parent, key and task
    are those of its record), instead of one replay record each. Made by
    :meth:`DiskStore.read_ahead`; one thread uses it (``thread``): the one that made it.
    """

    __slots__ = ("anchor", "count", "due", "ended", "first", "generation", "horizon", "ids",
                 "index", "last", "last_id", "next_position", "opened", "position", "ranges",
                 "run_id", "skip", "started", "store", "tail", "thread", "values")

    def __init__(self, store: StepJournal, run_id: str,
                 tail: tuple[int, int, bool] = (0, -1, False)) -> None:
        self.store, self.run_id = store, run_id
        self.thread = threading.get_ident()
        self.ranges: list[ReplayRange] = []  # closed ranges, not yet taken
        self.due = False  # as many closed ranges as an attempt buffers: take them
        # the open range: ``count`` steps from ``position``, replayed from the records after
        # ``anchor`` (skipping ``skip``; the first is ``first``), between ``started`` and
        # ``ended``; ``last_id``: the record before the window's first
        self.count = self.position = self.skip = 0
        self.anchor: tuple[int, int, bool] = (0, -1, False)
        self.first = self.last_id = ""
        self.started = self.ended = 0.0
        self.horizon = self.opened = 0  # the journal's last step rowid when read, opened
        self.next_position = -1  # the position that extends the open range (-1: none open)
        self.ids: Sequence[str] = ()
        self._fill(tail, False)

    @property
    def buffered(self) -> bool:
        return bool(self.count or self.ranges)

    def _fill(self, tail: tuple[int, int, bool], continues: bool) -> None:
        """Read the records after ``tail`` (``(attempt, position, inclusive)``: from it);
        ``continues``: the open range's last step is the record before the first read."""
        if continues:
            self.last_id = self.ids[-1]
        elif self.count:
            self._close()
        self.tail = tail
        # (before the records: one journaled after them has a greater rowid)
        self.horizon = self.store._horizon()
        ids, self.values, self.generation = self.store._ahead_rows(self.run_id, *tail)
        self.ids = ids
        self.index: dict[str, int] | None = None  # (made when a step is asked for out of
        # order: see _taken)
        # the record the open range ends with: ``ids[last]``, or the one before (-1); -2: none
        self.last = -1 if continues else -2

    def _close(self) -> None:
        """Close the open range, if any."""
        if self.count:
            last = self.last
            self.ranges.append(_new_range(ReplayRange, (  # (ReplayRange(), without its frame)
                self.position, self.count, self.anchor, self.skip, self.first,
                self.ids[last] if last >= 0 else self.last_id, self.started, self.ended,
                self.opened)))
            self.count = 0
            if len(self.ranges) >= _AHEAD_RANGES:
                self.due = True
        self.last = -2
        self.next_position = -1

    def _note(self, i: int, position: int, started: float) -> None:
        """Record the step at ``position`` as replayed from the record ``ids[i]``."""
        if i == self.last + 1 and position == self.next_position and self.count:
            self.count += 1
        else:
            self._close()
            self.count, self.position, self.started = 1, position, started
            self.anchor, self.skip, self.first = self.tail, i, self.ids[i]
            self.opened = self.horizon
        self.last = i
        self.next_position = position + 1
        self.ended = started

    def replay(self, step_id: str, position: int, started: float) -> bytes | None:
        """:meth:`DiskStore.find_step` for the attempt's step at ``position`` (its start:
        ``started``, seconds since the epoch), recorded as replayed when found.

        Raises:
            CorruptJournalError: as :meth:`DiskStore.find_step`.
        """
        i = self.last + 1
        ids = self.ids
        if position == self.next_position and i < len(ids) and ids[i] == step_id:
            # the record after the one replayed last, at the next position: the open range
            # goes on (a plain value, checked with the key in use: values are bytes only
            # while the store has no key, which changes only with the key generation)
            value = self.values[i]
            if type(value) is bytes and self.generation == signing._key_generation:
                self.count += 1
                self.last = i
                self.next_position = position + 1
                self.ended = started
                return value
        else:
            i = self._taken(step_id)
            if i < 0:
                return None
        found = self._value(i, step_id)
        if found is not None:
            self._note(i, position, started)
        return found

    def find(self, step_id: str) -> bytes | None:
        """:meth:`DiskStore.find_step`, not recorded as a replay."""
        i = self._taken(step_id)
        return self._value(i, step_id) if i >= 0 else None

    def _taken(self, step_id: str) -> int:
        """The index of the step's first record among those read, taken out of the index
        (read further when it is not among them), or -1 if it has no record. (A record
        replayed in order stays in the index: a step is asked for once.)"""
        index = self.index
        i = (self._indexed(step_id, max(self.last + 1, 0)) if index is None
             else index.pop(step_id, -1))
        return i if i >= 0 else self._seek(step_id)

    def _value(self, i: int, step_id: str) -> bytes | None:
        """The result of the record ``ids[i]`` (read and checked alone unless it is a plain
        value checked with the key in use)."""
        value = self.values[i]
        if type(value) is bytes:
            if self.generation == signing._key_generation and self.store._key is None:
                return value
            value = _AHEAD_MISS  # a key was set since: read and checked again
        elif type(value) is tuple:
            value = value[0]  # not a plain value: checked by _step_value
        else:
            value = _AHEAD_MISS  # too large to keep here
        return self.store._find_alone(self.run_id, step_id, value)

    def _seek(self, step_id: str) -> int:
        """Read the records from the step's first one on (or, past the last record read,
        the next ones) and return its index, or -1 if it has no record."""
        ids = self.ids
        if len(ids) == _AHEAD_ROWS and self.last == len(ids) - 1 \
                and (tail := self._key_of_last()) is not None:
            # past the records read so far, the last of which was replayed last: the next
            # ones (continuing the open range)
            self._fill(tail, True)
            i = self._indexed(step_id, 0)
            if i >= 0:
                return i
        found = [key for key in self.store._step_rows("attempt, position", self.run_id,
                                                      step_id, -1)
                 if type(key[0]) is int and type(key[1]) is int]  # (not garbage)
        if not found:
            return -1
        # the step's first record in journal order, and the records after it
        self._fill((*min(found), True), False)
        return self._indexed(step_id, 0)

    def _indexed(self, step_id: str, expected: int) -> int:
        """The index of the step's first record among those read, taken out of the index,
        or -1: ``expected`` when its record is there (in order: no index made), else looked
        up in the index, made now (each step's first record in journal order wins)."""
        ids = self.ids
        if expected < len(ids) and ids[expected] == step_id:
            return expected
        index = self.index = dict(zip(reversed(ids), range(len(ids) - 1, -1, -1), strict=True))
        return index.pop(step_id, -1)

    def _key_of_last(self) -> tuple[int, int, bool] | None:
        """``(attempt, position, False)`` of the last record read (the records of its step
        after the tail, in journal order: as many as the window holds); None if they are
        not there any more."""
        ids, tail = self.ids, self.tail
        step = ids[-1]
        start = tail[:2]
        after = sorted(key for key in map(tuple, self.store._step_rows(
            "attempt, position", self.run_id, step, -1))
            if type(key[0]) is int and type(key[1]) is int  # (not garbage)
            and (key > start or (tail[2] and key == start)))
        n = ids.count(step)
        if len(after) < n:
            return None
        attempt, position = after[n - 1]
        return attempt, position, False

    def retract(self) -> None:
        """Take back the step recorded last (its result could not be loaded)."""
        if self.count > 1:
            self.count -= 1
            self.last -= 1  # (the record before it: -1, the one before the window's first)
        else:
            self.count = 0
            self.last = -2
        self.next_position = -1

    def take_ranges(self) -> list[ReplayRange]:
        """The ranges recorded so far (the open one closed), handed over to be journaled."""
        self._close()
        taken, self.ranges, self.due = self.ranges, [], False
        return taken



class StepJournal(DiskBase):
    """The part of :class:`~durably.DiskStore` that journals steps and replays, and reads
    them back."""

    def find_step(self, run_id: str, step_id: str) -> bytes | None:
        """The result of a finished step of the run, or None.

        A recorded result that fails its checksum or signature is never loaded. For a
        cacheable task (``cache=True``: declared safe to serve from any run or to compute
        again) it reads as missing, with a warning: the step is served from the cache or
        executed again. For a ``cache=False`` task, which may have side effects, it raises
        :class:`~durably.CorruptJournalError`: executing it again is the user's decision
        (:meth:`repair_run`).

        Raises:
            CorruptJournalError: the recorded result of a ``cache=False`` step is damaged.
        """
        window = getattr(self._local, "window", None)
        if window is None or window.run_id != run_id:
            found = self._step_rows("attempt, position", run_id, step_id, -1)
            if not found:
                return None
            # from the step's first record on: a resumed run asks for the next ones next
            window = self._local.window = ReadAhead(self, run_id, (*min(found), True))
        return window.find(step_id)

    def _find_alone(self, run_id: str, step_id: str, data: Any = _AHEAD_MISS) -> bytes | None:
        """:meth:`find_step` without a read-ahead. ``data``: the result of the step's first
        record, when known."""
        if data is _AHEAD_MISS:
            found = self._step_rows(_RESULT, run_id, step_id, 1)
            if not found:
                return None
            data = found[0][0]
        value, why = self._step_value(run_id, step_id, data)
        if value is not None:
            return value
        return self._find_step_slow(run_id, step_id, why)

    def _step_rows(self, columns: str, run_id: str, step_id: str, limit: int
                   ) -> list[Any]:
        """``columns`` of the finished records of a step of a run, first written first (at
        most ``limit``; -1: all). They are found by sid, and, when that finds fewer than
        ``limit``, among rows without one: written by a process of an older durably that
        had the journal open before it was upgraded (``steps_unhashed``, empty otherwise)."""
        finished = "run_id=? AND step_id=? AND status IN ('ran', 'cached') ORDER BY rowid"
        with self._read_journal:
            db = self._db()
            rows = db.execute(
                f"SELECT rowid, {columns} FROM steps WHERE sid=? AND {finished} LIMIT ?",
                (step_sid(run_id, step_id), run_id, step_id, limit)).fetchall()
            if limit < 0 or len(rows) < limit:
                older = db.execute(
                    f"SELECT rowid, {columns} FROM steps WHERE sid IS NULL AND {finished}",
                    (run_id, step_id)).fetchall()
                if older:  # (rare: merged in the order they were written)
                    rows = sorted(rows + older)[:None if limit < 0 else limit]
        return [row[1:] for row in rows]

    def step_outline(self, run_id: str) -> list[tuple[str, str, str, float]]:
        """See :meth:`durably.store.Journal.step_outline`: one query of four columns.

        Raises:
            CorruptJournalError: a row of the run is garbage.
        """
        with self._read_journal:
            rows = self._db().execute(
                "SELECT step_id, task, status, ended FROM steps WHERE run_id=? AND status IN "
                "('ran', 'cached', 'interrupted') ORDER BY attempt, position, rowid",
                (run_id,)).fetchall()
        for row in rows:
            bad = garbage(row, _OUTLINE_TYPES)
            if bad:
                raise self._corrupt(run_id, "a step row", f"the row is garbage ({bad})")
        return [(step_id, task, status, float(ended)) for step_id, task, status, ended in rows]

    def finished_steps(self, run_id: str, step_ids: Iterable[str]) -> dict[str, StepRecord]:
        """See :meth:`durably.store.Journal.finished_steps`: each step's first finished
        record, found by its sid (one indexed query a step).

        Raises:
            CorruptJournalError: a row found is garbage.
        """
        found: dict[str, StepRecord] = {}
        with self.snapshot():
            for step in dict.fromkeys(step_ids):
                rows = self._step_rows(STEP_COLS, run_id, step, 1)
                if rows:
                    bad = garbage(rows[0], STEP_TYPES)
                    if bad:
                        raise self._corrupt(run_id, "a step row", f"the row is garbage ({bad})")
                    found[step] = step_from_row(rows[0])
        return found

    def parents_of(self, run_id: str, step_ids: Iterable[str]) -> dict[str, str | None]:
        """The parent (``parent_id``) of each of these steps of the run that has a record,
        whatever its status; found by sid (and among rows without one)."""
        wanted = list(step_ids)
        found: dict[str, str | None] = {}
        with self._read_journal:
            db = self._db()
            for i in range(0, len(wanted), 400):
                chunk = wanted[i:i + 400]
                marks = ", ".join("?" * len(chunk))
                sids = [step_sid(run_id, step) for step in chunk]
                rows = db.execute(f"SELECT step_id, parent_id FROM steps WHERE sid IN ({marks}) "
                                  "AND run_id=?", (*sids, run_id)).fetchall()
                rows += db.execute(f"SELECT step_id, parent_id FROM steps WHERE sid IS NULL AND "
                                   f"run_id=? AND step_id IN ({marks})", (run_id, *chunk)
                                   ).fetchall()
                asked = set(chunk)
                for step, parent in rows:
                    if step in asked:
                        found.setdefault(step, parent)
        return found

    def read_ahead(self, run_id: str) -> ReadAhead:
        """Read the first finished steps of a run that is being resumed, before its first
        step asks: for :meth:`find_step` in this thread, and for the attempt, whose replays
        :meth:`ReadAhead.replay` records as ranges."""
        window = ReadAhead(self, run_id)
        self._local.window = window
        return window

    def _horizon(self) -> int:
        """The rowid of the last step record journaled (0: none)."""
        with self._read_journal:
            row = self._db().execute("SELECT max(rowid) FROM steps").fetchone()
        return row[0] or 0

    def _ahead_rows(self, run_id: str, attempt: int, position: int, inclusive: bool
                    ) -> tuple[Sequence[str], list[Any], int]:
        """The next finished steps of the run after ``(attempt, position)`` (``inclusive``:
        from it) in journal order (a resumed run replays them in that order): one query for
        the next 512 instead of one per step. Returns their step ids, the value of each, and
        the key generation the values were checked with. A value is a plain result's
        payload, its checksum checked; any other result as ``(data,)``; None for a result
        too large to keep here (over 64 KiB, or past 8 MB in all: read alone when asked
        for). The journal is never held whole."""
        with self._read_journal:
            rows = self._db().execute(
                f"SELECT step_id, CASE WHEN length(result) <= {_AHEAD_LARGEST} THEN {_RESULT} END "
                "FROM steps WHERE run_id=? AND status IN ('ran', 'cached') AND "
                f"(attempt, position) {'>=' if inclusive else '>'} (?, ?) "
                f"ORDER BY attempt, position LIMIT {_AHEAD_ROWS}",
                (run_id, attempt, position)).fetchall()
        generation = signing._key_generation
        if not rows:
            return (), [], generation
        ids, results = zip(*rows, strict=True)
        del rows  # (its results, once the values are made)
        values: list[Any] = list(results)
        del results
        if (len(values) * _AHEAD_LARGEST > _AHEAD_BYTES
                and sum(map(len, filter(None, values))) > _AHEAD_BYTES):
            size = 0
            for i, data in enumerate(values):
                if data is not None:
                    size += len(data)
                    if size > _AHEAD_BYTES:
                        values[i] = None
        if self._key is None and self._key_gen == generation:
            # (_step_value's common case, with open_plain inlined, for every step at once, in
            # a comprehension: a third faster than a loop): a plain value's payload when its
            # header is the one sealing it without a key would write (magic and checksum: a
            # fifth faster than reading them apart); any other value as (data,)
            check, header = xxhash.xxh3_64_intdigest, _PLAIN.pack
            values = [
                p if (type(d) is bytes and d[:12] == header(MAGIC_PLAIN, check(p := d[12:]))
                      and p[:_REF_LEN] != BLOB_REF)
                else None if d is None else (d,)
                for d in values]
        else:
            values = [None if d is None else (d,) for d in values]
        return ids, values, generation

    def _step_value(self, run_id: str, step_id: str, data: Any) -> tuple[bytes | None, str]:
        if data is None:
            return None, "it has no recorded result"
        if self._key is None and self._key_gen == signing._key_generation and type(data) is bytes:
            payload, why = open_seal(data)  # the common case, kept short: unsigned, small
            if payload is None or not payload.startswith(BLOB_REF):
                return payload, why
        return self._open_journal_value(
            data, ("step", run_id, step_id), True,
            lambda why: self._corrupt(run_id, f"the result of step {step_id}", why))

    def _find_step_slow(self, run_id: str, step_id: str, why: str) -> bytes | None:
        """Another, sound record of the step (written when it ran again), else the verdict on
        the damaged one."""
        rows = self._step_rows(f"{_RESULT}, cache_key, task", run_id, step_id, -1)
        for data, _, _ in rows:  # (the damaged one among them reads as damaged again)
            value, _why = self._step_value(run_id, step_id, data)
            if value is not None:
                return value
        if not rows:  # set aside meanwhile (repair_run): not in the journal any more
            return None
        _, cache_key, task = rows[0]
        what = f"the recorded result of step {step_id} (task {task!r})"
        if isinstance(cache_key, str) and cache_key:
            log.warning("durably: the journal of run %r at %s is damaged: %s cannot be "
                        "trusted (%s); the task is cacheable, so it is taken from the cache or "
                        "executed again", run_id, self.path, what, why)
            return None
        raise self._corrupt(run_id, what, why, (
            f"durably will not execute {task!r} again by itself: it finished in this run, and "
            "a cache=False task may have side effects. Fix: if running it again is safe, call "
            f"durably.DiskStore({str(self.path)!r}).repair_run({run_id!r}) and rerun; else "
            "start a new run with fresh=True."))

    def append_steps(self, steps: Sequence[tuple[StepRecord, bytes | None]]) -> None:
        """Journal step records (with the results of finished steps). Records of replayed
        steps are kept compactly, many to a row (:meth:`append_replays`)."""
        self._append_steps(steps, checked=False)

    def append_steps_if_current(self, steps: Sequence[tuple[StepRecord, bytes | None]]
                                ) -> bool:
        """:meth:`append_steps`, only while each step's run is still its attempt's (no other
        process took it over: the run's record has the step's attempt), checked by each
        row's INSERT itself. A step that ends after its own attempt did (a thread the user
        started) is still journaled. False, and nothing written but replay records, when a
        row is refused.

        Raises:
            StoreError: the journal cannot be written.
        """
        return self._append_steps(steps, checked=True)

    def _append_steps(self, steps: Sequence[tuple[StepRecord, bytes | None]], *,
                      checked: bool) -> bool:
        if not steps:
            return True
        rows = []
        replays: dict[tuple[str, int], list[Replay]] = {}
        for rec, data in steps:
            compact = compact_replay(rec) if rec.status == "replayed" and data is None else None
            if compact is not None:
                replays.setdefault((rec.run_id, rec.attempt), []).append(compact)
            else:
                rows.append((*step_row(rec),
                             self._seal_blob(data, "step", rec.run_id, rec.step_id),
                             step_sid(rec.run_id, rec.step_id))
                            + ((rec.run_id, rec.attempt) if checked else ()))
        sql = _INSERT_STEP_IF_CURRENT if checked else _INSERT_STEP
        with self._write_journal:
            db = self._db()
            if len(rows) == 1 and not replays:
                return db.execute(sql, rows[0]).rowcount == 1
            with immediate(db):
                written = db.executemany(sql, rows).rowcount if rows else 0
                for (run_id, attempt), found in replays.items():
                    if not self._append_replays(run_id, attempt, found, checked=checked):
                        written -= 1  # (refused: that run's attempt is not its last)
        return written == len(rows)

    def append_replays(self, run_id: str, attempt: int,
                       replays: Sequence[Replay | ReplayRange]) -> bool:
        """Journal steps of ``attempt`` served from the run's journal, many to a row: what a
        replayed step's :class:`StepRecord` holds, without building one (75 bytes a step),
        or a :class:`ReplayRange` of steps replayed from consecutive records (81 bytes a
        range). :meth:`list_steps` returns them as records of status ``"replayed"``.

        Args:
            run_id: The run.
            attempt: The attempt that replayed them.
            replays: ``(position, started, ended, step_id, parent_id, cache_key, task)`` of
                each step (ids are 32 hex digits; ``parent_id`` may be None, ``cache_key``
                "" for a ``cache=False`` task), or ranges (made by :class:`ReadAhead`).

        Returns:
            False, and nothing written, if the run's stored record is not ``attempt``'s
            (another attempt took the run over: fencing).

        Raises:
            StoreError: the journal cannot be written.
        """
        return self._append_replays(run_id, attempt, replays, checked=True)

    def _append_replays(self, run_id: str, attempt: int,
                        replays: Sequence[Replay | ReplayRange], *, checked: bool) -> bool:
        ranges: list[ReplayRange] = []
        steps: list[Replay] = []
        for r in replays:
            if type(r) is ReplayRange:
                ranges.append(r)
            else:
                steps.append(r)  # type: ignore[arg-type]  # (a Replay)
        # a checksum, never a signature: the row is parsed, never unpickled, so a store opened
        # with another key (to look inside it) still lists its replays
        blobs = ([pack_replays(steps)] if steps else []) + (
            [pack_ranges(ranges)] if ranges else [])
        for blob in blobs:
            with self._write_journal:
                if checked:
                    if self._db().execute(
                            "INSERT INTO replays (run_id, attempt, steps) SELECT ?, ?, ? WHERE "
                            "EXISTS (SELECT 1 FROM runs WHERE run_id=? AND attempt=?)",
                            (run_id, attempt, seal(blob), run_id, attempt)).rowcount != 1:
                        return False
                else:
                    self._db().execute(
                        "INSERT INTO replays (run_id, attempt, steps) VALUES (?, ?, ?)",
                        (run_id, attempt, seal(blob)))
        return True

    def _replayed(self, run_id: str, attempt: int | None) -> list[StepRecord]:
        """The records of the run's replayed steps kept by :meth:`append_replays`. They only
        say which steps an attempt replayed: a damaged row is left out, with a warning
        (:meth:`repair_run` sets it aside), and never stops a run from continuing."""
        listed, ranged = self._replay_rows(run_id, attempt)
        found = [StepRecord(run_id, step, parent, task, "replayed", at, position, started,
                            ended, None, key)
                 for at, replays in listed
                 for position, started, ended, step, parent, key, task in replays]
        if ranged:
            with self._read_journal:
                found += replayed_in_ranges(self._db(), run_id, ranged, self._warn_replays)
        return found

    def _replay_rows(self, run_id: str, attempt: int | None
                     ) -> tuple[list[tuple[int, list[Replay]]],
                                list[tuple[int, list[PackedRange]]]]:
        """The rows :meth:`append_replays` wrote for the run (or one attempt of it), in the
        order they were written, by attempt: the steps each listed, and the ranges; a
        damaged row is left out, with a warning."""
        sql = "SELECT attempt, steps FROM replays WHERE run_id=?"
        params: tuple[Any, ...] = (run_id,)
        if attempt is not None:
            sql, params = sql + " AND attempt=?", (run_id, attempt)
        with self._read_journal:
            rows = self._db().execute(sql + " ORDER BY rowid", params).fetchall()
        listed: list[tuple[int, list[Replay]]] = []
        ranged: list[tuple[int, list[PackedRange]]] = []
        for at, data in rows:
            payload, why = (None, "the row is garbage") if type(at) is not int \
                else open_seal(data)
            if payload is not None:
                try:
                    ranges = unpack_ranges(payload)
                    if ranges is not None:
                        ranged.append((at, ranges))
                    else:
                        listed.append((at, unpack_replays(payload)))
                    continue
                except ValueError as exc:
                    why = str(exc)
            self._warn_replays(run_id, at, why)
        return listed, ranged

    def _warn_replays(self, run_id: str, attempt: Any, why: str) -> None:
        warned = f"replays {run_id} {attempt!r}"
        if warned not in self._warned:
            self._warned.add(warned)
            log.warning("durably: the journal of run %r at %s is damaged: a record of steps "
                        "replayed in attempt %r cannot be trusted (%s); they are left out "
                        "of its records (they only said which steps were replayed). Fix: "
                        "durably.DiskStore(%r).repair_run(%r) sets the row aside", run_id,
                        self.path, attempt, why, str(self.path), run_id)

    def page_steps(self, run_id: str, attempt: int, *, after: int = -1,
                   limit: int = 100) -> list[StepRecord]:
        """One page of an attempt's step records in call order (see
        :meth:`durably.store.Journal.page_steps`): a query that stops at ``limit`` rows of
        the index on (run, attempt, position); the attempt's replay ranges, when it has
        any, read for the page's positions only (:func:`replayed_page`), all in one
        snapshot of the journal.

        Raises:
            ValueError: ``limit`` is less than 1.
            CorruptJournalError: a row of the page is garbage.
        """
        if limit < 1:
            raise ValueError(f"page_steps: limit must be at least 1, got {limit!r}")
        with self.snapshot(), self._read_journal:
            db = self._db()
            rows = db.execute(
                f"SELECT {STEP_COLS} FROM steps WHERE run_id=? AND attempt=? AND position>? "
                "ORDER BY position LIMIT ?", (run_id, attempt, after, limit)).fetchall()
            for row in rows:
                bad = garbage(row, STEP_TYPES)
                if bad:
                    raise self._corrupt(run_id, "a step row", f"the row is garbage ({bad})")
            records = [step_from_row(row) for row in rows]
            if db.execute("SELECT 1 FROM replays WHERE run_id=? AND attempt=? LIMIT 1",
                          (run_id, attempt)).fetchone() is None:
                return records
            listed, ranged = self._replay_rows(run_id, attempt)
            records.extend(StepRecord(run_id, step, parent, task, "replayed", at, position,
                                      started, ended, None, key)
                           for at, replays in listed
                           for position, started, ended, step, parent, key, task in replays
                           if position > after)
            if ranged:
                records += replayed_page(db, run_id, ranged, after, limit, self._warn_replays)
        records.sort(key=_in_call_order)
        del records[limit:]
        return records

    def count_steps(self, run_id: str, attempt: int) -> dict[str, dict[str, int]]:
        """An attempt's steps by task and status (see
        :meth:`durably.store.Journal.count_steps`), counted by one aggregate query (each
        step by its last row: SQLite takes the bare columns of a ``max()`` from its row);
        the attempt's replays, when it has any, counted without building their records (a
        replay range by an aggregate query over the records it names:
        :func:`replayed_counts`), all in one snapshot of the journal."""
        with self.snapshot(), self._read_journal:
            db = self._db()
            rows = db.execute(
                "SELECT task, status, count(*) FROM (SELECT task, status, max(rowid) FROM steps "
                "WHERE run_id=? AND attempt=? AND status!='started' GROUP BY step_id) "
                "GROUP BY task, status", (run_id, attempt)).fetchall()
            counts: dict[str, dict[str, int]] = {}
            for task, status, n in rows:
                counts.setdefault(str(task), {})[str(status)] = int(n)
            if db.execute("SELECT 1 FROM replays WHERE run_id=? AND attempt=? LIMIT 1",
                          (run_id, attempt)).fetchone() is None:
                return counts
            listed, ranged = self._replay_rows(run_id, attempt)
            replayed: dict[str, int] = {}
            for _, replays in listed:
                for *_, task in replays:
                    replayed[task] = replayed.get(task, 0) + 1
            if ranged:
                for task, n in replayed_counts(db, run_id, ranged,
                                               self._warn_replays).items():
                    replayed[task] = replayed.get(task, 0) + n
        for task, n in replayed.items():
            by_status = counts.setdefault(task, {})
            by_status["replayed"] = by_status.get("replayed", 0) + n
        return counts

    def list_steps(self, run_id: str, attempt: int | None = None) -> list[StepRecord]:
        """A run's step records in call order.

        Raises:
            CorruptJournalError: a row of the run is garbage.
        """
        with self._read_journal:
            if attempt is None:
                rows = self._db().execute(
                    f"SELECT {STEP_COLS} FROM steps WHERE run_id=? ORDER BY attempt, position",
                    (run_id,),
                ).fetchall()
            else:
                rows = self._db().execute(
                    f"SELECT {STEP_COLS} FROM steps WHERE run_id=? AND attempt=? "
                    "ORDER BY position",
                    (run_id, attempt),
                ).fetchall()
        for row in rows:
            bad = garbage(row, STEP_TYPES)
            if bad:
                raise self._corrupt(run_id, "a step row", f"the row is garbage ({bad})")
        records = [step_from_row(row) for row in rows]
        replayed = self._replayed(run_id, attempt)
        if replayed:
            records.extend(replayed)
            records.sort(key=_in_call_order)
        return records
