"""The PostgreSQL store against a real server: opening it (keys, options, migrations from
several processes, a schema of a newer durably), passwords, fencing raced by a stale writer,
a server restart in the middle of a run, and the round trips of a step.

The server: ``$DURABLY_TEST_POSTGRES`` (``eval "$(.ci/postgres start)"``; see
postgres_server.py). Without it these tests skip, except in CI, where they fail.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import entrypoint, task
from durably._store import lease as _lease
from durably._store.postgres import PostgresStore
from durably._store.postgres.schema import VERSION
from durably.exceptions import DefinitionError, StoreError
from durably.store import KeyRecord, RunRecord, StepRecord, value_bytes

from .postgres_server import (
    drop_schemas,
    fresh_schema,
    server_setting,
    server_url,
    with_schema,
)

KEY = b"k" * 32


@pytest.fixture
def schemas() -> Iterator[list[str]]:
    made: list[str] = []
    yield made
    drop_schemas(server_url(), made)


@pytest.fixture
def pg(schemas: list[str]) -> Iterator[PostgresStore]:
    schema = fresh_schema()
    schemas.append(schema)
    store = PostgresStore(with_schema(server_url(), schema), key=KEY)
    durably.configure(store=store)
    yield store
    durably.configure()
    store.close()


def _table_text(store: PostgresStore) -> str:
    """Every row of every table of the store's schema, as text."""
    import psycopg

    with psycopg.connect(server_url(), autocommit=True) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
            (store.schema,))]
        return "".join(
            str(conn.execute(f"SELECT string_agg(t::text, '') FROM {store.schema}.{t} t"
                             ).fetchone()[0]) for t in tables)


# -- opening --------------------------------------------------------------------------------
def test_a_store_without_a_key_is_refused_unless_unsigned_is_allowed(
        schemas: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DURABLY_KEY", raising=False)
    monkeypatch.delenv("DURABLY_KEY_FILE", raising=False)
    durably.configure()
    schema = fresh_schema()
    schemas.append(schema)
    url = with_schema(server_url(), schema)
    unsigned = durably.open_store(url)  # (nothing connects before its first use)
    with pytest.raises(StoreError) as caught:
        unsigned.check()
    message = str(caught.value)
    assert "signing key" in message and "DURABLY_KEY_FILE" in message
    assert "allow_unsigned" in message and "token_hex" in message
    assert durably.open_store(url + "&allow_unsigned=true").allow_unsigned
    assert PostgresStore(url, allow_unsigned=True).signing_key is None
    with pytest.raises(StoreError, match="signing key"):
        unsigned.cache_get("any")
    durably.configure(key=KEY)  # the process's key is enough
    durably.open_store(url).check()
    durably.configure()
    durably.configure(key=KEY, store=url)  # (the key is set before the store opens)
    durably.configure()


def test_a_key_set_in_code_travels_with_the_store_to_workers(
        schemas: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import pickle

    monkeypatch.delenv("DURABLY_KEY", raising=False)
    monkeypatch.delenv("DURABLY_KEY_FILE", raising=False)
    schema = fresh_schema()
    schemas.append(schema)
    durably.configure(key=KEY)
    store = durably.open_store(with_schema(server_url(), schema))
    sent = pickle.dumps(store)  # (as to a worker, where no key is configured)
    durably.configure()
    again = pickle.loads(sent)
    from durably._store.integrity import key_from

    assert again.signing_key is not None and again.signing_key.id == key_from(KEY, "k").id
    again.check()


def test_bad_options_are_named(schemas: list[str]) -> None:
    base = server_url()
    with pytest.raises(DefinitionError, match="schema"):
        PostgresStore(with_schema(base, "Bad-Name"), key=KEY)
    with pytest.raises(DefinitionError, match="inline_limit"):
        PostgresStore(base, key=KEY, inline_limit=-1)
    with pytest.raises(DefinitionError, match="allow_unsigned"):
        PostgresStore(base + "&allow_unsigned=maybe")
    with pytest.raises(DefinitionError, match="no place in a URL"):
        PostgresStore(base + "&key=abcdefabcdefabcdefabcdef")
    store = PostgresStore(base + "&prepare_threshold=none&pool_size=3", key=KEY)
    assert store.prepare_threshold is None and store.pool_size == 3
    assert "prepare_threshold=none" in store.url and "pool_size=3" in store.url
    # libpq's options, given wrong: said at once, naming the option (one hung for ever,
    # another asked to GRANT CREATE)
    for option, said in (("connect_timeout=abc", "connect_timeout"),
                         ("bogus=1", "bogus"), ("sslmode=bogus", "sslmode")):
        schema = fresh_schema()
        schemas.append(schema)
        wrong = PostgresStore(with_schema(base, schema) + "&" + option, key=KEY)
        with pytest.raises(StoreError, match=said) as caught:
            wrong.check()
        assert "GRANT" not in str(caught.value)
        wrong.close()


def test_a_server_that_cannot_be_reached_is_a_store_error_without_the_password(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from durably._store.postgres import connections as _pg

    monkeypatch.setattr(_pg, "OPEN_SECONDS", 1.0)  # (10 s: a server starting up)
    store = PostgresStore("postgresql://ada:s3cret@127.0.0.1:1/nothing?connect_timeout=2",
                          key=KEY)
    started = time.monotonic()
    with pytest.raises(StoreError) as caught:
        store.check()
    assert "s3cret" not in str(caught.value) and "ada:***@" in str(caught.value)
    assert "cannot connect" in str(caught.value)
    assert time.monotonic() - started < 120


def test_the_tables_live_in_their_own_schema(pg: PostgresStore) -> None:
    @task
    def double(x: int) -> int:
        return 2 * x

    assert double(4) == 8
    import psycopg

    with psycopg.connect(server_url(), autocommit=True) as conn:
        tables = {r[0] for r in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
            (pg.schema,))}
        version = conn.execute(f"SELECT value FROM {pg.schema}.meta WHERE name = 'version'"
                               ).fetchone()
    assert {"runs", "steps", "events", "leases", "cache", "keys", "meta"} <= tables
    assert version == (str(VERSION),)


def test_a_schema_made_by_a_newer_durably_is_refused(pg: PostgresStore) -> None:
    pg.check()
    pg._write("make it newer", pg._sql("UPDATE {s}.meta SET value = '99' WHERE name = "
                                       "'version'"))
    again = PostgresStore(pg.url, key=KEY)
    with pytest.raises(StoreError, match="newer durably") as caught:
        again.check()
    assert "99" in str(caught.value) and "upgrade durably" in str(caught.value)


def test_a_schema_of_version_1_gains_the_thread_column(pg: PostgresStore) -> None:
    """A store made before runs had threads (schema version 1): its runs are kept and read
    without a thread, and a call on a thread records one once the schema is upgraded; its
    key records and steps gain the duration of an entry's execution and the time a hit
    saved (0.0 for the rows written before)."""
    @durably.entrypoint
    def job(x: int, *, previous: int = 0) -> int:
        return previous + x

    old = job.run(1)
    pg._write("make it version 1", pg._sql(
        "DROP INDEX {s}.runs_thread; ALTER TABLE {s}.runs DROP COLUMN thread; "
        "ALTER TABLE {s}.keys DROP COLUMN duration; ALTER TABLE {s}.steps DROP COLUMN saved; "
        "UPDATE {s}.meta SET value = '1' WHERE name = 'version'"))
    again = PostgresStore(pg.url, key=KEY)
    durably.configure(store=again)
    try:
        found = again.find_run(old.id)
        assert found is not None and found.thread is None
        assert [job.run(x, thread="t").result for x in (2, 3)] == [2, 5]
        assert [r.thread for r in again.list_thread_runs("t")] == ["t", "t"]
        assert again.list_steps(old.id) == []  # (read with the new column: none missing)
        info = KeyRecord("m:t", "k" * 32, "code", {}, {}, 1000.0, 1.5)
        again.cache_put(info.cache_key, b"v", info)
        assert again.cache_get_timed(info.cache_key) == (b"v", 1.5)
        assert again.find_key("m:t", info.cache_key) == info
    finally:
        again.close()


def _open_and_write(url: str, n: int) -> int:
    store = PostgresStore(url, key=KEY)
    store.cache_put(f"key-{n}", b"value")
    found = store.cache_get(f"key-{n}")
    store.close()
    return 1 if found is not None else 0


def test_migrations_run_once_from_several_processes_at_once(schemas: list[str]) -> None:
    schema = fresh_schema()
    schemas.append(schema)
    url = with_schema(server_url(), schema)
    with multiprocessing.get_context("spawn").Pool(6) as pool:
        assert pool.starmap(_open_and_write, [(url, n) for n in range(6)]) == [1] * 6
    store = PostgresStore(url, key=KEY)
    assert len(store._read("keys", store._sql("SELECT key FROM {s}.cache"))) == 6
    meta = dict(store._read("meta", store._sql("SELECT name, value FROM {s}.meta")))
    assert sorted(meta) == ["key_id", "store_id", "version"]
    assert meta["version"] == str(VERSION)
    assert meta["key_id"] == store.signing_key.id.hex()  # type: ignore[union-attr]
    store.close()


# -- passwords ------------------------------------------------------------------------------
def _tcp() -> tuple[str, str]:
    server_url()  # (skips without a server, or fails in CI)
    what = "no password role on the test server"
    return (server_setting("DURABLY_TEST_POSTGRES_TCP", what),
            server_setting("DURABLY_TEST_POSTGRES_PASSWORD", what))


@pytest.mark.parametrize("where", ["url", "PGPASSWORD", "pgpass"])
def test_a_password_is_never_written_into_the_store_or_the_logs(
        where: str, schemas: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    url, password = _tcp()
    schema = fresh_schema()
    schemas.append(schema)
    monkeypatch.delenv("PGPASSWORD", raising=False)
    if where == "url":
        url = url.replace("@", f":{password}@", 1)
    elif where == "PGPASSWORD":
        monkeypatch.setenv("PGPASSWORD", password)
    else:
        pgpass = tmp_path / "pgpass"
        pgpass.write_text(f"*:*:*:*:{password}\n")
        pgpass.chmod(0o600)
        monkeypatch.setenv("PGPASSFILE", str(pgpass))
    caplog.set_level(logging.DEBUG, logger="durably")
    store = durably.open_store(with_schema(url, schema), key=KEY)
    durably.configure(store=store)

    @task
    def shout(text: str) -> str:
        return text.upper()

    @entrypoint
    def job(text: str) -> str:
        return shout(text) + "!"

    assert job.run("hi", run_id="pw").result == "HI!"
    assert durably.get_run("pw").status == "finished"
    shown = [store.where, repr(store), *(r.getMessage() for r in caplog.records),
             _table_text(store), repr(durably.get_run("pw"))]
    assert not any(password in text for text in shown)
    if where == "url":
        assert ":***@" in store.where
    durably.configure()
    store.close()


def test_a_wrong_password_is_a_store_error_that_does_not_show_it(schemas: list[str]) -> None:
    url, password = _tcp()
    wrong = url.replace("@", ":not-the-password@", 1)
    with pytest.raises(StoreError) as caught:
        PostgresStore(wrong, key=KEY).check()
    assert "not-the-password" not in str(caught.value) and password not in str(caught.value)
    assert "password" in str(caught.value)


# -- fencing --------------------------------------------------------------------------------
def _stale_writer(url: str, run_id: str, writer: int, refusals: int) -> list[tuple[str, bool]]:
    """Append steps of attempt 1 as fast as it can until the store has refused ``refusals``
    of them (the run was taken over): each (step id, whether the store said it was
    written). Bounded by the race, never by a clock."""
    store = PostgresStore(url, key=KEY)
    said = []
    n = refused = 0
    while refused < refusals and n < 1_000_000:
        step = f"w{writer}-{n}"
        rec = StepRecord(run_id, step, None, "t", "ran", 1, writer * 1_000_000 + n,
                         float(n), float(n))
        ok = store.append_steps_if_current([(rec, b"v")])
        said.append((step, ok))
        refused += not ok
        n += 1
    store.close()
    return said


def test_a_takeover_raced_by_stale_writers_lets_none_of_their_steps_in_after_it(
        pg: PostgresStore) -> None:
    """Three processes journal steps of attempt 1 as fast as they can while the run is taken
    over (its record moved to attempt 2): every step the store accepted is there, none it
    refused is, and the steps of attempt 1 seen just after the takeover are all there will
    ever be — no write in flight lands after it."""
    run_id = "raced"
    pg.put_run(RunRecord(run_id, "m:job", "job", "running", 1.0, 1.0, 1, "d"))
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        pending = pool.starmap_async(_stale_writer, [(pg.url, run_id, w, 20)
                                                     for w in range(3)])
        deadline = time.monotonic() + 120
        # (every writer in full flow: 20 steps each accepted, whatever the machine's load)
        while time.monotonic() < deadline and not all(
                sum(s.step_id.startswith(f"w{w}-") for s in pg.list_steps(run_id)) >= 20
                for w in range(3)):
            time.sleep(0.01)
        taken = pg.put_run_if_current(
            RunRecord(run_id, "m:job", "job", "running", 1.0, 2.0, 2, "d"), previous=1)
        assert taken
        after_takeover = {s.step_id for s in pg.list_steps(run_id, attempt=1)}
        said = [item for part in pending.get(timeout=120) for item in part]
    final = {s.step_id for s in pg.list_steps(run_id, attempt=1)}
    accepted = {step for step, ok in said if ok}
    refused = {step for step, ok in said if not ok}
    assert len(accepted) >= 60 and len(refused) == 60  # (writes on both sides of it)
    assert final == after_takeover == accepted
    assert not refused & final


def test_a_step_written_again_is_accepted_once_and_a_stale_one_is_refused(
        pg: PostgresStore) -> None:
    """A step's journal write run again (its statement retried after a dropped connection:
    the record is there already, nothing is inserted) is still accepted and kept once;
    the same write after the run moved to a later attempt is refused."""
    pg.put_run(RunRecord("again", "m:job", "job", "running", 1.0, 1.0, 1, "d"))
    step = StepRecord("again", "s0", None, "m:t", "ran", 1, 0, 1.0, 2.0, cache_key="k")
    assert pg.append_steps_if_current([(step, b"v")])
    assert pg.append_steps_if_current([(step, b"v")])
    assert [s.step_id for s in pg.list_steps("again")] == ["s0"]
    assert pg.put_run_if_current(RunRecord("again", "m:job", "job", "running", 1.0, 2.0, 2,
                                           "d"), previous=1)
    assert not pg.append_steps_if_current([(step, b"v")])
    late = StepRecord("again", "s1", None, "m:t", "ran", 1, 1, 3.0, 4.0, cache_key="k1")
    assert not pg.append_steps_if_current([(late, b"w")])
    assert [s.step_id for s in pg.list_steps("again")] == ["s0"]
    assert not pg.append_steps_if_current([(StepRecord(
        "never", "s0", None, "m:t", "ran", 1, 0, 1.0, 2.0, cache_key="k"), b"v")])


def test_a_step_s_statements_survive_their_prepared_statements_being_discarded(
        pg: PostgresStore) -> None:
    """A step's statements prepared on a connection, then dropped by the server (DISCARD
    ALL, as a pooler's reset does), are prepared again: the steps go on."""
    @task
    def triple(i: int) -> int:
        return 3 * i

    @entrypoint
    def job(n: int) -> int:
        return sum(triple(i) for i in range(n))

    def prepared(conn: Any) -> list[str]:
        return [row[0] for row in conn.execute("SELECT name FROM pg_prepared_statements")
                if row[0].startswith("durably_")]

    def discard(conn: Any) -> list[str]:
        names = prepared(conn)
        conn.execute("DISCARD ALL")
        return names

    assert job.run(12, run_id="before").result == sum(3 * i for i in range(12))
    # (both connections kept idle, taken at once: each loses its statements)
    dropped = pg._do("discard", lambda one: discard(one) + pg._do("discard", discard))
    assert "durably_step" in dropped
    run = job.run(12, run_id="after")
    assert run.result == sum(3 * i for i in range(12)) and run.counts()["cached"] == 12
    counts = job.run(14, run_id="more").counts()
    assert (counts["cached"], counts["ran"]) == (12, 2)
    assert "durably_step" in pg._do("look", prepared)


def test_statements_a_pooler_discards_each_time_say_to_turn_preparing_off(
        schemas: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Behind a pooler that hands every statement another server connection (PgBouncer in
    transaction mode), a prepared statement is never there when it is used: the StoreError
    says to add ?prepare_threshold=none, and with it the same run goes through."""
    from durably._store.postgres import hot

    real = hot._result

    def pooled(conn: Any, send: Any) -> Any:  # (as if each statement went to a fresh one)
        conn.pgconn.exec_(b"DEALLOCATE ALL")
        return real(conn, send)

    monkeypatch.setattr(hot, "_result", pooled)

    @task
    def triple(i: int) -> int:
        return 3 * i

    @entrypoint
    def job(n: int) -> int:
        return sum(triple(i) for i in range(n))

    schema = fresh_schema()
    schemas.append(schema)
    url = with_schema(server_url(), schema)
    for given, works in ((url, False), (url + "&prepare_threshold=none", True)):
        store = PostgresStore(given, key=KEY)
        durably.configure(store=store)
        if works:
            assert job.run(20, run_id="pooled").result == sum(3 * i for i in range(20))
        else:
            with pytest.raises(StoreError, match="is not kept by the server") as caught:
                job.run(20, run_id="pooled")
            assert "Fix: " in str(caught.value) and "?prepare_threshold=none" in str(
                caught.value.args[0].partition("Fix: ")[2])
            assert "PgBouncer in transaction mode" in str(caught.value)
        durably.configure()
        store.close()


def test_bad_options_in_the_url_say_how_to_write_them() -> None:
    """(No server needed: refused before connecting.)"""
    with pytest.raises(DefinitionError, match=r"^\?schema='Bad-Name' is not a schema name"):
        durably.open_store("postgresql://ada@db.example/app?schema=Bad-Name")
    with pytest.raises(DefinitionError, match=r"^schema='Bad-Name' is not a schema name"):
        PostgresStore("postgresql://ada@db.example/app", schema="Bad-Name")
    with pytest.raises(DefinitionError, match="prepare_threshold='maybe'") as caught:
        durably.open_store("postgresql://ada@db.example/app?prepare_threshold=maybe")
    assert "prepare_threshold=none" in str(caught.value) and "PgBouncer" in str(caught.value)


def test_a_text_with_a_nul_byte_is_refused_not_cut(pg: PostgresStore) -> None:
    """libpq ends a text-format parameter at a NUL byte; a step's statements send theirs in
    binary, which the server refuses instead of keeping the text cut short."""
    with pytest.raises(StoreError, match="could not read the cache") as caught:
        pg.cache_get("key\x00tail")
    assert "Fix: PostgreSQL text cannot hold a NUL character" in str(caught.value)
    pg.put_run(RunRecord("nul", "m:job", "job", "running", 1.0, 1.0, 1, "d"))
    step = StepRecord("nul", "s0", None, "m:t", "ran", 1, 0, 1.0, 2.0, cache_key="k",
                      inputs="x='a\x00b'")
    with pytest.raises(StoreError, match="could not journal a step"):
        pg.append_steps_if_current([(step, b"v")])
    assert pg.list_steps("nul") == []


def test_a_step_s_statements_work_on_a_socket_past_descriptor_1023(
        schemas: list[str]) -> None:
    """A process with over a thousand files open (a Dask worker, a server) gets sockets
    past 1023, which select() cannot watch: a step's statements wait with poll()."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 1200
    if hard != resource.RLIM_INFINITY and hard < wanted + 100:
        pytest.skip(f"this process may open {hard} files at most")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted + 100), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(wanted)]
    schema = fresh_schema()
    schemas.append(schema)
    store = PostgresStore(with_schema(server_url(), schema), key=KEY, prepare_threshold=0)
    durably.configure(store=store)
    try:
        @task
        def inc(i: int) -> int:
            return i + 1

        @entrypoint
        def job(n: int) -> int:
            return sum(inc(i) for i in range(n))

        assert store._do("socket", lambda conn: conn.pgconn.socket) > 1023
        assert job.run(5, run_id="high").result == 15
        assert job.run(6, run_id="higher").counts()["cached"] == 5
    finally:
        durably.configure()
        store.close()
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# -- a server restart -------------------------------------------------------------------------
def _server_ctl() -> str:
    """The command that restarts, stops or starts the test server (``CTL restart``)."""
    server_url()
    return server_setting("DURABLY_TEST_POSTGRES_CTL",
                          "the test server cannot be restarted from here")


def _ctl(command: str, action: str) -> None:
    subprocess.run(f"{command} {action}", shell=True, check=True, capture_output=True,
                   timeout=120)


@pytest.mark.slow
def test_a_run_goes_on_across_a_server_restart_and_no_step_executes_twice(
        pg: PostgresStore) -> None:
    command = _server_ctl()
    executed: list[int] = []
    started = pg._one("ask", "SELECT pg_postmaster_start_time()")[0]

    @task(cache=False)
    def work(i: int) -> int:
        executed.append(i)
        if i == 3:  # the server restarts in the middle of the run (every connection drops)
            _ctl(command, "restart")
        return i * i

    @entrypoint
    def job(n: int) -> list[int]:
        return [work(i) for i in range(n)]

    assert job.run(8, run_id="restart").result == [i * i for i in range(8)]
    assert executed == list(range(8))
    assert pg._one("ask", "SELECT pg_postmaster_start_time()")[0] > started  # (restarted)
    assert [s.status for s in pg.list_steps("restart")] == ["ran"] * 8
    executed.clear()
    assert job.run(8, run_id="restart").result == [i * i for i in range(8)]
    assert executed == []  # resumed: everything replayed


@pytest.mark.slow
def test_a_run_cut_by_a_server_outage_fails_clearly_and_resumes_exactly_after_it(
        pg: PostgresStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server stops in the middle of a run and stays down longer than durably waits:
    the run fails with a StoreError that says what happened (it could not reconnect); once
    the server is back, a rerun replays the steps journaled before the outage and executes
    only the others."""
    from durably._store.postgres import connections as _pg

    command = _server_ctl()
    monkeypatch.setattr(_pg, "RETRY_SECONDS", 2.0)
    executed: list[int] = []

    @task(cache=False)
    def work(i: int) -> int:
        executed.append(i)
        if i == 3 and len(executed) == 4:
            _ctl(command, "stop")
        return i * i

    @entrypoint
    def job(n: int) -> list[int]:
        return [work(i) for i in range(n)]

    try:
        with pytest.raises(StoreError) as caught:
            job.run(8, run_id="outage")
    finally:
        _ctl(command, "start")
    assert "could not" in str(caught.value) and "server is up" in str(caught.value)
    # the cause in front (it could not reconnect), not the lease it then could not release
    assert "could not reconnect in 2 s" in str(caught.value), caught.value
    assert "lease" not in str(caught.value)
    assert executed == [0, 1, 2, 3]
    executed.clear()
    assert job.run(8, run_id="outage").result == [i * i for i in range(8)]
    assert executed == [3, 4, 5, 6, 7]  # step 3's end was never journaled: only it again
    ran = [s.step_id for s in pg.list_steps("outage") if s.status == "ran"]
    assert len(ran) == len(set(ran)) == 8


_DROPPED = """
import os, sys, psycopg, durably
from durably._store.postgres import PostgresStore
url, server = sys.argv[1:]
store = PostgresStore(url, key=b"k" * 32)
durably.configure(store=store)

def drop_connections():  # (as a server restart or a network cut does)
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                     "backend_type = 'client backend' AND pid <> pg_backend_pid() "
                     "AND usename = current_user")

@durably.task
def work(i: int) -> int:
    if i in (2, 5):
        drop_connections()
    return i * 10

@durably.entrypoint
def job(n: int) -> list[int]:
    return [work(i) for i in range(n)]

print(job.run(8).result)
store.close()
"""


def test_dropped_connections_print_nothing_on_stderr(
        schemas: list[str], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A process whose connections are dropped twice in a run (a server restart, a network
    cut) reconnects and prints its result, and nothing on stderr: psycopg_pool's warnings
    about durably's pool ("discarding closed connection", "couldn't stop thread ... within
    0 seconds") are demoted to DEBUG; another pool's warnings are left as they are."""
    schema = fresh_schema()
    schemas.append(schema)
    script = tmp_path / "dropped.py"
    script.write_text(_DROPPED)
    done = subprocess.run([sys.executable, str(script), with_schema(server_url(), schema),
                           server_url()],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str([i * 10 for i in range(8)])
    assert done.stderr == ""
    # in this process: the same warnings of durably's pool reach a DEBUG handler as DEBUG;
    # another pool's (or an ERROR) stay as they are
    caplog.set_level(logging.DEBUG, logger="psycopg.pool")
    store = PostgresStore(with_schema(server_url(), schema), key=KEY)
    store.check()
    pool_log = logging.getLogger("psycopg.pool")
    pool_log.warning("error connecting in %r: %s", f"durably {schema}", "gone")
    pool_log.warning("error connecting in %r: %s", "mine", "gone")
    pool_log.error("something else in %r", f"durably {schema}")
    assert [(r.levelname, r.getMessage()[:24]) for r in caplog.records
            if r.name == "psycopg.pool" and ("gone" in r.getMessage() or "else" in r.getMessage())
            ] == [("DEBUG", "error connecting in 'dur"), ("WARNING", "error connecting in 'min"),
                  ("ERROR", "something else in 'durab")]
    store.close()


_STOPPED = """
import os, signal, sys, durably
from durably._store.postgres import PostgresStore
from durably._store.postgres import connections
signal.signal(signal.SIGINT, signal.default_int_handler)
if len(sys.argv) > 2:  # (the stop path's wait for a lock as long as the test holds it)
    connections.STOPPING_LOCK_SECONDS = float(sys.argv[2])
durably.configure(store=PostgresStore(sys.argv[1], key=b"k" * 32))

@durably.task
def square(i: int) -> int:
    return i * i

@durably.entrypoint
def job(n: int) -> int:
    return sum(square(i) for i in range(n))

print(job.run(20, run_id="stopped").result)
"""


def _waiting_for_a_lock(server: str, besides: int) -> set[int]:
    import psycopg

    with psycopg.connect(server, autocommit=True) as conn:
        return {row[0] for row in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid <> %s",
            (besides,))}


def _until_waiting(server: str, besides: int, proc: subprocess.Popen[str],
                   not_among: set[int]) -> set[int]:
    """The backends waiting for a lock once one not among ``not_among`` is (polled: the
    state is what is waited for, not a time)."""
    while True:
        waiting = _waiting_for_a_lock(server, besides)
        if waiting - not_among:
            return waiting
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)


@pytest.mark.parametrize("twice", [False, True])
def test_ctrl_c_while_a_statement_waits_for_a_lock_ends_the_process(
        twice: bool, schemas: list[str], tmp_path: Path) -> None:
    """A step's write waits for a lock another connection holds (LOCK TABLE steps); Ctrl-C
    stops the process while the lock is still held: the stop path's statements wait a few
    seconds at most for it (its end, or its count of steps, then given up), and the person
    sees the two lines, no traceback. With the stop path's wait made as long as the lock,
    a second Ctrl-C ends the process with one short message. Once the lock is released,
    the same command finishes the run."""
    import psycopg

    schema = fresh_schema()
    schemas.append(schema)
    url = with_schema(server_url(), schema)
    PostgresStore(url, key=KEY).check()  # (its tables made)
    script = tmp_path / "stopped.py"
    script.write_text(_STOPPED)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    holder = psycopg.connect(server_url())
    try:
        holder.execute(f"LOCK TABLE {schema}.steps IN ACCESS EXCLUSIVE MODE")
        me = holder.info.backend_pid
        proc = subprocess.Popen([sys.executable, str(script), url, *(["600"] if twice else [])],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env)
        try:
            first = _until_waiting(server_url(), me, proc, set())  # (its step's write)
            proc.send_signal(signal.SIGINT)
            if twice:
                _until_waiting(server_url(), me, proc, first)  # (the stop path, waiting)
                proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=120)  # (the lock still held meanwhile)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    finally:
        holder.rollback()
        holder.close()
    assert proc.returncode in (-signal.SIGINT, 130), err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    if twice:
        assert err.startswith("durably: Ctrl-C again: run 'stopped'"), err
        assert len(err.splitlines()) == 2, err
    else:
        assert err.startswith("durably: Ctrl-C stopped run 'stopped'"), err
    done = subprocess.run([sys.executable, str(script), url], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(sum(i * i for i in range(20)))


# -- round trips ----------------------------------------------------------------------------
class _Counting:
    """Counts the statements sent to the server (each is one round trip: autocommit): at
    the cursor, which every statement goes through (``Connection.execute`` makes one),
    and where the store sends a step's statements, which go through libpq instead
    (``PostgresStore._hot``; their preparing on a connection, one more round trip once a
    connection, is not counted)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import psycopg

        self.count = 0
        self.statements: list[str] = []
        real = psycopg.Cursor.execute
        real_hot = PostgresStore._hot

        def execute(cur: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            self.count += 1
            self.statements.append(str(query)[:60])
            return real(cur, query, *args, **kwargs)

        def hot(store: PostgresStore, what: str, *args: Any) -> Any:
            self.count += 1
            self.statements.append(what)
            return real_hot(store, what, *args)

        monkeypatch.setattr(psycopg.Cursor, "execute", execute)
        monkeypatch.setattr(PostgresStore, "_hot", hot)


def test_an_executed_step_is_one_round_trip_and_a_hit_is_one(
        pg: PostgresStore, monkeypatch: pytest.MonkeyPatch) -> None:
    @task(cache=False)
    def act(i: int) -> int:
        return i + 1

    @task
    def square(i: int) -> int:
        return i * i

    @entrypoint
    def job(n: int) -> int:
        return sum(act(i) for i in range(n))

    job.run(1, run_id="warm")  # (the pool and the tables are made)
    square(0)
    counting = _Counting(monkeypatch)
    job.run(10, run_id="ten")
    ten = counting.count
    counting.count = 0
    job.run(30, run_id="thirty")
    assert counting.count - ten == 20, counting.statements  # one statement a step
    counting.count = 0
    assert square(0) == 0  # a hit
    assert counting.count == 1, counting.statements


def test_a_cache_hit_inside_a_run_is_one_round_trip(
        pg: PostgresStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step served from the cache inside a new run costs its lookup alone: its journal
    row is buffered (RunContext.note_cached) and written with the others in a batch. (A
    task of a script run as ``python job.py`` and the same module imported are two tasks,
    ``__main__.job`` and ``job``: the second executes, it does not hit.)"""
    @task
    def square(i: int) -> int:
        return i * i

    @entrypoint
    def job(n: int, run: str) -> int:
        return sum(square(i) for i in range(n))

    job.run(1000, "first", run_id="first")  # (executes; the pool and the tables are made)
    job.run(10, "warm", run_id="warm")
    counting = _Counting(monkeypatch)
    run = job.run(1000, "hits", run_id="hits")
    assert run.result == sum(i * i for i in range(1000))
    assert run.counts()["cached"] == 1000 and run.counts()["ran"] == 0
    lookups = counting.statements.count("read the cache")
    assert lookups == 1000, counting.statements[:20]
    # the run's start, its end and its journal rows in a batch: a few statements in all
    assert counting.count - lookups < 20, [s for s in counting.statements
                                           if s != "read the cache"]
    assert len([s for s in pg.list_steps("hits") if s.status == "cached"]) == 1000


def test_resuming_a_long_run_reads_its_journal_in_pages(
        pg: PostgresStore, monkeypatch: pytest.MonkeyPatch) -> None:
    @task(cache=False)
    def act(i: int) -> int:
        return i

    @entrypoint
    def job(n: int) -> int:
        return sum(act(i) for i in range(n))

    assert job.run(3000, run_id="long").result == sum(range(3000))
    counting = _Counting(monkeypatch)
    assert job.run(3000, run_id="long").result == sum(range(3000))
    assert counting.count < 40, counting.statements  # pages of 2,000, replays in batches


def test_a_lease_heartbeat_is_the_server_s_clock(pg: PostgresStore,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A client whose clock is an hour ahead still sees a lease of another host renewed a
    moment ago as live: its age is measured on the server."""
    owner = _lease.Owner("elsewhere", 4242, None, "t" * 32, time.time())
    assert pg.acquire_run("clock", owner) is None
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 3600)
    holder = pg.run_holder("clock")
    assert holder is not None and holder.token == owner.token


def test_threads_share_the_pool_without_errors(pg: PostgresStore) -> None:
    errors: list[BaseException] = []

    def hammer(n: int) -> None:
        try:
            for i in range(50):
                pg.cache_put(f"{n}-{i}", b"x" * i)
                assert pg.cache_get(f"{n}-{i}") == b"x" * i
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=hammer, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert pg.cache_stats()["entries"] == 16 * 50


def test_connections_kept_between_statements_go_to_threads_waiting_for_one(
        schemas: list[str]) -> None:
    """A store keeps a connection that ends a statement for its next one, yet never more
    than its pool's ``pool_size``, and a thread waiting for the pool gets a kept one (a
    connection left idle while a thread waits would time out that thread's request)."""
    schema = fresh_schema()
    schemas.append(schema)
    store = PostgresStore(with_schema(server_url(), schema), key=KEY, pool_size=2)
    errors: list[BaseException] = []
    try:
        def hammer(n: int) -> None:
            try:
                for i in range(40):
                    store.cache_put(f"{n}-{i}", b"x" * i)
                    assert store.cache_get(f"{n}-{i}") == b"x" * i
                    with store.batch():  # (a transaction takes and gives back one too)
                        assert store.cache_get(f"{n}-{i}") == b"x" * i
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=hammer, args=(n,)) for n in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stats = store._get_pool().get_stats()
        assert errors == []
        assert stats.get("requests_errors", 0) == 0, stats  # (no request timed out)
        assert stats["pool_max"] == 2 and stats["pool_size"] <= 2, stats
        assert store.cache_stats()["entries"] == 6 * 40
    finally:
        store.close()


@pytest.mark.parametrize("threshold", [5, None])
def test_a_step_s_statements_are_prepared_unless_told_not_to(
        schemas: list[str], threshold: int | None) -> None:
    """After ``prepare_threshold`` uses a step's statements (its cache lookup, its journal
    write) are prepared on the server; with ``prepare_threshold=None`` (PgBouncer in
    transaction mode) nothing ever is, and steps run the same."""
    schema = fresh_schema()
    schemas.append(schema)
    store = PostgresStore(with_schema(server_url(), schema), key=KEY,
                          prepare_threshold=threshold)
    durably.configure(store=store)
    try:
        @task
        def double(i: int) -> int:
            return 2 * i

        @entrypoint
        def job(n: int) -> int:
            return sum(double(i) for i in range(n))

        assert job.run(20, run_id="prep").result == sum(2 * i for i in range(20))
        assert job.run(20, run_id="prep").counts()["replayed"] == 20
        prepared = store._do("list prepared statements", lambda conn: [
            row[0] for row in conn.execute("SELECT statement FROM pg_prepared_statements")])
        steps = [q for q in prepared if f"INSERT INTO {schema}.steps" in q
                 or f"FROM {schema}.cache c LEFT JOIN" in q]  # (the lookup: with its duration)
        if threshold is None:
            assert prepared == []
        else:
            assert len(steps) == 2, prepared
    finally:
        durably.configure()
        store.close()


def test_a_store_pickles_as_its_url_and_reopens_in_a_subprocess(pg: PostgresStore,
                                                                 tmp_path: Path) -> None:
    @task
    def triple(x: int) -> int:
        return 3 * x

    assert triple(5) == 15
    script = tmp_path / "other.py"
    script.write_text(
        "import pickle, sys, durably\n"
        "store = pickle.loads(sys.stdin.buffer.read())\n"
        "durably.configure(store=store)\n"
        "@durably.task\n"
        "def triple(x: int) -> int:\n"
        "    raise SystemExit('executed again')\n"
        "triple.__module__ = 'tests.test_postgres_store'\n"
        "triple.__qualname__ = 'test_a_store_pickles_as_its_url_and_reopens_in_a_subprocess."
        "<locals>.triple'\n"
        "print(type(store).__name__, store.schema)\n")
    import pickle

    proc = subprocess.run([sys.executable, str(script)], input=pickle.dumps(pg),
                          capture_output=True, timeout=120,
                          env={**os.environ, "DURABLY_DIR": str(tmp_path / "elsewhere")})
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode().split() == ["PostgresStore", pg.schema]


# -- several stores, one blob store -----------------------------------------------------------
def test_stores_sharing_a_blob_store_collect_only_their_own_blobs(
        schemas: list[str], tmp_path: Path) -> None:
    """Two stores (two schemas) with one DURABLY_BLOBS: each keeps its blobs in a folder of
    its own (its id), so one's collection never removes the other's values, and a partial
    file a killed write left is collected after the grace period."""
    blobs = (tmp_path / "shared-blobs").as_uri()
    big = b"x" * (2 << 20)
    a_schema, b_schema = fresh_schema(), fresh_schema()
    schemas += [a_schema, b_schema]
    a = PostgresStore(with_schema(server_url(), a_schema), key=KEY, blobs=blobs)
    b = PostgresStore(with_schema(server_url(), b_schema), key=KEY, blobs=blobs)
    b.cache_put("b-entry", big)
    a.cache_put("a-entry", big + b"a")
    assert a.blobs is not None and b.blobs is not None and a.blobs.scope != b.blobs.scope
    b_blob = b._one("blob", b._sql("SELECT blob FROM {s}.cache"))[0]
    partial = Path(b.blobs.path(b_blob) + ".deadbeef.tmp")
    partial.write_bytes(b"cut short")
    old = time.time() - 7200
    for path in (tmp_path / "shared-blobs").rglob("*"):
        os.utime(path, (old, old))
    assert a.collect_values(grace=3600) == (0, 0)  # (a's own blob is referenced)
    assert value_bytes(b.cache_get("b-entry")) == big
    assert b.collect_values(grace=3600) == (1, len(b"cut short"))  # only the partial file
    assert not partial.exists() and value_bytes(b.cache_get("b-entry")) == big
    a.close()
    b.close()


@pytest.mark.parametrize("size", [40 << 20, 96 << 20])
def test_a_large_value_is_streamed_to_its_blob_and_back_never_held_twice(
        schemas: list[str], tmp_path: Path, size: int) -> None:
    """A value for the blob store is a file (a LargeValue) from the task to the blob store
    and back (one pickled larger than 64 MiB from the pickler on, a smaller one from its
    sealing): sealing it, writing it and reading it hold a chunk at a time, never the value
    (and reading it back holds the value once: the unpickled object)."""
    import tracemalloc

    from durably._keys import serde

    schema = fresh_schema()
    schemas.append(schema)
    store = PostgresStore(with_schema(server_url(), schema), key=KEY,
                          blobs=(tmp_path / "blobs").as_uri())
    value = b"\x07" * size
    pickled = serde.dumps(value, what="a value")
    # (a file from the pickler on, or bytes in memory below 64 MiB)
    assert isinstance(pickled, serde.Spilled) == (size > serde.SPILL_BYTES)
    tracemalloc.start()
    try:
        store.cache_put("big", pickled)
        _, written = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        found = store.cache_get("big")
        assert isinstance(found, serde.Spilled) and len(found) == len(pickled)
        _, read = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        assert serde.loads(found) == value
        _, loaded = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert written < 24 << 20, f"storing a {size:,}-byte value peaked at {written:,} bytes"
    assert read < 24 << 20, f"reading it back peaked at {read:,} bytes"
    assert loaded < size + (32 << 20), f"loading it peaked at {loaded:,} bytes"
    # sealed and signed like any value: a blob damaged on disk is a miss, never served
    blob = store._one("blob", store._sql("SELECT blob FROM {s}.cache"))[0]
    assert store.blobs is not None
    with open(store.blobs.path(blob), "r+b") as f:
        f.seek(100 << 10)
        f.write(b"\x08")
    assert store.cache_get("big") is None
    other = PostgresStore(with_schema(server_url(), schema), key=b"o" * 32,
                          blobs=(tmp_path / "blobs").as_uri())
    with pytest.raises(StoreError, match="signed with another key"):
        other.cache_put("big2", serde.dumps(value, what="a value"))
    store.close()
    other.close()


def test_a_large_value_without_a_blob_store_is_kept_in_its_row_said_once(
        schemas: list[str], caplog: pytest.LogCaptureFixture) -> None:
    """No blob store: a large value goes in its row, sent in binary (as text, libpq's hex
    and psycopg's arrays held it 5 to 8 times over), and the store says once how to keep
    such values in object storage instead."""
    import tracemalloc

    schema = fresh_schema()
    schemas.append(schema)
    store = PostgresStore(with_schema(server_url(), schema), key=KEY)
    store.check()
    value = os.urandom(24 << 20)
    with caplog.at_level(logging.WARNING, logger="durably"):
        tracemalloc.start()
        try:
            store.cache_put("big", value)
            _, written = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        store.cache_put("big-too", value + b"2")
    assert written < 2.5 * len(value), f"a {len(value):,}-byte value peaked at {written:,}"
    said = [r.getMessage() for r in caplog.records if "no blob store is named" in r.getMessage()]
    assert len(said) == 1 and "DURABLY_BLOBS" in said[0]
    assert store.cache_get("big") == value and store.cache_get("big-too") == value + b"2"
    store.close()


def test_a_damaged_blob_is_mended_by_the_next_write(schemas: list[str],
                                                    tmp_path: Path) -> None:
    """A blob damaged in place (same size, other bytes) is a miss; the value computed again
    is written over it (a blob of that name already there was kept, damaged, for ever)."""
    schema = fresh_schema()
    schemas.append(schema)
    store = PostgresStore(with_schema(server_url(), schema), key=KEY,
                          blobs=(tmp_path / "blobs").as_uri())
    value = b"v" * (3 << 20)
    store.cache_put("entry", value)
    blob = store._one("blob", store._sql("SELECT blob FROM {s}.cache"))[0]
    assert store.blobs is not None
    path = Path(store.blobs.path(blob))
    with open(path, "r+b") as f:
        f.seek(2 << 20)
        f.write(b"!")
    assert store.cache_get("entry") is None  # (damaged: a miss)
    store.cache_put("entry", value)  # (what the task computed again)
    assert value_bytes(store.cache_get("entry")) == value
    store.close()


def test_a_local_blob_store_is_private_and_a_mistyped_path_is_an_error(
        schemas: list[str], tmp_path: Path) -> None:
    """A local blob store's folders are 0700 and its blobs 0600 (umask 022), as a
    DiskStore's; a blob store whose folder's parent does not exist is refused when the store
    is made, naming that parent; the blob store's own folder is made (private) at the first
    blob. A shared folder (group bits) gives its group's bits to what is made in it."""
    import stat

    schema = fresh_schema()
    schemas.append(schema)
    url = with_schema(server_url(), schema)
    with pytest.raises(DefinitionError, match="does not exist") as caught:
        PostgresStore(url, key=KEY, blobs=str(tmp_path / "nonexistent-dir" / "x"))
    assert str(tmp_path / "nonexistent-dir") in str(caught.value)
    assert not (tmp_path / "nonexistent-dir").exists()
    old = os.umask(0o022)
    try:
        store = PostgresStore(url, key=KEY, blobs=str(tmp_path / "blobs"))
        assert not (tmp_path / "blobs").exists()  # (made at the first blob)
        store.cache_put("entry", b"p" * (2 << 20))
        shared = tmp_path / "shared"
        shared.mkdir()
        shared.chmod(0o770)
        team = PostgresStore(url, key=KEY, blobs=shared.as_uri())
        team.cache_put("team", b"t" * (2 << 20))
    finally:
        os.umask(old)
    modes = {p.relative_to(tmp_path): stat.S_IMODE(p.stat().st_mode)
             for p in tmp_path.rglob("*") if p.parts[len(tmp_path.parts)] in ("blobs", "shared")}
    assert [m for p, m in modes.items() if p.parts[0] == "blobs" and (tmp_path / p).is_dir()
            ] == [0o700] * 3, modes  # (the blob store's, the store's, the blob's first two)
    assert [m for p, m in modes.items() if p.parts[0] == "blobs" and (tmp_path / p).is_file()
            ] == [0o600], modes
    assert sorted(m for p, m in modes.items() if p.parts[0] == "shared"
                  ) == [0o660, 0o770, 0o770, 0o770], modes  # (its own, as made)
    assert value_bytes(store.cache_get("entry")) == b"p" * (2 << 20)
    store.close()
    team.close()


def test_a_missing_blob_is_a_store_error_that_names_where_it_was_looked_for(
        schemas: list[str], tmp_path: Path) -> None:
    schema = fresh_schema()
    schemas.append(schema)
    url = with_schema(server_url(), schema)
    writer = PostgresStore(url, key=KEY, blobs=(tmp_path / "right").as_uri())
    writer.cache_put("entry", b"y" * (2 << 20))
    misconfigured = PostgresStore(url, key=KEY, blobs=(tmp_path / "wrong").as_uri())
    with pytest.raises(StoreError, match="not in the blob store") as caught:
        misconfigured.cache_get("entry")
    assert "DURABLY_BLOBS" in str(caught.value)
    assert value_bytes(writer.cache_get("entry")) == b"y" * (2 << 20)  # (nothing was removed)
    unreachable = PostgresStore(url, key=KEY, blobs="s3://no-such-bucket/x", blob_options={
        "key": "k", "secret": "s", "client_kwargs": {"endpoint_url": "http://127.0.0.1:1"},
        "retries": 0, "config_kwargs": {"connect_timeout": 1, "retries": {"max_attempts": 1}}})
    with pytest.raises(StoreError, match="blob store s3://no-such-bucket/x"):
        unreachable.cache_put("other", b"z" * (2 << 20))
    for store in (writer, misconfigured, unreachable):
        store.close()


def test_a_run_whose_blob_was_deleted_is_repaired_and_goes_on(schemas: list[str],
                                                              tmp_path: Path) -> None:
    """A run's large value deleted from the blob store: the run stops with a StoreError that
    says how to repair it, repair_run sets the lost value aside, and the run then executes
    that (cacheable) step again and finishes."""
    import shutil

    schema = fresh_schema()
    schemas.append(schema)
    blobs = tmp_path / "blobs"
    store = PostgresStore(with_schema(server_url(), schema), key=KEY, blobs=blobs.as_uri())
    executed: list[int] = []

    @task
    def big(n: int) -> bytes:
        executed.append(n)
        return bytes([n]) * (2 << 20)

    @entrypoint(store=store)
    def job(n: int) -> int:
        return len(big(n)) + n

    assert job(3) == (2 << 20) + 3 and executed == [3]
    shutil.rmtree(blobs)
    with pytest.raises(StoreError, match="repair_run") as caught:
        job(3)
    assert "not in the blob store" in str(caught.value)
    run_id = durably.list_runs(store=store)[0].id
    lost = store.repair_run(run_id)
    assert any("missing from the blob store" in line for line in lost), lost
    assert job(3) == (2 << 20) + 3 and executed == [3, 3]
    store.close()


def test_a_process_without_the_blob_store_leaves_a_finished_run_as_it_was(
        schemas: list[str], tmp_path: Path) -> None:
    """A process that names no blob store replays a finished run with a large value: it gets
    the StoreError, and the run stays finished with its one attempt (not failed: a reader
    that cannot read a run changes nothing of it); the process with the blob store still
    replays it."""
    schema = fresh_schema()
    schemas.append(schema)
    url = with_schema(server_url(), schema)
    writer = PostgresStore(url, key=KEY, blobs=(tmp_path / "blobs").as_uri())
    reader = PostgresStore(url, key=KEY)
    executed: list[int] = []

    @task
    def big(n: int) -> bytes:
        executed.append(n)
        return bytes([n]) * (2 << 20)

    @entrypoint
    def job(n: int) -> int:
        return len(big(n)) + n

    durably.configure(store=writer)
    assert job.run(5, run_id="big").result == (2 << 20) + 5
    durably.configure(store=reader)
    with pytest.raises(StoreError, match="none is named here") as caught:
        job.run(5, run_id="big")
    assert any("journaled nothing" in note for note in caught.value.__notes__)
    for store in (reader, writer):
        run = durably.get_run("big", store=store)
        assert (run.status, run.attempt) == ("finished", 1)
    durably.configure(store=writer)
    assert job.run(5, run_id="big").result == (2 << 20) + 5 and executed == [5]
    durably.configure()
    writer.close()
    reader.close()


def test_a_process_with_another_key_is_refused_when_the_store_opens(
        schemas: list[str]) -> None:
    """A process with the wrong key must neither read nor write a shared store (it would
    execute the team's finished steps again, and sign runs and entries the team then
    cannot read): the store keeps the id of the key its values are signed with, and
    refuses another one when it opens, saying where this process's key came from and
    how to fix it. The team's entries and runs are left as they were."""
    schema = fresh_schema()
    schemas.append(schema)
    url = with_schema(server_url(), schema)
    team = PostgresStore(url, key=KEY)
    team.cache_put("entry", b"value")
    before = _table_text(team)
    stranger = PostgresStore(url, key=b"s" * 32)
    for use in (lambda: stranger.cache_get("entry"), lambda: stranger.cache_put("x", b"y"),
                stranger.check, lambda: stranger.list_runs()):
        with pytest.raises(StoreError) as refused:
            use()
        said = str(refused.value)
        assert "signed with another key" in said and schema in said, said
        assert "PostgresStore(key=...)" in said and "DURABLY_KEY_FILE" in said, said
        assert "k" * 16 not in said and "s" * 16 not in said  # (never the keys)
    assert team.cache_get("entry") == b"value"
    assert _table_text(team) == before
    # the same key in another handle (another process) opens it
    again = PostgresStore(url, key=KEY)
    assert again.cache_get("entry") == b"value"
    for store in (team, stranger, again):
        store.close()


def test_a_store_made_unsigned_or_before_key_ids_takes_the_first_key_that_opens_it(
        schemas: list[str]) -> None:
    """A store with no key id yet (made with allow_unsigned, or by a durably that kept
    none) records the key of the first process that opens it with one; a process opening
    it without a key (allow_unsigned) checks nothing."""
    import psycopg

    schema = fresh_schema()
    schemas.append(schema)
    url = with_schema(server_url(), schema)
    unsigned = PostgresStore(url, allow_unsigned=True)
    unsigned.cache_put("plain", b"value")
    with psycopg.connect(server_url(), autocommit=True) as conn:
        assert conn.execute(f"SELECT value FROM {schema}.meta WHERE name = 'key_id'"
                            ).fetchone() is None
    first = PostgresStore(url, key=KEY)
    first.check()
    with psycopg.connect(server_url(), autocommit=True) as conn:
        row = conn.execute(f"SELECT value FROM {schema}.meta WHERE name = 'key_id'"
                           ).fetchone()
    assert row is not None and row[0] == first.signing_key.id.hex()  # type: ignore[union-attr]
    with pytest.raises(StoreError, match="signed with another key"):
        PostgresStore(url, key=b"o" * 32).check()
    still = PostgresStore(url, allow_unsigned=True)
    assert still.cache_get("plain") == b"value"
    for store in (unsigned, first, still):
        store.close()


def test_system_schemas_are_refused() -> None:
    for schema in ("public", "information_schema", "pg_catalog"):
        with pytest.raises(DefinitionError, match="of PostgreSQL's own"):
            PostgresStore(server_url(), schema=schema, key=KEY)


# -- concurrent replays ---------------------------------------------------------------------
_REPLAYER = """
import os, sys, time
from pathlib import Path
import durably

here = Path(__file__).parent

@durably.task
def step(i: int) -> int:
    with open(here / "executed", "a") as f:
        f.write(f"{i}\\n")
    return i

@durably.entrypoint
def job(n: int) -> int:
    return sum(step(i) for i in range(n))

if len(sys.argv) > 1:  # (a replayer: waits for the others, so that they replay at once)
    while not (here / "go").exists():
        time.sleep(0.01)
print("result", job.run(2000, run_id="shared").result)
"""


@pytest.mark.parametrize("kind", ["disk", "postgres"])
def test_processes_replaying_a_finished_run_at_once_each_get_its_result(
        tmp_path: Path, schemas: list[str], kind: str) -> None:
    """A finished run called again with unchanged code only replays it: six processes doing
    so at once each get its result, none executes a step again, none holds the run's lease
    for its replay (no RunBusyError), as on a DiskStore. Each replay that gets to end first
    journals its attempt with its end, in one commit; the others' are not journaled."""
    if kind == "postgres":
        schema = fresh_schema()
        schemas.append(schema)
        url = with_schema(server_url(), schema)
        store: durably.Store = PostgresStore(url, key=KEY)
        env = {**os.environ, "DURABLY_STORE": url, "DURABLY_KEY": KEY.decode()}
    else:
        store = durably.DiskStore(tmp_path / "store")
        env = {**os.environ, "DURABLY_STORE": str(tmp_path / "store")}
    env = {k: v for k, v in env.items() if not k.startswith("PYTEST")}
    script = tmp_path / "replayer.py"
    script.write_text(_REPLAYER)
    first = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                           text=True, timeout=300)
    assert first.stdout.strip() == f"result {sum(range(2000))}", first.stderr
    executed = (tmp_path / "executed").read_text()
    assert len(executed.split()) == 2000
    procs = [subprocess.Popen([sys.executable, str(script), "replay"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(6)]
    (tmp_path / "go").touch()
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0 and out.strip() == f"result {sum(range(2000))}", err[-3000:]
    assert (tmp_path / "executed").read_text() == executed  # nothing executed again
    try:
        run = store.find_run("shared")
        assert run is not None and run.status == "finished"
        # the journaled replay (one at least, the first to end) names every step, in order
        assert 2 <= run.attempt <= 7
        first_steps = [s.step_id for s in store.list_steps("shared", attempt=1)]
        replayed = store.list_steps("shared", attempt=run.attempt)
        assert [s.status for s in replayed] == ["replayed"] * 2000
        assert [s.step_id for s in sorted(replayed, key=lambda s: s.position)] == first_steps
        assert [s.position for s in sorted(replayed, key=lambda s: s.position)] == list(
            range(2000))
        assert store.run_holder("shared") is None
    finally:
        store.close()
