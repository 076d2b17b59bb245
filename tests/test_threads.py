"""Conversation threads: ``entrypoint.run(message, thread=...)``, each call a run of its own
that receives what the thread's last finished call saved as ``previous``
(``durably.Final`` / ``entrypoint.final`` separates the saved value from the result), as in
LangGraph's functional API; failed, interrupted, concurrent and crashed calls."""

from __future__ import annotations

import asyncio
import re
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import DefinitionError, RunBusyError, RunStateError

from .conftest import script_env, write_script


def _chat(store: Any = None, wait: float | None = None) -> Any:
    replies: list[str] = []

    @durably.task(cache=False)
    def reply(message: str, history: list[str]) -> str:
        replies.append(message)
        return f"{message} (after {len(history)})"

    @durably.entrypoint(store=store, wait=wait)
    def chat(message: str, *, previous: list[str] | None = None) -> Any:
        history = list(previous or [])
        answer = reply(message, history)
        return durably.Final(value=answer, save=[*history, message])

    chat.replies = replies  # type: ignore[attr-defined]
    return chat


def test_each_call_on_a_thread_sees_what_the_last_one_saved(store: Any) -> None:
    chat = _chat()
    first = chat.run("hi", thread="t1")
    second = chat.run("how are you", thread="t1")
    other = chat.run("hi", thread="t2")
    assert (first.result, second.result, other.result) == (
        "hi (after 0)", "how are you (after 1)", "hi (after 0)")
    assert first.id != second.id and first.status == second.status == "finished"
    assert (first.thread, second.thread, other.thread) == ("t1", "t1", "t2")
    # the same message again is the thread's next call, not a replay of the first
    third = chat.run("hi", thread="t1")
    assert third.result == "hi (after 2)" and third.id not in (first.id, second.id)
    assert chat.replies == ["hi", "how are you", "hi", "hi"]
    assert [r.id for r in durably.list_runs(thread="t1")] == [third.id, second.id, first.id]
    assert [r.id for r in durably.list_runs(chat, thread="t2")] == [other.id]
    assert durably.list_runs("elsewhere", thread="t1") == []
    assert {r.id for r in durably.list_runs(chat)} == {first.id, second.id, third.id, other.id}
    # without a thread: a run of its own, previous left at its default
    assert chat("hello") == "hello (after 0)"


def test_a_call_without_a_thread_never_continues_or_returns_a_thread_run(store: Any) -> None:
    down = [True]

    @durably.task(cache=False)
    def reply(message: str, history: list[str]) -> str:
        if down[0]:
            raise RuntimeError("llm down")
        return f"re:{message} after {len(history)}"

    @durably.entrypoint
    def chat(message: str, *, previous: list[str] | None = None) -> Any:
        answer = reply(message, list(previous or []))
        return durably.Final(value=answer, save=[*(previous or []), message, answer])

    with pytest.raises(RuntimeError, match="llm down"):
        chat.run("hi", thread="user-1")
    failed = durably.list_runs(thread="user-1")[0]
    down[0] = False
    # an unrelated call with the same message: a run of its own; the thread's call stays failed
    alone = chat.run("hi")
    assert alone.thread is None and alone.id != failed.id and alone.result == "re:hi after 0"
    assert durably.get_run(failed.id).status == "failed"
    # a finished thread call is not returned either, nor the thread's call #2 for the
    # arguments it was given (previous= included)
    done = chat.run("yo", thread="user-2")
    second = chat.run("again", thread="user-2")
    assert done.thread == second.thread == "user-2"
    for run in (chat.run("yo"), chat.run("again", previous=["yo", done.result])):
        assert run.thread is None and run.id not in (done.id, second.id)
    # and a thread call never continues a run made without a thread
    assert chat.run("hi", thread="user-3").id not in (alone.id, failed.id)
    assert [r.thread for r in durably.list_runs(chat) if r.thread is None] == [None, None, None]


def test_without_final_the_next_call_sees_the_result(store: Any) -> None:
    @durably.entrypoint
    def total(x: int, *, previous: int | None = None) -> int:
        return (previous or 0) + x

    assert [total.run(x, thread="sum").result for x in (1, 2, 3)] == [1, 3, 6]
    assert durably.entrypoint.final is durably.Final  # type: ignore[attr-defined]


def test_two_entrypoints_on_one_thread_keep_their_own_previous(
        disk_store: durably.DiskStore) -> None:
    @durably.entrypoint
    def left(x: int, *, previous: int = 0) -> int:
        return previous + x

    @durably.entrypoint
    def right(x: int, *, previous: int = 100) -> int:
        return previous - x

    assert [left.run(1, thread="t").result, right.run(1, thread="t").result,
            left.run(2, thread="t").result, right.run(2, thread="t").result] == [1, 99, 3, 97]
    assert len(durably.list_runs(thread="t")) == 4
    assert [r.result for r in durably.list_runs(left, thread="t")] == [3, 1]


def test_an_entrypoint_without_previous_still_makes_one_run_per_call(
        disk_store: durably.DiskStore) -> None:
    @durably.entrypoint
    def echo(x: int) -> int:
        return x

    runs = [echo.run(1, thread="e") for _ in range(3)]
    assert len({r.id for r in runs}) == 3 and [r.result for r in runs] == [1, 1, 1]


def test_a_failed_call_saves_nothing_and_continues_when_called_again(
        disk_store: durably.DiskStore) -> None:
    fail = {"bad"}

    @durably.task
    def check(message: str) -> str:
        if message in fail:
            raise ValueError(message)
        return message

    @durably.entrypoint
    def chat(message: str, *, previous: list[str] | None = None) -> list[str]:
        return [*(previous or []), check(message)]

    assert chat.run("a", thread="t").result == ["a"]
    with pytest.raises(ValueError, match="bad"):
        chat.run("bad", thread="t")
    failed = durably.list_runs(thread="t")[0]
    assert failed.status == "failed"
    # another message: the next call, given the last *finished* call's value (LangGraph's)
    assert chat.run("b", thread="t").result == ["a", "b"]
    assert failed.id not in {r.id for r in durably.list_runs(thread="t")[:1]}
    # the failed call, resumed by its id once fixed, sees the previous it was first given
    fail.clear()
    again = chat.resume(failed.id, keep_finished=True)
    assert again == ["a", "bad"]
    # the next call takes the latest finished call by order on the thread: "bad" is #2,
    # "b" is #3
    assert chat.run("c", thread="t").result == ["a", "b", "c"]


def test_the_same_call_again_continues_the_unfinished_latest_one(
        disk_store: durably.DiskStore) -> None:
    fail = [False]
    done: list[str] = []

    @durably.task(cache=False)
    def side(message: str) -> str:
        done.append(message)
        return message

    @durably.task
    def flaky() -> None:
        if fail[0]:
            raise RuntimeError("down")

    @durably.entrypoint
    def chat(message: str, *, previous: int | None = None) -> int:
        side(message)
        flaky()
        return (previous or 0) + 1

    assert chat.run("x", thread="t").result == 1
    fail[0] = True
    with pytest.raises(RuntimeError):
        chat.run("y", thread="t")
    fail[0] = False
    again = chat.run("y", thread="t")  # the same call: it continues that run
    assert again.result == 2 and again.attempt == 2 and again.resumed_from == "failed"
    assert done == ["x", "y"]  # its finished step replayed, not executed again
    assert len(durably.list_runs(thread="t")) == 2


def test_an_interrupted_call_holds_the_thread_until_answered(
        disk_store: durably.DiskStore) -> None:
    @durably.entrypoint
    def chat(message: str, *, previous: str | None = None) -> str:
        if message == "ask":
            return f"{previous}+{durably.interrupt('ok?')}"
        return f"{previous}+{message}"

    chat.run("a", thread="t")
    asked = chat.run("ask", thread="t")
    assert asked.status == "interrupted"
    with pytest.raises(RunStateError, match="waits for an answer") as refused:
        chat.run("b", thread="t")
    assert asked.id in str(refused.value) and "resume" in str(refused.value)
    assert chat.run("ask", thread="t").status == "interrupted"  # the same call: still waits
    assert chat.resume(asked.id, "yes") == "None+a+yes"
    assert chat.run("b", thread="t").result == "None+a+yes+b"


def test_langgraph_s_entrypoint_final_is_taken_as_durably_s(
        disk_store: durably.DiskStore) -> None:
    """Code ported from LangGraph keeps its ``entrypoint.final(value=..., save=...)``: the
    caller gets ``value``, the next call on the thread ``save``."""
    class final:  # (as langgraph.func.entrypoint.final is: a value and what to save)
        def __init__(self, *, value: Any, save: Any) -> None:
            self.value, self.save = value, save

    final.__module__ = "langgraph.func"

    @durably.entrypoint
    def shout(message: str, *, previous: list[str] | None = None) -> Any:
        return final(value=message.upper(), save=[*(previous or []), message])

    assert shout.run("a", thread="h").result == "A"
    assert shout.run("b", thread="h").result == "B"

    @durably.entrypoint
    def seen(message: str, *, previous: list[str] | None = None) -> Any:
        return final(value=previous, save=[*(previous or []), message])

    assert [seen.run(m, thread="k").result for m in "xyz"] == [None, ["x"], ["x", "y"]]


def test_a_plain_call_given_thread_points_to_run(disk_store: durably.DiskStore) -> None:
    chat = _chat()
    for option, value in (("thread", "t1"), ("run_id", "r1"), ("fresh", True)):
        with pytest.raises(DefinitionError, match=rf"\.run\(\.\.\., {option}=\.\.\.\)"):
            chat("hi", **{option: value})
    assert chat.replies == [] and durably.list_runs(chat) == []
    assert chat("hi") == "hi (after 0)"


def test_a_call_whose_wait_ran_out_is_not_told_to_pass_wait(
        disk_store: durably.DiskStore) -> None:
    """A call that waited its wait= seconds for a call executing the run is refused
    without the advice to pass wait= (it had); a call without wait= keeps that advice."""
    started, release = threading.Event(), threading.Event()

    @durably.task(cache=False)
    def slow(message: str) -> str:
        started.set()
        assert release.wait(60)
        return message

    def define(wait: float | None) -> Any:
        @durably.entrypoint(name="busy-echo", wait=wait)
        def echo(message: str) -> str:
            return slow(message)
        return echo

    holder = threading.Thread(target=define(None), args=("x",))
    holder.start()
    try:
        assert started.wait(60)
        with pytest.raises(RunBusyError) as waited:
            define(0.01)("x")
        with pytest.raises(RunBusyError) as unwaited:
            define(None)("x")
    finally:
        release.set()
        holder.join(60)
    assert "wait=seconds" not in str(waited.value) and "waited its wait=" in str(waited.value)
    assert "wait=seconds" in str(unwaited.value)


def test_a_second_call_while_one_executes_is_refused_or_waits(
        disk_store: durably.DiskStore, monkeypatch: pytest.MonkeyPatch) -> None:
    from durably._decorators import threads

    started, release = threading.Event(), threading.Event()
    looked = {"second": threading.Event(), "twice": threading.Event()}
    original = threads.resolve

    def resolve(spec: Any, store: Any, thread: str, instance: Any, args: Any,
                kwargs: Any) -> Any:
        try:
            return original(spec, store, thread, instance, args, kwargs)
        finally:
            looked.get(threading.current_thread().name, threading.Event()).set()

    monkeypatch.setattr(threads, "resolve", resolve)

    @durably.task(cache=False)
    def slow(message: str) -> str:
        if message == "first":
            started.set()
            assert release.wait(60)
        return message

    def define(wait: float | None) -> Any:
        @durably.entrypoint(name="chat", wait=wait)
        def chat(message: str, *, previous: list[str] | None = None) -> list[str]:
            return [*(previous or []), slow(message)]
        return chat

    refusing, waiting = define(None), define(60)
    results: dict[str, Any] = {}
    first = threading.Thread(target=lambda: results.update(first=refusing.run("first",
                                                                              thread="t")))
    first.start()
    assert started.wait(60)
    with pytest.raises(RunBusyError, match="thread 't' is executing") as busy:
        refusing.run("second", thread="t")
    assert "wait=" in str(busy.value)
    # with wait=: queued behind the executing call, then the next call (sees its value);
    # the first call sent twice waits for it and returns its result
    second = threading.Thread(target=lambda: results.update(second=waiting.run(
        "second", thread="t")), name="second")
    twice = threading.Thread(target=lambda: results.update(twice=waiting.run("first",
                                                                             thread="t")),
                             name="twice")
    second.start()
    twice.start()
    # both have found the thread busy (the resolution of the first call's run, taken by the
    # call sent twice, is made before the release) before the first call ends
    assert looked["second"].wait(60) and looked["twice"].wait(60)
    release.set()
    for t in (first, second, twice):
        t.join(60)
    assert results["first"].result == ["first"]
    assert results["twice"].id == results["first"].id
    assert results["twice"].result == ["first"]
    assert results["second"].result == ["first", "second"]
    assert len(durably.list_runs(thread="t")) == 2


def test_a_call_that_loses_the_race_for_its_number_is_the_next_call(
        disk_store: durably.DiskStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two calls on one thread find the same next number; the one that starts its run
    second finds it taken (by other arguments) and becomes the call after it."""
    from durably._decorators import threads

    chat = _chat()
    chat.run("a", thread="t")
    original = threads.resolve
    raced: list[str] = []

    def racing(*args: Any, **kwargs: Any) -> Any:
        found = original(*args, **kwargs)
        if not raced:
            raced.append(found[0])
            assert chat.run("other", thread="t").id == found[0]  # took the number first
        return found

    monkeypatch.setattr(threads, "resolve", racing)
    late = chat.run("late", thread="t")
    assert late.result == "late (after 2)" and late.id != raced[0]
    assert [r.result for r in durably.list_runs(thread="t")] == [
        "late (after 2)", "other (after 1)", "a (after 0)"]


def test_async_and_streamed_calls_on_a_thread(disk_store: durably.DiskStore) -> None:
    @durably.entrypoint
    async def achat(message: str, *, previous: int = 0) -> Any:
        await asyncio.sleep(0)
        return durably.Final(value=f"{message}#{previous + 1}", save=previous + 1)

    async def main() -> list[Any]:
        one = await achat.run("a", thread="as")
        two = await achat.run("b", thread="as")
        return [one.result, two.result]

    assert asyncio.run(main()) == ["a#1", "b#2"]

    @durably.entrypoint
    def chat(message: str, *, previous: int = 0) -> Any:
        return durably.Final(value=f"{message}#{previous + 1}", save=previous + 1)

    chat.run("a", thread="st")
    done = [e.data for e in chat.stream("b", thread="st") if e.kind == "run_finished"]
    assert done == ["b#2"]
    assert [r.result for r in durably.list_runs(thread="st")] == ["b#2", "a#1"]


def test_bad_thread_options_are_refused(disk_store: durably.DiskStore) -> None:
    chat = _chat()
    for bad in ("", "-x", "a b", "x" * 101, 3):
        with pytest.raises(DefinitionError, match="invalid thread"):
            chat.run("hi", thread=bad)
    with pytest.raises(DefinitionError, match="run_id"):
        chat.run("hi", thread="t", run_id="mine")
    with pytest.raises(DefinitionError, match="fresh"):
        chat.run("hi", thread="t", fresh=True)
    with pytest.raises(DefinitionError, match="previous is what the thread"):
        chat.run("hi", thread="t", previous=["forged"])
    with pytest.raises(DefinitionError, match="list_runs"):
        durably.list_runs(thread=3)  # type: ignore[arg-type]

    with pytest.raises(DefinitionError, match="not keyword-only"):
        @durably.entrypoint
        def positional(message: str, previous: Any = None) -> None: ...

    with pytest.raises(DefinitionError, match="'thread'"):
        @durably.entrypoint
        def own(thread: str) -> None: ...


def test_a_format_7_journal_gains_the_thread_column(tmp_path: Path) -> None:
    store = durably.DiskStore(tmp_path / "s")

    @durably.entrypoint(store=store)
    def job(x: int) -> int:
        return x

    old = job.run(1)
    store.close()
    path = tmp_path / "s" / "journal.sqlite3"
    with sqlite3.connect(path) as con:  # as format 7 wrote it
        con.execute("DROP INDEX runs_by_thread")
        con.execute("ALTER TABLE runs DROP COLUMN thread")
        con.execute("PRAGMA user_version=7")
    reopened = durably.DiskStore(tmp_path / "s")
    found = reopened.find_run(old.id)
    assert found is not None and found.thread is None
    assert reopened.list_thread_runs("t") == []
    new = job.run(2, thread="t")  # (the entrypoint's own store, reopened)
    assert new.thread == "t" and new.id.endswith("@t.1")
    assert [r.run_id for r in durably.DiskStore(tmp_path / "s").list_thread_runs("t")] == [
        new.id]


CHAT = """
import os, sys
import durably

SIDE = os.environ["SIDE_FILE"]

@durably.task(cache=False)
def send(message, n):
    with open(SIDE, "a") as f:
        f.write(f"sent {message} {n}\\n")
    return n

@durably.task(cache=False)
def crash_point(message):
    if os.environ.get("CRASH_ON") == message:
        os._exit(9)
    return message

@durably.entrypoint
def chat(message, *, previous=None):
    seen = list(previous or [])
    send(message, len(seen))
    crash_point(message)
    return durably.entrypoint.final(value=f"{message}: {len(seen)} before", save=seen + [message])

if __name__ == "__main__":
    run = chat.run(sys.argv[1], thread="conv")
    print(run.id, run.attempt, run.result, flush=True)
"""


@pytest.mark.slow
def test_a_call_killed_mid_call_resumes_and_the_next_sees_it(tmp_path: Path) -> None:
    script = write_script(tmp_path / "chat.py", CHAT)
    side = tmp_path / "side.txt"
    env = script_env(tmp_path / "store", SIDE_FILE=str(side))

    def call(message: str, **extra: str) -> list[str]:
        proc = subprocess.run([sys.executable, str(script), message], env={**env, **extra},
                              capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert proc.returncode == (9 if extra else 0), proc.stderr
        return proc.stdout.strip().split(maxsplit=2)

    first = call("one")
    assert re.fullmatch(r"chat-[0-9a-f]{8}@conv\.1", first[0]), first
    assert first[1:] == ["1", "one: 0 before"]
    conv = first[0][:-2]  # chat-<digest>@conv
    assert call("two", CRASH_ON="two") == []  # killed after its message was sent
    assert side.read_text().splitlines() == ["sent one 0", "sent two 1"]
    # the same call again resumes the crashed run: the message is not sent twice, and it
    # sees the previous it was first given
    assert call("two") == [f"{conv}.2", "2", "two: 1 before"]
    assert side.read_text().splitlines() == ["sent one 0", "sent two 1"]
    assert call("three") == [f"{conv}.3", "1", "three: 2 before"]
    listed = subprocess.run([sys.executable, "-m", "durably", "runs", "--thread", "conv"],
                            env=env, capture_output=True, text=True, timeout=120,
                            cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()[1:]] == [
        f"{conv}.3", f"{conv}.2", f"{conv}.1"]
    none = subprocess.run([sys.executable, "-m", "durably", "runs", "--thread", "other"],
                          env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert "no runs on thread 'other'" in none.stdout


@pytest.mark.slow
def test_a_crashed_call_is_resumed_by_durably_resume(tmp_path: Path) -> None:
    script = write_script(tmp_path / "chat.py", CHAT)
    side = tmp_path / "side.txt"
    env = script_env(tmp_path / "store", SIDE_FILE=str(side))
    first = subprocess.run([sys.executable, str(script), "one"], env=env,
                           capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    crashed = subprocess.run([sys.executable, str(script), "two"],
                             env={**env, "CRASH_ON": "two"}, timeout=120, cwd=tmp_path)
    assert crashed.returncode == 9
    store = durably.DiskStore(tmp_path / "store")
    two = durably.list_runs(thread="conv", store=store)[0].id
    assert two.endswith("@conv.2") and durably.get_run(two, store=store).status == "crashed"
    resumed = subprocess.run([sys.executable, "-m", "durably", "resume", two],
                             env=env, capture_output=True, text=True, timeout=120,
                             cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert side.read_text().splitlines() == ["sent one 0", "sent two 1"]
    rec = store.find_run(two)
    assert rec is not None and rec.status == "finished" and rec.thread == "conv"
    assert durably.get_run(two, store=store).result == "two: 1 before"
    third = subprocess.run([sys.executable, str(script), "three"], env=env,
                           capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert third.stdout.strip().split(maxsplit=2) == [two[:-1] + "3", "1", "three: 2 before"]
