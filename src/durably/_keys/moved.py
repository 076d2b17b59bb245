"""Names of an older release, found where they are now.

Release 0.1.0 had one flat package (``durably._retry``, ``durably._store``, ...); its
modules now live in subpackages. Pickles it wrote name its classes and functions by those
modules: a value in a store, a failure journaled, or a value a user pickled. Plain
``pickle.loads`` finds them: an old module that no longer exists (``durably._retry``)
imports as a module whose attributes are its names where they are now (a finder at the end
of ``sys.meta_path``, installed by ``import durably``), and an old module that is a package
now (``durably._store``) answers its old names from the package's ``__getattr__``."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import pkgutil
import sys
import types
from typing import Any

__all__ = ["MOVED_MODULES", "MOVED_NAMES", "install_old_names", "moved_name"]


#: durably's modules as release 0.1.0 named them, where they are now: a pickle it stored (a
#: failure, an interrupt, a task sent by value) names them
MOVED_MODULES = {
    "durably._blobs": "durably._store.disk.blobs",
    "durably._bytecode": "durably._keys.bytecode",
    "durably._checkpoint": "durably._store.disk.checkpoint",
    "durably._class_code": "durably._keys.class_code",
    "durably._cli_support": "durably._cli.support",
    "durably._config": "durably._runtime.config",
    "durably._conformance": "durably.testing._conformance",
    "durably._context": "durably._runtime.context",
    "durably._decorators": "durably._decorators.pickling",
    "durably._effects": "durably._runtime.effects",
    "durably._encoders": "durably._keys.encoders",
    "durably._executors": "durably._executors.fanout",
    "durably._explain": "durably._runtime.explain",
    "durably._failures": "durably._runtime.failures",
    "durably._files": "durably._keys.files",
    "durably._fingerprint": "durably._keys.fingerprint",
    "durably._graph_builder": "durably._graph.builder",
    "durably._graph_state": "durably._graph.state",
    "durably._graph_structure": "durably._graph.structure",
    "durably._hashing": "durably._keys.hashing",
    "durably._history": "durably._runtime.history",
    "durably._interrupt": "durably._runtime.interrupt",
    "durably._keep": "durably._runtime.keep",
    "durably._lease": "durably._store.lease",
    "durably._maintenance": "durably._store.disk.maintenance",
    "durably._origin": "durably._keys.origin",
    "durably._progress": "durably._executors.progress",
    "durably._records": "durably._store.records",
    "durably._repair": "durably._store.disk.repair",
    "durably._retry": "durably._runtime.retry",
    "durably._revalidate": "durably._keys.revalidate",
    "durably._run": "durably._runtime.run",
    "durably._runtime": "durably._runtime.call",
    "durably._seal": "durably._store.integrity",
    "durably._serde": "durably._keys.serde",
    "durably._state": "durably._keys.state",
    "durably._store": "durably._store.disk.store",
    "durably._threads": "durably._runtime.threads",
    "durably._tracer": "durably._trace.tracer",
    "durably._urls": "durably._store.urls",
    "durably._wal": "durably._store.disk.wal",
    "durably._worker": "durably._executors.worker",
}


#: names that moved to another module as well
MOVED_NAMES = {
    ("durably._records", name): "durably._store.disk.rows"
    for name in ("step_row", "step_from_row", "run_row", "key_row", "immediate")
} | {
    ("durably._worker", "Seceded"): "durably._runtime.retry",
    ("durably._worker", "_rebuild_task"): "durably._decorators.pickling",
    ("durably._worker", "_task_by_value"): "durably._decorators.pickling",
    ("durably.testing", "MemoryStore"): "durably._store.memory",
}


def _find_in_package(package: str, name: str) -> Any:
    """``name`` where a module of ``package`` defines it (a module split in two since the
    release that wrote the pickle), else None."""
    if not package.startswith("durably."):
        return None
    root = importlib.import_module(package)
    for info in pkgutil.iter_modules(getattr(root, "__path__", []), package + "."):
        module = importlib.import_module(info.name)
        found = vars(module).get(name)
        if found is not None and getattr(found, "__module__", None) == info.name:
            return found
    return None


def moved_name(old: str, name: str) -> Any:
    """What release 0.1.0's module ``old`` called ``name``, where it is now.

    Raises:
        AttributeError: ``old`` had no such name (or it is gone).
    """
    here = sys.modules.get(old)
    if name.startswith("__") or (  # (a submodule not imported yet: the import system's)
            here is not None and hasattr(here, "__path__")
            and any(info.name == name for info in pkgutil.iter_modules(here.__path__))):
        raise AttributeError(f"module {old!r} has no attribute {name!r}")
    target = MOVED_NAMES.get((old, name)) or MOVED_MODULES.get(old, old)
    module = importlib.import_module(target)
    found = vars(module).get(name)
    if found is None or isinstance(found, types.ModuleType):
        found = _find_in_package(target.rpartition(".")[0], name)
    if found is None:
        raise AttributeError(f"module {old!r} has no attribute {name!r}")
    return found


class _OldModule(types.ModuleType):
    """A module of release 0.1.0 that no longer exists: its attributes are its names, where
    they are now."""

    def __getattr__(self, name: str) -> Any:
        return moved_name(self.__name__, name)


class _OldModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module that no longer exists (``durably._retry``) as an
    :class:`_OldModule`; asked only after every other finder found nothing."""

    def find_spec(self, fullname: str, path: Any, target: Any = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname in MOVED_MODULES:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _OldModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def install_old_names() -> None:
    """Let the old modules that no longer exist import (``import durably`` does it once)."""
    if not any(isinstance(finder, _OldModules) for finder in sys.meta_path):
        sys.meta_path.append(_OldModules())
