"""A fork that has not been executed yet (made by the dashboard's Fork button, or by
``make_fork``): its status is ``forked``, its attempt is 0, and its journal holds the steps
it inherited up to its checkpoint. Every reader of a run works on it as ``durably show``
presents it: those inherited steps (none for a fork at the run's input)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import durably
from durably import render
from durably._runtime.history import NO_UPDATE, make_fork
from durably.cli import cli


@durably.task
def inc(i: int) -> int:
    return i + 1


@durably.task
def boom(x: int) -> int:
    raise ValueError(f"bad {x}")


@durably.entrypoint
def chain(x: int) -> int:
    return boom(inc(inc(x)))


def _fork(store: durably.Store, at: str | None) -> tuple[durably.Run[int], str]:
    with pytest.raises(ValueError):
        chain(3)
    run = durably.list_runs(chain, store=store)[-1]  # (the first: forks are runs of chain too)
    record = store.find_run(run.id)
    assert record is not None
    return run, make_fork(store, record, at, NO_UPDATE)


def test_an_unexecuted_forks_readers_show_its_inherited_steps(store: durably.Store) -> None:
    run, fork_id = _fork(store, None)  # at the latest checkpoint: inc(3), inc(4) inherited
    fork = durably.get_run(fork_id, store=store)
    assert (fork.status, fork.attempt) == ("forked", 0)
    graph = fork.graph()
    assert (graph.status, graph.attempt) == ("forked", 0)
    assert [(n.task, n.status, n.inputs, n.output) for n in graph.nodes] == [
        ("inc", "ran", "i=3", "4"), ("inc", "ran", "i=4", "5")]
    assert "inc" in graph.to_mermaid() and "inc" in render.to_dot(graph)
    assert fork.graph(attempt=0).nodes == graph.nodes
    with pytest.raises(durably.NotFoundError, match=r"fork not executed yet.*attempt is 0"):
        fork.graph(attempt=1)
    with pytest.raises(durably.NotFoundError, match="attempts 1 to 1"):
        run.graph(attempt=0)  # (an executed run has no attempt 0)
    assert [s.output for s in fork.steps] == ["4", "5"]
    assert fork.counts() == {"ran": 2, "cached": 0, "replayed": 0, "failed": 0}
    assert fork.summary().startswith(f"run {fork_id!r} forked: 2 steps — 2 ran")
    assert fork.time_saved() == 0.0
    assert [c.id for c in fork.history()] == [c.id for c in run.history()
                                              if c.kind == "step"]
    assert fork.interrupts == []
    assert [e.kind for e in fork.events()].count("step_finished") == 2


def test_a_fork_at_the_input_has_an_empty_graph(store: durably.Store) -> None:
    _, fork_id = _fork(store, "")
    fork = durably.get_run(fork_id, store=store)
    graph = fork.graph()
    assert (graph.nodes, graph.status) == ((), "forked")
    assert fork.steps == [] and fork.history() == [] and fork.time_saved() == 0.0
    assert fork.summary() == f"run {fork_id!r} forked: 0 steps — 0 ran, 0 replayed, " \
        "0 cached, 0 failed"


def test_durably_graph_and_show_draw_an_unexecuted_fork(disk_store: durably.DiskStore
                                                        ) -> None:
    _, fork_id = _fork(disk_store, None)
    where = ["--dir", str(disk_store.path)]
    drawn = CliRunner().invoke(cli, ["graph", fork_id, "-f", "mermaid", *where])
    assert drawn.exit_code == 0, drawn.output
    assert drawn.output.count('["inc<br/>ran') == 2 and "· forked" in drawn.output
    shown = CliRunner().invoke(cli, ["show", fork_id, *where])
    assert shown.exit_code == 0 and "forked (attempt 0)" in shown.output


def test_the_dashboard_draws_an_unexecuted_fork(store: durably.Store) -> None:
    pytest.importorskip("starlette", reason="pip install -e '.[test]'")
    from .test_ui import client

    _, fork_id = _fork(store, None)
    _, at_input = _fork(store, "")
    c = client(store)
    graph = c.get(f"/api/runs/{fork_id}/graph")
    assert graph.status_code == 200 and "error" not in graph.json()
    assert graph.json()["dot"].count("inputs: i=") == 2 and graph.json()["nodes"] == 2
    empty = c.get(f"/api/runs/{at_input}/graph").json()
    assert "error" not in empty and empty["nodes"] == 0
    page = c.get(f"/runs/{fork_id}")
    assert page.status_code == 200 and "i=3" in page.text and "attempts 1 to 0" not in page.text
    assert c.get(f"/runs/{fork_id}/history").status_code == 200
    (row,) = [r for r in c.get("/api/runs").json() if r["id"] == fork_id]
    assert row["status"] == "forked" and row["counts"]["ran"] == 2
