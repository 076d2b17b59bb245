"""Seeing every lookup: with the ``durably`` logger at DEBUG (``DURABLY_LOG=debug``), each
cache lookup of a task call, outside and inside runs, logs one line: a hit, or a miss with
why it missed (what ``explain`` says, in short)."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

import durably

from .conftest import script_env, write_script


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.DEBUG and r.getMessage().startswith(("durably: hit",
                                                                         "durably: miss"))]


def test_hits_and_misses_outside_a_run_say_why(
        store: durably.Store, caplog: pytest.LogCaptureFixture) -> None:
    @durably.task(name="area")
    def area(width: int, height: int = 2) -> int:
        return width * height

    @durably.task(cache=False, name="notify")
    def notify(text: str) -> None:
        return None

    with caplog.at_level(logging.DEBUG, logger="durably"):
        area(3), area(3), area(4), notify("x")
    lines = _lines(caplog)
    assert len(lines) == 4
    assert lines[0].startswith("durably: miss area(width=3, height=2) [key ")
    assert lines[0].endswith(": no earlier entry")
    assert lines[1].startswith("durably: hit area(width=3, height=2)")
    assert lines[2].endswith(": argument 'width' differs")
    assert lines[3].startswith("durably: miss notify(text='x')") and "cache=False" in lines[3]
    assert all("\n" not in line for line in lines)
    key = area.cache_key(3)
    assert f"[key {key[:12]}]" in lines[0]


def test_lookups_inside_a_run_name_the_run_and_replays_are_not_lookups(
        store: durably.Store, caplog: pytest.LogCaptureFixture) -> None:
    @durably.task(name="square")
    def square(x: int) -> int:
        return x * x

    @durably.entrypoint(name="job")
    def job(n: int) -> int:
        return square(n) + square(n + 1)

    square(1)
    with caplog.at_level(logging.DEBUG, logger="durably"):
        run = job.run(1)
        job.run(1)  # replayed from its journal: no lookup of the cache
    lines = _lines(caplog)
    assert [s.status for s in run.steps] == ["cached", "ran"]
    assert len(lines) == 2
    assert lines[0].startswith(f"durably: hit square(x=1) in run {run.id} [key ")
    assert lines[1].startswith(f"durably: miss square(x=2) in run {run.id} [key ")
    assert lines[1].endswith(": argument 'x' differs")


def test_a_miss_says_the_code_changed_or_the_entry_expired(
        disk_store: durably.DiskStore, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from durably._runtime import policy as _policy

    ns: dict[str, object] = {"__name__": "__main__"}
    exec("import durably\n"  # (a notebook cell)
         "def helper(x):\n    return x + 1\n"
         "@durably.task\ndef work(x):\n    return helper(x)\n", ns)
    ns["work"](1)  # type: ignore[operator]
    exec("def helper(x):\n    return x + 2\n", ns)  # (the helper edited)
    with caplog.at_level(logging.DEBUG, logger="durably"):
        ns["work"](1)  # type: ignore[operator]
    assert _lines(caplog)[-1].endswith(": code changed: __main__.helper")

    @durably.task(expires_after=60, name="fresh")
    def fresh(x: int) -> int:
        return x

    fresh(1)
    later = _policy.now() + 61
    monkeypatch.setattr(_policy, "now", lambda: later)
    with caplog.at_level(logging.DEBUG, logger="durably"):
        fresh(1)
        fresh.refresh(2)
    expired, refreshed = _lines(caplog)[-2:]
    assert "miss" in expired and ": expired: written " in expired
    assert "more than expires_after=60 s ago" in expired
    assert refreshed.startswith("durably: miss") and refreshed.endswith(
        "refresh(): executed again, its entry replaced")


def test_nothing_is_logged_when_debug_is_off(
        disk_store: durably.DiskStore, caplog: pytest.LogCaptureFixture) -> None:
    @durably.task
    def f(x: int) -> int:
        return x

    with caplog.at_level(logging.INFO, logger="durably"):
        f(1), f(1)
    assert _lines(caplog) == []


SCRIPT = """
import durably

@durably.task
def double(x):
    return 2 * x

double(1); double(1)
print("done")
"""


@pytest.mark.parametrize("value", ["debug", "DEBUG"])
def test_durably_log_debug_sends_the_lines_to_stderr(tmp_path: Path, value: str) -> None:
    script = write_script(tmp_path / "job.py", SCRIPT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         env=script_env(tmp_path / "store", DURABLY_LOG=value), timeout=120,
                         cwd=tmp_path, check=True)
    assert out.stdout == "done\n"
    lines = [line for line in out.stderr.splitlines() if line.startswith("durably: ")]
    assert len(lines) == 2, out.stderr
    assert lines[0].startswith("durably: miss double(x=1) [key ")
    assert lines[0].endswith("no earlier entry")
    assert lines[1].startswith("durably: hit double(x=1) [key ")


def test_durably_log_that_is_not_a_level_is_a_warning(tmp_path: Path) -> None:
    script = write_script(tmp_path / "job.py", SCRIPT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         env=script_env(tmp_path / "store", DURABLY_LOG="verbose"), timeout=120,
                         cwd=tmp_path, check=True)
    assert "DURABLY_LOG='verbose' is not a logging level" in out.stderr
    assert "durably: hit" not in out.stderr


def test_the_lines_follow_the_level_as_it_changes(
        disk_store: durably.DiskStore, caplog: pytest.LogCaptureFixture) -> None:
    """The call path remembers nothing of its own: turning DEBUG on or off (on the durably
    logger, on the root logger, or with logging.disable) takes effect at the next call."""
    @durably.task(name="twice")
    def twice(x: int) -> int:
        return 2 * x

    caplog.handler.setLevel(logging.DEBUG)
    logger, root = logging.getLogger("durably"), logging.getLogger()
    before = (logger.level, root.level)
    try:
        logger.setLevel(logging.WARNING)
        twice(1), twice(1)
        assert _lines(caplog) == []
        logger.setLevel(logging.DEBUG)
        twice(1)
        assert len(_lines(caplog)) == 1
        logging.disable(logging.DEBUG)
        twice(1)
        assert len(_lines(caplog)) == 1
        logging.disable(logging.NOTSET)
        logger.setLevel(logging.NOTSET)  # (inherits the root's)
        root.setLevel(logging.DEBUG)
        twice(1)
        assert len(_lines(caplog)) == 2
        root.setLevel(logging.INFO)
        twice(1)
        assert len(_lines(caplog)) == 2
    finally:
        logging.disable(logging.NOTSET)
        logger.setLevel(before[0])
        root.setLevel(before[1])
