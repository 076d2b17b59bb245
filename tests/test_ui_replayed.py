"""The dashboard's step table shows a replayed step's inputs, output and the seconds its
execution took, read from the records that finished them for the page's steps only."""

from __future__ import annotations

import html
import time
from typing import Any

import pytest

import durably

pytest.importorskip("starlette", reason="pip install -e '.[test]'")

_FAIL = {"now": True}


@durably.task
def measured(i: int) -> dict[str, int]:
    time.sleep(0.02)
    return {"square": i * i}


@durably.entrypoint
def resumable(n: int) -> int:
    total = sum(measured(i)["square"] for i in range(n))
    if _FAIL["now"]:
        raise RuntimeError("stopped after the steps")
    return total


def test_replayed_steps_show_their_inputs_output_and_duration(
        store: durably.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    from .test_ui import client

    monkeypatch.setitem(_FAIL, "now", True)
    with pytest.raises(RuntimeError):
        resumable(3)
    monkeypatch.setitem(_FAIL, "now", False)
    run = resumable.run(3)
    assert run.attempt == 2 and run.counts()["replayed"] == 3
    first = {s.step_id: s for s in store.list_steps(run.id, attempt=1)}
    asked: list[list[str]] = []
    real = store.finished_steps

    def spy(run_id: str, step_ids: Any) -> Any:
        asked.append(list(step_ids))
        return real(run_id, step_ids)

    monkeypatch.setattr(store, "finished_steps", spy)
    c = client(store)
    for query in ("", "?status=replayed"):
        asked.clear()
        page = html.unescape(c.get(f"/runs/{run.id}{query}").text)
        # (the page's replayed steps only, whenever the page is read)
        assert asked and all(a == [s.step_id for s in run.steps] for a in asked)
        for s in run.steps:
            origin = first[s.step_id]
            assert origin.duration >= 0.02
            row = f'<td class="repr">{origin.inputs}</td><td class="repr">{origin.output}</td>'
            assert row in page, query
            # (the duration cell: the original execution's, as the page writes seconds)
            assert f'<td class="n">{origin.duration * 1000:.0f} ms</td>' in page, query
