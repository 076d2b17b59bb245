"""Wrong uses of the store, runs and keys (the table of ``test_errors.py`` continues here): each
is answered by a durably exception (or the Python error a user expects) whose message names
what was wrong and says how to fix it, and leaves every file byte for byte as it was."""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import entrypoint, task


@task
def _t(x: Any) -> Any:
    return x


@entrypoint
def _ep(x: int) -> int:
    return _t(x)


@task
def _question(x: int) -> str:
    return str(durably.interrupt(f"approve {x}?"))


@entrypoint
def _ask(x: int) -> str:
    return _question(x)


_opened: list[Any] = []


@task
def _opener(path: str) -> Any:
    handle = open(path)  # noqa: SIM115 - the wrong use under test
    _opened.append(handle)
    return handle


@dataclasses.dataclass
class Ctx:
    tmp: Path
    store: durably.DiskStore
    monkeypatch: pytest.MonkeyPatch
    finished: str
    waiting: str


def _future_store(c: Ctx) -> None:
    root = c.tmp / "future"
    root.mkdir(mode=0o700)
    (root / "FORMAT").write_text("durably-store 99\n")
    durably.DiskStore(root).cache_get("k")


def _future_journal(c: Ctx) -> None:
    root = c.tmp / "future-journal"
    root.mkdir(mode=0o700)
    (root / "FORMAT").write_text("durably-store 2\n")  # same layout, a newer journal
    con = sqlite3.connect(root / "journal.sqlite3")
    con.execute("PRAGMA user_version=99")
    con.close()
    durably.DiskStore(root).list_runs()


def _shared_dir(c: Ctx) -> None:
    root = c.tmp / "shared"
    root.mkdir()
    root.chmod(0o777)
    durably.DiskStore(root).cache_get("k")


def _durably_dir_file(c: Ctx) -> None:
    target = c.tmp / "a-file"
    target.write_text("hello")
    c.monkeypatch.setenv("DURABLY_DIR", str(target))
    durably.configure()
    _t(3)


def _env_key(c: Ctx, name: str, value: str) -> None:
    c.monkeypatch.setenv(name, value)
    durably.DiskStore(c.store.path).cache_get("k")


def _key_path_as_key(c: Ctx) -> None:
    keyfile = c.tmp / "keyfile"
    keyfile.write_text("0123456789abcdef0123456789abcdef")
    keyfile.chmod(0o600)
    durably.configure(key=str(keyfile))


def _open_file_result(c: Ctx) -> None:
    with open(c.tmp / "data.txt", "w") as f:
        f.write("rows")
    try:
        _opener(str(c.tmp / "data.txt"))
    finally:
        while _opened:
            _opened.pop().close()


def _too_deep(c: Ctx) -> None:
    value: list[Any] = []
    for _ in range(100_000):
        value = [value]
    _t(value)


Case = tuple[str, Callable[[Ctx], Any], type[BaseException], tuple[str, ...]]

def _an_entrypoint() -> Any:
    @durably.entrypoint
    def etl(n: int) -> int:
        return n
    return etl


CASES: list[Case] = [
    ("resume on a finished run", lambda c: _ep.resume(c.finished, 1),
     durably.RunStateError, ("is finished, not interrupted", "{finished}")),
    ("resume an unknown run id", lambda c: _ask.resume("no-such-run", 1),
     durably.NotFoundError, ("no-such-run", "list_runs()")),
    ("resume with an invalid run_id", lambda c: _ask.resume("../etc/passwd", 1),
     durably.DefinitionError, ("invalid run_id", "../etc/passwd", "for example run_id=")),
    ("resume a run of another entrypoint", lambda c: _ask.resume(c.finished, 1),
     durably.RunStateError, ("belongs to entrypoint", "{finished}")),
    ("fresh=True with an existing run_id", lambda c: _ep.run(1, run_id=c.finished, fresh=True),
     durably.RunStateError, ("fresh=True", "already exists", "{finished}")),
    ("an existing run_id with other arguments", lambda c: _ep.run(2, run_id=c.finished),
     durably.RunStateError, ("other arguments", "{finished}")),
    ("fork at an unknown checkpoint", lambda c: durably.fork(c.finished, at="zzzzzzzz"),
     durably.NotFoundError, ("zzzzzzzz", "history()")),
    ("fork of an unknown run", lambda c: durably.fork("no-such-run"),
     durably.NotFoundError, ("no-such-run",)),
    ("a run_id that is too long", lambda c: _ep.run(1, run_id="r" * 201),
     durably.DefinitionError, ("invalid run_id", "1 to 200", "for example run_id=")),
    ("DURABLY_DIR pointing at a file", _durably_dir_file,
     durably.StoreError, ("is a file", "a-file", "DURABLY_DIR")),
    ("a store from a future durably", _future_store,
     durably.StoreError, ("newer durably", "format 99", "future")),
    ("a journal from a future durably", _future_journal,
     durably.StoreError, ("newer durably", "format 99", "journal.sqlite3")),
    ("a store every user can write", _shared_dir,
     durably.StoreError, ("refusing the store", "shared", "0o777", "chmod 700")),
    ("a signing key that is not bytes", lambda c: durably.configure(key=12345),  # type: ignore[arg-type]
     durably.DefinitionError, ("bytes or str", "int")),
    ("a signing key too short", lambda c: durably.configure(key="short"),
     durably.DefinitionError, ("5 bytes", "at least 16")),
    ("a key file's path given as the key", _key_path_as_key,
     durably.DefinitionError, ("names a file", "keyfile", "DURABLY_KEY_FILE")),
    ("DURABLY_KEY_FILE naming no file",
     lambda c: _env_key(c, "DURABLY_KEY_FILE", str(c.tmp / "missing-key")),
     durably.StoreError, ("missing-key", "DURABLY_KEY_FILE")),
    ("DURABLY_KEY too short", lambda c: _env_key(c, "DURABLY_KEY", "abc"),
     durably.StoreError, ("DURABLY_KEY", "3 bytes")),
    ("DiskStore with a key of the wrong type", lambda c: durably.DiskStore(key=1.5),  # type: ignore[arg-type]
     durably.DefinitionError, ("DiskStore(key=...)", "float")),
    ("DiskStore with allow_shared not a bool",
     lambda c: durably.DiskStore(allow_shared="yes"),  # type: ignore[arg-type]
     durably.DefinitionError, ("allow_shared", "'yes'")),
    ("DiskStore with a size limit of True", lambda c: durably.DiskStore(size_limit=True),
     durably.DefinitionError, ("size_limit", "True", "'5GB'")),
    ("a Dask executor given an address instead of a client",
     lambda c: __import__("durably.executors").executors.Dask("tcp://host:8786"),
     durably.DefinitionError, ("Dask(client=...)", "tcp://host:8786", "Client(")),
    ("map() on an entrypoint", lambda c: _an_entrypoint().map([1, 2]),
     durably.DefinitionError, ("has no map()", "task.map(...)")),
    ("repair_run of an unknown run", lambda c: c.store.repair_run("no-such-run"),
     durably.NotFoundError, ("no-such-run",)),
    ("interrupt() outside a run", lambda c: durably.interrupt("approve?"),
     durably.NoActiveRunError, ("interrupt()", "outside a run")),
    ("idempotency_key() outside a run", lambda c: durably.idempotency_key(),
     durably.NoActiveRunError, ("idempotency_key()", "outside a run")),
    ("a task returning an open file", _open_file_result,
     durably.SerializationError, ("open file", "data.txt", "_opener")),
    ("an argument nested too deeply", _too_deep,
     durably.SerializationError, ("nested too deeply",)),
]


def snapshot(root: Path) -> dict[str, Any]:
    """Every file under ``root`` with its bytes (SQLite's shared-memory index, rewritten by
    readers, left out), and the row count of every table of every database."""
    files = {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
             if p.is_file() and not p.name.endswith("-shm")}
    counts = {}
    for name in files:
        if name.endswith((".sqlite3", ".db")):
            con = sqlite3.connect(f"file:{root / name}?mode=ro", uri=True)
            try:
                tables = [t for (t,) in con.execute(
                    "SELECT name FROM sqlite_master WHERE type='table'")]
                counts[name] = {t: con.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0]
                                for t in tables}
            except sqlite3.DatabaseError:
                counts[name] = {}
            finally:
                con.close()
    return {"files": files, "rows": counts}


@pytest.fixture
def ctx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Ctx]:
    store = durably.DiskStore(tmp_path / "store")
    durably.configure(store=store)
    _t(1)
    finished = _ep.run(1).id
    waiting = _ask.run(1).id
    yield Ctx(tmp_path, store, monkeypatch, finished, waiting)
    durably.configure()
    store.close()


@pytest.mark.parametrize(("what", "call", "error", "names"), CASES, ids=[c[0] for c in CASES])
def test_a_wrong_use_gets_a_clear_error_and_changes_no_file(
        ctx: Ctx, what: str, call: Callable[[Ctx], Any], error: type[BaseException],
        names: tuple[str, ...]) -> None:
    before = snapshot(ctx.tmp)
    runs_before = [(r.id, r.status, r.attempt) for r in durably.list_runs(store=ctx.store)]
    with pytest.raises(error) as info:
        call(ctx)
    message = str(info.value)
    # says how to fix it: "Fix: ...", or (run ids) the valid form with an example
    assert "Fix:" in message or "for example run_id=" in message, message
    for name in names:  # names the culprit
        assert name.format(finished=ctx.finished) in message, (name, message)
    assert [(r.id, r.status, r.attempt) for r in durably.list_runs(store=ctx.store)] == \
        runs_before
    after = snapshot(ctx.tmp)
    assert {k: v for k, v in after["rows"].items() if k in before["rows"]} == before["rows"]
    assert after["files"].keys() == before["files"].keys() | _created_by_the_case(what)
    for name, data in before["files"].items():
        assert after["files"][name] == data, f"{name} changed"


def _created_by_the_case(what: str) -> set[str]:
    """Files a case itself creates to set the wrong use up (not written by durably)."""
    return {
        "DURABLY_DIR pointing at a file": {"a-file"},
        "a store from a future durably": {"future/FORMAT"},
        "a journal from a future durably": {"future-journal/FORMAT",
                                            "future-journal/journal.sqlite3"},
        "a key file's path given as the key": {"keyfile"},
        "a task returning an open file": {"data.txt"},
    }.get(what, set())


def test_the_two_tables_hold_at_least_thirty_wrong_uses() -> None:
    from .test_errors import CASES as EARLIER

    assert len(EARLIER) + len(CASES) >= 30


def test_a_bound_method_is_refused_with_the_way_out(tmp_path: Path) -> None:
    """task(obj.method) left the object out of its arguments: a Python method then failed on
    every call (TypeError, too many positional arguments), and a built-in one ("abc".upper)
    served one object's result to another. Both are refused when decorated, with a fix that
    works; functions (len, Class.method, bytes.fromhex, random.random: one hidden object of
    its module) and a staticmethod over a bound method are still taken."""
    import random

    durably.configure(store=durably.DiskStore(tmp_path))

    @dataclasses.dataclass
    class Scaler:
        k: int

        def scale(self, x: int) -> int:
            return self.k * x

        @classmethod
        def unit(cls, x: int) -> int:
            return x

        @task
        def double(self, x: int) -> int:
            return 2 * self.k * x

    fixes = {
        "Scaler.scale": r"decorate the method in its class .*durably.task\(Class.method\)",
        "Scaler.unit": r"bound to the class .* @classmethod.*Scaler.unit.__func__",
        "Scaler.double": r"it is a task already",
        "str.upper": r"bound to an object \(str\)",
        "int.__add__": r"bound to an object \(int\)",
        "dict.get": r"bound to an object \(dict\)",
    }
    bound: list[Any] = [Scaler(3).scale, Scaler.unit, Scaler(3).double, "abc".upper, (5).__add__,
                        {}.get]
    for method, (name, fix) in zip(bound, fixes.items(), strict=True):
        with pytest.raises(durably.DefinitionError, match=rf"cannot take '[^']*{name}' .*{fix}"):
            task(method)
    # a Python method a module exposes as a function is bound all the same (random.choice:
    # its hidden object went in as its first argument, a TypeError on every call)
    with pytest.raises(durably.DefinitionError, match=r"'Random.choice' bound to an object "
                       r".*a function of your own"):
        task(random.choice)
    with pytest.raises(durably.DefinitionError,
                       match=r"entrypoint\(\) cannot take .*make an entrypoint of"):
        entrypoint(Scaler(3).scale)
    scale = task(Scaler.scale)  # the way out: the object is an argument
    assert (scale(Scaler(3), 2), scale(Scaler(5), 2)) == (6, 10)
    assert scale.cache_key(Scaler(3), 2) != scale.cache_key(Scaler(5), 2)
    assert task(Scaler.unit.__func__)(Scaler, 4) == 4  # the classmethod's way out
    assert task(len)("abc") == 3 and task(bytes.fromhex)("ff") == b"\xff"
    assert isinstance(task(random.random)(), float)
    assert task(staticmethod(Scaler(7).scale)).__wrapped__ is not None


def test_a_value_that_cannot_be_digested_is_named_where_it_sits(tmp_path: Path) -> None:
    """In a list of 10,000 rows, the error says which row and key hold the lock."""
    import threading

    durably.configure(store=durably.DiskStore(tmp_path / "store"))

    @task
    def total(rows: Any, n: int = 1) -> int:
        return len(rows)

    @entrypoint
    def job(rows: Any) -> int:
        return total(rows)

    rows: list[dict[str, Any]] = [{"id": i, "name": f"u{i}"} for i in range(10_000)]
    rows[7777]["lock"] = threading.Lock()
    looped: list[Any] = [1]
    looped.append(looped)
    looped.append({"a": [1, 2, (3, threading.Lock())]})
    for value, where in ((rows, " (at rows[7777]['lock'])"),
                         (looped, " (at rows[2]['a'][2][1])"),
                         (threading.Lock(), "")):
        with pytest.raises(durably.SerializationError) as got:
            total(value)
        assert str(got.value).startswith("task '") and (
            f".total': cannot digest argument 'rows'{where}: an object of type _thread.lock"
            in str(got.value))
        assert "ignore=('rows',)" in str(got.value)
    with pytest.raises(durably.SerializationError, match=r"^entrypoint '.*job': cannot digest "
                       r"argument 'rows' \(at rows\[7777\]\['lock'\]\)"):
        job(rows)
    with pytest.raises(durably.SerializationError, match=r"\(at rows\[7777\]\['lock'\]\)"):
        total.cache_key(rows)


@pytest.mark.parametrize("decorate", [
    lambda f: task(name="nul\x00name")(f),
    lambda f: task(version="1\x00")(f),
    lambda f: entrypoint(name="job\x00")(f),
])
def test_a_nul_in_a_name_or_version_is_refused_at_decoration(
        decorate: Callable[[Any], Any], store: Any) -> None:
    """Stores keep names as text, and PostgreSQL's text cannot hold a NUL: refused when the
    function is decorated, naming it, on every store (before any body runs; on PostgreSQL
    it failed at the step's write, after the body ran)."""
    ran: list[int] = []

    def body(x: int) -> int:
        ran.append(x)
        return x

    with pytest.raises(durably.DefinitionError, match="NUL character") as caught:
        decorate(body)
    assert "'\\x00'" in str(caught.value) and "Fix: remove it from" in str(caught.value)
    assert ("nul\\x00name" in str(caught.value) or "job\\x00" in str(caught.value)
            or "<locals>.body'" in str(caught.value))
    assert ran == [] and durably.list_runs() == []
