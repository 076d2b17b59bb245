"""The journal's upgrade: its tables created, or upgraded in place from an older format
(:data:`~durably._store.disk.store.JOURNAL_FORMAT` says what each format changed)."""

from __future__ import annotations

import sqlite3

from durably._store.disk.repair import seal_old_blobs
from durably._store.disk.rows import (
    COLUMNS_8,
    SCHEMA,
    SCHEMA_2,
    SCHEMA_3,
    SCHEMA_4,
    SCHEMA_5,
    SCHEMA_5_KEYS,
    SCHEMA_6,
    SCHEMA_6_EVENTS,
    SCHEMA_6_LEASES,
    SCHEMA_8,
    immediate,
    row_hash_sql,
)
from durably._store.integrity import SigningKey

__all__ = ["upgrade"]


def upgrade(con: sqlite3.Connection, key: SigningKey | None, version_due: int) -> None:
    """Create the journal's tables, or upgrade them from an older format to
    ``version_due``, in one transaction (a racing process sees the new format and does
    nothing). Format 3 seals the blobs of older journals (signing them with ``key``, the
    key in use: trust on upgrade)."""

    with immediate(con):
        version = con.execute("PRAGMA user_version").fetchone()[0]
        if version >= version_due:
            return
        for statement in SCHEMA.split(";"):
            if statement.strip():
                con.execute(statement)
        if version < 2:
            columns = {row[1] for row in con.execute("PRAGMA table_info(steps)")}
            for statement in SCHEMA_2.split(";"):
                statement = statement.strip()
                if not statement:
                    continue
                column = statement.split()[5] if statement.startswith("ALTER") else None
                if column is None or column not in columns:
                    con.execute(statement)
        con.execute(SCHEMA_3)
        for statement in SCHEMA_4.split(";"):
            if statement.strip():
                con.execute(statement)
        if 1 <= version < 3:
            seal_old_blobs(con, key)
        con.create_function("durably_row_hash", 1, row_hash_sql, deterministic=True)
        if "sid" not in {row[1] for row in con.execute("PRAGMA table_info(steps)")}:
            con.execute("ALTER TABLE steps ADD COLUMN sid INTEGER")
        keyed = "kid" in {row[1] for row in con.execute("PRAGMA table_info(keys)")}
        for statement in (SCHEMA_5 + ";" + ("" if keyed else SCHEMA_5_KEYS)).split(";"):
            if statement.strip():
                con.execute(statement)
        made = dict(con.execute(
            "SELECT name, sql FROM sqlite_master WHERE type='table' AND name IN "
            "('events', 'leases')").fetchall())
        for schema, due in ((SCHEMA_6_EVENTS, "AUTOINCREMENT" in made["events"]),
                            (SCHEMA_6_LEASES, "WITHOUT ROWID" not in made["leases"]),
                            (SCHEMA_6, True)):
            for statement in schema.split(";") if due else ():
                if statement.strip():
                    con.execute(statement)
        for table, column, kind in COLUMNS_8:
            if column not in {row[1] for row in con.execute(f"PRAGMA table_info({table})")}:
                con.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
        con.execute(SCHEMA_8)
        con.execute(f"PRAGMA user_version={version_due}")

