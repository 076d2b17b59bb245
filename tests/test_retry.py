"""retry= and timeout= on tasks, and the one-line summary a finished run logs."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest

import durably
from durably import entrypoint, task

pytestmark = pytest.mark.usefixtures("store")


def test_retries_until_success_and_journals_every_failed_try() -> None:
    tries: list[int] = []

    @task(retry=durably.Retry(attempts=4, backoff=0, on=(ConnectionError,)))
    def fetch(x: int) -> int:
        tries.append(x)
        if len(tries) < 3:
            raise ConnectionError(f"flaky {len(tries)}")
        return x * 2

    @entrypoint
    def pipeline(x: int) -> int:
        return fetch(x)

    run = pipeline.run(5)
    assert run.result == 10 and tries == [5, 5, 5]
    records = [(r.status, r.error) for r in run.records()]
    assert records == [("failed", "try 1 of 4: ConnectionError('flaky 1')"),
                       ("failed", "try 2 of 4: ConnectionError('flaky 2')"), ("ran", None)]
    assert [n.status for n in run.graph().nodes] == ["ran"]
    assert pipeline.run(5).counts()["replayed"] == 1 and tries == [5, 5, 5]


def test_other_exceptions_and_exhausted_retries_propagate_unchanged() -> None:
    calls: list[str] = []

    @task(retry=durably.Retry(attempts=2, backoff=0, on=(ConnectionError,)))
    def picky(kind: str) -> None:
        calls.append(kind)
        raise (ConnectionError if kind == "net" else ValueError)(kind)

    with pytest.raises(ValueError, match="bad"):
        picky("bad")
    assert calls == ["bad"]  # not a retried type: one try
    with pytest.raises(ConnectionError, match="net"):
        picky("net")
    assert calls == ["bad", "net", "net"]


def test_several_policies_on_one_task_the_first_matching_applies() -> None:
    """retry=[...] as LangGraph allows: each failure is retried by the first policy whose
    on= matches it, with that policy's attempts; others propagate at once."""
    failures = iter([ConnectionError("down"), TimeoutError("slow"), TimeoutError("slow")])
    tries: list[str] = []

    @task(cache=False, retry=[durably.Retry(attempts=5, backoff=0, on=(TimeoutError,)),
                              durably.Retry(attempts=2, backoff=0, on=(OSError,))])
    def fetch() -> str:
        error = next(failures, None)
        tries.append(type(error).__name__)
        if error is not None:
            raise error
        return "page"

    @entrypoint
    def crawl() -> str:
        return fetch()

    run = crawl.run()
    assert run.result == "page"
    assert tries == ["ConnectionError", "TimeoutError", "TimeoutError", "NoneType"]
    labels = [r.error.split(":")[0] for r in run.records() if r.status == "failed"]
    assert labels == ["try 1 of 2", "try 2 of 5", "try 3 of 5"]

    # a failure its policy would not have tried so many times: said so, not "try 3 of 2"
    again = iter([TimeoutError("slow"), TimeoutError("slow"), ConnectionError("down")])

    @task(cache=False, retry=[durably.Retry(attempts=5, backoff=0, on=(TimeoutError,)),
                              durably.Retry(attempts=2, backoff=0, on=(OSError,))])
    def fetch_again() -> str:
        raise next(again)

    @entrypoint
    def crawl_again() -> str:
        return fetch_again()

    with pytest.raises(ConnectionError):
        crawl_again()
    failed = [r.error for r in durably.list_runs(crawl_again)[0].records()
              if r.status == "failed"]
    assert failed[-1].startswith(
        "try 3, not retried (ConnectionError's policy allows 2 tries in all)"), failed

    # a ConnectionError (an OSError, not a TimeoutError): the second policy, 2 tries
    attempts: list[int] = []

    @task(cache=False, retry=[durably.Retry(attempts=5, backoff=0, on=(TimeoutError,)),
                              durably.Retry(attempts=2, backoff=0, on=(OSError,))])
    def down() -> None:
        attempts.append(1)
        raise ConnectionError("down")

    with pytest.raises(ConnectionError):
        down()
    assert len(attempts) == 2

    @task(cache=False, retry=[durably.Retry(attempts=3, backoff=0, on=(TimeoutError,))])
    def other() -> None:
        attempts.append(2)
        raise ValueError("not retried")

    with pytest.raises(ValueError):
        other()
    assert attempts.count(2) == 1
    with pytest.raises(durably.DefinitionError, match="non-empty list"):
        task(retry=[])(lambda: 1)


def test_retry_shorthand_and_bad_options() -> None:
    seen: list[int] = []

    @task(retry=3, cache=False)
    def flaky() -> str:
        seen.append(1)
        if len(seen) < 3:
            raise RuntimeError("again")
        return "ok"

    durably.Retry(attempts=3, backoff=0)  # constructing is cheap and validated
    flaky.spec.retry = durably.Retry(attempts=3, backoff=0)  # no real waiting in the test
    assert flaky() == "ok" and len(seen) == 3
    with pytest.raises(durably.DefinitionError, match="retry=3"):
        task(retry="3")(lambda: 1)  # type: ignore[call-overload]
    with pytest.raises(durably.DefinitionError, match="attempts"):
        durably.Retry(attempts=0)
    with pytest.raises(durably.DefinitionError, match="exception types"):
        durably.Retry(on=(KeyError, "x"))  # type: ignore[arg-type]
    with pytest.raises(durably.DefinitionError, match="positive number of seconds"):
        task(timeout=-1)(lambda: 1)


def test_interrupts_are_never_retried() -> None:
    tries: list[int] = []

    @task(retry=durably.Retry(attempts=5, backoff=0, on=(BaseException,)))
    def ask() -> Any:
        tries.append(1)
        return durably.interrupt("ok?")

    @entrypoint
    def pipeline() -> Any:
        return ask()

    assert pipeline.run().status == "interrupted" and tries == [1]


def test_timeout_of_a_sync_task_raises_and_can_be_retried() -> None:
    release = threading.Event()
    tries: list[int] = []

    # generous: the second try must finish within it on a loaded CI machine
    @task(cache=False, timeout=3.0,
          retry=durably.Retry(attempts=2, backoff=0, on=(TimeoutError,)))
    def slow() -> str:
        tries.append(1)
        if len(tries) == 1:
            release.wait(60)  # the first try hangs past its timeout
        return "second try"

    @entrypoint
    def pipeline() -> str:
        return slow()

    run = pipeline.run()
    release.set()
    assert run.result == "second try" and len(tries) == 2
    [failed, ran] = run.records()
    assert failed.status == "failed" and "TaskTimeoutError" in (failed.error or "")
    assert ran.status == "ran"
    with pytest.raises(TimeoutError):
        raise durably.TaskTimeoutError("is a TimeoutError")


def test_timeout_cancels_an_async_task() -> None:
    cancelled: list[bool] = []

    @task(timeout=0.1)
    async def hang() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    with pytest.raises(durably.TaskTimeoutError, match=r"hang.*0\.1 s and was cancelled"):
        asyncio.run(hang())
    assert cancelled == [True]


def test_a_finished_run_logs_its_summary(caplog: pytest.LogCaptureFixture) -> None:
    @task
    def work(i: int) -> int:
        return i

    @entrypoint
    def pipeline(n: int) -> list[int]:
        return [work(i) for i in range(n)]

    with caplog.at_level(logging.INFO, logger="durably"):
        pipeline(3)
        pipeline(3)
    lines = [r.getMessage() for r in caplog.records if r.name == "durably"]
    assert len(lines) == 2
    assert "finished: 3 steps — 3 ran, 0 replayed" in lines[0]
    assert "0 ran, 3 replayed" in lines[1] and "reran a finished run" in lines[1]


def test_an_abandoned_try_cannot_repeat_a_side_effect() -> None:
    sent: list[int] = []
    tries: list[int] = []

    @task(cache=False)
    def send_email(x: int) -> str:
        sent.append(x)
        return "sent"

    release, woke = threading.Event(), threading.Event()

    # generous: the second try must finish within it on a loaded CI machine
    @task(cache=False, timeout=3.0, retry=durably.Retry(attempts=2, backoff=0))
    def step(x: int) -> str:
        tries.append(x)
        if len(tries) == 1:
            release.wait(60)  # the first try is abandoned at its timeout ...
            try:
                return send_email(x)  # ... and must not send when it wakes up
            finally:
                woke.set()
        return send_email(x)

    @entrypoint
    def main() -> str:
        result = step(1)
        release.set()  # the abandoned try wakes up while the run still runs
        assert woke.wait(60)
        return result

    run = main.run()
    assert run.result == "sent" and sent == [1] and len(tries) == 2
    assert sorted(r.task.rpartition(".")[2] for r in run.records() if r.status == "ran") == [
        "send_email", "step"]


def test_a_timeout_counts_from_the_call_and_imports_nothing(tmp_path: Any) -> None:
    """The first ``timeout=`` call of a process imported dask's ``distributed`` (0.3 s or
    more, when it is installed) after starting the body and before starting to wait: a body
    taking twice its timeout returned normally. Only a process that has it imported (a Dask
    worker) looks at it; the wait ends ``seconds`` after the body started."""
    import subprocess
    import sys

    from tests.conftest import script_env, write_script

    script = write_script(tmp_path / "timed.py", """
        import sys, threading, time
        import durably

        never = threading.Event()

        @durably.task(timeout=0.5)
        def stuck(x):
            never.wait(30)
            return x

        started = time.monotonic()
        try:
            stuck(1)
        except durably.TaskTimeoutError:
            print("timed out", "distributed" in sys.modules, time.monotonic() - started < 25)
        """)
    done = subprocess.run([sys.executable, str(script)], env=script_env(tmp_path / "store"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["timed", "out", "False", "True"]
