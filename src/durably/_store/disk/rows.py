"""The rows a disk store's SQLite journal keeps: the schema and its migrations, records as rows,
row checksums, the packed records of replayed steps and replay ranges, and the write
transaction (:class:`immediate`)."""

from __future__ import annotations

import binascii
import bisect
import contextlib
import itertools
import json
import re
import sqlite3
import struct
import sys
from collections.abc import Callable, Sequence
from typing import Any

import xxhash

from durably._store.records import KeyRecord, Replay, ReplayRange, RunRecord, StepRecord

__all__ = ["EVENT_COLS", "EVENT_TYPES", "PackedRange", "RUN_COLS", "RUN_TYPES", "SCHEMA",
           "SCHEMA_2", "SCHEMA_3", "SCHEMA_4", "SCHEMA_5", "SCHEMA_5_KEYS", "SCHEMA_6",
           "SCHEMA_6_EVENTS", "SCHEMA_6_LEASES", "SCHEMA_8", "COLUMNS_8", "STEP_COLS", "STEP_TYPES",
           "compact_replay", "discard_leftover", "garbage", "immediate", "key_row", "pack_ranges",
           "pack_replays", "replayed_counts", "replayed_in_ranges", "replayed_page", "row_hash",
           "row_hash_sql", "run_row", "step_from_row", "step_row", "step_sid", "unpack_ranges",
           "unpack_replays"]


def step_row(r: StepRecord) -> tuple[Any, ...]:
    """A step record as a row (fast: dataclasses.astuple deep-copies)."""
    # the result's elements' digests follow its own in its column, space-separated ("-" for
    # an element without one): no new column, and a reader that predates them sees a
    # digest that matches nothing
    result = r.result_digest
    if r.output_digests and result:
        result = " ".join((result, *(d or "-" for d in r.output_digests)))
    return (r.run_id, r.step_id, r.parent_id, r.task, r.status, r.attempt, r.position,
            r.started, r.ended, r.error, r.cache_key, r.inputs, r.output, result,
            " ".join(r.input_digests), r.saved or None)


def step_from_row(row: Sequence[Any]) -> StepRecord:
    """The inverse of :func:`step_row`."""
    result: str = row[13] or ""
    elements: tuple[str, ...] = ()
    if " " in result:
        result, *rest = result.split(" ")
        elements = tuple("" if d == "-" else d for d in rest)
    return StepRecord(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8],
                      row[9], row[10], row[11], row[12], result,
                      tuple(row[14].split()) if row[14] else (), elements,
                      row[15] or 0.0)


def run_row(r: RunRecord) -> tuple[Any, ...]:
    """A run record as a row."""
    return (r.run_id, r.entrypoint, r.name, r.status, r.created, r.updated, r.attempt,
            r.input_digest, r.args, r.result, r.error, r.thread)


_json_sorted = json.JSONEncoder(sort_keys=True).encode


_json_str = json.encoder.encode_basestring_ascii  # (C) a str as JSON, as json.dumps writes it


def _sorted_json(d: dict[str, str]) -> str:
    """``json.dumps(d, sort_keys=True)`` of a dict of strings, the same text written without
    an encoder (JSONEncoder.encode builds one per call: most of its cost, paid twice per
    executed step)."""
    try:
        return "{" + ", ".join([f"{_json_str(k)}: {_json_str(v)}"
                                for k, v in sorted(d.items())]) + "}"
    except TypeError:  # not all strings: the encoder says it
        return _json_sorted(d)


def key_row(r: KeyRecord) -> tuple[Any, ...]:
    """A key record as a row of the keys table: ``(kid, cache_key, task, code, inputs, parts,
    created, duration)``."""
    return (row_hash(r.cache_key), r.cache_key, r.task, r.code, _sorted_json(r.inputs),
            _sorted_json(r.parts), r.created, r.duration)


def row_hash(text: str) -> int:
    """What the journal's lookup indexes hold instead of long text keys (format 5): an
    xxh3-64 of ``text``'s UTF-8, shifted to 63 bits (a SQLite integer, always positive).

    An index entry is then about 15 bytes instead of about 80, so the indexes of a store of
    millions of steps stay small enough for SQLite's page cache; rows are still matched on
    their text, so two texts with one hash only cost a second row read.

    Example:
        >>> row_hash("run-1/0af1") == row_hash("run-1/0af1") != row_hash("run-2/0af1")
        True
        >>> 0 <= row_hash("") < 2**63
        True
    """
    return xxhash.xxh3_64_intdigest(text.encode()) >> 1


def row_hash_sql(data: object) -> int | None:
    """:func:`row_hash` as the SQL function ``durably_row_hash`` of the format 5 upgrade,
    given the text's bytes (``CAST(... AS BLOB)``: a column that is not valid UTF-8 does not
    fail the upgrade); NULL for NULL."""
    if isinstance(data, bytes):
        return xxhash.xxh3_64_intdigest(data) >> 1  # row_hash of the text these bytes encode
    return None if data is None else row_hash(str(data))


def step_sid(run_id: str, step_id: str) -> int:
    """The ``sid`` column of a step's rows: :func:`row_hash` of ``run_id/step_id``, which
    the ``steps_by_sid`` index finds a run's step by."""
    return row_hash(f"{run_id}/{step_id}")


# what each column of a row must hold (a row that does not is garbage: CorruptJournalError)
_S, _SN, _I, _F = (str,), (str, type(None)), (int,), (int, float)


STEP_TYPES = (_S, _S, _SN, _S, _S, _I, _I, _F, _F, _SN, _S, _SN, _SN, _SN, _SN,
              (int, float, type(None)))


RUN_TYPES = (_S, _S, _S, _S, _F, _F, _I, _S)


EVENT_TYPES = (_S, _S, _F, _I, _SN, _S)


def garbage(row: Sequence[Any], types: Sequence[tuple[type, ...]]) -> str:
    """"" when each column has its type, else which column does not."""
    for i, (value, allowed) in enumerate(zip(row, types, strict=False)):
        if not isinstance(value, allowed) or isinstance(value, bool):
            return f"column {i} holds {value!r:.40}"
    return ""


SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, entrypoint TEXT NOT NULL, name TEXT NOT NULL,
    status TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL,
    attempt INTEGER NOT NULL, input_digest TEXT NOT NULL,
    args BLOB, result BLOB, error TEXT);
CREATE INDEX IF NOT EXISTS runs_by_inputs ON runs (entrypoint, input_digest, updated);
CREATE TABLE IF NOT EXISTS steps (
    run_id TEXT NOT NULL, attempt INTEGER NOT NULL, position INTEGER NOT NULL,
    step_id TEXT NOT NULL, parent_id TEXT, task TEXT NOT NULL, status TEXT NOT NULL,
    started REAL NOT NULL, ended REAL NOT NULL, error TEXT, cache_key TEXT NOT NULL,
    result BLOB);
CREATE INDEX IF NOT EXISTS steps_by_id ON steps (run_id, step_id, status);
CREATE INDEX IF NOT EXISTS steps_by_order ON steps (run_id, attempt, position);
CREATE TABLE IF NOT EXISTS leases (
    run_id TEXT PRIMARY KEY, host TEXT NOT NULL, pid INTEGER NOT NULL, started INTEGER,
    token TEXT NOT NULL, heartbeat REAL NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS keys (
    cache_key TEXT PRIMARY KEY, task TEXT NOT NULL, code TEXT NOT NULL,
    inputs TEXT NOT NULL, parts TEXT NOT NULL, created REAL NOT NULL);
CREATE INDEX IF NOT EXISTS keys_by_task ON keys (task, created);
"""


# format 2: the tracer's columns on steps, and the events table
SCHEMA_2 = """
ALTER TABLE steps ADD COLUMN inputs TEXT;
ALTER TABLE steps ADD COLUMN output TEXT;
ALTER TABLE steps ADD COLUMN result_digest TEXT;
ALTER TABLE steps ADD COLUMN input_digests TEXT;
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY, run_id TEXT NOT NULL, kind TEXT NOT NULL,
    time REAL NOT NULL, attempt INTEGER NOT NULL, step_id TEXT, key TEXT NOT NULL,
    data BLOB);
CREATE INDEX IF NOT EXISTS events_by_run ON events (run_id, kind, seq);
"""


# format 3: every blob sealed; what repair_run takes out of a journal is kept here
SCHEMA_3 = """
CREATE TABLE IF NOT EXISTS set_aside (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT, what TEXT NOT NULL,
    reason TEXT NOT NULL, time REAL NOT NULL, row TEXT, data BLOB);
"""


# format 4: steps served from the journal on resume ("replayed") are recorded compactly, many
# to a row (see pack_replays), instead of one steps row each
SCHEMA_4 = """
CREATE TABLE IF NOT EXISTS replays (
    run_id TEXT NOT NULL, attempt INTEGER NOT NULL, steps BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS replays_by_run ON replays (run_id, attempt)
"""


# format 5: the journal's random-key lookups go through short integer hashes (row_hash), so
# that their indexes do not outgrow SQLite's page cache and the CPU's caches as a store
# grows: a step is found by ``sid`` (a hash of its run and step ids) instead of the
# (run_id, step_id, status) text index, and a key record by ``kid`` (a hash of its cache
# key, unique) instead of the cache key as primary key. ``durably_row_hash`` is row_hash of
# a BLOB (the text's bytes: it never fails on a garbage row, whose hash is then NULL),
# registered on the connection for the upgrade only. Key records colliding on 63 bits keep
# the later one (INSERT OR REPLACE, as before for one key).
#
# A process of an older durably that opened the journal before the upgrade goes on writing
# format 4 rows: steps without a sid (found through ``steps_unhashed``, which holds only
# them: empty otherwise) and key records without a kid (kid and cache_key may be NULL, as
# the old primary key allowed). The steps part fills the sid of rows that have none (the
# column is added first when missing); the keys part is run when keys has no kid column.
SCHEMA_5 = """
UPDATE steps SET sid = durably_row_hash(CAST(run_id || '/' || step_id AS BLOB))
    WHERE sid IS NULL;
CREATE INDEX IF NOT EXISTS steps_by_sid ON steps (sid);
CREATE INDEX IF NOT EXISTS steps_unhashed ON steps (run_id, step_id) WHERE sid IS NULL;
DROP INDEX IF EXISTS steps_by_id
"""


SCHEMA_5_KEYS = """
CREATE TABLE keys_5 (
    kid INTEGER, cache_key TEXT, task TEXT NOT NULL, code TEXT NOT NULL,
    inputs TEXT NOT NULL, parts TEXT NOT NULL, created REAL NOT NULL);
CREATE UNIQUE INDEX keys_by_kid ON keys_5 (kid);
INSERT OR REPLACE INTO keys_5 SELECT durably_row_hash(CAST(cache_key AS BLOB)), cache_key,
    task, code, inputs, parts, created FROM keys ORDER BY rowid;
DROP TABLE keys;
ALTER TABLE keys_5 RENAME TO keys;
CREATE INDEX IF NOT EXISTS keys_by_task ON keys (task, created)
"""


# format 6: fewer pages written by each commit that starts or ends an attempt (each page
# of a commit is two writes to the log: about 5 us here, a tenth of a resume's fixed cost).
# The events table without AUTOINCREMENT (which updated sqlite_sequence, one more page, at
# every event; seq still orders a run's events: a new row's is above every row there is),
# the leases table WITHOUT ROWID (one b-tree, not a table and its primary key index), and
# no index of runs by update time (a run's row moved in it at every start and end of an
# attempt; only list_runs, which reads every row, sorted by it). Tables made by older
# formats are rebuilt under their names, their rows kept (a process of an older durably
# that has the journal open finds the same columns under the same names).
SCHEMA_6_EVENTS = """
CREATE TABLE events_6 (
    seq INTEGER PRIMARY KEY, run_id TEXT NOT NULL, kind TEXT NOT NULL,
    time REAL NOT NULL, attempt INTEGER NOT NULL, step_id TEXT, key TEXT NOT NULL,
    data BLOB);
INSERT INTO events_6 (seq, run_id, kind, time, attempt, step_id, key, data)
    SELECT seq, run_id, kind, time, attempt, step_id, key, data FROM events ORDER BY seq;
DROP TABLE events;
ALTER TABLE events_6 RENAME TO events;
CREATE INDEX events_by_run ON events (run_id, kind, seq)
"""


SCHEMA_6_LEASES = """
CREATE TABLE leases_6 (
    run_id TEXT PRIMARY KEY, host TEXT NOT NULL, pid INTEGER NOT NULL, started INTEGER,
    token TEXT NOT NULL, heartbeat REAL NOT NULL) WITHOUT ROWID;
INSERT OR REPLACE INTO leases_6 SELECT run_id, host, pid, started, token, heartbeat
    FROM leases WHERE run_id IS NOT NULL ORDER BY rowid;
DROP TABLE leases;
ALTER TABLE leases_6 RENAME TO leases
"""


SCHEMA_6 = "DROP INDEX IF EXISTS runs_by_time"


# format 8: a run's conversation thread (entrypoint.run(..., thread=)), and the runs of a
# thread found by it (the column is added first when missing)
SCHEMA_8 = ("CREATE INDEX IF NOT EXISTS runs_by_thread ON runs (thread, updated) "
            "WHERE thread IS NOT NULL")
#: format 8's new columns, each added when missing: a run's conversation thread, the seconds
#: the execution that produced a cache entry took (a key record's duration) and the time a
#: step served from the cache saved (a step record's ``saved``); NULL in older rows
COLUMNS_8 = (("runs", "thread", "TEXT"), ("keys", "duration", "REAL"),
             ("steps", "saved", "REAL"))


_REPLAY = struct.Struct("<qdd16s16s16sBH")  # position, started, ended, ids, flags, task


_REPLAY_IDS = struct.Struct("<qdd48sBH")  # the same layout, the three ids as one field


_HEX32 = re.compile(r"[0-9a-f]{32}")


_REPLAYS_MAGIC = b"durably-replays-1\n"


def compact_replay(r: StepRecord) -> Replay | None:
    """The compact form of a step record, or None if it has more than a replay record
    holds (its inputs, output, an error, ids that are not 32 hex digits)."""
    if (r.status != "replayed" or r.error is not None or r.inputs is not None
            or r.output is not None or r.result_digest or r.input_digests
            or not 0 <= r.position < 2**63 or not _HEX32.fullmatch(r.step_id)
            or not (r.parent_id is None or _HEX32.fullmatch(r.parent_id))
            or not (r.cache_key == "" or _HEX32.fullmatch(r.cache_key))):
        return None
    return (r.position, r.started, r.ended, r.step_id, r.parent_id, r.cache_key, r.task)


def pack_replays(replays: Sequence[Replay]) -> bytes:
    """Replayed steps as one blob: 75 bytes a step, the task names once.

    Every id must be 32 hex digits (the parent may be None, the cache key ""), as
    :func:`compact_replay` checks.

    Example:
        >>> r = (3, 1.5, 1.5, "ab" * 16, None, "cd" * 16, "inc")
        >>> unpack_replays(pack_replays([r])) == [r]
        True
    """
    names: dict[str, int] = {}
    parts = []
    pack = _REPLAY_IDS.pack
    fromhex = binascii.a2b_hex  # (bytes.fromhex, without its whitespace handling: faster)
    zero = "0" * 32
    for position, started, ended, step_id, parent, key, task in replays:
        index = names.setdefault(task, len(names))
        # the three ids in one conversion (the same bytes as three 16s fields)
        parts.append(pack(position, started, ended,
                          fromhex(f"{step_id}{zero if parent is None else parent}{key or zero}"),
                          (parent is not None) | (bool(key) << 1), index))
    header = json.dumps(list(names)).encode()
    return b"".join((_REPLAYS_MAGIC, struct.pack("<II", len(header), len(replays)), header,
                     *parts))


def unpack_replays(blob: bytes) -> list[Replay]:
    """The inverse of :func:`pack_replays`.

    Raises:
        ValueError: the blob is not one :func:`pack_replays` wrote (damaged).
    """
    if not blob.startswith(_REPLAYS_MAGIC):
        raise ValueError("not a record of replayed steps")
    try:
        at = len(_REPLAYS_MAGIC)
        size, count = struct.unpack_from("<II", blob, at)
        at += 8
        names = json.loads(blob[at:at + size])
        at += size
        if (not isinstance(names, list) or not all(isinstance(n, str) for n in names)
                or len(blob) != at + count * _REPLAY.size):
            raise ValueError("a record of replayed steps has the wrong length")
        return [(position, started, ended, step.hex(), parent.hex() if flags & 1 else None,
                 key.hex() if flags & 2 else "", names[index])
                for position, started, ended, step, parent, key, flags, index
                in _REPLAY.iter_unpack(blob[at:])]
    except (struct.error, IndexError, UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"a record of replayed steps is damaged ({exc})") from None


# position, count, anchor (attempt, position, inclusive), skip, hashes of first and last ids,
# started, ended, horizon
_RANGE = struct.Struct("<qqqq?qQQddq")


_RANGES_MAGIC = b"durably-replay-ranges-1\n"


_BOUND = 1 << 48  # positions, steps and skips of a range are below this


def _id_hash(step_id: str) -> int:
    return xxhash.xxh3_64_intdigest(step_id.encode())


def pack_ranges(ranges: Sequence[ReplayRange]) -> bytes:
    """Replay ranges as one blob: 81 bytes a range (the ids of its first and last steps as
    64-bit hashes: enough to check them).

    Example:
        >>> r = ReplayRange(5, 3, (1, 0, False), 2, "ab" * 16, "cd" * 16, 1.5, 1.75, 40)
        >>> [tuple(u)[:4] for u in unpack_ranges(pack_ranges([r]))]
        [(5, 3, (1, 0, False), 2)]
    """
    pack = _RANGE.pack
    return b"".join((_RANGES_MAGIC, struct.pack("<I", len(ranges)), *(
        pack(r.position, r.steps, r.anchor[0], r.anchor[1], r.anchor[2], r.skip,
             _id_hash(r.first), _id_hash(r.last), r.started, r.ended, r.horizon)
        for r in ranges)))


#: a range as :func:`unpack_ranges` reads it: the ids of its first and last steps as hashes
PackedRange = tuple[int, int, tuple[int, int, bool], int, int, int, float, float, int]


def unpack_ranges(blob: bytes) -> list[PackedRange] | None:
    """The ranges :func:`pack_ranges` wrote (the ids of first and last as their hashes);
    None for a blob of another kind (one :func:`pack_replays` wrote).

    Raises:
        ValueError: the blob is a damaged record of replay ranges.
    """
    if not blob.startswith(_RANGES_MAGIC):
        return None
    at = len(_RANGES_MAGIC)
    try:
        (count,) = struct.unpack_from("<I", blob, at)
    except struct.error:
        raise ValueError("a record of replay ranges is cut short") from None
    if len(blob) != at + 4 + count * _RANGE.size:
        raise ValueError("a record of replay ranges has the wrong length")
    found: list[PackedRange] = [
        (position, n, (a, p, inclusive), skip, first, last, started, ended, horizon)
        for position, n, a, p, inclusive, skip, first, last, started, ended, horizon
        in _RANGE.iter_unpack(blob[at + 4:])]
    if any(not (0 <= r[0] < _BOUND and 1 <= r[1] < _BOUND and 0 <= r[3] < _BOUND)
           for r in found):
        raise ValueError("a record of replay ranges holds an impossible range")
    return found


def replayed_in_ranges(db: sqlite3.Connection, run_id: str,
                       ranged: Sequence[tuple[int, Sequence[PackedRange]]],
                       warn: Callable[[str, int, str], None]) -> list[StepRecord]:
    """The records of the steps replayed in these ranges (by attempt), each step's ids,
    parent, key and task read from the journal record it was replayed from; the steps of
    a range spread evenly over its time.

    A record journaled after a range's records were read (a step of an earlier attempt
    whose thread finished late) may sit among them: it is told apart by its rowid (after
    the range's horizon), else by its time (it ended after the range did). A range whose
    records are still not in the journal as it says (one was set aside, or damaged) is
    left out: ``warn(run_id, attempt, why)``. Rows whose keys or times are not numbers
    (garbage: see :meth:`DiskStore.repair_run`) are never among a range's records."""
    low = min(r[2][:2] for _, ranges in ranged for r in ranges)
    rows = db.execute(
        "SELECT attempt, position, ended, step_id, parent_id, task, cache_key, rowid "
        "FROM steps WHERE run_id=? AND status IN ('ran', 'cached') "
        "AND (attempt, position) >= (?, ?) AND typeof(attempt)='integer' "
        "AND typeof(position)='integer' AND typeof(ended) IN ('real', 'integer') "
        "ORDER BY attempt, position", (run_id, *low)).fetchall()
    keys = [(row[0], row[1]) for row in rows]
    found: list[StepRecord] = []
    for attempt, ranges in ranged:
        for position, steps, anchor, skip, first, last, started, ended, horizon in ranges:
            key = anchor[:2]
            at = (bisect.bisect_left if anchor[2] else bisect.bisect_right)(keys, key)
            span = rows[at + skip:at + skip + steps]
            # (else the slow ways, when records were journaled after the range was made)
            for column, bound in ((7, horizon), (2, ended)):  # (rowid, ended)
                if _spans(span, steps, first, last):
                    break
                span = list(itertools.islice(
                    (row for row in itertools.islice(rows, at, None) if row[column] <= bound),
                    skip, skip + steps))
            if not _spans(span, steps, first, last):
                warn(run_id, attempt, f"{steps} steps replayed from the records after "
                     f"{key} cannot be matched to the journal's records (one was set "
                     "aside or damaged since)")
                continue
            each = (ended - started) / steps
            found.extend(
                StepRecord(run_id, step, parent, task, "replayed", attempt, position + k,
                           started + k * each, started + (k + 1) * each, None, cache_key)
                for k, (_, _, _, step, parent, task, cache_key, _) in enumerate(span))
    return found


#: the finished records a range may name, in journal order, from its anchor on (``{}``:
#: ``>=`` for an inclusive anchor, ``>`` else): the rows :func:`replayed_in_ranges` reads
_RANGE_ROWS = (
    "FROM steps WHERE run_id=? AND status IN ('ran', 'cached') AND (attempt, position) {} "
    "(?, ?) AND typeof(attempt)='integer' AND typeof(position)='integer' "
    "AND typeof(ended) IN ('real', 'integer') ORDER BY attempt, position")
_RANGE_COLS = "attempt, position, ended, step_id, parent_id, task, cache_key, rowid"


def _range_query(columns: str, anchor: tuple[int, int, bool]) -> str:
    return f"SELECT {columns} " + _RANGE_ROWS.format(">=" if anchor[2] else ">") + \
        " LIMIT ? OFFSET ?"


def _matches(db: sqlite3.Connection, run_id: str, r: PackedRange) -> bool:
    """Whether a range's records are where it says, as :func:`replayed_in_ranges` reads
    them without its slow ways: its first and last records (the ``skip``-th after its
    anchor, and the one ``steps - 1`` further) are its first and last steps (two rows read,
    not the range's)."""
    _, steps, anchor, skip, first, last, *_ = r
    sql = _range_query("step_id", anchor)
    for offset, expected in ((skip, first), (skip + steps - 1, last)):
        found = db.execute(sql, (run_id, anchor[0], anchor[1], 1, offset)).fetchone()
        if found is None or _id_hash(found[0]) != expected:
            return False
    return True


def replayed_page(db: sqlite3.Connection, run_id: str,
                  ranged: Sequence[tuple[int, Sequence[PackedRange]]], after: int, limit: int,
                  warn: Callable[[str, int, str], None]) -> list[StepRecord]:
    """The records of these ranges (by attempt) at positions greater than ``after``: at
    least the ``limit`` of lowest position (every record among the first ``limit`` of the
    page, in the order :func:`replayed_in_ranges` gives them), read a page at a time: a
    range past those positions is not read, a range whose records are where it says is read
    for the positions asked only (its first and last records checked, as
    :func:`replayed_in_ranges` checks them), and only a range that needs the slow ways (a
    record journaled late among its records, or one set aside) is read whole by
    :func:`replayed_in_ranges`, which tells late records apart and leaves a damaged range
    out (``warn``)."""
    if limit < 1:
        return []
    # each range's records at positions after `after`: from its k-th record on
    todo = sorted(((max(0, after + 1 - r[0]), order, attempt, r)
                   for order, (attempt, r) in enumerate(
                       (attempt, r) for attempt, ranges in ranged for r in ranges)
                   if r[0] + r[1] - 1 > after), key=lambda t: t[3][0] + t[0])
    found: list[tuple[int, StepRecord]] = []  # (the range's order: the whole read's order)
    for k, order, attempt, r in todo:
        if len(found) >= limit and r[0] + k > sorted(
                rec.position for _, rec in found)[limit - 1]:
            break  # (this range's records, and every later one's, are past the page)
        position, steps, anchor, skip, _, _, started, ended, _ = r
        if _matches(db, run_id, r):
            rows = db.execute(_range_query(_RANGE_COLS, anchor),
                              (run_id, anchor[0], anchor[1], min(limit, steps - k),
                               skip + k)).fetchall()
            each = (ended - started) / steps
            found.extend(
                (order, StepRecord(run_id, step, parent, task, "replayed", attempt,
                                   position + j, started + j * each,
                                   started + (j + 1) * each, None, cache_key))
                for j, (_, _, _, step, parent, task, cache_key, _)
                in enumerate(rows, start=k))
        else:  # (the slow ways, for this range alone)
            found.extend((order, rec)
                         for rec in replayed_in_ranges(db, run_id, [(attempt, [r])], warn)
                         if rec.position > after)
    found.sort(key=lambda t: t[0])  # (stable: each range's records stay in their order)
    return [rec for _, rec in found]


def replayed_counts(db: sqlite3.Connection, run_id: str,
                    ranged: Sequence[tuple[int, Sequence[PackedRange]]],
                    warn: Callable[[str, int, str], None]) -> dict[str, int]:
    """The records of these ranges (by attempt) counted by task, as
    :func:`replayed_in_ranges` would give them, without building them: a range whose records
    are where it says is counted by one aggregate query over its records; one that needs
    the slow ways is read by :func:`replayed_in_ranges` (a damaged one counts none, and
    ``warn`` is called)."""
    counts: dict[str, int] = {}
    for attempt, ranges in ranged:
        for r in ranges:
            _, steps, anchor, skip, *_ = r
            if _matches(db, run_id, r):
                sql = (f"SELECT task, count(*) FROM ({_range_query('task', anchor)}) "
                       "GROUP BY task")
                for task, n in db.execute(sql, (run_id, anchor[0], anchor[1], steps, skip)):
                    counts[task] = counts.get(task, 0) + n
            else:
                for rec in replayed_in_ranges(db, run_id, [(attempt, [r])], warn):
                    counts[rec.task] = counts.get(rec.task, 0) + 1
    return counts


def _spans(span: Sequence[Any], steps: int, first: int, last: int) -> bool:
    """Whether these records are the ``steps`` records of a range: its first and last
    step ids (their hashes) match."""
    return (len(span) == steps and _id_hash(span[0][3]) == first
            and _id_hash(span[-1][3]) == last)


RUN_COLS = (
    "run_id, entrypoint, name, status, created, updated, attempt, input_digest, args, result, "
    "error, thread"
)


STEP_COLS = (
    "run_id, step_id, parent_id, task, status, attempt, position, started, ended, error, "
    "cache_key, inputs, output, result_digest, input_digests, saved"
)


EVENT_COLS = "run_id, kind, time, attempt, step_id, key, data"


#: the connections inside a transaction :func:`immediate` began, by id: the frame running the
#: ``with`` statement that began it. The transaction is that block's while the frame is on
#: the stack; once it is not, the block was left without ending it (a KeyboardInterrupt that
#: landed as its ``__exit__`` was entered), and it is a leftover. (Each thread has its own
#: connection: only that thread reads and writes its entry.)
_OPEN: dict[int, Any] = {}


def _running(frame: Any) -> bool:
    """Whether ``frame`` is on the current thread's stack."""
    f: Any = sys._getframe(2)
    while f is not None:
        if f is frame:
            return True
        f = f.f_back
    return False


class immediate:
    """One write transaction, taken at once (BEGIN IMMEDIATE), rolled back on any error
    (SQLite may have rolled it back already, after a full disk: the original error wins).
    Inside a ``with immediate(db)`` block still running on ``db`` (:meth:`DiskStore.batch`),
    it is part of that one: it commits or rolls back with it. A transaction left open on
    ``db`` (a KeyboardInterrupt between its BEGIN and its end) is rolled back first: it was
    never committed, and joining it would lose every later write.

    A class, not a generator: a suspended generator would keep its transaction open, and
    look like a block still running, until the garbage collector closed it.
    """

    __slots__ = ("begin", "db", "depth", "joined")

    def __init__(self, db: sqlite3.Connection, depth: int = 1,
                 begin: str = "BEGIN IMMEDIATE") -> None:
        self.db = db
        self.depth = depth  # frames between __enter__ and the one running the `with`
        self.joined = False
        self.begin = begin  # "BEGIN": a read transaction (one snapshot), no write lock

    def __enter__(self) -> sqlite3.Connection:
        db = self.db
        if db.in_transaction:
            frame = _OPEN.get(id(db))
            if frame is not None and _running(frame):
                self.joined = True
                return db
            _rollback(db)  # a leftover
        key = id(db)
        try:
            db.execute(self.begin)
            _OPEN[key] = sys._getframe(self.depth)
            return db
        except BaseException:
            _OPEN.pop(key, None)
            _rollback(db)
            raise

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if self.joined:
            return
        db = self.db
        try:
            if kind is None:
                try:
                    db.execute("COMMIT")
                except BaseException:
                    _rollback(db)
                    raise
            else:
                _rollback(db)
        finally:
            _OPEN.pop(id(db), None)


def _rollback(db: sqlite3.Connection) -> None:
    if db.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            db.execute("ROLLBACK")


def discard_leftover(db: sqlite3.Connection, force: bool = False) -> None:
    """Roll back a transaction left open on ``db``: one no running ``with immediate(db)``
    block began (an interrupted write), or with ``force`` any (the caller knows its block
    was left)."""
    if not db.in_transaction:
        return
    frame = _OPEN.get(id(db))
    if force or frame is None or not _running(frame):
        _rollback(db)
        _OPEN.pop(id(db), None)
