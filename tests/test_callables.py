"""Every callable a user would decorate: functools.partial and callable objects (issue #33,
point 9), and the repr of tasks and entrypoints."""

from __future__ import annotations

import asyncio
import functools
import pickle
from typing import Any

import pytest

import durably

CALLS: list[tuple[Any, ...]] = []


def scaled(factor: int, x: int, offset: int = 0) -> int:
    CALLS.append(("scaled", factor, x, offset))
    return factor * x + offset


async def ascaled(factor: int, x: int) -> int:
    CALLS.append(("ascaled", factor, x))
    return factor * x


class Scale:
    """A callable object configured by its attribute."""

    def __init__(self, factor: int) -> None:
        self.factor = factor

    def __call__(self, x: int) -> int:
        CALLS.append(("Scale", self.factor, x))
        return self.factor * x


class AsyncScale:
    def __init__(self, factor: int) -> None:
        self.factor = factor

    async def __call__(self, x: int) -> int:
        CALLS.append(("AsyncScale", self.factor, x))
        return self.factor * x


#: found by its name in this module: pickles by reference
double = durably.task(functools.partial(scaled, 2), name="double")


@pytest.fixture(autouse=True)
def _fresh_calls() -> None:
    CALLS.clear()


# -- functools.partial ---------------------------------------------------------------------
def test_partial_with_name_caches(store: Any) -> None:
    t = durably.task(functools.partial(scaled, 3), name="triple")
    assert t(2) == 6
    assert t(2) == 6
    assert CALLS == [("scaled", 3, 2, 0)]  # the second call is a hit
    assert t.explain(2).hit
    assert t.spec.identity == f"{__name__}:triple"


def test_partial_positional_and_keyword_calls_share_an_entry(store: Any) -> None:
    t = durably.task(functools.partial(scaled, 3), name="triple")
    assert t(2) == t(x=2) == t(2, offset=0) == 6
    assert len(CALLS) == 1
    assert t.cache_key(2) == t.cache_key(x=2)


def test_partial_other_bound_value_misses(store: Any) -> None:
    three = durably.task(functools.partial(scaled, 3), name="scaled_by")
    four = durably.task(functools.partial(scaled, 4), name="scaled_by")  # same identity
    assert three(2) == 6
    assert four(2) == 8
    assert len(CALLS) == 2
    assert three.cache_key(2) != four.cache_key(2)
    # a keyword bound value too, and a caller's value for it
    k1 = durably.task(functools.partial(scaled, 3, offset=1), name="offset")
    k2 = durably.task(functools.partial(scaled, 3, offset=2), name="offset")
    assert k1.cache_key(2) != k2.cache_key(2)
    assert k1(2, offset=5) == 11


def test_partial_bound_value_changed_in_place_misses(store: Any) -> None:
    def total(items: list[int], x: int) -> int:
        CALLS.append(("total", x))
        return sum(items) + x

    items = [1, 2]
    t = durably.task(functools.partial(total, items), name="total")
    assert t(1) == 4
    items.append(10)
    assert t(1) == 14  # never the result computed with [1, 2]
    assert len(CALLS) == 2


def test_nested_partial(store: Any) -> None:
    t = durably.task(functools.partial(functools.partial(scaled, 3), 2), name="six")
    assert t() == t(offset=0) == 6
    assert t(offset=1) == 7
    assert len(CALLS) == 2


def test_partial_of_a_task_is_a_task_calling_a_task(store: Any) -> None:
    inner = durably.task(scaled)
    t = durably.task(functools.partial(inner, 5), name="five")
    assert t(2) == t(2) == 10
    assert len(CALLS) == 1


def test_async_partial(store: Any) -> None:
    t = durably.task(functools.partial(ascaled, 3), name="atriple")
    assert t.spec.is_async

    async def main() -> list[int]:
        return [await t(2), await t(x=2)]

    assert asyncio.run(main()) == [6, 6]
    assert CALLS == [("ascaled", 3, 2)]


def test_partial_pickles_by_name_or_by_value(store: Any) -> None:
    assert pickle.loads(pickle.dumps(double)) is double
    t = durably.task(functools.partial(scaled, 7), name="not_a_module_name")
    copy = pickle.loads(pickle.dumps(t))
    assert copy.cache_key(1) == t.cache_key(1) and copy(1) == 7


# -- callable objects ----------------------------------------------------------------------
def test_callable_object_with_name_caches(store: Any) -> None:
    t = durably.task(Scale(3), name="scale")
    assert t(2) == t(x=2) == 6
    assert CALLS == [("Scale", 3, 2)]
    assert t.spec.identity == f"{__name__}:scale"


def test_callable_objects_configured_differently_do_not_share(store: Any) -> None:
    three = durably.task(Scale(3), name="scale")
    four = durably.task(Scale(4), name="scale")
    assert three(2) == 6
    assert four(2) == 8
    assert len(CALLS) == 2
    assert three.cache_key(2) != four.cache_key(2)


def test_callable_object_changed_in_place_misses(store: Any) -> None:
    obj = Scale(3)
    t = durably.task(obj, name="scale")
    assert t(2) == 6
    obj.factor = 5
    assert t(2) == 10  # never the result computed with factor 3
    obj.factor = 3
    assert t(2) == 6
    assert len(CALLS) == 2


def test_async_callable_object(store: Any) -> None:
    t = durably.task(AsyncScale(3), name="ascale")
    assert t.spec.is_async

    async def main() -> list[int]:
        return [await t(2), await t(2)]

    assert asyncio.run(main()) == [6, 6]
    assert len(CALLS) == 1


# -- a name is required ----------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["task", "entrypoint"])
@pytest.mark.parametrize("make", [lambda: functools.partial(scaled, 3), lambda: Scale(3)],
                         ids=["partial", "object"])
def test_missing_name_names_the_fix(kind: str, make: Any) -> None:
    decorator = getattr(durably, kind)
    with pytest.raises(durably.DefinitionError, match=r"needs a name.*Fix: .*name="):
        decorator(make())


# -- inside a run ----------------------------------------------------------------------------
def test_partial_task_is_a_journaled_step_that_replays(store: Any) -> None:
    t = durably.task(functools.partial(scaled, 3), name="triple")
    obj = durably.task(Scale(10), name="tenfold")

    @durably.entrypoint
    def pipeline(n: int) -> int:
        return t(n) + obj(n)

    run = pipeline.run(2)
    assert run.result == 26
    assert [(s.task, s.status) for s in run.steps] == [("triple", "ran"), ("tenfold", "ran")]
    again = pipeline.run(2)
    assert again.result == 26
    assert [s.status for s in again.steps] == ["replayed", "replayed"]
    assert len(CALLS) == 2


def test_entrypoint_of_partial_and_object(store: Any) -> None:
    def main(label: str, n: int) -> str:
        CALLS.append(("main", label, n))
        return f"{label}{n}"

    ep = durably.entrypoint(functools.partial(main, "a"), name="main_a")
    assert ep(1) == "a1"
    assert ep.run(1).result == "a1"

    class Main:
        def __call__(self, n: int) -> int:
            return n + 1

    ep2 = durably.entrypoint(Main(), name="main_obj")
    assert ep2.run(1).result == 2


# -- repr ------------------------------------------------------------------------------------
class Owner:
    @durably.task
    def method(self, x: int) -> int:
        return x

    @durably.entrypoint
    def main(self) -> int:
        return 1


def test_repr_names_the_task() -> None:
    assert repr(durably.task(scaled)) == f"<durably.Task '{__name__}.scaled'>"
    assert repr(double) == f"<durably.Task '{__name__}.double'>"
    assert repr(durably.task(Scale(2), name="s2")) == f"<durably.Task '{__name__}.s2'>"
    assert repr(durably.task(scaled, name="named")) == f"<durably.Task '{__name__}.named'>"
    assert repr(Owner.method) == f"<durably.Task '{__name__}.Owner.method'>"
    assert repr(Owner().method) == f"<durably.Task '{__name__}.Owner.method'>"
    assert repr(durably.entrypoint(scaled)) == f"<durably.Entrypoint '{__name__}.scaled'>"
    assert repr(Owner().main) == f"<durably.Entrypoint '{__name__}.Owner.main'>"
    ep = durably.entrypoint(functools.partial(scaled, 1), name="one")
    assert repr(ep) == f"<durably.Entrypoint '{__name__}.one'>"
