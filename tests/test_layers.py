"""The package's layers, checked from its source: imports point down the layers (none up, so
no cycle between subpackages), only the disk backend imports its storage libraries, the
runtime talks to stores only through the protocol (no probing of a store's attributes), and
no module grows past about a thousand lines.

The layers, top to bottom (``docs/concepts/architecture.md`` says what each does)::

    durably, cli, testing, _ui     the package, the command, the store conformance suite,
                                   the dashboard (durably ui)
    stategraph, _graph             the StateGraph builder and compiled app
    _decorators                    @task, @entrypoint
    executors, _executors          fan-out over threads, processes, Dask; the worker side
    _runtime                       spec, context, call path, attempt, interrupts, retries
    _trace                         the tracer (events and journal -> run graph)
    render                         Mermaid, DOT, SVG, HTML
    store, _store                  the store protocol, its records, leases and integrity,
                                   the memory and disk backends
    _keys                          digests, encoders, code fingerprints, pickling
    exceptions

An import inside ``if TYPE_CHECKING:`` is not an import at run time and is not checked.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "durably"

LAYERS: list[set[str]] = [
    {"durably", "__main__", "cli", "_cli", "testing", "_ui"},
    {"stategraph", "_graph"},
    {"_decorators"},
    {"executors", "_executors"},
    {"_runtime"},
    {"_trace"},
    {"render"},
    {"store", "_store"},
    {"_keys"},
    {"exceptions"},
]
LAYER_OF = {unit: depth for depth, units in enumerate(LAYERS) for unit in units}
#: the storage libraries only one backend may import: the disk store's, the PostgreSQL store's
STORAGE_LIBRARIES = {"sqlite3": "durably._store.disk", "diskcache": "durably._store.disk",
                     "psycopg": "durably._store.postgres",
                     "psycopg_pool": "durably._store.postgres",
                     "fsspec": "durably._store.postgres", "s3fs": "durably._store.postgres"}
#: the layers that use stores only through :mod:`durably.store`'s protocol
STORE_USERS = {"_runtime", "_decorators", "_executors", "_graph", "stategraph", "_trace",
               "_ui"}
MAX_LINES = 1000


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _unit(module: str) -> str:
    """The layer unit of a module of durably: its subpackage or top-level module."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "durably"


def _imports(path: Path, module: str) -> list[tuple[str, int]]:
    """(imported module, line) for every import of ``path`` run at run time."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only.update(id(inner) for inner in ast.walk(node))
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            if target == "durably":  # from durably import store: the module; else the package
                for alias in node.names:
                    is_module = ((SRC / f"{alias.name}.py").exists()
                                 or (SRC / alias.name).is_dir())
                    found.append((f"durably.{alias.name}" if is_module else target,
                                  node.lineno))
            else:
                found.append((target, node.lineno))
    return found


MODULES = _modules()


def test_every_subpackage_and_module_has_a_layer() -> None:
    units = {_unit(name) for name in MODULES}
    assert units <= set(LAYER_OF), f"put these in LAYERS: {sorted(units - set(LAYER_OF))}"


def test_imports_point_down_the_layers() -> None:
    upward = []
    for name, path in MODULES.items():
        here = LAYER_OF[_unit(name)]
        for target, line in _imports(path, name):
            if target.split(".")[0] != "durably":
                continue
            there = LAYER_OF[_unit(target)]
            if there < here:
                upward.append(f"{path.relative_to(SRC.parent)}:{line} imports {target}")
    assert not upward, "imports that point up a layer:\n" + "\n".join(upward)


def _layer(module: str) -> str:
    """A module's layer, named by its units (a public module and the subpackage behind it,
    such as ``store`` and ``_store``, are one layer)."""
    return "/".join(sorted(LAYERS[LAYER_OF[_unit(module)]]))


def test_no_cycle_between_subpackages() -> None:
    edges: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        for target, _line in _imports(path, name):
            if target.split(".")[0] == "durably" and _layer(target) != _layer(name):
                edges.setdefault(_layer(name), set()).add(_layer(target))
    # a depth-first search from every unit: a cycle is a unit met again on its own path
    def visit(unit: str, path: list[str]) -> None:
        for after in sorted(edges.get(unit, ())):
            if after in path:
                cycle = [*path[path.index(after):], after]
                pytest.fail("a cycle between subpackages: " + " -> ".join(cycle))
            visit(after, [*path, after])

    for unit in sorted(edges):
        visit(unit, [unit])


def test_only_a_backend_imports_its_storage_libraries() -> None:
    found = [f"{path.relative_to(SRC.parent)}:{line} imports {target}"
             for name, path in MODULES.items()
             for target, line in _imports(path, name)
             if target.split(".")[0] in STORAGE_LIBRARIES
             and not name.startswith(STORAGE_LIBRARIES[target.split(".")[0]])]
    assert not found, "\n".join(found)


def test_the_runtime_does_not_probe_stores() -> None:
    """The runtime calls the protocol's methods; it never asks a store whether it has one."""
    probe = re.compile(r"\b(getattr|hasattr)\((self\.|ctx\.|call\.|run\.)?_?store\b")
    found = [f"{path.relative_to(SRC.parent)}:{number}: {line.strip()}"
             for name, path in MODULES.items() if _unit(name) in STORE_USERS
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if probe.search(line)]
    assert not found, "\n".join(found)


def test_no_module_is_over_a_thousand_lines() -> None:
    long = {str(path.relative_to(SRC.parent)): n for path in MODULES.values()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"split these modules by concept: {long}"


def test_the_rules_catch_what_they_are_for(tmp_path: Path) -> None:
    """The checks above find an upward import and a storage library where they are."""
    module = tmp_path / "durably" / "_keys" / "bad.py"
    module.parent.mkdir(parents=True)
    module.write_text("import sqlite3\n\ndef f():\n    from durably._runtime import run\n")
    found = _imports(module, "durably._keys.bad")
    assert ("sqlite3", 1) in found and ("durably._runtime", 4) in found
    assert LAYER_OF[_unit("durably._runtime")] < LAYER_OF[_unit("durably._keys.bad")]
    typing_only = tmp_path / "durably" / "_keys" / "ok.py"
    typing_only.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                           "    from durably._runtime import run\n")
    assert [t for t, _ in _imports(typing_only, "durably._keys.ok")] == ["typing"]


def test_every_module_is_durably_s_own_code() -> None:
    """Fingerprints and warnings tell durably's frames from the user's by the package's
    folder: every module of every subpackage is under it."""
    from durably._keys.origin import PACKAGE_DIR, _is_user_path

    assert Path(PACKAGE_DIR) == SRC
    user = [str(path) for path in MODULES.values() if _is_user_path(str(path))]
    assert not user, user
