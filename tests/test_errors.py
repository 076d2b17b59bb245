"""Wrong uses get a durably error (or the Python error a user expects) that says what was
wrong and how to fix it, and leave the store unchanged."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import entrypoint, task


def _gen() -> Any:
    yield 1


async def _agen() -> Any:
    yield 1


class _Klass:
    pass


@task
def _t(x: int) -> int:
    return x


@entrypoint
def _ep(x: int) -> int:
    return _t(x)


CASES: list[tuple[str, Callable[[], Any], type[BaseException], str]] = [
    ("task on a class", lambda: task(_Klass), durably.DefinitionError, "not a class"),
    ("task on a non-callable", lambda: task(42), durably.DefinitionError, "decorates functions"),
    ("task on a generator function", lambda: task(_gen), durably.DefinitionError,
     "return a list"),
    ("task on an async generator", lambda: task(_agen), durably.DefinitionError, "generator"),
    ("entrypoint on a class", lambda: entrypoint(_Klass), durably.DefinitionError, "class"),
    ("version is not a string", lambda: task(version=3)(lambda x: x),  # type: ignore[arg-type]
     durably.DefinitionError, 'version="1"'),
    ("empty version", lambda: task(version="")(lambda x: x), durably.DefinitionError,
     "non-empty string"),
    ("name is not a string", lambda: task(name=5)(lambda x: x),  # type: ignore[arg-type]
     durably.DefinitionError, "non-empty string"),
    ("ignore given as a bare string", lambda: task(ignore="x")(lambda x: x),  # type: ignore[arg-type]
     durably.DefinitionError, "ignore=('x',)"),
    ("ignore names an unknown argument", lambda: task(ignore=("y",))(lambda x: x),
     durably.DefinitionError, "not among its arguments ['x']"),
    ("cache is not a bool", lambda: task(cache="no")(lambda x: x),  # type: ignore[arg-type]
     durably.DefinitionError, "True or False"),
    ("option passed positionally", lambda: task("name"),  # type: ignore[call-overload]
     durably.DefinitionError, "@task(name='name')"),
    ("store that is not a store", lambda: entrypoint(store=3)(lambda: 1),  # type: ignore[arg-type]
     durably.DefinitionError, "needs a durably store"),
    ("configure with a non-store", lambda: durably.configure(store=object()),  # type: ignore[arg-type]
     durably.DefinitionError, "needs a durably store"),
    ("wrong arguments to a task", lambda: _t(1, 2), TypeError, "_t(): too many"),
    ("missing argument to an entrypoint", lambda: _ep(), TypeError, "missing a required"),
    ("invalid run_id", lambda: _ep.run(1, run_id="../etc"), durably.DefinitionError,
     "invalid run_id"),
    ("run_id not a string", lambda: _ep.run(1, run_id=7), durably.DefinitionError,  # type: ignore[arg-type]
     "invalid run_id"),
    ("fresh not a bool", lambda: _ep.run(1, fresh="yes"), durably.DefinitionError,  # type: ignore[arg-type]
     "fresh must be True or False"),
    ("unknown run id", lambda: durably.get_run("missing-run"), durably.NotFoundError,
     "durably.list_runs()"),
    ("undigestable argument", lambda: _t(threading.Lock()), durably.SerializationError,  # type: ignore[arg-type]
     "ignore=('x',)"),
    ("list_runs with a wrong filter", lambda: durably.list_runs(42), TypeError,
     "entrypoint or its name"),
    ("DiskStore with a bad size limit", lambda: durably.DiskStore(size_limit=-1),
     durably.DefinitionError,
     "positive number of bytes"),
    ("DiskStore with a bad sync mode", lambda: durably.DiskStore(synchronous="fast"), ValueError,
     "'normal' or 'full'"),
    ("list_runs given a task", lambda: durably.list_runs(_t), TypeError,
     "only entrypoints have runs"),
    ("DiskStore with a non-path", lambda: durably.DiskStore(123),  # type: ignore[arg-type]
     durably.DefinitionError, "takes a directory path"),
    ("undigestable entrypoint argument", lambda: _ep(threading.Lock()),  # type: ignore[arg-type]
     durably.SerializationError, "entrypoint '_ep': cannot digest argument 'x'"),
    ("durably.file of a missing file", lambda: durably.file("/nonexistent/x"),
     FileNotFoundError, "no such file"),
    ("durably.file of a non-path", lambda: durably.file(3),  # type: ignore[arg-type]
     durably.DefinitionError, "takes a path"),
    ("a map with no workers", lambda: _t.map([1], max_workers=0), durably.DefinitionError,
     "max_workers must be a positive int"),
    ("a map of a non-iterable", lambda: _t.map(5), durably.DefinitionError,  # type: ignore[arg-type]
     "takes iterables of inputs"),
]


def _says_how_to_fix(message: str) -> bool:
    """A "Fix: ..." sentence, or a message that states the valid form ("must be ...",
    "use ...", "takes ...") or is Python's own error for wrong arguments."""
    return any(phrase in message for phrase in (
        "Fix:", "must be", " use ", "takes ", "only entrypoints have runs",
        "missing a required argument", "too many positional arguments", "no such file",
        "not among its arguments", "needs a durably store"))


@pytest.mark.parametrize(("what", "call", "error", "message"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_gets_a_clear_error_and_changes_nothing(
        tmp_path: Path, what: str, call: Callable[[], Any], error: type[BaseException],
        message: str) -> None:
    from .test_bad_input import snapshot

    store = durably.DiskStore(tmp_path / "store")
    durably.configure(store=store)
    _t(1)  # the store exists and holds an entry
    _ep(1)
    before = snapshot(store.path)
    runs_before = [(r.id, r.status, r.attempt) for r in durably.list_runs()]
    with pytest.raises(error) as info:
        call()
    assert message in str(info.value), str(info.value)  # names the culprit
    assert _says_how_to_fix(str(info.value)), str(info.value)
    assert [(r.id, r.status, r.attempt) for r in durably.list_runs()] == runs_before
    assert snapshot(store.path) == before  # every file byte for byte, every table's rows


def test_durably_dir_pointing_at_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "not-a-dir"
    target.write_text("hello")
    monkeypatch.setenv("DURABLY_DIR", str(target))
    durably.configure()
    with pytest.raises(durably.StoreError, match="is a file") as info:
        _t(3)
    assert "DURABLY_DIR" in str(info.value)
    assert target.read_text() == "hello"


def test_every_durably_error_is_a_durably_error() -> None:
    for exc in (durably.DefinitionError, durably.SerializationError, durably.StoreError,
                durably.NotFoundError, durably.RunStateError):
        assert issubclass(exc, durably.DurablyError)
    assert issubclass(durably.NotFoundError, LookupError)
    assert issubclass(durably.DefinitionError, TypeError)
