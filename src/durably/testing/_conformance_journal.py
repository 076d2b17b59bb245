"""The conformance tests of a store's journal (:class:`JournalConformance`): run, step and
event records, deleting runs, leases (acquire, renew, release, takeover, a raced acquire),
fencing (a stale holder's writes refused), transactions and snapshots.

They are the part of :class:`durably.testing.StoreConformance` that checks the
:class:`durably.store.Journal` side of the protocol, apart from the tests of the values a
store keeps (:mod:`durably.testing._conformance_values`) so that each module reads as one
part of the protocol. The run and step records the tests write, and the check that a read
serves nothing, are here; the tests of values use them too.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import queue
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import pytest

from durably._keys import serde as _serde
from durably._store import lease as _lease
from durably.exceptions import CorruptJournalError, RunStateError
from durably.store import EventRecord, Owner, RunRecord, StepRecord, Store

__all__ = ["JournalConformance"]

#: what the dead owner of another host is called
_OTHER_HOST = "durably-conformance-other-host.invalid"


class _Boom(Exception):
    """Raised inside a transaction to roll it back."""


def _id() -> str:
    """A fresh id of 32 hex digits (what the runtime's run, step and key ids look like)."""
    return uuid.uuid4().hex


def _run(run_id: str, *, attempt: int = 1, status: str = "running", updated: float = 1000.0,
         entrypoint: str = "conformance:main", name: str = "main", digest: str = "inputs",
         args: bytes | None = None, result: bytes | None = None,
         error: str | None = None, thread: str | None = None) -> RunRecord:
    return RunRecord(run_id, entrypoint, name, status, 500.0, updated, attempt, digest, args,
                     result, error, thread)


def _step(run_id: str, position: int, *, attempt: int = 1, status: str = "ran",
          step_id: str | None = None, parent_id: str | None = None, cache_key: str = "",
          task: str = "conformance:step", started: float = 1000.0) -> StepRecord:
    return StepRecord(run_id, step_id or _id(), parent_id, task, status, attempt, position,
                      started + position, started + position + 0.5, None, cache_key)


def _replayed(run_id: str, position: int, attempt: int) -> StepRecord:
    """A step served from the run's journal, as the runtime records it (nothing but ids)."""
    return StepRecord(run_id, _id(), None, "conformance:step", "replayed", attempt, position,
                      1000.0 + position, 1000.0 + position, None, _id())


def _refused(read: Callable[[], Any]) -> bool:
    """Whether a read does not serve its value: it returns None, a value that raises when
    loaded (an unreadable one), or raises :class:`~durably.CorruptJournalError`."""
    try:
        got = read()
    except CorruptJournalError:
        return True
    return got is None or isinstance(got, _serde.Unreadable)


def _dead_pid() -> int:
    """The pid of a process of this host that has exited (and was reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", ""])
    proc.wait()
    return proc.pid


def _contend(opener: Callable[[str], Store], url: str, run_id: str, start: Any, done: Any,
             answers: Any) -> None:
    """One contender of the raced acquire, in a process of its own: open the store from its
    URL, acquire the run's lease when every contender is ready, say what came of it, and
    stay alive (holding what it won) until every contender has said so."""
    store = opener(url)
    owner = _lease.me()
    _lease.hold(owner)
    try:
        try:
            start.wait(60)
            holder = store.acquire_run(run_id, owner)
            answers.put((owner.token, None if holder is None else holder.token, ""))
        except BaseException as exc:  # noqa: BLE001 - reported to the test process
            answers.put((owner.token, None, f"{type(exc).__name__}: {exc}"))
        with contextlib.suppress(Exception):
            done.wait(60)
    finally:
        _lease.let_go(owner)
        store.close()


class JournalConformance:
    """The tests of the journal: records, deleting runs, leases, fencing, transactions. A
    part of :class:`~durably.testing.StoreConformance`, which gives them its fixtures and
    harness."""

    if TYPE_CHECKING:  # StoreConformance's harness, which these tests use
        processes: ClassVar[bool]
        contenders: ClassVar[int]

        @staticmethod
        def open_in_process(url: str) -> Store: ...

        def set_clock(self, store: Store, when: float,
                      monkeypatch: pytest.MonkeyPatch) -> None: ...

    # -- records ---------------------------------------------------------------------------
    def test_a_run_record_round_trips(self, store: Store) -> None:
        """``put_run`` stores a run's record as given (``find_run`` returns it), and replaces
        it when written again; ``find_run`` of an unknown run is None."""
        run_id = _id()
        assert store.find_run(run_id) is None
        first = _run(run_id, args=b"arguments", result=None)
        store.put_run(first)
        assert store.find_run(run_id) == first
        second = _run(run_id, attempt=2, status="failed", updated=2000.0, args=b"arguments",
                      result=b"result", error="ValueError('no')")
        store.put_run(second)
        assert store.find_run(run_id) == second
        assert store.find_run(_id()) is None

    def test_find_latest_run_is_the_most_recently_updated(self, store: Store) -> None:
        """``find_latest_run`` is the most recently updated run of that entrypoint with those
        inputs, whatever the order they were written in; None when there is none."""
        older, latest, middle = _id(), _id(), _id()
        store.put_run(_run(older, updated=1000.0))
        store.put_run(_run(latest, updated=3000.0))
        store.put_run(_run(middle, updated=2000.0))
        store.put_run(_run(_id(), updated=9000.0, digest="other inputs"))
        store.put_run(_run(_id(), updated=9000.0, entrypoint="conformance:other"))
        found = store.find_latest_run("conformance:main", "inputs")
        assert found is not None and found.run_id == latest
        assert store.find_latest_run("conformance:main", "no such inputs") is None
        assert store.find_latest_run("conformance:none", "inputs") is None

    def test_list_runs_most_recently_updated_first(self, store: Store) -> None:
        """``list_runs`` lists runs most recently updated first; runs updated at the same
        time, the last written first."""
        ids = [_id() for _ in range(5)]
        for run_id, updated in zip(ids, (1000.0, 3000.0, 2000.0, 3000.0, 3000.0), strict=True):
            store.put_run(_run(run_id, updated=updated))
        assert [r.run_id for r in store.list_runs()] == [ids[4], ids[3], ids[1], ids[2],
                                                          ids[0]]

    def test_list_runs_ties_keep_one_order(self, store: Store) -> None:
        """Runs updated at the same time are all listed, in one order that does not change
        between calls (which order is the store's choice)."""
        ids = [_id() for _ in range(3)]
        for run_id in ids:
            store.put_run(_run(run_id, updated=1000.0))
        store.put_run(_run(ids[0], attempt=2, updated=1000.0))
        first = [r.run_id for r in store.list_runs()]
        assert sorted(first) == sorted(ids)
        assert [r.run_id for r in store.list_runs()] == first

    def test_list_runs_filters_by_entrypoint_identity_or_name(self, store: Store) -> None:
        """``list_runs(entrypoint)`` keeps the runs whose entrypoint identity or name is
        ``entrypoint``."""
        main = [_id(), _id()]
        store.put_run(_run(main[0], updated=1000.0))
        store.put_run(_run(_id(), updated=1500.0, entrypoint="conformance:other",
                           name="other"))
        store.put_run(_run(main[1], updated=2000.0))
        for wanted in ("conformance:main", "main"):
            assert [r.run_id for r in store.list_runs(wanted)] == [main[1], main[0]]
        assert store.list_runs("nothing") == []
        assert len(store.list_runs()) == 3

    def test_a_run_keeps_its_thread(self, store: Store) -> None:
        """A run record's ``thread`` is kept by ``put_run``, ``put_run_if_current`` and read
        back by ``find_run``, ``list_runs`` and ``list_thread_runs`` (the runs on that
        thread only, most recently updated first)."""
        thread = f"t-{_id()}"
        first, second, other, none = _id(), _id(), _id(), _id()
        store.put_run(_run(first, updated=1000.0, thread=thread, args=b"args",
                           result=b"result"))
        store.put_run(_run(other, updated=1500.0, thread=f"{thread}-other"))
        store.put_run(_run(second, updated=2000.0, thread=thread))
        store.put_run(_run(none, updated=2500.0))
        found = store.find_run(first)
        assert found is not None and found.thread == thread
        assert store.put_run_if_current(_run(first, status="finished", updated=3000.0,
                                             thread=thread, args=b"args", result=b"result"))
        assert [r.run_id for r in store.list_thread_runs(thread)] == [first, second]
        # (read back as find_run reads them: arguments and result as they were put)
        listed = store.list_thread_runs(thread)[0]
        assert (listed.args, listed.result) == (b"args", b"result")
        assert [r.thread for r in store.list_thread_runs(thread)] == [thread, thread]
        assert {r.run_id: r.thread for r in store.list_runs()}[none] is None
        assert store.list_thread_runs(f"{thread}-none") == []

    def test_steps_are_listed_in_call_order(self, store: Store) -> None:
        """``list_steps`` returns a run's step records as written, ordered by attempt then
        position whatever the order they were appended in; ``attempt`` selects one attempt;
        ``parents_of`` gives each step's parent."""
        run_id = _id()
        store.put_run(_run(run_id, attempt=2))
        root = _step(run_id, 0)
        full = StepRecord(run_id, _id(), root.step_id, "conformance:other", "cached", 1, 1,
                          1001.0, 1001.25, None, _id(), "(1, 2)", "3", "ab" * 16,
                          ("cd" * 16, "ef" * 16), ("01" * 16, ""))
        failed = StepRecord(run_id, _id(), None, "conformance:step", "failed", 1, 2, 1002.0,
                            1002.5, "ValueError('bad')", "", "(3,)")
        again = _step(run_id, 0, attempt=2, step_id=failed.step_id)
        store.append_steps([(again, b"again")])
        store.append_steps([(failed, None), (full, b"full"), (root, b"root")])
        store.append_steps([(_step(_id(), 0), b"another run")])
        assert store.list_steps(run_id) == [root, full, failed, again]
        assert store.list_steps(run_id, attempt=1) == [root, full, failed]
        assert store.list_steps(run_id, attempt=2) == [again]
        assert store.list_steps(run_id, attempt=3) == []
        assert store.list_steps(_id()) == []
        assert store.parents_of(run_id, [full.step_id, root.step_id, _id()]) == {
            full.step_id: root.step_id, root.step_id: None}

    def test_the_record_that_finished_a_step_is_found_by_its_id(self, store: Store) -> None:
        """``finished_steps`` gives, for each step named that has one, its first ``ran`` or
        ``cached`` record of any attempt (what a replayed step shows its inputs and output
        from): not a failed try before it, not a later record, nothing of another run."""
        run_id = _id()
        store.put_run(_run(run_id, attempt=3))
        cached = StepRecord(run_id, _id(), None, "conformance:other", "cached", 1, 0, 1000.0,
                            1000.25, None, _id(), "(1, 2)", "3", "ab" * 16, ("cd" * 16,))
        failed = StepRecord(run_id, _id(), None, "conformance:step", "failed", 1, 1, 1001.0,
                            1001.5, "ValueError('bad')", "", "(3,)")
        ran = _step(run_id, 0, attempt=2, step_id=failed.step_id)
        store.append_steps([(cached, b"cached"), (failed, None)])
        store.append_steps([(ran, b"ran"), (_step(run_id, 1, attempt=2,
                                                  step_id=cached.step_id), b"again")])
        store.append_steps([(_replayed(run_id, 0, 3), None)])
        other = _step(_id(), 0, step_id=cached.step_id)
        store.append_steps([(other, b"another run")])
        only_failed = _id()
        store.append_steps([(StepRecord(run_id, only_failed, None, "conformance:step",
                                        "failed", 2, 2, 1002.0, 1002.5, "E()"), None)])
        assert store.finished_steps(run_id, [cached.step_id, failed.step_id, only_failed,
                                             _id()]) == {cached.step_id: cached,
                                                         failed.step_id: ran}
        assert store.finished_steps(run_id, []) == {}
        assert store.finished_steps(_id(), [cached.step_id]) == {}
        # the outline: the ran, cached and interrupted records, in call order
        asked = _step(run_id, 3, attempt=2, status="interrupted")
        store.append_steps([(asked, None)])
        assert store.step_outline(run_id) == [
            (r.step_id, r.task, r.status, r.ended) for r in store.list_steps(run_id)
            if r.status in ("ran", "cached", "interrupted")]
        assert [(step, status) for step, _, status, _ in store.step_outline(run_id)] == [
            (cached.step_id, "cached"), (failed.step_id, "ran"), (cached.step_id, "ran"),
            (asked.step_id, "interrupted")]
        assert store.step_outline(_id()) == []

    def test_steps_are_read_a_page_at_a_time_and_counted(self, store: Store) -> None:
        """``page_steps`` returns an attempt's records in call order after a position, at
        most ``limit`` of them (replayed steps included), and ``count_steps`` counts the
        attempt's steps by task and by each step's last record other than ``"started"``
        (a try that failed then ran counts as ``"ran"``)."""
        run_id = _id()
        store.put_run(_run(run_id, attempt=2))
        store.append_steps([(_step(run_id, 0), b"attempt 1")])
        started = _step(run_id, 0, attempt=2, status="started")
        ran = _step(run_id, 0, attempt=2, step_id=started.step_id)
        failed = _step(run_id, 1, attempt=2, status="failed")
        retried = _step(run_id, 1, attempt=2, step_id=failed.step_id, started=1000.25)
        cached = _step(run_id, 2, attempt=2, status="cached", task="conformance:other",
                       cache_key=_id())
        store.append_steps([(started, None)])
        store.append_steps([(ran, b"0"), (failed, None)])
        store.append_steps([(retried, b"1"), (cached, b"2")])
        replayed = [(p, 1000.0 + p, 1000.5 + p, _id(), None, _id(), "conformance:step")
                    for p in (3, 4, 5)]
        assert store.append_replays(run_id, 2, replayed)
        for p in range(6, 9):
            store.append_steps([(_step(run_id, p, attempt=2), b"%d" % p)])
        whole = store.list_steps(run_id, attempt=2)
        assert [s.position for s in whole] == [0, 0, 1, 1, 2, 3, 4, 5, 6, 7, 8]
        assert store.page_steps(run_id, 2, limit=100) == whole
        assert store.page_steps(run_id, 2, limit=3) == whole[:3]
        assert store.page_steps(run_id, 2, after=1, limit=4) == whole[4:8]
        assert store.page_steps(run_id, 2, after=4, limit=2) == whole[7:9]
        assert store.page_steps(run_id, 2, after=8) == []
        assert store.page_steps(run_id, 1) == store.list_steps(run_id, attempt=1)
        assert store.page_steps(_id(), 1) == []
        with pytest.raises(ValueError, match="limit"):
            store.page_steps(run_id, 2, limit=0)
        assert store.count_steps(run_id, 2) == {
            "conformance:step": {"ran": 5, "replayed": 3}, "conformance:other": {"cached": 1}}
        assert store.count_steps(run_id, 1) == {"conformance:step": {"ran": 1}}
        assert store.count_steps(run_id, 3) == {} and store.count_steps(_id(), 1) == {}

    def test_replayed_steps_are_appended_as_any_step(self, store: Store) -> None:
        """``append_steps`` (not fenced) journals records of replayed steps (status
        ``"replayed"``, no value) as any other, whatever attempt the run's record has: a
        late thread of an earlier attempt included; ``list_steps`` returns them as
        written."""
        run_id = _id()
        store.put_run(_run(run_id, attempt=2))
        current, late = _replayed(run_id, 0, 2), _replayed(run_id, 5, 1)
        store.append_steps([(current, None)])
        store.append_steps([(late, None)])
        assert store.list_steps(run_id) == [late, current]

    def test_find_step_serves_finished_steps_only(self, store: Store) -> None:
        """``find_step`` returns the value of a step that finished (``ran`` or ``cached``)
        with a value; None for a failed step, an unknown step or the step of another run. A
        finished step recorded without a value is not served either (None, or
        :class:`~durably.CorruptJournalError` from a store that takes it for damage)."""
        run_id = _id()
        store.put_run(_run(run_id))
        ran, cached, failed, empty = (_step(run_id, 0), _step(run_id, 1, status="cached"),
                                      _step(run_id, 2, status="failed"), _step(run_id, 3))
        store.append_steps([(ran, b"ran"), (cached, b"cached"), (failed, b"failed"),
                            (empty, None)])
        assert store.find_step(run_id, ran.step_id) == b"ran"
        assert store.find_step(run_id, cached.step_id) == b"cached"
        assert store.find_step(run_id, failed.step_id) is None
        assert _refused(lambda: store.find_step(run_id, empty.step_id))
        assert store.find_step(run_id, _id()) is None
        assert store.find_step(_id(), ran.step_id) is None

    def test_a_read_ahead_serves_what_find_step_serves(self, store: Store) -> None:
        """A store that reads ahead (:meth:`~durably.store.Journal.read_ahead` is not None)
        serves, in call order and from the thread that asked, each finished step's value
        as :meth:`~durably.store.Journal.find_step` does, and None for a step without a
        finished record; a replay it retracts is not journaled. A store that does not read
        ahead is checked through ``find_step`` alone (the test above)."""
        run_id = _id()
        store.put_run(_run(run_id))
        steps = [_step(run_id, i) for i in range(5)]
        failed = _step(run_id, 5, status="failed")
        store.append_steps([(s, b"value %d" % i) for i, s in enumerate(steps)]
                           + [(failed, b"failed")])
        ahead = store.read_ahead(run_id)
        if ahead is None:
            assert [store.find_step(run_id, s.step_id) for s in steps] == [
                b"value %d" % i for i in range(5)]
            return
        assert ahead.thread == threading.get_ident()
        served = [ahead.replay(s.step_id, i, 2000.0 + i) for i, s in enumerate(steps)]
        assert served == [b"value %d" % i for i in range(5)]
        assert ahead.find(steps[2].step_id) in (b"value 2", None)  # (None: forgotten)
        assert ahead.replay(failed.step_id, 5, 2005.0) is None
        assert ahead.replay(_id(), 6, 2006.0) is None
        ranges = ahead.take_ranges()
        assert sum(r.steps for r in ranges) == 5  # the five replays, nothing else

    def test_events_are_listed_in_order_and_by_kind(self, store: Store) -> None:
        """``list_events`` returns a run's events in the order they were appended (over
        several calls), as written; ``kinds`` keeps those of these kinds."""
        run_id = _id()
        store.put_run(_run(run_id))
        started = EventRecord(run_id, "run_started", 1000.0, 1)
        asked = EventRecord(run_id, "interrupt", 999.0, 1, _id(), "question-1", b"payload")
        custom = EventRecord(run_id, "custom", 1001.0, 1, None, "", b"data")
        answer = EventRecord(run_id, "answer", 1002.0, 0, None, "question-1", b"yes")
        store.append_events([started, asked])
        store.append_events([EventRecord(_id(), "custom", 1.0, 1)])
        store.append_events([custom, answer])
        assert store.list_events(run_id) == [started, asked, custom, answer]
        assert store.list_events(run_id, ["custom"]) == [custom]
        assert store.list_events(run_id, ["answer", "interrupt"]) == [asked, answer]
        assert store.list_events(run_id, ["run_failed"]) == []
        assert store.list_events(_id()) == []

    def test_delete_runs_removes_a_run_journal_and_keeps_the_cache(
            self, store: Store, owners: Callable[[], Owner]) -> None:
        """``delete_runs`` removes runs with their steps, events and lease, keeps the cache
        and the other runs, skips unknown ids and returns the ids deleted in the order
        given; with ``dry_run`` it only says which it would delete."""
        doomed, kept, cache_key = _id(), _id(), _id()
        owner = owners()
        for run_id in (doomed, kept):
            store.put_run(_run(run_id))
            store.append_steps([(_step(run_id, 0, step_id=run_id, cache_key=cache_key), b"v")])
            store.append_events([EventRecord(run_id, "run_started", 1000.0, 1)])
        store.cache_put(cache_key, b"v")
        # a lease left behind: its owner is no longer executing (a process of this one, let
        # go); held again after the deletion, a lease still stored would be live again
        assert store.acquire_run(doomed, owner) is None
        _lease.let_go(owner)
        assert store.run_holder(doomed) is None
        assert store.delete_runs([_id(), doomed], dry_run=True) == [doomed]
        assert store.find_run(doomed) is not None and store.list_steps(doomed)
        assert store.delete_runs([_id(), doomed, doomed]) == [doomed]
        _lease.hold(owner)
        assert store.find_run(doomed) is None
        assert store.list_steps(doomed) == [] and store.list_events(doomed) == []
        assert store.find_step(doomed, doomed) is None
        assert store.run_holder(doomed) is None, "the deleted run's lease is still stored"
        assert store.find_run(kept) is not None and len(store.list_steps(kept)) == 1
        assert len(store.list_events(kept)) == 1
        assert store.cache_get(cache_key) == b"v"
        assert store.delete_runs([doomed]) == []

    def test_delete_runs_refuses_a_run_a_live_owner_executes(
            self, store: Store, owners: Callable[[], Owner]) -> None:
        """``delete_runs`` of a run whose lease a live owner holds raises
        :class:`~durably.RunStateError` and deletes nothing; with ``skip_executing`` that
        run is left out (not deleted, not returned)."""
        busy, idle = _id(), _id()
        store.put_run(_run(busy))
        store.put_run(_run(idle))
        assert store.acquire_run(busy, owners()) is None
        with pytest.raises(RunStateError):
            store.delete_runs([idle, busy])
        assert store.find_run(busy) is not None
        assert store.delete_runs([busy, idle], skip_executing=True) == [idle]
        assert store.find_run(busy) is not None and store.find_run(idle) is None

    # -- leases ----------------------------------------------------------------------------
    def test_a_lease_is_held_by_one_live_owner(self, store: Store,
                                               owners: Callable[[], Owner]) -> None:
        """A lease is taken by ``acquire_run`` (None) and refused to another live owner
        (it gets the holder); only the holder renews (True) and releases it; ``run_holder``
        and ``check_run`` name the holder; once released, another owner takes it."""
        run_id = _id()
        a, b = owners(), owners()
        assert store.run_holder(run_id) is None
        assert store.acquire_run(run_id, a) is None
        assert store.acquire_run(run_id, a) is None  # (its own lease: taken again)
        holder = store.acquire_run(run_id, b)
        assert holder is not None and holder.token == a.token
        found = store.run_holder(run_id)
        assert found is not None and (found.token, found.host, found.pid) == (
            a.token, a.host, a.pid)
        assert store.check_run(run_id, a) is None
        found = store.run_holder(run_id)
        assert found is not None and found.token == a.token, (
            "check_run(run_id, holder) removed the holder's own lease")
        checked = store.check_run(run_id, b)
        assert checked is not None and checked.token == a.token
        assert store.renew_run(run_id, a) is True
        assert store.renew_run(run_id, b) is False
        assert store.renew_run_apart(run_id, a) is True
        assert store.release_run(run_id, b) is False
        found = store.run_holder(run_id)
        assert found is not None and found.token == a.token
        assert store.release_run(run_id, a) is True
        assert store.release_run(run_id, a) is False
        assert store.renew_run(run_id, a) is False
        assert store.run_holder(run_id) is None
        assert store.acquire_run(run_id, b) is None
        found = store.run_holder(run_id)
        assert found is not None and found.token == b.token

    def test_a_dead_owner_on_this_host_is_taken_over(self, store: Store,
                                                     owners: Callable[[], Owner]) -> None:
        """The lease of an owner on this host whose process has exited is not live
        (``run_holder`` is None) and is taken over by a new owner's ``acquire_run``."""
        run_id = _id()
        me = _lease.me()
        # started=-1: were the pid reused meanwhile, its process would not be that owner
        dead = Owner(me.host, _dead_pid(), -1, _id(), time.time())
        assert not dead.alive(time.time())
        assert store.acquire_run(run_id, dead) is None
        assert store.run_holder(run_id) is None
        new = owners()
        assert store.check_run(run_id, new) is None
        assert store.acquire_run(run_id, new) is None
        found = store.run_holder(run_id)
        assert found is not None and found.token == new.token
        assert store.release_run(run_id, dead) is False

    def test_an_owner_of_another_host_expires_without_renewal(
            self, store: Store, owners: Callable[[], Owner],
            monkeypatch: pytest.MonkeyPatch) -> None:
        """The lease of an owner on another host is live while renewed within
        ``LEASE_SECONDS`` (another owner is refused), and taken over once it was not renewed
        for longer."""
        run_id = _id()
        there = Owner(_OTHER_HOST, 4242, None, _id(), time.time())
        new = owners()
        assert store.acquire_run(run_id, there) is None
        holder = store.acquire_run(run_id, new)
        assert holder is not None and holder.token == there.token
        later = time.time() + _lease.LEASE_SECONDS + 5
        self.set_clock(store, later, monkeypatch)
        assert store.run_holder(run_id) is None
        assert store.acquire_run(run_id, new) is None
        found = store.run_holder(run_id)
        assert found is not None and found.token == new.token

    def test_renewal_keeps_a_lease_of_another_host_alive(
            self, store: Store, owners: Callable[[], Owner],
            monkeypatch: pytest.MonkeyPatch) -> None:
        """``renew_run`` refreshes the lease's heartbeat: renewed after 0.75 of
        ``LEASE_SECONDS``, a lease of another host is still live at 1.5 of it (another owner
        is refused)."""
        run_id = _id()
        start = time.time()
        there = Owner(_OTHER_HOST, 4242, None, _id(), start)
        new = owners()
        assert store.acquire_run(run_id, there) is None
        self.set_clock(store, start + 0.75 * _lease.LEASE_SECONDS, monkeypatch)
        assert store.renew_run(run_id, there) is True
        self.set_clock(store, start + 1.5 * _lease.LEASE_SECONDS, monkeypatch)
        found = store.run_holder(run_id)
        assert found is not None and found.token == there.token, (
            "a lease renewed within LEASE_SECONDS expired: renew_run did not refresh its "
            "heartbeat")
        holder = store.acquire_run(run_id, new)
        assert holder is not None and holder.token == there.token

    def test_an_acquire_raced_has_exactly_one_winner(
            self, store: Store, owners: Callable[[], Owner]) -> None:
        """Of several contenders acquiring a run's lease at once (released together by a
        barrier: processes opening the store from its URL when ``processes`` is True,
        else threads), exactly one gets None; every other is told that one holds it."""
        run_id = _id()
        store.put_run(_run(run_id))  # (the store exists before the contenders open it)
        n = self.contenders
        if self.processes:
            answers = self._race_processes(store, run_id, n)
        else:
            answers = self._race_threads(store, run_id, n, owners)
        errors = [error for _, _, error in answers if error]
        assert not errors, f"contenders failed: {errors}"
        winners = [token for token, holder, _ in answers if holder is None]
        assert len(winners) == 1, f"{len(winners)} of {n} contenders acquired the lease"
        losers = {holder for _, holder, _ in answers if holder is not None}
        assert losers == {winners[0]}, "a contender was refused by an owner that did not win"

    def _race_threads(self, store: Store, run_id: str, n: int,
                      owners: Callable[[], Owner]) -> list[tuple[str, str | None, str]]:
        contenders = [owners() for _ in range(n)]
        start = threading.Barrier(n)
        answers: list[tuple[str, str | None, str]] = []

        def contend(owner: Owner) -> None:
            try:
                start.wait(30)
                holder = store.acquire_run(run_id, owner)
                answers.append((owner.token, None if holder is None else holder.token, ""))
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                answers.append((owner.token, None, f"{type(exc).__name__}: {exc}"))

        threads = [threading.Thread(target=contend, args=(o,)) for o in contenders]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert len(answers) == n, "a contender did not answer within 60 s"
        return answers

    def _race_processes(self, store: Store, run_id: str, n: int
                        ) -> list[tuple[str, str | None, str]]:
        url = store.url
        if not url:
            pytest.fail(f"processes = True, but {type(store).__name__}.url is None: a "
                        "store shared by processes must have a URL they open it from")
        try:  # (here first: a URL no process can open fails now, saying why)
            type(self).open_in_process(url)
        except Exception as exc:  # noqa: BLE001 - reported as the test's failure
            pytest.fail(f"processes = True: the contender processes open the store from its "
                        f"URL {url!r}, which does not open here: {type(exc).__name__}: "
                        f"{str(exc).rstrip('.')}. "
                        "Fix: register the backend's URL scheme (install the package whose "
                        "entry point group durably.stores names it), override "
                        "open_in_process, or set processes = False.")
        ctx = multiprocessing.get_context("spawn")
        start, done = ctx.Barrier(n), ctx.Barrier(n)
        answers: Any = ctx.Queue()
        procs = [ctx.Process(target=_contend, daemon=True,
                             args=(type(self).open_in_process, url, run_id, start, done,
                                   answers))
                 for _ in range(n)]
        for proc in procs:
            proc.start()
        got: list[tuple[str, str | None, str]] = []
        try:
            deadline = time.monotonic() + 120
            while len(got) < n and time.monotonic() < deadline:
                try:
                    got.append(answers.get(timeout=1))
                except queue.Empty:
                    if not any(proc.is_alive() for proc in procs):
                        # every contender exited: what they sent is in the queue by now
                        with contextlib.suppress(queue.Empty):
                            while len(got) < n:
                                got.append(answers.get(timeout=5))
                        break
        finally:
            for proc in procs:
                proc.join(30)
                if proc.is_alive():
                    proc.kill()
                    proc.join()
        codes = [proc.exitcode for proc in procs]
        assert len(got) == n, (f"{n - len(got)} of {n} contender processes did not answer "
                               f"(exit codes: {codes})")
        return got

    # -- fencing ---------------------------------------------------------------------------
    def test_a_stale_holder_writes_nothing(self, store: Store,
                                           owners: Callable[[], Owner]) -> None:
        """Once another owner took a run over (A's lease released, B acquired it and
        started attempt 2), every write A makes for attempt 1 is refused (False) and
        changes nothing: its steps, its final record, its start of the next attempt, its
        replays; B's writes for attempt 2 succeed."""
        run_id = _id()
        a = owners()
        assert store.acquire_run(run_id, a) is None
        store.put_run(_run(run_id, attempt=1))
        assert store.append_steps_if_current([(_step(run_id, 0), b"a0")]) is True
        assert store.append_replays(run_id, 1, [(1, 1001.0, 1001.0, _id(), None, _id(),
                                                 "conformance:step")]) is True
        # taken over: A's lease is gone, B acquires it and starts attempt 2
        assert store.release_run(run_id, a) is True
        b = owners()
        assert store.acquire_run(run_id, b) is None
        assert store.put_run_if_current(_run(run_id, attempt=2, updated=2000.0),
                                        previous=1) is True
        steps = store.list_steps(run_id)
        assert len(steps) == 2
        # A, unaware, goes on with attempt 1
        assert store.append_steps_if_current([(_step(run_id, 2), b"a2")]) is False
        assert store.list_steps(run_id) == steps
        assert store.append_replays(run_id, 1, [(3, 1003.0, 1003.0, _id(), None, _id(),
                                                 "conformance:step")]) is False
        assert store.list_steps(run_id) == steps
        assert store.put_run_if_current(_run(run_id, attempt=1, status="finished",
                                             updated=3000.0, result=b"A's")) is False
        assert store.put_run_if_current(_run(run_id, attempt=2, status="running",
                                             updated=3000.0, name="A's"), previous=1) is False
        stored = store.find_run(run_id)
        assert stored is not None and (stored.attempt, stored.status, stored.name,
                                       stored.result) == (2, "running", "main", None)
        # B's writes go through
        mine = _step(run_id, 0, attempt=2)
        assert store.append_steps_if_current([(mine, b"b0")]) is True
        assert store.append_replays(run_id, 2, [(1, 2001.0, 2001.0, _id(), None, _id(),
                                                 "conformance:step")]) is True
        assert store.put_run_if_current(_run(run_id, attempt=2, status="finished",
                                             updated=4000.0, result=b"B's")) is True
        stored = store.find_run(run_id)
        assert stored is not None and (stored.attempt, stored.status, stored.result) == (
            2, "finished", b"B's")
        assert [(s.attempt, s.position, s.status) for s in store.list_steps(run_id)] == [
            (1, 0, "ran"), (1, 1, "replayed"), (2, 0, "ran"), (2, 1, "replayed")]
        assert store.find_step(run_id, mine.step_id) == b"b0"

    def test_put_run_if_current_checks_the_stored_attempt(self, store: Store) -> None:
        """``put_run_if_current(record)`` writes only while the stored record has
        ``record.attempt``; with ``previous``, only while it has ``previous`` (the start of
        the next attempt); False and nothing written otherwise, and for a run with no
        record."""
        run_id = _id()
        assert store.put_run_if_current(_run(run_id)) is False
        assert store.put_run_if_current(_run(run_id), previous=0) is False
        assert store.find_run(run_id) is None
        store.put_run(_run(run_id, attempt=1))
        assert store.put_run_if_current(_run(run_id, attempt=1, status="failed")) is True
        assert store.put_run_if_current(_run(run_id, attempt=2), previous=2) is False
        assert store.put_run_if_current(_run(run_id, attempt=2)) is False
        found = store.find_run(run_id)
        assert found is not None and (found.attempt, found.status) == (1, "failed")
        assert store.put_run_if_current(_run(run_id, attempt=2), previous=1) is True
        assert store.put_run_if_current(_run(run_id, attempt=3), previous=1) is False
        found = store.find_run(run_id)
        assert found is not None and (found.attempt, found.status) == (2, "running")

    def test_a_mixed_batch_refuses_the_stale_run_steps(self, store: Store) -> None:
        """``append_steps_if_current`` of the steps of two runs, one taken over, returns
        False; the stale run's steps are not written, the current run's are."""
        stale, current = _id(), _id()
        store.put_run(_run(stale, attempt=2))
        store.put_run(_run(current, attempt=1))
        mine, old = _step(current, 0), _step(stale, 0, attempt=1)
        assert store.append_steps_if_current([(mine, b"current"), (old, b"stale")]) is False
        assert store.list_steps(stale) == []
        assert store.find_step(stale, old.step_id) is None
        assert store.list_steps(current) == [mine]

    def test_stale_replayed_steps_are_refused(self, store: Store) -> None:
        """``append_steps_if_current`` of records of steps replayed in an attempt that was
        taken over (status ``"replayed"``, no value) returns False and writes nothing."""
        run_id = _id()
        store.put_run(_run(run_id, attempt=2))
        assert store.append_steps_if_current([(_replayed(run_id, 0, 1), None)]) is False
        assert store.append_steps_if_current([(_replayed(run_id, 0, 1), None),
                                              (_replayed(run_id, 1, 1), None)]) is False
        assert store.list_steps(run_id) == []
        current = _replayed(run_id, 0, 2)
        assert store.append_steps_if_current([(current, None)]) is True
        assert store.list_steps(run_id) == [current]

    # -- transactions ----------------------------------------------------------------------
    def test_a_block_that_raises_keeps_nothing(self, store: Store,
                                               owners: Callable[[], Owner]) -> None:
        """The writes of a ``batch()`` block that raises are all gone (run record, steps,
        events, lease); inside the block they were seen."""
        run_id, owner = _id(), owners()
        step = _step(run_id, 0)
        with pytest.raises(_Boom), store.batch():
            assert store.acquire_run(run_id, owner) is None
            store.put_run(_run(run_id))
            store.append_steps([(step, b"v")])
            store.append_events([EventRecord(run_id, "run_started", 1000.0, 1)])
            assert store.find_run(run_id) is not None
            raise _Boom
        assert store.find_run(run_id) is None
        assert store.list_steps(run_id) == [] and store.find_step(run_id, step.step_id) is None
        assert store.list_events(run_id) == []
        assert store.run_holder(run_id) is None, "the lease taken in the block was kept"
        assert store.acquire_run(run_id, owners()) is None

    def test_a_committed_block_is_seen_whole(self, store: Store, other: Store,
                                             owners: Callable[[], Owner]) -> None:
        """The writes of a ``batch()`` block that ends are all kept, and seen by another
        handle on the store."""
        run_id, owner = _id(), owners()
        step = _step(run_id, 0)
        with store.batch():
            assert store.acquire_run(run_id, owner) is None
            store.put_run(_run(run_id))
            store.append_steps([(step, b"v")])
            store.append_events([EventRecord(run_id, "run_started", 1000.0, 1)])
        for handle in (store, other):
            assert handle.find_run(run_id) == _run(run_id)
            assert handle.list_steps(run_id) == [step]
            assert handle.find_step(run_id, step.step_id) == b"v"
            assert len(handle.list_events(run_id)) == 1
            holder = handle.run_holder(run_id)
            assert holder is not None and holder.token == owner.token

    def test_a_reader_never_sees_a_block_in_progress(self, store: Store,
                                                     other: Store) -> None:
        """Another handle reading (from another thread) while a ``batch()`` block is under
        way sees none of its writes, or (a store whose reads wait for the block) all of
        them; never a part."""
        if other is store:
            pytest.skip(f"reopen() of {type(store).__name__} returns the same object (no "
                        "URL, or a store kept in this process): a reader cannot be told "
                        "apart from the writer; implement reopen() to check it")
        run_id = _id()
        begun, looked = threading.Event(), threading.Event()
        errors: list[BaseException] = []
        seen: list[tuple[bool, int, int]] = []

        def write() -> None:
            try:
                with store.batch():
                    store.put_run(_run(run_id))
                    store.append_steps([(_step(run_id, 0), b"v")])
                    store.append_events([EventRecord(run_id, "run_started", 1000.0, 1)])
                    begun.set()
                    looked.wait(5)  # (a reader that waits for the block: it ends then)
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                errors.append(exc)
            finally:
                begun.set()

        def read() -> None:
            try:
                begun.wait(30)
                seen.append((other.find_run(run_id) is not None,
                             len(other.list_steps(run_id)), len(other.list_events(run_id))))
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                errors.append(exc)
            finally:
                looked.set()

        threads = [threading.Thread(target=write), threading.Thread(target=read)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not errors, errors
        assert seen in ([(False, 0, 0)], [(True, 1, 1)]), f"the reader saw {seen}"
        assert (other.find_run(run_id) is not None, len(other.list_steps(run_id))) == (True, 1)

    def test_a_snapshot_reads_one_state(self, store: Store, other: Store) -> None:
        """The reads of a ``snapshot()`` block see one state of the journal: a write
        committed by another handle meanwhile is not seen until the block ends."""
        run_id = _id()
        store.put_run(_run(run_id))
        store.append_events([EventRecord(run_id, "run_started", 1000.0, 1)])
        written = threading.Event()
        errors: list[BaseException] = []

        def write() -> None:
            try:
                with other.batch():
                    other.put_run(_run(run_id, status="finished", updated=2000.0))
                    other.append_events([EventRecord(run_id, "run_finished", 2000.0, 1)])
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                errors.append(exc)
            finally:
                written.set()

        writer = threading.Thread(target=write)
        with store.snapshot():
            before = (store.find_run(run_id), store.list_events(run_id))
            writer.start()
            written.wait(0.5)  # (a store whose snapshot holds writers back: they wait)
            after = (store.find_run(run_id), store.list_events(run_id))
        writer.join(60)
        assert not errors, errors
        assert after == before, "a read in a snapshot saw a write committed meanwhile"
        found = store.find_run(run_id)
        assert found is not None and found.status == "finished"
        assert len(store.list_events(run_id)) == 2
