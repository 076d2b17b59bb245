"""Values in code fingerprints: configuration is followed into its contents, state is not.

A value the task reads is *configuration* unless the walked code itself changes it: changing
configuration in place gives the next call a fingerprint of the current contents; *state*
(memos, registries, counters, lazily created clients) never enters the fingerprint, so a key
does not depend on what ran before it in the process. Also: package versions, docstrings.
"""

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

from .conftest import define, fp, script_env, variant, write_script

# -- configuration: changed in place, noticed ------------------------------------------------
# Each case: a source defining `task` with the value `$V`, and a statement that changes that
# value in place to `$V` (run in the same namespace).
CONFIGURATION = {
    "dict item": (
        """
        WEIGHTS = {"a": $V}
        def task(x):
            return x * WEIGHTS["a"]
        """,
        'WEIGHTS["a"] = $V',
    ),
    "nested dict item": (
        """
        CONFIG = {"nested": {"x": $V}, "other": [1, 2]}
        def task(x):
            return x * CONFIG["nested"]["x"]
        """,
        'CONFIG["nested"]["x"] = $V',
    ),
    "attribute of a user object": (
        """
        class Settings:
            def __init__(self):
                self.rate = 1
        SETTINGS = Settings()
        SETTINGS.rate = $V
        def task(x):
            return x * SETTINGS.rate
        """,
        "SETTINGS.rate = $V",
    ),
    "field of a dataclass": (
        """
        import dataclasses
        @dataclasses.dataclass
        class Config:
            rate: int
        CONFIG = Config($V)
        def task(x):
            return x * CONFIG.rate
        """,
        "CONFIG.rate = $V",
    ),
    "list in a closure": (
        """
        def make():
            factors = [$V, 7]
            def task(x):
                return x * factors[0]
            return task
        task = make()
        """,
        "task.__closure__[0].cell_contents[0] = $V",
    ),
    "set": (
        """
        TAGS = {"t", $V}
        def task(x):
            return x in TAGS
        """,
        'TAGS.clear(); TAGS.update({"t", $V})',
    ),
    "list inside a tuple": (
        """
        PAIR = ([$V], "fixed")
        def task(x):
            return x * PAIR[0][0]
        """,
        "PAIR[0][0] = $V",
    ),
    "constant of a helper": (
        """
        WEIGHTS = {"a": $V}
        def helper(x):
            return x * WEIGHTS["a"]
        def task(x):
            return helper(x) + 1
        """,
        'WEIGHTS["a"] = $V',
    ),
    "class attribute": (
        """
        class Model:
            weights = {"a": $V}
        def task(x):
            return x * Model.weights["a"]
        """,
        'Model.weights["a"] = $V',
    ),
    "default argument": (
        """
        def task(x, opts={"k": $V}):
            return x * opts["k"]
        """,
        'task.__defaults__[0]["k"] = $V',
    ),
    "instance of a bound method": (
        """
        class Scaler:
            def __init__(self):
                self.k = $V
            def scale(self, x):
                return x * self.k
        scale = Scaler().scale
        def task(x):
            return scale(x)
        """,
        "scale.__self__.k = $V",
    ),
    "small numpy array": (
        """
        import numpy as np
        W = np.array([$V, 2.0])
        def task(x):
            return W @ x
        """,
        "W[0] = $V",
    ),
    "dict holding a function": (
        """
        def double(x):
            return 2 * x
        STEPS = {"scale": double, "offset": $V}
        def task(x):
            return STEPS["scale"](x) + STEPS["offset"]
        """,
        'STEPS["offset"] = $V',
    ),
}


@pytest.mark.parametrize(("template", "change"), CONFIGURATION.values(),
                         ids=CONFIGURATION.keys())
def test_configuration_changed_in_place_is_noticed(template: str, change: str) -> None:
    ns = define(variant(template, 1.5))
    first = fingerprint_function(ns["task"])
    assert first.valid()
    exec(variant(change, 2.5), ns)
    assert not first.valid()
    changed = fp(ns["task"])
    assert changed != first.digest
    exec(variant(change, 1.5), ns)  # back to the original contents: the original key
    assert fp(ns["task"]) == first.digest


@pytest.mark.parametrize("name", ["dict item", "nested dict item", "list in a closure",
                                  "class attribute", "constant of a helper"])
def test_a_changed_value_gives_the_key_of_a_fresh_definition_with_it(name: str) -> None:
    """No poisoning: the key made after the change is the one a new process makes for the same
    contents, not the one made before the change."""
    template, change = CONFIGURATION[name]
    ns = define(variant(template, 1.5))
    task = durably.task(ns["task"])
    before = task.cache_key(3)
    exec(variant(change, 2.5), ns)
    fresh = durably.task(define(variant(template, 2.5))["task"])
    assert task.cache_key(3) == fresh.cache_key(3) != before


def test_in_place_change_gives_the_current_result_and_stores_it_under_its_own_key(
    tmp_path: Path,
) -> None:
    durably.configure(store=durably.DiskStore(tmp_path / "s"))
    source = """
        import durably
        WEIGHTS = {"a": $V}
        @durably.task
        def score(x):
            record(x)
            return x * WEIGHTS["a"]
        """
    try:
        calls: list[int] = []
        ns = define(variant(source, 1), {"__name__": "__main__", "record": calls.append})
        assert ns["score"](2) == 2
        ns["WEIGHTS"]["a"] = 10
        assert ns["score"](2) == 20  # not the stale 2
        ns["WEIGHTS"]["a"] = 1
        assert ns["score"](2) == 2
        assert calls == [2, 2]  # the last call was a hit on the first key
        # new definitions, as in new processes: each value finds its own result
        for value, expected in ((1, 2), (10, 20)):
            fresh = define(variant(source, value),
                           {"__name__": "__main__", "record": calls.append})
            assert fresh["score"](2) == expected
        assert calls == [2, 2]
    finally:
        durably.configure()


def test_a_function_put_into_a_table_is_noticed() -> None:
    ns = define("""
        def double(x):
            return 2 * x
        def triple(x):
            return 3 * x
        HANDLERS = {"scale": double}
        def task(x):
            return HANDLERS["scale"](x)
        """)
    first = fingerprint_function(ns["task"])
    ns["HANDLERS"]["scale"] = ns["triple"]
    assert not first.valid()
    assert fp(ns["task"]) != first.digest
    ns["HANDLERS"]["scale"] = ns["double"]
    assert fp(ns["task"]) == first.digest


def test_explain_names_the_changed_configuration(tmp_path: Path) -> None:
    durably.configure(store=durably.DiskStore(tmp_path / "s"))
    try:
        ns = define(variant(CONFIGURATION["dict item"][0], 1) + "import durably\n"
                    "task = durably.task(task)\n")
        ns["task"](3)
        ns["WEIGHTS"]["a"] = 2
        why = ns["task"].explain(3)
        assert not why.hit
        assert why.changed_code == ("__main__.WEIGHTS",)
    finally:
        durably.configure()


def test_a_file_held_in_a_global_follows_its_content(tmp_path: Path) -> None:
    """``durably.file`` is digested by its content: a small file is digested again on each
    revalidation, so editing it gives the next call a new key."""
    data = tmp_path / "data.csv"
    data.write_text("a,b\n1,2\n")
    ns = define("""
        import durably
        def task(x):
            return DATA.read_text() + x
        """)
    ns["DATA"] = durably.file(data)
    first = fingerprint_function(ns["task"])
    assert first.valid()
    data.write_text("a,b\n1,3\n")
    assert not first.valid()
    assert fp(ns["task"]) != first.digest


def test_an_enum_member_value_is_code() -> None:
    src = """
        import enum
        class Mode(enum.Enum):
            FAST = $V
            SLOW = "slow"
        def task(x):
            return Mode.FAST.value * x
        """
    one, two, one_again = (fp(define(variant(src, v))["task"]) for v in (1, 2, 1))
    assert one != two and one == one_again


def test_a_large_value_is_revalidated_by_the_digest_of_its_pickle() -> None:
    """A value whose pickle passes 64 KiB is checked by the digest of its pickle on every
    call (C speed, its buffers hashed in place): a change in place is seen, as is
    rebinding the name; an unchanged value stays valid."""
    ns = define("""
        BIG = list(range(100_000))
        def task(x):
            return BIG[x]
        """)
    first = fingerprint_function(ns["task"])
    assert first.valid() and first.valid()
    ns["BIG"][0] = -1
    assert not first.valid()  # in place: seen
    second = fingerprint_function(ns["task"])
    assert second.valid() and second.digest != first.digest
    ns["BIG"] = list(ns["BIG"])
    assert not second.valid()


def test_a_large_value_changed_in_place_is_seen_before_a_result_is_cached(
        tmp_path: Path) -> None:
    """A value too large to check by its pickle (over 64 KiB: a DataFrame, a list of
    objects) edited in place: it is digested again before the next call's key, so that
    call sees the edit (no warning: editing a value between calls is what it is for), and
    a new process with the original value never gets the edited result."""
    script = write_script(tmp_path / "job.py", """
        import sys, time, warnings
        import numpy as np, pandas as pd
        import durably

        DF = pd.DataFrame({"a": np.arange(20_000)})  # 160 kB

        class Item:
            def __init__(self, w):
                self.w = w

        ITEMS = [Item(1.0) for _ in range(3_000)]  # slow to digest (some 20-50 ms)

        @durably.task
        def total(n):
            return int(DF["a"].head(n).sum())

        @durably.task
        def weight(n):
            return sum(item.w for item in ITEMS[:n])

        if sys.argv[1] == "edit":
            print(total(3), weight(3))
            DF.loc[0, "a"] = 1000
            ITEMS[0].w = 100.0  # (at once: no pause, whatever the machine's load)
            with warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("always")
                after = total(4), weight(4)
            for w in said:
                print("warned:", w.message)
            print(*after, total(4), total(3), weight(4), weight(3))
        else:
            print(total(4), weight(4))
        """)
    env = script_env(tmp_path / "store")
    edit = subprocess.run([sys.executable, str(script), "edit"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert edit.returncode == 0, edit.stderr
    lines = edit.stdout.splitlines()
    assert lines == ["3 3.0", "1006 103.0 1006 1003 103.0 102.0"]  # the edit seen at once
    fresh = subprocess.run([sys.executable, str(script), "fresh"], env=env,
                           capture_output=True, text=True, timeout=120)
    assert fresh.returncode == 0, fresh.stderr
    assert fresh.stdout.split() == ["6", "4.0"]  # computed from the original values


def test_hits_after_a_large_value_or_a_file_changed_in_place_are_not_stale(
        tmp_path: Path) -> None:
    """Hits see an in-place edit too: a large global edited in place was served the
    results from before the edit on every hit until some call missed (a user's sweep of
    cached calls after `W *= 2` returned the old values); it is now digested again before
    every key is made, at once, never after some time. A durably.file() global is looked at
    by os.stat() on every call: the call right after the file changed sees it."""
    script = write_script(tmp_path / "hits.py", """
        import pathlib, time, warnings
        import numpy as np
        import durably

        W = np.ones(200_000)  # 1.6 MB: checked by identity on each call
        pathlib.Path("big.bin").write_bytes(b"A" * 8_000_000)  # slow to digest
        DATA = durably.file("big.bin")

        @durably.task
        def dot(x):
            return float(W.sum() * x)

        @durably.task
        def first():
            return pathlib.Path(DATA).read_bytes()[:1]

        warnings.simplefilter("always")
        print([dot(x) for x in (1, 2)], first())
        W *= 2
        with open("big.bin", "r+b") as f:
            f.write(b"Z")
        print([dot(x) for x in (1, 2)], first(), first())
        """)
    done = subprocess.run([sys.executable, str(script)], env=script_env(tmp_path / "store"),
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[200000.0, 400000.0] b'A'",
                                        "[400000.0, 800000.0] b'Z' b'Z'"]
    assert "Warning" not in done.stderr  # editing values and files is what they are for


def test_the_check_before_caching_sees_edits_not_caches_filling(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The check of a large value before a result is cached compares its digest as the
    encoder gives it: a cached_property filled by the task (the value unchanged) is no edit,
    and its result is cached without a warning; a large array edited in place is seen at
    once, by the next call's key."""
    import warnings

    import numpy as np

    ns = define("""
        import functools
        import durably

        class Doc:
            def __init__(self, text):
                self.text = text

            @functools.cached_property
            def words(self):
                return self.text.split()

        DOCS = [Doc(f"w{i} x y") for i in range(3_000)]

        @durably.task
        def count(k):
            return sum(len(d.words) for d in DOCS[:k])
        """)
    ns["BIG"] = np.zeros(1_000_000)  # 8 MB
    ns.update(define("""
        @durably.task
        def total(k):
            return float(BIG.sum()) + k
        """, ns))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [ns["count"](k) for k in (1, 2, 3000)] == [3, 6, 9000]
    assert all(ns["count"].explain(k).hit for k in (1, 2, 3000))
    assert ns["total"](1) == 1.0
    ns["BIG"][0] = 1000.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ns["total"](2) == 1002.0  # the key made with the edited contents
        assert ns["total"](1) == 1001.0  # never the result from before the edit
    assert ns["total"].explain(2).hit  # cached under the edited contents' key
    ns["BIG"][0] = 0.0
    assert ns["total"](1) == 1.0  # the first contents' entry, a hit again


def test_a_value_given_as_out_is_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """``np.add(ARR, 1, out=ARR)`` writes into ARR: the task changes it, so it is state (its
    type counts, not its contents) and the check before caching does not take the task's
    own writes for an edit: no warning, and the result is cached. A value only read, or
    given under another keyword, stays configuration."""
    import warnings

    import numpy as np

    ns = define("""
        import durably

        @durably.task
        def bump(k):
            np.add(ARR, 1, out=ARR)
            np.clip(LIMITS, 0, k, out=LIMITS)
            return float(ARR[0]) + float(SCALE.sum()) * 0

        def reads(k):
            return float(np.sum(SCALE, dtype=None)) * k
        """, {"__name__": "__main__", "np": np})
    ns.update(ARR=np.zeros(100_000), LIMITS=np.ones(10), SCALE=np.ones(3))
    first = fingerprint_function(ns["bump"]).digest
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ns["bump"](1) == 1.0
    assert ns["bump"].explain(1).hit
    ns["ARR"][:] = 7.0  # state: its contents are not in the fingerprint
    assert fingerprint_function(ns["bump"]).digest == first
    ns["SCALE"][0] = 5.0  # configuration (read only): noticed
    assert fingerprint_function(ns["bump"]).digest != first
    reads = fingerprint_function(ns["reads"])
    ns["SCALE"][1] = 9.0
    assert not reads.valid()


def test_a_mutation_by_code_the_task_does_not_reach_keeps_the_value_configuration() -> None:
    ns = define("""
        WEIGHTS = {"a": 1}
        def configure(a):
            WEIGHTS["a"] = a
        def task(x):
            return x * WEIGHTS["a"]
        """)
    first = fingerprint_function(ns["task"])
    ns["configure"](3)
    assert not first.valid()
    assert fp(ns["task"]) != first.digest


@pytest.mark.parametrize("body", [
    'return int(DF["a"].add(k).sum())',  # Series.add: a new Series
    'return list(COLS.append(pd.Index([k])))',  # Index.append: a new Index
    'return int(DF.pop.__name__ == "pop") + k',  # named, not called
    'return int(FRAMES["a"].add(k).sum().sum())',  # of an item of a dict of frames
])
def test_a_method_named_like_a_mutator_keeps_a_package_s_value_configuration(
        body: str) -> None:
    """Only a container of the language's kind (list, dict, set, deque...) or an object of
    the user's classes whose method changes it is state by a call of ``append``, ``add``,
    ``update``...: pandas' ``Series.add`` and ``Index.append`` return new objects, and the
    global read through them is configuration (new data in it is noticed). Taken for state,
    a notebook's new data (or a script's new CSV) was served the old result."""
    import pandas as pd

    ns = define(f"""
        import pandas as pd
        DF = pd.DataFrame({{"a": [1, 2, 3]}})
        COLS = pd.Index(["a", "b"])
        FRAMES = {{"a": pd.DataFrame({{"a": [1]}})}}
        def task(k):
            {body}
        """)
    first = fingerprint_function(ns["task"])
    ns["DF"] = pd.DataFrame({"a": [10, 20, 30]})  # the data cell run again with new data
    ns["COLS"] = pd.Index(["x"])
    ns["FRAMES"] = {"a": pd.DataFrame({"a": [100]})}
    assert not first.valid()
    assert fp(ns["task"]) != first.digest


def test_a_package_s_object_changed_by_its_method_is_noticed_not_stale(
        tmp_path: Path) -> None:
    """A value of an installed package that the task really changes through a method named
    like a mutator (``DataFrame.insert``, ``ndarray.sort``) is configuration: the change is
    seen, so the result computed with the value before it is not served for the value after
    it (taken for state, the second calls returned 3.0 and 1). (A later process's first call,
    a hit, does not sort ARR again: a task's effect on a global is not cached.)"""
    script = write_script(tmp_path / "job.py", """
        import sys, warnings
        import numpy as np, pandas as pd
        import durably

        ARR = np.array([3.0, 1.0, 2.0])
        DF = pd.DataFrame({"a": [1, 2]})

        @durably.task
        def first_then_sort(k):
            first = float(ARR[0])
            ARR.sort()  # in place
            return first + k

        @durably.task
        def width_then_insert(k):
            width = DF.shape[1]
            if "b" not in DF:
                DF.insert(1, "b", [0, 0])  # in place
            return width + k

        warnings.simplefilter("ignore")
        print(first_then_sort(0), width_then_insert(0), first_then_sort(0),
              width_then_insert(0))
        """)
    done = subprocess.run([sys.executable, str(script)], env=script_env(tmp_path / "store"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["3.0", "1", "1.0", "2"]  # as without durably


@pytest.mark.parametrize("body", [
    'return CONFIG.get("a"), CONFIG.copy(), list(CONFIG.items()), "a" in CONFIG',
    # in a nested function: a local, a parameter of the same name
    "def f():\n        CONFIG = {}\n        CONFIG['a'] = x\n    return f(), CONFIG['a']",
    "def f(CONFIG):\n        CONFIG['a'] = x\n    return f({}), CONFIG['a']",
    "d = {}\n    d['a'] = CONFIG['a']\n    return d",  # another dict, filled from it
    "return sorted(CONFIG)[0].upper()",  # a method of something derived from it
    "return dict(CONFIG).update(a=x)",  # a copy changed
])
def test_reading_a_value_keeps_it_configuration(body: str) -> None:
    ns = define(f"CONFIG = {{'a': 1}}\ndef task(x):\n    {body}\n")
    first = fingerprint_function(ns["task"])
    ns["CONFIG"]["a"] = 2
    assert not first.valid()


# -- state: changed by the walked code, left out ---------------------------------------------
# Each case: a source defining `task` and `fill()`, which changes the state the way the
# program does when it runs; the fingerprint must not depend on whether it ran.
STATE = {
    "memo filled by a helper": """
        _CONFIG_CACHE = {}
        def load_config(name):
            if name not in _CONFIG_CACHE:
                _CONFIG_CACHE[name] = {"k": len(name)}
            return _CONFIG_CACHE[name]
        def task(x):
            return load_config(x)["k"]
        def fill():
            task("abc")
        """,
    "memo read before the helper that fills it is walked": """
        _CACHE = {}
        def task(x):
            return len(_CACHE), remember(x)
        def remember(x):
            _CACHE[x] = x
            return x
        def fill():
            task(1)
        """,
    "list appended to": """
        _SEEN = []
        def task(x):
            _SEEN.append(x)
            return x
        def fill():
            task(1)
        """,
    "setdefault and append": """
        _GROUPS = {}
        def task(x):
            _GROUPS.setdefault(x % 2, []).append(x)
            return x
        def fill():
            task(3)
        """,
    "item deleted": """
        _PENDING = {"a": 1, "b": 2}
        def task(x):
            if _PENDING:
                del _PENDING[next(iter(_PENDING))]
            return x
        def fill():
            task(1)
        """,
    "item of an item": """
        _TREE = {"a": {}}
        def task(x):
            _TREE["a"][x] = x
            return x
        def fill():
            task(1)
        """,
    "key chosen by a condition": """
        _CACHE = {}
        def task(x):
            _CACHE[x if x > 0 else -x] = x
            return x
        def fill():
            task(-4)
        """,
    "inside a loop and an exception handler": """
        _LOG = {}
        def task(x):
            for i in range(x):
                try:
                    raise KeyError(i)
                except KeyError:
                    _LOG[i] = True
            return x
        def fill():
            task(3)
        """,
    "in a nested function": """
        _CACHE = {}
        def task(x):
            def put():
                _CACHE[x] = x
            put()
            return x
        def fill():
            task(5)
        """,
    "attribute assigned": """
        class Stats:
            calls = 0
        STATS = Stats()
        def task(x):
            STATS.calls += 1
            return x
        def fill():
            task(1)
        """,
    "attribute deleted": """
        class Box:
            pass
        BOX = Box()
        BOX.item = 1
        def task(x):
            if hasattr(BOX, "item"):
                del BOX.item
            return x
        def fill():
            task(1)
        """,
    "global counter": """
        _CALLS = 0
        def task(x):
            global _CALLS
            _CALLS += 1
            return x
        def fill():
            task(1)
        """,
    "client created on first use": """
        class Client:
            def get(self, x):
                return x
        _CLIENT = None
        def client():
            global _CLIENT
            if _CLIENT is None:
                _CLIENT = Client()
            return _CLIENT
        def task(x):
            return client().get(x)
        def fill():
            task(1)
        """,
    "nonlocal counter": """
        def make():
            calls = 0
            def task(x):
                nonlocal calls
                calls += 1
                return x
            return task
        task = make()
        def fill():
            task(1)
        """,
    "list in a closure appended to": """
        def make():
            seen = []
            def task(x):
                seen.append(x)
                return x
            return task
        task = make()
        def fill():
            task(1)
        """,
    "default argument used as a memo": """
        def helper(x, _memo={}):
            if x not in _memo:
                _memo[x] = x * 2
            return _memo[x]
        def task(x):
            return helper(x)
        def fill():
            task(4)
        """,
    "class attribute changed through self": """
        class Registry:
            items = []
            def add(self, x):
                self.items.append(x)
                return x
        REGISTRY = Registry()
        def task(x):
            return REGISTRY.add(x)
        def fill():
            task(1)
        """,
    "class attribute changed through cls": """
        class Plugins:
            _known = {}
            @classmethod
            def register(cls, name):
                cls._known[name] = True
                return name
        def task(x):
            return Plugins.register(x)
        def fill():
            task("p")
        """,
    "class counter rebound through cls": """
        class Ids:
            last = 0
            @classmethod
            def next(cls):
                cls.last += 1
                return cls.last
        def task(x):
            return Ids.next() and x
        def fill():
            task(1)
        """,
    "a method of the user's class changes self": """
        class Counter:
            def __init__(self):
                self.n = 0
            def bump(self):
                self.n += 1
                return self.n
        COUNTER = Counter()
        def task(x):
            return COUNTER.bump() and x
        def fill():
            task(1)
        """,
    "a method that calls a method that changes self": """
        class Cache:
            def __init__(self):
                self.data = {}
            def get(self, k):
                return self.data.get(k) or self._load(k)
            def _load(self, k):
                self.data[k] = k
                return k
        CACHE = Cache()
        def task(x):
            return CACHE.get(x)
        def fill():
            task(1)
        """,
    "a bound method that changes its instance": """
        class Recorder:
            def __init__(self):
                self.seen = []
            def add(self, x):
                self.seen.append(x)
                return x
        record = Recorder().add
        def task(x):
            return record(x)
        def fill():
            task(1)
        """,
    "a callable object that records its calls": """
        class Recorder:
            def __init__(self):
                self.calls = []
            def __call__(self, x):
                self.calls.append(x)
        def make(record):
            def task(x):
                record(x)
                return x
            return task
        RECORD = Recorder()
        task = make(RECORD)
        def also(x):
            RECORD(x)
        def fill():
            task(1)
            also(2)
        """,
    "class attribute changed through an instance": """
        class Registry:
            items = []
        REGISTRY = Registry()
        def task(x):
            REGISTRY.items.append(x)
            return x
        def fill():
            task(1)
        """,
    "field of a slotted object": """
        class Bag:
            __slots__ = ("seen",)
            def __init__(self):
                self.seen = set()
        BAG = Bag()
        def task(x):
            BAG.seen.add(x)
            return x
        def fill():
            task(1)
        """,
    "a list subclass whose method calls the list's": """
        class Log(list):
            def append(self, x):
                super().append(("at", x))
        LOG = Log()
        def task(x):
            LOG.append(x)
            return x
        def fill():
            task(1)
        """,
    "the user's class changing itself through a library function": """
        import heapq
        class Queue:
            def __init__(self):
                self.heap = []
            def add(self, x):
                heapq.heappush(self.heap, x)
        QUEUE = Queue()
        def task(x):
            QUEUE.add(x)
            return x
        def fill():
            task(2)
        """,
    "the user's class changing itself with setattr": """
        class Settings:
            def update(self, **kw):
                for k, v in kw.items():
                    setattr(self, k, v)
        SEEN = Settings()
        def task(x):
            SEEN.update(last=x)
            return x
        def fill():
            task(3)
        """,
    "lists in a tuple appended to": """
        BUCKETS = ([], [])
        def task(x):
            BUCKETS[x % 2].append(x)
            return x
        def fill():
            task(1)
        """,
    "an element of the standard library appended to": """
        import xml.etree.ElementTree as ET
        ROOT = ET.Element("root")
        def task(x):
            ROOT.append(ET.Element("item"))
            return x
        def fill():
            task(1)
        """,
    "flag values combined": """
        import enum
        class Perm(enum.Flag):
            R = 1
            W = 2
            X = 4
        def task(x):
            return Perm.R in x
        def fill():
            Perm.R | Perm.W | Perm.X
        """,
    "a memo of functools.cache": """
        import functools
        @functools.cache
        def square(x):
            return x * x
        def task(x):
            return square(x)
        def fill():
            task(3)
        """,
}


@pytest.mark.parametrize("template", STATE.values(), ids=STATE.keys())
def test_state_changed_by_the_code_is_left_out(template: str) -> None:
    ns = define(template)
    first = fingerprint_function(ns["task"])
    ns["fill"]()
    assert first.valid()  # nothing to compute again
    assert fp(ns["task"]) == first.digest
    filled_first = define(template)  # a process where the state was filled before the key
    filled_first["fill"]()
    assert fp(filled_first["task"]) == first.digest


def test_a_side_effect_task_keeps_its_key_whatever_ran_before() -> None:
    """The tester's case: a ``cache=False`` task whose key depended on whether another task
    had filled a memo first, so its journaled step ran again on resume."""
    src = """
        import durably
        _CONFIG_CACHE = {}
        def load_config(name):
            if name not in _CONFIG_CACHE:
                _CONFIG_CACHE[name] = {"k": len(name)}
            return _CONFIG_CACHE[name]
        @durably.task
        def warm(name):
            return load_config(name)["k"]
        @durably.task(cache=False)
        def notify(name):
            return load_config(name)["k"]
        """
    key = define(src)["notify"].cache_key("abc")
    ns = define(src)
    ns["warm"]("abc")  # another task filled the memo before notify's key was made
    assert ns["notify"].cache_key("abc") == key


def test_state_still_takes_part_by_its_type_and_its_code() -> None:
    src = """
        class Client:
            def get(self, x):
                return x + $V
        _CLIENTS = {}
        def task(x):
            _CLIENTS.setdefault("c", Client())
            return _CLIENTS["c"].get(x)
        """
    # the client's class is named by the code, so its code counts
    assert fp(define(variant(src, 1))["task"]) != fp(define(variant(src, 2))["task"])
    ns = define(variant(src, 1))
    first = fingerprint_function(ns["task"])
    ns["_CLIENTS"] = {}  # rebinding state by hand: computed again, to the same digest
    assert not first.valid()
    assert fp(ns["task"]) == first.digest


# -- modules ---------------------------------------------------------------------------------
Loader = Callable[[dict[str, str], str], types.ModuleType]


@pytest.fixture
def user_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Loader]:
    """Write modules into tmp_path (on sys.path) and import one of them afresh."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)

    def purge() -> None:
        for name in [n for n in sys.modules if n.startswith("fps_")]:
            del sys.modules[name]

    def load(files: dict[str, str], main: str) -> types.ModuleType:
        for rel, src in files.items():
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / rel).write_text(textwrap.dedent(src))
        purge()
        importlib.invalidate_caches()
        return importlib.import_module(main)

    yield load
    purge()


def test_an_attribute_of_a_user_module_is_configuration_or_state(user_modules: Loader) -> None:
    tasks = user_modules({
        "fps_cfg.py": """
            WEIGHTS = {"a": 1}
            CACHE = {}
            CALLS = 0
            """,
        "fps_tasks.py": """
            import fps_cfg
            def task(x):
                fps_cfg.CACHE[x] = x
                fps_cfg.CALLS += 1
                return x * fps_cfg.WEIGHTS["a"]
            """,
    }, "fps_tasks")
    cfg = sys.modules["fps_cfg"]
    first = fingerprint_function(tasks.task)
    tasks.task(2)  # fills the cache: state
    assert first.valid()
    cfg.WEIGHTS["a"] = 3  # configuration
    assert not first.valid()
    assert fp(tasks.task) != first.digest


CROSS = """
import dataclasses
_MEMO = {}
_CALLS = 0
WEIGHTS = {"b": 2.0, "a": 1, "tags": {"x", "y", "z"}}
@dataclasses.dataclass
class Config:
    rate: float = 0.5
    layers: list = dataclasses.field(default_factory=lambda: [1, 2])
CONFIG = Config()
class Registry:
    items = []
    def add(self, x):
        self.items.append(x)
        return x
REGISTRY = Registry()
def load(k):
    global _CALLS
    _CALLS += 1
    if k not in _MEMO:
        _MEMO[k] = {"k": k, "set": {k, "s"}}
    return _MEMO[k]
def task(x):
    return load(x), WEIGHTS["a"], CONFIG.rate, REGISTRY.add(x), sorted(WEIGHTS["tags"])
"""
PRINT = """
import sys; sys.path.insert(0, sys.argv[1]); import fps_cross as m
from durably._keys.fingerprint import fingerprint_function as f
if sys.argv[2] == "filled":
    for k in ("q", "r", "s"):
        m.task(k)
print(f(m.task).digest)
m.WEIGHTS["a"] = 5
m.CONFIG.layers.append(3)
changed = f(m.task).digest
m.WEIGHTS["a"] = 1
m.CONFIG.layers.pop()
print(changed, f(m.task).digest)
"""


def test_fingerprints_are_equal_across_processes_whatever_ran_before(
    user_modules: Loader, tmp_path: Path
) -> None:
    mod = user_modules({"fps_cross.py": CROSS}, "fps_cross")
    here = fp(mod.task)
    outputs = []
    for seed, state in (("1", "empty"), ("2", "filled"), ("3", "filled")):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        proc = subprocess.run(
            [sys.executable, "-B", "-c", PRINT, str(tmp_path), state],
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )
        assert proc.returncode == 0, proc.stderr
        outputs.append(proc.stdout.split())
    assert all(out[0] == here == out[2] for out in outputs)  # state filled or not
    assert len({out[1] for out in outputs}) == 1  # the changed contents: one digest too
    assert outputs[0][1] != here


# -- versions of installed packages ----------------------------------------------------------
def _install(site: Path, dist: str, version: str) -> None:
    """A package without ``__version__``, installed with distribution metadata."""
    (site / "fps_lib").mkdir(parents=True, exist_ok=True)
    (site / "fps_lib" / "__init__.py").write_text("def work(x):\n    return x\n")
    for old in site.glob("*.dist-info"):
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "top_level.txt").write_text("fps_lib\n")
    (info / "RECORD").write_text("fps_lib/__init__.py,,\n")


VERSION_TASK = """
import sys; sys.path.insert(0, sys.argv[1])
import fps_lib
from durably._keys.fingerprint import fingerprint_function
def task(x):
    return fps_lib.work(x)
print(fingerprint_function(task).digest)
"""


# a distribution named like its module, or not (found through packages_distributions)
@pytest.mark.parametrize("dist", ["fps_lib", "fps-lib-dist"])
def test_an_upgrade_of_a_package_without_version_attribute_is_noticed(
    tmp_path: Path, dist: str
) -> None:
    site = tmp_path / "lib" / "site-packages"  # an installed package, not the user's code

    def digest() -> str:
        proc = subprocess.run(
            [sys.executable, "-B", "-c", VERSION_TASK, str(site)],
            capture_output=True, text=True, timeout=120, check=False,
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    _install(site, dist, "1.0")
    first = digest()
    assert digest() == first
    _install(site, dist, "1.1")
    assert digest() != first


# -- docstrings ------------------------------------------------------------------------------
DOCSTRINGS = {  # (source, whether rewording `$V` keeps the fingerprint)
    "function": ('def task(x):\n    """$V"""\n    return x + 1\n', True),
    "method of a helper class": (
        'class M:\n    def f(self, x):\n        """$V"""\n        return x\n'
        "def task(x):\n    return M().f(x)\n", True),
    "nested function": (
        'def task(x):\n    def inner():\n        """$V"""\n        return x\n'
        "    return inner()\n", True),
    # the same text as the docstring and as a value: the value counts
    "string returned that equals the docstring": (
        'def task(x):\n    """$V"""\n    return "$V"\n', False),
    "first string constant, no docstring": ('def task(x):\n    return "$V"\n', False),
    "string statement after the first": (
        'def task(x):\n    y = x\n    "$V"\n    return y\n', True),  # no value at all
}


@pytest.mark.parametrize(("template", "ignored"), DOCSTRINGS.values(), ids=DOCSTRINGS.keys())
def test_docstrings_are_left_out_and_string_values_are_not(template: str, ignored: bool) -> None:
    one, two = (fp(define(template.replace("$V", v))["task"]) for v in ("one", "two"))
    assert (one == two) is ignored


def test_adding_a_docstring_keeps_the_fingerprint() -> None:
    plain = "def task(x):\n    return x + 1\n"
    documented = 'def task(x):\n    """Add one."""\n    return x + 1\n'
    assert fp(define(plain)["task"]) == fp(define(documented)["task"])


def test_a_class_keeps_its_fingerprint_after_its_instances_were_digested() -> None:
    """Pickling or digesting an instance adds ``__slotnames__`` to its class (copyreg): a
    cache, not code, so the key does not depend on whether that happened first."""
    src = """
        class Settings:
            def __init__(self):
                self.rate = 2
        SETTINGS = Settings()
        def task(x):
            return x * SETTINGS.rate
        """
    before = fp(define(src)["task"])
    ns = define(src)
    durably.digest(ns["SETTINGS"])
    assert fp(ns["task"]) == before


def test_the_large_value_warning_names_the_user_s_line(tmp_path: Path) -> None:
    """A global over 64 MiB is digested before each call; the warning that says so (once)
    names the task and the global, and points at the call in the user's code."""
    script = write_script(tmp_path / "edit.py", """
        import warnings
        import numpy as np
        import durably

        BIG = np.zeros(9_000_000)  # 72 MB

        @durably.task
        def total(k):
            return float(BIG.sum()) + k

        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            total(1)  # the line the warning names
            total(2)
        print([(w.filename.endswith("edit.py"), w.lineno) for w in said])
        print(str(said[0].message))
        """)
    out = subprocess.run([sys.executable, str(script)], env=script_env(tmp_path / "s"),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    where, message = out.stdout.strip().splitlines()
    assert where == "[(True, 14)]"
    assert "'total'" in message and "__main__.BIG" in message and "69 MiB" in message
    assert "version=" in message and "argument" in message


def test_editing_the_definition_of_a_state_value_in_its_file_is_noticed(
        tmp_path: Path) -> None:
    """A module-level list or dict the task itself mutates (FEATURES.sort(),
    DEFAULTS.setdefault(...)) is state: its contents do not count, so filling it never
    changes a key. Editing its literal in the file was then served the old result in every
    new process (a break-it helper). The source of its top-level definition counts now;
    running it twice unedited still hits."""
    script = tmp_path / "state_job.py"
    source = textwrap.dedent("""
        import durably
        FEATURES = ["b", "a"]
        DEFAULTS = {"lr": 0.1}

        @durably.task
        def feats(x):
            FEATURES.sort()
            return [f + str(x) for f in FEATURES]

        @durably.task
        def lr(x):
            DEFAULTS.setdefault("seed", 0)
            return DEFAULTS["lr"] * x

        print(feats(1), lr(10), feats.explain(1).hit)
        """)
    script.write_text(source)
    env = script_env(tmp_path / "store")

    def run() -> str:
        done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                              text=True, timeout=120, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert run() == "['a1', 'b1'] 1.0 True"
    assert run() == "['a1', 'b1'] 1.0 True"  # the same definitions: hits
    script.write_text(source.replace('["b", "a"]', '["c", "b", "a"]').replace("0.1", "0.5"))
    assert run() == "['a1', 'b1', 'c1'] 5.0 True"


def test_what_makes_a_state_value_at_import_counts_not_only_its_assignment(
        tmp_path: Path) -> None:
    """A state value filled by module-level statements (EXTRA.extend([...]), a loop filling
    REG) or made by a function of the module (BUILT = build()): editing those is an edit
    too (a review: each was served its old result in new processes). The module's main
    block does not count."""
    script = tmp_path / "state_more.py"
    source = textwrap.dedent("""
        import durably
        EXTRA = []
        EXTRA.extend(["a"])
        REG = {}
        for k in ["a"]:
            REG[k] = len(k)

        def build():
            return ["a"]

        BUILT = build()

        @durably.task
        def use():
            EXTRA.sort()
            REG.setdefault("z", 0)
            BUILT.append("!")
            return [EXTRA[0], sorted(REG)[0], BUILT[0]]

        if __name__ == "__main__":
            print(use())  # MAIN
        """)
    env = script_env(tmp_path / "store")

    def run(text: str) -> str:
        script.write_text(text)
        done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert run(source) == "['a', 'a', 'a']"
    assert run(source.replace("# MAIN", "# the main block, edited")) == "['a', 'a', 'a']"
    for old, new in (('EXTRA.extend(["a"])', 'EXTRA.extend(["b"])'),
                     ('for k in ["a"]:', 'for k in ["b"]:'),
                     ('    return ["a"]', '    return [SEED]')):
        source = source.replace(old, new)
        if "SEED" in new:  # what build() uses of the module counts too
            source = source.replace("def build():", 'SEED = "b"\n\ndef build():')
        assert run(source).count("'b'") == (1 if "EXTRA" in new else 2 if "for" in new
                                            else 3), new
    assert run(source.replace('SEED = "b"', 'SEED = "c"')).count("'c'") == 1


def test_a_definition_edited_after_its_module_was_loaded_is_not_read(tmp_path: Path) -> None:
    """The file of a loaded module edited before the first call (an editor, without a
    reload): the process's values come from the old source, so the new source must not
    name its results, or a new process (new source, new values) would be served them."""
    (tmp_path / "feature_mod.py").write_text(textwrap.dedent("""
        import durably
        FEATURES = ["b", "a"]

        @durably.task
        def feats(x):
            FEATURES.sort()
            return [f + str(x) for f in FEATURES]
        """))
    script = write_script(tmp_path / "edit_then_call.py", """
        import pathlib, sys, time
        import feature_mod
        if sys.argv[1] == "edit":
            time.sleep(0.05)
            path = pathlib.Path(feature_mod.__file__)
            path.write_text(path.read_text().replace('["b", "a"]', '["c", "b", "a"]'))
        print(feature_mod.feats(1))
        """)
    env = {**script_env(tmp_path / "store"), "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), os.environ.get("PYTHONPATH", "")])}

    def run(mode: str) -> str:
        done = subprocess.run([sys.executable, "-B", str(script), mode], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert run("edit") == "['a1', 'b1']"  # the values it loaded
    assert run("fresh") == "['a1', 'b1', 'c1']"  # not served the result above


def test_a_file_rewritten_while_its_task_runs_leaves_no_result_in_the_cache(
        tmp_path: Path) -> None:
    """A durably.file() input (an argument, or a global) rewritten while the body runs:
    the body read the new content, but the key was made from the old one, so a new process
    with the old content was served the new result (a review). That result stays out of
    the cache (the run's journal keeps it); the next call computes and caches it."""
    data = tmp_path / "data.txt"
    script = write_script(tmp_path / "race.py", f"""
        import sys, threading, time
        import durably
        P = {str(data)!r}
        DATA = durably.file(P)

        @durably.task
        def read_global():
            time.sleep(0.3)
            return open(DATA).read()

        @durably.task
        def read_arg(f):
            time.sleep(0.3)
            return open(f).read()

        @durably.entrypoint
        def job(which):
            return read_global() if which == "g" else read_arg(durably.file(P))

        which, mode, inrun = sys.argv[1:4]
        if mode == "race":
            threading.Timer(0.1, lambda: open(P, "w").write("NEW")).start()
        call = ((lambda: job.run(which, fresh=True).result) if inrun == "run" else
                read_global if which == "g" else (lambda: read_arg(durably.file(P))))
        print(call())
        """)
    def run(which: str, mode: str, inrun: str) -> str:
        data.write_text("OLD")
        done = subprocess.run([sys.executable, str(script), which, mode, inrun],
                              env=script_env(tmp_path / f"store-{which}-{inrun}"),
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    for which in ("g", "a"):
        for inrun in ("plain", "run"):
            assert run(which, "race", inrun) == "NEW"  # it read what was there then
            # not served the racing result
            assert run(which, "fresh", inrun) == "OLD", (which, inrun)


def test_a_file_nested_anywhere_rewritten_by_its_task_is_not_cached(tmp_path: Path) -> None:
    """The files watched while a body runs are those its arguments' digest and its code
    fingerprint met, however nested: a dict of lists, a set, a dataclass field, the 151st
    item of a list, a global list (only bare ones and the first 100 items one level down
    were watched: a review found the rest cached under the old content's key)."""
    import dataclasses as dc

    path = tmp_path / "f.txt"
    path.write_text("v1")
    f = durably.file(path)
    ns = define(f"""
        import dataclasses, durably, pathlib
        G_LIST = [durably.file({str(path)!r})]

        @dataclasses.dataclass(frozen=True)
        class Box:
            f: object

        def read_and_rewrite(f):
            text = pathlib.Path(f).read_text()
            pathlib.Path(f).write_text("v2")
            return text

        @durably.task
        def via_arg(x):
            return read_and_rewrite({str(path)!r})

        @durably.task
        def via_global():
            return read_and_rewrite(G_LIST[0])
        """)
    Box = ns["Box"]
    for arg in ({"k": [f]}, frozenset([f]), Box(f), [0] * 150 + [f]):
        path.write_text("v1")
        assert ns["via_arg"](arg) == "v1"
        path.write_text("v1")
        assert ns["via_arg"].explain(arg).hit is False, (dc.is_dataclass(arg), type(arg))
    path.write_text("v1")
    assert ns["via_global"]() == "v1"
    path.write_text("v1")
    assert ns["via_global"].explain().hit is False


def test_a_file_rewritten_after_its_key_was_made_leaves_no_result_in_the_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The write lands after the key was made from the old content, before the body starts
    (a loaded machine stretches that moment): the body reads the new content, and that
    result is not cached under the old content's key. A file only touched (its content the
    same) between calls does not matter."""
    from durably._runtime import spec as _spec

    durably.configure(store=durably.DiskStore(tmp_path / "store"))
    data = tmp_path / "data.txt"
    data.write_text("OLD")
    ran: list[str] = []

    @durably.task
    def read(f: durably.File) -> str:
        ran.append(f.read_text())
        return f.read_text()

    real = _spec.Spec.key_and_code
    writes = {"now": "NEW"}

    def then_written(self: Any, input_digest: str) -> Any:
        made = real(self, input_digest)
        if writes["now"] is not None:
            data.write_text(writes["now"])  # right after the key, before the body
            writes["now"] = None
        return made

    monkeypatch.setattr(_spec.Spec, "key_and_code", then_written)
    assert read(durably.file(data)) == "NEW"  # what was there when it ran
    monkeypatch.undo()
    data.write_text("OLD")
    assert read(durably.file(data)) == "OLD"  # not served the result read from NEW
    assert ran == ["NEW", "OLD"]
    assert read(durably.file(data)) == "OLD" and ran == ["NEW", "OLD"]  # a hit


def test_a_file_changed_and_changed_back_while_its_task_runs_is_not_cached(
        tmp_path: Path) -> None:
    """Written and put back (or only touched) while the body runs: what the body read may
    be neither the key's content nor the file's now, so the result is not cached (a review
    found the content compared again after the body let "B" be served for "A")."""
    durably.configure(store=durably.DiskStore(tmp_path / "store"))
    data = tmp_path / "data.txt"
    data.write_text("A")
    ran: list[str] = []

    @durably.task
    def aba(f: durably.File) -> str:
        data.write_text("B")
        got = data.read_text()
        data.write_text("A")
        ran.append(got)
        return got

    assert aba(durably.file(data)) == "B"
    assert aba(durably.file(data)) == "B" and ran == ["B", "B"]  # executed again


def test_a_global_file_touched_once_lets_later_results_be_cached(tmp_path: Path) -> None:
    """A durably.file() global touched (its content the same) between calls: later calls'
    results are cached again (its stamp is taken before each call's key, not kept from the
    walk: every later miss would otherwise read as 'changed')."""
    data = tmp_path / "config.txt"
    data.write_text("k=1")
    mod = types.ModuleType("touched_global_mod")
    mod.__dict__["durably"] = durably
    mod.__dict__["P"] = str(data)
    exec(textwrap.dedent("""
        DATA = durably.file(P)
        RAN = []

        @durably.task
        def use(x):
            RAN.append(x)
            return DATA.read_text() + str(x)
        """), mod.__dict__)
    durably.configure(store=durably.DiskStore(tmp_path / "store"))
    assert mod.use(1) == "k=11"
    os.utime(data, (3, 3))
    assert mod.use(2) == "k=12" and mod.use(2) == "k=12"
    assert mod.RAN == [1, 2]  # the second use(2) was a hit
