"""A run's history read a page at a time (``Run.history(offset=, limit=)``, the dashboard's
history pages, a fork from one): the same checkpoints as the whole read, the states of
the page's checkpoints read only, never the journal whole."""

from __future__ import annotations

import re
from typing import Any

import pytest

import durably
from durably.store import Store

_FAIL = {"now": False}


@durably.task
def part(i: int) -> str:
    return f"part {i}"


@durably.task
def approve(n: int) -> str:
    return f"approved {n}: {durably.interrupt({'how many': n})}"


@durably.entrypoint
def paged(n: int) -> str:
    first = [part(i) for i in range(n)]
    answer = approve(n)
    more = [part(100 + i) for i in range(n)]
    if _FAIL["now"]:
        raise RuntimeError("stopped")
    return f"{len(first)} {answer} {len(more)}"


def _run(monkeypatch: pytest.MonkeyPatch) -> durably.Run[str]:
    """A run of 14 checkpoints (6 parts, an interrupt, its step, 6 parts) over 3 attempts:
    the last resumed after a failure, so its steps are replayed."""
    assert paged.run(6).status == "interrupted"
    monkeypatch.setitem(_FAIL, "now", True)
    with pytest.raises(RuntimeError):
        paged.resume(durably.list_runs(paged)[0].id, "yes")
    monkeypatch.setitem(_FAIL, "now", False)
    run = paged.run(6)
    assert run.status == "finished" and run.attempt == 3
    return run


def test_a_page_of_the_history_is_the_same_as_the_whole_read(
        store: durably.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    run = _run(monkeypatch)
    whole = run.history()
    assert len(whole) == 14 and [c.kind for c in whole].count("interrupt") == 1
    assert [c.steps_done for c in whole] == [13, 12, 11, 10, 9, 8, 7, 6, 6, 5, 4, 3, 2, 1]
    (asked,) = [c for c in whole if c.kind == "interrupt"]
    assert (asked.state, asked.answer) == ("{'how many': 6}", "'yes'")
    for offset in range(16):
        for limit in (0, 1, 3, 5, 13, 20, None):
            end = None if limit is None else offset + limit
            assert run.history(offset=offset, limit=limit) == whole[offset:end], (offset, limit)
    for bad in ({"offset": -1}, {"offset": 1.5}, {"limit": -2}, {"limit": True}):
        with pytest.raises(durably.DefinitionError, match="number of checkpoints"):
            run.history(**bad)


def test_a_page_reads_the_states_of_its_checkpoints_only(
        store: durably.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    run = _run(monkeypatch)
    whole = run.history()
    asked: list[list[str]] = []
    real = store.finished_steps

    def spy(run_id: str, step_ids: Any) -> Any:
        asked.append(list(step_ids))
        return real(run_id, step_ids)

    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the journal read whole for a page of the history")

    monkeypatch.setattr(store, "finished_steps", spy)
    if type(store).step_outline is not Store.step_outline:  # (its own query: DiskStore's)
        monkeypatch.setattr(store, "list_steps", never)
    assert run.history(offset=4, limit=5) == whole[4:9]
    assert sorted(asked[0]) == sorted(c.id for c in whole[4:9] if c.kind == "step")


def test_the_dashboards_history_pages_and_a_fork_from_one(
        store: durably.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("starlette", reason="pip install -e '.[test]'")
    from durably._ui import app

    from .test_ui import client, csrf_of, post

    run = _run(monkeypatch)
    whole = run.history()
    monkeypatch.setattr(app, "HISTORY_PAGE", 5)
    c = client(store)
    shown = []
    for page in (1, 2, 3):
        text = c.get(f"/runs/{run.id}/history?page={page}").text
        assert f"page {page} of 3" in text and "14 checkpoints" in text
        shown += re.findall(r'name="at" value="([^"]+)"', text)
    assert shown == [cp.id for cp in whole]
    last = c.get(f"/runs/{run.id}/history?page=3").text
    assert c.get(f"/runs/{run.id}/history?page=99").text == last  # (past the last: the last)
    # a fork from the second page: the steps up to its checkpoint copied, as durably.fork
    at = whole[8]
    assert (at.kind, at.state) == ("step", "'part 5'")
    page = c.get(f"/runs/{run.id}/history?page=2").text
    made = post(c, f"/runs/{run.id}/fork", {"csrf": csrf_of(page), "at": at.id})
    assert made.status_code == 303
    fork_id = made.headers["location"].partition("?")[0].rpartition("/")[2]
    fork = durably.get_run(fork_id, store=store)
    assert fork.status == "forked"
    assert [(s.step_id, s.output) for s in fork.steps] == [
        (cp.id, cp.state) for cp in whole[8:][::-1] if cp.kind == "step"]
