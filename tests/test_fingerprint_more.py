"""Code fingerprints: record classes of libraries (pydantic, attrs, dataclasses), values that
cannot be digested, try blocks, user modules named like standard ones, state by nature."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
import types
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from durably._keys import origin as _origin
from durably._keys.fingerprint import fingerprint_function

Loader = Callable[[dict[str, str], str], types.ModuleType]


def fp(func: Any) -> str:
    return fingerprint_function(func).digest


def define(src: str) -> dict[str, Any]:
    ns: dict[str, Any] = {"__name__": "__main__"}
    exec(textwrap.dedent(src), ns)
    return ns


@pytest.fixture
def user_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Loader]:
    """Write modules into tmp_path (on sys.path) and import one of them afresh."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    names: set[str] = set()

    def purge() -> None:
        for name in [n for n in sys.modules if n.startswith("fpm_") or n in names]:
            del sys.modules[name]
            _origin._USER.pop(name, None)

    def load(files: dict[str, str], main: str) -> types.ModuleType:
        for rel, src in files.items():
            (tmp_path / rel).write_text(textwrap.dedent(src))
            names.add(rel.removesuffix(".py"))
        purge()
        importlib.invalidate_caches()
        return importlib.import_module(main)

    yield load
    purge()


# -- equal in every process ------------------------------------------------------------------
RECORDS = """
import dataclasses, enum, itertools, os
from os import environ
import attrs, pydantic

class Settings(pydantic.BaseModel):
    n: int = pydantic.Field(1, gt=0)
    tags: list = pydantic.Field(default_factory=lambda: ["a"])

    @pydantic.field_validator("n")
    @classmethod
    def positive(cls, v):
        return v

SETTINGS = Settings()

@dataclasses.dataclass
class Point:
    x: int = 1

class Color(enum.Enum):
    RED = 1

@attrs.frozen
class Frozen:
    x: int = 1

@attrs.define(hash=True)
class Hashed:
    x: int = 1

class Counter:
    _ids = itertools.count()

def t_global_model(x):
    return SETTINGS.n + x

def t_model_class(x):
    return Settings(n=x)

def t_dataclass(x):
    return Point(x)

def t_enum(x):
    return Color.RED

def t_frozen(x):
    return Frozen(x), Hashed(x)

def t_environ(x):
    return environ.get("HOME"), os.environ.get("HOME")

def t_counter(x):
    return next(Counter._ids)
"""
TASKS = ("t_global_model", "t_model_class", "t_dataclass", "t_enum", "t_frozen",
         "t_environ", "t_counter")
PRINT = (
    "import sys, os; sys.path.insert(0, sys.argv[1]); os.chdir(sys.argv[2]); "
    "import fpm_records as m\n"
    "from durably._keys.fingerprint import fingerprint_function as f\n"
    "for _ in range(int(sys.argv[3])): m.t_counter(0)\n"
    f"print(' '.join(f(getattr(m, n)).digest for n in {TASKS!r}))\n"
)


def test_record_classes_give_equal_fingerprints_across_processes(
    user_modules: Loader, tmp_path: Path
) -> None:
    mod = user_modules({"fpm_records.py": RECORDS}, "fpm_records")
    here = " ".join(fp(getattr(mod, n)) for n in TASKS)
    outputs = []
    for seed, cwd, calls in (("1", tmp_path, "0"), ("2", Path.home(), "3"), ("3", "/", "1")):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        proc = subprocess.run(
            [sys.executable, "-B", "-c", PRINT, str(tmp_path), str(cwd), calls],
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )
        assert proc.returncode == 0, proc.stderr
        outputs.append(proc.stdout.strip())
    assert outputs == [here] * 3


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("n: int = 1", "n: int = 2"),
        ("n: int = 1", "n: float = 1"),
        ("n: int = 1", "n: int = pydantic.Field(1, gt=0)"),
        ("tags: list = pydantic.Field(default_factory=lambda: [1])",
         "tags: list = pydantic.Field(default_factory=lambda: [2])"),
    ],
)
def test_a_pydantic_field_change_changes_the_fingerprint(before: str, after: str) -> None:
    src = """
        import pydantic
        class Settings(pydantic.BaseModel):
            $F
        def task(x):
            return Settings()
        """
    assert fp(define(src.replace("$F", before))["task"]) == fp(
        define(src.replace("$F", before))["task"])
    assert fp(define(src.replace("$F", before))["task"]) != fp(
        define(src.replace("$F", after))["task"])


@pytest.mark.parametrize("decorator", ["@dataclasses.dataclass", "@attrs.frozen", "@attrs.define"])
@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("x: int = 1", "x: int = 2"),
        ("x: list = FACTORY(lambda: [1])", "x: list = FACTORY(lambda: [2])"),
    ],
)
def test_a_record_field_change_changes_the_fingerprint(
    decorator: str, before: str, after: str
) -> None:
    factory = ("dataclasses.field(default_factory=" if "dataclass" in decorator
               else "attrs.field(factory=")
    src = f"""
        import dataclasses, attrs
        {decorator}
        class Rec:
            $F
        def task(x):
            return Rec()
        """

    def digest(field: str) -> str:
        return fp(define(src.replace("$F", field.replace("FACTORY(", factory)))["task"])

    assert digest(before) == digest(before)
    assert digest(before) != digest(after)


def test_generated_methods_are_recorded_by_name() -> None:
    src = """
        import attrs
        @attrs.frozen
        class Frozen:
            x: int = 1
            def double(self):
                return self.x * $V
        def task(x):
            return Frozen(x).double()
        """
    assert fp(define(src.replace("$V", "2"))["task"]) == fp(define(src.replace("$V", "2"))["task"])
    assert fp(define(src.replace("$V", "2"))["task"]) != fp(define(src.replace("$V", "3"))["task"])


# -- values that cannot be digested ----------------------------------------------------------
def test_a_value_that_cannot_be_digested_nor_pickled_is_named_in_a_warning() -> None:
    src = """
        import threading
        LOCKED = {"n": 1, "lock": threading.Lock()}
        def fpm_opaque_task(x):
            return LOCKED["n"] + x
        """
    task = define(src)["fpm_opaque_task"]
    with pytest.warns(UserWarning, match=r"__main__\.LOCKED.*version=") as record:
        fp(task)
    assert len(record) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fp(define(src)["fpm_opaque_task"])  # once per function and name


def test_a_value_that_only_pickles_is_digested_by_its_pickle(user_modules: Loader) -> None:
    src = """
        class OnlyPickles:
            def __init__(self, n):
                self.n = n
            def __reduce_ex__(self, protocol):
                if protocol < 5:
                    raise TypeError("protocol 5 only")
                return (OnlyPickles, (self.n,))
        VALUE = OnlyPickles($V)
        def task(x):
            return VALUE.n + x
        """

    def digest(v: int) -> str:
        return fp(user_modules({"fpm_pickles.py": src.replace("$V", str(v))}, "fpm_pickles").task)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert digest(1) == digest(1)
        assert digest(1) != digest(2)


def test_state_by_nature_is_recorded_by_type_without_a_warning() -> None:
    src = """
        import itertools, threading
        LOCK = threading.Lock()
        IDS = itertools.count()
        def gen():
            yield 1
        GEN = gen()
        def task(x):
            with LOCK:
                return next(IDS), next(GEN, None), x
        """
    ns = define(src)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = fp(ns["task"])
        ns["task"](1)
        assert fp(ns["task"]) == first


# -- try blocks ------------------------------------------------------------------------------
def test_moving_a_statement_out_of_a_try_block_changes_the_fingerprint() -> None:
    inside = """
        def task(x):
            try:
                a = g(x)
                b = h(a)
            except ValueError:
                b = 0
            return b
        """
    outside = """
        def task(x):
            try:
                a = g(x)
            except ValueError:
                b = 0
            else:
                b = h(a)
            return b
        """
    one, two = define(inside)["task"], define(outside)["task"]
    assert one.__code__.co_code == two.__code__.co_code  # only the exception table differs
    assert fp(one) != fp(two)


# -- a user module named like a standard one -------------------------------------------------
def test_a_user_module_named_like_a_standard_one_is_user_code(user_modules: Loader) -> None:
    assert "tabnanny" not in sys.modules  # the standard module of that name is not imported
    helper = "def helper(x):\n    return x + $V\n"
    files = {"fpm_stdname.py": "import tabnanny\ndef task(x):\n    return tabnanny.helper(x)\n"}
    mod = user_modules({**files, "tabnanny.py": helper.replace("$V", "1")}, "fpm_stdname")
    assert _origin.is_user_module("tabnanny")
    one = fp(mod.task)
    mod = user_modules({**files, "tabnanny.py": helper.replace("$V", "2")}, "fpm_stdname")
    assert fp(mod.task) != one
    assert not _origin.is_user_module("json")


def test_the_methods_of_a_user_metaclass_count_for_its_classes() -> None:
    """A class's code covers its metaclass's when that is the user's (``type(s).tag()``
    calls it): editing the metaclass changes the fingerprint of code using the class, and
    of the class given as a value. A library's metaclass (ABCMeta) counts by name only."""
    src = """
        import abc

        class Meta(type):
            def tag(cls):
                return "m$V"

        class WithMeta(metaclass=Meta):
            def __init__(self):
                self.x = 1

        class Abstract(abc.ABC):
            pass

        def task(s):
            return type(s).tag()

        def uses_class():
            return WithMeta.tag()
        """
    one, two = (define(src.replace("$V", v)) for v in ("1", "2"))
    assert fp(one["task"]) == fp(two["task"])  # (s is an argument: not the task's code)
    assert fp(one["uses_class"]) != fp(two["uses_class"])
    from durably import digest

    assert digest(one["WithMeta"]) != digest(two["WithMeta"])
    assert digest(one["WithMeta"]()) != digest(two["WithMeta"]())  # an instance too
    assert digest(one["Abstract"]) == digest(define(src.replace("$V", "3"))["Abstract"])
    hooked = src.replace("                self.x = 1\n", "                self.x = 1\n\n"
                         "            def __durably_digest__(self):\n"
                         "                return self.x\n")
    assert "__durably_digest__" in hooked
    a, b = (define(hooked.replace("$V", v)) for v in ("1", "2"))
    assert digest(a["WithMeta"]()) != digest(b["WithMeta"]())  # a hooked class: its code too
