"""Code fingerprints: what changes a task's cache key, what must not, and how edits made in a
notebook, by ``importlib.reload`` or by IPython's autoreload are noticed."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import durably
from durably._keys.fingerprint import fingerprint_function

from .conftest import define, fp, variant

# -- what changes the key ----------------------------------------------------------------------
# Each template defines `task`; `$V` is the edit. Every task takes one argument `x`.
CHANGES = {
    "body": """
        def task(x):
            return x + $V
        """,
    "default argument": """
        def task(x, k=$V, *, j=$V):
            return x + k + j
        """,
    "lambda inside the body": """
        def task(x):
            return sorted(x, key=lambda v: v * $V)
        """,
    "closure cell": """
        def make(k):
            def task(x):
                return x + k
            return task
        task = make($V)
        """,
    "helper": """
        def helper(x):
            return x * $V
        def task(x):
            return helper(x)
        """,
    "helper of a helper": """
        def base(x):
            return x - $V
        def helper(x):
            return base(x) * 2
        def task(x):
            return helper(x)
        """,
    "module-level constant": """
        SCALE = $V
        def task(x):
            return x * SCALE
        """,
    "class method": """
        class Model:
            def predict(self, x):
                return x * $V
        def task(x):
            return Model().predict(x)
        """,
    "property of a class": """
        class Model:
            @property
            def scale(self):
                return $V
        def task(x):
            return Model().scale * x
        """,
    "class of a dataclass instance": """
        import dataclasses
        @dataclasses.dataclass
        class Config:
            k: int = 1
            def scale(self, x):
                return x * $V
        CONFIG = Config()
        def task(x):
            return CONFIG.scale(x)
        """,
    "nested task": """
        import durably
        @durably.task
        def inner(x):
            return x + $V
        @durably.task
        def task(x):
            return inner(x)
        """,
    "functools.cache helper": """
        import functools
        @functools.cache
        def helper(x):
            return x + $V
        def task(x):
            return helper(x)
        """,
    "helper behind functools.partial": """
        import functools
        def helper(x, k):
            return x * k + $V
        scaled = functools.partial(helper, k=2)
        def task(x):
            return scaled(x)
        """,
    "table of handlers": """
        def double(x):
            return x * $V
        HANDLERS = {"double": double}
        def task(x):
            return HANDLERS["double"](x)
        """,
    "mutual recursion": """
        def task(x):
            return other(x - 1) if x else 0
        def other(x):
            return task(x - 1) if x else $V
        """,
    "handlers that call back": """
        def task(x):
            return HANDLERS[x % 2](x)
        def even(x):
            return task(x - 1) if x else 0
        def odd(x):
            return task(x - 1) + $V
        HANDLERS = {0: even, 1: odd}
        """,
}


@pytest.mark.parametrize("template", CHANGES.values(), ids=CHANGES.keys())
def test_an_edit_changes_the_fingerprint_and_rerunning_the_same_code_does_not(
    template: str,
) -> None:
    first, edited, again = (fp(define(variant(template, v))["task"]) for v in (1, 2, 1))
    assert first != edited
    assert first == again  # new function objects, same code: same digest


def test_closures_from_one_factory_never_share_a_key() -> None:
    def make(k: int) -> Any:
        def scaled(x: int) -> int:
            return x * k

        return durably.task(scaled)

    one, two, one_again = make(1), make(2), make(1)
    assert one.cache_key(3) != two.cache_key(3)
    assert one.cache_key(3) == one_again.cache_key(3)


def test_a_closure_cell_filled_after_the_fingerprint_is_noticed() -> None:
    def factory() -> Any:
        def task() -> int:
            return later()

        first = fingerprint_function(task)  # `later` is still an empty cell here

        def later() -> int:
            return 1

        return first

    assert not factory().valid()


# -- what must not change the key ------------------------------------------------------------
BASE = textwrap.dedent("""
    import json
    def helper(x):
        return x + 1
    def task(x):
        return json.dumps(helper(x))
    """)
UNCHANGED = {
    "unrelated function": (BASE + "def other():\n    return 1\n",
                           BASE + "def other():\n    return 2\n"),
    "unrelated constant": (BASE + "OTHER = 1\n", BASE + "OTHER = 2\n"),
    "moved down by blank lines and comments": (BASE, "\n\n# a comment\n\n\n" + BASE),
    # `json.dumps` names an attribute of json, not the module's own `dumps`
    "global named like an attribute the task reads": (
        BASE + "def dumps(x):\n    return 1\n", BASE + "def dumps(x):\n    return 2\n"
    ),
}


@pytest.mark.parametrize(("before", "after"), UNCHANGED.values(), ids=UNCHANGED.keys())
def test_unrelated_edits_keep_the_fingerprint(before: str, after: str) -> None:
    assert fp(define(before)["task"]) == fp(define(after)["task"])


def test_stdlib_and_installed_code_is_recorded_by_name_not_walked() -> None:
    src = """
        import json, os.path, wrapt
        from json import $V
        def task(x):
            return json.dumps(x) + $V(x) + os.path.join("a", "b") + str(wrapt.FunctionWrapper)
        """
    first = fingerprint_function(define(src.replace("$V", "dumps"))["task"])
    assert set(first.changed_by) == {"__main__.task"}  # json, os and wrapt were not walked
    assert fp(define(src.replace("$V", "dumps"))["task"]) == first.digest
    assert fp(define(src.replace("$V", "loads"))["task"]) != first.digest  # the name counts


# -- helpers in other user modules -----------------------------------------------------------
HELPERS = "def helper(x):\n    return x + $V\n"
IMPORT_STYLES: dict[str, dict[str, str]] = {
    "from-import": {
        "fpu_tasks.py": "from fpu_helpers import helper\ndef task(x):\n    return helper(x)\n",
        "fpu_helpers.py": HELPERS,
    },
    "module attribute": {
        "fpu_tasks.py": "import fpu_helpers as h\ndef task(x):\n    return h.helper(x)\n",
        "fpu_helpers.py": HELPERS,
    },
    "transitive": {
        "fpu_tasks.py": "from fpu_helpers import helper\ndef task(x):\n    return helper(x)\n",
        "fpu_helpers.py": "from fpu_deep import helper as deep\ndef helper(x):\n"
                          "    return deep(x)\n",
        "fpu_deep.py": HELPERS,
    },
    "package submodule": {
        "fpu_tasks.py": "import fpu_pkg\ndef task(x):\n    return fpu_pkg.sub.helper(x)\n",
        "fpu_pkg/__init__.py": "from . import sub\n",
        "fpu_pkg/sub.py": HELPERS,
    },
    "namespace package": {
        "fpu_tasks.py": "import fpu_ns.helpers\n"
                        "def task(x):\n    return fpu_ns.helpers.helper(x)\n",
        "fpu_ns/helpers.py": HELPERS,
    },
    "import inside the body": {
        "fpu_tasks.py": "def task(x):\n    from fpu_helpers import helper\n    return helper(x)\n",
        "fpu_helpers.py": HELPERS,
    },
    "relative import inside the body": {
        "fpu_pkg/__init__.py": "",
        "fpu_pkg/tasks.py": "def task(x):\n    from . import sub\n    return sub.helper(x)\n",
        "fpu_pkg/sub.py": HELPERS,
    },
}

Loader = Callable[[dict[str, str], str], types.ModuleType]


@pytest.fixture
def user_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Loader]:
    """Write modules into tmp_path (on sys.path) and import one of them afresh, as a new
    process would; no bytecode is cached, so an edit of the same size is always seen."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)

    def purge() -> None:
        for name in [n for n in sys.modules if n.startswith("fpu_")]:
            del sys.modules[name]

    def load(files: dict[str, str], main: str) -> types.ModuleType:
        for rel, src in files.items():
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / rel).write_text(src)
        purge()
        importlib.invalidate_caches()
        return importlib.import_module(main)

    yield load
    purge()


@pytest.mark.parametrize("files", IMPORT_STYLES.values(), ids=IMPORT_STYLES.keys())
def test_a_helper_in_another_user_module_is_part_of_the_fingerprint(
    user_modules: Loader, files: dict[str, str]
) -> None:
    main = "fpu_pkg.tasks" if "fpu_pkg/tasks.py" in files else "fpu_tasks"
    first, edited, again = (
        fp(user_modules({k: variant(s, v) for k, s in files.items()}, main).task)
        for v in (1, 2, 1)
    )
    assert first != edited
    assert first == again


def test_a_reloaded_helper_module_is_noticed_by_the_same_task(
    user_modules: Loader, tmp_path: Path
) -> None:
    tasks = user_modules({
        "fpu_helpers.py": variant(HELPERS, 1),
        "fpu_tasks.py": "import durably, fpu_helpers\n@durably.task\ndef task(x):\n"
                        "    return fpu_helpers.helper(x)\n",
    }, "fpu_tasks")
    key = tasks.task.cache_key(1)
    for value, same in ((2, False), (1, True)):
        (tmp_path / "fpu_helpers.py").write_text(variant(HELPERS, value))
        importlib.reload(sys.modules["fpu_helpers"])
        assert (tasks.task.cache_key(1) == key) is same


# -- across processes ------------------------------------------------------------------------
CROSS = """
import functools, json, os
SETTINGS = {"b": 2, "a": 1, "tags": frozenset({"x", "y", "z"}), "more": {"p", "q"}}
GETTERS = {"env": os.getenv, "dumps": json.dumps}
def helper(x):
    return sorted({x, "k", "l"} | set(SETTINGS["tags"]))
class Box:
    kinds = {"s", "t"}
    def get(self):
        return sorted(self.kinds)
def ping(n):
    return pong(n - 1) if n else 0
def pong(n):
    return ping(n - 1) if n else HANDLERS["ping"](0)
HANDLERS = {"ping": ping, "pong": pong}
@functools.cache
def cached(x):
    return x
def task(x):
    return helper(x), SETTINGS, GETTERS, Box().get(), ping(x), cached(x), json.dumps(x)
"""
PRINT = (
    "import sys; sys.path.insert(0, sys.argv[1]); import fpu_cross as m\n"
    "from durably._keys.fingerprint import fingerprint_function as f\n"
    "print(f(m.task).digest, f(m.ping).digest, f(m.pong).digest)\n"
)


def test_fingerprints_are_equal_across_processes(user_modules: Loader, tmp_path: Path) -> None:
    mod = user_modules({"fpu_cross.py": CROSS}, "fpu_cross")
    here = " ".join(fp(f) for f in (mod.task, mod.ping, mod.pong))
    outputs = []
    for seed, env_value in (("1", "a"), ("2", "b"), ("3", "")):
        env = {**os.environ, "PYTHONHASHSEED": seed, "FPU_SOME_SETTING": env_value}
        proc = subprocess.run(
            [sys.executable, "-B", "-c", PRINT, str(tmp_path)],
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )
        assert proc.returncode == 0, proc.stderr
        outputs.append(proc.stdout.strip())
    assert outputs == [here] * 3
    assert len(set(here.split())) == 3  # ping and pong are fingerprinted from each end


def test_handlers_that_call_back_give_one_digest_at_any_stack_depth() -> None:
    src = variant(CHANGES["handlers that call back"], 1)

    def at_depth(n: int) -> str:
        return at_depth(n - 1) if n else fp(define(src)["task"])

    assert at_depth(0) == at_depth(150) == at_depth(300)


# -- notebooks: redefinition in __main__ -----------------------------------------------------
HELPER_1 = "def helper(x):\n    return x + 1\n"
HELPER_2 = "def helper(x):\n    return x + 2\n"
TASK = "import durably\n@durably.task\ndef task(x):\n    return helper(x)\n"


def test_a_redefined_helper_is_noticed_and_the_original_code_gets_its_key_back() -> None:
    ns = define(HELPER_1 + TASK)
    task = ns["task"]
    key = task.cache_key(1)
    first = fingerprint_function(task)
    assert first.valid()
    define(HELPER_2, ns)
    assert not first.valid()
    assert task.cache_key(1) != key
    assert task.spec.code_version() != first.digest
    define(HELPER_1, ns)
    assert task.cache_key(1) == key
    define(HELPER_1 + TASK, ns)  # the whole cell again: new objects, same code
    assert ns["task"] is not task
    assert ns["task"].cache_key(1) == key


def test_a_helper_defined_after_the_first_key_is_noticed() -> None:
    ns = define(TASK)  # the task's cell ran before the helper's
    without = ns["task"].cache_key(1)
    define(HELPER_1, ns)
    with_1 = ns["task"].cache_key(1)
    define(HELPER_2, ns)
    assert len({without, with_1, ns["task"].cache_key(1)}) == 3


def test_a_shadowed_builtin_is_noticed() -> None:
    ns = define("def task(x):\n    return len(x)\n")
    first = fingerprint_function(ns["task"])
    define("def len(x):\n    return 0\n", ns)
    assert not first.valid()
    assert fp(ns["task"]) != first.digest


def test_autoreload_replacing_code_in_place_is_noticed() -> None:
    ns = define(HELPER_1 + TASK)
    key = ns["task"].cache_key(1)
    first = fingerprint_function(ns["task"])
    helper = ns["helper"]
    helper.__code__ = define(HELPER_2)["helper"].__code__  # what IPython's autoreload does
    assert ns["helper"] is helper
    assert not first.valid()
    assert ns["task"].cache_key(1) != key


def test_replacing_a_method_on_the_class_is_noticed() -> None:
    ns = define(variant(CHANGES["class method"], 1))
    first = fingerprint_function(ns["task"])
    ns["Model"].predict = define(variant(CHANGES["class method"], 2))["Model"].predict
    assert not first.valid()
    assert fp(ns["task"]) != first.digest


# -- end to end through the store ------------------------------------------------------------
def test_the_cache_follows_helper_edits(tmp_path: Path) -> None:
    durably.configure(store=durably.DiskStore(tmp_path / "s"))
    try:
        calls: list[int] = []
        # `record` is a bound builtin method: recorded by name, so the growing list it
        # appends to does not take part in the fingerprint
        ns = define(HELPER_1 + TASK.replace("    return", "    record(x)\n    return"),
                    {"__name__": "__main__", "record": calls.append})
        task = ns["task"]
        assert (task(1), task(1)) == (2, 2)
        assert calls == [1]  # the second call was a hit
        define(HELPER_2, ns)
        assert task(1) == 3
        assert calls == [1, 1]  # the edit made it execute again
        define(HELPER_1, ns)
        assert task(1) == 2
        assert calls == [1, 1]  # back to the original code: a hit again
        ns["helper"].__code__ = define(variant(HELPERS, 5))["helper"].__code__
        assert task(1) == 6
        assert calls == [1, 1, 1]  # autoreload-style edit: executed again
    finally:
        durably.configure()
