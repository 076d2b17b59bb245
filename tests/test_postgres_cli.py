"""The ``durably`` command on a PostgreSQL store: real runs (a pipeline, a run that fails and
is continued, an ``interrupt()`` answered later, a fork, a StateGraph) written by real
scripts, then read, resumed, forked, pruned and deleted by the real command in subprocesses,
with ``--store URL`` and with ``$DURABLY_STORE``; a signed store (``$DURABLY_KEY``); errors
that name the store without its password; and the store's maintenance (collecting blobs no
row refers to, setting a damaged step aside).

The server: ``$DURABLY_TEST_POSTGRES`` (see postgres_server.py). Each test has a schema of
its own, dropped when it ends.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import durably

from .conftest import write_script
from .postgres_server import (
    drop_schemas,
    fresh_schema,
    server_setting,
    server_url,
    with_schema,
)

pytestmark = pytest.mark.slow

SRC = Path(__file__).resolve().parent.parent / "src"
KEY = "0123456789abcdef0123456789abcdef"

FLOWS = """
import os
import pathlib
import time
from typing import TypedDict

import durably
from durably import END, START, StateGraph


@durably.task
def load(n):
    return list(range(n))


@durably.task
def square(x):
    return x * x


@durably.task
def total(xs):
    return sum(xs)


@durably.entrypoint
def pipeline(n):
    return total([square(x) for x in load(n)])


@durably.task
def flaky(x):
    if os.environ.get("FLOWS_FAIL") == "1":
        raise ValueError(f"flaky failed on {x}")
    return x + 1


@durably.entrypoint
def fragile(n):
    return flaky(square(n))


@durably.task
def draft(topic):
    return f"a draft on {topic}"


@durably.task
def review(text):
    return durably.interrupt({"please review": text})


@durably.entrypoint
def approve(topic):
    text = draft(topic)
    return f"{text}: {review(text)}"


@durably.task
def big(n):
    return bytes(range(256)) * n


@durably.entrypoint
def bigflow(n):
    return len(big(n))


@durably.task
def wait_for(path):
    while not pathlib.Path(path).exists():
        time.sleep(0.05)
    return "released"


@durably.entrypoint
def holder(path):
    return wait_for(path)


class Article(TypedDict):
    topic: str
    draft: str
    verdict: str


def write(state):
    return {"draft": f"a post about {state['topic']}"}


def ask(state):
    return {"verdict": str(durably.interrupt({"approve?": state["draft"]}))}


def publish(state):
    return {"draft": state["draft"].upper() + " (" + state["verdict"] + ")"}


builder = StateGraph(Article, name="article")
builder.add_node("write", write).add_node("ask", ask).add_node("publish", publish)
builder.add_edge(START, "write").add_edge("write", "ask").add_edge("ask", "publish")
builder.add_edge("publish", END)
article = builder.compile()
"""

START = """
import json
import os

import durably
import flows

ids = {"p4": flows.pipeline.run(4).id, "p3": flows.pipeline.run(3).id}
os.environ["FLOWS_FAIL"] = "1"
for n in (5, 6):
    try:
        flows.fragile.run(n)
    except ValueError:
        pass
del os.environ["FLOWS_FAIL"]
ids["resumed"] = flows.fragile.run(5).id  # failed once, then continued: finished, attempt 2
ids["failed"] = [r.id for r in durably.list_runs("fragile") if r.status == "failed"][0]
ids["approve"] = flows.approve.run("owls").id  # paused at interrupt()
ids["article"] = flows.article.run({"topic": "owls", "draft": "", "verdict": ""}).id
print(json.dumps(ids))
"""


# -- helpers ------------------------------------------------------------------------------------
def environ(**extra: str) -> dict[str, str]:
    """This process's environment without pytest's, durably's or libpq's settings, with the
    source tree first on the path."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST", "DURABLY_", "PG"))}
    env["PYTHONPATH"] = str(SRC)
    env.update(extra)
    return env


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run the ``durably`` command (``python -m durably``) in a subprocess."""
    return subprocess.run([sys.executable, "-m", "durably", *args], cwd=cwd,
                          env=env if env is not None else environ(), capture_output=True,
                          text=True, timeout=timeout)


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr
    return proc.stdout


def fails(proc: subprocess.CompletedProcess[str], *words: str, code: int = 1) -> str:
    """The error line, checked: one line on stderr, no traceback, the exit status."""
    assert proc.returncode == code, f"exit {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("durably: error: "), proc.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def as_json(proc: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(ok(proc))


def python(script: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, str(script)], cwd=script.parent, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"script failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def sql(statement: str, params: Any = None) -> list[Any]:
    """Run a statement on the test server (as its superuser); the rows it returns."""
    import psycopg

    with psycopg.connect(server_url(), autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else []


def schema_exists(schema: str) -> bool:
    return bool(sql("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)))


def tcp() -> tuple[str, str]:
    """The test server's URL over TCP for the role with a password, and that password."""
    server_url()  # (skips, or fails in CI)
    what = "no password role on the test server"
    return (server_setting("DURABLY_TEST_POSTGRES_TCP", what),
            server_setting("DURABLY_TEST_POSTGRES_PASSWORD", what))


@pytest.fixture
def schemas() -> Iterator[list[str]]:
    """Schemas a test made on the server (dropped after it)."""
    made: list[str] = []
    yield made
    drop_schemas(server_url(), made)


class Project:
    """A project directory with ``flows.py``, and a PostgreSQL store written by running it."""

    def __init__(self, path: Path, schema: str, url: str, ids: dict[str, str]) -> None:
        self.path, self.schema, self.url, self.ids = path, schema, url, ids

    def cli(self, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        """The command on this store, by ``--store URL``."""
        return cli("--store", self.url, *args, cwd=self.path, env=environ(**extra))

    def env(self, **extra: str) -> dict[str, str]:
        """The environment that makes this store the default (``$DURABLY_STORE``)."""
        return environ(DURABLY_STORE=self.url, **extra)


@pytest.fixture
def project(tmp_path: Path, schemas: list[str]) -> Project:
    schema = fresh_schema()
    schemas.append(schema)
    url = with_schema(server_url(), schema) + "&allow_unsigned=true"
    path = tmp_path / "project"
    path.mkdir()
    write_script(path / "flows.py", FLOWS)
    start = write_script(path / "start.py", START)
    proc = python(start, environ(DURABLY_STORE=url))
    return Project(path, schema, url, json.loads(proc.stdout.strip().splitlines()[-1]))


# -- reading runs -------------------------------------------------------------------------------
def test_runs_lists_every_run_by_store_url_and_by_durably_store(project: Project) -> None:
    p = project
    runs = as_json(p.cli("runs", "--json"))
    assert {r["id"] for r in runs} == set(p.ids.values()) and len(runs) == 6
    status = {r["id"]: (r["status"], r["attempt"]) for r in runs}
    assert status == {p.ids["p4"]: ("finished", 1), p.ids["p3"]: ("finished", 1),
                      p.ids["resumed"]: ("finished", 2), p.ids["failed"]: ("failed", 1),
                      p.ids["approve"]: ("interrupted", 1),
                      p.ids["article"]: ("interrupted", 1)}
    assert runs[0]["id"] == p.ids["article"]  # most recently updated first
    # $DURABLY_STORE, and --store after the command's name, name the same store
    assert as_json(cli("runs", "--json", cwd=p.path, env=p.env())) == runs
    assert as_json(cli("runs", "--json", "--store", p.url, cwd=p.path)) == runs
    text = ok(cli("runs", cwd=p.path, env=p.env()))
    assert text.splitlines()[0].split() == ["RUN", "ENTRYPOINT", "STATUS", "ATTEMPT", "UPDATED"]
    assert len(text.splitlines()) == 7 and all(run_id in text for run_id in p.ids.values())
    paused = as_json(p.cli("runs", "--status", "interrupted", "--json"))
    assert {r["id"] for r in paused} == {p.ids["approve"], p.ids["article"]}
    assert {r["entrypoint"] for r in paused} == {"flows:approve", "flows:article"}
    pipelines = as_json(p.cli("runs", "-e", "pipeline", "--json"))
    assert {r["id"] for r in pipelines} == {p.ids["p4"], p.ids["p3"]}
    assert "(2 of 6 runs; --limit 0 lists all)" in ok(p.cli("runs", "-n", "2"))
    nothing = ok(p.cli("runs", "--status", "running"))
    assert nothing.startswith("no running runs in the store at postgresql://")
    assert f"(schema {p.schema})" in nothing


def test_show_gives_steps_counts_results_errors_and_interrupts(project: Project) -> None:
    p = project
    text = ok(p.cli("show", p.ids["p4"]))
    assert "finished (attempt 1)" in text and "flows:pipeline" in text
    assert "6 — 6 ran, 0 cached, 0 replayed, 0 failed" in text
    assert [line.split()[1] for line in text.splitlines() if line[:1].isdigit()] == [
        "load", "square", "square", "square", "square", "total"]
    shown = as_json(p.cli("show", p.ids["p4"][:14], "--json"))  # a unique prefix
    assert shown["id"] == p.ids["p4"] and shown["result"] == 14
    assert [s["output"] for s in shown["steps"]] == ["[0, 1, 2, 3]", "0", "1", "4", "9", "14"]
    # the second pipeline found three squares in the cache the first one wrote
    p3 = as_json(p.cli("show", p.ids["p3"], "--json"))
    assert p3["counts"] == {"ran": 2, "cached": 3, "replayed": 0, "failed": 0}
    assert p3["result"] == 5
    assert "cache hits 3 of 5 (60%)" in ok(p.cli("show", p.ids["p3"]))
    # failed, then continued: every attempt's steps with --all
    resumed = as_json(p.cli("show", p.ids["resumed"], "--all", "--json"))
    assert (resumed["status"], resumed["attempt"], resumed["result"]) == ("finished", 2, 26)
    assert [(s["attempt"], s["task"], s["status"]) for s in resumed["steps"]] == [
        (1, "square", "ran"), (1, "flaky", "failed"), (2, "square", "replayed"),
        (2, "flaky", "ran")]
    assert "flaky failed on 25" in resumed["steps"][1]["error"]
    failed = ok(p.cli("show", p.ids["failed"]))
    assert "failed (attempt 1)" in failed and "flaky failed on 36" in failed
    # paused at interrupt(): the question and the command that answers it
    paused = ok(p.cli("show", p.ids["approve"]))
    assert "interrupted (attempt 1)" in paused and "waiting for 1 answer" in paused
    assert "{'please review': 'a draft on owls'}" in paused
    assert f"durably resume flows:approve {p.ids['approve']} --value JSON" in paused
    fails(p.cli("show", "pipeline-"), "names 2 runs")
    fails(p.cli("show", "no-such-run"), "no run 'no-such-run'", f"(schema {p.schema})")


def test_history_and_graph(project: Project, tmp_path: Path) -> None:
    p = project
    points = as_json(p.cli("history", p.ids["approve"], "--json"))
    assert [(c["kind"], c["task"]) for c in points] == [("interrupt", "review"),
                                                        ("step", "draft")]
    assert points[0]["state"] == "{'please review': 'a draft on owls'}"
    text = ok(p.cli("history", p.ids["p4"]))
    assert text.splitlines()[0].split()[:3] == ["CHECKPOINT", "KIND", "TASK"]
    assert len(text.splitlines()) == 7  # one checkpoint per finished step
    mermaid = ok(p.cli("graph", p.ids["p4"]))
    assert "flowchart TD" in mermaid and mermaid.count("square<br/>ran") == 4
    assert p.ids["p4"] in mermaid
    dot = ok(p.cli("graph", p.ids["p4"], "-f", "dot"))
    assert dot.startswith("digraph") and "total" in dot
    failed = ok(p.cli("graph", p.ids["resumed"], "--attempt", "1"))
    assert "flaky<br/>failed" in failed
    proc = p.cli("graph", p.ids["approve"], "-o", str(tmp_path / "approve.html"))
    ok(proc)
    assert "wrote the graph" in proc.stderr
    html = (tmp_path / "approve.html").read_text(encoding="utf-8")
    assert "<html" in html and "review" in html
    ok(p.cli("graph", p.ids["p3"], "-o", str(tmp_path / "p3.mmd")))
    assert (tmp_path / "p3.mmd").read_text(encoding="utf-8") == ok(p.cli("graph", p.ids["p3"]))


# -- continuing runs ----------------------------------------------------------------------------
def test_resume_an_interrupt_and_a_failed_run_then_fork(project: Project) -> None:
    p = project
    run = p.ids["approve"]
    text = ok(cli("resume", "flows:approve", run, "--value", '"yes"', cwd=p.path, env=p.env()))
    assert f"run {run!r} finished" in text and "'a draft on owls: yes'" in text
    assert "finished (attempt 2)" in ok(p.cli("show", run))
    fails(p.cli("resume", "flows:approve", run, "--value", '"yes"'),
          "is finished, not interrupted")
    # the failed run, continued with what it finished kept
    failed = p.ids["failed"]
    text = ok(p.cli("resume", "flows:fragile", failed, "--keep-finished"))
    assert f"run {failed!r} finished" in text and "result: 37" in text
    shown = as_json(p.cli("show", failed, "--json"))
    assert (shown["status"], shown["attempt"], shown["result"]) == ("finished", 2, 37)
    assert [(s["task"], s["status"]) for s in shown["steps"]] == [("square", "replayed"),
                                                                  ("flaky", "ran")]
    # fork the first pipeline at its first square, with a new result for that step
    points = as_json(p.cli("history", p.ids["p4"], "--json"))
    first_square = [c for c in points if c["task"] == "square"][-1]
    assert first_square["state"] == "0"
    text = ok(p.cli("fork", p.ids["p4"], "--at", first_square["id"][:8], "--update", "100"))
    assert f"at checkpoint {first_square['id'][:12]} (step square)" in text
    assert "result: 114" in text  # 100 + 1 + 4 + 9
    runs = as_json(p.cli("runs", "--json"))
    fork = runs[0]
    assert fork["id"].startswith(p.ids["p4"] + "-fork-") and fork["status"] == "finished"
    assert as_json(p.cli("show", fork["id"], "--json"))["result"] == 114
    assert as_json(p.cli("show", p.ids["p4"], "--json"))["result"] == 14  # the source kept
    # a fork of a paused run at its interrupt pauses again (exit status 3)
    paused = p.cli("fork", p.ids["article"])
    assert paused.returncode == 3 and "waiting for 1 answer" in paused.stdout, paused.stderr


def test_a_stategraph_run_is_resumed_shown_and_drawn(project: Project) -> None:
    p = project
    run = p.ids["article"]
    shown = ok(p.cli("show", run))
    assert "waiting for 1 answer" in shown and "{'approve?': 'a post about owls'}" in shown
    text = ok(p.cli("resume", "flows:article", run, "--value", '"ok"'))
    assert f"run {run!r} finished" in text and "A POST ABOUT OWLS (ok)" in text
    result = as_json(p.cli("show", run, "--json"))["result"]
    assert result == {"topic": "owls", "draft": "A POST ABOUT OWLS (ok)", "verdict": "ok"}
    history = ok(p.cli("history", run))
    assert "article::superstep" in history and "interrupt" in history
    assert "flowchart TD" in ok(p.cli("graph", run))


_TIMES = {"created", "updated", "started", "ended", "duration", "time", "oldest", "newest",
          "path", "bytes", "entry_bytes", "size_limit"}


def _untimed(value: Any) -> Any:
    """A JSON value without the fields that differ between two stores written apart (times,
    sizes, where the store is)."""
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if k not in _TIMES}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    if isinstance(value, str):
        return re.sub(r"\(written [^)]*\)", "(written ...)", value)
    return value


def test_the_command_says_the_same_of_it_as_of_a_store_directory(project: Project) -> None:
    """The same workload written to a store directory: every command's JSON agrees (but
    for times and sizes), before and after the runs are continued from the command."""
    p = project
    disk = p.path / "store"
    proc = python(p.path / "start.py", environ(DURABLY_STORE=str(disk)))
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == p.ids

    def same(*args: str) -> None:
        on_pg = as_json(p.cli(*args, "--json"))
        on_disk = as_json(cli("--store", str(disk), *args, "--json", cwd=p.path))
        assert _untimed(on_pg) == _untimed(on_disk), args

    def everything() -> None:
        same("runs")
        same("cache", "stats")
        for run in p.ids.values():
            same("show", run, "--all")
            same("history", run)

    everything()
    for args in (["resume", "flows:approve", p.ids["approve"], "--value", '"yes"'],
                 ["resume", "flows:article", p.ids["article"], "--value", '"ok"'],
                 ["resume", "flows:fragile", p.ids["failed"], "--keep-finished"]):
        on_pg = ok(p.cli(*args)).splitlines()
        on_disk = ok(cli("--store", str(disk), *args, cwd=p.path)).splitlines()
        assert on_pg[1:] == on_disk[1:]  # (the first line says how long it took)
    everything()
    same("explain", "flows:square", "3")
    for args in (["cache", "clear", "--task", "square"], ["cache", "prune", "--max-size", "0"]):
        on_pg = ok(p.cli(*args)).splitlines()[-1]
        on_disk = ok(cli("--store", str(disk), *args, cwd=p.path)).splitlines()[-1]
        assert on_pg.split(" from ")[0] == on_disk.split(" from ")[0]  # removed N entries
        same("cache", "stats")
    same("explain", "flows:square", "3")


# -- the cache ----------------------------------------------------------------------------------
def _entries(p: Project) -> dict[str, int]:
    stats = as_json(p.cli("cache", "stats", "--json"))
    return {t["task"]: t["entries"] for t in stats["tasks"]}


def test_cache_stats(project: Project) -> None:
    p = project
    store = durably.open_store(p.url)  # an entry without a key record (a crash's, re-put)
    store.cache_put("f" * 32, b"an entry without a key record")
    store.close()
    stats = as_json(p.cli("cache", "stats", "--json"))
    assert stats["path"].startswith("postgresql://")
    assert stats["path"].endswith(f"(schema {p.schema})")
    tasks = {t["task"]: t for t in stats["tasks"]}
    # squares 0-3 (p4), 5 and 6 (fragile); 0-2 found in the cache by p3
    assert (tasks["flows:square"]["entries"], tasks["flows:square"]["ran"],
            tasks["flows:square"]["cached"]) == (6, 6, 3)
    assert tasks["flows:load"]["entries"] == 2 and tasks["flows:total"]["entries"] == 2
    assert tasks["flows:flaky"]["entries"] == 1  # the try that failed is not cached
    assert "flows:review" not in tasks  # asked a person: never cached
    assert tasks["(unknown task)"]["entries"] == 1
    assert stats["entries"] == sum(t["entries"] for t in stats["tasks"])
    assert stats["bytes"] == sum(t["bytes"] for t in stats["tasks"]) > 0
    assert stats["runs"] == 6
    assert stats["hit_rate"] == pytest.approx(stats["cached"] / (stats["cached"] + stats["ran"]))
    text = ok(cli("cache", "stats", cwd=p.path, env=p.env()))
    assert "hit rate" in text and "flows:square" in text and f"(schema {p.schema})" in text
    assert text.splitlines()[0].startswith("store     postgresql://")


def test_cache_prune_and_clear_keep_the_journals(project: Project) -> None:
    p = project
    before = _entries(p)
    count = sum(before.values())
    # nothing is 30 days old, until load's entries are made so (stored then)
    assert "removed 0 cache entries" in ok(p.cli("cache", "prune", "--older-than", "30d"))
    sql(f"UPDATE {p.schema}.cache SET stored = stored - 40 * 86400 "
        f"WHERE key IN (SELECT cache_key FROM {p.schema}.keys WHERE task = 'flows:load')")
    assert "would remove 2 cache entries" in ok(p.cli("cache", "prune", "--older-than", "30d",
                                                      "--dry-run"))
    text = ok(p.cli("cache", "prune", "--older-than", "30d"))
    assert "removed 2 cache entries" in text and f"(schema {p.schema})" in text
    assert "journals are kept" in text
    after = _entries(p)
    assert after["flows:load"] == 0 and after["flows:square"] == before["flows:square"]
    # by size: the dry run says, the prune does
    assert f"would remove {count - 2} cache entries" in ok(p.cli(
        "cache", "prune", "--max-size", "0", "--dry-run"))
    total = as_json(p.cli("cache", "stats", "--json"))["bytes"]
    ok(p.cli("cache", "prune", "--max-size", str(total - 1)))
    assert 0 < sum(_entries(p).values()) < count - 2
    # one task's entries; its key records are kept, so explain still knows them
    squares = _entries(p)["flows:square"]
    assert f"would remove {squares} cache entr" in ok(p.cli("cache", "clear", "--task",
                                                            "square", "--dry-run"))
    text = ok(p.cli("cache", "clear", "--task", "square"))
    assert "task 'square': flows:square" in text and f"removed {squares} cache entr" in text
    stats = as_json(p.cli("cache", "stats", "--json"))
    [square] = [t for t in stats["tasks"] if t["task"] == "flows:square"]
    assert (square["entries"], square["ran"], square["cached"]) == (0, 6, 3)
    why = ok(p.cli("explain", "flows:square", "2"))
    assert "no longer in the cache" in why
    fails(p.cli("cache", "clear", "--task", "nope"), "no task named 'nope'")
    # everything
    ok(cli("cache", "clear", cwd=p.path, env=p.env()))
    assert sum(_entries(p).values()) == 0
    assert as_json(p.cli("cache", "stats", "--json"))["bytes"] == 0
    # the journals are untouched: every run is listed, and replays without the cache
    assert len(as_json(p.cli("runs", "--json"))) == 6
    again = write_script(p.path / "again.py", """
        import flows
        run = flows.pipeline.run(4)
        print(run.counts(), run.result)
    """)
    out = python(again, p.env()).stdout
    assert "'replayed': 6" in out and out.strip().endswith(" 14")


# -- deleting runs ------------------------------------------------------------------------------
def test_delete_runs_by_id_and_by_filter(project: Project) -> None:
    p = project
    entries = _entries(p)
    fails(p.cli("delete"), "delete needs RUN ids or a filter", code=2)
    text = ok(p.cli("delete", p.ids["p3"][:14], "--dry-run"))
    assert text.splitlines() == [p.ids["p3"], "would delete 1 run (dry run)"]
    assert len(as_json(p.cli("runs", "--json"))) == 6
    text = ok(p.cli("delete", p.ids["p3"]))
    assert text.splitlines()[0] == p.ids["p3"]
    assert "deleted 1 run from postgresql://" in text and f"(schema {p.schema})" in text
    assert "the cache is kept" in text
    fails(p.cli("show", p.ids["p3"]), f"no run {p.ids['p3']!r}")
    assert _entries(p) == entries  # the cache is kept
    assert not sql(f"SELECT 1 FROM {p.schema}.steps WHERE run_id = %s", (p.ids["p3"],))
    text = ok(cli("delete", "--status", "failed", cwd=p.path, env=p.env()))
    assert text.splitlines() == [p.ids["failed"], text.splitlines()[1]]
    fails(p.cli("delete", "--entrypoint", "nope"), "belongs to an entrypoint 'nope'",
          "pipeline (flows:pipeline)")
    left = {r["id"] for r in as_json(p.cli("runs", "--json"))}
    assert left == set(p.ids.values()) - {p.ids["p3"], p.ids["failed"]}


def _hold(p: Project, release: Path) -> tuple[subprocess.Popen[str], str]:
    """A process executing a run of ``flows.holder`` until ``release`` exists, and the run's
    id (once the command lists it as running)."""
    job = write_script(p.path / f"hold_{release.name}.py", f"""
        import flows
        print(flows.holder.run({str(release)!r}).result)
    """)
    proc = subprocess.Popen([sys.executable, str(job)], cwd=p.path, env=p.env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    running: list[Any] = []
    while not running and time.monotonic() < deadline and proc.poll() is None:
        running = as_json(p.cli("runs", "--status", "running", "--json"))
        time.sleep(0.2)
    assert [r["entrypoint"] for r in running] == ["flows:holder"], proc.poll()
    return proc, running[0]["id"]


def test_a_run_being_executed_is_never_deleted_and_a_crashed_one_continues(
        project: Project, tmp_path: Path) -> None:
    p = project
    release = tmp_path / "release"
    proc, held = _hold(p, release)
    try:
        assert "running (attempt 1)" in ok(p.cli("show", held))
        fails(p.cli("delete", held), f"run {held!r} is executing", "process")
        matched = ok(p.cli("delete", "--older-than", "0", "--dry-run")).splitlines()
        # the 4 others that are not waiting for an answer, and the summary (the 2 that
        # are waiting are kept without --status interrupted)
        assert held not in matched and len(matched) == 5
        assert matched[-1].endswith("2 runs are waiting for an answer (interrupted) and "
                                    "kept: add --status interrupted to delete them")
        fails(p.cli("resume", "flows:holder", held, "--keep-finished"), "is running")
        release.write_text("go")
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0 and out.strip() == "released", err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert ok(p.cli("delete", held)).splitlines()[0] == held
    # a process killed while it executes a run: the run is crashed, and continues
    other = tmp_path / "other"
    proc, crashed = _hold(p, other)
    proc.kill()
    proc.communicate(timeout=60)
    listed = as_json(p.cli("runs", "--status", "crashed", "--json"))
    assert [r["id"] for r in listed] == [crashed]
    assert "the process executing it died" in ok(p.cli("show", crashed))
    other.write_text("go")
    text = ok(p.cli("resume", "flows:holder", crashed, "--keep-finished"))
    assert f"run {crashed!r} finished" in text and "result: 'released'" in text
    shown = as_json(p.cli("show", crashed, "--json"))
    assert (shown["status"], shown["attempt"], shown["result"]) == ("finished", 2, "released")


# -- a signed store -----------------------------------------------------------------------------
def test_a_signed_store_is_read_with_durably_key(tmp_path: Path, schemas: list[str]) -> None:
    schema = fresh_schema()
    schemas.append(schema)
    url = with_schema(server_url(), schema)  # no allow_unsigned: a key is required
    write_script(tmp_path / "flows.py", FLOWS)
    start = write_script(tmp_path / "start.py", """
        import flows
        print(flows.pipeline.run(4).id)
    """)
    run = python(start, environ(DURABLY_STORE=url, DURABLY_KEY=KEY)).stdout.strip()
    shown = as_json(cli("--store", url, "show", run, "--json", cwd=tmp_path,
                        env=environ(DURABLY_KEY=KEY)))
    assert (shown["status"], shown["result"]) == ("finished", 14)
    stats = as_json(cli("cache", "stats", "--json", cwd=tmp_path,
                        env=environ(DURABLY_STORE=url, DURABLY_KEY=KEY)))
    assert stats["entries"] == 6 and stats["runs"] == 1
    # without a key: refused, in one line that says how to fix it
    line = fails(cli("--store", url, "show", run, cwd=tmp_path), "no signing key",
                 "DURABLY_KEY_FILE", "allow_unsigned")
    assert line.startswith("durably: error: the PostgreSQL store postgresql://")
    # with another key: refused when the store opens, saying which key to use
    fails(cli("--store", url, "show", run, cwd=tmp_path, env=environ(DURABLY_KEY="f" * 32)),
          "signed with another key", "(DURABLY_KEY)", "DURABLY_KEY_FILE")


# -- the store named, its password never -------------------------------------------------------
def test_the_store_is_named_without_its_password(tmp_path: Path, schemas: list[str]) -> None:
    url, password = tcp()
    schema = fresh_schema()
    schemas.append(schema)
    for given in (url.replace("@", f":{password}@", 1),  # in the URL's user part
                  f"{url}?password={password}"):  # in the query, as libpq takes it too
        where = with_schema(given, schema) + "&allow_unsigned=true"
        made = durably.open_store(where)
        made.check()  # (makes the tables)
        made.close()
        shown = [ok(cli("--store", where, "runs", cwd=tmp_path)),
                 ok(cli("cache", "stats", cwd=tmp_path, env=environ(DURABLY_STORE=where))),
                 ok(cli("--store", where, "cache", "stats", "--json", cwd=tmp_path)),
                 ok(cli("--store", where, "cache", "clear", cwd=tmp_path)),
                 fails(cli("--store", where, "show", "nope", cwd=tmp_path), "no run 'nope'")]
        assert not any(password in text for text in shown), shown
        assert all("***" in text for text in shown), shown
        assert shown[0].startswith("no runs in the store at postgresql://durably_pw")
        assert f"(schema {schema})" in shown[0]


def test_a_store_that_cannot_be_opened_is_one_line_naming_it(
        tmp_path: Path, schemas: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    url, password = tcp()
    host = url.split("@", 1)[1].split("/", 1)[0]
    wrong = url.replace("@", ":not-the-password@", 1) + "?allow_unsigned=true"
    for where in ("--store", "$DURABLY_STORE"):
        args, env = (["--store", wrong], environ()) if where == "--store" else (
            [], environ(DURABLY_STORE=wrong))
        line = fails(cli(*args, "runs", cwd=tmp_path, env=env),
                     "cannot connect to the PostgreSQL store",
                     f"postgresql://durably_pw:***@{host}/postgres",
                     "password authentication failed")
        assert "not-the-password" not in line and password not in line
    right = url.replace("@", f":{password}@", 1)
    line = fails(cli("--store", right.replace("/postgres", "/nosuchdb") + "?allow_unsigned=true",
                     "runs", cwd=tmp_path),
                 "cannot connect", f"durably_pw:***@{host}/nosuchdb", "does not exist")
    assert password not in line
    # a schema that is not there: said, and not made by asking
    missing = fresh_schema()
    schemas.append(missing)
    line = fails(cli("--store", with_schema(right, missing) + "&allow_unsigned=true", "cache",
                     "stats", cwd=tmp_path), "no durably store at", f"schema={missing}",
                 "(--store)")
    assert password not in line and "durably_pw:***@" in line
    assert not schema_exists(missing)
    fails(cli("runs", cwd=tmp_path, env=environ(
        DURABLY_STORE=with_schema(right, missing) + "&allow_unsigned=true")),
        "no durably store at", "($DURABLY_STORE)")
    assert not schema_exists(missing)
    # a URL without its //: the fix is said, the password in neither the URL nor the fix
    line = fails(cli("--store", right.replace("://", ":", 1), "runs", cwd=tmp_path),
                 "without its '//'", f"Fix: postgresql://durably_pw:***@{host}/postgres",
                 code=2)
    assert password not in line
    # a bad option: a usage error for --store (exit status 2), an error for $DURABLY_STORE
    fails(cli("--store", right + "?allow_unsigned=maybe", "runs", cwd=tmp_path),
          "allow_unsigned='maybe'", code=2)
    fails(cli("runs", cwd=tmp_path, env=environ(DURABLY_STORE=right + "?schema=Bad-Name")),
          "'Bad-Name' is not a schema name")
    # no server there (a port nothing listens on, a host name that does not resolve), in
    # this process: the wait for a server starting up (10 s) shortened
    from click.testing import CliRunner

    from durably._store.postgres import connections as _pg
    from durably.cli import cli as command

    monkeypatch.setattr(_pg, "OPEN_SECONDS", 0.5)
    for host in ("127.0.0.1:1", "no-such-host.invalid"):
        nobody = f"postgresql://ada:s3cret@{host}/db?allow_unsigned=true&connect_timeout=2"
        result = CliRunner().invoke(command, ["--store", nobody, "runs"])
        assert result.exit_code == 1 and "Traceback" not in result.output
        assert result.output.count("\n") == 1
        assert (f"durably: error: cannot connect to the PostgreSQL store "
                f"postgresql://ada:***@{host}/db") in result.output
        assert "s3cret" not in result.output


# -- maintenance --------------------------------------------------------------------------------
def _blob_names(store: Any) -> set[str]:
    return {name for name, _size, _when in store.blobs.listing()}


@pytest.mark.parametrize("blobs", ["dir", "memory"])
def test_collect_values_removes_only_blobs_no_row_refers_to(
        blobs: str, tmp_path: Path, schemas: list[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    schema = fresh_schema()
    schemas.append(schema)
    where = str(tmp_path / "blobs") if blobs == "dir" else f"memory://{uuid.uuid4().hex}"
    store = durably.open_store(with_schema(server_url(), schema), allow_unsigned=True,
                               blobs=where, inline_limit=1000)
    durably.configure(store=store)
    try:
        @durably.task
        def big(n: int) -> bytes:
            return bytes([n % 256]) * (4000 + n)

        @durably.entrypoint
        def job(n: int) -> int:
            return len(big(n))

        @durably.entrypoint
        def measure(data: bytes) -> int:
            return len(data)

        first, second = job.run(1), job.run(2)
        assert (first.result, second.result) == (4001, 4002)
        given = measure.run(b"an argument kept as a blob " * 100)
        assert given.result == 2700

        def blob_of(table: str, column: str, run_id: str) -> str:
            [(name,)] = sql(f"SELECT {column} FROM {schema}.{table} WHERE run_id = %s AND "
                            f"{column} IS NOT NULL", (run_id,))
            return str(name)

        # a value is one blob (named by its bytes) whichever rows refer to it: each run's
        # step and its cache entry share one; the arguments of `measure` have their own
        one, two = blob_of("steps", "blob", first.id), blob_of("steps", "blob", second.id)
        args = blob_of("runs", "args_blob", given.id)
        assert {r[0] for r in sql(f"SELECT blob FROM {schema}.cache")} == {one, two}
        assert _blob_names(store) == {one, two, args}
        orphan = store.blobs.put(b"no row names me" * 100)
        assert _blob_names(store) == {one, two, args, orphan}
        assert store.collect_values() == (0, 0)  # everything younger than the grace period
        assert store.collect_values(grace=0) == (1, 1500)  # the orphan only
        assert _blob_names(store) == {one, two, args}
        # a run deleted: the blobs only it referred to go
        assert durably.delete_runs([given.id], store=store) == [given.id]
        removed, freed = store.collect_values(grace=0)
        assert removed == 1 and freed > 2700 and _blob_names(store) == {one, two}
        # the first job's run deleted: its blob stays while its cache entry refers to it
        assert durably.delete_runs([first.id], store=store) == [first.id]
        assert store.collect_values(grace=0) == (0, 0)
        assert _blob_names(store) == {one, two}
        assert store.large_value_bytes() == sum(
            size for _n, size, _w in store.blobs.listing()) > 8000
        # the cache cleared: the blob no row refers to any more goes; the second run's stays
        assert store.clear() == 2
        removed, freed = store.collect_values(grace=0)
        assert removed == 1 and _blob_names(store) == {two}
        again = job.run(2)  # its journal replays from the blob kept
        assert again.id == second.id and again.result == 4002
        assert again.counts()["replayed"] == 1
        assert job.run(1).counts()["ran"] == 1  # executes again, and writes its blob again
        assert _blob_names(store) == {one, two}
        assert store.collect_values(grace=0) == (0, 0)
    finally:
        durably.configure()
        store.close()


def test_repair_run_sets_a_damaged_step_aside(tmp_path: Path, schemas: list[str]) -> None:
    schema = fresh_schema()
    schemas.append(schema)
    url = with_schema(server_url(), schema) + "&allow_unsigned=true"
    store = durably.open_store(url)
    durably.configure(store=store)
    calls: list[tuple[str, int]] = []
    try:
        @durably.task
        def square(x: int) -> int:
            calls.append(("square", x))
            return x * x

        @durably.task(cache=False)
        def notify(total: int) -> int:
            calls.append(("notify", total))
            return total

        @durably.entrypoint
        def job(n: int) -> int:
            return notify(sum(square(i) for i in range(n)))

        run, other = job.run(4), job.run(3)
        assert (run.result, other.result) == (14, 5)
        # damage the value of the side effect's step (not cached: it cannot be re-derived)
        assert sql(f"UPDATE {schema}.steps SET value = 'garbage'::bytea WHERE run_id = %s "
                   "AND task LIKE %s RETURNING 1", (run.id, "%notify")) == [(1,)]
        calls.clear()
        with pytest.raises(durably.CorruptJournalError) as info:
            job(4)
        assert run.id in str(info.value) and "repair_run" in str(info.value)
        assert calls == []
        assert job.run(3).result == 5 and calls == []  # the other run is unharmed
        # the command still shows it (its other steps, the damaged one as recorded)
        project = tmp_path / "p"
        project.mkdir()
        shown = as_json(cli("--store", url, "show", run.id, "--all", "--json", cwd=project))
        # as it was: the call that could not read its journal journaled nothing
        assert (shown["status"], shown["attempt"]) == ("finished", 1)
        assert [(s["attempt"], s["task"].rpartition(".")[2], s["status"])
                for s in shown["steps"]] == [(1, "square", "ran")] * 4 + [
            (1, "notify", "ran")]
        lines = store.repair_run(run.id)
        assert len(lines) == 1 and "notify" in lines[0] and "attempt 1" in lines[0]
        aside = sql(f"SELECT run_id, what, why, value FROM {schema}.set_aside")
        assert len(aside) == 1 and aside[0][0] == run.id and bytes(aside[0][3]) == b"garbage"
        assert "notify" in aside[0][1]
        assert not sql(f"SELECT 1 FROM {schema}.steps WHERE run_id = %s AND task LIKE %s",
                       (run.id, "%notify"))
        assert store.repair_run(run.id) == []  # nothing damaged left
        assert store.repair_run(other.id) == []
        # the step set aside executes again, once; the rest replays
        assert job(4) == 14 and calls == [("notify", 14)]
        assert job(4) == 14 and calls == [("notify", 14)]
        with pytest.raises(durably.NotFoundError):
            store.repair_run("no-such-run")
    finally:
        durably.configure()
        store.close()
