"""Where code comes from: the user's own modules, or the standard library, installed packages
and durably itself.

Code fingerprints walk the user's own code deeply and record other code by name and by the
version of the installed distribution that provides it (``importlib.metadata``;
``__version__`` when no distribution is found). Modules the user's code imports inside a
function's body are resolved here, and imported when they are the user's own.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import sysconfig
import types
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import importlib.metadata

__all__ = ["PACKAGE_DIR", "is_user_module"]

#: the folder of the durably package (its code is never the user's)
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _system_prefixes() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    found = {
        os.path.realpath(paths[k]) + os.sep
        for k in ("stdlib", "platstdlib", "purelib", "platlib")
        if k in paths
    }
    found.add(os.path.realpath(PACKAGE_DIR) + os.sep)
    return tuple(sorted(found))


_PREFIXES = _system_prefixes()
_USER: dict[str, bool] = {}


def _is_user_path(path: str) -> bool:
    real = os.path.realpath(path)
    return not (
        real.startswith(_PREFIXES)
        or f"{os.sep}site-packages{os.sep}" in real
        or f"{os.sep}dist-packages{os.sep}" in real
    )


def is_user_module(name: str | None) -> bool:
    """Whether a module is the user's own code (fingerprinted deeply) rather than the
    standard library, an installed package or durably itself (recorded by name)."""
    if name is None:
        return True
    known = _USER.get(name)
    if known is not None:
        return known
    top = name.partition(".")[0]
    mod = sys.modules.get(name)
    if name == "__main__":
        result = True
    elif top in sys.stdlib_module_names and mod is None:
        return False  # not imported: decided by its file once it is (not cached)
    elif top == "durably" or (
        # a user's module named like a standard one (a local `code.py`) is the user's
        top in sys.stdlib_module_names and not _has_user_file(mod)
    ):
        result = False
    else:
        if mod is None:
            return True  # code without a module (exec'd): fingerprint it; not cached
        file = getattr(mod, "__file__", None)
        # a namespace package is the user's when one of its directories is
        paths = [file] if file else [p for p in getattr(mod, "__path__", None) or () if p]
        if paths:
            result = any(_is_user_path(p) for p in paths)
        else:  # no file and no path: a built-in, or a module made in memory (types.ModuleType)
            origin = getattr(getattr(mod, "__spec__", None), "origin", None)
            result = name not in sys.builtin_module_names and origin not in ("built-in",
                                                                              "frozen")
    _USER[name] = result
    return result


def _has_user_file(mod: types.ModuleType | None) -> bool:
    file = getattr(mod, "__file__", None)
    return isinstance(file, str) and os.path.isabs(file) and _is_user_path(file)


# -- versions of installed packages ----------------------------------------------------------
_VERSIONS: dict[str, str] = {}  # top-level module -> version text, once per process
_DISTRIBUTIONS: Mapping[str, list[str]] | None = None  # top-level module -> distributions


def _package_version(module: str) -> str:
    """The version of the installed distribution that provides ``module`` (all of them, named,
    when several share a namespace), else its top package's ``__version__``, else ``""``."""
    top = module.partition(".")[0]
    found = _VERSIONS.get(top)
    if found is None:
        found = _VERSIONS[top] = _find_version(top)
    return found


def _find_version(top: str) -> str:
    if top not in sys.stdlib_module_names:
        try:
            # the common case, cheap: a distribution named like the module, that provides it
            import importlib.metadata  # lazily: it costs ~13 ms at import time

            dist = importlib.metadata.distribution(top)
            if _provides(dist, top):
                return str(dist.version)
        except Exception:  # noqa: BLE001 - not found, or unreadable metadata: the full map
            pass
        versions = []
        for name in sorted(set(_distributions().get(top, ()))):
            try:
                versions.append(f"{name}=={importlib.metadata.version(name)}")
            except Exception:  # noqa: BLE001 - metadata gone or unreadable: skip it
                continue
        if len(versions) == 1:
            return versions[0].partition("==")[2]
        if versions:
            return ",".join(versions)
    return str(getattr(sys.modules.get(top), "__version__", ""))


def _provides(dist: importlib.metadata.Distribution, top: str) -> bool:
    declared = dist.read_text("top_level.txt")
    if declared is not None:
        return top in declared.split()
    for f in dist.files or ():
        if len(f.parts) > 1 and f.parts[0] == top:  # a package
            return True
        if len(f.parts) == 1 and f.parts[0].partition(".")[0] == top:  # a module
            return True
    return False


def _distributions() -> Mapping[str, list[str]]:
    global _DISTRIBUTIONS
    if _DISTRIBUTIONS is None:
        try:
            import importlib.metadata

            _DISTRIBUTIONS = importlib.metadata.packages_distributions()
        except Exception:  # noqa: BLE001 - broken metadata somewhere: versions fall back
            _DISTRIBUTIONS = {}
    return _DISTRIBUTIONS


# -- modules imported by the user's code ----------------------------------------------------
def _resolve_import(name: str, level: int, package: Any) -> str | None:
    if level == 0:
        return name
    if not isinstance(package, str) or not package:
        return None
    parts = package.split(".")
    if level - 1 >= len(parts):
        return None
    base = ".".join(parts[: len(parts) - level + 1])
    return f"{base}.{name}" if name else base


def _import_user_module(name: str) -> types.ModuleType | None:
    """The module ``name`` (imported now if it is the user's own code and not yet imported:
    its code is part of the fingerprint even when a cache hit skips the task's import)."""
    mod = sys.modules.get(name)
    top = name.partition(".")[0]
    if mod is not None or top in sys.stdlib_module_names:
        return mod
    try:
        # the top package first: finding `pkg.sub` imports `pkg`, which must be the user's
        if top in sys.modules:
            if not is_user_module(top):
                return None
        elif not _spec_is_user(importlib.util.find_spec(top)):
            return None
        if name != top and not _spec_is_user(importlib.util.find_spec(name)):
            return None
        return importlib.import_module(name)
    except Exception:  # noqa: BLE001 - not importable now: the task's own import will tell
        return None


def _spec_is_user(spec: Any) -> bool:
    if spec is None:
        return False
    origin = spec.origin
    if origin and os.path.isabs(origin):
        return _is_user_path(origin)
    paths = [p for p in spec.submodule_search_locations or () if p]  # a namespace package
    return any(_is_user_path(p) for p in paths)
