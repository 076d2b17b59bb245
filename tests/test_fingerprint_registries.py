"""Code reached through registries: singledispatch, __init_subclass__ plugins, in-memory
modules."""

from __future__ import annotations

import sys
import textwrap
import types
from pathlib import Path

import pytest

from durably._keys.fingerprint import fingerprint_function

from .conftest import define, fp, load_source


def test_singledispatch_implementations_count() -> None:
    src = """
        import functools

        @functools.singledispatch
        def render(x):
            return "generic"

        @render.register
        def _(x: int):
            return f"int {x * $V}"

        def task(x):
            return render(x)
        """
    two = fp(define(src.replace("$V", "2"))["task"])
    three = fp(define(src.replace("$V", "3"))["task"])
    assert two != three
    assert two == fp(define(src.replace("$V", "2"))["task"])


def test_an_overload_registered_or_redefined_later_is_noticed() -> None:
    """An overload registered after the fingerprint was taken (a later notebook cell), or
    registered again with another body, makes the fingerprint invalid: no stale result."""
    ns = define("""
        import functools

        @functools.singledispatch
        def fmt(v):
            return f"generic {v}"

        def task(v):
            return fmt(v)
        """)
    first = fingerprint_function(ns["task"])
    assert first.valid()
    exec(textwrap.dedent("""
        @fmt.register(float)
        def _(v):
            return f"{v:.2f}"
        """), ns)
    assert not first.valid()
    second = fingerprint_function(ns["task"])
    assert second.digest != first.digest and second.valid()
    exec(textwrap.dedent("""
        @fmt.register(float)
        def _(v):
            return f"float {v}"
        """), ns)
    assert not second.valid()
    assert fingerprint_function(ns["task"]).digest not in (first.digest, second.digest)


def test_plugin_classes_in_a_registry_filled_by_init_subclass_count(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plugins = """
class Base:
    _registry = {}

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        Base._registry[cls.__name__.lower()] = cls

    @classmethod
    def create(cls, name):
        return cls._registry[name]()


class Double(Base):
    def apply(self, x):
        return x * FACTOR
"""
    fps = []
    for factor in ("2", "3", "2"):
        mod = load_source(tmp_path, monkeypatch, "durably_plugins", plugins.replace("FACTOR",
                                                                                   factor))
        ns = define("def task(x):\n    return plugins.Base.create('double').apply(x)\n",
                    {"__name__": "__main__", "plugins": mod})
        fps.append(fp(ns["task"]))
    assert fps[0] != fps[1] and fps[0] == fps[2]


def test_a_module_made_in_memory_is_user_code(monkeypatch: pytest.MonkeyPatch) -> None:
    from durably._keys.origin import is_user_module

    mod = types.ModuleType("durably_cfgmod")
    mod.K = 4  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "durably_cfgmod", mod)
    assert is_user_module("durably_cfgmod")
    assert not is_user_module("sys") and not is_user_module("builtins")
    ns = define("import durably_cfgmod\ndef task(x):\n    return durably_cfgmod.K * x\n")
    before = fp(ns["task"])
    mod.K = 11  # type: ignore[attr-defined]
    assert fp(define("import durably_cfgmod\ndef task(x):\n    return durably_cfgmod.K * x\n")
              ["task"]) != before


def test_standard_library_resources_do_not_warn() -> None:
    import warnings

    src = """
        import sqlite3, threading
        from concurrent.futures import ThreadPoolExecutor
        CONN = sqlite3.connect(":memory:")
        LOCAL = threading.local()
        POOL = ThreadPoolExecutor(1)
        def task(x):
            return (CONN, LOCAL, POOL, x)
        """
    ns = define(src)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            fp(ns["task"])
    finally:
        ns["POOL"].shutdown()
        ns["CONN"].close()
