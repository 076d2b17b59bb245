"""A failed step the run caught is part of its history: replayed, never executed again in
that run; only the failure that ended the run is executed again by the next attempt."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import durably
from durably.exceptions import ReplayedError

from .conftest import run_script, script_env, write_script


def test_a_caught_failure_is_replayed_not_executed_again(store: Any) -> None:
    sent: list[int] = []

    @durably.task(cache=False)
    def send(n: int) -> None:
        sent.append(n)
        raise ValueError("refused")

    @durably.entrypoint
    def wf(n: int) -> str:
        try:
            send(n)
        except ValueError as exc:
            return f"handled {exc}"
        return "sent"

    assert [wf(1), wf(1), wf(1)] == ["handled refused"] * 3
    assert sent == [1]  # the side effect happened once; the reruns replayed its failure
    run = wf.run(1)
    assert run.status == "finished"
    failed = [s for s in run.steps if s.status == "failed"]
    assert failed and failed[-1].attempt == run.attempt  # each attempt shows the failure


def test_the_replayed_exception_says_where_it_comes_from(store: Any) -> None:
    seen: list[BaseException] = []

    @durably.task
    def parse(text: str) -> int:
        return int(text)

    @durably.entrypoint
    def job(text: str) -> int:
        try:
            return parse(text)
        except ValueError as exc:
            seen.append(exc)
            return -1

    assert job("x") == -1
    assert job("x") == -1
    first, again = seen
    assert type(again) is ValueError and again.args == first.args
    notes = "\n".join(getattr(again, "__notes__", []))
    assert "replayed from the journal" in notes and "parse" in notes
    assert "int(text)" in notes  # the original traceback's text


def test_the_failure_that_ended_the_run_is_executed_again(store: Any) -> None:
    tries: list[int] = []

    @durably.task(cache=False)
    def flaky(n: int) -> int:
        tries.append(n)
        if len(tries) == 1:
            raise ConnectionError("down")
        return n

    @durably.entrypoint
    def wf(n: int) -> int:
        return flaky(n) + 1

    with pytest.raises(ConnectionError):
        wf(5)
    assert wf(5) == 6  # the next attempt executes it again
    assert wf(5) == 6 and tries == [5, 5]


def test_a_failure_caught_then_rethrown_as_another_error_is_executed_again(store: Any) -> None:
    calls: list[str] = []

    @durably.task(cache=False)
    def pay(order: str) -> None:
        calls.append(order)
        if len(calls) == 1:
            raise KeyError(order)

    @durably.entrypoint
    def checkout(order: str) -> str:
        try:
            pay(order)
        except KeyError as exc:
            raise RuntimeError("payment failed") from exc
        return "paid"

    with pytest.raises(RuntimeError):
        checkout("o1")
    assert checkout("o1") == "paid"
    assert calls == ["o1", "o1"]


def test_a_failure_inside_a_fan_out_that_ended_the_run_is_retried(store: Any) -> None:
    calls: list[int] = []

    @durably.task(cache=False)
    def item(n: int) -> int:
        calls.append(n)
        if n == 2 and calls.count(2) == 1:
            raise ValueError(n)
        return n

    @durably.entrypoint
    def wf() -> list[int]:
        return list(item.map([1, 2, 3]))

    with pytest.raises(BaseException):  # noqa: B017 - an ExceptionGroup or the item's error
        wf()
    assert wf() == [1, 2, 3]
    assert sorted(calls) == [1, 2, 2, 3]


def test_retried_tries_are_not_replayed_only_the_final_outcome(store: Any) -> None:
    tries: list[int] = []

    @durably.task(cache=False, retry=3)
    def shaky(n: int) -> int:
        tries.append(n)
        if len(tries) < 2:
            raise ConnectionError("blip")
        return n * 10

    @durably.entrypoint
    def wf(n: int) -> int:
        return shaky(n)

    assert wf(1) == 10
    assert wf(1) == 10
    assert tries == [1, 1]


def test_a_caught_failure_of_a_retried_task_is_replayed(store: Any) -> None:
    tries: list[int] = []

    @durably.task(cache=False, retry=durably.Retry(attempts=2))
    def never(n: int) -> int:
        tries.append(n)
        raise ConnectionError("still down")

    @durably.entrypoint
    def wf(n: int) -> str:
        try:
            never(n)
        except ConnectionError:
            return "gave up"
        return "ok"

    assert wf(1) == "gave up"
    assert wf(1) == "gave up"
    assert tries == [1, 1]  # two tries in the first run, none after


class _Unpicklable(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


def test_an_exception_that_cannot_be_pickled_is_rebuilt_without_what_does_not_pickle(
        store: Any) -> None:
    seen: list[BaseException] = []
    calls: list[int] = []

    @durably.task(cache=False)
    def send(n: int) -> None:
        calls.append(n)
        raise _Unpicklable(f"socket {n} closed")

    @durably.entrypoint
    def wf(n: int) -> str:
        try:
            send(n)
        except _Unpicklable as exc:
            seen.append(exc)
            return "caught"
        return "ok"

    assert wf(3) == "caught" and wf(3) == "caught"
    assert calls == [3]
    again = seen[1]
    assert type(again) is _Unpicklable and str(again) == "socket 3 closed"
    assert not hasattr(again, "lock")  # (what does not pickle is left out)
    assert "rebuilt from its class" in "\n".join(again.__notes__)


def test_an_exception_whose_class_is_gone_is_replayed_as_a_stand_in(store: Any) -> None:
    seen: list[BaseException] = []

    def make() -> type[Exception]:
        class Local(KeyError):  # not importable by name: a stand-in
            def __init__(self, key: str, lock: Any) -> None:
                super().__init__(key)
                self.lock = lock
        return Local

    local = make()

    @durably.task(cache=False)
    def lookup(k: str) -> None:
        raise local(k, threading.Lock())

    @durably.entrypoint
    def wf(k: str) -> str:
        try:
            lookup(k)
        except KeyError as exc:  # the stand-in is a KeyError too
            seen.append(exc)
            return "missing"
        return "found"

    assert wf("a") == wf("a") == "missing"
    stand_in = seen[1]
    assert isinstance(stand_in, ReplayedError) and isinstance(stand_in, KeyError)
    assert stand_in.original_type.endswith("Local")
    assert "stand-in" in "\n".join(stand_in.__notes__)


class _NeedsTwo(ValueError):
    def __init__(self, a: str, b: str) -> None:  # pickles, but does not load back
        super().__init__(f"{a}/{b}")


def test_an_exception_that_does_not_load_back_is_a_stand_in_of_its_builtin_base(
        store: Any) -> None:
    calls: list[int] = []

    @durably.task(cache=False)
    def check(n: int) -> None:
        calls.append(n)
        raise _NeedsTwo("bad", str(n))

    @durably.entrypoint
    def wf(n: int) -> str:
        try:
            check(n)
        except ValueError as exc:  # the stand-in is a ValueError too
            return type(exc).__name__
        return "ok"

    assert wf(1) == "_NeedsTwo"
    assert wf(1) == "_NeedsTwo"
    assert calls == [1]


_SCRIPT = """
    import os, sys
    import durably

    LOG = os.environ["LOG"]

    @durably.task(cache=False)
    def send(n):
        with open(LOG, "a") as f:
            f.write(f"send {n}\\n")
        raise ValueError("refused")

    @durably.task(cache=False)
    def after(n):
        if os.environ.get("KILL") == "1":
            os.kill(os.getpid(), 9)  # a crash after the caught failure
        with open(LOG, "a") as f:
            f.write(f"after {n}\\n")
        return n

    @durably.entrypoint
    def wf(n):
        try:
            send(n)
        except ValueError:
            pass
        return after(n)

    print(wf(7))
"""


def test_a_crash_after_a_caught_failure_replays_it_on_resume(tmp_path: Path) -> None:
    script = write_script(tmp_path / "job.py", _SCRIPT)
    log = tmp_path / "log.txt"
    killed = subprocess.run([sys.executable, str(script)],
                            env=script_env(tmp_path / "store", LOG=str(log), KILL="1"),
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert log.read_text() == "send 7\n"
    done = run_script(script, script_env(tmp_path / "store", LOG=str(log)))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "7"
    assert log.read_text() == "send 7\nafter 7\n"  # the failed send did not happen again
    assert os.path.exists(tmp_path / "store")


def test_a_fork_after_a_caught_failure_replays_it_too(store: Any) -> None:
    sent: list[int] = []

    @durably.task(cache=False)
    def send(n: int) -> None:
        sent.append(n)
        raise ValueError("refused")

    @durably.task
    def after(n: int) -> int:
        return n + 1

    @durably.entrypoint
    def wf(n: int) -> int:
        with contextlib.suppress(ValueError):  # (the run goes on from the failure)
            send(n)
        return after(n)

    run = wf.run(4)
    assert run.result == 5 and sent == [4]
    forked = wf.fork(run.id)  # from its latest checkpoint: after's result
    assert forked.result == 5
    assert sent == [4]  # the fork's history has the failure: not executed again
    from_input = wf.fork(run.id, at="")  # before its first step: everything anew
    assert from_input.result == 5 and sent == [4, 4]
    assert all(e.kind not in ("step_raised", "step_retry") for e in run.events())


class _CustomInit(Exception):
    def __init__(self, code: int, detail: str) -> None:  # pickles, does not load back
        super().__init__(f"code={code}")
        self.code = code


def test_a_caught_exception_of_a_custom_class_is_replayed_as_its_own_class(
        store: Any) -> None:
    """An exception with a custom __init__ (botocore's ClientError) does not load back as
    pickled: it is rebuilt as an instance of its own class (its args and attributes set),
    so the except that caught it catches it again, and the finished run stays finished."""
    calls: list[int] = []

    @durably.task(cache=False)
    def call_api(n: int) -> None:
        calls.append(n)
        raise _CustomInit(429, "slow down")

    @durably.entrypoint
    def wf(n: int) -> str:
        try:
            call_api(n)
        except _CustomInit as exc:
            return f"caught {exc.code} {exc}"
        return "ok"

    for _ in range(3):
        run = wf.run(1)
        assert (run.status, run.result) == ("finished", "caught 429 code=429")
    assert calls == [1]


def test_what_a_failing_step_changed_in_its_arguments_is_replayed_too(store: Any) -> None:
    @durably.task(cache=False)
    def step(acc: list[str]) -> None:
        acc.append("partial")
        raise ValueError("boom")

    @durably.task
    def count(acc: list[str]) -> int:
        return len(acc)

    @durably.entrypoint
    def wf() -> tuple[list[str], int]:
        acc: list[str] = []
        with contextlib.suppress(ValueError):
            step(acc)
        return acc, count(acc)

    assert wf() == wf() == wf() == (["partial"], 1)
