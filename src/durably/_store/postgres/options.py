"""A PostgreSQL store's URL and its options, and how its connection errors read: which may
go away by themselves (a server restarting) and which will not (a wrong URL or password)."""

from __future__ import annotations

import urllib.parse
from typing import Any

from durably.exceptions import DefinitionError

__all__ = ["OPTIONS", "fix_for", "flag", "message", "reachable_later", "split_url", "whole"]

#: the options durably reads from a postgresql:// URL's query (the rest is libpq's)
OPTIONS = ("schema", "blobs", "allow_unsigned", "inline_limit", "pool_size",
           "prepare_threshold")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def split_url(url: str) -> tuple[str, dict[str, str]]:
    """The URL for libpq (durably's options taken out of its query) and those options."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme.lower() not in ("postgresql", "postgres"):
        raise DefinitionError(
            f"PostgresStore takes a postgresql:// URL, got one of scheme {parts.scheme!r}. "
            "Fix: postgresql://user@host:5432/dbname.")
    mine: dict[str, str] = {}
    rest = []
    for name, value in urllib.parse.parse_qsl(parts.query, keep_blank_values=True):
        if name in OPTIONS:
            mine[name] = value
        elif name in ("key", "signing_key"):
            raise DefinitionError(
                "a postgresql:// store URL gives a signing key; a key has no place in a URL "
                "(it ends up in logs, shell histories and process lists). Fix: set "
                "DURABLY_KEY_FILE (or DURABLY_KEY), or pass key=... in code.")
        else:
            rest.append((name, value))
    return urllib.parse.urlunsplit(parts._replace(
        query=urllib.parse.urlencode(rest, safe="/"))), mine


def whole(value: Any, name: str, least: int = 0) -> int:
    try:
        number = int(str(value).replace("_", "")) if not isinstance(value, int) else value
    except ValueError:
        number = -1
    if isinstance(value, bool) or number < least:
        none = (f", or {name}=none not to prepare statements (behind PgBouncer in transaction "
                "mode)") if name == "prepare_threshold" else ""
        raise DefinitionError(f"PostgresStore: {name}={value!r} is not a whole number of at "
                              f"least {least}{' or none' if none else ''}. Fix: for example "
                              f"{name}=8{none}.")
    return number


def flag(value: str, name: str) -> bool:
    if value.lower() not in _TRUE + _FALSE:
        raise DefinitionError(f"PostgresStore: {name}={value!r} is not true or false. Fix: "
                              f"?{name}=true.")
    return value.lower() in _TRUE


def message(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


#: SQLSTATEs of a prepared statement the server does not have (invalid_sql_statement_name)
#: or has already (duplicate_prepared_statement): a pooler that hands each transaction
#: another server connection, or discards prepared statements (DISCARD ALL)
_PREPARED_STATES = ("26000", "42P05")


def fix_for(exc: BaseException) -> str:
    """The "Fix: ..." of a store error caused by ``exc``: what the error says, else to check
    the server (a dropped connection)."""
    text = str(exc).lower()
    if getattr(exc, "sqlstate", None) in _PREPARED_STATES or "prepared statement" in text:
        return ("Fix: the connection goes through a pooler that does not keep prepared "
                "statements (PgBouncer in transaction mode): add ?prepare_threshold=none to "
                "the store's URL (or pass prepare_threshold=None).")
    if "0x00" in text:  # (a NUL in text: "invalid byte sequence ... 0x00", psycopg's "NUL (0x00)")
        return ("Fix: PostgreSQL text cannot hold a NUL character ('\\x00'): remove it from "
                "the name or text given (a run id, a task's name or version, a thread).")
    return ("Fix: check that the server is up and reachable; a finished step is never lost, "
            "and the run resumes where it stopped once it is back.")


#: what a connection error says when the server may come back by itself (restarting, a
#: network cut): anything else (a wrong host name, user, password or database) fails at once
_TRANSIENT = ("connection refused", "no such file or directory", "server closed the connection",
              "terminating connection", "the database system is starting up",
              "the database system is shutting down", "the database system is in recovery",
              "connection is lost", "connection is closed", "timed out", "timeout expired",
              "could not receive data", "could not send data", "ssl syscall error",
              "eof detected", "consuming input failed", "administrator command",
              "connection is bad", "too many clients")
#: SQLSTATEs of the same: admin shutdown, crash shutdown, cannot connect now, connection
#: exceptions
_TRANSIENT_STATES = ("57P01", "57P02", "57P03", "08000", "08003", "08006")


def reachable_later(exc: BaseException) -> bool:
    """Whether a connection error may go away by itself (the server restarting, a network
    cut), rather than a wrong URL, user or password."""
    if getattr(exc, "sqlstate", None) in _TRANSIENT_STATES:
        return True
    if type(exc).__name__ == "PoolTimeout":  # (no connection came back in time)
        return True
    text = str(exc).lower()
    if any(word in text for word in ("password", "authentication", "does not exist",
                                     "could not translate host name", "invalid ",
                                     "bad value")):  # (the last two: an option's value)
        return False
    return any(word in text for word in _TRANSIENT)
