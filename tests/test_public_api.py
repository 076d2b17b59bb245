"""The public surface: what `import durably` offers, sorted and documented."""

from __future__ import annotations

import inspect

import durably

EXPECTED = [
    "ENCODING_VERSION", "END", "START", "Checkpoint", "Command", "CorruptJournalError",
    "DefinitionError", "DiskStore", "DurablyError", "Entrypoint", "Event", "Explanation", "File",
    "Final",
    "Interrupt", "NoActiveRunError", "NondeterminismError", "NotFoundError", "PostgresStore",
    "Recovered", "Removed", "RenderError",
    "ReplayedError", "Retry", "Run", "RunBusyError", "RunCancelledError", "RunGraph",
    "RunInterrupted", "RunStateError", "RunTimeoutError", "Send",
    "SerializationError",
    "StateGraph", "StepRecord", "Store",
    "StoreError", "Task", "TaskTimeoutError", "asleep", "cancel_run", "cancelled", "configure",
    "delete_runs", "digest",
    "entrypoint", "file", "fork",
    "get_run", "get_writer", "idempotency_key", "interrupt", "list_runs", "open_store",
    "prune", "recover", "register_encoder",
    "sleep",
    "task",
]


def test_all_is_sorted_and_exact() -> None:
    assert durably.__all__ == EXPECTED
    assert sorted(durably.__all__, key=lambda n: (not n.isupper(), n)) == durably.__all__


def test_every_public_name_exists_and_is_documented() -> None:
    for name in durably.__all__:
        obj = getattr(durably, name)
        if callable(obj):
            assert inspect.getdoc(obj), f"durably.{name} has no docstring"


def test_implementation_modules_are_private() -> None:
    import pkgutil

    public = {m.name for m in pkgutil.iter_modules(durably.__path__) if not m.name.startswith("_")}
    assert public == {"cli", "exceptions", "executors", "render", "stategraph", "store",
                      "testing"}


def test_public_errors_are_named_where_they_are_documented() -> None:
    """A traceback names an error by the module a user imports it from."""
    import pickle

    from durably import exceptions, stategraph

    for module in (exceptions, stategraph):
        for name in module.__all__:
            obj = getattr(module, name)
            if isinstance(obj, type) and issubclass(obj, Exception):
                assert obj.__module__ == module.__name__, name
                assert pickle.loads(pickle.dumps(obj)) is obj


def test_heavy_parts_are_imported_on_first_use() -> None:
    import subprocess
    import sys

    code = ("import sys, durably; print(sorted(m for m in ('durably.stategraph', "
            "'durably._executors.fanout', 'durably._executors.pools', 'durably.cli', "
            "'durably.render') if m in sys.modules)); "
            "durably.StateGraph; durably.executors.Dask; print('durably.stategraph' in "
            "sys.modules, 'durably._executors.pools' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split("\n")
    assert out[:2] == ["[]", "True True"]


def test_import_durably_does_not_import_asyncio_itself() -> None:
    """asyncio is a sixth of `import durably` with wrapt 1.x, which does not import it (2.2+ does;
    a later one may not): durably's own modules import it on first use, from a running loop."""
    import subprocess
    import sys

    code = '''
import sys

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] != "asyncio":
            return None
        frame = sys._getframe(1)
        while frame is not None and frame.f_globals.get("__name__", "").startswith(
                ("importlib", "_frozen_importlib")):
            frame = frame.f_back
        importer = "" if frame is None else frame.f_globals.get("__name__", "")
        if importer.startswith("durably"):
            raise ImportError(f"{importer} imports asyncio")
        return None

sys.meta_path.insert(0, Refuse())
import durably
from durably._runtime.attempt import is_cancelled
print(is_cancelled(ValueError()), is_cancelled(None))
import asyncio
print(is_cancelled(asyncio.CancelledError()), is_cancelled(KeyboardInterrupt()))
'''
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["False False", "True False"]
