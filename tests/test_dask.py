"""The Dask executor against a real ``distributed.LocalCluster`` with worker processes."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import pickle
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
from durably.executors import Dask

from .conftest import run_script, script_env, write_script

distributed = pytest.importorskip("distributed")

pytestmark = pytest.mark.slow


def _mark(log: str, text: str) -> None:
    with open(log, "a") as f:
        f.write(text + "\n")


def _lines(log: str | Path) -> list[str]:
    path = Path(log)
    return path.read_text().splitlines() if path.exists() else []


@durably.task
def where(x: int) -> tuple[int, int]:
    return x, os.getpid()


@durably.task(ignore=("log",))
def leaf(x: int, log: str) -> int:
    _mark(log, f"leaf {x}")
    return x * 3


@durably.task(ignore=("log",))
def branch(x: int, log: str) -> int:
    _mark(log, f"branch {x}")
    return leaf(x, log) + 1


@durably.task(ignore=("log", "flags"))
def flaky(x: int, log: str, flags: str) -> int:
    _mark(log, f"flaky {x}")
    if os.path.exists(os.path.join(flags, str(x))):
        raise ValueError(f"item {x} failed")
    return -x


@durably.task(ignore=("log",))
def dies_at_two(x: int, log: str) -> int:
    _mark(log, f"item {x}")
    time.sleep(0.1)
    if x == 2:
        os._exit(1)  # the worker dies (again on each retry of the scheduler)
    return x


@durably.task
async def adouble(x: int) -> int:
    await asyncio.sleep(0)
    return 2 * x


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=":0")
    with cluster, distributed.Client(cluster) as c:
        yield c


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[durably.DiskStore]:
    store = durably.DiskStore(tmp_path / "shared-store")
    durably.configure(store=store)
    yield store
    durably.configure()
    store.close()


@pytest.fixture
def log(tmp_path: Path) -> str:
    return str(tmp_path / "calls.log")


def test_map_on_a_cluster_keeps_input_order_and_runs_on_workers(client: Any, disk: Any) -> None:
    out = where.map(range(8), executor=Dask(client))
    assert [x for x, _ in out] == list(range(8))
    pids = {pid for _, pid in out}
    assert os.getpid() not in pids
    assert pids <= set(client.run(os.getpid).values())
    assert where.map(range(8), executor="dask") == out  # the current client; all cached


def test_nested_tasks_on_dask_workers_are_cached_in_the_store(client: Any, disk: Any,
                                                              log: str) -> None:
    assert branch.map([1, 2, 3], [log] * 3, executor=Dask(client)) == [4, 7, 10]
    assert leaf(2, log) == 6  # written by a worker process, read here
    assert branch.map([1, 2, 3], [log] * 3, executor="dask") == [4, 7, 10]
    assert sorted(_lines(log)) == ["branch 1", "branch 2", "branch 3", "leaf 1", "leaf 2",
                                   "leaf 3"]


def test_failures_in_a_run_and_a_rerun_of_only_them(client: Any, disk: Any, log: str,
                                                    tmp_path: Path) -> None:
    flags = tmp_path / "flags"
    flags.mkdir()
    (flags / "2").touch()

    @durably.entrypoint
    def job(n: int) -> list[int]:
        return flaky.map(range(n), [log] * n, [str(flags)] * n, executor=Dask(client),
                         max_workers=2)

    with pytest.raises(ExceptionGroup) as info:
        job(5)
    (exc,) = info.value.exceptions
    assert isinstance(exc, ValueError) and str(exc) == "item 2 failed"
    assert "flaky" in str(exc.__cause__)  # the worker's traceback
    (flags / "2").unlink()
    run = job.run(5)
    assert run.result == [0, -1, -2, -3, -4]
    assert run.counts()["replayed"] == 4 and run.counts()["ran"] == 1
    assert sorted(_lines(log)) == sorted([f"flaky {x}" for x in range(5)] + ["flaky 2"])


def test_submit_and_async_tasks(client: Any, disk: Any, log: str) -> None:
    pool = Dask(client)
    futures = [pool.submit(leaf, x, log) for x in range(4)]
    assert sorted(f.result() for f in concurrent.futures.as_completed(futures)) == [0, 3, 6, 9]

    async def main() -> list[int]:
        return await adouble.map(range(5), executor=pool)

    assert asyncio.run(main()) == [0, 2, 4, 6, 8]


CLUSTER_FANOUT = """
import os, time
import distributed
import durably

def mark(text):
    with open(os.environ["COUNT_FILE"], "a") as f:
        f.write(text + "\\n")
        f.flush()
        os.fsync(f.fileno())

@durably.task
def work(i):
    mark(str(i))
    block = int(os.environ.get("BLOCK_FROM", "-1"))
    if 0 <= block <= i:
        os.write(1, f"blocked {i}\\n".encode())
        while not os.path.exists(os.environ["RELEASE_FILE"]):
            time.sleep(0.02)
    return i * 10

@durably.entrypoint
def pipeline(n):
    return sum(work.map(range(n), executor="dask", max_workers=2))

if __name__ == "__main__":
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as cluster:
        with distributed.Client(cluster):
            print("result", pipeline(int(os.environ["ITEMS"])), flush=True)
"""


def test_sigkill_halfway_through_a_dask_map_resumes_exactly(tmp_path: Path) -> None:
    n, block = 10, 5
    script = write_script(tmp_path / "cluster_fanout.py", CLUSTER_FANOUT)
    count, release = tmp_path / "count.txt", tmp_path / "release"
    env = script_env(tmp_path / "store", COUNT_FILE=str(count), RELEASE_FILE=str(release),
                     BLOCK_FROM=str(block), ITEMS=str(n))
    with subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                          start_new_session=True) as proc:
        watchdog = threading.Timer(180, os.killpg, (proc.pid, signal.SIGKILL))
        watchdog.start()
        try:
            assert proc.stdout is not None and proc.stderr is not None
            blocked, seen = 0, ""
            while blocked < 2:
                line = proc.stdout.readline()
                seen += line
                if not line:
                    break
                blocked += line.count("blocked")
        finally:
            watchdog.cancel()
            os.killpg(proc.pid, signal.SIGKILL)  # the script, the cluster and its workers
            proc.wait(timeout=30)
            release.touch()
        assert blocked == 2, f"{seen}\n{proc.stderr.read()}"

    store = durably.DiskStore(tmp_path / "store")
    (run,) = store.list_runs()
    finished = set()
    for step in store.list_steps(run.run_id):
        data = store.find_step(run.run_id, step.step_id)
        if step.status == "ran" and data is not None:
            finished.add(pickle.loads(data) // 10)
    store.close()
    assert finished == set(range(block))

    count.unlink()
    env["BLOCK_FROM"] = "-1"
    out = run_script(script, env, timeout=180)
    assert out.stdout == f"result {sum(i * 10 for i in range(n))}\n"
    assert sorted(int(x) for x in _lines(count)) == list(range(block, n))


@pytest.mark.slow
def test_finished_items_never_run_again_when_a_worker_dies(disk: Any, log: str) -> None:
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=":0")

    @durably.entrypoint
    def main(n: int) -> list[int]:
        return dies_at_two.map(range(n), [log] * n, executor="dask")

    with cluster, distributed.Client(cluster), pytest.raises(ExceptionGroup) as group:
        main(5)
    assert {type(e).__name__ for e in group.value.exceptions} == {"KilledWorker"}
    finished = [int(s.inputs.partition("=")[2].partition(",")[0])
                for s in durably.list_runs(main)[0].steps if s.status == "ran" and s.inputs]
    assert finished, "some items finished"
    # each finished item ran once: its result was released, never recomputed on a death
    assert {x: _lines(log).count(f"item {x}") for x in finished} == {x: 1 for x in finished}


NESTED_MAPS = """
import asyncio, os, time
import distributed
import durably

@durably.task
def leaf(x):
    return x * 10, os.getpid()

@durably.task
def middle(x):
    return [v for v, _ in leaf.map(range(x, x + 3), executor="dask")]

@durably.task
def top(x):  # a map inside a map inside a map, every level on the cluster
    return middle.map(range(x, x + 2), executor="dask")

@durably.task
async def aleaf(x):
    return x + 1

@durably.task
async def amiddle(x):
    return sum(await aleaf.map(range(x, x + 3), executor="dask"))

@durably.task(timeout=60)
def timed(x):  # its body runs in a thread of its own: the pool thread waits for it
    return [v for v, _ in leaf.map([x, x + 1], executor="dask")]

@durably.task
def between(x):  # a thread map between two Dask levels
    return middle.map([x, x + 1], executor="thread")

@durably.task
async def gathered(x):  # two maps of one async body at once: rejoined after the last
    fast, slow = await asyncio.gather(aleaf.map([x], executor="dask"),
                                      aslow.map([x, x + 1, x + 2], executor="dask"))
    return fast + slow

@durably.task
async def aslow(x):
    await asyncio.sleep(0.3)
    return -x

@durably.entrypoint
def job(n):
    return top.map(range(n), executor="dask")

@durably.entrypoint
async def ajob(n):
    return await amiddle.map(range(n), executor="dask")

if __name__ == "__main__":
    # one worker with one thread: a body waiting for its items in the pool's only thread
    # would leave none for them
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as cluster:
        with distributed.Client(cluster) as client:
            print("sync", job(3), flush=True)
            print("async", asyncio.run(ajob(3)), flush=True)
            start = time.monotonic()
            print("timed", timed.map([0, 5], executor="dask"), time.monotonic() - start < 30,
                  flush=True)
            print("between", between.map([0], executor="dask"), flush=True)
            print("gathered", asyncio.run(gathered.map([0, 10], executor="dask")), flush=True)
            # the body's thread is back in the pool: the cluster still runs items
            (worker_pid,) = client.run(os.getpid).values()
            pids = {pid for _, pid in leaf.map(range(100, 104), executor="dask")}
            print("after", pids == {worker_pid} and worker_pid != os.getpid(), flush=True)
            print("rerun", job(3) == job(3), flush=True)
"""


def test_maps_nested_in_items_on_a_one_thread_worker_do_not_deadlock(tmp_path: Path) -> None:
    script = write_script(tmp_path / "nested_maps.py", NESTED_MAPS)
    env = script_env(tmp_path / "store")
    with subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                          start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=150)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the script, the cluster and its workers
            out, err = proc.communicate()
            pytest.fail(f"the nested maps hung (a deadlock):\n{out}\n{err[-3000:]}")
    assert proc.returncode == 0, f"{out}\n{err}"
    rows = [[[10 * v for v in range(y, y + 3)] for y in (x, x + 1)] for x in range(3)]
    assert out.splitlines() == [
        f"sync {rows}", "async [6, 9, 12]", "timed [[0, 10], [50, 60]] True",
        "between [[[0, 10, 20], [10, 20, 30]]]", "gathered [[1, 0, -1, -2], [11, -10, -11, -12]]",
        "after True", "rerun True"]
