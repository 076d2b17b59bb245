"""`Task.explain`: would this call hit, and if not, which part of the key differs?"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

import durably

from .conftest import run_script, script_env, write_script

pytestmark = pytest.mark.usefixtures("store")


def test_first_call_hit_and_changed_argument() -> None:
    @durably.task
    def area(width: int, height: int, unit: str = "m") -> str:
        return f"{width * height} {unit}2"

    first = area.explain(2, 3)
    assert not first.hit and first.nearest is None
    assert "no earlier entry" in str(first)
    area(2, 3)
    hit = area.explain(width=2, height=3, unit="m")
    assert hit.hit and "served from the cache" in str(hit)
    assert hit.cache_key == area.cache_key(2, 3)
    miss = area.explain(2, 4)
    assert not miss.hit
    assert miss.changed_arguments == ("height",) and miss.changed_code == ()
    assert "argument 'height' differs" in str(miss) and "width" not in str(miss)
    both = area.explain(5, 3, unit="cm")
    assert both.changed_arguments == ("unit", "width")


def _cell(ns: dict[str, Any], source: str) -> None:
    exec(compile(textwrap.dedent(source), "<cell>", "exec"), ns)


def test_changed_helper_is_named() -> None:
    ns: dict[str, Any] = {"__name__": "__main__", "durably": durably}
    _cell(ns, """
        def normalize(x):
            return x / 10

        @durably.task
        def score(x):
            return normalize(x) + 1
    """)
    ns["score"](5)
    assert ns["score"].explain(5).hit
    _cell(ns, """
        def normalize(x):
            return x / 100
    """)
    why = ns["score"].explain(5)
    assert not why.hit and why.changed_arguments == ()
    assert why.changed_code == ("__main__.normalize",)
    assert "the code changed: __main__.normalize" in str(why)


def test_changed_task_body_is_named() -> None:
    ns: dict[str, Any] = {"__name__": "__main__", "durably": durably}
    _cell(ns, "@durably.task\ndef f(x):\n    return x + 1\n")
    ns["f"](1)
    _cell(ns, "@durably.task\ndef f(x):\n    return x + 2\n")
    assert ns["f"].explain(1).changed_code == ("__main__.f",)


def test_version_change_and_cache_false() -> None:
    @durably.task(name="v-task", version="1")
    def v1(x: int) -> int:
        return x

    @durably.task(name="v-task", version="2")
    def v2(x: int) -> int:
        return x

    v1(1)
    why = v2.explain(1)
    assert why.version_change == ("1", "2") and "version changed from '1' to '2'" in str(why)

    @durably.task(cache=False)
    def side(x: int) -> int:
        return x

    side(1)
    assert not side.explain(1).hit and "cache=False" in str(side.explain(1))


def test_entry_gone_from_the_cache(store: Any) -> None:
    @durably.task
    def f(x: int) -> int:
        return x

    f(1)
    key = f.cache_key(1)
    assert store.cache_delete([key]) == 1
    why = f.explain(1)
    assert not why.hit and "no longer in the cache" in str(why)


def test_steps_of_a_run_are_explained_after_the_run() -> None:
    @durably.task
    def t(x: int) -> int:
        return x * 2

    @durably.entrypoint
    def pipeline(n: int) -> list[int]:
        return [t(i) for i in range(n)]

    pipeline(3)
    assert all(t.explain(i).hit for i in range(3))
    assert t.explain(3).changed_arguments == ("x",)


def test_explain_from_another_process(tmp_path: Path) -> None:
    script = write_script(tmp_path / "job.py", """
        import sys
        import durably

        @durably.task
        def fit(alpha, data):
            return alpha * sum(data)

        if sys.argv[1:] == ["run"]:
            print(fit(0.5, [1, 2, 3]))
        else:
            print(fit.explain(0.7, [1, 2, 3]))
    """)
    env = script_env(tmp_path / "store")
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(script), "run"], env=env, capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = run_script(script, env).stdout
    assert "argument 'alpha' differs" in out and "'data'" not in out


def test_changed_constant_and_class_attribute_are_named() -> None:
    ns: dict[str, Any] = {"__name__": "__main__", "durably": durably}
    _cell(ns, """
        RATE = 0.1

        class Scaler:
            factor = 2

            def apply(self, x):
                return x * self.factor

        @durably.task
        def price(x):
            return Scaler().apply(x) * (1 + RATE)
    """)
    ns["price"](10)
    _cell(ns, "RATE = 0.2\n")
    assert ns["price"].explain(10).changed_code == ("__main__.RATE",)
    _cell(ns, "RATE = 0.1\nScaler.factor = 3\n")
    assert ns["price"].explain(10).changed_code == ("__main__.Scaler",)
    _cell(ns, "Scaler.factor = 2\ndef apply(self, x):\n    return x * self.factor + 0\n"
              "Scaler.apply = apply\n")
    # the method was replaced by another function: the old one is gone, the new one is named
    assert ns["price"].explain(10).changed_code == ("__main__.Scaler.apply", "__main__.apply")


def test_an_argument_mutated_by_the_body_is_recorded_as_it_was_passed() -> None:
    @durably.task
    def consume(items: list[int], n: int) -> int:
        total = sum(items)
        items.clear()
        return total * n

    consume([1, 2, 3], 2)
    why = consume.explain([1, 2, 3], 3)
    assert why.changed_arguments == ("n",)


_PARAMS = """
    import dataclasses

    WEIGHT = 1

    @dataclasses.dataclass
    class Params:
        lr: float

        def effective_lr(self):
            return self.lr * $V * WEIGHT

    @durably.task
    def train(p, steps):
        return p.lr * steps

    @durably.task
    def train_all(ps, steps):
        return [p.lr * steps for p in ps]

    @durably.entrypoint
    def sweep(lr):
        return train(Params(lr), 3)
"""


def test_an_argument_whose_class_code_changed_names_the_class() -> None:
    """An argument's digest covers the code of its user class: explain says it was the
    class's code that changed, and what in it (a method, a constant a method uses), not
    the value, and lists them among changed_code."""
    ns: dict[str, Any] = {"__name__": "__main__", "durably": durably}
    _cell(ns, _PARAMS.replace("$V", "2"))
    ns["train"](ns["Params"](0.1), 3)
    ns["train_all"]([ns["Params"](0.1), ns["Params"](0.2)], 3)
    ns["sweep"](0.5)  # inside a run: the key record is written at the run's end
    other_value = ns["train"].explain(ns["Params"](0.3), 3)
    assert other_value.changed_arguments == ("p",) and other_value.changed_code == ()
    assert "class" not in str(other_value)

    _cell(ns, _PARAMS.replace("$V", "4"))  # only the method changed
    method = ("__main__.Params", "__main__.Params.effective_lr")
    why = ns["train"].explain(ns["Params"](0.1), 3)
    assert not why.hit and why.changed_arguments == ("p",)
    assert why.changed_code == method
    assert "argument 'p' differs" in str(why)
    assert ("the code of its class __main__.Params (__main__.Params.effective_lr) changed"
            in str(why))
    nested = ns["train_all"].explain([ns["Params"](0.1), ns["Params"](0.2)], 3)
    assert nested.changed_code == method
    in_run = ns["train"].explain(ns["Params"](0.5), 3)
    assert in_run.changed_arguments == ("p",) and in_run.changed_code == method
    # the steps argument unchanged is not blamed; a changed one is, without a class
    both = ns["train"].explain(ns["Params"](0.1), 4)
    assert both.changed_arguments == ("p", "steps")
    assert "argument 'steps' differs" in str(both) and str(both).count("its class") == 1

    _cell(ns, _PARAMS.replace("$V", "2").replace("WEIGHT = 1", "WEIGHT = 11"))
    constant = ns["train"].explain(ns["Params"](0.1), 3)
    assert constant.changed_code == ("__main__.Params", "__main__.WEIGHT")
    assert "its class __main__.Params (__main__.WEIGHT) changed" in str(constant)


_PLAIN = """
    WEIGHT = 1

    class Scaler:  # a plain class: its instances are digested by their pickle recipe
        def __init__(self, k):
            self.k = k

        def apply(self, x):
            return x * self.k * $V * WEIGHT

    class Model:
        def __init__(self, name):
            self.name = name

        @durably.task
        def predict(self, x):
            return x + $V

    @durably.task
    def run(s, x):
        return s.apply(x)
"""


def test_a_plain_class_whose_code_changed_is_named() -> None:
    """An argument of a plain class (no dataclass, no hook: digested by its pickle recipe,
    which names its class) whose class's code changed: explain names the class and what in
    it changed, as for a dataclass; so does the ``self`` of a task method."""
    ns: dict[str, Any] = {"__name__": "__main__", "durably": durably}
    _cell(ns, _PLAIN.replace("$V", "2"))
    ns["run"](ns["Scaler"](2), 10)
    ns["Model"]("m").predict(1)
    other_value = ns["run"].explain(ns["Scaler"](3), 10)
    assert other_value.changed_arguments == ("s",) and other_value.changed_code == ()
    assert "class" not in str(other_value)

    _cell(ns, _PLAIN.replace("$V", "4"))  # the methods changed, not the values
    why = ns["run"].explain(ns["Scaler"](2), 10)
    assert not why.hit and why.changed_arguments == ("s",)
    assert why.changed_code == ("__main__.Scaler", "__main__.Scaler.apply")
    assert ("argument 's' differs" in str(why) and "the code of its class __main__.Scaler "
            "(__main__.Scaler.apply) changed" in str(why))
    method = ns["Model"]("m").predict.explain(1)
    assert method.changed_arguments == ("self",)
    assert "__main__.Model" in method.changed_code
    assert "the code of its class __main__.Model" in str(method)

    _cell(ns, _PLAIN.replace("$V", "2").replace("WEIGHT = 1", "WEIGHT = 5"))
    constant = ns["run"].explain(ns["Scaler"](2), 10)
    assert constant.changed_code == ("__main__.Scaler", "__main__.WEIGHT")
    assert "its class __main__.Scaler (__main__.WEIGHT) changed" in str(constant)


def test_the_nearest_entry_is_the_one_whose_code_differs_least() -> None:
    """Of earlier entries with the same arguments, explain compares with the one whose code
    differs in the fewest parts: an edit reverted since is not named."""
    ns: dict[str, Any] = {"__name__": "__main__", "durably": durably}
    cell = """
        A = $A
        B = $B

        @durably.task
        def f(x):
            return x + A + B
    """
    _cell(ns, cell.replace("$A", "1").replace("$B", "1"))
    ns["f"](5)
    _cell(ns, cell.replace("$A", "2").replace("$B", "1"))  # A edited...
    ns["f"](5)
    _cell(ns, cell.replace("$A", "1").replace("$B", "2"))  # ...reverted; B edited
    why = ns["f"].explain(5)
    assert why.changed_code == ("__main__.B",)


def test_a_constant_read_as_a_module_attribute_is_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`x * cfg.MULT` with cfg.MULT edited: explain named nothing ('the code changed: its
    fingerprint.'); it names cfg.MULT now, as it does for `from cfg import MULT`."""
    from .conftest import load_source

    load_source(tmp_path, monkeypatch, "cfg_consts", "MULT = 3\n")
    job = load_source(tmp_path, monkeypatch, "job_consts", """
import durably, cfg_consts
@durably.task
def via_attr(x):
    return x * cfg_consts.MULT
""")
    job.via_attr(2)
    load_source(tmp_path, monkeypatch, "cfg_consts", "MULT = 4\n")
    job = load_source(tmp_path, monkeypatch, "job_consts", """
import durably, cfg_consts
@durably.task
def via_attr(x):
    return x * cfg_consts.MULT
""")
    why = job.via_attr.explain(2)
    assert not why.hit and why.changed_code == ("cfg_consts.MULT",)
    assert "the code changed: cfg_consts.MULT" in str(why)
