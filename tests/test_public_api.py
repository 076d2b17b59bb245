"""The public surface: what `import durably` offers, sorted and documented."""

from __future__ import annotations

import inspect

import durably

EXPECTED = [
    "ENCODING_VERSION", "END", "START", "Checkpoint", "CorruptJournalError", "DefinitionError",
    "DiskStore", "DurablyError", "Entrypoint", "Event", "Explanation", "File", "Interrupt",
    "NoActiveRunError", "NotFoundError", "RenderError", "Retry", "Run", "RunGraph",
    "RunInterrupted", "RunStateError", "SerializationError", "StateGraph", "StepRecord", "Store",
    "StoreError", "Task", "TaskTimeoutError", "configure", "digest", "entrypoint", "file", "fork",
    "get_run", "get_writer", "idempotency_key", "interrupt", "list_runs", "register_encoder",
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
    assert public == {"cli", "exceptions", "executors", "render", "stategraph", "testing"}


def test_heavy_parts_are_imported_on_first_use() -> None:
    import subprocess
    import sys

    code = ("import sys, durably; print(sorted(m for m in ('durably.stategraph', "
            "'durably._executors', 'durably.cli', 'durably.render') if m in sys.modules)); "
            "durably.StateGraph; durably.executors.Dask; print('durably.stategraph' in "
            "sys.modules, 'durably._executors' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split("\n")
    assert out[:2] == ["[]", "True True"]
