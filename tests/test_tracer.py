"""The tracer: live events (stream), journaled events, and the run graph, on every store."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import durably
from durably import entrypoint, render, task
from durably._trace.producers import SOURCE, digests_only, source_token
from tests.conftest import run_script, script_env, write_script

pytestmark = pytest.mark.usefixtures("store")


def _n(name: str) -> str:
    """A task's short name (tasks defined in a test are named by their qualified name)."""
    return name.rpartition(".")[2]


# -- events ----------------------------------------------------------------------------------
def test_stream_yields_every_event_in_order_with_reprs() -> None:
    @task
    def square(x: int) -> int:
        return x * x

    @task
    def total(xs: list[int]) -> int:
        durably.get_writer()({"adding": len(xs)})
        return sum(xs)

    @entrypoint
    def pipeline(n: int) -> int:
        return total([square(i) for i in range(n)])

    events = list(pipeline.stream(2))
    assert [(e.kind, _n(e.task), e.status) for e in events] == [
        ("run_started", "pipeline", "new"),
        ("step_started", "square", ""), ("step_finished", "square", "ran"),
        ("step_started", "square", ""), ("step_finished", "square", "ran"),
        ("step_started", "total", ""), ("custom", "", ""),
        ("step_finished", "total", "ran"),
        ("run_finished", "pipeline", "finished"),
    ]
    finished = [e for e in events if e.kind == "step_finished"]
    assert [(e.inputs, e.output) for e in finished] == [
        ("x=0", "0"), ("x=1", "1"), ("xs=[0, 1]", "1")]
    assert all(e.duration is not None and e.duration >= 0 for e in finished)
    custom = next(e for e in events if e.kind == "custom")
    assert custom.data == {"adding": 2} and custom.step_id == finished[-1].step_id
    assert events[-1].data == 1 and events[-1].run_id == events[0].run_id
    # a second stream of the same run replays: the steps say so
    again = list(pipeline.stream(2))
    assert [e.status for e in again if e.kind == "step_finished"] == ["replayed"] * 3
    assert again[0].status == "finished"  # the status the run had before this attempt


def test_step_events_carry_parent_of_nested_calls() -> None:
    @task
    def leaf(x: int) -> int:
        return x + 1

    @task
    def outer(x: int) -> int:
        return leaf(x) * 2

    @entrypoint
    def pipeline(x: int) -> int:
        return outer(x)

    events = [e for e in pipeline.stream(1) if e.kind == "step_finished"]
    assert [_n(e.task) for e in events] == ["leaf", "outer"]
    assert events[0].parent_id == events[1].step_id and events[1].parent_id is None


def test_failed_run_raises_from_the_stream_after_its_events() -> None:
    @task
    def boom(x: int) -> int:
        raise ValueError(f"bad {x}")

    @entrypoint
    def pipeline(x: int) -> int:
        return boom(x)

    seen: list[str] = []
    with pytest.raises(ValueError, match="bad 3"):
        for event in pipeline.stream(3):
            seen.append(event.kind)
    assert seen == ["run_started", "step_started", "step_failed", "run_failed"]


def test_breaking_out_of_a_stream_stops_the_run_and_it_resumes() -> None:
    executed: list[int] = []

    @task
    def work(i: int) -> int:
        executed.append(i)
        return i

    @entrypoint
    def pipeline(n: int) -> list[int]:
        return [work(i) for i in range(n)]

    for event in pipeline.stream(10):
        if event.kind == "step_finished" and event.output == "2":
            break
    assert executed == [0, 1, 2]  # stopped at the next step boundary
    run = durably.list_runs(pipeline)[0]
    assert run.status == "stopped"
    assert run.events()[-1].kind == "run_stopped"
    again = pipeline.run(10)
    assert again.result == list(range(10)) and again.resumed_from == "stopped"
    assert executed == list(range(10))  # nothing ran twice
    assert again.counts() == {"ran": 7, "cached": 0, "replayed": 3, "failed": 0}


def test_async_entrypoint_streams_asynchronously() -> None:
    @task
    async def fetch(x: int) -> int:
        await asyncio.sleep(0)
        return x * 10

    @entrypoint
    async def pipeline(n: int) -> int:
        return sum(await asyncio.gather(*(fetch(i) for i in range(n))))

    async def consume() -> list[Any]:
        return [(e.kind, e.status) async for e in pipeline.stream(3)]

    events = asyncio.run(consume())
    assert events[0] == ("run_started", "new") and events[-1] == ("run_finished", "finished")
    assert [s for k, s in events if k == "step_finished"] == ["ran"] * 3
    with pytest.raises(durably.DefinitionError, match=r"async for event in pipeline\.stream"):
        for _ in pipeline.stream(4):  # (Python's own TypeError named no fix)
            pass
    assert not durably.list_runs(pipeline) or all(
        r.status == "finished" for r in durably.list_runs(pipeline))  # (nothing started)

    @task
    async def step(i: int) -> int:
        await asyncio.sleep(0.02)  # the run yields to the loop, so the consumer keeps up
        return i

    @entrypoint
    async def sequential(n: int) -> list[int]:
        return [await step(i) for i in range(n)]

    async def stop_early() -> None:
        async for e in sequential.stream(50):
            if e.kind == "step_finished":
                break

    asyncio.run(stop_early())
    run = durably.list_runs(sequential)[0]
    assert run.status == "stopped" and 1 <= run.counts()["ran"] < 50


def test_events_are_journaled_with_the_run() -> None:
    @task
    def note(x: int) -> int:
        durably.get_writer()(f"seen {x}")
        return x

    @entrypoint
    def pipeline(x: int) -> int:
        return note(x)

    run = pipeline.run(5)
    pipeline.run(5)
    kinds = [(e.kind, e.attempt) for e in durably.get_run(run.id).events()]
    assert kinds == [("run_started", 1), ("custom", 1), ("step_finished", 1),
                     ("run_finished", 1), ("run_started", 2), ("step_finished", 2),
                     ("run_finished", 2)]
    custom = [e for e in run.events() if e.kind == "custom"]
    assert [e.data for e in custom] == ["seen 5"]


def test_get_writer_outside_a_run_says_so() -> None:
    with pytest.raises(durably.NoActiveRunError, match="outside a run"):
        durably.get_writer()


# -- the run graph ---------------------------------------------------------------------------
def _edges(graph: durably.RunGraph) -> list[tuple[str, str]]:
    return [(_n(graph.node(e.source).label), _n(graph.node(e.target).label))
            for e in graph.edges]


def test_graph_has_data_flow_edges_through_arguments_and_containers() -> None:
    @task
    def load(name: str) -> dict[str, int]:
        return {"name_len": len(name)}

    @task
    def score(row: dict[str, int]) -> int:
        return row["name_len"] * 10

    @task
    def report(scores: list[int], by_name: dict[str, dict[str, int]], title: str) -> str:
        return f"{title}: {sum(scores)}"

    @entrypoint
    def pipeline(names: list[str]) -> str:
        rows = [load(n) for n in names]
        scores = [score(r) for r in rows]
        return report(scores, {n: r for n, r in zip(names, rows, strict=True)}, "total")

    graph = pipeline.run(["ab", "cde"]).graph()
    assert [_n(n.task) for n in graph.nodes] == ["load", "load", "score", "score", "report"]
    load_a, load_b, score_a, score_b, rep = (n.id for n in graph.nodes)
    pairs = {(e.source, e.target) for e in graph.edges}
    assert pairs == {(load_a, score_a), (load_b, score_b), (score_a, rep), (score_b, rep),
                     (load_a, rep), (load_b, rep)}
    assert graph.node(rep).inputs is not None and "title='total'" in graph.node(rep).inputs
    assert graph.node(rep).output == "'total: 50'"


@pytest.mark.parametrize("cache", [True, False])
def test_a_large_argument_is_encoded_once_and_its_flow_edges_are_drawn(cache: bool) -> None:
    """An executed step's key, the digest of each argument (explain) and the tracer's flow
    digests come from one encoding of a large list of strings: the same digests, so the
    data-flow edges from the steps that made it and its elements are drawn as before."""
    from durably._keys.canonical import Encoder
    from durably._keys.hashing import digest_each, trace_digest

    @task
    def chat(n: int) -> list[str]:
        return [f"message {i} " * 300 for i in range(n)]

    @task
    def last(n: int) -> str:
        return f"message {n - 1} " * 300

    @task(cache=cache)
    def summarize(messages: list[str], state: dict[str, Any]) -> int:
        return len(messages) + len(state["messages"])

    @entrypoint
    def pipeline(n: int) -> int:
        messages = chat(n)
        last(n)
        return summarize(messages, {"messages": messages, "n": n})

    calls: list[int] = []
    strings = Encoder.strings

    def counted(self: Encoder, items: Any, *more: Any) -> Any:
        if len(items) == 40:  # (not the names in the code fingerprints)
            calls.append(len(items))
        return strings(self, items, *more)

    Encoder.strings = counted  # type: ignore[method-assign]
    try:
        run = pipeline.run(40)
    finally:
        Encoder.strings = strings  # type: ignore[method-assign]
    assert run.result == 80
    # summarize's key (both arguments hold the list): 2 (6 before: the digest of each
    # argument, for explain or the tracer, and the tracer's digest of the list as an
    # element of the dict encoded them again, and chat's result was digested for the
    # tracer, which now knows it by identity: see _trace.producers); whether the body
    # changed its arguments in place is told by their pickles' digests, not encoded (see
    # _effects)
    assert calls == [40, 40]
    graph = run.graph()
    # the list, whole and in the dict, is chat's result; last returned a string equal to
    # one of its elements, but not that string, and its result was never passed on: no
    # edge (a flow is the object a step returned, not a value equal to it)
    assert sorted(_edges(graph)) == [("chat", "summarize")]
    step = next(r for r in run.steps if _n(r.task) == "summarize")
    messages = chat(40)
    arguments = {"messages": messages, "state": {"messages": messages, "n": 40}}
    whole = digest_each(arguments)
    elements = [trace_digest(m) for m in messages] + [trace_digest(messages), trace_digest(40)]
    assert sorted(digests_only(step.input_digests)) == sorted(
        [whole["messages"], whole["state"], *elements])
    # and the steps that produced them, by identity: the list (whole, and in the dict) and
    # the elements chat returned
    chat_id = next(r.step_id for r in run.steps if _n(r.task) == "chat")
    named = [d for d in step.input_digests if d.startswith(SOURCE)]
    assert named == [source_token(chat_id)] * (2 + 40)


def test_values_too_common_to_mean_a_flow_are_left_out_of_cache_false_steps() -> None:
    """A cache=False step's flow digests leave out None, booleans, small numbers and short
    strings, as trace_digest does, also when its arguments were digested with its key."""
    from durably._keys.hashing import trace_digest

    @task(cache=False)
    def notify(channel_id_nz: int, retries_nz: bool) -> int:
        return channel_id_nz

    @task(cache=False)
    def summarize_nz(rows: list[Any], n: int, flag: bool, none: None) -> int:
        return n

    @entrypoint
    def pipeline() -> int:
        notify(channel_id_nz=3, retries_nz=True)
        notify(channel_id_nz=3, retries_nz=True)
        return summarize_nz([{"a": "hello"}, "world"], 3, True, None)

    steps = pipeline.run().steps
    assert [s.input_digests for s in steps[:2]] == [(), ()]
    rows = [{"a": "hello"}, "world"]
    assert steps[2].input_digests == (trace_digest(rows), trace_digest(rows[0]),
                                      trace_digest(rows[1]))


def test_reprs_of_dicts_keep_their_order() -> None:
    """A row reads as it was built: reprlib alone sorts a dict's keys."""
    @task
    def row(n: int) -> dict[str, Any]:
        return {"id": n, "name": "a", "amount": 2.5, "tags": {"z": 1, "a": 2}, "more": 0}

    @entrypoint
    def pipeline() -> list[dict[str, Any]]:
        return [row(1)]

    node = pipeline.run().graph().nodes[0]
    assert node.output == "{'id': 1, 'name': 'a', 'amount': 2.5, 'tags': {'z': 1, 'a': 2}, ...}"


def test_graph_ignores_none_and_booleans_as_flows() -> None:
    @task
    def check(x: int) -> bool:
        return x > 0

    @task
    def nothing(x: int) -> None:
        return None

    @task
    def use(flag: bool, value: None) -> int:
        return 1

    @entrypoint
    def pipeline() -> int:
        check(1)
        nothing(1)
        return use(True, None)

    assert pipeline.run().graph().edges == ()


def test_graph_nests_calls_inside_their_caller() -> None:
    @task
    def leaf(x: int) -> int:
        return x + 1

    @task
    def middle(x: int) -> int:
        return leaf(x) + leaf(x + 10)

    @entrypoint
    def pipeline() -> int:
        return middle(1)

    graph = pipeline.run().graph()
    top = graph.children(None)
    assert [_n(n.task) for n in top] == ["middle"]
    assert [_n(n.task) for n in graph.children(top[0].id)] == ["leaf", "leaf"]


def test_graph_shows_failed_steps_and_the_retry() -> None:
    fail = [True]

    @task
    def flaky(x: int) -> int:
        if fail[0]:
            raise RuntimeError("flaky")
        return x

    @task
    def ok(x: int) -> int:
        return x

    @entrypoint
    def pipeline() -> int:
        return flaky(ok(100))

    with pytest.raises(RuntimeError):
        pipeline()
    run = durably.list_runs(pipeline)[0]
    graph = run.graph()
    assert [(_n(n.task), n.status) for n in graph.nodes] == [("ok", "ran"), ("flaky", "failed")]
    assert graph.nodes[1].error == "RuntimeError('flaky')"
    assert _edges(graph) == [("ok", "flaky")]
    fail[0] = False
    graph = pipeline.run().graph()
    assert [(_n(n.task), n.status) for n in graph.nodes] == [("ok", "replayed"), ("flaky", "ran")]
    assert _edges(graph) == [("ok", "flaky")]  # flow info of the replayed step is kept
    first = run.graph(attempt=1)
    assert [n.status for n in first.nodes] == ["ran", "failed"]


def test_graph_of_a_rerun_shows_replayed_and_cached_steps() -> None:
    @task
    def slow(x: int) -> int:
        return x * 2

    @entrypoint
    def pipeline(x: int) -> int:
        return slow(x) + slow(x + 1)

    pipeline(1)
    replayed = pipeline.run(1).graph()
    assert {n.status for n in replayed.nodes} == {"replayed"}
    assert replayed.time_saved >= 0 and replayed.attempt == 2
    cached = pipeline.run(1, fresh=True).graph()
    assert {n.status for n in cached.nodes} == {"cached"}
    assert all(n.output is not None for n in cached.nodes)


def test_large_fan_out_collapses_into_one_node_with_counts() -> None:
    @task
    def parse(i: int) -> str:
        return f"row {i}"

    @task
    def merge(xs: list[str]) -> int:
        return len(xs)

    @entrypoint
    def pipeline(n: int) -> int:
        return merge([parse(i) for i in range(n)])

    pipeline(1_000)  # the first 1,000 are replayed or cached below
    graph = pipeline.run(1_200).graph()
    assert [_n(n.label) for n in graph.nodes] == ["parse ×1,200", "merge"]
    group = graph.nodes[0]
    assert group.count == 1_200 and dict(group.statuses) == {"cached": 1_000, "ran": 200}
    assert group.status == "ran" and len(group.steps) == 1_200
    assert [(e.count, _n(graph.node(e.target).task)) for e in graph.edges] == [(1_200, "merge")]
    assert graph.counts() == {"cached": 1_000, "ran": 201}
    full = durably.list_runs(pipeline)[0].graph(collapse=None)
    assert len(full.nodes) == 1_201 and len(full.edges) == 1_200


def test_entrypoint_graph_is_its_latest_run() -> None:
    @task
    def inc(x: int) -> int:
        return x + 1

    @entrypoint
    def pipeline(x: int) -> int:
        return inc(x)

    with pytest.raises(durably.NotFoundError, match="no run"):
        pipeline.graph()
    pipeline(1)
    pipeline(2)
    graph = pipeline.graph()
    assert graph.run_id == durably.list_runs(pipeline)[0].id
    assert graph.nodes[0].inputs == "x=2"


def test_a_run_is_drawn_by_another_process(tmp_path: Path) -> None:
    script = write_script(tmp_path / "flow.py", """
        import sys
        import durably

        @durably.task
        def load(n):
            return list(range(n))

        @durably.task
        def total(xs):
            return sum(xs)

        @durably.entrypoint
        def pipeline(n):
            return total(load(n))

        if __name__ == "__main__":
            print(pipeline.run(4).id)
    """)
    env = script_env(tmp_path / "store")
    run_id = run_script(script, env).stdout.strip()
    reader = write_script(tmp_path / "reader.py", f"""
        import durably
        graph = durably.get_run({run_id!r}).graph()
        print([n.task for n in graph.nodes])
        print([(graph.node(e.source).task, graph.node(e.target).task) for e in graph.edges])
    """)
    out = run_script(reader, env).stdout.splitlines()
    assert out == ["['load', 'total']", "[('load', 'total')]"]


# -- the journal format ----------------------------------------------------------------------
def test_a_format_1_store_is_upgraded_in_place(tmp_path: Path) -> None:
    root = tmp_path / "old"
    root.mkdir()
    (root / "FORMAT").write_text("durably-store 1\n")
    con = sqlite3.connect(root / "journal.sqlite3")
    con.executescript("""
        CREATE TABLE runs (run_id TEXT PRIMARY KEY, entrypoint TEXT NOT NULL, name TEXT NOT NULL,
            status TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL,
            attempt INTEGER NOT NULL, input_digest TEXT NOT NULL, args BLOB, result BLOB,
            error TEXT);
        CREATE TABLE steps (run_id TEXT NOT NULL, attempt INTEGER NOT NULL,
            position INTEGER NOT NULL, step_id TEXT NOT NULL, parent_id TEXT,
            task TEXT NOT NULL, status TEXT NOT NULL, started REAL NOT NULL, ended REAL NOT NULL,
            error TEXT, cache_key TEXT NOT NULL, result BLOB);
        INSERT INTO steps VALUES ('r', 1, 0, 's', NULL, 't', 'ran', 1.0, 2.0, NULL, 'k', x'00');
        PRAGMA user_version=1;
    """)
    con.close()
    store = durably.DiskStore(root)
    [step] = store.list_steps("r")
    assert (step.step_id, step.inputs, step.result_digest, step.input_digests) == (
        "s", None, "", ())
    assert store.list_events("r") == []
    assert (root / "FORMAT").read_text().strip() == "durably-store 2"
    store.close()


# -- found by a new user trying to break it --------------------------------------------------
def test_edges_follow_the_most_recent_producer_and_count_equal_results() -> None:
    @task
    def load(name: str) -> dict[str, list[int]]:
        return {"rows": [1, 2, 3]}

    @task
    def validate(d: dict[str, list[int]]) -> dict[str, list[int]]:
        return d  # passes its input through

    @task
    def train(d: dict[str, list[int]]) -> str:
        return "model"

    @task
    def index_file(name: str) -> dict[str, int]:
        return {"lines": 0}

    @task
    def merge(stats: list[dict[str, int]]) -> int:
        return len(stats)

    @task
    def count_errors(rows: list[str]) -> int:
        return 0

    @task
    def fetch_page(page: int) -> str:
        return f"page {page}"

    @entrypoint
    def ml() -> tuple[str, int, str]:
        count_errors(["a", "b"])
        page = fetch_page(0)  # 0 is too common a value to be a flow from count_errors
        model = train(validate(load("x")))
        return model, merge([index_file(n) for n in ("a.py", "b.py", "c.py")]), page

    graph = ml.run().graph(collapse=None)
    assert sorted(_edges(graph)) == sorted([
        ("load", "validate"), ("validate", "train"),
        ("index_file", "merge"), ("index_file", "merge"), ("index_file", "merge")])


def test_nested_fan_outs_collapse_inside_collapsed_groups() -> None:
    @task
    def leaf(i: int) -> tuple[str, int]:
        return ("leaf", i)

    @task
    def branch(i: int) -> list[tuple[str, int]]:
        return [leaf(2 * i), leaf(2 * i + 1)]

    @entrypoint
    def tree(n: int) -> list[Any]:
        return [branch(i) for i in range(n)]

    graph = tree.run(30).graph()
    assert [(_n(n.task), n.count) for n in graph.nodes] == [("branch", 30), ("leaf", 60)]
    assert graph.nodes[1].parent == graph.nodes[0].id


def test_graph_of_an_earlier_attempt_has_that_attempts_status() -> None:
    fail = [True]

    @task
    def p(x: int) -> int:
        if fail[0]:
            raise ValueError("bad")
        return x

    @entrypoint
    def at() -> int:
        return p(100)

    with pytest.raises(ValueError):
        at.run(run_id="at-1")
    fail[0] = False
    run = at.run(run_id="at-1")
    assert run.graph(attempt=1).status == "failed" and run.graph().status == "finished"
    with pytest.raises(durably.NotFoundError, match="attempts 1 to 2"):
        run.graph(attempt=7)


def test_saved_run_events_carry_status_duration_output_and_error() -> None:
    @task
    def a(x: int) -> int:
        return x + 100

    @entrypoint
    def ev(fail: bool) -> int:
        if fail:
            raise RuntimeError("nope")
        return a(1)

    live = list(ev.stream(False))
    saved = durably.get_run(live[0].run_id).events()
    assert [(e.kind, e.output) for e in saved if e.kind.startswith("run_")] == [
        ("run_started", None), ("run_finished", "101")]
    assert saved[0].status == live[0].status == "new"
    assert saved[-1].duration is not None and saved[-1].duration >= 0
    with pytest.raises(RuntimeError):
        ev(True)
    failed = durably.list_runs(ev)[0].events()[-1]
    assert failed.kind == "run_failed" and "nope" in str(failed.data)


def test_an_unstorable_result_is_a_failed_step_in_stream_and_graph() -> None:
    import threading

    @task
    def make_lock() -> Any:
        return threading.Lock()

    @entrypoint
    def lk() -> str:
        return str(make_lock())

    kinds: list[str] = []
    with pytest.raises(durably.SerializationError):
        for e in lk.stream():
            kinds.append(e.kind)
    assert kinds == ["run_started", "step_started", "step_failed", "run_failed"]
    graph = durably.list_runs(lk)[0].graph()
    assert [n.status for n in graph.nodes] == ["failed"]


def test_an_async_stream_closed_early_leaves_no_unretrieved_error(
        caplog: pytest.LogCaptureFixture) -> None:
    @task
    async def fetch(i: int) -> int:
        await asyncio.sleep(0.02)
        return i

    @entrypoint
    async def crawl(n: int) -> list[int]:
        return [await fetch(i) for i in range(n)]

    async def main() -> None:
        async for ev in crawl.stream(5):
            if ev.kind == "step_finished":
                break
        await asyncio.sleep(0.1)

    import gc

    asyncio.run(main())
    gc.collect()
    assert "never retrieved" not in caplog.text
    assert durably.list_runs(crawl)[0].status == "stopped"


def test_a_sync_stream_sees_the_callers_context_vars() -> None:
    import contextvars

    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")

    @entrypoint
    def cv(tag: str) -> str:
        return var.get()

    var.set("set by caller")
    assert list(cv.stream("b"))[-1].data == "set by caller"


def test_a_custom_event_that_cannot_be_pickled_never_fails_the_run(
        caplog: pytest.LogCaptureFixture) -> None:
    import threading

    @entrypoint
    def prog() -> str:
        durably.get_writer()({"progress": 1, "lock": threading.Lock()})
        return "done"

    run = prog.run()
    assert run.result == "done"
    [custom] = [e for e in run.events() if e.kind == "custom"]
    assert "progress" in custom.data and "lock" in caplog.text


def _killed_then_shown(script: Path) -> str:
    """What ``script show`` prints after ``script run`` killed its own process (both on the
    store beside the script)."""
    import subprocess
    import sys

    env = script_env(script.parent / "store")
    killed = subprocess.run([sys.executable, str(script), "run"], env=env, cwd=script.parent,
                            capture_output=True, timeout=120)
    assert killed.returncode != 0
    out = subprocess.run([sys.executable, str(script), "show"], env=env, cwd=script.parent,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_a_crash_inside_a_step_keeps_it_and_its_children_in_the_graph(tmp_path: Path) -> None:
    script = write_script(tmp_path / "crashy.py", """
        import os, signal, sys
        import durably

        @durably.task
        def step(i):
            return i + 100

        @durably.task
        def hang(x):
            os.kill(os.getpid(), signal.SIGKILL)

        @durably.task
        def wrapper(x):
            return hang(step(x))

        @durably.entrypoint
        def crashy(n):
            return wrapper(sum(step(i) for i in range(n)))

        if __name__ == "__main__":
            if sys.argv[1:] == ["run"]:
                crashy.run(2, run_id="crashy-1")
            else:
                g = durably.get_run("crashy-1").graph()
                print([(n.task, n.status, g.node(n.parent).task if n.parent else None)
                       for n in g.nodes])
    """)
    assert _killed_then_shown(script).strip() == str([
        ("step", "ran", None), ("step", "ran", None), ("wrapper", "started", None),
        ("step", "ran", "wrapper")])


def test_a_crash_inside_a_map_item_keeps_the_item_as_the_parent_of_its_children(
        tmp_path: Path) -> None:
    """Items of a task.map on threads, inside a nested body, call tasks of their own; the
    process is killed while one item is between two of them: that item is in the graph
    (started), its finished child nested under it, as for a plain call (no step's parent
    is missing); the next call finishes the run, executing only what had not finished."""
    script = write_script(tmp_path / "crashy.py", """
        import os, signal, sys, time
        import durably

        @durably.task
        def leaf(x):
            if x == 105 and sys.argv[1:] == ["run"]:
                time.sleep(0.3)  # (the other items finish meanwhile)
                os.kill(os.getpid(), signal.SIGKILL)
            return x * 10

        @durably.task
        def item(x):
            first = leaf(x)
            time.sleep(0.05)
            return first + leaf(x + 100)

        @durably.task
        def mid(n):
            return sum(item.map(range(n), max_workers=4))

        @durably.entrypoint
        def job(n):
            return mid(n)

        if __name__ == "__main__":
            if sys.argv[1:] == ["show"]:
                run = durably.get_run("job-1")
                ids = {s.step_id for s in run.steps}
                print(sorted({(s.task, s.status) for s in run.steps
                              if s.parent_id is not None and s.parent_id not in ids}))
                print(sorted((s.task, s.status) for s in run.steps if s.task != "leaf"))
            else:
                print(job.run(8, run_id="job-1").result)
    """)
    orphans, callers = _killed_then_shown(script).strip().splitlines()
    assert orphans == "[]"  # every journaled step's parent is in the journal
    # (a step's latest record: the killed item started, the others ran)
    assert callers == str(sorted([("mid", "started"), ("item", "started")]
                                 + [("item", "ran")] * 7))
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(script), "again"], cwd=script.parent,
                          env=script_env(script.parent / "store"), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(sum(x * 10 + (x + 100) * 10 for x in range(8)))


@given(st.one_of(st.integers(), st.floats(allow_nan=True), st.booleans(), st.none(),
                 st.text(max_size=80)),
       st.integers(min_value=10, max_value=200))
@settings(max_examples=500, deadline=None)
def test_short_repr_of_plain_values_is_reprlibs(value: Any, limit: int) -> None:
    """short_repr returns plain scalars' repr directly: the text must be reprlib's, cut
    to the limit, as for every other value."""
    from durably._trace.tracer import _REPR, short_repr

    text = _REPR.repr(value)
    expected = text if len(text) <= limit else text[: limit - 3] + "..."
    assert short_repr(value, limit) == expected


class _Counted:
    """An element that counts how often its repr is written."""

    calls = 0

    def __repr__(self) -> str:
        _Counted.calls += 1
        return "c"


def test_short_repr_of_a_record_writes_only_what_it_shows() -> None:
    """A dataclass or pydantic model with its generated repr is described field by field, as
    reprlib describes a dict: its whole repr is never written (a graph's state holds a list
    that grows at every super-step). The text is the record's own repr when that is short;
    fields with repr=False stay out; a class's own __repr__ is used as before."""
    import dataclasses

    import pydantic

    from durably._trace.tracer import short_repr

    @dataclasses.dataclass
    class Chat:
        messages: list[Any]
        n: int = 0
        token: str = dataclasses.field(default="secret", repr=False)

    class Model(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(arbitrary_types_allowed=True)
        messages: list[Any] = []
        n: int = 0
        token: str = pydantic.Field(default="secret", repr=False)
        inner: Chat | None = None

    for record in (Chat([_Counted() for _ in range(10_000)], 3),
                   Model(messages=[_Counted() for _ in range(10_000)], n=3)):
        _Counted.calls = 0
        text = short_repr(record)
        assert _Counted.calls <= 5, type(record)  # (reprlib shows 5 elements of a list)
        assert "Chat(messages=[c, c, c, c, c, ...], n=3" in text or text.startswith(
            "Model(messages=[c, c, c, c, c, ...], n=3, inner=None")
        assert "secret" not in text
    small = (Chat(["hi"], 2), Model(messages=["hi"], n=2, inner=Chat([], 1)))
    for record in small:
        assert short_repr(record) == repr(record)

    @dataclasses.dataclass
    class Own:
        x: int

        def __repr__(self) -> str:
            return "Own!"

    assert short_repr(Own(1)) == "Own!"
    assert short_repr([Chat([], 1)]) == f"[{Chat([], 1)!r}]"


def test_a_step_given_an_element_of_an_earlier_result_draws_a_fan_out_edge() -> None:
    """rows = load(); process(row) for each row (a loop, or process.map): an edge from load
    to every process, in the live run, read back from the journal, and when replayed."""
    from durably._keys.hashing import trace_digest

    @task
    def load(n: int) -> list[dict[str, Any]]:
        return [{"id": i, "name": f"row {i}"} for i in range(n)]

    @task
    def pages(n: int) -> dict[str, str]:
        return {f"p{i}": f"text of page {i}" for i in range(n)}

    @task
    def process(row: dict[str, Any]) -> str:
        return f"{row['name']}!"

    @task
    def words(text: str) -> int:
        return len(text.split())

    @task
    def pair() -> tuple[str, int, None]:
        return ("a long name", 3, None)

    @task
    def show(name: str) -> str:
        return name.upper()

    @entrypoint
    def etl(n: int) -> int:
        rows = load(n)
        done = [process(r) for r in rows[:2]] + process.map(rows[2:])
        counts = [words(text) for text in pages(2).values()]
        show(pair()[0])
        return len(done) + sum(counts)

    run = etl.run(4)
    by_id = {s.step_id: _n(s.task) for s in run.steps}
    # the results are known by identity (see _trace.producers): the step given one of their
    # elements names the step that returned it; no digest of a result is taken
    loaded = next(s for s in run.steps if _n(s.task) == "load")
    assert (loaded.result_digest, loaded.output_digests) == ("", ())
    first = next(s for s in run.steps if _n(s.task) == "process")
    assert source_token(loaded.step_id) in first.input_digests
    assert trace_digest(load(4)[0]) in first.input_digests  # (and its digest, as before)

    def fan_out(graph: Any) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for e in graph.edges:
            found.setdefault(by_id[e.source], []).append(by_id[e.target])
        return found

    for graph in (run.graph(), durably.get_run(run.id).graph()):
        assert fan_out(graph) == {"load": ["process"] * 4, "pages": ["words"] * 2,
                                  "pair": ["show"]}
    again = etl.run(4)
    assert {k for k, v in again.counts().items() if v} == {"replayed"}
    assert fan_out(again.graph()) == {"load": ["process"] * 4, "pages": ["words"] * 2,
                                      "pair": ["show"]}


class _Split(NamedTuple):
    train: list[int]
    test: list[int]


class _Rows(list[str]):
    pass


def test_a_result_unpacked_before_it_is_passed_on_draws_its_edges() -> None:
    """train, test = split(data): a NamedTuple (or a list subclass) unpacked, each part
    passed to a later step, drew no edge (only exact tuples and lists offered their
    elements' digests)."""
    @task
    def split(n: int) -> _Split:
        return _Split(list(range(n)), list(range(n, 2 * n)))

    @task
    def names(n: int) -> _Rows:
        return _Rows(f"name {i}" for i in range(n))

    @task
    def fit(xs: list[int]) -> int:
        return sum(xs) + 100

    @task
    def shout(name: str) -> str:
        return name.upper()

    @entrypoint
    def train(n: int) -> tuple[int, int, str, str]:
        train_set, test_set = split(n)
        first, second = names(2)
        return fit(train_set), fit(test_set), shout(first), shout(second)

    run = train.run(5)
    by_id = {s.step_id: _n(s.task) for s in run.steps}
    for graph in (run.graph(), durably.get_run(run.id).graph(), train.run(5).graph()):
        assert sorted((by_id[e.source], by_id[e.target]) for e in graph.edges) == [
            ("names", "shout"), ("names", "shout"), ("split", "fit"), ("split", "fit")]


_hex32 = st.text("0123456789abcdef", min_size=32, max_size=32)


@settings(max_examples=200, deadline=None)
@given(result=st.just("") | _hex32, inputs=st.lists(_hex32, max_size=4),
       outputs=st.lists(st.just("") | _hex32, max_size=6))
def test_step_rows_keep_the_digests_of_the_result_and_its_elements(
        result: str, inputs: list[str], outputs: list[str]) -> None:
    """A step record's digests survive the journal's row (a result without a digest of its
    own keeps no element digests: nothing could be drawn from it)."""
    from durably._store.disk.rows import step_from_row, step_row
    from durably._store.records import StepRecord

    r = StepRecord("run", "s" * 32, None, "t", "ran", 1, 0, 1.0, 2.0, None, "", None, None,
                   result, tuple(inputs), tuple(outputs))
    back = step_from_row(step_row(r))
    assert back.result_digest == result and back.input_digests == tuple(inputs)
    assert back.output_digests == (tuple(outputs) if result else ())


def test_a_step_is_not_drawn_as_the_source_of_the_steps_it_called() -> None:
    """A step's result exists once it returned: the steps it called before (given elements
    equal to its result's) received them from where they came, not from it. numpy's
    scalars are as common as Python's (no edge for np.int64(0))."""
    import numpy as np

    @task
    def load_ids() -> list[str]:
        return ["id-100", "id-200"]

    @task
    def upload(item_id: str) -> str:
        return f"uploaded {item_id}"

    @task
    def sync(ids: list[str]) -> list[str]:
        for i in ids:
            upload(i)
        return ids

    @task
    def stats() -> dict[str, Any]:
        return {"missing": np.int64(0), "ok": np.bool_(True)}

    @task
    def check(ok: Any, missing: Any) -> str:
        return "checked"

    @entrypoint
    def pipe() -> str:
        sync(load_ids())
        stats()
        return check(np.bool_(True), np.int64(0))

    run = pipe.run()
    name = {s.step_id: _n(s.task) for s in run.steps}
    edges = sorted((name[e.source], name[e.target]) for e in run.graph().edges)
    assert edges == [("load_ids", "sync"), ("load_ids", "upload"), ("load_ids", "upload")]


def test_a_large_result_keeps_the_digests_of_its_first_elements() -> None:
    """A result of more than MAX_RESULT_ELEMENTS elements keeps its first ones: the steps
    given those draw their edges (the size and the cost stay bounded, with no cliff)."""
    from durably._keys.hashing import MAX_RESULT_ELEMENTS

    @task
    def rows(n: int) -> list[str]:
        return [f"row {i}" for i in range(n)]

    @task
    def handle(row: str) -> int:
        return len(row)

    @entrypoint
    def many(n: int) -> int:
        got = rows(n)
        return handle(got[0]) + handle(got[-1])

    run = many.run(MAX_RESULT_ELEMENTS + 500)
    produced = next(s for s in run.steps if _n(s.task) == "rows")
    given = [s.input_digests for s in run.steps if _n(s.task) == "handle"]
    assert [source_token(produced.step_id) in d for d in given] == [True, False]
    handles = [s.step_id for s in run.steps if _n(s.task) == "handle"]
    assert [e.target for e in run.graph().edges] == handles[:1]  # the first row's step


def test_a_list_returned_by_a_step_flows_from_it_not_from_its_last_item() -> None:
    """report(evaluate()), evaluate returning [score(1), score(2), score(3)]: the edge into
    report comes from evaluate (the step that handed the scores on), not also from the last
    score (evaluate's result was taken as returned before the last score's, though it
    returned after it: a stray edge from one of three scores)."""
    @durably.task
    def score(w: float) -> float:
        return w * 101.5

    @durably.task
    def evaluate() -> list[float]:
        return [score(w) for w in (1.0, 2.0, 3.0)]

    @durably.task
    def report(xs: list[float]) -> float:
        return max(xs)

    @durably.entrypoint
    def nested() -> float:
        return report(evaluate())

    graph = nested.run().graph()
    task_of = {n.id: n.task.rpartition(".")[2] for n in graph.nodes}
    into_report = sorted(task_of[e.source] for e in graph.edges
                         if task_of[e.target] == "report")
    assert into_report == ["evaluate"]


def test_a_child_on_another_thread_is_journaled_after_its_parent_s_start(
        disk_store: durably.DiskStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step's body calls tasks from threads of its own: the first child journals that
    the step started, and a child on another thread meanwhile waits for that record before
    it executes. Its record is never committed first (killed between the two, the journal
    would hold a child whose parent it does not name)."""
    import concurrent.futures
    import contextvars
    import time

    real = disk_store.append_steps_if_current

    def slow_start(steps: Any) -> Any:
        if any(rec.status == "started" for rec, _ in steps):
            time.sleep(0.3)  # (the other thread's child would be journaled meanwhile)
        return real(steps)

    monkeypatch.setattr(disk_store, "append_steps_if_current", slow_start)

    @task
    def leaf(x: int) -> int:
        return x * 10

    @task
    def fan(n: int) -> int:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            # (each call in a copy of this thread's context: inside the step, as durably's
            # own fan-outs do)
            calls = [pool.submit(contextvars.copy_context().run, leaf, x) for x in range(n)]
            return sum(f.result() for f in calls)

    @entrypoint
    def job(n: int) -> int:
        return fan(n)

    run = job.run(2)
    assert run.result == 10
    with sqlite3.connect(disk_store.path / "journal.sqlite3") as con:
        order = [(task, status) for task, status in con.execute(
            "SELECT task, status FROM steps WHERE run_id=? ORDER BY rowid", (run.id,))]
    assert [_n(t) for t, _ in order] == ["fan", "leaf", "leaf", "fan"]
    assert order[0][1] == "started" and order[-1][1] == "ran"


@durably.task
def _sq(x: int) -> int:
    return x * x


def test_a_graph_s_collapse_must_be_a_number_of_calls(store: Any) -> None:
    """``run.graph(collapse=-1)`` looped for ever (every group is larger than -1, so the
    graph never stopped changing); a wrong type raised a bare TypeError."""
    @durably.entrypoint(store=store)
    def few(n: int) -> int:
        return sum(_sq(i) for i in range(n))

    run = few.run(3)
    for bad in (-1, "x", 2.5, True):
        with pytest.raises(durably.DefinitionError, match="collapse"):
            run.graph(collapse=bad)  # type: ignore[arg-type]
    assert len(run.graph(collapse=0).nodes) == len(run.graph(collapse=None).nodes) == 3
    assert len(run.graph(collapse=2).nodes) == 1  # (3 calls of one task: one node)
    import numpy as np

    assert len(run.graph(collapse=np.int64(2)).nodes) == 1  # type: ignore[arg-type]


@durably.task
def _leaf(i: int) -> int:
    if i % 3 == 0:
        raise RuntimeError(f"leaf {i} failed")
    return i


@durably.task
def _branch(k: int) -> int:
    return sum(_leaf.map([k * 100 + j for j in range(1, 9)]))


def test_a_collapsed_nested_fan_out_counts_every_call_it_stands_for(store: Any) -> None:
    """A map inside each call of a map: the inner calls, collapsed under each outer call,
    are collapsed again under the outer group; that node counts every inner call, by status
    (it counted the groups it merged: ``leaf ×5 · 5 failed`` for 40 calls)."""
    @durably.entrypoint(store=store)
    def nested(n: int) -> int:
        return sum(_branch.map(list(range(n))))

    with pytest.raises(ExceptionGroup):
        nested(5)
    run = durably.list_runs(nested, store=store)[0]
    every = run.graph(collapse=None)
    truth: dict[str, int] = {}
    for n in every.nodes:
        if n.task == _n("_leaf"):
            truth[n.status] = truth.get(n.status, 0) + 1
    assert sum(truth.values()) == 40 and truth.get("failed", 0) > 0 and truth.get("ran", 0) > 0
    graph = run.graph(collapse=4)
    (branches,) = [n for n in graph.nodes if n.task == _n("_branch")]
    (leaves,) = [n for n in graph.nodes if n.task == _n("_leaf")]
    assert (branches.count, leaves.count) == (5, 40) and leaves.parent == branches.id
    assert dict(leaves.statuses) == truth and leaves.status == "failed"
    assert sorted(leaves.steps) == sorted(n.id for n in every.nodes if n.task == _n("_leaf"))
    assert graph.counts() == every.counts()
    drawn = f"_leaf ×40<br/>{truth['ran']} ran · {truth['failed']} failed<br/>"
    assert drawn in render.to_mermaid(graph)
    # the dashboard expands the inner group as it expands the outer one: its calls (5)
    # drawn one by one, each with its own group of inner calls
    pytest.importorskip("starlette", reason="pip install -e '.[test]'")
    from .test_ui import client

    c = client(store)
    found = c.get(f"/api/runs/{run.id}/graph?collapse=4").json()
    assert sorted(found["groups"].values()) == [5, 5]
    expanded = run.graph(collapse=5)
    inner = [n for n in expanded.nodes if n.task == _n("_leaf")]
    assert [n.count for n in inner] == [8] * 5
    assert sum(n.statuses.get("failed", 0) for n in inner) == truth["failed"]


# -- data flow by identity (_trace.producers) ------------------------------------------------
def test_a_result_from_an_earlier_attempt_flows_into_a_step_executed_after_resume() -> None:
    """A step replayed on resume is known as the source of what it returned: the step that
    executes after the crash and is given it draws the edge; an equal copy draws none."""
    failing = {"on": True}

    @task
    def load_r(n: int) -> list[dict[str, int]]:
        return [{"row": i} for i in range(n)]

    @task
    def passed_on(rows: list[dict[str, int]]) -> list[dict[str, int]]:
        return rows

    @task
    def count_r(rows: list[dict[str, int]], copy: list[dict[str, int]]) -> int:
        return len(rows) + len(copy)

    @entrypoint
    def job_r(n: int) -> int:
        rows = load_r(n)
        if failing["on"]:
            raise RuntimeError("crash after load_r")
        return count_r(passed_on(rows), [dict(r) for r in rows])

    with pytest.raises(RuntimeError):
        job_r.run(3, run_id="resumed-flow")
    failing["on"] = False
    run = job_r.run(3, run_id="resumed-flow")
    assert run.counts()["replayed"] == 1
    by_id = {s.step_id: _n(s.task) for s in run.steps}
    edges = sorted((by_id[e.source], by_id[e.target]) for e in run.graph().edges)
    # passed_on returned the list it was given: it is count_r's source, not load_r; the
    # copy's rows are other objects (equal ones): no edge from them
    assert edges == [("load_r", "passed_on"), ("passed_on", "count_r")]
    assert sorted(
        (by_id[e.source], by_id[e.target]) for e in durably.get_run(run.id).graph().edges
    ) == edges


def test_the_flow_record_lets_go_of_results_nothing_else_holds() -> None:
    """A run whose steps' results are dropped as it goes does not keep them alive for its
    edges: the record of producers holds about twice the results still in use at most; and
    an object made where a dropped result was (its id reused) draws no edge."""
    from durably._runtime.context import current_run

    @task
    def make(i: int) -> list[int]:
        return [i, i * 1000 + 100_003]

    @task
    def use(values: list[int]) -> int:
        return len(values)

    held: list[int] = []

    @entrypoint
    def churn(n: int) -> int:
        ctx = current_run.get()
        assert ctx is not None
        kept = make(-1)
        for i in range(n):
            make(i)  # (dropped at once)
            held.append(len(ctx.producers._by_id))
        return use(kept) + use([5, 6 * 1000])  # (a new list, made after the others died)

    run = churn.run(6000)
    assert run.result == 4
    assert max(held) <= 2 * 1024 + 4  # (not 3 objects for each of the 6,000 steps)
    by_id = {s.step_id: (_n(s.task), s.inputs) for s in run.steps}
    assert [(by_id[e.source][0], by_id[e.target]) for e in run.graph(collapse=None).edges] \
        == [("make", ("use", "values=[-1, 99003]"))]


def test_an_object_whose_id_is_reused_after_it_was_let_go_draws_no_edge() -> None:
    """The record holds each object it names (so its id cannot be reused meanwhile) and
    names it only while that very object is given (``is``)."""
    import gc

    from durably._trace.producers import Producers

    p = Producers()
    made = [[f"row {i}", 10**6 + i] for i in range(50)]
    ids = {id(x) for x in made}
    for x in made:
        p.returned(x, "producer")
    del made, x
    gc.collect()
    p._sweep()
    p._sweep()  # (the elements go once the lists that held them are gone)
    assert p._by_id == {}
    again = [[f"row {i}", 10**6 + i] for i in range(200)]  # (CPython reuses the memory)
    assert {id(x) for x in again} & ids  # an id reused: the case this test is about
    assert p.sources({"values": again}) == ()


class _Model:
    """A result type that takes weak references (as numpy arrays and dataframes do)."""

    def __init__(self, n: int) -> None:
        self.n = n


def test_a_result_that_takes_weak_references_is_never_kept_alive_for_its_edges() -> None:
    """An object that takes weak references is noted by one: dropped by the run, it is
    freed at once, and another object made where it was draws no edge; one still held
    draws its edge."""
    import weakref

    from durably._trace.producers import Producers

    p = Producers()
    kept = _Model(1)
    p.returned(kept, "fit")
    dropped = _Model(2)
    p.returned(dropped, "fit")
    gone = weakref.ref(dropped)
    del dropped
    assert gone() is None  # (freed at once: the record held it weakly)
    again = [_Model(i) for i in range(50)]
    assert p.sources({"models": again}) == ()
    assert p.sources({"model": kept, "models": [kept]}) == ("fit", "fit")


def test_results_replayed_before_more_than_later_replays_still_flow() -> None:
    """The results of replayed steps are noted in order when a step executes, or every
    LATER replays (so no more than that are held unnoted): a resumed run whose first
    executed step is given the result of its first replayed step, after more than LATER
    replays, draws that edge, and no other."""
    from durably._trace.producers import LATER

    failing = {"on": True}

    @task
    def part(i: int) -> list[str]:
        return [f"part {i}", f"of {i}"]

    @task
    def join_first(first: list[str]) -> str:
        return " ".join(first)

    @entrypoint
    def parts(n: int) -> str:
        made = [part(i) for i in range(n)]
        if failing["on"]:
            raise RuntimeError("crash after the parts")
        return join_first(made[0])

    n = LATER + 50
    with pytest.raises(RuntimeError):
        parts.run(n, run_id="many-replays")
    failing["on"] = False
    run = parts.run(n, run_id="many-replays")
    assert run.counts()["replayed"] == n
    first = min((s for s in run.steps if _n(s.task) == "part"),
                key=lambda s: s.position).step_id  # (part(0): the first call)
    joined = next(s.step_id for s in run.steps if _n(s.task) == "join_first")
    assert [(e.source, e.target) for e in run.graph(collapse=None).edges] == [(first, joined)]
