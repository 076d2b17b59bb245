"""The tables of a PostgreSQL store, in their own schema, and their migrations.

Migrations run when a process first uses the store: under a transaction-scoped advisory
lock (so processes starting at once apply them one at a time, and the second finds them
done), each ``CREATE ... IF NOT EXISTS``, recorded in ``meta`` as the schema's version. A
schema whose version is newer than this durably's is refused: an older durably must not
write tables whose meaning it does not know.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from durably._store.integrity import SigningKey, key_differs
from durably.exceptions import DefinitionError, StoreError

__all__ = ["VERSION", "check_key", "check_schema_name", "migrate"]

#: the schema version this durably writes
VERSION = 2

_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")

#: version -> statements bringing the schema from the version before to it ({s}: the schema)
MIGRATIONS: dict[int, list[str]] = {
    1: [
        "CREATE SEQUENCE IF NOT EXISTS {s}.written",
        """CREATE TABLE IF NOT EXISTS {s}.runs (
            run_id text PRIMARY KEY,
            entrypoint text NOT NULL,
            name text NOT NULL,
            status text NOT NULL,
            created float8 NOT NULL,
            updated float8 NOT NULL,
            attempt integer NOT NULL,
            input_digest text NOT NULL,
            args bytea,
            args_blob text,
            result bytea,
            result_blob text,
            error text,
            written bigint NOT NULL)""",
        "CREATE INDEX IF NOT EXISTS runs_latest ON {s}.runs "
        "(entrypoint, input_digest, updated DESC, written DESC)",
        "CREATE INDEX IF NOT EXISTS runs_updated ON {s}.runs (updated DESC, written DESC)",
        """CREATE TABLE IF NOT EXISTS {s}.steps (
            seq bigserial PRIMARY KEY,
            run_id text NOT NULL,
            step_id text NOT NULL,
            parent_id text,
            task text NOT NULL,
            status text NOT NULL,
            attempt integer NOT NULL,
            position integer NOT NULL,
            started float8 NOT NULL,
            ended float8 NOT NULL,
            error text,
            cache_key text NOT NULL,
            inputs text,
            output text,
            result_digest text NOT NULL,
            input_digests text,
            output_digests text,
            value bytea,
            blob text)""",
        # a record written twice (its statement retried after a dropped connection) is kept
        # once (the tries of a retried step differ by their start)
        "CREATE UNIQUE INDEX IF NOT EXISTS steps_once ON {s}.steps "
        "(run_id, attempt, position, status, step_id, started)",
        "CREATE INDEX IF NOT EXISTS steps_find ON {s}.steps (run_id, step_id)",
        """CREATE TABLE IF NOT EXISTS {s}.events (
            seq bigserial PRIMARY KEY,
            run_id text NOT NULL,
            kind text NOT NULL,
            time float8 NOT NULL,
            attempt integer NOT NULL,
            step_id text,
            key text NOT NULL,
            data bytea,
            blob text)""",
        "CREATE UNIQUE INDEX IF NOT EXISTS events_once ON {s}.events "
        "(run_id, kind, attempt, time, key, coalesce(step_id, ''))",
        """CREATE TABLE IF NOT EXISTS {s}.leases (
            run_id text PRIMARY KEY,
            host text NOT NULL,
            pid integer NOT NULL,
            started bigint,
            token text NOT NULL,
            heartbeat timestamptz NOT NULL)""",
        """CREATE TABLE IF NOT EXISTS {s}.cache (
            key text PRIMARY KEY,
            value bytea,
            blob text,
            size bigint NOT NULL,
            stored float8 NOT NULL)""",
        "CREATE INDEX IF NOT EXISTS cache_stored ON {s}.cache (stored)",
        """CREATE TABLE IF NOT EXISTS {s}.keys (
            cache_key text PRIMARY KEY,
            task text NOT NULL,
            code text NOT NULL,
            inputs jsonb NOT NULL,
            parts jsonb NOT NULL,
            created float8 NOT NULL)""",
        "CREATE INDEX IF NOT EXISTS keys_task ON {s}.keys (task, created DESC)",
        """CREATE TABLE IF NOT EXISTS {s}.set_aside (
            seq bigserial PRIMARY KEY,
            run_id text NOT NULL,
            what text NOT NULL,
            why text NOT NULL,
            row_data jsonb NOT NULL,
            value bytea,
            blob text,
            time float8 NOT NULL)""",
    ],
    # a run's conversation thread (entrypoint.run(..., thread=)), and its runs found by it;
    # the seconds the execution that produced a cache entry took (its key record's
    # duration) and the time a step served from the cache saved (a step record's saved)
    2: [
        "ALTER TABLE {s}.runs ADD COLUMN IF NOT EXISTS thread text",
        "CREATE INDEX IF NOT EXISTS runs_thread ON {s}.runs (thread, updated DESC) "
        "WHERE thread IS NOT NULL",
        "ALTER TABLE {s}.keys ADD COLUMN IF NOT EXISTS duration float8",
        "ALTER TABLE {s}.steps ADD COLUMN IF NOT EXISTS saved float8",
    ],
}


def check_schema_name(schema: Any, where: str) -> str:
    """``schema`` if it is a plain PostgreSQL name durably may create.

    Raises:
        DefinitionError: it is not a str of lower-case letters, digits and ``_`` (at most 63,
            not starting with a digit).

    Example:
        >>> check_schema_name("durably_ci", "schema=")
        'durably_ci'
    """
    if schema in ("public", "information_schema") or (isinstance(schema, str)
                                                       and schema.startswith("pg_")):
        raise DefinitionError(
            f"{where}{schema!r} is a schema of PostgreSQL's own or shared by every "
            "application; durably makes tables named runs, steps, cache and keys in its "
            "schema. Fix: a schema of durably's own, such as schema=\"durably\".")
    if not isinstance(schema, str) or not _NAME.fullmatch(schema):
        raise DefinitionError(
            f"{where}{schema!r} is not a schema name durably can use. Fix: lower-case "
            "letters, digits and _ (at most 63 characters, not starting with a digit), such "
            "as schema=\"durably\" or ?schema=durably_ci.")
    return schema


def migrate(conn: Any, schema: str, where: str) -> str:
    """Bring ``schema``'s tables to :data:`VERSION` (creating the schema), unless they are
    there already; return the store's id (made once, with its tables: the folder of its
    blobs in a blob store several stores may share).

    Raises:
        StoreError: the schema was made by a newer durably, or its version is not durably's.
    """
    _tables(conn, schema, where)
    row = conn.execute(f"SELECT value FROM {schema}.meta WHERE name = 'store_id'").fetchone()
    if row is None:
        conn.execute(f"INSERT INTO {schema}.meta VALUES ('store_id', %s) ON CONFLICT (name) "
                     "DO NOTHING", (uuid.uuid4().hex,))
        row = conn.execute(f"SELECT value FROM {schema}.meta WHERE name = 'store_id'"
                           ).fetchone()
    return str(row[0])


def _tables(conn: Any, schema: str, where: str) -> None:
    found = _version(conn, schema, where)
    if found == VERSION:
        return
    if found is None or found < VERSION:
        with conn.transaction():
            # one process at a time (the others wait, then find the tables made)
            conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                         (f"durably:{schema}",))
            if conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s",
                            (schema,)).fetchone() is None:
                # (only when missing: a user who may not create schemas uses one made for it)
                conn.execute(f"CREATE SCHEMA {schema}")
            conn.execute(f"CREATE TABLE IF NOT EXISTS {schema}.meta "
                         "(name text PRIMARY KEY, value text NOT NULL)")
            row = conn.execute(f"SELECT value FROM {schema}.meta WHERE name = 'version'"
                               ).fetchone()
            found = _number(row[0], schema, where) if row else 0
            for version in range(found + 1, VERSION + 1):
                for statement in MIGRATIONS[version]:
                    conn.execute(statement.format(s=schema))
                conn.execute(f"INSERT INTO {schema}.meta VALUES ('version', %s) ON CONFLICT "
                             "(name) DO UPDATE SET value = excluded.value",
                             (str(max(found, version)),))
    if found is not None and found > VERSION:
        raise StoreError(
            f"the PostgreSQL store {where} (schema {schema!r}) was made by a newer durably "
            f"(schema version {found}; this durably writes version {VERSION}). "
            "Fix: upgrade durably (pip install -U 'durably[postgres]') in every process "
            "that uses this store, or use another schema (?schema=NAME).")


def _version(conn: Any, schema: str, where: str) -> int | None:
    """The schema's version, or None when it has no tables yet."""
    import psycopg

    try:
        row = conn.execute(f"SELECT value FROM {schema}.meta WHERE name = 'version'").fetchone()
    except psycopg.errors.UndefinedTable:
        return None
    except psycopg.errors.InvalidSchemaName:
        return None
    return _number(row[0], schema, where) if row else None


def _number(value: Any, schema: str, where: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise StoreError(
            f"the PostgreSQL store {where}: the table {schema}.meta says its version is "
            f"{value!r}, which is not durably's. Fix: choose a schema of durably's own "
            "(?schema=NAME); this one holds tables of something else.") from None



def check_key(conn: Any, schema: str, where: str, key: SigningKey | None) -> None:
    """Check that ``key`` is the key the store's values are signed with: the id of the
    first key that opened it (:attr:`SigningKey.id`, a hash of the key, as every signature
    carries it) is kept in ``meta`` as ``key_id``; a store without one (made unsigned, or
    by an older durably) takes this key's. Nothing is checked without a key
    (``allow_unsigned``).

    Raises:
        StoreError: the store's values were signed with another key.
    """
    if key is None:
        return
    mine = key.id.hex()
    row = conn.execute(f"SELECT value FROM {schema}.meta WHERE name = 'key_id'").fetchone()
    if row is None:  # (of several processes recording theirs at once, the first wins)
        conn.execute(f"INSERT INTO {schema}.meta VALUES ('key_id', %s) ON CONFLICT (name) "
                     "DO NOTHING", (mine,))
        row = conn.execute(f"SELECT value FROM {schema}.meta WHERE name = 'key_id'"
                           ).fetchone()
    if row[0] != mine:
        raise key_differs(f"the PostgreSQL store {where} (schema {schema!r})", row[0], key)
