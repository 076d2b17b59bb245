"""The task call path and the run lifecycle, on every store implementation."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import inspect
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import entrypoint, task
from durably.testing import MemoryStore

from .conftest import run_script, script_env

pytestmark = pytest.mark.usefixtures("store")


class Counter:
    def __init__(self) -> None:
        self.calls: list[Any] = []

    def __call__(self, *args: Any) -> None:
        self.calls.append(args if len(args) != 1 else args[0])


# -- 1. binding ------------------------------------------------------------------------------
def test_positional_keyword_and_default_share_one_entry() -> None:
    seen = Counter()

    @task
    def f(x: int, y: int = 2, *, z: int = 3) -> int:
        seen(x)
        return x + y + z

    assert f(1) == f(x=1) == f(1, y=2) == f(1, 2, z=3) == f(z=3, y=2, x=1) == 6
    assert seen.calls == [1]
    assert f(1, y=5) == 9
    assert seen.calls == [1, 1]
    assert f.cache_key(1) == f.cache_key(x=1, y=2) != f.cache_key(1, 5)


def test_ignored_argument_is_left_out_of_the_key() -> None:
    seen = Counter()

    @task(ignore=("verbose",))
    def f(x: int, verbose: bool = False) -> int:
        seen(x)
        return x

    f(1, verbose=True)
    f(1, verbose=False)
    assert seen.calls == [1]


def test_outside_a_run_a_task_is_a_durable_memoized_function(store: Any) -> None:
    seen = Counter()

    @task
    def f(x: int) -> list[int]:
        seen(x)
        return [x]

    assert f(2) == [2] and f(2) == [2]
    assert seen.calls == [2]
    assert store.list_runs() == []


def test_types_that_compare_equal_do_not_share_entries() -> None:
    seen = Counter()

    @task
    def f(x: Any) -> str:
        seen(x)
        return repr(x)

    assert [f(1), f(1.0), f(True), f("1")] == ["1", "1.0", "True", "'1'"]
    assert len(seen.calls) == 4


# -- options -----------------------------------------------------------------------------------
def test_version_replaces_the_code_fingerprint() -> None:
    def make(body: int) -> Any:
        @task(name="versioned", version="1")
        def f(x: int) -> int:
            return x + body

        return f

    first, second = make(1), make(100)
    assert first(1) == 2
    assert second(1) == 2  # same name and version: the stored result is kept across edits
    assert first.cache_key(1) == second.cache_key(1)


def test_cache_false_is_never_served_from_the_cache_but_journaled_in_a_run() -> None:
    seen = Counter()

    @task(cache=False)
    def notify(x: int) -> int:
        seen(x)
        return x

    notify(1)
    notify(1)
    assert seen.calls == [1, 1]

    @entrypoint
    def pipeline() -> int:
        return notify(5) + notify(5)

    assert pipeline() == 10
    assert seen.calls == [1, 1, 5, 5]  # two calls in the run: two steps (occurrence 0 and 1)
    run = pipeline.run()
    assert run.result == 10
    assert seen.calls == [1, 1, 5, 5]
    assert [s.status for s in run.steps] == ["replayed", "replayed"]


# -- runs --------------------------------------------------------------------------------------
def test_rerun_replays_finished_steps_and_handle_reports_them() -> None:
    seen = Counter()

    @task
    def square(x: int) -> int:
        seen(x)
        return x * x

    @entrypoint
    def pipeline(n: int) -> int:
        return sum(square(i) for i in range(n))

    first = pipeline.run(4)
    assert (first.status, first.result, first.attempt) == ("finished", 14, 1)
    assert [s.status for s in first.steps] == ["ran"] * 4
    assert all(s.task == "test_rerun_replays_finished_steps_and_handle_reports_them.<locals>."
               "square" for s in first.steps)
    assert all(s.ended >= s.started and s.duration >= 0 for s in first.steps)
    second = pipeline.run(4)
    assert second.id == first.id and second.attempt == 2
    assert [s.status for s in second.steps] == ["replayed"] * 4
    assert seen.calls == [0, 1, 2, 3]
    assert "4 replayed" in second.summary() and "reran a finished run" in second.summary()
    other = pipeline.run(5)
    assert other.id != first.id
    assert [s.status for s in other.steps] == ["cached"] * 4 + ["ran"]
    assert seen.calls == [0, 1, 2, 3, 4]


def test_fresh_starts_a_new_run_and_plain_rerun_continues_the_newest() -> None:
    @entrypoint
    def pipeline(x: int) -> int:
        return x

    a = pipeline.run(1)
    b = pipeline.run(1, fresh=True)
    assert b.id != a.id and b.attempt == 1
    c = pipeline.run(1)
    assert c.id == b.id and c.attempt == 2


def test_get_run_and_list_runs(store: Any) -> None:
    @entrypoint(name="pipe")
    def pipeline(x: int) -> int:
        return x * 10

    r1 = pipeline.run(1)
    r2 = pipeline.run(2, run_id="my-run")
    got = durably.get_run("my-run", store=store)
    assert (got.id, got.status, got.result, got.name) == ("my-run", "finished", 20, "pipe")
    assert [r.id for r in durably.list_runs()] == [r2.id, r1.id]
    assert [r.id for r in durably.list_runs(pipeline)] == [r2.id, r1.id]
    assert [r.id for r in durably.list_runs("pipe")] == [r2.id, r1.id]
    assert durably.list_runs("other") == []
    with pytest.raises(durably.NotFoundError, match="no run 'nope'") as info:
        durably.get_run("nope")
    assert isinstance(info.value, LookupError)
    assert "PosixPath" not in str(info.value)  # the path as it reads: '/tmp/...'


def test_get_run_takes_the_unique_start_of_an_id_as_the_cli_does(store: Any) -> None:
    @entrypoint
    def pipeline(x: int) -> int:
        return x * 10

    pipeline.run(1, run_id="batch-alpha-1")
    pipeline.run(2, run_id="batch-alpha-2")
    pipeline.run(3, run_id="batch-beta")
    assert durably.get_run("batch-b", store=store).id == "batch-beta"
    assert durably.get_run("batch-alpha-2", store=store).result == 20
    with pytest.raises(durably.NotFoundError, match="ambiguous") as info:
        durably.get_run("batch-alpha", store=store)
    assert "batch-alpha-1" in str(info.value) and "batch-alpha-2" in str(info.value)
    assert "batch-beta" not in str(info.value) and "Fix: give more of the id" in str(info.value)
    with pytest.raises(durably.NotFoundError, match=r"no run 'batch-gamma'.*no run id starts"):
        durably.get_run("batch-gamma", store=store)
    with pytest.raises(durably.NotFoundError, match="no run ''"):  # never "any run"
        durably.get_run("", store=store)


def test_explicit_run_id_is_bound_to_its_entrypoint_and_arguments() -> None:
    @entrypoint
    def one(x: int) -> int:
        return x

    @entrypoint
    def two(x: int) -> int:
        return x

    one.run(1, run_id="r1")
    with pytest.raises(durably.RunStateError, match="belongs to entrypoint"):
        two.run(1, run_id="r1")
    with pytest.raises(durably.RunStateError, match="other arguments"):
        one.run(2, run_id="r1")
    with pytest.raises(durably.RunStateError, match="already exists"):
        one.run(1, run_id="r1", fresh=True)
    assert one.run(1, run_id="r1").attempt == 2


def test_nested_tasks_are_steps_under_their_parent() -> None:
    seen = Counter()

    @task
    def inner(x: int) -> int:
        seen(("inner", x))
        return x + 1

    @task
    def outer(x: int) -> int:
        seen(("outer", x))
        return inner(x) + inner(x + 10)

    @entrypoint
    def pipeline() -> int:
        return outer(1)

    run = pipeline.run()
    assert run.result == 2 + 12
    by_task = {s.task.rpartition(".")[2]: s for s in run.steps}
    steps = run.steps
    assert [s.task.rpartition(".")[2] for s in steps] == ["outer", "inner", "inner"]
    assert steps[1].parent_id == steps[2].parent_id == by_task["outer"].step_id
    assert steps[0].parent_id is None


def test_entrypoint_called_inside_a_run_runs_inline() -> None:
    @task
    def t(x: int) -> int:
        return x

    @entrypoint
    def child(x: int) -> int:
        return t(x)

    @entrypoint
    def parent() -> int:
        return child(1) + child(2)

    run = parent.run()
    assert run.result == 3
    assert len(run.steps) == 2
    assert len(durably.list_runs()) == 1


# -- 6. exceptions -----------------------------------------------------------------------------
def test_exception_propagates_unchanged_is_journaled_never_cached_and_retried() -> None:
    seen = Counter()
    fail = {"on": True}

    class Boom(Exception):
        pass

    @task
    def ok(x: int) -> int:
        seen(("ok", x))
        return x

    @task
    def flaky(x: int) -> int:
        seen(("flaky", x))
        if fail["on"]:
            raise Boom(f"bad {x}")
        return x * 100

    @entrypoint
    def pipeline() -> int:
        return ok(1) + flaky(2)

    with pytest.raises(Boom, match="bad 2") as info:
        pipeline()
    assert type(info.value) is Boom and info.value.args == ("bad 2",)
    run = durably.list_runs(pipeline)[0]
    assert run.status == "failed" and "Boom" in (run.error or "")
    assert [(s.status, s.error) for s in run.steps] == [("ran", None), ("failed", "Boom('bad 2')")]
    with pytest.raises(durably.RunStateError, match="is failed"):
        _ = run.result
    with pytest.raises(Boom):
        flaky(2)  # not cached as a result: executes again
    fail["on"] = False
    again = pipeline.run()
    assert again.result == 201 and again.id == run.id
    assert [s.status for s in again.steps] == ["replayed", "ran"]
    assert seen.calls == [("ok", 1), ("flaky", 2), ("flaky", 2), ("flaky", 2)]


# -- 8. serialization --------------------------------------------------------------------------
def test_unpicklable_result_is_a_failed_step_and_nothing_is_cached(store: Any) -> None:
    @task
    def make_lock() -> Any:
        return threading.Lock()

    @entrypoint
    def pipeline() -> Any:
        return make_lock()

    with pytest.raises(durably.SerializationError, match="make_lock") as info:
        pipeline()
    assert "lock" in str(info.value)
    run = durably.list_runs()[0]
    [step] = run.steps
    assert step.status == "failed" and "SerializationError" in (step.error or "")
    assert store.cache_get(make_lock.cache_key()) is None


@pytest.mark.parametrize(
    "value", [threading.Lock(), (i for i in range(3))], ids=["lock", "generator"]
)
def test_undigestable_argument_names_the_argument_and_the_way_out(value: Any) -> None:
    @task
    def use(config: int, handle: Any) -> int:
        return config

    with pytest.raises(durably.SerializationError) as info:
        use(1, value)
    msg = str(info.value)
    assert "'handle'" in msg and "ignore=" in msg and "use" in msg

    @task(ignore=("handle",))
    def use_ignored(config: int, handle: Any) -> int:
        return config

    assert use_ignored(1, value) == 1


def test_generator_result_is_refused() -> None:
    @task
    def gen() -> Any:
        return (i for i in range(3))

    with pytest.raises(durably.SerializationError, match="generator"):
        gen()


# -- 9. mutation -------------------------------------------------------------------------------
def test_mutating_a_returned_object_never_changes_the_cache() -> None:
    @task
    def make() -> dict[str, list[int]]:
        return {"xs": [1, 2]}

    first = make()
    first["xs"].append(3)
    second = make()
    assert second == {"xs": [1, 2]}
    second["xs"].clear()
    assert make() == {"xs": [1, 2]}

    @entrypoint
    def pipeline() -> dict[str, list[int]]:
        out = make()
        out["xs"].append(99)
        return out

    assert pipeline() == {"xs": [1, 2, 99]}
    assert pipeline() == {"xs": [1, 2, 99]}


# -- 7. identity -------------------------------------------------------------------------------
def test_same_name_in_two_modules_never_shares_entries(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    source = "import durably\n\n@durably.task\ndef f(x):\n    return __name__\n"
    for mod in ("mod_a_same", "mod_b_same"):
        (tmp_path / f"{mod}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    a = importlib.import_module("mod_a_same")
    b = importlib.import_module("mod_b_same")
    try:
        assert a.f.cache_key(1) != b.f.cache_key(1)
        assert (a.f(1), b.f(1)) == ("mod_a_same", "mod_b_same")
    finally:
        sys.modules.pop("mod_a_same")
        sys.modules.pop("mod_b_same")


# -- methods -----------------------------------------------------------------------------------
def test_methods_classmethods_and_staticmethods() -> None:
    seen = Counter()

    @dataclasses.dataclass
    class Model:
        k: int

        @task
        def predict(self, x: int) -> int:
            seen(("predict", self.k, x))
            return self.k * x

        @task
        @classmethod
        def build(cls, k: int) -> int:
            seen(("build", k))
            return k

        @task
        @staticmethod
        def helper(x: int) -> int:
            seen(("helper", x))
            return -x

    assert Model(2).predict(3) == 6 and Model(2).predict(x=3) == 6
    assert Model(3).predict(3) == 9  # self is part of the inputs
    assert Model.predict(Model(2), 3) == 6
    assert Model.build(4) == Model.build(k=4) == 4
    assert Model.helper(5) == Model(1).helper(5) == -5
    assert seen.calls == [("predict", 2, 3), ("predict", 3, 3), ("build", 4), ("helper", 5)]


def test_decorated_function_keeps_signature_doc_and_wrapped() -> None:
    def original(a: int, b: str = "x") -> str:
        """Docs."""
        return b * a

    t = task(original)
    e = entrypoint(original)
    for wrapper in (t, e):
        assert wrapper.__wrapped__ is original
        assert wrapper.__doc__ == "Docs."
        assert wrapper.__name__ == "original"
        assert inspect.signature(wrapper) == inspect.signature(original)


# -- 10. async ---------------------------------------------------------------------------------
def test_async_tasks_follow_the_same_rules() -> None:
    seen = Counter()
    fail = {"on": True}

    @task
    async def fetch(x: int, scale: int = 1) -> list[int]:
        seen(("fetch", x))
        await asyncio.sleep(0)
        return [x * scale]

    @task
    async def flaky(x: int) -> int:
        seen(("flaky", x))
        if fail["on"]:
            raise ValueError("no")
        return x

    @task(cache=False)
    async def side(x: int) -> int:
        seen(("side", x))
        return x

    @entrypoint
    async def pipeline(n: int) -> list[Any]:
        parts = await asyncio.gather(*(fetch(i) for i in range(n)))
        await side(1)
        return [*parts, await flaky(7)]

    assert inspect.iscoroutinefunction(fetch) and inspect.iscoroutinefunction(pipeline)
    with pytest.raises(ValueError, match="no"):
        asyncio.run(pipeline(2))
    assert asyncio.run(fetch(0)) == asyncio.run(fetch(x=0, scale=1)) == [0]
    fail["on"] = False
    run = asyncio.run(pipeline.run(2))
    assert run.result == [[0], [1], 7]
    assert sorted(s.status for s in run.steps) == ["ran", "replayed", "replayed", "replayed"]
    run.result[0].append(5)
    assert asyncio.run(fetch(0)) == [0]
    assert seen.calls.count(("side", 1)) == 1
    assert seen.calls.count(("fetch", 0)) == 1 and seen.calls.count(("flaky", 7)) == 2

    @task
    async def bad() -> Any:
        return threading.Lock()

    with pytest.raises(durably.SerializationError, match="bad"):
        asyncio.run(bad())


def test_tasks_in_user_threads_join_the_run_with_or_without_the_context() -> None:
    """Without the context, a pool's threads started inside the run join it too (see
    test_foreign_threads.py)."""
    import contextvars
    from concurrent.futures import ThreadPoolExecutor

    @task
    def work(x: int) -> int:
        return x * 2

    @entrypoint
    def pipeline(with_context: bool) -> list[int]:
        with ThreadPoolExecutor(2) as pool:
            if with_context:
                futures = [pool.submit(contextvars.copy_context().run, work, i) for i in range(4)]
            else:
                futures = [pool.submit(work, i + 10) for i in range(4)]
            return [f.result() for f in futures]

    joined = pipeline.run(True)
    assert joined.result == [0, 2, 4, 6]
    assert sorted(s.status for s in joined.steps) == ["ran"] * 4
    alone = pipeline.run(False)
    assert alone.result == [20, 22, 24, 26]
    assert sorted(s.status for s in alone.steps) == ["ran"] * 4
    assert work.explain(10).hit  # cached, as any step


def test_explain_cache_key_and_run_on_bound_methods() -> None:
    class K:
        def __init__(self, k: int) -> None:
            self.k = k

        def __reduce__(self) -> Any:
            return (K, (self.k,))

        @task
        def meth(self, x: int) -> int:
            return self.k + x

        @task
        @classmethod
        def cm(cls, x: int) -> int:
            return x

        @entrypoint
        def ep(self, x: int) -> int:
            return self.meth(x)

    k = K(1)
    assert not k.meth.explain(2).hit
    assert k.meth(2) == 3
    assert k.meth.explain(2).hit and K.meth.explain(k, 2).hit
    assert k.meth.cache_key(2) == K.meth.cache_key(k, 2) != K(5).meth.cache_key(2)
    assert K.cm(1) == 1 and K.cm.explain(1).hit and k.cm.explain(1).hit
    run = k.ep.run(4)
    assert run.result == 5 and [s.status for s in run.steps] == ["ran"]
    assert K(9).ep.run(4).result == 13  # self is part of the run's inputs


def test_tasks_pickle_by_reference_for_worker_processes(tmp_path: Path) -> None:
    import pickle

    (tmp_path / "work_mod.py").write_text(
        "import durably\n\n@durably.task\ndef square(x):\n    return x * x\n\n"
        "@durably.entrypoint\ndef ep(n):\n    return [square(i) for i in range(n)]\n"
    )
    script = tmp_path / "pool.py"
    script.write_text(
        "import copy, pickle\nfrom concurrent.futures import ProcessPoolExecutor\n"
        "import work_mod\n"
        "assert pickle.loads(pickle.dumps(work_mod.square)) is work_mod.square\n"
        "assert copy.copy(work_mod.ep) is work_mod.ep\n"
        "if __name__ == '__main__':\n"
        "    with ProcessPoolExecutor(2) as pool:\n"
        "        print(list(pool.map(work_mod.square, range(5))))\n"
    )
    done = run_script(script, script_env(tmp_path / "store"))
    assert done.stdout.strip() == "[0, 1, 4, 9, 16]"

    @task
    def local(x: int) -> int:
        return x

    with pytest.raises(pickle.PicklingError, match="defined inside a function"):
        pickle.dumps(local)


def test_bound_task_methods_pickle_as_their_object_s_attribute(tmp_path: Path) -> None:
    """``obj.method`` of a task method pickles as a bound method does (the object by value,
    the method by name): a process pool maps it, and its cache entries are the ones the
    parent process wrote (the same object digests alike in every process)."""

    (tmp_path / "model_mod.py").write_text(
        "import dataclasses, os\nimport durably\n\n"
        "@dataclasses.dataclass\nclass Model:\n    w: float\n\n"
        "    @durably.task\n    def predict(self, x):\n"
        "        os.write(1, f'executed {self.w} {x}\\n'.encode())  # one write: no interleaving\n"
        "        return self.w * x\n\n"
        "    @durably.task\n    @classmethod\n    def unit(cls, x):\n        return x\n\n"
        "    @durably.entrypoint\n    def score(self, n):\n"
        "        return sum(self.predict(i) for i in range(n))\n"
    )
    script = tmp_path / "pool.py"
    script.write_text(
        "import copy, pickle, sys\nfrom concurrent.futures import ProcessPoolExecutor\n"
        "from model_mod import Model\n"
        "m = Model(2.0)\n"
        "again = pickle.loads(pickle.dumps(m.predict))\n"
        "assert again.__self__ == m and again.__self__ is not m\n"
        "assert pickle.loads(pickle.dumps(Model.unit))(5) == 5\n"
        "assert pickle.loads(pickle.dumps(m.score)).run(2).result == 2.0\n"
        "if __name__ == '__main__':\n"
        "    m.predict(1)\n"
        "    with ProcessPoolExecutor(2) as pool:\n"
        "        print(list(pool.map(m.predict, [1, 2, 3])))\n"
        "    print(again.explain(2).hit, again.explain(1).hit)\n"
    )
    done = run_script(script, script_env(tmp_path / "store"))
    lines = done.stdout.split("\n")
    assert "[2.0, 4.0, 6.0]" in lines and "True True" in lines
    # each input executed once, across the pool's processes (x=1 in the parent first)
    executed = sorted(line for line in lines if line.startswith("executed"))
    assert executed == ["executed 2.0 0", "executed 2.0 1", "executed 2.0 2",
                        "executed 2.0 3"], done.stdout


def test_a_script_s_tasks_keep_their_identity_in_spawned_workers(tmp_path: Path) -> None:
    """A worker process multiprocessing spawns runs the script again as __mp_main__: its
    tasks are the script's (the same identity and cache keys as in the parent), so a pool
    shares the parent's cache entries."""

    script = tmp_path / "spawned.py"
    script.write_text(
        "import multiprocessing as mp\nfrom concurrent.futures import ProcessPoolExecutor\n"
        "import durably\n\n"
        "@durably.task\ndef plain(x):\n    return x * 2\n\n"
        "def keys(x):\n    return plain.spec.identity, plain.cache_key(x), plain.explain(x).hit\n\n"
        "if __name__ == '__main__':\n"
        "    plain(100)\n"
        "    print('parent', keys(100))\n"
        "    for method in ('spawn', 'forkserver'):\n"
        "        with ProcessPoolExecutor(1, mp_context=mp.get_context(method)) as pool:\n"
        "            print(method, pool.submit(keys, 100).result())\n"
    )
    done = run_script(script, script_env(tmp_path / "store"))
    lines = dict(line.split(" ", 1) for line in done.stdout.strip().splitlines())
    assert "'__main__.spawned:plain'" in lines["parent"] and "True)" in lines["parent"]
    assert lines["spawn"] == lines["forkserver"] == lines["parent"]


def test_a_script_s_tasks_stay_tasks_through_cloudpickle_and_joblib(tmp_path: Path) -> None:
    """cloudpickle copies functions of __main__ by value, and took a task for the function
    it wraps: handed to joblib's workers it ran there undecorated (never cached), and an
    instance of a script's class coming back stripped the class's task methods in the
    parent. A script's task now travels as itself (rebuilt with its identity and code
    where it is not defined), so the workers' calls are cached in the shared store."""

    script = tmp_path / "par.py"
    script.write_text(
        "import os\nimport cloudpickle\nimport durably\n"
        "from joblib import Parallel, delayed\n\n"
        "class Model:\n    def __init__(self, w):\n        self.w = w\n\n"
        "    @durably.task\n    def predict(self, x):\n"
        "        open(f'predict-{x}-{os.getpid()}', 'w').close()\n        return self.w * x\n\n"
        "@durably.task\ndef square(x):\n"
        "    open(f'square-{x}-{os.getpid()}', 'w').close()\n    return x * x\n\n"
        "def make(w):\n    return Model(w)\n\n"
        "@durably.task\ndef fact(n):\n"
        "    open(f'fact-{n}-{os.getpid()}', 'w').close()\n"
        "    return 1 if n <= 1 else n * fact(n - 1)\n\n"
        "class C:\n    @durably.task\n    @staticmethod\n    def twice(x):\n"
        "        open(f'twice-{x}-{os.getpid()}', 'w').close()\n        return 2 * x\n\n"
        "@durably.entrypoint\ndef ep(x):\n    return x + 1\n\n"
        "if __name__ == '__main__':\n"
        "    print('SQUARES', Parallel(n_jobs=2)(delayed(square)(i) for i in range(4)))\n"
        "    print('FACTS', [Parallel(n_jobs=2)(delayed(fact)(n) for n in (k,)) for k in (3, 4)])\n"
        "    print('TWICE', Parallel(n_jobs=2)(delayed(C.twice)(x) for x in (3, 4)))\n"
        "    print('EP', Parallel(n_jobs=2)(delayed(ep)(x) for x in (3, 4)))\n"
        "    models = Parallel(n_jobs=2)(delayed(make)(w) for w in (1, 2))\n"
        "    cloudpickle.loads(cloudpickle.dumps(Model(3)))\n"
        "    print('KEPT', type(Model.__dict__['predict']).__name__, models[1].predict(5))\n"
        "    print('HIT', square.explain(3).hit)\n"
    )
    def run() -> str:
        return run_script(script, script_env(tmp_path / "store"), timeout=180).stdout

    def executed(kind: str) -> list[str]:  # each execution, without the process
        return sorted(p.name.rsplit("-", 1)[0] for p in tmp_path.glob(f"{kind}-*"))

    first = run()
    assert "SQUARES [0, 1, 4, 9]" in first and "KEPT Task 10" in first and "HIT True" in first
    assert "FACTS [[6], [24]]" in first and "TWICE [6, 8]" in first and "EP [4, 5]" in first
    assert executed("square") == ["square-0", "square-1", "square-2", "square-3"]
    assert executed("predict") == ["predict-5"]
    # a recursive task: each n executed once across the workers (fact(4) in a worker finds
    # fact(3) in the cache: the inner calls are the task too); a staticmethod task is one
    assert len(set(executed("fact"))) == len(executed("fact")) == 4
    assert executed("twice") == ["twice-3", "twice-4"]
    second = run()  # every call a cache hit: nothing executes again
    assert second == first
    assert len(executed("square")) == 4 and len(executed("fact")) == 4
    assert len(executed("predict")) == 1 and len(executed("twice")) == 2


def test_a_script_s_task_kept_in_a_journaled_value_is_today_s_task_on_resume(
        tmp_path: Path) -> None:
    """A task of a script inside a step's result (pickled by name, or with cloudpickle
    when the value needs it) is, when the run resumes after an edit, the task as the
    script defines it now: never a frozen copy of the old code."""
    import subprocess

    script = tmp_path / "job.py"
    source = (
        "import os\nimport durably\n\n"
        "@durably.task\ndef lookup(i):\n    return i + 1\n\n"
        "@durably.task(cache=False)\ndef choose():\n"
        "    return {'fn': lookup, 'other': lambda: 0}  # (a lambda: cloudpickle)\n\n"
        "@durably.entrypoint\ndef ep():\n    fn = choose()['fn']\n"
        "    if os.environ.get('CRASH'):\n        raise SystemExit('crash')\n"
        "    return fn(1), fn is lookup\n\n"
        "if __name__ == '__main__':\n    print(ep())\n")
    script.write_text(source)
    env = script_env(tmp_path / "store")
    crashed = subprocess.run([sys.executable, str(script)], cwd=tmp_path,
                             env={**env, "CRASH": "1"}, capture_output=True, text=True,
                             timeout=120)
    assert crashed.returncode != 0
    script.write_text(source.replace("i + 1", "i + 100"))
    assert run_script(script, env).stdout.strip() == "(101, True)"


def test_a_recursive_script_task_shares_its_entries_with_process_workers(
        tmp_path: Path) -> None:
    """A task that calls itself names itself in its fingerprint: the same whether the
    script runs as __main__ or again in a worker (__mp_main__), so a worker serves the
    calls the parent made from the cache."""

    script = tmp_path / "rec.py"
    script.write_text(
        "import os\nimport durably\n\n"
        "@durably.task\ndef fact(n):\n    print('EXEC', n, flush=True)\n"
        "    return 1 if n <= 1 else n * fact(n - 1)\n\n"
        "if __name__ == '__main__':\n    fact(3)\n"
        "    print(fact.map([4], executor='process', progress=False))\n")
    done = run_script(script, script_env(tmp_path / "store"))
    assert done.stdout.split() == ["EXEC", "3", "EXEC", "2", "EXEC", "1", "EXEC", "4", "[24]"]


def test_a_run_in_progress_in_another_thread_is_busy() -> None:
    started, release = threading.Event(), threading.Event()

    @entrypoint
    def slow(x: int) -> int:
        started.set()
        release.wait(30)
        return x

    worker = threading.Thread(target=slow, args=(1,))
    worker.start()
    try:
        assert started.wait(30)
        with pytest.raises(durably.RunStateError, match="being executed in this process"):
            slow(1)
    finally:
        release.set()
        worker.join(30)
    assert slow(1) == 1  # the lease was released
    assert slow(2) == 2


def test_replay_reads_ahead_in_journal_order_with_small_and_large_results(store: Any) -> None:
    calls: list[int] = []

    @task
    def make(i: int) -> bytes:
        calls.append(i)
        return bytes([i % 256]) * (100_000 if i % 7 == 0 else 10)  # some over the read-ahead

    @entrypoint
    def pipeline(n: int) -> list[bytes]:
        return [make(i) for i in range(n)]

    first = pipeline.run(1_200).result
    again = pipeline.run(1_200)
    assert again.result == first and calls == list(range(1_200))
    assert again.counts()["replayed"] == 1_200
    # out of order (another branch first): still found
    @entrypoint
    def reversed_pipeline(n: int) -> list[bytes]:
        return [make(i) for i in reversed(range(n))]

    reversed_pipeline(50)
    assert reversed_pipeline(50) == [make(i) for i in reversed(range(50))]


def test_entrypoint_parameters_cannot_shadow_the_run_options() -> None:
    for name in ("fresh", "run_id"):
        with pytest.raises(durably.DefinitionError, match=f"named '{name}'.*rename"):
            entrypoint(eval(f"lambda {name}=None: {name}"))


def test_queued_cache_writes_survive_a_failed_flush(monkeypatch: pytest.MonkeyPatch) -> None:
    """A flush that fails (a full disk) puts the run's queued cache writes back: the attempt's
    end, or a later flush, writes them (before, they were gone for good)."""
    from durably._runtime.context import RunContext
    from durably._store.lease import me

    store = MemoryStore()
    ctx = RunContext("r", store, 1, me())
    ctx.cache_later("k1", b"v1", None)
    put = store.cache_put_many
    monkeypatch.setattr(store, "cache_put_many", lambda items: (_ for _ in ()).throw(
        OSError(28, "No space left on device")))
    with pytest.raises(OSError):
        ctx.flush_cache()
    monkeypatch.setattr(store, "cache_put_many", put)
    ctx.flush_cache()
    assert store.cache_get("k1") == b"v1"


def test_a_run_executing_in_this_process_reads_as_running(store: Any) -> None:
    seen: list[str] = []
    handles: list[durably.Run[int]] = []

    @entrypoint
    def job() -> int:
        (run,) = durably.list_runs(job, store=store)
        seen.append(run.status)
        handles.extend([*durably.list_runs(job, store=store), run])
        return 1

    done = job.run()
    assert seen == ["running"] and done.status == "finished" and done.resumed_from is None
    assert handles[0].result == 1  # read while running: read again, not "crashed"
    assert handles[1].status == "finished"
    store.put_run(dataclasses.replace(store.find_run(done.id), status="running"))
    # "running" in the journal, no attempt holds the lease: crashed, and resumed as such
    assert durably.get_run(done.id, store=store).status == "crashed"
    again = job.run()
    assert again.resumed_from == "crashed" and seen == ["running", "running"]
    assert "process had died" in again.summary()
    starts = [e.status for e in again.events() if e.kind == "run_started"]
    assert starts == ["new", "crashed"]  # as the live stream said


def test_a_run_between_attempts_never_reads_as_crashed(store: Any) -> None:
    """Its attempts end (the final status written, the lease released) and begin while it
    is read from another thread: a handle read before must never say "crashed"."""
    stop = threading.Event()
    bad: list[str] = []

    @task
    def one(i: int) -> int:
        return i

    @entrypoint
    def job() -> int:
        return one(1)

    run_id = job.run().id

    def watch() -> None:
        while not stop.is_set():
            run = durably.get_run(run_id, store=store)
            if run.status == "crashed":
                bad.append(f"attempt {run.attempt}")

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for _ in range(300):
            job.run()
    finally:
        stop.set()
        watcher.join()
    assert bad == []


def test_a_step_that_ends_after_its_attempt_did_is_still_journaled(store: Any) -> None:
    """A step in a thread the user started with the run's context that ends after the
    entrypoint raised is journaled as before (its run was not taken over), so the rerun
    replays it instead of repeating its side effect."""
    import contextvars

    release, started, executed = threading.Event(), threading.Event(), []
    threads: list[threading.Thread] = []

    @task(cache=False)
    def charge(x: int) -> int:
        started.set()
        release.wait(10)
        executed.append(x)
        return x

    @entrypoint
    def job() -> int:
        thread = threading.Thread(target=contextvars.copy_context().run, args=(charge, 1))
        thread.start()
        threads.append(thread)
        # (charge has begun: a step that starts after its entrypoint failed is refused, as
        # the run stops its running calls at their next step boundary; the second time it
        # is replayed, without executing, before the entrypoint fails)
        if len(threads) == 1:
            started.wait(10)
        else:
            thread.join(10)
        raise ValueError("fails while charge runs")

    with pytest.raises(ValueError):
        job()
    release.set()
    threads[0].join(10)
    with pytest.raises(ValueError):
        job()
    threads[1].join(10)
    assert executed == [1]  # replayed the second time


def test_a_step_called_long_after_its_attempt_ended_runs_and_is_journaled(store: Any) -> None:
    """A thread the user started with the run's context calls a task after the entrypoint
    returned, past the lease's renewal time: the released lease is not renewed (nor taken
    for lost), so the task runs and is journaled (before: an internal StopRun)."""
    import contextvars

    from durably._runtime.context import current_run

    go, executed, contexts = threading.Event(), [], []
    threads: list[threading.Thread] = []

    @task(cache=False)
    def charge(x: int) -> int:
        executed.append(x)
        return x

    def later() -> None:
        go.wait(10)
        charge(1)

    @entrypoint
    def job() -> int:
        contexts.append(current_run.get())
        thread = threading.Thread(target=contextvars.copy_context().run, args=(later,))
        thread.start()
        threads.append(thread)
        return 0

    assert job() == 0
    contexts[0].renew_at = 0.0  # as if 30 s had passed: the next task call would renew
    go.set()
    threads[0].join(10)
    assert executed == [1]
    assert [s.status for s in durably.list_runs(job)[0].steps] == ["ran"]


def test_an_attempt_releases_its_lease_only_once_its_final_status_is_written(
        store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """In this order a store without transactions (MemoryStore) never shows a run released
    but still "running", which reads as crashed (the race the test above samples)."""
    seen: list[str] = []
    release = store.release_run

    def release_run(run_id: str, owner: Any) -> Any:
        seen.append(store.find_run(run_id).status)
        return release(run_id, owner)

    monkeypatch.setattr(store, "release_run", release_run)

    @entrypoint
    def job(n: int) -> int:
        return n

    assert job(3) == 3
    assert seen == ["finished"]


def test_cheap_steps_cache_entries_are_written_before_a_slow_step_executes(
        store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    import durably._runtime.step

    # a step is slow from 0.2 s (not 10 ms: a loaded machine never makes a cheap one slow)
    monkeypatch.setattr(durably._runtime.step, "_WRITE_THROUGH", 0.2)
    seen: list[tuple[str, list[bool]]] = []

    def written(i: int) -> list[bool]:
        return [store.cache_get(cheap.cache_key(j)) is not None for j in range(i)]

    @task(version="1")  # (its closure holds the store: no fingerprint)
    def cheap(i: int) -> int:
        seen.append(("cheap", written(i)))
        return i

    @task(version="1")
    def slow(n: int) -> int:
        seen.append(("slow", written(n)))
        time.sleep(0.25)  # (writes its own entry at once)
        return n

    @entrypoint
    def job(base: int, n: int) -> int:
        return (sum(cheap(i) for i in range(base, base + n)) + slow(base + n)
                + sum(cheap(i) for i in range(base + n, base + 2 * n)))

    job(100, 2)  # (a first call may be slow: opening the cache)
    seen.clear()
    job(0, 3)
    # cheap steps still batch their writes (but a task's first one in an attempt, written
    # at once with its key record: see keep_finished); before the slow one executes, they
    # are written
    assert seen == [("cheap", []), ("cheap", [True]), ("cheap", [True, False]),
                    ("slow", [True, True, True]), ("cheap", [True, True, True]),
                    ("cheap", [True, True, True, False]),
                    ("cheap", [True, True, True, False, False])]


def test_no_lease_thread_is_left_behind_a_run(store: Any) -> None:
    """The thread renewing leases ends soon after the last attempt (none is left for a
    later fork() to inherit), and starts again with the next run."""
    import time

    @entrypoint
    def job() -> list[str]:
        return [t.name for t in threading.enumerate()]

    def renewing() -> bool:
        return any(t.name == "durably-lease" for t in threading.enumerate())

    assert "durably-lease" in job()
    deadline = time.monotonic() + 10
    while renewing():
        assert time.monotonic() < deadline, "the lease's thread outlived the run"
        time.sleep(0.05)
    assert "durably-lease" in job.run(run_id="again").result


def _lease_taken_by_another_host(store: Any, run_id: str) -> None:
    """The run's lease now another host's (a takeover), its heartbeat fresh."""
    import time

    from durably._store.lease import me

    other = dataclasses.replace(me(), host="elsewhere", heartbeat=time.time())
    if isinstance(store, durably.PostgresStore):  # (its heartbeat on the server's clock)
        store._write("take over", store._sql(
            "UPDATE {s}.leases SET host = %s, token = %s, heartbeat = now() WHERE run_id = %s"),
            (other.host, other.token, run_id))
    elif not isinstance(store, durably.DiskStore):  # (MemoryStore, MinimalStore)
        store._leases[run_id] = other
    else:
        store._db().execute("UPDATE leases SET host=?, token=?, heartbeat=? WHERE run_id=?",
                            (other.host, other.token, other.heartbeat, run_id))


@pytest.mark.parametrize("when", ["during_a_step", "after_the_steps", "before_a_step",
                                  "after_the_steps_large"])
def test_an_attempt_whose_lease_was_taken_over_never_journals_its_end(
        store: Any, when: str) -> None:
    """Another process took the run over (its lease replaced, its record the new
    attempt's) while this attempt executed: the attempt raises RunStateError, and the run's
    record stays the new attempt's. Taken over during a step, that step's record is not
    journaled (the other attempt executes it again: a late record would be replayed instead
    of its own) and nothing after it runs; found by a renewal before a step, that step does
    not start; after the last step, the end finds it. Finished steps stay journaled."""

    from durably._runtime.context import current_run

    executed: list[int] = []

    def take_over() -> None:
        ctx = current_run.get()
        assert ctx is not None
        _lease_taken_by_another_host(store, ctx.run_id)
        record = store.find_run(ctx.run_id)
        store.put_run(dataclasses.replace(record, attempt=2, status="running"))

    @task(version="1")  # (its code reaches the store, which has no digest)
    def step(i: int) -> int:
        executed.append(i)
        if i == 1 and when == "during_a_step":
            take_over()
        return i

    @entrypoint
    def job(n: int) -> Any:
        total = 0
        for i in range(n):
            if i == 2 and when == "before_a_step":
                take_over()
                ctx = current_run.get()
                assert ctx is not None
                ctx.renew_at = 0.0  # the next step renews the lease first
            total += step(i)
        if when.startswith("after_the_steps"):
            take_over()
        # (a result over 1 MiB: the end's other path)
        return b"x" * (2 << 20) if when.endswith("large") else total

    with pytest.raises(durably.RunStateError, match="lost the run's lease") as caught:
        job.run(3, run_id="taken")
    after = store.find_run("taken")
    assert (after.status, after.attempt) == ("running", 2)  # the other attempt's record
    journaled = [s.position for s in store.list_steps("taken") if s.status == "ran"]
    if when == "during_a_step":
        assert executed == [0, 1] and journaled == [0]
        assert "The attempt stopped" in str(caught.value)
    elif when == "before_a_step":
        assert executed == [0, 1] and journaled == [0, 1]
        assert "The attempt stopped" in str(caught.value)
    else:
        assert executed == [0, 1, 2] and journaled == [0, 1, 2]
        assert "The attempt finished" in str(caught.value)


@pytest.mark.parametrize("how", ["ctrl_c", "exit"])
def test_a_ctrl_c_or_exit_in_an_attempt_that_lost_its_lease_goes_on_as_it_is(
        store: Any, how: str) -> None:
    """An attempt ended by Ctrl-C or sys.exit, which finds its lease lost at its end,
    raises that (a note says the lease was lost), not RunStateError: Ctrl-C still stops a
    worker loop that catches RunStateError, and the exit code stays."""

    from durably._runtime.context import current_run

    @entrypoint
    def job() -> int:
        ctx = current_run.get()
        assert ctx is not None
        _lease_taken_by_another_host(store, ctx.run_id)
        if how == "exit":
            sys.exit(3)
        raise KeyboardInterrupt

    with pytest.raises(SystemExit if how == "exit" else KeyboardInterrupt) as caught:
        job()
    assert any("lost the run's lease" in note
               for note in getattr(caught.value, "__notes__", []))
    if how == "exit":
        assert caught.value.code == 3


def test_a_lease_let_go_halfway_is_not_renewed_for_ever(store: Any) -> None:
    """A Ctrl-C inside let_go (after the attempt stopped being live, before its renewal was
    dropped) must not leave the lease renewed, and its thread running, for ever."""
    import time

    from durably._store import lease as _lease

    owner, renewed = _lease.me(), []
    _lease.hold(owner)
    _lease.beat(owner, lambda: renewed.append(owner.token))
    _lease._LIVE.discard(owner.token)  # (let_go's first line, and no further)
    deadline = time.monotonic() + 10
    while owner.token in _lease._BEATING:
        assert time.monotonic() < deadline, "a let-go lease is renewed for ever"
        time.sleep(0.05)


def test_a_fork_waits_for_a_renewal_and_no_renewal_starts_during_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A child forked while a renewal used SQLite would inherit its locks held: fork()
    waits for it. A fork in progress holds renewals back, for 10 s at most (a fork whose
    hook was cut short by a Ctrl-C leaves its mark: it must not stop renewals for good)."""
    import os
    import time

    from durably._store import lease as _lease

    _lease._renewal_active[0] = True  # a renewal in progress, ending in 0.3 s
    ends = threading.Timer(0.3, lambda: _lease._renewal_active.__setitem__(0, False))
    ends.start()
    t = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    assert time.monotonic() - t >= 0.25 and not _lease._FORKS
    ends.join()

    monkeypatch.setattr(_lease, "RENEW_SECONDS", 0.05)
    deadline = time.monotonic() + 10  # (a thread of an earlier run keeps its 30 s beat)
    while _lease._beater[0] is not None and _lease._beater[0].is_alive():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    owner, renewed = _lease.me(), []
    _lease.hold(owner)
    _lease._FORKS[-1] = time.monotonic()  # a fork in progress (or cut short just now)
    try:
        _lease.beat(owner, lambda: renewed.append(time.monotonic()))
        time.sleep(0.6)
        assert renewed == []
        _lease._FORKS[-1] = time.monotonic() - _lease._FORK_SECONDS  # 10 s ago: stale
        deadline = time.monotonic() + 5
        while not renewed:
            assert time.monotonic() < deadline, "renewals stopped for good"
            time.sleep(0.05)
    finally:
        _lease._FORKS.pop(-1, None)
        _lease.let_go(owner)


def _no_lease_thread() -> None:
    """Wait for the renewing thread of earlier runs to end (it keeps its own period)."""
    import time

    from durably._store import lease as _lease

    deadline = time.monotonic() + 10
    while _lease._beater[0] is not None and _lease._beater[0].is_alive():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_renewal_held_back_by_a_fork_is_tried_at_the_next_look(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A renewal skipped because a fork was in progress is tried again at the thread's next
    look, not a whole period later: a few forks in a row (a process pool) would otherwise
    let the lease expire while the run executes."""
    import time

    from durably._store import lease as _lease

    monkeypatch.setattr(_lease, "RENEW_SECONDS", 1.0)
    monkeypatch.setattr(_lease, "_TICK_SECONDS", 0.05)
    _no_lease_thread()
    owner, renewed = _lease.me(), []
    _lease.hold(owner)
    start = time.monotonic()
    try:
        _lease.beat(owner, lambda: renewed.append(time.monotonic() - start))
        time.sleep(0.9)
        _lease._FORKS[-1] = time.monotonic()  # a fork from 0.9 s to 1.2 s
        time.sleep(0.3)
        _lease._FORKS.pop(-1)
        time.sleep(0.5)
    finally:
        _lease._FORKS.pop(-1, None)
        _lease.let_go(owner)
    assert renewed and 1.2 <= renewed[0] < 1.9, renewed  # (before: 2.0, a period later)


@pytest.mark.usefixtures("sigint_raises_keyboard_interrupt")
def test_a_ctrl_c_while_fork_waits_for_a_renewal_is_raised_after_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """fork() waits for a renewal in progress; a Ctrl-C meanwhile neither cuts the wait
    short (the child could inherit SQLite's locks held) nor is lost: it is raised once the
    fork is done."""
    import os
    import signal
    import time

    from durably._store import lease as _lease

    _lease._renewal_active[0] = True  # a renewal in progress, ending in 0.5 s
    ends = threading.Timer(0.5, lambda: _lease._renewal_active.__setitem__(0, False))
    ctrl_c = threading.Timer(0.1, signal.pthread_kill, (threading.main_thread().ident,
                                                        signal.SIGINT))
    ends.start()
    ctrl_c.start()
    t = time.monotonic()
    pid = 0
    try:
        with pytest.raises(KeyboardInterrupt):
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            time.sleep(1.0)  # (raised here, once the fork returned)
        assert time.monotonic() - t >= 0.45  # the wait was not cut short
    finally:
        ends.join()
        ctrl_c.join()
        if pid:
            os.waitpid(pid, 0)
    assert pid and not _lease._INTERRUPTED_FORKS


def test_a_ctrl_c_as_the_lease_commits_leaves_no_lease_behind(
        store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C landing just after the attempt's start committed (its lease written) takes
    the lease back: other processes are not refused while this one lives."""
    from durably._runtime import attempt as _attempt
    from durably._store.disk import rows as _records

    real = _attempt._resolve_run
    calls = []

    def resolve(*args: Any) -> Any:
        found = real(*args)
        calls.append(found[0])
        return found

    monkeypatch.setattr(_attempt, "_resolve_run", resolve)
    if not isinstance(store, durably.DiskStore):  # interrupted once the lease is taken
        acquire = store.acquire_run

        def acquire_then_ctrl_c(run_id: str, owner: Any) -> Any:
            assert acquire(run_id, owner) is None
            monkeypatch.setattr(store, "acquire_run", acquire)
            raise KeyboardInterrupt

        monkeypatch.setattr(store, "acquire_run", acquire_then_ctrl_c)
    else:  # the first commit of the attempt (its start) is interrupted once it committed
        commit = _records.immediate.__exit__

        def commit_then_ctrl_c(self: Any, kind: Any, exc: Any, tb: Any) -> None:
            commit(self, kind, exc, tb)
            if kind is None and not self.joined and calls:
                monkeypatch.setattr(_records.immediate, "__exit__", commit)
                raise KeyboardInterrupt

        monkeypatch.setattr(_records.immediate, "__exit__", commit_then_ctrl_c)

    @entrypoint
    def job() -> int:
        return 1

    with pytest.raises(KeyboardInterrupt):
        job()
    # no lease row: another process would judge it by this live pid, and be refused (this
    # process, whose token is let go, would not)
    if isinstance(store, durably.PostgresStore):
        assert calls and store._one("count", store._sql(
            "SELECT count(*) FROM {s}.leases WHERE run_id = %s"), (calls[0],))[0] == 0
    elif not isinstance(store, durably.DiskStore):  # (MemoryStore, MinimalStore)
        assert calls and calls[0] not in store._leases
    else:
        assert calls and store._db().execute("SELECT count(*) FROM leases WHERE run_id=?",
                                             (calls[0],)).fetchone()[0] == 0
    assert job() == 1


def test_a_ctrl_c_in_the_attempts_last_clean_up_still_lets_its_lease_go(
        store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C inside the clean-up that ends an attempt (as its context is left) still
    lets its lease go: no renewal of it goes on for the life of the process."""
    from durably._runtime import attempt as _attempt
    from durably._store import lease as _lease

    leave, calls, owners = _attempt._leave, [], []

    def leave_then_ctrl_c(started: Any) -> None:
        calls.append(started)
        owners.append(started.ctx.owner)
        leave(started)
        if len(calls) == 2:  # the second: end_run's finally
            raise KeyboardInterrupt

    monkeypatch.setattr(_attempt, "_leave", leave_then_ctrl_c)

    @entrypoint
    def job() -> int:
        return 1

    with pytest.raises(KeyboardInterrupt):
        job()
    token = owners[0].token
    assert token not in _lease._LIVE and token not in _lease._BEATING


def test_the_idle_lease_thread_does_not_spin(monkeypatch: pytest.MonkeyPatch) -> None:
    """Between a run's end and its own, the renewing thread sleeps, even once the time of
    its next renewal has passed."""
    import time

    from durably._store import lease as _lease

    monkeypatch.setattr(_lease, "RENEW_SECONDS", 0.1)  # (due while it idles)

    @entrypoint
    def job() -> int:
        return 1

    job()
    cpu = time.process_time()
    time.sleep(1.2)
    assert time.process_time() - cpu < 0.3


def test_task_clear_removes_its_entries_only_and_keeps_runs(store: Any) -> None:
    """``task.clear()`` (joblib's ``f.clear()``): this task's entries, every code version
    and input, and none of another task's; a run still replays its finished steps."""
    calls: list[int] = []

    @task
    def square(x: int) -> int:
        calls.append(x)
        return x * x

    @task
    def cube(x: int) -> int:
        return x ** 3

    @entrypoint
    def job(n: int) -> int:
        return sum(square(i) for i in range(n))

    assert job(3) == 5 and cube(2) == 8
    assert square.clear().entries == 3 and square.clear().entries == 0
    assert cube.explain(2).hit and not square.explain(1).hit
    assert job(3) == 5 and calls == [0, 1, 2]  # (finished: its run's result)
    assert square(1) == 1 and calls == [0, 1, 2, 1]  # outside the run: executed again

    @entrypoint
    def clears(n: int) -> list[Any]:
        first = [square(i) for i in range(n)]  # (cheap steps: their entries are queued)
        removed = square.clear().entries
        return [first, removed, [square(i) for i in range(n)]]

    square.clear()
    calls.clear()
    run = clears.run(3)  # inside a run: the entries it queued are removed too
    assert run.result == [[0, 1, 4], 3, [0, 1, 4]] and calls == [0, 1, 2, 0, 1, 2]
    assert [s.status for s in run.steps] == ["ran"] * 6

    own = MemoryStore()

    @entrypoint(store=own)
    def elsewhere(n: int) -> list[Any]:  # a run in a store of its own: clear() clears it
        first = [square(i) for i in range(n)]
        return [first, square.clear().entries, [square(i) for i in range(n)]]

    calls.clear()
    assert elsewhere(2) == [[0, 1], 2, [0, 1]] and calls == [0, 1, 0, 1]


def test_the_summary_counts_a_retried_step_once_and_says_when_nothing_was_replayed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step that failed twice and then succeeded counts once, as ran (a user's summary
    said '6 ran, 7 failed' for seven items); a try that is not retried says why; a rerun
    after a fix to the task's own code, which replays nothing, says so instead of 'its
    finished steps were replayed'."""
    from tests.conftest import load_source

    tries: dict[int, int] = {}

    @durably.task(retry=durably.Retry(attempts=3, backoff=0.0, on=(ConnectionError,)))
    def fetch(i: int) -> int:
        tries[i] = tries.get(i, 0) + 1
        if i == 0 and tries[i] < 3:
            raise ConnectionError("flaky")
        if i == 1:
            raise KeyError("not retried")
        return i

    @durably.entrypoint
    def crawl(n: int) -> list[int]:
        return [fetch(i) if i != 1 else -1 for i in range(n)] + [_safe(fetch, 1)]

    def _safe(f: Any, i: int) -> int:
        try:
            return int(f(i))
        except KeyError:
            return -1

    run = crawl.run(3)
    assert run.counts() == {"ran": 2, "cached": 0, "replayed": 0, "failed": 1}
    errors = [s.error for s in run.steps if s.status == "failed"]
    assert errors[-1].startswith("try 1 of 3, not retried (KeyError is not in on=)")

    v1 = load_source(tmp_path, monkeypatch, "etl_flow", """
import durably
@durably.task
def item(i):
    if i == 2:
        raise ValueError("bad item")
    return i * 10
@durably.entrypoint
def etl(n):
    return [item(i) for i in range(n)]
""")
    with pytest.raises(ValueError):
        v1.etl(3)
    v2 = load_source(tmp_path, monkeypatch, "etl_flow", """
import durably
@durably.task
def item(i):
    return i * 10
@durably.entrypoint
def etl(n):
    return [item(i) for i in range(n)]
""")
    fixed = v2.etl.run(3)
    assert fixed.counts()["ran"] == 3 and fixed.counts()["replayed"] == 0
    assert "no step was replayed: the steps that had finished are of tasks whose code" in (
        fixed.summary())


def test_a_summary_never_says_finished_steps_were_replayed_when_none_were() -> None:
    """A run resumed with no step to replay (an interrupt asked by the entrypoint's own
    body before any step; a failure before the first step) said 'its finished steps were
    replayed'."""
    @entrypoint
    def approve(doc: str) -> str:
        verdict = durably.interrupt({"approve?": doc})
        return f"{doc}: {verdict}"

    assert approve.run("memo").status == "interrupted"
    again = approve.run("memo")  # (still waiting: continued, nothing to replay)
    assert again.status == "interrupted" and again.resumed_from == "interrupted"
    assert again.counts() == {"ran": 0, "cached": 0, "replayed": 0, "failed": 0}
    text = again.summary()
    assert "were replayed" not in text and "none of its steps had finished" in text, text

    flaky = {"fail": True}

    @task
    def double(x: int) -> int:
        return 2 * x

    @entrypoint
    def job(x: int) -> int:
        if flaky["fail"]:
            raise RuntimeError("before any step")
        return double(x)

    with pytest.raises(RuntimeError):
        job(3)
    flaky["fail"] = False
    fixed = job.run(3)
    assert fixed.result == 6 and fixed.counts()["replayed"] == 0
    assert "were replayed" not in fixed.summary() and "none of its steps had finished" in (
        fixed.summary())

    rerun = job.run(3)  # a finished run again: its one step replayed, and said so
    assert rerun.counts()["replayed"] == 1 and "replayed from its journal" in rerun.summary()


def test_time_saved_is_the_wall_time_the_reused_executions_covered() -> None:
    """Steps that ran side by side count once: a sum of durations said 11.85 s saved on a
    run of 2.2 s. Records written as a run of 8 parallel steps of 2 s (and a nested pair)
    would have given 16 s + 2 s."""
    from durably._store.records import RunRecord, StepRecord

    store = MemoryStore()
    store.put_run(RunRecord("par", "m:f", "f", "finished", 100.0, 200.0, 2, "d"))

    def step(i: int, status: str, attempt: int, start: float, end: float,
             parent: str | None = None) -> tuple[StepRecord, bytes | None]:
        return (StepRecord("par", f"{i:032x}", parent, "work", status, attempt, i, start, end),
                None)

    ran = [step(i, "ran", 1, 100.0, 102.0) for i in range(8)]  # 8 threads at once
    ran += [step(8, "ran", 1, 103.0, 104.0), step(9, "ran", 1, 103.5, 104.0, f"{8:032x}")]
    store.append_steps([(rec, b"x") for rec, _ in ran])
    store.append_steps([step(i, "replayed", 2, 150.0, 150.0) for i in range(10)])
    run = durably.get_run("par", store=store)
    assert run.counts()["replayed"] == 10
    assert run.time_saved() == pytest.approx(3.0)  # [100, 102] and [103, 104]
    assert run.graph().time_saved == pytest.approx(3.0)
    assert "3.00 s saved by the journal" in run.summary()

    from durably._trace.spans import wall_span

    assert wall_span([]) == 0.0
    assert wall_span([(5.0, 4.0), (1.0, 1.0)]) == 0.0  # (no time)
    assert wall_span([(0.0, 1.0), (1.0, 2.0), (3.0, 4.0)]) == pytest.approx(3.0)


def _keeps_durations(store: Any) -> bool:
    """Whether the store gives a hit the duration of its entry (a backend on the protocol's
    default ``cache_get_timed`` gives 0.0: tests/minimal_store.py)."""
    from durably.store import Store

    return type(store).cache_get_timed is not Store.cache_get_timed


def test_a_run_of_cache_hits_shows_the_time_the_cache_saved(store: Any) -> None:
    """A run whose steps are all served from the cache saved what executing them cost in the
    run that did: each hit's record keeps the duration of the execution that produced its
    entry (as that step's record measured it), and time_saved sums them."""
    @task
    def square(x: int) -> int:
        return x * x

    @entrypoint
    def squares(n: int, label: str) -> list[int]:
        return [square(i) for i in range(n)]

    first = squares.run(4, "first")
    ran = {s.cache_key: s.duration for s in store.list_steps(first.id) if s.status == "ran"}
    assert len(ran) == 4 and first.time_saved() == 0.0

    second = squares.run(4, "second")  # another run: every step a hit
    hits = [s for s in store.list_steps(second.id) if s.status == "cached"]
    assert len(hits) == 4 and second.counts()["ran"] == 0
    if not _keeps_durations(store):
        assert [s.saved for s in hits] == [0.0] * 4 and second.time_saved() == 0.0
        return
    assert {s.cache_key: s.saved for s in hits} == ran  # (exactly: the recorded durations)
    assert all(s.saved > 0 for s in hits)
    assert second.time_saved("cache") == pytest.approx(sum(ran.values()))
    assert second.time_saved("replay") == 0.0
    assert second.time_saved() == pytest.approx(sum(ran.values()))
    assert second.graph().time_saved == pytest.approx(sum(ran.values()))
    with pytest.raises(durably.DefinitionError, match="replay"):
        second.time_saved("journal")  # type: ignore[arg-type]


def test_the_summary_says_what_the_cache_and_the_journal_saved() -> None:
    """Records of a run whose second attempt replayed a step that ran for 2 s and was
    served two hits of entries that took 1.5 s and 0.25 s to compute elsewhere."""
    from durably._store.records import RunRecord, StepRecord

    store = MemoryStore()
    store.put_run(RunRecord("both", "m:f", "f", "finished", 100.0, 200.0, 2, "d"))

    def step(i: int, status: str, attempt: int, start: float, end: float,
             saved: float = 0.0) -> tuple[StepRecord, bytes | None]:
        return (StepRecord("both", f"{i:032x}", None, "work", status, attempt, i, start, end,
                           cache_key=f"{i:032x}", saved=saved), b"x")

    store.append_steps([step(0, "ran", 1, 100.0, 102.0), step(0, "replayed", 2, 150.0, 150.0),
                        step(1, "cached", 2, 150.0, 150.1, 1.5),
                        step(2, "cached", 2, 150.1, 150.2, 0.25)])
    run = durably.get_run("both", store=store)
    assert (run.time_saved("replay"), run.time_saved("cache"), run.time_saved()) == (
        pytest.approx(2.0), pytest.approx(1.75), pytest.approx(3.75))
    assert "3.75 s saved (2.00 s by the journal, 1.75 s by the cache)" in run.summary()
    store.append_steps([step(3, "cached", 2, 150.2, 150.3, 0.5)])
    assert durably.get_run("both", store=store).graph().time_saved == pytest.approx(4.25)


def test_time_saved_by_replay_and_by_the_cache_together(store: Any) -> None:
    """An attempt that replays steps (some of them hits of its first attempt) and is served
    new hits: by replay, the wall span of its own earlier executions; by the cache, the
    durations of the executions (in another run) behind every hit, replayed or new."""
    fail = {"on": True}

    @task
    def load(i: int) -> int:
        return i + 1

    @task
    def mark(label: str) -> str:
        return label.upper()

    @entrypoint
    def warm(n: int) -> list[int]:
        return [load(i) for i in range(n)]

    @entrypoint
    def job(n: int, label: str) -> tuple[list[int], str, int]:
        hits = [load(i) for i in range(n)]  # hits of warm's entries
        marked = mark(label)  # executes in the first attempt
        if fail["on"]:
            raise RuntimeError("crash after the first steps")
        return hits, marked, load(n)  # a hit of the second attempt

    warmed = warm.run(4)
    durations = {s.cache_key: s.duration for s in store.list_steps(warmed.id)}
    with pytest.raises(RuntimeError):
        job(3, "a")
    fail["on"] = False
    run = job.run(3, "a")
    assert run.attempt == 2 and run.result == ([1, 2, 3], "A", 4)
    records = store.list_steps(run.id)
    mark_ran = next(s for s in records if s.status == "ran" and s.attempt == 1)
    assert run.counts() == {"ran": 0, "cached": 1, "replayed": 4, "failed": 0}
    assert run.time_saved("replay") == pytest.approx(mark_ran.duration)
    expected_cache = sum(durations.values()) if _keeps_durations(store) else 0.0
    assert run.time_saved("cache") == pytest.approx(expected_cache)
    assert run.time_saved() == pytest.approx(mark_ran.duration + expected_cache)
    assert run.graph().time_saved == pytest.approx(run.time_saved())


def test_entries_written_without_a_duration_save_nothing(store: Any) -> None:
    """An entry whose key record has no duration (written by an older durably) is served
    as before; its hits count 0 time saved."""
    @task
    def inc(x: int) -> int:
        return x + 1

    @entrypoint
    def job(n: int, label: str) -> list[int]:
        return [inc(i) for i in range(n)]

    job.run(3, "first")
    (identity,) = [t for t in store.task_identities() if t.endswith(".inc")]
    for info in store.list_keys(identity):
        data = store.cache_get(info.cache_key)
        store.cache_put(info.cache_key, data, dataclasses.replace(info, duration=0.0))
    second = job.run(3, "second")
    assert second.counts()["cached"] == 3 and second.result == [1, 2, 3]
    assert [s.saved for s in second.steps if s.status == "cached"] == [0.0] * 3
    assert second.time_saved() == 0.0


def test_a_rerun_whose_steps_all_changed_never_says_they_were_replayed() -> None:
    def make(version: str) -> Any:
        @durably.task(name="rr_a", version=version)
        def a() -> str:
            return version

        @durably.task(name="rr_b")
        def b(x: str) -> str:
            return x + "!"

        @durably.entrypoint(name="rr_job")
        def job() -> str:
            return b(a())

        return job

    assert make("1").run().result == "1!"
    again = make("2").run()
    assert again.result == "2!" and again.counts()["replayed"] == 0
    text = again.summary()
    assert "none was replayed" in text and "unchanged steps replayed" not in text, text
