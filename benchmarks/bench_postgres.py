"""durably's PostgreSQL store against LangGraph's functional API with ``PostgresSaver`` and
DBOS on PostgreSQL, on one local server: executed and replayed steps, cache hits, the
round trips each costs, a 10,000-step resume, 8 writer processes and a Dask fan-out.

Run: python benchmarks/bench_postgres.py [--quick] [--steps 100] [--repeat 5] [--sections ...]

The server is named by ``$DURABLY_BENCH_POSTGRES`` or ``$DURABLY_TEST_POSTGRES`` (a libpq URL,
``postgresql://postgres@/postgres?host=/tmp/durably-pg.XXXX&port=NNNN``); without either the
script says how to start one (``eval "$(.ci/postgres start)"``) and exits 0. Each library gets
a database of its own, made for the run and dropped at its end. durably signs its values
(``durably.configure(key=...)``: a ``PostgresStore`` refuses to open without a key unless told
``allow_unsigned``). Ratios are durably / other: lower is better, except where the row says
so (steps or items per second).

- **calls**: in one process, one sample of each contender in turn, ``--repeat`` times,
  medians. *executed step*: a run of ``--steps`` trivial steps on new inputs, wall time /
  steps (durably ``@entrypoint`` + ``@task``; LangGraph ``@entrypoint(checkpointer=
  PostgresSaver)`` + ``@task``, ``.result()`` one at a time; DBOS ``@DBOS.workflow`` of
  ``@DBOS.step``), and the process's CPU time per executed step over the same samples (its
  threads included; the server's not), which the machine's other work hardly changes.
  *replayed step*: every step of a finished run served from the journal, wall time / steps
  (durably: the finished run called again; LangGraph: a run that failed after its steps, resumed
  with ``invoke(None, config)`` on its thread_id, since invoking a finished thread again
  executes its tasks again; DBOS: ``DBOS.fork_workflow(id, steps + 1)``, its way to run a
  workflow again over its recorded steps, with its internal queue's poll lowered from 1 s to 5
  ms during the sample and ``get_result`` polling every 2 ms, so the figure is the replay and
  not the poll). Each check confirms that no step executed again.
  *cache hit*: a durably task called outside any run on a warm entry, against a plain
  psycopg ``SELECT`` of one small row (the floor of one round trip; neither peer has a
  PostgreSQL cache of task results).
- **trips**: the same work done through a counting TCP proxy in front of the server, in a
  process of its own: client-server round trips and statements per step or per hit.
- **resume**: a run of ``--resume-steps`` (10,000) steps fails after its last step; its
  resume replays them all (durably only).
- **writers**: ``--writers`` (8) processes, each executing ``--writer-steps`` steps in runs
  of ``--steps``, all at once into one store (one database per library), after every process
  has connected: steps per second over the whole, and the runs that failed.
- **dask**: a ``task.map`` of ``--items`` (10,000) trivial items in a new run each time, on a
  ``distributed.LocalCluster(processes=True, n_workers=2)``, journaled in the PostgreSQL store;
  items per second, beside plain ``client.map`` + ``gather`` of the same function.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import description, positive_int, report
from _workload import FAIL, chain, inc

import durably

#: the signing key every durably process of the benchmark uses (signing is how a shared store
#: is run; a PostgresStore refuses to open without a key unless allow_unsigned)
KEY = b"0123456789abcdef0123456789abcdef"
SECTIONS = ("calls", "trips", "resume", "writers", "dask")
START_SERVER = ('no PostgreSQL server given: set DURABLY_BENCH_POSTGRES (or '
                'DURABLY_TEST_POSTGRES) to a libpq URL, e.g. start a throwaway server with\n'
                '    eval "$(.ci/postgres start)"\n'
                'and run this again; skipped.')

_bases = itertools.count(1)
Sample = Callable[[], float]


def next_base() -> int:
    """A fresh input range (pid-salted: processes never share one), so every step misses."""
    return (os.getpid() % 10_000) * 10**12 + next(_bases) * 10_000_000


def server_url() -> str | None:
    return os.environ.get("DURABLY_BENCH_POSTGRES") or os.environ.get("DURABLY_TEST_POSTGRES")


def postgres_store_class() -> Any:
    """durably.PostgresStore, or None when this durably has none (printed once)."""
    try:
        return durably.PostgresStore
    except (AttributeError, ImportError) as exc:
        print(f"durably: PostgresStore not available ({exc})", flush=True)
        return None


# -- URLs ----------------------------------------------------------------------------------------
def url_params(url: str) -> dict[str, str]:
    from psycopg.conninfo import conninfo_to_dict

    return {k: str(v) for k, v in conninfo_to_dict(url).items() if v is not None}


def make_url(params: dict[str, str]) -> str:
    """A postgresql:// URL from libpq parameters (a socket directory goes in the query)."""
    p = dict(params)
    user, password = p.pop("user", ""), p.pop("password", "")
    host, port, dbname = p.pop("host", ""), p.pop("port", ""), p.pop("dbname", "")
    netloc = urllib.parse.quote(user, safe="")
    if password:
        netloc += ":" + urllib.parse.quote(password, safe="")
    netloc += "@" if netloc else ""
    if host and not host.startswith("/") and "," not in host:
        netloc += host + (f":{port}" if port else "")
    else:
        if host:
            p["host"] = host
        if port:
            p["port"] = port
    query = urllib.parse.urlencode(p, safe="/")
    return f"postgresql://{netloc}/{urllib.parse.quote(dbname, safe='')}" + (
        f"?{query}" if query else "")


def database_url(url: str, dbname: str) -> str:
    return make_url({**url_params(url), "dbname": dbname})


def upstream_of(url: str) -> tuple[int, Any]:
    """Where the server listens, as (socket family, address), from a libpq URL."""
    p = url_params(url)
    port = int((p.get("port") or os.environ.get("PGPORT") or "5432").split(",")[0])
    host = (p.get("hostaddr") or p.get("host") or os.environ.get("PGHOST")
            or "/var/run/postgresql").split(",")[0]
    if host.startswith("/"):
        return socket.AF_UNIX, f"{host}/.s.PGSQL.{port}"
    return socket.AF_INET, (host, port)


# -- a proxy that counts round trips -------------------------------------------------------------
class _Frontend:
    """Splits what a client sends into protocol messages; counts statements (a simple
    ``Query``, or an ``Execute`` of the extended protocol)."""

    def __init__(self) -> None:
        self.buf = b""
        self.startup = True

    def feed(self, data: bytes) -> int:
        self.buf += data
        n = 0
        while True:
            if self.startup:  # untyped: [length][code]... (an SSL/GSS request, then startup)
                if len(self.buf) < 8:
                    return n
                length = int.from_bytes(self.buf[:4], "big")
                if len(self.buf) < length:
                    return n
                code = int.from_bytes(self.buf[4:8], "big")
                self.buf = self.buf[length:]
                self.startup = code in (80877103, 80877104)
                continue
            if len(self.buf) < 5:
                return n
            length = int.from_bytes(self.buf[1:5], "big")
            if len(self.buf) < 1 + length:
                return n
            n += self.buf[:1] in (b"Q", b"E")
            self.buf = self.buf[1 + length:]


class CountingProxy:
    """A TCP proxy on 127.0.0.1 in front of the server. A round trip is a burst of bytes from
    a client that follows the server's answer (or opens the connection): what a client waits
    for. Statements are counted from the protocol's messages."""

    def __init__(self, server: str) -> None:
        self.upstream = upstream_of(server)
        self.server = server
        self.lock = threading.Lock()
        self.trips = self.statements = 0
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(128)
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True, name="proxy").start()

    def url(self, dbname: str) -> str:
        """A URL reaching ``dbname`` through the proxy (no TLS: its bytes are counted)."""
        p = {k: v for k, v in url_params(self.server).items()
             if k not in ("host", "hostaddr", "port", "sslmode", "gssencmode")}
        return make_url({**p, "host": "127.0.0.1", "port": str(self.port), "dbname": dbname,
                         "sslmode": "disable", "gssencmode": "disable"})

    def snapshot(self) -> tuple[int, int]:
        with self.lock:
            return self.trips, self.statements

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            family, address = self.upstream
            upstream = socket.socket(family, socket.SOCK_STREAM)
            try:
                upstream.connect(address)
            except OSError:
                client.close()
                continue
            if family == socket.AF_INET:
                upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            last = ["s"]
            threading.Thread(target=self._up, args=(client, upstream, last), daemon=True).start()
            threading.Thread(target=self._down, args=(upstream, client, last),
                             daemon=True).start()

    def _up(self, src: socket.socket, dst: socket.socket, last: list[str]) -> None:
        frontend = _Frontend()
        with contextlib.suppress(OSError):
            while data := src.recv(1 << 16):
                n = frontend.feed(data)
                with self.lock:
                    if last[0] != "c":
                        self.trips += 1
                        last[0] = "c"
                    self.statements += n
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def _down(self, src: socket.socket, dst: socket.socket, last: list[str]) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(1 << 16):
                with self.lock:
                    last[0] = "s"
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.listener.close()


# -- the libraries: one class each, the same few operations ---------------------------------------
@durably.task(cache=False)
def act(x: int) -> int:
    """A side effect's task: journaled, never looked up in nor written to the cache."""
    return x + 1


@durably.entrypoint
def chain_act(n: int, base: int) -> int:
    return sum(act(base + i) for i in range(n))


class Durably:
    name = "durably"

    def __init__(self, url: str, schema: str, store: Any = None) -> None:
        durably.configure(key=KEY)
        cls = postgres_store_class()
        if cls is None:
            raise RuntimeError("durably: PostgresStore not available")
        self.store = store or cls(url, schema=schema)
        durably.configure(store=self.store)

    def use(self) -> None:
        durably.configure(store=self.store)

    def execute(self, n: int, base: int) -> None:
        self.use()
        counts = chain.run(n, base).counts()
        if counts["ran"] != n:
            raise AssertionError(f"durably: expected {n} executed steps, got {counts}")

    def execute_uncached(self, n: int, base: int) -> None:
        self.use()
        counts = chain_act.run(n, base).counts()
        if counts["ran"] != n:
            raise AssertionError(f"durably: expected {n} executed steps, got {counts}")

    def prepare_replay(self, n: int, base: int) -> None:
        self.execute(n, base)

    def replay(self, n: int, base: int) -> None:
        self.use()
        counts = chain.run(n, base).counts()
        if counts["replayed"] != n:
            raise AssertionError(f"durably: expected {n} replayed steps, got {counts}")

    def hit(self) -> None:
        inc(-1)

    def close(self) -> None:
        self.store.close()


class Uncached:
    """durably's steps of a ``cache=False`` task: the journal alone."""

    def __init__(self, ours: Durably) -> None:
        self.execute = ours.execute_uncached


class LangGraph:
    name = "langgraph"

    def __init__(self, url: str, setup: bool = True) -> None:
        from langgraph.checkpoint.postgres import PostgresSaver
        from langgraph.func import entrypoint, task

        self.stack = contextlib.ExitStack()
        self.saver = self.stack.enter_context(PostgresSaver.from_conn_string(url))
        if setup:
            self.saver.setup()
        self.calls = [0]
        calls = self.calls

        @task
        def lg_inc(x: int) -> int:
            calls[0] += 1
            return x + 1

        def body(inputs: dict[str, int]) -> int:
            total = 0
            for i in range(inputs["n"]):
                total += lg_inc(inputs["base"] + i).result()
            if FAIL["on"]:
                raise RuntimeError("stopped after the steps, to be resumed")
            return total

        self.chain = entrypoint(checkpointer=self.saver)(body)

    @staticmethod
    def config(base: int) -> dict[str, Any]:
        return {"configurable": {"thread_id": f"t{base}"}}

    def execute(self, n: int, base: int) -> None:
        self.calls[0] = 0
        self.chain.invoke({"n": n, "base": base}, self.config(base))
        if self.calls[0] != n:
            raise AssertionError(f"LangGraph executed {self.calls[0]} tasks, not {n}")

    def prepare_replay(self, n: int, base: int) -> None:
        FAIL["on"] = True
        try:
            self.chain.invoke({"n": n, "base": base}, self.config(base))
        except RuntimeError:
            pass
        finally:
            FAIL["on"] = False

    def replay(self, n: int, base: int) -> None:
        self.calls[0] = 0
        self.chain.invoke(None, self.config(base))
        if self.calls[0]:
            raise AssertionError(f"LangGraph executed {self.calls[0]} tasks again on resume")

    def close(self) -> None:
        self.stack.close()


class Dbos:
    name = "dbos"
    _made = False

    def __init__(self, url: str, executor_id: str | None = None) -> None:
        from dbos import DBOS, DBOSConfig, SetWorkflowID

        if Dbos._made:
            raise RuntimeError("DBOS is one per process")
        Dbos._made = True
        config: DBOSConfig = {"name": "durably-bench", "system_database_url": url,
                              "run_admin_server": False, "log_level": "WARNING"}
        if executor_id:
            config["executor_id"] = executor_id
        DBOS(config=config)
        self.DBOS, self.SetWorkflowID = DBOS, SetWorkflowID
        self.calls = [0]
        calls = self.calls

        @DBOS.step()
        def step(x: int) -> int:
            calls[0] += 1
            return x + 1

        @DBOS.workflow()
        def workflow(n: int, base: int) -> int:
            return sum(step(base + i) for i in range(n))

        self.workflow = workflow
        DBOS.launch()
        from dbos._dbos import _get_dbos_instance

        # fork_workflow runs the fork from DBOS's internal queue, polled every second
        self.queue = _get_dbos_instance()._registry.get_internal_queue()

    def execute(self, n: int, base: int) -> None:
        self.calls[0] = 0
        with self.SetWorkflowID(f"w{base}"):
            self.workflow(n, base)
        if self.calls[0] != n:
            raise AssertionError(f"DBOS executed {self.calls[0]} steps, not {n}")

    def prepare_replay(self, n: int, base: int) -> None:
        self.execute(n, base)

    def replay(self, n: int, base: int) -> None:
        self.calls[0] = 0
        handle = self.DBOS.fork_workflow(f"w{base}", n + 1)
        handle.get_result(polling_interval_sec=0.002)
        if self.calls[0]:
            raise AssertionError(f"DBOS executed {self.calls[0]} steps again in a fork")

    def again(self, n: int, base: int) -> None:
        """The finished workflow started again with its id: its recorded output."""
        self.calls[0] = 0
        with self.SetWorkflowID(f"w{base}"):
            self.workflow(n, base)
        if self.calls[0]:
            raise AssertionError(f"DBOS executed {self.calls[0]} steps again")

    @contextlib.contextmanager
    def fast_queue(self) -> Iterator[None]:
        """The internal queue polled every 5 ms (the poll under way ends first)."""
        self.queue._polling_interval_sec = 0.005
        time.sleep(1.1)
        try:
            yield
        finally:
            self.queue._polling_interval_sec = 1.0

    def close(self) -> None:
        self.DBOS.destroy()


def open_tool(tool: str, url: str, schema: str, seed: int) -> Any:
    if tool == "durably":
        return Durably(url, schema)
    if tool == "langgraph":
        return LangGraph(url, setup=False)
    return Dbos(url, executor_id=f"bench-{seed}-{os.getpid()}")


# -- samples -------------------------------------------------------------------------------------
def interleave(samples: dict[str, Sample], repeat: int) -> dict[str, float]:
    """Median of ``repeat`` samples of each measurement, taken in turn (after one warm-up)."""
    for sample in samples.values():
        sample()
    got: dict[str, list[float]] = {name: [] for name in samples}
    for _ in range(repeat):
        for name, sample in samples.items():
            got[name].append(sample())
    return {name: statistics.median(values) for name, values in got.items()}


#: the process's CPU time (``time.process_time``, its threads included) per executed step,
#: by measurement, warm-up first: unlike wall time, hardly changed by other work on the
#: machine (the server's CPU is not in it)
CPU: dict[str, list[float]] = {}


def executed_sample(tool: Any, steps: int, name: str) -> Sample:
    def sample() -> float:
        base = next_base()
        t, cpu = time.perf_counter(), time.process_time()
        tool.execute(steps, base)
        wall = (time.perf_counter() - t) / steps
        CPU.setdefault(name, []).append((time.process_time() - cpu) / steps)
        return wall
    return sample


def cpu_median(name: str) -> float | None:
    """The median CPU time per executed step of ``name``'s samples, warm-up left out."""
    got = CPU.get(name, [])[1:]
    return statistics.median(got) if got else None


def replayed_sample(tool: Any, steps: int, around: Callable[[], Any] = contextlib.nullcontext,
                    replay: Callable[[int, int], None] | None = None) -> Sample:
    def sample() -> float:
        base = next_base()
        tool.prepare_replay(steps, base)
        with around():
            t = time.perf_counter()
            (replay or tool.replay)(steps, base)
            return (time.perf_counter() - t) / steps
    return sample


def resumed_sample(tool: Durably, steps: int) -> Sample:
    """durably: a run failing after its steps, then called again."""
    def sample() -> float:
        tool.use()
        base = next_base()
        FAIL["on"] = True
        with contextlib.suppress(RuntimeError):
            chain.run(steps, base)
        FAIL["on"] = False
        t = time.perf_counter()
        run = chain.run(steps, base)
        elapsed = time.perf_counter() - t
        if run.counts()["replayed"] != steps:
            raise AssertionError(f"durably resumed: {run.counts()}")
        return elapsed / steps
    return sample


def per_call(fn: Callable[[], Any], number: int) -> Sample:
    def sample() -> float:
        t = time.perf_counter()
        for _ in range(number):
            fn()
        return (time.perf_counter() - t) / number
    return sample


def raw_select(url: str) -> tuple[Callable[[], Any], Any]:
    """One small row read by key on a plain psycopg connection: one round trip."""
    import psycopg

    conn = psycopg.connect(url, autocommit=True)
    conn.execute("CREATE TABLE IF NOT EXISTS bench_kv (k text PRIMARY KEY, v bytea)")
    conn.execute("INSERT INTO bench_kv VALUES ('k', %s) ON CONFLICT DO NOTHING",
                 (os.urandom(120),))
    return (lambda: conn.execute("SELECT v FROM bench_kv WHERE k = %s", ("k",)).fetchone(),
            conn)


# -- worker processes ----------------------------------------------------------------------------
def worker_main(opts: argparse.Namespace) -> None:
    """A process of the ``writers`` and ``trips`` sections. It opens its library, prepares
    (untimed), says ``ready`` and waits for ``go`` on stdin; does the work; prints one JSON
    line; then waits for stdin to close before it shuts down (so a counter around the work
    sees the work only)."""
    result: dict[str, Any] = {"errors": 0, "messages": [], "steps": 0, "units": 0}
    tool: Any = None
    bases: list[int] = []
    try:
        tool = open_tool(opts.tool, opts.url, opts.schema, opts.seed)
        if opts.tool == "durably":
            tool.store.check()  # connected, the tables made (the writers race to make them)
        if opts.warm:  # one run first: connections opened, statements prepared
            if opts.action == "hit":
                tool.hit()
            elif opts.action == "uncached":
                tool.execute_uncached(opts.steps, next_base())
            else:
                tool.execute(opts.steps, next_base())
        if opts.action == "replayed":
            bases = [next_base() for _ in range(opts.runs)]
            for b in bases:
                tool.prepare_replay(opts.steps, b)
    except Exception as exc:  # noqa: BLE001 - a process that cannot start is counted
        result["errors"] += opts.runs
        result["messages"].append(f"start: {type(exc).__name__}: {exc}"[:400])
        tool = None
    print("ready", flush=True)
    sys.stdin.readline()
    result["start"] = time.time()
    if tool is not None:
        for r in range(opts.runs if opts.action != "hit" else 1):
            try:
                if opts.action in ("executed", "uncached"):
                    (tool.execute if opts.action == "executed" else tool.execute_uncached)(
                        opts.steps, next_base())
                    result["steps"] += opts.steps
                elif opts.action == "replayed":
                    tool.replay(opts.steps, bases[r])
                    result["steps"] += opts.steps
                else:
                    for _ in range(opts.hits):
                        tool.hit()
                    result["units"] += opts.hits
            except Exception as exc:  # noqa: BLE001 - every failed run is counted
                result["errors"] += 1
                if len(result["messages"]) < 3:
                    result["messages"].append(f"{type(exc).__name__}: {exc}"[:400])
    result["end"] = time.time()
    print(json.dumps(result), flush=True)
    sys.stdin.read()
    if tool is not None:
        tool.close()


def start_workers(argvs: list[list[str]]) -> list[subprocess.Popen[str]]:
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", *argv],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for argv in argvs]
    for p in procs:  # every one connected and prepared
        line = p.stdout.readline() if p.stdout else ""
        if line.strip() != "ready":
            for q in procs:
                q.kill()
            raise RuntimeError(f"a worker did not start ({line!r}); see its stderr above")
    return procs


def run_workers(argvs: list[list[str]], proxy: CountingProxy | None = None
                ) -> tuple[list[dict[str, Any]], tuple[int, int]]:
    """Start the workers, let them go at once, collect their results (and the proxy's counts
    over the work)."""
    procs = start_workers(argvs)
    before = proxy.snapshot() if proxy else (0, 0)
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    results = []
    for p in procs:
        assert p.stdout is not None
        line = p.stdout.readline()
        results.append(json.loads(line) if line.strip() else
                       {"errors": 1, "messages": ["no result"], "steps": 0, "units": 0})
    after = proxy.snapshot() if proxy else (0, 0)
    for p in procs:
        assert p.stdin is not None
        p.stdin.close()
        p.wait(timeout=120)
    return results, (after[0] - before[0], after[1] - before[1])


def worker_argv(tool: str, url: str, action: str, steps: int, runs: int, seed: int,
                schema: str = "bench", hits: int = 1, warm: bool = True) -> list[str]:
    return ["--tool", tool, "--url", url, "--action", action, "--steps", str(steps),
            "--runs", str(runs), "--seed", str(seed), "--schema", schema, "--hits", str(hits),
            *(["--warm"] if warm else [])]


# -- Dask ----------------------------------------------------------------------------------------
@durably.task
def item(i: int) -> int:
    return i + 1


@durably.entrypoint
def fan(n: int, base: int) -> int:
    return sum(item.map(range(base, base + n), executor="dask", progress=False))


@durably.task
def inner(i: int) -> int:
    return i * 2


@durably.task
def outer(i: int) -> int:
    return inner(i) + 1  # on a worker: a plain cached call into the store it reopened


@durably.entrypoint
def probe(n: int, base: int) -> int:
    return sum(outer.map(range(base, base + n), executor="dask", progress=False))


def plain_item(i: int) -> int:
    return i + 1


def dask_section(store: Any, items: int, repeat: int) -> dict[str, Any]:
    from distributed import Client, LocalCluster

    # the workers reopen the store from its URL: they need the key as every process does
    os.environ["DURABLY_KEY"] = KEY.decode()
    durably.configure(store=store)
    out: dict[str, Any] = {}
    with LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                      dashboard_address=None, silence_logs=logging.ERROR) as cluster, \
            Client(cluster) as client:
        client.gather(client.map(plain_item, range(100)))  # workers up
        fan.run(100, next_base())  # durably on the workers (imports, the store reopened)
        executed, replayed, raw = [], [], []
        for _ in range(repeat):
            base = next_base()
            t = time.perf_counter()
            run = fan.run(items, base)
            executed.append(time.perf_counter() - t)
            if run.counts()["ran"] != items:
                raise AssertionError(f"dask map: {run.counts()}")
            t = time.perf_counter()
            run = fan.run(items, base)
            replayed.append(time.perf_counter() - t)
            if run.counts()["replayed"] != items:
                raise AssertionError(f"dask map replayed: {run.counts()}")
            base = next_base()
            t = time.perf_counter()
            client.gather(client.map(plain_item, range(base, base + items), pure=False))
            raw.append(time.perf_counter() - t)
        out["executed_s"] = statistics.median(executed)
        out["replayed_s"] = statistics.median(replayed)
        out["raw_s"] = statistics.median(raw)
        # did the workers share the store? a task called inside the bodies, on the workers,
        # is a hit here afterwards
        base = next_base()
        probe.run(20, base)
        out["shared"] = sum(inner.explain(i).hit for i in range(base, base + 20))
    return out


# -- the main process ----------------------------------------------------------------------------
class Databases:
    """One database per library, made now and dropped at the end."""

    def __init__(self, url: str) -> None:
        import psycopg

        self.url = url
        self.admin = psycopg.connect(url, autocommit=True)
        self.prefix = f"durably_bench_{os.getpid()}"
        self.made: list[str] = []

    def make(self, tool: str) -> str:
        name = f"{self.prefix}_{tool}"
        self.admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.admin.execute(f'CREATE DATABASE "{name}"')
        self.made.append(name)
        return name

    def setting(self, name: str) -> str:
        return str(self.admin.execute(f"SHOW {name}").fetchone()[0])

    def drop(self) -> None:
        for name in self.made:
            with contextlib.suppress(Exception):
                self.admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.admin.close()


def row(rows: list[dict[str, Any]], measure: str, d: float | None, o: float | None,
        target: str, limit: float | None = None, unit: str = "s", **extra: Any) -> None:
    r: dict[str, Any] = {"measure": measure, f"durably_{unit}": d, f"other_{unit}": o,
                         "ratio": d / o if d is not None and o else None, "target": target,
                         "limit": limit, **extra}
    if o is None:
        del r[f"other_{unit}"]
    rows.append(r)


def main() -> None:
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--quick", action="store_true",
                        help="fewer samples, writer steps and Dask items (about a minute)")
    parser.add_argument("--steps", type=positive_int, default=100, help="steps a run (100)")
    parser.add_argument("--repeat", type=positive_int, help="samples of each (5; quick 3)")
    parser.add_argument("--hits", type=positive_int, default=500, help="hits a sample (500)")
    parser.add_argument("--resume-steps", type=positive_int, default=10_000,
                        help="steps of the resumed run (10,000)")
    parser.add_argument("--writers", type=positive_int, default=8, help="writer processes (8)")
    parser.add_argument("--writer-steps", type=positive_int,
                        help="steps each writer executes (500; quick 200)")
    parser.add_argument("--items", type=positive_int, help="Dask map items (10,000; quick 2,000)")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated, of {', '.join(SECTIONS)} (default: all)")
    parser.add_argument("--no-peers", action="store_true", help="durably only")
    # a worker process (internal)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tool", default="durably", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--action", default="executed", help=argparse.SUPPRESS)
    parser.add_argument("--runs", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--schema", default="bench", help=argparse.SUPPRESS)
    parser.add_argument("--warm", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.worker:
        worker_main(opts)
        return
    sections = [s.strip() for s in opts.sections.split(",") if s.strip()]
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown section {unknown}; choose from {list(SECTIONS)}")
    repeat = opts.repeat or (3 if opts.quick else 5)
    writer_steps = opts.writer_steps or (200 if opts.quick else 500)
    items = opts.items or (2_000 if opts.quick else 10_000)
    dask_repeat = 1 if opts.quick else 2

    url = server_url()
    if not url:
        print(START_SERVER)
        return
    has_store = postgres_store_class() is not None
    peers = [] if opts.no_peers else ["langgraph", "dbos"]
    for name, module in (("langgraph", "langgraph.checkpoint.postgres"), ("dbos", "dbos"),
                         ("dask", "distributed")):
        if name in peers or (name == "dask" and "dask" in sections):
            try:
                __import__(module)
            except ImportError as exc:
                print(f"{name}: not measured, {module} cannot be imported ({exc}); "
                      "pip install -e '.[postgres,dask,bench]'", flush=True)
                if name in peers:
                    peers.remove(name)
                else:
                    sections.remove("dask")
    dbs = Databases(url)
    print(f"server: PostgreSQL {dbs.setting('server_version')}, fsync={dbs.setting('fsync')}, "
          f"synchronous_commit={dbs.setting('synchronous_commit')}; {os.cpu_count()} CPUs; "
          f"steps a run {opts.steps}, {repeat} samples", flush=True)
    urls = {tool: database_url(url, dbs.make(tool))
            for tool in (["durably"] if has_store else []) + peers}
    if "langgraph" in urls:  # its tables, once (the worker processes do not race to make them)
        LangGraph(urls["langgraph"]).close()
    rows: list[dict[str, Any]] = []
    extra: dict[str, Any] = {"steps": opts.steps, "repeat": repeat, "sections": sections,
                             "durably_store": has_store}
    store = None
    try:
        if has_store:
            durably.configure(key=KEY)
            store = durably.PostgresStore(urls["durably"], schema="bench")
        if "calls" in sections:
            print("== calls", file=sys.stderr, flush=True)
            rows += calls_section(urls, store, opts.steps, opts.hits, repeat, peers, extra)
        if "trips" in sections:
            print("== round trips", file=sys.stderr, flush=True)
            rows += trips_section(url, urls, dbs, opts.steps, opts.hits, peers, has_store,
                                  extra)
        if "resume" in sections and store is not None:
            print("== resume", file=sys.stderr, flush=True)
            rows += resume_section(store, opts.resume_steps, extra)
        if "writers" in sections:
            print("== writers", file=sys.stderr, flush=True)
            rows += writers_section(urls, opts.writers, writer_steps, opts.steps, peers,
                                    has_store, extra)
        if "dask" in sections and store is not None:
            print("== dask", file=sys.stderr, flush=True)
            rows += dask_rows(store, items, dask_repeat, extra)
    finally:
        durably.configure()
        if store is not None:
            store.close()
        dbs.drop()
    if not has_store:
        rows.insert(0, {"measure": "durably: PostgresStore not available (peers only)"})
    report("postgres", rows, **extra)


def calls_section(urls: dict[str, str], store: Any, steps: int, hits: int, repeat: int,
                  peers: list[str], extra: dict[str, Any]) -> list[dict[str, Any]]:
    samples: dict[str, Sample] = {}
    closers: list[Callable[[], Any]] = []
    ours = None
    try:
        if store is not None:
            ours = Durably(urls["durably"], "bench", store)
            select, conn = raw_select(urls["durably"])
            closers.append(conn.close)
            ours.hit()
            samples.update({
                "durably.executed": executed_sample(ours, steps, "durably.executed"),
                "durably.uncached": executed_sample(Uncached(ours), steps,
                                                     "durably.uncached"),
                "durably.replayed": replayed_sample(ours, steps),
                "durably.resumed": resumed_sample(ours, steps),
                "durably.hit": lambda: (ours.use(), per_call(ours.hit, hits)())[1],
                "psycopg.select": per_call(select, hits),
            })
        if "langgraph" in peers:
            lg = LangGraph(urls["langgraph"])
            closers.append(lg.close)
            samples.update({"langgraph.executed": executed_sample(lg, steps, "langgraph.executed"),
                            "langgraph.replayed": replayed_sample(lg, steps)})
        if "dbos" in peers:
            db = Dbos(urls["dbos"])
            closers.append(db.close)

            def again(n: int, base: int) -> None:
                db.again(n, base)
            samples.update({"dbos.executed": executed_sample(db, steps, "dbos.executed"),
                            "dbos.replayed": replayed_sample(db, steps, db.fast_queue),
                            "dbos.again": replayed_sample(db, steps, replay=again)})
        got = interleave(samples, repeat)
    finally:
        for close in reversed(closers):
            close()
    extra["calls"] = got
    g = got.get
    rows: list[dict[str, Any]] = [{"measure": f"calls (runs of {steps} steps; medians)"}]
    row(rows, "executed step on PostgreSQL vs LangGraph + PostgresSaver", g("durably.executed"),
        g("langgraph.executed"), "<= 0.5", 0.5)
    row(rows, "executed step on PostgreSQL vs DBOS (PostgreSQL)", g("durably.executed"),
        g("dbos.executed"), "<= 0.2", 0.2)
    row(rows, "  ... a cache=False task's step vs LangGraph", g("durably.uncached"),
        g("langgraph.executed"), "(info: the journal alone, no cache lookup nor write)")
    extra["client_cpu"] = {name: cpu_median(name) for name in CPU}
    for peer, label in (("langgraph", "LangGraph"), ("dbos", "DBOS")):
        row(rows, f"  ... client CPU per executed step vs {label}",
            cpu_median("durably.executed"), cpu_median(f"{peer}.executed"),
            "(info: process_time, threads included; load-independent, server CPU not in it)")
    row(rows, "replayed step vs LangGraph resumed after an error", g("durably.replayed"),
        g("langgraph.replayed"), "(info)")
    row(rows, "replayed step vs DBOS fork_workflow (queue poll 5 ms)", g("durably.replayed"),
        g("dbos.replayed"), "(info)")
    row(rows, "  ... durably resumed after an error vs LangGraph", g("durably.resumed"),
        g("langgraph.replayed"), "(info: the same kind of resume)")
    row(rows, "  ... finished run called again vs DBOS same workflow id", g("durably.replayed"),
        g("dbos.again"), "(info: DBOS returns the recorded output, no step runs)")
    row(rows, "cache hit outside a run vs psycopg SELECT of one row", g("durably.hit"),
        g("psycopg.select"), "(info: the floor of one round trip)")
    return rows


def trips_section(url: str, urls: dict[str, str], dbs: Databases, steps: int, hits: int,
                  peers: list[str], has_store: bool, extra: dict[str, Any]
                  ) -> list[dict[str, Any]]:
    proxy = CountingProxy(url)
    counted: dict[str, tuple[float, float]] = {}
    runs = 3
    try:
        jobs = []
        if has_store:
            jobs += [("durably.executed", "durably", "executed"),
                     ("durably.uncached", "durably", "uncached"),
                     ("durably.replayed", "durably", "replayed"),
                     ("durably.hit", "durably", "hit")]
        if "langgraph" in peers:
            jobs += [("langgraph.executed", "langgraph", "executed"),
                     ("langgraph.replayed", "langgraph", "replayed")]
        if "dbos" in peers:
            jobs += [("dbos.executed", "dbos", "executed")]
        for name, tool, action in jobs:
            dbname = url_params(urls[tool])["dbname"]
            results, (trips, stmts) = run_workers(
                [worker_argv(tool, proxy.url(dbname), action, steps, runs, 0, schema="trips",
                             hits=hits)], proxy)
            if results[0]["errors"]:
                print(f"{name}: {results[0]['messages']}", file=sys.stderr)
                continue
            units = results[0]["units"] or results[0]["steps"]
            counted[name] = (100 * trips / units, 100 * stmts / units)
    finally:
        proxy.close()
    extra["round_trips"] = counted
    rows: list[dict[str, Any]] = [{"measure": "round trips to the server, through a counting "
                                              "proxy (statements in the JSON)"}]
    for what, label in (("executed", "per 100 executed steps"),
                        ("uncached", "  ... of a cache=False task"),
                        ("replayed", "per 100 replayed steps"), ("hit", "per 100 cache hits")):
        d = counted.get(f"durably.{what}")
        compared = False
        for peer, peer_label in (("langgraph", "LangGraph"), ("dbos", "DBOS")):
            o = counted.get(f"{peer}.{'executed' if what == 'uncached' else what}")
            if o is not None:
                compared = True
                row(rows, f"{label} vs {peer_label}", d[0] if d else None, o[0], "(info)",
                    unit="n", durably_statements=d[1] if d else None, other_statements=o[1])
        if not compared and d is not None:
            row(rows, label, d[0], None, "(info)" if what != "hit" else "(info: 100 is one a "
                "hit)", unit="n", durably_statements=d[1])
    print("round trips (statements) per step or hit:", ", ".join(
        f"{k} {t / 100:.2f} ({s / 100:.2f})" for k, (t, s) in counted.items()), flush=True)
    return rows


def resume_section(store: Any, steps: int, extra: dict[str, Any]) -> list[dict[str, Any]]:
    durably.configure(store=store)
    base = next_base()
    FAIL["on"] = True
    t = time.perf_counter()
    with contextlib.suppress(RuntimeError):
        chain.run(steps, base)
    executed = time.perf_counter() - t
    FAIL["on"] = False
    t = time.perf_counter()
    run = chain.run(steps, base)
    resumed = time.perf_counter() - t
    if run.counts()["replayed"] != steps:
        raise AssertionError(f"resume: {run.counts()}")
    t = time.perf_counter()
    run = chain.run(steps, base)
    again = time.perf_counter() - t
    if run.counts()["replayed"] != steps:
        raise AssertionError(f"finished run again: {run.counts()}")
    extra["resume"] = {"steps": steps, "executed_s": executed, "resumed_s": resumed,
                       "again_s": again}
    print(f"{steps:,}-step run: executed in {executed:.2f} s, resumed in {resumed:.3f} s, "
          f"called again once finished in {again:.3f} s", flush=True)
    rows: list[dict[str, Any]] = [{"measure": f"a {steps:,}-step run"}]
    row(rows, f"resume of a {steps:,}-step run on PostgreSQL", resumed, None, "< 1 s", 1.0,
        on="durably_s")
    row(rows, "  ... the finished run called again", again, None, "(info)")
    row(rows, "  ... executing it (before the resume)", executed, None, "(info)")
    return rows


def writers_section(urls: dict[str, str], writers: int, writer_steps: int, steps: int,
                    peers: list[str], has_store: bool, extra: dict[str, Any]
                    ) -> list[dict[str, Any]]:
    runs = max(1, writer_steps // steps)
    per_tool: dict[str, dict[str, Any]] = {}
    for tool in (["durably"] if has_store else []) + peers:
        # no warm-up run: the processes open the store together (durably: a schema nobody
        # has made yet, so they also race to create it)
        argvs = [worker_argv(tool, urls[tool], "executed", steps, runs, i, schema="writers",
                             warm=False) for i in range(writers)]
        results, _ = run_workers(argvs)
        done = sum(r["steps"] for r in results)
        errors = sum(r["errors"] for r in results)
        wall = max(r["end"] for r in results) - min(r["start"] for r in results)
        messages = [m for r in results for m in r["messages"]][:5]
        per_tool[tool] = {"steps": done, "errors": errors, "wall_s": wall,
                          "steps_per_s": done / wall if wall > 0 else None,
                          "messages": messages}
        print(f"{writers} writers, {tool}: {done:,} steps in {wall:.2f} s "
              f"({done / wall:,.0f}/s), {errors} failed runs"
              + (f": {messages}" if messages else ""), flush=True)
    extra["writers"] = per_tool
    d = per_tool.get("durably", {})
    rows: list[dict[str, Any]] = [
        {"measure": f"{writers} writer processes, {runs * steps} steps each, one store"}]
    for peer, label in (("langgraph", "LangGraph"), ("dbos", "DBOS")):
        if peer in per_tool:
            row(rows, f"steps/s vs {label} (higher is better)", d.get("steps_per_s"),
                per_tool[peer]["steps_per_s"], "(info: ratio > 1, durably faster)", unit="n")
    if not peers:
        row(rows, "steps/s", d.get("steps_per_s"), None, "(info)", unit="n")
    row(rows, f"failed runs of {writers} writer processes", d.get("errors"), None, "0", 0,
        unit="n", on="durably_n")
    return rows


def dask_rows(store: Any, items: int, repeat: int, extra: dict[str, Any]
              ) -> list[dict[str, Any]]:
    got = dask_section(store, items, repeat)
    extra["dask"] = got
    print(f"Dask map of {items:,} items: a new run {items / got['executed_s']:,.0f} items/s, "
          f"replayed {items / got['replayed_s']:,.0f}/s; plain client.map "
          f"{items / got['raw_s']:,.0f}/s; workers sharing the store: {got['shared']}/20",
          flush=True)
    rows: list[dict[str, Any]] = [{"measure": f"Dask map of {items:,} items, "
                                              "LocalCluster(processes=True, n_workers=2)"}]
    row(rows, "items/s in a new run vs plain client.map (higher is better)",
        items / got["executed_s"], items / got["raw_s"], "(info: what journaling costs)",
        unit="n")
    row(rows, "  ... items/s replaying the run (nothing sent)", items / got["replayed_s"], None,
        "(info)", unit="n")
    row(rows, "  ... Dask workers share the store (tasks of 20 found)", got["shared"], None,
        "20 (workers reopen the store)", 20, unit="n", on="durably_n", op=">=")
    return rows


if __name__ == "__main__":
    main()
