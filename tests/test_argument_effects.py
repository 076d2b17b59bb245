"""A task's in-place changes to its arguments are part of what it did: a hit or a replay
puts them back into the caller's objects, so a rerun never diverges."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import numpy as np
import pytest

import durably
from durably._runtime.effects import Effects


def test_a_task_appending_to_its_argument_replays_the_same_every_time(store: Any) -> None:
    @durably.task
    def add(acc: list[int], x: int) -> int:
        acc.append(x)
        return len(acc)

    @durably.entrypoint
    def job() -> list[int]:
        acc: list[int] = []
        return [add(acc, i) for i in range(4)]

    assert job() == [1, 2, 3, 4]
    assert job() == [1, 2, 3, 4]  # replayed: acc grows as when the bodies executed
    assert job.run(fresh=True).result == [1, 2, 3, 4]  # a new run: served from the cache


def test_a_hit_outside_a_run_leaves_the_callers_object_as_the_body_did(store: Any) -> None:
    calls: list[int] = []

    @durably.task
    def fill(d: dict[str, int], n: int) -> int:
        calls.append(n)
        d.update({f"k{i}": i for i in range(n)})
        return n

    first: dict[str, int] = {}
    assert fill(first, 3) == 3
    second: dict[str, int] = {}
    assert fill(second, 3) == 3  # a hit (the key is made from the empty dict)
    assert calls == [3]
    assert second == first == {"k0": 0, "k1": 1, "k2": 2}


def test_the_cache_key_is_made_from_the_arguments_before_the_call(store: Any) -> None:
    calls: list[list[int]] = []

    @durably.task
    def push(items: list[int]) -> int:
        calls.append(list(items))
        items.append(0)
        return len(items)

    a: list[int] = [1]
    assert push(a) == 2 and a == [1, 0]
    b: list[int] = [1, 0]  # what a looks like now: another input
    assert push(b) == 3
    assert calls == [[1], [1, 0]]


def test_scikit_learn_fit_on_the_callers_estimator_replays_fitted(store: Any) -> None:
    from sklearn.linear_model import LogisticRegression

    rng = np.random.RandomState(0)
    x = rng.rand(60, 3)
    y = (x[:, 0] > 0.5).astype(int)
    executed: list[str] = []

    @durably.task
    def fit(clf: Any, x: Any, y: Any) -> float:
        executed.append("fit")
        clf.fit(x, y)
        return float(clf.score(x, y))

    @durably.task
    def predict(clf: Any, x: Any) -> int:
        executed.append("predict")
        return int(clf.predict(x).sum())

    @durably.entrypoint
    def compare() -> tuple[float, int]:
        clf = LogisticRegression()
        return fit(clf, x, y), predict(clf, x)

    first = compare()
    for _ in range(3):
        assert compare() == first
    assert executed == ["fit", "predict"]  # the reruns replayed both: the inputs matched


@dataclasses.dataclass
class Counter:
    n: int = 0
    seen: list[int] = dataclasses.field(default_factory=list)


class Plain:
    def __init__(self) -> None:
        self.total = 0.0


def test_arrays_dataclasses_and_plain_objects_are_put_back(store: Any) -> None:
    @durably.task
    def scale(a: Any, k: float) -> float:
        a *= k
        return float(a.sum())

    @durably.task
    def bump(c: Counter, k: int) -> int:
        c.n += k
        c.seen.append(k)
        return c.n

    @durably.task
    def total(p: Plain, xs: tuple[float, ...]) -> float:
        p.total += sum(xs)
        return p.total

    @durably.entrypoint
    def job() -> tuple[list[float], int, list[int], float]:
        a = np.ones(3)
        scale(a, 2.0)
        c = Counter()
        bump(c, 2)
        bump(c, 5)
        p = Plain()
        total(p, (1.0, 2.5))
        return a.tolist(), c.n, c.seen, p.total

    expected = ([2.0, 2.0, 2.0], 7, [2, 5], 3.5)
    assert job() == expected
    assert job() == expected


def test_the_returned_argument_is_the_callers_object(store: Any) -> None:
    @durably.task
    def tag(d: dict[str, int]) -> dict[str, int]:
        d["tagged"] = 1
        return d

    tag({})
    mine: dict[str, int] = {}
    out = tag(mine)
    assert out is mine and mine == {"tagged": 1}


def test_immutable_arguments_store_the_plain_result(disk_store: durably.DiskStore) -> None:
    @durably.task
    def f(x: int, s: str, t: tuple[int, str]) -> int:
        return x

    f(1, "a", (2, "b"))
    key = f.cache_key(1, "a", (2, "b"))
    import pickle

    assert pickle.loads(disk_store.cache_get(key) or b"") == 1


def test_a_file_argument_is_immutable_and_not_compared_before_and_after_the_body(
        store: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A durably.File is its path (its content changing is caught by its stamps): it cannot
    be changed in place, so its state is not taken before and after every body."""
    import durably._runtime.call

    compared: list[list[str]] = []
    real = durably._runtime.call.state_before
    monkeypatch.setattr(durably._runtime.call, "state_before",
                        lambda values, known: compared.append([n for n, _ in values])
                        or real(values, known))
    path = tmp_path / "a.txt"
    path.write_text("one")
    f = durably.file(path)
    with pytest.raises(AttributeError, match=r"durably\.File is immutable"):
        f.path = tmp_path / "other.txt"  # type: ignore[misc]
    with pytest.raises(AttributeError, match="immutable"):
        del f.path

    @durably.task
    def size(source: durably.File, xs: list[int]) -> int:
        return len(source.read_bytes()) + len(xs)

    @durably.entrypoint
    def job() -> int:
        return size(f, [1])

    assert job() == 4
    assert compared == [["xs"]]  # the list may change in place; the file may not
    assert f.path == path and durably.file(str(path)) == f


def test_an_unchanged_mutable_argument_stores_the_plain_result(
        disk_store: durably.DiskStore) -> None:
    @durably.task
    def total(xs: list[int]) -> int:
        return sum(xs)

    total([1, 2])
    import pickle

    value = pickle.loads(disk_store.cache_get(total.cache_key([1, 2])) or b"")
    assert value == 3 and not isinstance(value, Effects)


def test_a_change_that_cannot_be_stored_warns_once_with_the_fix(store: Any) -> None:
    @durably.task
    def attach(holder: list[Any]) -> int:
        holder.append(threading.Lock())
        return 1

    with pytest.warns(UserWarning, match=r"attach.*'holder'.*cannot be pickled.*Fix: return"):
        attach([])
    attach([])  # a hit (the key is the empty list's), no second warning
    assert attach([]) == 1


class Frozen:
    __slots__ = ("v",)

    def __init__(self) -> None:
        self.v = 0

    def __setstate__(self, state: Any) -> None:
        if hasattr(self, "v"):  # (a new object loads; one in use cannot take a state)
            raise RuntimeError("read-only")
        self.v = state[1]["v"]


def test_a_change_that_cannot_be_put_back_warns_naming_the_argument(store: Any) -> None:
    @durably.task
    def setv(f: Frozen) -> int:
        f.v = 5
        return 5

    setv(Frozen())
    with pytest.warns(UserWarning, match=r"setv.*'f'.*cannot be put back"):
        assert setv(Frozen()) == 5


def test_a_generator_drawn_from_is_advanced_by_a_hit_too(store: Any) -> None:
    import random

    @durably.task
    def draw(rng: Any) -> float:
        return float(rng.random())

    @durably.task
    def pick(r: random.Random) -> int:
        return r.randint(0, 10**6)

    first, second = np.random.default_rng(0), np.random.default_rng(0)
    assert draw(first) == draw(second)  # the second is a hit
    assert first.random() == second.random()  # and left as the body left the first
    a, b = random.Random(1), random.Random(1)
    assert pick(a) == pick(b) and a.random() == b.random()


def test_objects_inside_an_argument_are_updated_not_replaced(store: Any) -> None:
    """The caller's references to objects inside a changed argument (estimators in a list,
    a model in a config dict) see the body's changes after a hit or a replay too."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.tree import DecisionTreeClassifier

    rng = np.random.RandomState(0)
    x = rng.rand(80, 3)
    y = (x[:, 0] > 0.5).astype(int)

    @durably.task
    def fit_all(models: list[Any], x: Any, y: Any) -> int:
        for m in models:
            m.fit(x, y)
        return len(models)

    @durably.task
    def train(cfg: dict[str, Any]) -> int:
        cfg["model"].n = 7
        cfg["log"].append("trained")
        return 1

    def body() -> tuple[float, float, int, list[str], bool]:
        lr, dt = LogisticRegression(), DecisionTreeClassifier(random_state=0)
        fit_all([lr, dt], x, y)
        model, log = Plain(), []  # type: ignore[var-annotated]
        cfg = {"model": model, "log": log}
        train(cfg)
        return (lr.score(x, y), dt.score(x, y), getattr(model, "n", 0), log,
                cfg["model"] is model)

    @durably.entrypoint
    def job() -> tuple[float, float, int, list[str], bool]:
        return body()

    first = job()
    assert first[2:] == (7, ["trained"], True)
    assert job() == first  # replayed
    assert body() == first  # served from the cache


def test_an_array_array_argument_is_put_back(store: Any) -> None:
    import array

    @durably.task
    def use(o: Any, i: int) -> int:
        o.append(i)
        return i

    @durably.entrypoint
    def job() -> str:
        o = array.array("i")
        for i in range(3):
            use(o, i)
        return repr(o)

    assert job() == job() == "array('i', [0, 1, 2])"
