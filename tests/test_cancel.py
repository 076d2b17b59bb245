"""Cancellation (issue 36, point 8): the siblings of a failed StateGraph node and of a failed
entrypoint's submitted tasks are cancelled (async ones get CancelledError, sync ones see
durably.cancelled() and stop at their next step), a run is stopped from another thread with
durably.cancel_run, and @entrypoint(timeout=) stops a run; each leaves the run resumable,
and the resumed run executes exactly the steps that had not finished.

Threads meet on events, never on sleeps: every wait is bounded (30 s) only so that a broken
build fails instead of hanging, and no outcome depends on the machine's speed."""

from __future__ import annotations

import asyncio
import concurrent.futures
import operator
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

import durably
from durably import END, START, StateGraph

BOUND = 30.0  # seconds: only a broken build waits this long


def _until(predicate: Any) -> bool:
    """Poll ``predicate`` (every 5 ms) until it is true or BOUND passes."""
    end = time.monotonic() + BOUND
    while not predicate():
        if time.monotonic() > end:
            return False
        time.sleep(0.005)
    return True


class Log(TypedDict):
    log: Annotated[list[str], operator.add]


def test_cancelled_is_false_outside_a_run_and_in_a_run_going_on(disk_store: Any) -> None:
    assert durably.cancelled() is False

    @durably.task
    def look() -> bool:
        return durably.cancelled()

    @durably.entrypoint
    def job() -> bool:
        return look()

    assert job() is False
    assert durably.cancel_run("nothing-runs-here") is False
    with pytest.raises(durably.DefinitionError, match="invalid run_id"):
        durably.cancel_run("no spaces allowed")


def test_cancel_run_from_another_thread_stops_a_sync_run_resumably(disk_store: Any) -> None:
    executed: list[int] = []
    inside = threading.Event()
    first = threading.Event()
    first.set()

    @durably.task
    def part(i: int) -> int:
        if i == 2 and first.is_set():
            inside.set()  # the other thread cancels now, while this step runs
            assert _until(durably.cancelled)  # the cooperative signal, seen inside the step
        executed.append(i)
        return i * 10

    @durably.entrypoint
    def job(n: int) -> list[int]:
        return [part(i) for i in range(n)]

    outcome: list[BaseException | None] = []

    def call() -> None:
        try:
            job.run(5, run_id="cancel-me")
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - looked at below
            outcome.append(exc)

    worker = threading.Thread(target=call)
    worker.start()
    assert inside.wait(BOUND)
    assert durably.cancel_run("cancel-me") is True
    worker.join(BOUND)
    (error,) = outcome
    assert type(error) is durably.RunCancelledError
    assert error.run_id == "cancel-me" and error.steps == 3
    assert "cancel_run" in str(error) and "same arguments" in str(error)
    assert executed == [0, 1, 2]  # the step running at the cancel finished; none started after
    run = durably.get_run("cancel-me")
    assert run.status == "stopped" and "cancel_run" in (run.error or "")
    assert durably.cancel_run("cancel-me") is False  # it no longer executes

    first.clear()
    resumed = job.run(5, run_id="cancel-me")
    assert resumed.result == [0, 10, 20, 30, 40]
    assert executed == [0, 1, 2, 3, 4]  # only the missing steps executed
    assert [s.status for s in resumed.steps] == ["replayed"] * 3 + ["ran"] * 2


def test_timeout_stops_a_run_and_a_call_again_resumes_it(disk_store: Any) -> None:
    executed: list[int] = []
    first = threading.Event()
    first.set()

    @durably.task
    def part(i: int) -> int:
        if i == 1 and first.is_set():
            assert _until(durably.cancelled)  # the timeout passes while this step runs
        executed.append(i)
        return i

    @durably.entrypoint(timeout=0.5)
    def job(n: int) -> int:
        return sum(part(i) for i in range(n))

    with pytest.raises(durably.RunTimeoutError) as caught:
        job(4)
    error = caught.value
    assert isinstance(error, TimeoutError) and isinstance(error, durably.RunCancelledError)
    assert error.timeout == 0.5
    assert "timeout of 0.5 s" in str(error) and ".job'" in str(error)
    assert error.run_id in str(error) and "durably resume" in str(error)
    # (step 1 waits for the timeout, so 2 steps finish; on a machine so loaded that the
    # timeout passed before step 1 began, fewer: what finished is what is kept, either way)
    done = error.steps
    assert done <= 2 and executed == list(range(done))
    (run,) = durably.list_runs()
    assert run.status == "stopped" and "timed out" in (run.error or "")

    first.clear()
    assert job(4) == 6  # the whole timeout again: the rest executes
    assert executed == [0, 1, 2, 3]  # each step executed once
    assert [s.status for s in durably.list_runs()[0].steps] == (
        ["replayed"] * done + ["ran"] * (4 - done))


def test_timeout_of_an_async_entrypoint_cancels_its_await(disk_store: Any) -> None:
    executed: list[str] = []
    first = threading.Event()
    first.set()

    @durably.task
    async def fetch(name: str) -> str:
        if name == "slow" and first.is_set():
            await asyncio.sleep(BOUND)  # cancelled by the timeout
        executed.append(name)
        return name

    @durably.entrypoint(timeout=0.5)
    async def job() -> list[str]:
        return [await fetch("quick"), await fetch("slow")]

    with pytest.raises(durably.RunTimeoutError) as caught:
        asyncio.run(job())
    assert executed == ["quick"][:caught.value.steps]  # (["quick"] unless the timeout came first)
    assert durably.list_runs()[0].status == "stopped"
    first.clear()
    assert asyncio.run(job()) == ["quick", "slow"]
    assert executed == ["quick", "slow"]  # each executed once


def test_cancel_run_cancels_an_async_entrypoint_from_another_thread(disk_store: Any) -> None:
    waiting = threading.Event()

    @durably.task
    async def forever() -> None:
        waiting.set()
        await asyncio.sleep(BOUND)

    @durably.entrypoint
    async def job() -> None:
        await forever()

    def cancel_when_waiting() -> bool:
        assert waiting.wait(BOUND)
        return durably.cancel_run("async-run")

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        cancelled = pool.submit(cancel_when_waiting)
        with pytest.raises(durably.RunCancelledError, match="async-run"):
            asyncio.run(job.run(run_id="async-run"))
        assert cancelled.result(BOUND) is True
    assert durably.get_run("async-run").status == "stopped"


@pytest.mark.parametrize("bad", [0, -1, "10", True, float("inf")])
def test_a_bad_timeout_is_refused(bad: Any) -> None:
    with pytest.raises(durably.DefinitionError, match=r"timeout=.*seconds > 0"):
        durably.entrypoint(timeout=bad)
    with pytest.raises(durably.DefinitionError, match=r"compile\(timeout=\.\.\.\)"):
        g = StateGraph(Log, name="bad_timeout")
        g.add_node("a", lambda s: {"log": ["a"]})
        g.add_edge(START, "a").add_edge("a", END)
        g.compile(timeout=bad)


def test_a_failed_node_cancels_its_super_step_siblings(disk_store: Any) -> None:
    """quick finishes before fail fails; steady's next step raises (its finished pieces
    are kept); polite sees durably.cancelled() and leaves; sleepy (async) is cancelled.
    After the fix, only what had not finished executes: quick and steady's pieces are
    replayed."""
    executed: list[str] = []
    first = threading.Event()
    first.set()
    quick_done, steady_ready, polite_ready, sleepy_ready = (
        threading.Event(), threading.Event(), threading.Event(), threading.Event())
    seen: list[str] = []

    @durably.task
    def piece(k: int) -> int:
        executed.append(f"piece{k}")
        return k

    def quick(s: Log) -> dict[str, Any]:
        executed.append("quick")
        quick_done.set()
        return {"log": ["quick"]}

    def fail(s: Log) -> dict[str, Any]:
        if first.is_set():
            for ready in (quick_done, steady_ready, polite_ready, sleepy_ready):
                assert ready.wait(BOUND)
            raise ValueError("bad input")
        executed.append("fail")
        return {"log": ["fail"]}

    def steady(s: Log) -> dict[str, Any]:
        got = [piece(0), piece(1)]
        if first.is_set():
            steady_ready.set()
            assert _until(durably.cancelled)
            seen.append("steady")
        got.append(piece(2))  # a step after the cancel: raises
        return {"log": [f"steady{sum(got)}"]}

    def polite(s: Log) -> dict[str, Any]:
        if first.is_set():
            polite_ready.set()
            assert _until(durably.cancelled)
            seen.append("polite")
            raise asyncio.CancelledError  # leaves without a result: executes on resume
        executed.append("polite")
        return {"log": ["polite"]}

    async def sleepy(s: Log) -> dict[str, Any]:
        if first.is_set():
            sleepy_ready.set()
            try:
                await asyncio.sleep(BOUND)
            except asyncio.CancelledError:
                seen.append("sleepy")
                raise
        executed.append("sleepy")
        return {"log": ["sleepy"]}

    g = StateGraph(Log, name="siblings")
    for name, fn in [("quick", quick), ("fail", fail), ("steady", steady),
                     ("polite", polite), ("sleepy", sleepy)]:
        g.add_node(name, fn)
        g.add_edge(START, name).add_edge(name, END)
    app = g.compile()

    started = time.monotonic()
    with pytest.raises(ValueError, match="bad input") as caught:
        app.invoke({"log": []}, run_id="sib")
    assert time.monotonic() - started < BOUND  # sleepy did not sleep on
    assert any("node 'fail'" in n for n in getattr(caught.value, "__notes__", []))
    assert sorted(seen) == ["polite", "sleepy", "steady"]
    # (quick and steady run side by side: in either order)
    assert sorted(executed) == ["piece0", "piece1", "quick"]
    assert durably.get_run("sib").status == "failed"

    first.clear()
    executed.clear()
    final = app.invoke(None, run_id="sib")
    assert sorted(final["log"]) == sorted(["quick", "fail", "steady3", "polite", "sleepy"])
    # quick and steady's two pieces were replayed; piece2 (refused) and the rest executed
    assert sorted(executed) == sorted(["fail", "piece2", "polite", "sleepy"])


def test_a_node_failure_never_hides_behind_a_sibling_stop(disk_store: Any) -> None:
    """Two nodes fail, a third is cancelled: the group names the two failures only."""
    go = threading.Barrier(2)

    def boom(which: str) -> Any:
        def node(s: Log) -> dict[str, Any]:
            go.wait(BOUND)
            raise KeyError(which)
        return node

    def patient(s: Log) -> dict[str, Any]:
        assert _until(durably.cancelled)
        raise asyncio.CancelledError

    g = StateGraph(Log, name="two_fail")
    for name, fn in [("x", boom("x")), ("y", boom("y")), ("z", patient)]:
        g.add_node(name, fn)
        g.add_edge(START, name).add_edge(name, END)
    with pytest.raises(ExceptionGroup) as caught:
        g.compile().invoke({"log": []})
    assert sorted(type(e).__name__ for e in caught.value.exceptions) == ["KeyError"] * 2
    assert "'z'" not in str(caught.value)


def test_cancel_run_stops_a_graph_and_cancels_its_async_nodes(disk_store: Any) -> None:
    executed: list[str] = []
    first = threading.Event()
    first.set()
    running = threading.Event()

    def a(s: Log) -> dict[str, Any]:
        executed.append("a")
        return {"log": ["a"]}

    async def slow(s: Log) -> dict[str, Any]:
        if first.is_set():
            running.set()
            await asyncio.sleep(BOUND)
        executed.append("slow")
        return {"log": ["slow"]}

    def wait(s: Log) -> dict[str, Any]:
        if first.is_set():
            assert _until(durably.cancelled)
            raise asyncio.CancelledError
        executed.append("wait")
        return {"log": ["wait"]}

    g = StateGraph(Log, name="cancel_graph")
    g.add_node("a", a).add_node("slow", slow).add_node("wait", wait)
    g.add_edge(START, "a").add_edge("a", "slow").add_edge("a", "wait")
    g.add_edge("slow", END).add_edge("wait", END)
    app = g.compile()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        call = pool.submit(app.invoke, {"log": []}, run_id="g1")
        assert running.wait(BOUND)
        assert durably.cancel_run("g1") is True
        with pytest.raises(durably.RunCancelledError, match=r"app\.invoke\(None, run_id='g1'\)"):
            call.result(BOUND)
    assert durably.get_run("g1").status == "stopped" and executed == ["a"]
    first.clear()
    assert sorted(app.invoke(None, run_id="g1")["log"]) == ["a", "slow", "wait"]
    assert sorted(executed) == ["a", "slow", "wait"]  # "a" replayed, not executed again


def test_graph_timeout_stops_the_run_resumably(disk_store: Any) -> None:
    executed: list[str] = []
    first = threading.Event()
    first.set()

    def step(name: str) -> Any:
        def node(s: Log) -> dict[str, Any]:
            if name == "b" and first.is_set():
                assert _until(durably.cancelled)
            executed.append(name)
            return {"log": [name]}
        return node

    g = StateGraph(Log, name="graph_timeout")
    g.add_node("a", step("a")).add_node("b", step("b")).add_node("c", step("c"))
    g.add_edge(START, "a").add_edge("a", "b").add_edge("b", "c").add_edge("c", END)
    app = g.compile(timeout=0.5)
    with pytest.raises(durably.RunTimeoutError, match=r"timeout of 0\.5 s"):
        app.invoke({"log": []}, run_id="gt")
    # b finished (its journaled result is kept), c never began (unless the machine was so
    # loaded that the timeout came before b began: then a alone)
    assert executed in (["a", "b"], ["a"])
    first.clear()
    assert app.invoke(None, run_id="gt")["log"] == ["a", "b", "c"]
    assert executed == ["a", "b", "c"]  # each node executed once


def test_a_failed_entrypoint_stops_its_submitted_sync_tasks(disk_store: Any) -> None:
    """The failure reaches the entrypoint through future.result() (as in LangGraph's
    functional API): the submitted calls still running see durably.cancelled() and
    their next step raises; what finished is journaled and replayed."""
    executed: list[str] = []
    first = threading.Event()
    first.set()
    long_ready = threading.Event()

    @durably.task
    def piece(name: str) -> str:
        executed.append(name)
        return name

    @durably.task
    def long_one() -> str:
        piece("l1")
        if first.is_set():
            long_ready.set()
            assert _until(durably.cancelled)
        return piece("l2")  # after the failure: raises, so long_one executes again later

    @durably.task
    def short_one() -> str:
        executed.append("short")
        return "short"

    @durably.task
    def failing() -> str:
        if first.is_set():
            assert long_ready.wait(BOUND)
            raise ValueError("failed")
        executed.append("failing")
        return "ok"

    @durably.entrypoint
    def job() -> list[str]:
        done = short_one.submit()
        futures = [long_one.submit(), failing.submit()]
        done.result()
        return [f.result() for f in reversed(futures)]

    with pytest.raises(ValueError, match="failed"):
        job()
    assert sorted(executed) == ["l1", "short"]
    first.clear()
    executed.clear()
    assert job() == ["ok", "l2"]
    assert sorted(executed) == ["failing", "l2"]  # short and l1 replayed


def test_a_failed_async_entrypoint_cancels_its_running_tasks(disk_store: Any) -> None:
    executed: list[str] = []
    first = threading.Event()
    first.set()
    cancelled: list[str] = []

    @durably.task
    async def slow() -> str:
        if first.is_set():
            try:
                await asyncio.sleep(BOUND)
            except asyncio.CancelledError:
                cancelled.append("slow")
                raise
        executed.append("slow")
        return "slow"

    @durably.task
    async def quick() -> str:
        executed.append("quick")
        return "quick"

    @durably.task
    async def failing() -> str:
        await asyncio.sleep(0)
        if first.is_set():
            raise ValueError("failed")
        executed.append("failing")
        return "failing"

    @durably.entrypoint
    async def job() -> list[str]:
        return list(await asyncio.gather(quick(), slow(), failing()))

    started = time.monotonic()
    with pytest.raises(ValueError, match="failed"):
        asyncio.run(job())
    assert time.monotonic() - started < BOUND and cancelled == ["slow"]
    assert executed == ["quick"]
    first.clear()
    assert asyncio.run(job()) == ["quick", "slow", "failing"]
    assert sorted(executed) == ["failing", "quick", "slow"]  # quick replayed, not again


SCRIPT = '''
import os, sys, time
import durably

@durably.task
def part(i):
    if i == 1 and os.environ.get("HANG") == "1":
        while not durably.cancelled():
            time.sleep(0.005)
    print(f"executed {i}", flush=True)
    return i

@durably.entrypoint(timeout=float(os.environ["LIMIT"]))
def job(n):
    return sum(part(i) for i in range(n))

try:
    print("result", job(3), flush=True)
except durably.RunTimeoutError as e:
    print("timed out", e.steps, flush=True)
    sys.exit(2)
'''


def test_a_script_timed_out_resumes_in_a_new_process(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    env = {"DURABLY_DIR": str(tmp_path / "store"), "PATH": "/usr/bin:/bin",
           "PYTHONPATH": str(Path(durably.__file__).parents[1])}

    def run(**extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(script)], env={**env, **extra},
                              capture_output=True, text=True, timeout=120)

    first = run(HANG="1", LIMIT="1")
    assert first.returncode == 2, first.stderr
    *ran, last = first.stdout.splitlines()
    done = int(last.removeprefix("timed out "))  # 2: part 1 hangs until the timeout
    assert ran == [f"executed {i}" for i in range(done)] and done <= 2
    second = run(LIMIT="60")
    assert second.returncode == 0, second.stderr
    assert second.stdout.splitlines() == [f"executed {i}" for i in range(done, 3)] + [
        "result 3"]  # only the missing steps, in a new process


def test_cancel_run_while_streaming_ends_the_stream_with_the_error(disk_store: Any) -> None:
    executed: list[int] = []

    @durably.task
    def part(i: int) -> int:
        executed.append(i)
        return i

    @durably.entrypoint
    def job(n: int) -> list[int]:
        return [part(i) for i in range(n)]

    kinds: list[str] = []
    with pytest.raises(durably.RunCancelledError) as caught:
        for event in job.stream(4, run_id="streamed"):
            kinds.append(event.kind)
            if event.kind == "step_finished" and len(executed) == 2:
                assert durably.cancel_run("streamed") is True  # (the run waits meanwhile)
    assert caught.value.steps == 2 and kinds[-1] == "run_stopped"
    assert executed == [0, 1]
    assert job.run(4, run_id="streamed").result == [0, 1, 2, 3]
    assert executed == [0, 1, 2, 3]


def test_cancel_run_during_a_map_starts_no_more_items(disk_store: Any) -> None:
    """The item running finishes and is journaled; the items not started never start."""
    executed: list[int] = []
    first = threading.Event()
    first.set()
    running = threading.Event()

    @durably.task
    def item(i: int) -> int:
        if i == 0 and first.is_set():
            running.set()
            assert _until(durably.cancelled)
        executed.append(i)
        return i

    @durably.entrypoint
    def job(n: int) -> list[int]:
        return item.map(range(n), max_workers=1)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        call = pool.submit(job.run, 4, run_id="mapped")
        assert running.wait(BOUND)
        assert durably.cancel_run("mapped") is True
        with pytest.raises(durably.RunCancelledError):
            call.result(BOUND)
    assert executed == [0]
    first.clear()
    assert job.run(4, run_id="mapped").result == [0, 1, 2, 3]
    assert executed == [0, 1, 2, 3]
