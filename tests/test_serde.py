"""Results to bytes and back: plain pickle first, cloudpickle for code, never an open file."""

from __future__ import annotations

import importlib
import io
import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import durably
from durably._keys.serde import dumps, loads
from tests.conftest import script_env, write_script


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    path = tmp_path / "data.txt"
    path.write_text("line 1\nline 2\n")
    return path


@pytest.mark.parametrize(
    ("mode", "type_name"),
    [("r", "TextIOWrapper"), ("rb", "BufferedReader"), ("a", "TextIOWrapper"),
     ("ab", "BufferedWriter"), ("r+b", "BufferedRandom")],
)
def test_an_open_file_is_refused(data_file: Path, mode: str, type_name: str) -> None:
    with open(data_file, mode) as f:
        with pytest.raises(durably.SerializationError, match=type_name) as info:
            dumps(f, what="the result of task 'load'")
        with pytest.raises(durably.SerializationError, match=type_name):
            dumps({"rows": [1, 2], "handle": [f]}, what="the result of task 'load'")
    message = str(info.value)
    assert "task 'load'" in message and "open file" in message and str(data_file) in message


def test_an_open_file_inside_code_pickled_by_value_is_refused(data_file: Path) -> None:
    with open(data_file) as f, pytest.raises(durably.SerializationError, match="TextIOWrapper"):
        dumps([lambda: f.read()], what="x")  # cloudpickle would store f's content


def test_code_still_pickles_by_value() -> None:
    class Local:
        def __init__(self, n: int) -> None:
            self.n = n

    def make_adder(n: int) -> Any:
        return lambda x: x + n

    restored = loads(dumps([make_adder(2), Local(3)], what="x"))
    assert restored[0](1) == 3 and restored[1].n == 3
    buffers = loads(dumps([io.BytesIO(b"ab"), io.StringIO("cd"), lambda: 1], what="x"))
    assert buffers[0].getvalue() == b"ab" and buffers[1].getvalue() == "cd"  # values in memory
    assert loads(dumps({"a": [1, 2.5]}, what="x")) == {"a": [1, 2.5]}
    assert loads(pickle.dumps(3)) == 3


def generator() -> Iterator[int]:
    yield 1


def test_what_cannot_be_pickled_raises_a_serialization_error() -> None:
    with pytest.raises(durably.SerializationError, match="generator"):
        dumps(generator(), what="the result of task 'g'")


def test_a_task_returning_an_open_file_fails_and_caches_nothing(
    tmp_path: Path, data_file: Path
) -> None:
    durably.configure(store=durably.DiskStore(tmp_path / "s"))
    calls: list[int] = []
    handles: list[Any] = []

    @durably.task
    def load(path: str) -> Any:
        calls.append(1)
        f = open(path)  # noqa: SIM115 - the bug under test: an open file as a result
        handles.append(f)
        return f

    try:
        for _ in range(2):
            with pytest.raises(durably.SerializationError, match="TextIOWrapper"):
                load(str(data_file))
        assert len(calls) == 2  # nothing was cached: the second call ran again
    finally:
        for f in handles:
            f.close()
        durably.configure()


def test_a_value_of_a_script_run_as_a_module_loads_where_it_is_imported(tmp_path: Path) -> None:
    """``python -m job`` names its tasks ``job:...``, like ``import job``, and they share cache
    entries and runs: a result of a class defined in the script was pickled as
    ``__main__.Result``, which a process that imports ``job`` does not have (the call, the
    entrypoint, even ``fresh=True`` raised SerializationError). It is pickled by the name the
    script is imported by, and loads back as the class of ``__main__`` in a later
    ``python -m job``, without importing the script a second time."""
    write_script(tmp_path / "job.py", """
        import dataclasses, sys
        import durably

        print("imported as", __name__, file=sys.stderr)

        @dataclasses.dataclass
        class Result:
            score: float
            scale: object = None

        def half(x):
            return x / 2

        @durably.task
        def evaluate(n):
            return Result(n / 10, half)

        @durably.entrypoint
        def main(n):
            return evaluate(n)

        if __name__ == "__main__":
            r = main(3)
            print(type(r) is Result, r.scale is half, r.score, main.run(3).status,
                  evaluate.cache_key(3))
        """)
    env = script_env(tmp_path / "store")

    def python(*args: str) -> list[str]:
        done = subprocess.run([sys.executable, *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stderr.count("imported as") == 1, done.stderr  # never imported twice
        return done.stdout.split()

    *started, key = python("-m", "job")
    assert started == ["True", "True", "0.3", "finished"]
    imported = python("-c", "import job; r = job.evaluate(3); s = job.main(3); "
                      "print(type(r) is job.Result, r == s, r.scale is job.half, "
                      "job.main.run(3, fresh=True).result == r, job.evaluate.cache_key(3))")
    assert imported == ["True", "True", "True", "True", key]  # (one cache entry: shared)
    assert python("-m", "job") == [*started, key]  # replayed


class _LoadsBroken:
    """Pickles, but does not load back while BROKEN is set (a __reduce__ that drops the
    argument __init__ needs: what a user's class got wrong)."""

    BROKEN = True

    def __init__(self, x: int) -> None:
        self.x = x

    def __reduce__(self) -> Any:
        return (_LoadsBroken, ()) if _LoadsBroken.BROKEN else (_LoadsBroken, (self.x,))


@durably.task
def _make(x: int) -> _LoadsBroken:
    _MADE.append(x)
    return _LoadsBroken(x)


_MADE: list[int] = []


@durably.entrypoint
def _uses(xs: list[int]) -> list[int]:
    return [r.x for r in _make.map(xs)] + [_make(xs[0]).x]


def test_a_cached_value_that_cannot_be_loaded_is_set_aside_and_computed_again(
        disk_store: durably.DiskStore, caplog: pytest.LogCaptureFixture) -> None:
    """A cache entry whose value does not load back is never worth a failure: it is set
    aside in damaged/ with a warning and the task executes again, outside a run, inside
    one (a new run, fresh=True, used to fail on it like the old one), and for a fan-out's
    duplicate item waiting for the first. A finished run's journaled value cannot be
    executed again: its error says what may be wrong, without blaming an edit only."""
    _MADE.clear()
    _LoadsBroken.BROKEN = True
    assert _make(7).x == 7 and _MADE == [7]  # stored; the live object returned
    with caplog.at_level("WARNING", logger="durably"):
        assert _make(7).x == 7  # not loadable: executed again
    assert _MADE == [7, 7]
    assert "cannot be loaded" in caplog.text and "set aside" in caplog.text
    kept = list((disk_store.path / "damaged").iterdir())
    assert len(kept) == 1
    caplog.clear()
    with caplog.at_level("WARNING", logger="durably"):
        assert _make(7).x == 7  # not cached again here: executed, without another warning
    assert _MADE == [7, 7, 7] and not caplog.text
    assert list((disk_store.path / "damaged").iterdir()) == kept  # (no copy per call)

    assert _uses([1, 1]) == [1, 1, 1]
    assert sorted(_MADE[3:]) == [1, 1, 1]  # each copy executed: none could be served
    # the finished run replays its journal, which cannot load: its tasks are cacheable,
    # so they are computed again (with a warning), never an error on every call
    with pytest.warns(UserWarning, match="journaled result of task .*_make.* cannot be"):
        assert _uses([1, 1]) == [1, 1, 1]
    run = _uses.run([1, 1], fresh=True)
    assert run.result == [1, 1, 1] and {s.status for s in run.steps} == {"ran"}
    _LoadsBroken.BROKEN = False  # fixed: stored and served from then on
    assert _uses.run([2, 2], fresh=True).result == [2, 2, 2]
    made = len(_MADE)
    assert _uses.run([2, 2], fresh=True).result == [2, 2, 2] and len(_MADE) == made


def test_a_package_run_as_a_program_is_never_imported_to_load_a_value(tmp_path: Path) -> None:
    """``python -m app`` runs ``app/__main__.py``: importing ``app.__main__`` would run the
    program again, so its classes are not pickled by that name (they are by ``job``'s
    under ``python -m job``), and :func:`~durably._keys.serde.main_global` refuses it."""
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__init__.py").write_text("")
    program = """
        import dataclasses
        from durably._keys.serde import dumps

        @dataclasses.dataclass
        class Res:
            x: int

        print(b"main_global" in dumps(Res(1), what="x"))
        """
    write_script(tmp_path / "app" / "__main__.py", program)
    write_script(tmp_path / "job.py", program)
    env = script_env(tmp_path / "store")
    for module, named in (("app", "False"), ("job", "True")):
        done = subprocess.run([sys.executable, "-m", module], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == [named]
    from durably._keys.serde import main_global

    with pytest.raises(ImportError, match="would run it"):
        main_global("app.__main__", "Res")


class _NeedsAPlugin:
    """Loads only where ``_durably_test_plugin`` can be imported (another process's
    environment: a package this one lacks)."""

    def __reduce__(self) -> Any:
        return (importlib.import_module, ("_durably_test_plugin",))


@durably.task
def _plugged(x: int) -> Any:
    _MADE.append(x)
    return _NeedsAPlugin()


def test_a_cached_value_this_process_cannot_import_is_a_miss_never_an_error(
        disk_store: durably.DiskStore) -> None:
    """A value that does not load here (a module this process cannot import) is never an
    error on every call: the call warns (task, key, reason), executes, and stores the new
    result in its place."""
    _MADE.clear()
    _plugged(1)
    with pytest.warns(UserWarning, match=r"_plugged.*cannot be loaded.*_durably_test_plugin"):
        assert isinstance(_plugged(1), _NeedsAPlugin)
    assert _MADE == [1, 1]
    assert disk_store.cache_get(_plugged.cache_key(1)) is not None
    assert not (disk_store.path / "damaged").exists()


def test_a_cached_value_whose_class_moved_is_recomputed_and_replaced(
        disk_store: durably.DiskStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The class of a cached result moved (renamed in its module): the old entry cannot
    load; the call warns, executes with today's code, and the next call is a hit again."""
    (tmp_path / "shapes_v1.py").write_text(
        "class Box:\n    def __init__(self, w):\n        self.w = w\n\n"
        "def make(w):\n    return Box(w)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import shapes_v1  # type: ignore[import-not-found]

    made: list[int] = []

    @durably.task(version="1")
    def box(w: int) -> Any:
        made.append(w)
        return shapes_v1.make(w)

    assert box(3).w == 3
    crate = type("Crate", (shapes_v1.Box,), {"__module__": "shapes_v1"})
    del shapes_v1.Box  # moved: its module no longer has it by that name
    shapes_v1.Crate = crate
    shapes_v1.make = crate
    with pytest.warns(UserWarning, match=r"task .*box.*cannot be loaded in this process"):
        fixed = box(3)
    assert made == [3, 3] and fixed.w == 3 and type(fixed).__name__ == "Crate"
    assert box(3).w == 3 and made == [3, 3]  # the new entry loads: a hit, no warning


class _Versioned:
    """A class whose pickled format changes (FORMAT 2 reads a key FORMAT 1 did not write)."""

    FORMAT = 1

    def __init__(self, value: int) -> None:
        self.value = value

    def __getstate__(self) -> dict[str, Any]:
        return {"v": self.value} if _Versioned.FORMAT == 1 else {"value": self.value}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.value = state["v"] if _Versioned.FORMAT == 1 else state["value"]


_VERSIONED: list[int] = []


@durably.task(version="1")
def _versioned(x: int) -> _Versioned:
    _VERSIONED.append(x)
    return _Versioned(x)


@durably.entrypoint
def _uses_versioned(x: int) -> int:
    return int(_versioned(x).value)


def test_a_class_whose_format_changed_is_recomputed_then_cached_again(
        disk_store: durably.DiskStore, caplog: pytest.LogCaptureFixture) -> None:
    """A cached value whose class changed its pickled format (KeyError in __setstate__)
    is set aside with the task named; the new result, which loads, is cached at once."""
    _VERSIONED.clear()
    _Versioned.FORMAT = 1
    try:
        assert _versioned(3).value == 3
        _Versioned.FORMAT = 2
        with caplog.at_level("WARNING", logger="durably"):
            assert _versioned(3).value == 3
        assert "_versioned" in caplog.text and "format" in caplog.text
        assert _versioned(3).value == 3
        assert _VERSIONED == [3, 3]  # the new result was cached: a hit
    finally:
        _Versioned.FORMAT = 1


def test_a_finished_run_whose_cacheable_result_no_longer_loads_computes_it_again(
        disk_store: durably.DiskStore) -> None:
    """Replaying a finished run whose journaled result of a cacheable task cannot be loaded
    now (its class changed its format) warns and serves it from the cache or executes it:
    a cacheable task is safe to compute again (a cache=False one still raises)."""
    _VERSIONED.clear()
    _Versioned.FORMAT = 1
    try:
        assert _uses_versioned(5) == 5
        _Versioned.FORMAT = 2
        with pytest.warns(UserWarning, match=r"journaled result of task .*_versioned.* "
                                             r"cannot be loaded"):
            assert _uses_versioned(5) == 5
        assert _VERSIONED == [5, 5]
    finally:
        _Versioned.FORMAT = 1
