"""Dask on several machines with a PostgreSQL store.

The cluster's two workers stand for two machines without a shared filesystem: each has a
``DURABLY_DIR``, a Dask local directory and a working directory of its own, so a
``DiskStore`` would never be shared between them (nor with the caller, whose
``DURABLY_DIR`` is another one again). What they share is the PostgreSQL server: a worker
reopens the caller's store from its URL (a store pickles as ``Store.location()``).

Executions are counted by rows a body inserts into a table on that server, the one thing
every "machine" sees. Each test has a store schema and a log schema of its own, dropped at
its end.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import durably

from .conftest import script_env
from .postgres_server import drop_schemas, fresh_schema, server_url, with_schema

distributed = pytest.importorskip("distributed")
pytest.importorskip("psycopg")

pytestmark = pytest.mark.slow

#: where a body logs what it executed: (libpq URL, schema of the table ``executions``)
Log = tuple[str, str]


def _execute(log: Log, sql: str, params: Any = None) -> list[Any]:
    import psycopg

    url, schema = log
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(sql.replace("{s}", schema), params)
        return cur.fetchall() if cur.description else []


def _record(log: Log, what: str, item: int) -> None:
    """One row per execution, on the server every worker reaches."""
    _execute(log, "INSERT INTO {s}.executions (what, item, pid, durably_dir) "
                  "VALUES (%s, %s, %s, %s)",
             (what, item, os.getpid(), os.environ.get("DURABLY_DIR", "")))


def _executions(log: Log, what: str) -> list[tuple[int, int, str]]:
    """``(item, pid, worker's DURABLY_DIR)`` of each execution of ``what``, in order."""
    return [tuple(r) for r in _execute(
        log, "SELECT item, pid, durably_dir FROM {s}.executions WHERE what = %s ORDER BY n",
        (what,))]


def _make_log(url: str) -> Log:
    log = (url, fresh_schema())
    _execute(log, "CREATE SCHEMA {s}")
    _execute(log, "CREATE TABLE {s}.executions (n bigserial PRIMARY KEY, what text, "
                  "item int, pid int, durably_dir text)")
    _execute(log, "CREATE TABLE {s}.holds (item int PRIMARY KEY)")
    return log


# -- the cluster: two "machines" --------------------------------------------------------------
@dataclasses.dataclass
class Machines:
    client: Any
    homes: dict[str, Path]  # worker name -> its own directory tree

    def durably_dir(self, name: str) -> str:
        return str(self.homes[name] / "durably")

    def addresses(self) -> dict[str, str]:
        """Worker name -> address (new ones after a restart)."""
        info = self.client.scheduler_info()["workers"]
        return {w["name"]: address for address, w in info.items()}

    def settle(self) -> None:
        """Each worker process works in a directory of its own (after a restart too)."""
        for name, address in self.addresses().items():
            self.client.run(os.chdir, str(self.homes[name] / "work"), workers=[address])

    def untouched(self) -> dict[str, list[str]]:
        """What durably left on each machine's disk: nothing, when the store is PostgreSQL
        (its DURABLY_DIR, and a ./.durably of its working directory, never made)."""
        left = {}
        for name, home in self.homes.items():
            found = [str(p) for p in (home / "durably", home / "work" / ".durably")
                     if p.exists()]
            if found:
                left[name] = found
        return left


@pytest.fixture(scope="module")
def machines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Machines]:
    server_url()  # (skips before starting a cluster when there is no server)
    root = tmp_path_factory.mktemp("machines")
    homes = {name: root / name for name in ("a", "b")}
    workers = {}
    for name, home in homes.items():
        (home / "work").mkdir(parents=True)
        workers[name] = {"cls": distributed.Nanny, "options": {
            "nthreads": 1, "local_directory": str(home / "dask"), "host": "127.0.0.1",
            "env": {"DURABLY_DIR": str(home / "durably"), "DURABLY_STORE": "",
                    "DURABLY_PROGRESS": "0"}}}
    scheduler = {"cls": distributed.Scheduler,
                 "options": {"host": "127.0.0.1", "dashboard_address": ":0"}}
    with distributed.SpecCluster(workers=workers, scheduler=scheduler) as cluster, \
            distributed.Client(cluster) as client:
        client.wait_for_workers(2)
        found = Machines(client, homes)
        found.settle()
        yield found


@pytest.fixture
def pg(request: pytest.FixtureRequest) -> Iterator[tuple[str, Log]]:
    """The URL of a store in a schema of its own, and a log in another; both dropped."""
    url = server_url()
    schema = fresh_schema()
    log = _make_log(url)
    yield with_schema(url, schema) + "&allow_unsigned=true", log
    durably.configure()
    drop_schemas(url, [schema, log[1]])


# -- a nested task called on two workers --------------------------------------------------------
@durably.task(ignore=("log",))
def shared_part(x: int, log: Log) -> int:
    _record(log, "shared_part", x)
    return x * x


@durably.task(ignore=("log",))
def item(i: int, x: int, log: Log) -> dict[str, Any]:
    from durably._runtime.config import default_store

    _record(log, "item", i)
    why = shared_part.explain(x, log)  # before the call: would it be served?
    value = shared_part(x, log)
    return {"item": i, "value": value, "hit": why.hit, "key": why.cache_key, "pid": os.getpid(),
            "durably_dir": os.environ["DURABLY_DIR"], "cwd": os.getcwd(),
            "store": default_store().where}


@durably.entrypoint
def spread(x: int, workers: list[str], log: Log) -> list[dict[str, Any]]:
    """Item i on worker i, one after the other (so the second call comes after the first
    has finished: one execution is then what a shared cache gives, never a race)."""
    import dask

    out: list[dict[str, Any]] = []
    for i, address in enumerate(workers):
        with dask.annotate(workers=[address], allow_other_workers=False):
            out += item.map([i], [x], [log], executor="dask")
    return out


def test_a_nested_task_called_on_two_workers_executes_once(machines: Machines,
                                                           pg: tuple[str, Log]) -> None:
    url, log = pg
    store = durably.open_store(url, allow_unsigned=True)
    durably.configure(store=store)
    try:
        where = machines.addresses()
        run = spread.run(7, [where["a"], where["b"]], log)
        first, second = run.result
        # two machines: two processes, neither the caller, each with its own directories
        assert first["pid"] != second["pid"] and os.getpid() not in (first["pid"],
                                                                     second["pid"])
        assert [first["durably_dir"], second["durably_dir"]] == [
            machines.durably_dir("a"), machines.durably_dir("b")]
        assert os.environ["DURABLY_DIR"] not in (first["durably_dir"], second["durably_dir"])
        assert first["cwd"] != second["cwd"]
        # both use the caller's PostgreSQL store, reopened from its URL
        assert first["store"] == second["store"] == store.where
        # the nested task executed once, on the first worker; the second was served
        assert (first["value"], first["hit"]) == (49, False)
        assert (second["value"], second["hit"]) == (49, True)
        assert _executions(log, "shared_part") == [(7, first["pid"], first["durably_dir"])]
        assert [i for i, _, _ in _executions(log, "item")] == [0, 1]
        # its entry is in PostgreSQL (the caller reads it there), nothing on any disk
        assert first["key"] == second["key"] == shared_part.explain(7, log).cache_key
        assert store.cache_get(first["key"]) is not None
        assert shared_part(7, log) == 49 and len(_executions(log, "shared_part")) == 1
        assert machines.untouched() == {}
        assert not Path(os.environ["DURABLY_DIR"]).exists()
        assert run.counts() == {"ran": 2, "cached": 0, "replayed": 0, "failed": 0}
    finally:
        durably.configure()
        store.close()


def test_without_a_store_the_workers_share_each_executes_it(
        machines: Machines, pg: tuple[str, Log], caplog: pytest.LogCaptureFixture) -> None:
    """The contrast: a store the workers cannot reach (memory://, as a DiskStore without a
    shared filesystem) leaves each worker a cache of its own in its memory, and the nested
    task executes once per worker; the caller is told so (not only the workers' logs)."""
    _, log = pg
    caplog.set_level("WARNING", logger="durably")
    durably.configure(store=f"memory://{fresh_schema()}")
    where = machines.addresses()
    first, second = spread(8, [where["a"], where["b"]], log)
    assert (first["hit"], second["hit"]) == (False, False)
    assert _executions(log, "shared_part") == [(8, first["pid"], first["durably_dir"]),
                                               (8, second["pid"], second["durably_dir"])]
    assert machines.untouched() == {}
    told = [r.getMessage() for r in caplog.records if "worker's memory only" in r.getMessage()]
    assert told and "cannot be shared" in told[0], caplog.text


# -- a caller killed mid-map, resumed elsewhere -----------------------------------------------
CALLER = """
import os, time
import distributed
import durably

def execute(log, sql, params=None):
    import psycopg
    url, schema = log
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(sql.replace("{s}", schema), params)
        return cur.fetchall() if cur.description else []

def record(log, what, i):
    execute(log, "INSERT INTO {s}.executions (what, item, pid, durably_dir) "
                 "VALUES (%s, %s, %s, %s)", (what, i, os.getpid(), os.environ["DURABLY_DIR"]))

@durably.task(ignore=("log",))
def work(i, log):
    record(log, "started", i)
    while execute(log, "SELECT 1 FROM {s}.holds WHERE item = %s", (i,)):
        time.sleep(0.05)  # held: until the test deletes the row (or the worker restarts)
    record(log, "finished", i)
    return i * 10

@durably.entrypoint
def study(n, log):
    return work.map(range(n), [log] * n, executor="dask", max_workers=2)

if __name__ == "__main__":
    log = (os.environ["LOG_URL"], os.environ["LOG_SCHEMA"])
    with distributed.Client(os.environ["SCHEDULER"]):
        run = study.run(int(os.environ["ITEMS"]), log, run_id=os.environ["RUN_ID"])
        print("result", run.result, flush=True)
        print("counts", run.counts(), flush=True)
"""


def _caller(home: Path, env: dict[str, str]) -> tuple[Path, dict[str, str]]:
    """A caller "machine": a directory with its own copy of the script, and its own
    DURABLY_DIR (never made: the store is PostgreSQL)."""
    home.mkdir()
    script = home / "study.py"
    script.write_text(textwrap.dedent(CALLER))
    return script, script_env(home / "durably", **env)


def test_a_caller_killed_mid_map_is_resumed_elsewhere_executing_exactly_the_missing_items(
        machines: Machines, pg: tuple[str, Log], tmp_path: Path) -> None:
    """Items 0..4 finish; 5 and 6 (the map keeps two in flight) are held on the workers
    when the caller is killed with SIGKILL; 7..11 were never sent.

    What is asserted, exactly: the items journaled as finished when the caller died are
    items 0..4 (an item is journaled by the caller as its result comes back, and item
    k + 2 is sent only after item k's was journaled); the second caller, in another
    directory, replays those and executes exactly the others, 5..11, each once. The
    bodies of 5 and 6 the dead caller left running on the cluster are stopped by
    restarting the workers (Dask cannot stop a running body; its result would never have
    been journaled), so every item's body finishes exactly once in all."""
    n, held = 12, 5
    url, log = pg
    _execute(log, "INSERT INTO {s}.holds (item) SELECT generate_series(%s::int, %s::int)",
             (held, n - 1))
    env = {"DURABLY_STORE": url, "DURABLY_PROGRESS": "0", "LOG_URL": log[0],
           "LOG_SCHEMA": log[1], "ITEMS": str(n), "RUN_ID": "study-on-two-machines",
           "SCHEDULER": machines.client.scheduler.address}
    script1, env1 = _caller(tmp_path / "caller-1", env)
    out1 = tmp_path / "caller-1.out"
    with open(out1, "w") as sink, subprocess.Popen(
            [sys.executable, str(script1)], env=env1, stdout=sink, stderr=subprocess.STDOUT,
            cwd=script1.parent, start_new_session=True) as proc:
        watchdog = threading.Timer(90, os.killpg, (proc.pid, signal.SIGKILL))
        watchdog.start()
        try:
            deadline = time.monotonic() + 60
            while {held, held + 1} - {i for i, _, _ in _executions(log, "started")}:
                assert proc.poll() is None, f"the caller ended early:\n{out1.read_text()}"
                assert time.monotonic() < deadline, out1.read_text()
                time.sleep(0.05)
        finally:
            watchdog.cancel()
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    store = durably.open_store(url, allow_unsigned=True)
    try:
        (run,) = store.list_runs()
        assert run.run_id == "study-on-two-machines"
        journaled = sorted(int(s.output) // 10 for s in store.list_steps(run.run_id)
                           if s.status == "ran")
    finally:
        store.close()
    assert journaled == list(range(held))
    assert sorted(i for i, _, _ in _executions(log, "started")) == list(range(held + 2))
    assert sorted(i for i, _, _ in _executions(log, "finished")) == list(range(held))

    # the bodies of items 5 and 6 still run on the workers, held: stopped by a restart,
    # before the holds go (they never finish, so their side effects never happen)
    machines.client.restart()
    machines.settle()
    _execute(log, "DELETE FROM {s}.holds")
    ((before,),) = _execute(log, "SELECT max(n) FROM {s}.executions")

    script2, env2 = _caller(tmp_path / "caller-2", env)
    start = time.monotonic()
    proc2 = subprocess.run([sys.executable, str(script2)], env=env2, capture_output=True,
                           text=True, timeout=60, cwd=script2.parent)
    assert proc2.returncode == 0, f"{proc2.stdout}\n{proc2.stderr}"
    assert "durably:" not in proc2.stderr, proc2.stderr  # (no warning: a store, a lease)
    assert time.monotonic() - start < 60
    assert proc2.stdout.splitlines() == [
        f"result {[i * 10 for i in range(n)]}",
        f"counts {{'ran': {n - held}, 'cached': 0, 'replayed': {held}, 'failed': 0}}"]

    resumed = _execute(log, "SELECT what, item FROM {s}.executions WHERE n > %s", (before,))
    # executed by the resume: exactly the items missing from the journal, each once
    assert sorted(i for what, i in resumed if what == "started") == list(range(held, n))
    assert sorted(i for what, i in resumed if what == "finished") == list(range(held, n))
    # in all, every item's body finished exactly once, on the workers
    finished = _executions(log, "finished")
    assert sorted(i for i, _, _ in finished) == list(range(n))
    worker_dirs = {machines.durably_dir("a"), machines.durably_dir("b")}
    assert {d for _, _, d in finished} <= worker_dirs
    # nothing on any disk: the callers' DURABLY_DIRs and the workers' were never made
    assert not (tmp_path / "caller-1" / "durably").exists()
    assert not (tmp_path / "caller-2" / "durably").exists()
    assert machines.untouched() == {}


# -- two callers' stores on one worker at once -------------------------------------------------
@durably.task(ignore=("log",))
def slow_item(tag: str, wait: float, log: Log) -> tuple[str, str, str]:
    from durably._runtime.config import default_store

    before = default_store().where
    _record(log, f"begun {tag}", 0)
    if wait:  # until the other caller's item has begun on this worker's other thread
        deadline = time.monotonic() + 30
        while not _executions(log, "begun B") and time.monotonic() < deadline:
            time.sleep(0.02)
    value = shared_part(len(tag), log)  # cached in the store of this item's caller
    return tag, before, default_store().where + f" {value}"


def test_bodies_of_callers_with_other_stores_at_once_on_one_worker_keep_their_own(
        pg: tuple[str, Log]) -> None:
    """A worker shared by two callers whose stores differ, running an item of each on two
    threads at once: each body's nested calls go to its own caller's store (the worker's
    default store, which the second item changed, is not the first item's)."""
    url_a, log = pg
    url_b = with_schema(server_url(), fresh_schema()) + "&allow_unsigned=true"
    store_a = durably.open_store(url_a, allow_unsigned=True)
    store_b = durably.open_store(url_b, allow_unsigned=True)

    @durably.entrypoint(store=store_a, name="on_a")
    def on_a() -> list[Any]:
        return slow_item.map(["A"], [1.0], [log], executor="dask")

    @durably.entrypoint(store=store_b, name="on_b")
    def on_b() -> list[Any]:
        while not _executions(log, "begun A"):
            time.sleep(0.02)
        return slow_item.map(["B"], [0.0], [log], executor="dask")

    try:
        cluster = distributed.LocalCluster(n_workers=1, threads_per_worker=2,
                                           processes=True, dashboard_address=":0")
        with cluster, distributed.Client(cluster), \
                concurrent.futures.ThreadPoolExecutor(2) as pool:
            a, b = pool.submit(on_a), pool.submit(on_b)
            ((tag_a, before_a, after_a),) = a.result(timeout=60)
            ((tag_b, before_b, after_b),) = b.result(timeout=60)
        assert (tag_a, tag_b) == ("A", "B")
        assert before_a == store_a.where and after_a == f"{store_a.where} 1"
        assert before_b == store_b.where and after_b == f"{store_b.where} 1"
        # one entry in each store: each caller's own nested call
        key = shared_part.explain(1, log).cache_key
        assert store_a.cache_get(key) is not None and store_b.cache_get(key) is not None
        assert len(_executions(log, "shared_part")) == 2
    finally:
        store_a.close()
        store_b.close()
        drop_schemas(server_url(), [store_b.schema])
