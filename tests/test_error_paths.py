"""An error about a value that cannot be stored or digested says where in it the offending
part is (issue #33, point 8): ``result['conn']``, ``result.client.lock``, ``rows[3].lock``,
keeping what was wrong and the fix."""

from __future__ import annotations

import re
import threading
from typing import Any, NamedTuple

import pytest

import durably
from durably._keys.hashing import locate_undigestable
from durably._keys.serde import dumps, locate_unpicklable


class Client:
    def __init__(self) -> None:
        self.host = "db"
        self.lock = threading.Lock()


class Service:
    def __init__(self) -> None:
        self.name = "svc"
        self.client = Client()


class Row:
    def __init__(self, i: int, lock: Any = None) -> None:
        self.id = i
        self.lock = lock


class Slotted:
    __slots__ = ("__hidden", "value")

    def __init__(self, value: Any) -> None:
        self.value = 1
        self.__hidden = value


class Pair(NamedTuple):
    left: Any
    right: Any


def _rows() -> list[Row]:
    return [Row(0), Row(1), Row(2), Row(3, threading.Lock()), Row(4)]


@durably.task
def returns_conn() -> Any:
    return {"n": 1, "conn": threading.Lock()}


@durably.task
def returns_service() -> Any:
    return Service()


@durably.task
def returns_a_lock() -> Any:
    return threading.Lock()


_OPENED: list[Any] = []


@durably.task
def returns_an_open_file(path: str) -> Any:
    _OPENED.append(open(path))  # noqa: SIM115 - the point of the test (closed by it)
    return {"data": [1, _OPENED[-1]]}


@durably.task
def count(rows: Any) -> int:
    return len(rows)


@durably.task(ignore=("rows",))
def count_ignored(rows: Any) -> int:
    return len(rows)


def _message(call: Any, *args: Any) -> str:
    with pytest.raises(durably.SerializationError) as got:
        call(*args)
    return str(got.value)


def test_a_result_that_cannot_be_pickled_names_the_path_to_the_part(store: Any) -> None:
    text = _message(returns_conn)
    assert re.search(r"cannot store the result of task '[^']*returns_conn' "
                     r"\(at result\['conn'\]\): that part cannot be "
                     r"pickled \(cannot pickle '_thread\.lock' object\)\. Fix: ", text), text
    text = _message(returns_service)
    assert "(at result.client.lock): that part cannot be pickled" in text, text
    assert "cannot be pickled" in text and "Fix: return plain data" in text
    # the value itself: no path, the message as it was
    text = _message(returns_a_lock)
    assert "(at " not in text and "a value of type _thread.lock cannot be pickled" in text


def test_an_open_file_inside_a_result_is_located(store: Any, tmp_path: Any) -> None:
    path = tmp_path / "f.txt"
    path.write_text("x")
    try:
        text = _message(returns_an_open_file, str(path))
    finally:
        while _OPENED:
            _OPENED.pop().close()
    assert "(at result['data'][1]): it holds an open file or stream" in text, text
    assert "Fix: use its path" in text


def test_an_argument_names_the_path_to_the_part(store: Any) -> None:
    text = _message(count, _rows())
    assert "cannot digest argument 'rows' (at rows[3].lock)" in text, text
    assert "ignore=('rows',)" in text


@pytest.mark.slow
def test_an_argument_sent_to_a_worker_process_names_the_path(disk_store: Any) -> None:
    with pytest.raises(ExceptionGroup) as info:
        count_ignored.map([_rows()], executor="process")
    (exc,) = info.value.exceptions
    assert isinstance(exc, durably.SerializationError)
    assert re.search(r"cannot send argument 'rows' \(at rows\[3\]\.lock\) of "
                     r"'[^']*count_ignored' to a worker process", str(exc)), str(exc)


def test_other_values_are_named_by_what_they_are() -> None:
    with pytest.raises(durably.SerializationError, match=r"interrupt\(\) \(at payload\['lock'\]\)"):
        dumps({"lock": threading.Lock()}, what="the payload of interrupt()")
    with pytest.raises(durably.SerializationError, match=r"\(at value\[0\]\)"):
        dumps([threading.Lock()], what="something")


def test_the_locator_searches_containers_and_attributes() -> None:
    lock = threading.Lock()
    assert locate_unpicklable("r", {"a": [1, (2, lock)]}) == "r['a'][1][1]"
    assert locate_unpicklable("r", Pair(1, {"x": lock})) == "r.right['x']"
    assert locate_unpicklable("r", {frozenset([1]), Row(0, lock)}) in (
        "list(r)[0].lock", "list(r)[1].lock")
    assert locate_unpicklable("r", Slotted(lock)) == "r._Slotted__hidden"
    assert locate_unpicklable("r", {Row(0, lock): 1}) == "list(r)[0].lock"  # a dict's key
    assert locate_unpicklable("r", lock) is None
    assert locate_unpicklable("r", [1, 2]) is None  # (nothing fails)
    looped: list[Any] = [1]
    looped.append(looped)
    looped.append({"k": lock})
    assert locate_unpicklable("r", looped) == "r[2]['k']"
    # bounded: the search gives up after `limit` parts
    many = [*range(50), lock]
    assert locate_unpicklable("r", many, limit=10) is None
    assert locate_unpicklable("r", many) == "r[50]"


def test_digest_errors_search_attributes_too() -> None:
    assert locate_undigestable("rows", _rows()) == "rows[3].lock"
    assert locate_undigestable("s", Service()) == "s.client.lock"
