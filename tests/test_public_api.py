"""The public surface: what `import durably` offers, sorted and documented."""

from __future__ import annotations

import inspect

import durably

EXPECTED = [
    "ENCODING_VERSION", "DefinitionError", "DiskStore", "DurablyError", "Entrypoint", "Explanation",
    "File",
    "NotFoundError", "Run", "RunStateError", "SerializationError", "StepRecord", "Store",
    "StoreError", "Task", "configure", "digest", "entrypoint", "file", "get_run", "list_runs",
    "register_encoder", "task",
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
    assert public == {"exceptions", "testing"}
