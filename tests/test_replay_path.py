"""The replay path's bookkeeping without locks: step identities, occurrence counts and the
buffered replay records stay exact when threads of one run use them at once."""

from __future__ import annotations

import contextvars
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import durably
from durably._runtime import context as _context
from durably._runtime.context import RunContext
from durably._runtime.spec import step_identity
from durably._store.lease import me
from durably.testing import MemoryStore

from .conftest import run_script, script_env, write_script

_ids = st.text(alphabet="0123456789abcdef", min_size=32, max_size=32)


def _new_context() -> RunContext:
    return RunContext("run", MemoryStore(), 1, me())


@pytest.fixture
def switch_often() -> Iterator[None]:
    """Threads switch every microsecond, so that unlocked read-modify-writes would collide."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


@given(st.lists(st.tuples(st.none() | st.sampled_from(["p" * 32, "q" * 32]),
                          st.sampled_from(["a" * 32, "b" * 32, "c" * 32])), max_size=30))
@settings(max_examples=200, deadline=None)
def test_step_ids_count_occurrences_per_parent_and_key(calls: list[tuple[str | None, str]]
                                                       ) -> None:
    """A run's n-th call with the same parent and key gets step_identity(parent, key, n): the
    identity a fork or another process computes for it."""
    ctx = _new_context()
    seen: dict[tuple[str | None, str], int] = {}
    for parent, key in calls:
        n = seen.get((parent, key), 0)
        seen[(parent, key)] = n + 1
        assert ctx.step_id(parent, key) == step_identity(parent, key, n)


def _ids_from_threads(keys: list[str]) -> list[str]:
    """The step ids eight threads get calling ``ctx.step_id(None, key)`` for each key in
    turn, on one new context, all of them."""
    ctx = _new_context()
    got: list[list[str]] = [[] for _ in range(8)]

    def work(out: list[str]) -> None:
        for key in keys:
            out.append(ctx.step_id(None, key))

    threads = [threading.Thread(target=work, args=(out,)) for out in got]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [i for out in got for i in out]


def test_threads_never_get_one_occurrence_twice(switch_often: None) -> None:
    key = "ab" * 16
    everything = _ids_from_threads([key] * 3000)
    assert len(set(everything)) == len(everything) == 24_000
    assert set(everything) == {step_identity(None, key, n) for n in range(24_000)}


def test_threads_racing_for_first_occurrences_get_each_number_once(switch_often: None
                                                                  ) -> None:
    """Eight threads call the same 2,000 keys in the same order: every key's first call is
    raced for (one of them stores its mark, the others count on from it); each key gets
    the occurrences 0 to 7, once each."""
    keys = [f"{k:032x}" for k in range(2000)]
    everything = sorted(_ids_from_threads(keys))
    assert everything == sorted(step_identity(None, key, n) for key in keys for n in range(8))


def test_a_run_s_threads_calling_one_step_alike_replay_each_call(store: Any) -> None:
    """Threads of one run call a side effect with the same inputs at once: each call is a
    step of its own (occurrences 0 to 3 of each input), executed once, replayed on resume."""
    calls: list[int] = []

    @durably.task(cache=False)
    def note(x: int) -> int:
        calls.append(x)
        return x

    fail = {"on": True}

    @durably.entrypoint
    def fan(n: int) -> int:
        def work() -> int:
            return sum(note(x) for x in range(n))

        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(contextvars.copy_context().run, work) for _ in range(4)]
            total = sum(f.result() for f in futures)
        if fail["on"]:
            raise RuntimeError("stopped after the threads, to be resumed")
        return total

    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with pytest.raises(RuntimeError):
            fan(300)
    finally:
        sys.setswitchinterval(before)
    assert sorted(calls) == sorted(list(range(300)) * 4)
    fail["on"] = False
    calls.clear()
    run = fan.run(300)
    assert run.result == 4 * sum(range(300)) and calls == []
    assert run.counts()["replayed"] == 1200


def test_a_task_called_from_a_signal_handler_while_its_thread_counts(tmp_path: Path
                                                                     ) -> None:
    """A signal handler calls a task while the thread it interrupts is counting a step's
    occurrence (a progress note on a timer): the run finishes, every call a step of its own
    (a lock in the counting waited for itself: the run hung). In a process of its own, so
    that a hang is a timeout, not a stuck test run."""
    script = write_script(tmp_path / "alarm.py", """
        import signal, sys
        import durably

        @durably.task(cache=False)
        def tick(x):
            return x

        @durably.task(cache=False)
        def note(msg):
            return msg

        busy = [False]

        def on_alarm(signum, frame):
            if not busy[0]:
                busy[0] = True
                try:
                    note("progress")
                finally:
                    busy[0] = False

        @durably.entrypoint
        def job(n):
            signal.signal(signal.SIGALRM, on_alarm)
            signal.setitimer(signal.ITIMER_REAL, 0.0003, 0.0003)
            try:
                return sum(tick(0) for _ in range(n))
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)

        run = job.run(20_000)
        print(run.status, run.counts()["ran"] - 20_000)
        """)
    out = run_script(script, script_env(tmp_path / "store"), timeout=90).stdout.split()
    assert out[0] == "finished" and int(out[1]) > 0  # (the notes: each a step of its own)


def test_replay_records_buffered_by_threads_are_all_taken(
        switch_often: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Threads buffer replay records while another thread takes them (as a flush does):
    every record is taken exactly once."""
    monkeypatch.setattr(_context, "_FLUSH_EVERY", 10**9)  # only the taker below takes them
    ctx = _new_context()
    taken: list[Any] = []
    done = threading.Event()

    def take() -> None:
        while not done.is_set():
            taken.extend(ctx.take_pending()[1])
        taken.extend(ctx.take_pending()[1])

    def note(n: int) -> None:
        for i in range(5000):
            ctx.note_replayed((n * 5000 + i, 1.0, 2.0, "a" * 32, None, "", "t"))

    taker = threading.Thread(target=take)
    taker.start()
    writers = [threading.Thread(target=note, args=(n,)) for n in range(4)]
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    done.set()
    taker.join()
    assert sorted(r[0] for r in taken) == list(range(20_000))


def test_a_thread_map_replays_every_item_once(store: Any) -> None:
    """A fan-out on threads resumes with every finished item replayed, counted once each."""
    calls: list[int] = []

    @durably.task
    def square(x: int) -> int:
        calls.append(x)
        return x * x

    fail = {"on": True}

    @durably.entrypoint
    def sweep(n: int) -> int:
        total = sum(square.map(range(n), executor="thread"))
        if fail["on"]:
            raise RuntimeError("stopped after the map, to be resumed")
        return total

    with pytest.raises(RuntimeError):
        sweep(200)
    fail["on"] = False
    calls.clear()
    run = sweep.run(200)
    assert run.result == sum(x * x for x in range(200)) and calls == []
    assert run.counts()["replayed"] == 200


def _golden(a: Any, b: Any = 2, *, c: Any = "x") -> Any:
    return a


# cache keys and side-effect keys written by durably before the replay path was made
# faster: a journal or cache written then must still be found (the same bytes are hashed)
GOLDEN_KEYS = [
    ((1,), {}, "608c47e9ba61a8352796dc5455d3d0ae", "0c08b6a255eb3180fb893ddcfe293e8f"),
    ((1, 2), {}, "608c47e9ba61a8352796dc5455d3d0ae", "0c08b6a255eb3180fb893ddcfe293e8f"),
    ((1,), {"c": "x"}, "608c47e9ba61a8352796dc5455d3d0ae", "0c08b6a255eb3180fb893ddcfe293e8f"),
    ((-(2**63) - 1,), {}, "72cacfc86ca1303a0dca9c33b7d4d4a6", "ad073b5e9cf36f712611604d1bf37b9f"),
    ((1.5,), {"b": (1, "two")}, "43bfab9e6b66722e10789af08ba07715",
     "12654dfe8e62ca582d8a3688cd599ba6"),
    (("héllo",), {"b": None, "c": True}, "5ad317d1bf579781de9d02af6750d2e5",
     "e38c1a2fa2a9f9cf4c1ca2400805c299"),
    ((b"raw",), {}, "6ea61f626a33b8f6ab30cd79bc64d47d", "c71ff69f340eda5ac05b372813d58f7d"),
]


@pytest.mark.parametrize(("args", "kwargs", "key", "side_effect_key"), GOLDEN_KEYS)
def test_cache_keys_are_the_ones_earlier_versions_wrote(
        args: tuple[Any, ...], kwargs: dict[str, Any], key: str, side_effect_key: str) -> None:
    from durably._runtime.spec import Spec

    spec = Spec(_golden, kind="task", name="golden", version="1")
    spec.identity = "golden:golden"
    digest = spec.digest_inputs(spec.arguments(None, args, kwargs))
    assert spec.key_and_code(digest) == (key, "v:1")
    assert spec.side_effect_key(digest) == side_effect_key


def test_a_run_renews_its_lease_as_its_steps_go(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each step checks whether the run's lease is due for renewal; when it is, the lease's
    heartbeat moves (a long run is never taken for a dead one)."""
    import sqlite3
    import time

    monkeypatch.setattr(_context, "RENEW_SECONDS", 0.05)
    store = durably.DiskStore(tmp_path / "s")
    durably.configure(store=store)
    seen: list[float] = []

    def heartbeat() -> float:
        con = sqlite3.connect(tmp_path / "s" / "journal.sqlite3")
        try:
            return float(con.execute("SELECT heartbeat FROM leases").fetchone()[0])
        finally:
            con.close()

    @durably.task
    def slow(i: int) -> int:
        time.sleep(0.03)
        return i

    @durably.entrypoint
    def job(n: int) -> int:
        total = 0
        for i in range(n):
            total += slow(i)
            seen.append(heartbeat())
        return total

    assert job(8) == 28
    assert seen[-1] > seen[0]  # renewed during the run, by the steps


@durably.task
def _big(i: int) -> bytes:
    return i.to_bytes(4, "little") * 20_000  # 80 kB: over the read-ahead's 64 KiB per result


_STOP = {"after_steps": True}


@durably.entrypoint
def _many_big(n: int) -> int:
    total = sum(_big(i)[0] for i in range(n))
    if _STOP["after_steps"]:
        raise RuntimeError("stopped, to be resumed")
    return total


def test_a_replay_of_large_results_reads_ahead_once_not_per_step(tmp_path: Any) -> None:
    """A result too large for the read-ahead window is read alone when its step replays; the
    window still serves the steps after it (it was read again from each such step: one
    512-row query per step)."""
    store = durably.DiskStore(tmp_path / "store")
    durably.configure(store=store)
    try:
        _STOP["after_steps"] = True
        with pytest.raises(RuntimeError):
            _many_big(60)
        _STOP["after_steps"] = False
        queries: list[str] = []
        store._db().set_trace_callback(queries.append)
        run = _many_big.run(60)
        store._db().set_trace_callback(None)
        assert run.result == sum(range(60)) and run.counts()["replayed"] == 60
        ahead = [q for q in queries if "CASE WHEN length(result)" in q]
        alone = [q for q in queries if "SELECT rowid, CAST(result AS BLOB) FROM steps" in q]
        assert len(ahead) == 1  # the first lookup's
        assert len(alone) == 60  # each large result, the first one's lookup included
    finally:
        durably.configure()
        store.close()
