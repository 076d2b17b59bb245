"""The statements of every step (its cache lookup, its journal write), sent through libpq
(psycopg's :class:`psycopg.pq.PGconn`) rather than a psycopg cursor.

A cursor's execute costs ~20 us of client CPU per statement (its query conversion, its
prepared-statement bookkeeping, its adapters' lookup and its wait generator, all in
Python); a step's two statements sent here with parameters encoded once per column type
cost ~10 us each (measured with ``time.process_time`` on 20,000 lookups). Each statement is
prepared on its connection after ``prepare_threshold`` uses, as psycopg would (never with
``prepare_threshold=None``: PgBouncer in transaction mode); parameters and results are
binary. The wait for the server polls its socket with a timeout, as psycopg's does, so that
a signal (Ctrl-C) is handled during a statement that hangs. Errors are psycopg's
exceptions, raised as a cursor would raise them, so the store's handling of a dropped
connection is unchanged.
"""

from __future__ import annotations

import re
import select
import struct
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["Hot", "execute"]

_FLOAT8 = struct.Struct("!d")
_BINARY = 1
#: libpq's PGRES_COMMAND_OK and PGRES_TUPLES_OK
_DONE = (1, 2)
_CONNECTION_BAD = 1  # libpq's CONNECTION_BAD
#: the server has no prepared statement of that name (one deallocated by DISCARD ALL)
_NO_STATEMENT = "26000"


#: SQL type -> encoder of a non-null parameter, in binary (text too: its length is sent,
#: where libpq would end a text-format value at a NUL byte instead of refusing it)
_ENCODERS: dict[str, Callable[[Any], bytes]] = {
    "text": str.encode, "int4": struct.Struct("!i").pack, "int8": struct.Struct("!q").pack,
    "float8": _FLOAT8.pack, "bytea": bytes}
#: SQL type -> decoder of a non-null binary result column
_DECODERS: dict[str, Callable[[bytes], Any]] = {
    "text": bytes.decode, "float8": lambda b: _FLOAT8.unpack(b)[0], "bytea": bytes}


class Hot:
    """One such statement: its SQL with ``$n`` parameters, each given a type by a cast or by
    the column it is compared to, and the types of its parameters and result columns.

    Args:
        name: The name it is prepared under on a connection (``durably_...``).
        sql: The statement, ``{s}`` replaced by the schema.
        params: The SQL type of each parameter (``text``, ``int4``, ``int8``, ``float8``,
            ``bytea``), in order.
        columns: The SQL type of each result column (``text``, ``float8``, ``bytea``).

    Example:
        >>> hot = Hot("durably_one", "SELECT value FROM s.cache WHERE key = $1", ("text",),
        ...           ("bytea",))
        >>> hot.encode(["k1"])
        [b'k1']
    """

    __slots__ = ("columns", "decoders", "encoders", "formats", "name", "sql")

    def __init__(self, name: str, sql: str, params: Sequence[str],
                 columns: Sequence[str] = ()) -> None:
        wanted = {int(n) for n in re.findall(r"\$(\d+)", sql)}
        if wanted != set(range(1, len(params) + 1)):
            raise ValueError(f"statement {name}: parameters ${sorted(wanted)} for "
                             f"{len(params)} types")
        self.name = name.encode()
        self.sql = sql.encode()
        self.encoders = tuple(_ENCODERS[t] for t in params)
        self.formats = [_BINARY] * len(params)
        self.columns = tuple(columns)
        self.decoders = tuple(_DECODERS[t] for t in columns)

    def encode(self, params: Sequence[Any]) -> list[bytes | None]:
        """The parameters as libpq takes them (None: NULL)."""
        return [None if v is None else enc(v)
                for enc, v in zip(self.encoders, params, strict=True)]

    def row(self, result: Any) -> tuple[Any, ...] | None:
        """The first row of a result, decoded; None when it has none."""
        if result.ntuples == 0:
            return None
        return tuple(None if (v := result.get_value(0, i)) is None else dec(v)
                     for i, dec in enumerate(self.decoders))


def execute(conn: Any, hot: Hot, params: Sequence[Any], threshold: int | None) -> Any:
    """Run ``hot`` on ``conn`` (a psycopg connection, idle or in a transaction, used by no
    other thread meanwhile) and return its result (a :class:`psycopg.pq.PGresult`, binary).

    Raises:
        psycopg.Error: the statement failed (the server's error, as psycopg raises it), or
            the connection broke (:class:`psycopg.OperationalError`).
    """
    import psycopg

    values = hot.encode(params)
    uses: dict[bytes, int] = conn.__dict__.get("durably_prepared")  # (statement -> uses)
    if uses is None:
        uses = conn.durably_prepared = {}
    n = uses.get(hot.name, 0)
    uses[hot.name] = n + 1
    if threshold is None or n < threshold:
        return _result(conn, lambda pg: pg.send_query_params(
            hot.sql, values, param_formats=hot.formats, result_format=_BINARY))
    if n == threshold:  # (prepared once on this connection, the first time past it)
        _result(conn, lambda pg: pg.send_prepare(hot.name, hot.sql))
    for _ in range(2):
        result = _result(conn, lambda pg: pg.send_query_prepared(
            hot.name, values, param_formats=hot.formats, result_format=_BINARY))
        if result is not None:
            return result
        # the server no longer has it (DISCARD ALL): prepared again
        _result(conn, lambda pg: pg.send_prepare(hot.name, hot.sql))
    raise psycopg.OperationalError(f"the prepared statement {hot.name.decode()} is not kept "
                                   "by the server (a connection pooler discards it)")


def _result(conn: Any, send: Callable[[Any], None]) -> Any:
    """Send a query with ``send(pgconn)`` and wait for its result; None when the server
    has no prepared statement of that name."""
    import psycopg

    pg = conn.pgconn
    send(pg)
    while pg.flush():  # (a large value: the socket's buffer full, written as it empties)
        _wait(pg.socket, write=True)
    first = None
    while True:  # (every result to the query's end, none waited for without a timeout)
        pg.consume_input()
        if pg.is_busy():
            _wait(pg.socket, write=False)
            continue
        result = pg.get_result()
        if result is None:
            break
        first = first or result
    if first is not None and first.status in _DONE:
        return first
    if first is None or pg.status == _CONNECTION_BAD:  # (the connection broke)
        said = first.error_message if first is not None else pg.error_message
        raise psycopg.OperationalError(
            (said or b"the connection is lost").decode(errors="replace").strip())
    error = psycopg.errors.error_from_result(first)
    if error.sqlstate == _NO_STATEMENT:
        return None
    raise error


def _wait(fd: int, *, write: bool) -> None:
    """Wait up to 0.1 s for ``fd`` to be readable (writable), so that a signal is handled
    meanwhile: poll where there is one (select cannot watch a descriptor past 1023, as a
    process with many files open has), select on Windows (which has no such limit)."""
    if _POLL is None:
        select.select([] if write else [fd], [fd] if write else [], [], 0.1)
        return
    poller = _POLL()
    poller.register(fd, select.POLLOUT if write else select.POLLIN)
    poller.poll(100)


_POLL = getattr(select, "poll", None)
