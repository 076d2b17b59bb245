"""``durably ui`` over HTTP (Starlette's TestClient), on every store of the ``store``
fixture: the token, the cross-site checks, read-only mode, the pages and the actions
(answering an interrupt as ``resume`` would, deleting, pruning), the fork commands of a run's
history."""

from __future__ import annotations

import html
import json
import pickle
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import durably
from durably.cli import cli

pytest.importorskip("starlette", reason="pip install -e '.[test]'")
from starlette.testclient import TestClient

from durably._cli.support import _size
from durably._cli.ui import _local
from durably._ui import create_app
from durably._ui.queries import safe_load

TOKEN = "t0ken-for-tests"
BASE = "http://127.0.0.1:8765"


@durably.task
def parse(i: int) -> int:
    return i * 2


@durably.task
def ask(total: int) -> str:
    answer = durably.interrupt({"question": "publish?", "total": total})
    return f"published {total}: {answer}"


@durably.entrypoint
def publish(n: int) -> str:
    total = sum(parse(i) for i in range(n))
    durably.get_writer()({"progress": "parsed"})
    return ask(total)


@durably.task
def broken(x: int) -> int:
    raise ValueError(f"bad row {x}")


@durably.entrypoint
def fails() -> int:
    return broken(7)


def client(store: durably.Store, *, read_only: bool = False, login: bool = True,
           base: str = BASE, local_only: bool = True) -> TestClient:
    c = TestClient(create_app(store, TOKEN, read_only=read_only, local_only=local_only),
                   base_url=base)
    if login:
        c.get(f"/?token={TOKEN}")
    return c


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, "the page has no form"
    return found.group(1)


def post(c: TestClient, path: str, data: dict[str, str], **headers: str) -> Any:
    return c.post(path, data=data, headers={"origin": BASE, **headers},
                  follow_redirects=False)


def test_every_request_needs_the_token(store: durably.Store) -> None:
    publish.run(3)
    c = client(store, login=False)
    for path in ("/", "/api/runs", "/static/app.js", "/static/viz.js", "/cache"):
        refused = c.get(path)
        assert refused.status_code == 403, path
        assert "needs its token" in refused.text
        assert f"{BASE}/?token=..." in refused.text  # (the address it was reached at)
    assert c.get("/?token=wrong").status_code == 403
    elsewhere = TestClient(create_app(store, TOKEN), base_url="http://[::1]:43210")
    assert "http://[::1]:43210/?token=..." in elsewhere.get("/").text
    assert c.get("/?token=%C3%A9t%C3%A9").status_code == 403  # (not ASCII: wrong, no error)
    assert c.get("/api/runs", headers={"x-durably-token": "wrong"}).status_code == 403
    # the header is enough; the token in the URL once sets a cookie and drops it from the URL
    assert c.get("/api/runs", headers={"x-durably-token": TOKEN}).status_code == 200
    first = c.get(f"/?token={TOKEN}&status=failed", follow_redirects=False)
    assert first.status_code == 303 and first.headers["location"] == "/?status=failed"
    cookie = first.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and TOKEN in cookie
    assert c.get("/api/runs").status_code == 200  # (the cookie, now)
    assert c.get("/static/viz.js").text.startswith(("/*", "!", "(", "var", "\"use"))


def test_every_response_carries_the_security_headers(store: durably.Store) -> None:
    run_id = publish.run(3).id
    anonymous = client(store, login=False)
    c = client(store)
    for response in (anonymous.get("/"), c.get("/"), c.get(f"/runs/{run_id}"),
                     c.get("/static/app.js"), c.get("/api/runs"), c.get("/runs/nope"),
                     post(c, f"/runs/{run_id}/delete", {"confirm": "x"})):
        headers = response.headers
        assert headers["x-frame-options"] == "DENY", response.url
        policy = headers["content-security-policy"]
        assert "frame-ancestors 'none'" in policy and "default-src 'self'" in policy
        assert "'unsafe-inline'" not in policy and "'unsafe-eval'" not in policy
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["referrer-policy"] == "same-origin"
    # (no inline script or handler on a page: the policy would block it)
    page = c.get(f"/runs/{run_id}").text + c.get("/").text
    assert not re.search(r"<script>|\son[a-z]+=|javascript:", page)


def test_runs_and_a_run_page(store: durably.Store) -> None:
    run = publish.run(25)
    assert run.status == "interrupted"
    c = client(store)
    rows = c.get("/api/runs").json()
    assert [r["id"] for r in rows] == [run.id]
    row = rows[0]
    assert row["status"] == "interrupted" and row["counts"] == {
        "ran": 25, "cached": 0, "replayed": 0, "failed": 0, "interrupted": 1}
    assert row["duration"] is not None and row["duration"] >= 0
    page = c.get(f"/runs/{run.id}").text
    interrupt_id = run.interrupts[0].id
    assert interrupt_id in page and "publish?" in page
    assert "&#x27;progress&#x27;: &#x27;parsed&#x27;" in page  # the custom event
    assert f"durably resume {run.id}" in page
    graph = c.get(f"/api/runs/{run.id}/graph").json()
    assert "parse" in graph["dot"] and "×25" in graph["dot"]  # a fan-out collapsed, with count
    assert list(graph["groups"].values()) == [25]
    expanded = c.get(f"/api/runs/{run.id}/graph?collapse=25").json()
    assert expanded["groups"] == {} and expanded["nodes"] == 26
    assert c.get("/runs/no-such-run").status_code == 404


def test_the_time_the_cache_saved_is_shown(store: durably.Store) -> None:
    """A run served from the cache: the runs table's time saved and the run page's (its
    first attempt, read by the page's quick path) say what the cache saved."""
    from durably._ui.pages import _seconds

    publish.run(5)
    second = publish.run(6)  # parse(0) to parse(4) served from the cache
    assert second.counts()["cached"] == 5
    by_cache = second.time_saved("cache")
    assert by_cache == pytest.approx(sum(s.saved for s in second.steps))
    c = client(store)
    row = next(r for r in c.get("/api/runs").json() if r["id"] == second.id)
    assert row["saved"] == pytest.approx(second.time_saved()) == pytest.approx(by_cache)
    page = c.get(f"/runs/{second.id}").text
    if by_cache > 0:  # (0.0 on a store that keeps no durations: tests/minimal_store.py)
        assert f"{_seconds(by_cache)} ({_seconds(by_cache)} by the cache)" in page


def test_the_step_table_is_paginated_and_filtered(store: durably.Store) -> None:
    run = publish.run(250)
    c = client(store)
    first = c.get(f"/runs/{run.id}").text
    assert "page 1 of 3" in first and "next ›" in first
    third = c.get(f"/runs/{run.id}?page=3").text
    assert "page 3 of 3" in third
    assert len(re.findall(r'<td class="n">\d[\d,]*</td><td>parse', third)) == 50
    asked = c.get(f"/runs/{run.id}?task=ask").text
    assert "Steps <small>1</small>" in asked


def test_the_forms_say_what_is_wrong_in_the_dashboards_words(
        disk_store: durably.DiskStore) -> None:
    run = publish.run(2)
    c = client(disk_store)
    csrf = csrf_of(c.get(f"/runs/{run.id}").text)
    empty = post(c, f"/runs/{run.id}/answer", {"csrf": csrf})
    assert empty.status_code == 400 and "no answer was given" in empty.text
    gone = post(c, "/runs/nope-0000/answer", {"csrf": csrf, "answer:0123456789abcdef": "1"})
    assert gone.status_code == 404 and "runs page" in gone.text
    assert "list_runs" not in gone.text and "store=" not in gone.text
    nothing = post(c, "/cache/prune", {"csrf": csrf, "confirm": "yes"})
    assert nothing.status_code == 400 and "Older than" in nothing.text
    assert "durably.prune" not in nothing.text


def test_a_huge_payload_is_cut(store: durably.Store) -> None:
    from durably._ui.pages import MAX_PAYLOAD

    run = hostile.run("x" * 5_000_000)
    page = client(store).get(f"/runs/{run.id}").text
    assert len(page) < 10 * MAX_PAYLOAD + 200_000
    assert "more characters, not shown" in page


@durably.entrypoint
def ask_big() -> str:
    return str(durably.interrupt({"big": list(range(300_000)), "point": complex(1, 2),
                                  "s": "x" * 2_000_000, "last": "still shown"}))


def test_a_big_payloads_keys_are_all_shown_each_value_cut_on_its_own(
        store: durably.Store) -> None:
    from durably._ui.pages import MAX_PAYLOAD

    run = ask_big.run()
    page = client(store).get(f"/runs/{run.id}").text
    payload = page[page.index('<pre class="payload">'):]
    payload = payload[:payload.index("</pre>")]
    assert len(payload) < 2 * MAX_PAYLOAD
    for key in ("big", "point", "s", "last"):  # (every key, the ones after a huge value too)
        assert f"&quot;{key}&quot;: " in payload
    assert "&quot;big&quot;: [0, 1, 2, 3" in payload and "(1+2j)" in payload
    assert "&quot;last&quot;: &quot;still shown&quot;" in payload
    assert payload.count("more characters, not shown") == 2  # (big and s, each cut)
    # a small payload is pretty-printed whole
    small = client(store).get(f"/runs/{hostile.run({'a': 1}).id}").text
    assert '&quot;payload&quot;: {\n    &quot;a&quot;: 1\n  }' in small


def test_a_step_page_past_the_last_is_the_last(store: durably.Store) -> None:
    run = crunch.run(150)
    c = client(store)
    last = c.get(f"/runs/{run.id}?page=99999").text
    assert "page 2 of 2" in last and "99,999" not in last
    assert len(re.findall(r'<td class="n">\d[\d,]*</td><td>parse', last)) == 50


def test_errors_show_their_traceback(store: durably.Store) -> None:
    with pytest.raises(ValueError, match="bad row 7"):
        fails()
    run = durably.list_runs(store=store)[0]
    page = client(store).get(f"/runs/{run.id}").text
    assert "bad row 7" in page and "Traceback (most recent call last)" in page
    assert 'raise ValueError(f&quot;bad row {x}&quot;)' in page


@durably.entrypoint
def table(n: int) -> dict[str, Any]:
    return {"rows": [parse(i) for i in range(n)], "tail": "the end"}


@durably.task
def part(i: int) -> int:
    raise ValueError(f"part {i} went wrong because " + "the input was bad " * 8)


@durably.entrypoint
def parts(n: int) -> list[int]:
    return part.map(list(range(n)))


def test_a_run_page_shows_its_result_its_interrupted_steps_and_a_long_error_folded(
        store: durably.Store) -> None:
    c = client(store)
    done = table.run(3)
    page = c.get(f"/runs/{done.id}").text
    result = page[page.index('<section id="result">'):]
    assert "&quot;rows&quot;: [\n    0,\n    2,\n    4\n  ]" in result
    assert "&quot;tail&quot;: &quot;the end&quot;" in result
    # a huge result: cut, every key shown
    big = c.get(f"/runs/{table.run(30_000).id}").text
    big = big[big.index('<section id="result">'):big.index("</section>",
                                                            big.index('<section id="result">'))]
    assert "more characters, not shown" in big and "&quot;tail&quot;: &quot;the end&quot;" in big
    assert len(big) < 30_000
    # the header counts the interrupted step the step table lists
    asked = publish.run(2)
    page = c.get(f"/runs/{asked.id}").text
    assert re.search(r'id="steps-total">3</span> — <span id="steps-ran">\d</span> ran, .*'
                     r'<span id="steps-interrupted">1</span> interrupted</dd>', page)
    assert '<section id="result">' not in page
    # a long error (an ExceptionGroup of 12): folded under its first line, cut at a word
    with pytest.raises(ExceptionGroup):
        parts.run(12)
    failed = durably.list_runs(store=store, entrypoint=parts.spec.identity)[0]
    assert failed.error is not None and len(failed.error) > 1000
    page = c.get(f"/runs/{failed.id}").text
    folded = re.search(r'<details class="error run-error"><summary>([^<]*)</summary><pre>',
                       page)
    assert folded, "the long error is not folded"
    summary = html.unescape(folded.group(1))
    assert len(summary) <= 165 and (summary.endswith(" …") or len(summary) < 160)
    assert "part 11 went wrong" in page  # (the whole text under it)


def test_an_answer_is_journaled_as_resume_would_and_resume_finishes_the_run(
        store: durably.Store) -> None:
    run = publish.run(4)
    interrupt_id = run.interrupts[0].id
    c = client(store)
    page = c.get(f"/runs/{run.id}").text
    answered = post(c, f"/runs/{run.id}/answer",
                    {"csrf": csrf_of(page), f"answer:{interrupt_id}": '"yes"'})
    assert answered.status_code == 303
    after = c.get(answered.headers["location"]).text
    assert "Every question of this run is answered" in after
    assert f"durably resume {run.id}" in after
    events = store.list_events(run.id, ("answer",))
    assert [(e.key, pickle.loads(e.data or b"")) for e in events] == [(interrupt_id, "yes")]
    assert durably.get_run(run.id, store=store).status == "interrupted"  # not resumed by it
    # the run continues when it is next resumed, with no answer given there
    assert publish.resume(run.id) == "published 12: yes"
    assert durably.get_run(run.id, store=store).status == "finished"
    # answered twice (a form sent again): refused, nothing journaled
    again = post(c, f"/runs/{run.id}/answer",
                 {"csrf": csrf_of(page), f"answer:{interrupt_id}": '"no"'})
    assert again.status_code == 409 and "not waiting for an answer" in again.text
    assert len(store.list_events(run.id, ("answer",))) == 1


def test_an_answer_holds_the_runs_lease_against_a_resume(
        store: durably.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """The dashboard answers holding the run's lease: with the lease held by another holder
    the form says the run is executing and journals nothing; and a resume that starts while
    the dashboard checks and journals finds the run held, and does not proceed."""
    from durably._store import lease
    from durably._ui import queries

    run = publish.run(2)
    interrupt_id = run.interrupts[0].id
    c = client(store)
    csrf = csrf_of(c.get(f"/runs/{run.id}").text)
    other = lease.me()
    lease.hold(other)
    try:
        assert store.acquire_run(run.id, other) is None
        held = post(c, f"/runs/{run.id}/answer", {"csrf": csrf, f"answer:{interrupt_id}": "1"})
        assert held.status_code == 409 and "is executing" in held.text
        assert store.list_events(run.id, ("answer",)) == []
        holder = store.run_holder(run.id)  # (its lease is left as it was)
        assert holder is not None and holder.token == other.token
    finally:
        store.release_run(run.id, other)
        lease.let_go(other)
    raced: list[BaseException] = []
    record_answers = queries.record_answers

    def resume_meanwhile(*args: Any) -> None:  # (a resume starting between check and write)
        try:
            publish.resume(run.id, "from resume")
        except durably.DurablyError as exc:
            raced.append(exc)
        record_answers(*args)

    monkeypatch.setattr(queries, "record_answers", resume_meanwhile)
    answered = post(c, f"/runs/{run.id}/answer",
                    {"csrf": csrf, f"answer:{interrupt_id}": '"dashboard"'})
    assert answered.status_code == 303
    assert len(raced) == 1 and isinstance(raced[0], durably.RunBusyError)
    assert store.run_holder(run.id) is None  # (released)
    assert [pickle.loads(e.data or b"") for e in store.list_events(run.id, ("answer",))] == [
        "dashboard"]
    assert publish.resume(run.id) == "published 2: dashboard"


def test_a_bad_answer_is_refused_and_none_is_journaled(store: durably.Store) -> None:
    run = publish.run(2)
    c = client(store)
    csrf = csrf_of(c.get(f"/runs/{run.id}").text)
    not_json = post(c, f"/runs/{run.id}/answer",
                    {"csrf": csrf, f"answer:{run.interrupts[0].id}": "yes"})
    assert not_json.status_code == 400 and "is not JSON" in not_json.text
    unknown = post(c, f"/runs/{run.id}/answer", {"csrf": csrf, "answer:0123456789ab": "1"})
    assert unknown.status_code == 409
    assert store.list_events(run.id, ("answer",)) == []
    with pytest.raises(durably.DefinitionError, match="no answer"):
        publish.resume(run.id)  # (still unanswered: None is no answer)


@durably.task
def approve(i: int) -> str:
    return f"{i}: {durably.interrupt({'item': i})}"


@durably.entrypoint
def approve_all(n: int) -> list[str]:
    return approve.map(list(range(n)))


def test_some_of_several_questions_are_answered_the_rest_stay_pending(
        store: durably.Store) -> None:
    run = approve_all.run(3)
    ids = {i.payload["item"]: i.id for i in run.interrupts}
    c = client(store)
    page = c.get(f"/runs/{run.id}").text
    assert page.count("<textarea") == 3 and "required" not in page  # (each box optional)
    # the hint gives the command's form for several questions: {id: value}
    hint = html.unescape(page[page.index('<p class="hint">The answers'):])
    hint = hint[:hint.index("</p>")]
    assert re.search(r"--value '\{\"\w+\": JSON, \"\w+\": JSON, \"\w+\": JSON\}'", hint)
    assert all(f'"{i}": JSON' in hint for i in ids.values())  # (in the questions' order)
    csrf = csrf_of(page)
    empty = post(c, f"/runs/{run.id}/answer",
                 {"csrf": csrf, **{f"answer:{i}": " " for i in ids.values()}})
    assert empty.status_code == 400 and "every box was empty" in empty.text
    assert store.list_events(run.id, ("answer",)) == []
    some = post(c, f"/runs/{run.id}/answer", {"csrf": csrf, f"answer:{ids[0]}": '"ok"',
                                              f"answer:{ids[1]}": "", f"answer:{ids[2]}": ""})
    assert some.status_code == 303 and "2+left+pending" in some.headers["location"]
    assert [e.key for e in store.list_events(run.id, ("answer",))] == [ids[0]]
    page = c.get(f"/runs/{run.id}").text
    assert "Waiting for 2 answer(s)" in page and page.count("<textarea") == 2
    assert f"answer:{ids[0]}" not in page
    # the single question left after another answer: its box required again
    post(c, f"/runs/{run.id}/answer", {"csrf": csrf, f"answer:{ids[1]}": '"fine"'})
    page = c.get(f"/runs/{run.id}").text
    assert page.count("<textarea") == 1 and " required" in page and "--value JSON" in page
    post(c, f"/runs/{run.id}/answer", {"csrf": csrf, f"answer:{ids[2]}": '"go"'})
    assert approve_all.resume(run.id) == ["0: ok", "1: fine", "2: go"]


def test_actions_are_refused_from_another_site_or_without_the_csrf_token(
        store: durably.Store) -> None:
    run = publish.run(2)
    c = client(store)
    csrf = csrf_of(c.get(f"/runs/{run.id}").text)
    form = {"csrf": csrf, f"answer:{run.interrupts[0].id}": '"yes"'}
    evil = c.post(f"/runs/{run.id}/answer", data=form, follow_redirects=False,
                  headers={"origin": "http://evil.example"})
    assert evil.status_code == 403
    nowhere = c.post(f"/runs/{run.id}/answer", data=form, follow_redirects=False)
    assert nowhere.status_code == 403  # (no Origin, no Referer)
    bad = post(c, f"/runs/{run.id}/answer", {**form, "csrf": "forged"})
    assert bad.status_code == 403 and "CSRF" in bad.text
    assert store.list_events(run.id, ("answer",)) == []


def test_read_only_hides_every_action_and_refuses_them(store: durably.Store) -> None:
    run = publish.run(2)
    writer = client(store)
    csrf = csrf_of(writer.get(f"/runs/{run.id}").text)
    c = client(store, read_only=True)
    page = c.get(f"/runs/{run.id}").text
    assert "<form method=\"post\"" not in page and "<textarea" not in page
    assert "publish?" in page  # (the question is shown, without a form)
    # its hint gives the command to answer with, never speaking of answering here
    hint = html.unescape(page[page.index('<p class="hint">This dashboard is read-only'):])
    assert hint.startswith(f"<p class=\"hint\">This dashboard is read-only: answer with "
                           f"<code>durably resume {run.id} --value JSON</code>")
    assert "is journaled as" not in page
    for path, data in ((f"/runs/{run.id}/answer", {f"answer:{run.interrupts[0].id}": "1"}),
                       (f"/runs/{run.id}/delete", {"confirm": run.id}),
                       ("/cache/prune", {"older_than": "0s", "confirm": "yes"})):
        refused = post(c, path, {"csrf": csrf, **data})
        assert refused.status_code == 403 and "read-only" in refused.text, path
    assert store.list_events(run.id, ("answer",)) == []
    assert durably.get_run(run.id, store=store).status == "interrupted"


def test_delete_needs_the_run_id_typed(store: durably.Store) -> None:
    run = publish.run(2)
    c = client(store)
    csrf = csrf_of(c.get(f"/runs/{run.id}").text)
    unconfirmed = post(c, f"/runs/{run.id}/delete", {"csrf": csrf, "confirm": ""})
    assert unconfirmed.status_code == 400
    assert durably.get_run(run.id, store=store).id == run.id
    deleted = post(c, f"/runs/{run.id}/delete", {"csrf": csrf, "confirm": run.id})
    assert deleted.status_code == 303
    assert durably.list_runs(store=store) == []
    assert c.get("/api/runs").json() == []


def test_deleting_a_run_by_its_prefix_or_one_that_does_not_exist(store: durably.Store) -> None:
    """As answering: a run id's prefix names the run; an id that names none is not found
    (it was said to be executing)."""
    run = publish.run(2)
    c = client(store)
    csrf = csrf_of(c.get(f"/runs/{run.id}").text)
    missing = post(c, "/runs/zzz-no-such-run/delete", {"csrf": csrf, "confirm": "zzz-no-such-run"})
    assert missing.status_code == 404 and "executing" not in missing.text
    assert "no run" in missing.text.lower()
    prefix = run.id[:-4]
    deleted = post(c, f"/runs/{prefix}/delete", {"csrf": csrf, "confirm": prefix})
    assert deleted.status_code == 303
    assert durably.list_runs(store=store) == []


def test_the_history_has_a_fork_button_for_each_checkpoint(store: durably.Store) -> None:
    """Each checkpoint has a Fork form (in read-only mode: the command that forks), and
    showing them makes nothing."""
    run = publish.run(3)
    page = client(store).get(f"/runs/{run.id}").text
    read_only = client(store, read_only=True).get(f"/runs/{run.id}").text
    for cp in run.history():
        assert f'name="at" value="{cp.id}"' in page
        assert f"durably fork {run.id} --at {cp.id[:12]}" in read_only
        assert f'name="at" value="{cp.id}"' not in read_only
    assert [r.id for r in durably.list_runs(store=store)] == [run.id]  # (nothing made)


def test_a_fork_made_in_the_dashboard_is_executed_by_durably_resume(tmp_path: Path) -> None:
    """The Fork button makes the fork (not executed) and its page gives ``durably resume
    FORK``; that command, in another process, loads the script the source run recorded and
    finishes the fork: the steps before the checkpoint replayed, the rest executed."""
    import os
    import subprocess

    (tmp_path / "job_for_ui_fork.py").write_text(
        "import durably\n\n"
        "@durably.task\n"
        "def step(i):\n"
        "    print(f'executed step {i}', flush=True)\n"
        "    return i * 10\n\n"
        "@durably.entrypoint\n"
        "def job(n):\n"
        "    return sum(step(i) for i in range(n))\n\n"
        "if __name__ == '__main__':\n"
        "    print('result', job(3))\n")
    env = {**os.environ, "DURABLY_DIR": str(tmp_path / "store"),
           "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    first = subprocess.run([sys.executable, "job_for_ui_fork.py"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    assert "executed step 2" in first.stdout and "result 30" in first.stdout
    store = durably.DiskStore(tmp_path / "store")
    (run,) = durably.list_runs(store=store)
    at = next(cp for cp in run.history() if cp.task == "step" and "1" in (cp.state or ""))
    c = client(store)
    page = c.get(f"/runs/{run.id}").text
    refused = post(c, f"/runs/{run.id}/fork", {"csrf": "wrong", "at": at.id})
    assert refused.status_code == 403
    made = post(c, f"/runs/{run.id}/fork", {"csrf": csrf_of(page), "at": at.id})
    assert made.status_code == 303
    fork_id = made.headers["location"].partition("?")[0].rpartition("/")[2]
    fork = durably.get_run(fork_id, store=store)
    assert fork.status == "forked" and fork.script == run.script is not None
    assert f"durably resume {fork_id}" in c.get(f"/runs/{fork_id}").text
    resumed = subprocess.run(
        [sys.executable, "-m", "durably", "resume", fork_id, "--dir", str(tmp_path / "store")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "executed step 2" in resumed.stdout
    assert "executed step 0" not in resumed.stdout and "executed step 1" not in resumed.stdout
    fork = durably.get_run(fork_id, store=store)
    assert fork.status == "finished" and fork.result == 30
    assert fork.counts() == {"ran": 1, "cached": 0, "replayed": 2, "failed": 0}
    assert durably.get_run(run.id, store=store).attempt == 1  # (the source is untouched)


def test_cache_statistics_and_prune(disk_store: durably.DiskStore) -> None:
    durably.configure(store=disk_store)
    publish.run(5)
    c = client(disk_store)
    page = c.get("/cache").text
    assert "parse" in page and "Prune the cache" in page
    assert disk_store.cache_stats()["entries"] >= 5
    unconfirmed = post(c, "/cache/prune", {"csrf": csrf_of(page), "older_than": "0s"})
    assert unconfirmed.status_code == 400
    assert disk_store.cache_stats()["entries"] >= 5
    # the page's size is the bytes of the entries, the tasks' Bytes added up, and what the
    # prune then says it removed
    stats = disk_store.cache_stats()
    counted = sum(t["bytes"] for t in stats["tasks"])
    # (in the CLI's units, the bytes in the title)
    assert counted == stats["entry_bytes"] > 0
    assert f'<dd><span title="{counted:,} bytes">{_size(counted)}</span> (' in page
    assert re.search(r"<dd><span [^>]*>\d+(\.\d)? [kMG]?B</span>", page)
    pruned = post(c, "/cache/prune",
                  {"csrf": csrf_of(page), "older_than": "0s", "confirm": "yes"})
    assert pruned.status_code == 303
    assert f"removed {stats['entries']:,} cache entries ({_size(counted)})" in c.get(
        pruned.headers["location"]).text
    assert disk_store.cache_stats()["entries"] == 0
    bad = post(c, "/cache/prune", {"csrf": csrf_of(page), "older_than": "soon",
                                   "confirm": "yes"})
    assert bad.status_code == 400


def test_the_stream_sends_every_run_then_changes(store: durably.Store) -> None:
    run = publish.run(2)
    c = client(store)
    with c.stream("GET", "/api/stream") as events:
        lines = events.iter_lines()
        assert next(lines) == "event: runs"
        data = next(lines)
    assert data.startswith("data: ") and run.id in data and '"removed": []' in data


def test_the_stream_pushes_runs_made_and_deleted_while_it_is_open(
        store: durably.Store) -> None:
    import json

    first = publish.run(1)
    c = client(store)
    with c.stream("GET", "/api/stream") as events:
        changes = (json.loads(line[6:]) for line in events.iter_lines()
                   if line.startswith("data: "))
        assert [r["id"] for r in next(changes)["runs"]] == [first.id]
        second = publish.run(2)  # (another process's run reaches the store the same way)
        change = next(changes)
        assert [r["id"] for r in change["runs"]] == [second.id]
        assert change["runs"][0]["status"] == "interrupted" and change["removed"] == []
        durably.delete_runs([first.id], store=store)
        assert next(changes) == {"runs": [], "removed": [first.id], "total": 1}


def test_payloads_are_shown_without_importing_the_users_code(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    (tmp_path / "usermod_for_ui.py").write_text(
        "import os\nos.environ['IMPORTED_USERMOD'] = '1'\n"
        "class Order:\n    def __init__(self, n):\n        self.n = n\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import usermod_for_ui  # type: ignore[import-not-found]

    data = pickle.dumps({"order": usermod_for_ui.Order(3), "ok": [1, "a"]})
    monkeypatch.delitem(sys.modules, "usermod_for_ui")
    monkeypatch.delenv("IMPORTED_USERMOD")
    loaded = safe_load(data)
    assert "usermod_for_ui" not in sys.modules
    assert loaded["ok"] == [1, "a"] and repr(loaded["order"]).startswith("usermod_for_ui.Order")
    assert safe_load(pickle.dumps(print)) != print  # (no builtin beyond plain data)


def test_the_command_needs_the_ui_extra(monkeypatch: pytest.MonkeyPatch,
                                        disk_store: durably.DiskStore) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn", None)
    result = CliRunner().invoke(cli, ["ui", "--dir", str(disk_store.path)])
    assert result.exit_code == 1
    assert "pip install 'durably[ui]'" in result.output


def test_a_request_for_another_host_name_is_refused(store: durably.Store) -> None:
    """DNS rebinding: a page of evil.example whose name now points at 127.0.0.1 reaches the
    dashboard with Host: evil.example; refused unless it serves a non-local address."""
    for base in (BASE, "http://localhost:8765", "http://[::1]:8765"):
        assert client(store, base=base).get("/api/runs").status_code == 200, base
    evil = client(store, base="http://evil.example:8765")
    refused = evil.get("/api/runs", headers={"x-durably-token": TOKEN})
    assert refused.status_code == 403 and "evil.example" in refused.text
    assert "--host" in refused.text
    served = client(store, base="http://dash.example:8765", local_only=False)
    assert served.get("/api/runs").status_code == 200


def test_only_loopback_hosts_are_local() -> None:
    assert _local("127.0.0.1") and _local("localhost") and _local("::1")
    assert not _local("0.0.0.0") and not _local("192.168.1.5") and not _local("example.com")


def test_durably_resume_continues_a_run_answered_in_the_dashboard(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "approvals_for_ui.py").write_text(
        "import durably\n\n"
        "@durably.entrypoint\n"
        "def approve(doc):\n"
        "    return f'{doc}: {durably.interrupt({\"review\": doc})}'\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    store = durably.DiskStore(tmp_path / "store")
    durably.configure(store=store)
    import approvals_for_ui  # type: ignore[import-not-found]

    run = approvals_for_ui.approve.run("memo")
    runner = CliRunner()
    unanswered = runner.invoke(cli, ["resume", run.id, "--dir", str(store.path)])
    assert unanswered.exit_code == 1 and "waits for an answer" in unanswered.output
    c = client(store)
    page = c.get(f"/runs/{run.id}").text
    post(c, f"/runs/{run.id}/answer",
         {"csrf": csrf_of(page), f"answer:{run.interrupts[0].id}": '"approved"'})
    resumed = runner.invoke(cli, ["resume", run.id, "--dir", str(store.path)])
    assert resumed.exit_code == 0, resumed.output
    assert "memo: approved" in resumed.output


def test_a_big_runs_history_is_on_a_page_of_its_own(store: durably.Store,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from durably._ui import app

    monkeypatch.setattr(app, "INLINE_HISTORY", 2)
    run = publish.run(3)
    c = client(store)
    page = c.get(f"/runs/{run.id}").text
    assert f'href="/runs/{run.id}/history"' in page and 'name="at"' not in page
    history = c.get(f"/runs/{run.id}/history").text
    assert history.count('name="at"') == len(run.history()) == 4  # 3 parse, 1 interrupt


def test_the_history_page_is_paginated(store: durably.Store,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from durably._ui import app

    monkeypatch.setattr(app, "HISTORY_PAGE", 3)
    run = publish.run(4)  # (5 checkpoints: 4 parse, 1 interrupt)
    c = client(store)
    ids = [cp.id for cp in run.history()]
    first = c.get(f"/runs/{run.id}/history").text
    assert re.findall(r'name="at" value="([^"]+)"', first) == ids[:3]
    assert "page 1 of 2" in first and f'href="/runs/{run.id}/history?page=2"' in first
    second = c.get(f"/runs/{run.id}/history?page=2").text
    assert re.findall(r'name="at" value="([^"]+)"', second) == ids[3:]
    assert "page 2 of 2" in second and "next" not in second
    assert c.get(f"/runs/{run.id}/history?page=99999").text == second  # (the last page)


@pytest.mark.slow
@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_the_command_prints_an_address_with_its_token(host: str,
                                                      disk_store: durably.DiskStore) -> None:
    import contextlib
    import os
    import signal
    import subprocess
    import threading

    import httpx

    durably.configure(store=disk_store)
    publish.run(1)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "durably", "ui", "--dir", str(disk_store.path), "--port", "0",
         "--host", host], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(2)]
        found = re.search(r"open (http://\S+:(\d+)/\?token=(\S+))", lines[1])
        assert found, lines
        port, token = found.group(2), found.group(3)
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{base}/api/runs").status_code == 403
        rows = httpx.get(f"{base}/api/runs", headers={"x-durably-token": token}).json()
        assert [r["name"] for r in rows] == ["publish"]
        # Ctrl-C stops it, quietly, even with live pages' streams open (read, as a
        # browser reads them)
        opened = threading.Semaphore(0)

        def read_stream() -> None:
            with contextlib.suppress(httpx.HTTPError), httpx.stream(
                    "GET", f"{base}/api/stream", headers={"x-durably-token": token},
                    timeout=60) as events:
                for line in events.iter_lines():
                    if line == "event: runs":
                        opened.release()
        readers = [threading.Thread(target=read_stream, daemon=True) for _ in range(2)]
        for reader in readers:
            reader.start()
        for _ in readers:
            assert opened.acquire(timeout=60)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        for reader in readers:
            reader.join(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert ("is not a loopback address" in err) == (host == "0.0.0.0")
    # (quietly: no stream cancelled with a traceback)
    assert "Traceback" not in err and "Exception in ASGI" not in err, err


def test_the_command_waits_for_a_store_not_made_yet_without_making_it(
        tmp_path: Path) -> None:
    import os
    import signal
    import subprocess

    import httpx

    where = tmp_path / "not-yet"
    proc = subprocess.Popen(
        [sys.executable, "-m", "durably", "ui", "--dir", str(where), "--port", "0",
         "--read-only"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(2)]
        assert f"no store at {where} yet" in lines[0], lines
        found = re.search(r"open (http://\S+:(\d+)/\?token=(\S+))", lines[1])
        assert found, lines
        base, headers = f"http://127.0.0.1:{found.group(2)}", {"x-durably-token": found.group(3)}
        page = httpx.get(f"{base}/", headers=headers)
        assert page.status_code == 200 and 'id="waiting"' in page.text
        assert f"No run was made in <code>{where}</code> yet" in page.text
        assert httpx.get(f"{base}/api/runs", headers=headers).json() == []
        missing = httpx.get(f"{base}/runs/nope", headers=headers)
        assert missing.status_code == 404 and "no run was made there" in missing.text
        with httpx.stream("GET", f"{base}/api/stream", headers=headers, timeout=60) as events:
            lines_read = events.iter_lines()
            assert next(lines_read) == "event: runs"
            assert json.loads(next(lines_read)[6:]) == {"runs": [], "removed": [], "total": 0}
            assert not where.exists()  # (reading never makes the store)
            made = durably.DiskStore(where)
            durably.configure(store=made)
            run = publish.run(2)
            for line in lines_read:  # (picked up live, once made)
                if line.startswith("data: ") and run.id in line:
                    break
        assert [r["id"] for r in httpx.get(f"{base}/api/runs", headers=headers).json()] == [
            run.id]
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err


def test_the_command_refuses_a_memory_store() -> None:
    result = CliRunner().invoke(cli, ["ui", "--store", "memory://", "--port", "0"])
    assert result.exit_code == 1
    assert "cannot watch a memory:// store" in result.output


def test_open_without_a_browser_says_so(disk_store: durably.DiskStore) -> None:
    import os
    import signal
    import subprocess
    import threading

    durably.configure(store=disk_store)
    publish.run(1)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "BROWSER": "/nonexistent/browser",
           "DISPLAY": "", "WAYLAND_DISPLAY": ""}
    proc = subprocess.Popen(
        [sys.executable, "-m", "durably", "ui", "--dir", str(disk_store.path), "--port", "0",
         "--open"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    stop = threading.Timer(60, proc.send_signal, (signal.SIGINT,))  # (if it says nothing)
    stop.start()
    try:
        assert proc.stderr is not None
        said = proc.stderr.readline()
        assert "no browser could be opened" in said and "--open" in said
    finally:
        stop.cancel()
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)


def test_a_busy_port_is_one_error_line_with_its_fix(disk_store: durably.DiskStore) -> None:
    import os
    import socket
    import subprocess

    durably.configure(store=disk_store)
    publish.run(1)

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "durably", "ui", "--dir", str(disk_store.path), "--port",
             str(port)], capture_output=True, text=True, timeout=120,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    assert done.returncode == 1, done.stderr  # (an error: README's exit statuses)
    assert done.stderr.startswith("durably: error:") and done.stderr.count("\n") == 1
    assert f"port {port}" in done.stderr and "--port 0" in done.stderr


@durably.entrypoint
def crunch(n: int) -> int:
    return sum(parse(i) for i in range(n))


def test_a_big_run_opens_reading_one_page_of_its_steps(
        store: durably.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's page counts its steps with one aggregate query and reads only the page it
    shows (``page_steps``), never the whole journal (``list_steps``); the next page starts
    after the last call shown."""
    from durably._ui import app

    run = crunch.run(450)
    monkeypatch.setattr(app, "INLINE_HISTORY", 0)  # (the history reads every step)
    read: list[tuple[str, int]] = []
    page_steps, list_steps = store.page_steps, store.list_steps

    def paged(run_id: str, attempt: int, *, after: int = -1,
              limit: int = 100) -> list[durably.store.StepRecord]:
        found = page_steps(run_id, attempt, after=after, limit=limit)
        read.append(("page_steps", len(found)))
        return found

    def whole(run_id: str, attempt: int | None = None) -> list[durably.store.StepRecord]:
        found = list_steps(run_id, attempt)
        read.append(("list_steps", len(found)))
        return found

    monkeypatch.setattr(store, "page_steps", paged)
    monkeypatch.setattr(store, "list_steps", whole)
    c = client(store)
    first = c.get(f"/runs/{run.id}").text
    # (a store that keeps the protocol's defaults, built on list_steps, reads it whole)
    own = type(store).page_steps is not durably.store.Journal.page_steps
    if own:  # (a page of 100 calls, and 16 more to see where the page ends)
        assert read == [("page_steps", 116)]
    assert ">450</span> — <span id=\"steps-ran\">450</span> ran, <span id=\"steps-cached\">0" \
        "</span> cached" in first and "page 1 of 5" in first
    assert len(re.findall(r'<td class="n">\d[\d,]*</td><td>parse', first)) == 100
    link = re.search(r'href="(/runs/[^"]*after=[^"]*)#steps">next', first)
    assert link is not None
    read.clear()
    second = c.get(link.group(1).replace("&amp;", "&")).text
    assert "page 2 of 5" in second
    if own:
        assert [name for name, _ in read] == ["page_steps"]
    shown = [int(n.replace(",", "")) for n in
             re.findall(r'<td class="n">(\d[\d,]*)</td><td>parse', second)]
    assert shown == [p for p in range(100, 200)]


_STOP = {"on": False}  # crunch_or_stop raises after its steps while this is set


@durably.entrypoint
def crunch_or_stop(n: int) -> int:
    total = sum(parse(i) for i in range(n))
    if _STOP["on"]:
        raise RuntimeError("stopped after the steps, to be resumed")
    return total


@pytest.mark.parametrize("shape", ["resumed", "cached"])
def test_a_big_resumed_or_cached_run_opens_reading_one_page_of_its_steps(
        store: durably.Store, monkeypatch: pytest.MonkeyPatch, shape: str) -> None:
    """A run whose steps were all replayed (a resumed attempt) or served from the cache
    opens reading the page it shows (``page_steps``), never its whole journal; its time
    saved, which needs the whole journal, comes with the runs' rows (the page's script
    puts it in) and is :meth:`durably.Run.time_saved`'s."""
    from durably._ui import app

    if shape == "resumed":
        _STOP["on"] = True
        with pytest.raises(RuntimeError):
            crunch_or_stop(250)
        _STOP["on"] = False
        run = crunch_or_stop.run(250)
        assert run.attempt == 2 and run.counts()["replayed"] == 250
    else:
        crunch.run(250)
        run = crunch_or_stop.run(250)
        assert run.counts()["cached"] == 250
    monkeypatch.setattr(app, "INLINE_HISTORY", 0)  # (the history reads every step)
    monkeypatch.setattr(app, "INLINE_SAVED", 100)
    read: list[str] = []
    page_steps, list_steps = store.page_steps, store.list_steps

    def paged(run_id: str, attempt: int, *, after: int = -1,
              limit: int = 100) -> list[durably.store.StepRecord]:
        read.append("page_steps")
        return page_steps(run_id, attempt, after=after, limit=limit)

    def whole(run_id: str, attempt: int | None = None) -> list[durably.store.StepRecord]:
        read.append("list_steps")
        return list_steps(run_id, attempt)

    monkeypatch.setattr(store, "page_steps", paged)
    monkeypatch.setattr(store, "list_steps", whole)
    c = client(store)
    first = c.get(f"/runs/{run.id}").text
    if type(store).page_steps is not durably.store.Journal.page_steps:
        assert read == ["page_steps"]
    status = "replayed" if shape == "resumed" else "cached"
    assert f'<span id="steps-{status}">250</span>' in first and "page 1 of 3" in first
    assert '<span id="time-saved" data-pending="1">computing…</span>' in first
    link = re.search(r'href="(/runs/[^"]*after=99)#steps">next', first)
    assert link is not None
    second = c.get(link.group(1).replace("&amp;", "&")).text
    shown = [int(n) for n in re.findall(r'<td class="n">(\d+)</td><td>parse', second)]
    assert shown == list(range(100, 200)) and "page 2 of 3" in second
    # the runs' rows: the time saved, as the run says it (the journal read once per run)
    row = next(r for r in c.get("/api/runs").json() if r["id"] == run.id)
    assert row["saved"] == pytest.approx(run.time_saved())
    assert row["saved_by_cache"] == pytest.approx(run.time_saved("cache"))
    # once kept, the page shows it itself
    again = c.get(f"/runs/{run.id}").text
    assert 'id="time-saved">' in again and "computing…" not in again


_WATCH: dict[str, Any] = {"shift": 0.0, "seen": []}


@durably.entrypoint
def hits_watched(n: int) -> int:
    """Calls parse(0..n-1), all served from the cache, noting after each how many cached
    steps the dashboard would count in the journal (``count_steps``); the clock the steps'
    records are stamped by jumps 2 s after the second."""
    from durably._runtime.context import live_run

    ctx = live_run()
    assert ctx is not None
    for i in range(n):
        parse(i)
        counted = _WATCH["store"].count_steps(ctx.run_id, ctx.attempt)
        _WATCH["seen"].append(counted.get("parse", {}).get("cached", 0))
        if i == 1:
            _WATCH["shift"] = 2.0
    return n


def test_an_executing_runs_cached_steps_reach_its_journal_a_second_after_the_first(
        store: durably.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps served from the cache are journaled in batches, and once the oldest buffered
    is a second old (by the steps' own times) at the next one: the dashboard's count of a
    running run's cached steps is never more than that late."""
    from durably._runtime import step as _step

    crunch.run(4)  # parse(0..3) cached
    real = _step.now
    monkeypatch.setattr(_step, "now", lambda: real() + _WATCH["shift"])
    monkeypatch.setitem(_WATCH, "store", store)
    monkeypatch.setitem(_WATCH, "seen", [])
    monkeypatch.setitem(_WATCH, "shift", 0.0)
    run = hits_watched.run(4)
    assert run.counts()["cached"] == 4
    # buffered, buffered, then the third (2 s after the first) writes the three, buffered
    assert _WATCH["seen"] == [0, 0, 3, 3]


class _Boom:
    """A payload whose unpickling makes a folder (``os.mkdir``): a side effect the dashboard
    must never cause."""

    def __init__(self, mark: str) -> None:
        self.mark = mark

    def __reduce__(self) -> tuple[Any, ...]:
        import os

        return (os.mkdir, (self.mark,))


@durably.task
def ask_about(payload: Any) -> str:
    answer = durably.interrupt({"payload": payload})
    return f"answered {answer!r}"


@durably.entrypoint
def hostile(payload: Any) -> str:
    return ask_about(payload)


def test_no_page_unpickles_a_value_or_imports_the_users_code(
        store: durably.Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An interrupt's payload (and the run's arguments) whose unpickling has a side effect,
    or whose class is in a module with an import side effect: no page, API, stream or
    action of the dashboard unpickles it (its History shows a placeholder)."""

    marks = tmp_path / "marks"
    marks.mkdir()
    (tmp_path / "evil_for_ui.py").write_text(
        "import os, pathlib\n"
        "pathlib.Path(os.environ['EVIL_FOR_UI']).write_text('imported')\n"
        "class Payload:\n    def __init__(self, n):\n        self.n = n\n")
    monkeypatch.setenv("EVIL_FOR_UI", str(marks / "imported"))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("evil_for_ui", None)  # (imported by the test of another store)
    import evil_for_ui  # type: ignore[import-not-found]

    unpickled = marks / "unpickled"
    runs = [hostile.run(_Boom(str(unpickled))), hostile.run(evil_for_ui.Payload(3))]
    assert [r.status for r in runs] == ["interrupted", "interrupted"]
    assert not unpickled.exists()  # (pickling it had no side effect)
    (marks / "imported").unlink()
    monkeypatch.delitem(sys.modules, "evil_for_ui")
    c = client(store)
    for run in runs:
        page = c.get(f"/runs/{run.id}")
        assert page.status_code == 200 and "History" in page.text
        history = c.get(f"/runs/{run.id}/history").text
        assert ("posix.mkdir(" in history or "os.mkdir(" in history
                or "evil_for_ui.Payload(" in history)
        assert c.get(f"/api/runs/{run.id}/graph").status_code == 200
        checkpoint = re.search(r'name="at" value="([^"]+)"', history)
        assert checkpoint is not None
        forked = post(c, f"/runs/{run.id}/fork",
                      {"csrf": csrf_of(history), "at": checkpoint.group(1)})
        assert forked.status_code == 303
        assert c.get(forked.headers["location"]).status_code == 200
    for path in ("/", "/api/runs", "/cache"):
        assert c.get(path).status_code == 200
    with c.stream("GET", "/api/stream") as events:
        assert next(events.iter_lines()) == "event: runs"
    answered = post(c, f"/runs/{runs[0].id}/answer", {
        "csrf": csrf_of(history), f"answer:{runs[0].interrupts[0].id}": '"yes"'})
    assert answered.status_code == 303
    assert c.get(f"/runs/{runs[0].id}/history").status_code == 200  # (with the answer)
    assert not unpickled.exists(), "the dashboard unpickled a payload (os.mkdir ran)"
    assert not (marks / "imported").exists() and "evil_for_ui" not in sys.modules, \
        "the dashboard imported the user's module"


def test_a_null_answer_is_refused_as_the_cli_refuses_it(store: durably.Store) -> None:
    run = publish.run(2)
    c = client(store)
    page = c.get(f"/runs/{run.id}").text
    for null in ("null", " null\n"):
        refused = post(c, f"/runs/{run.id}/answer",
                       {"csrf": csrf_of(page), f"answer:{run.interrupts[0].id}": null})
        assert refused.status_code == 400
        assert "None is not one" in refused.text
    assert durably.get_run(run.id, store=store).interrupts  # (nothing was journaled)
    with pytest.raises(durably.DefinitionError, match="None is not one"):
        publish.resume(run.id, None)  # (what durably resume --value null calls)


def test_a_corrupt_journal_is_said_with_its_fix_on_the_pages_and_in_the_stream(
        tmp_path: Path) -> None:
    import json

    root = tmp_path / "s"
    store = durably.DiskStore(root)
    durably.configure(store=store)
    publish.run(2)
    store.close()
    for name in ("journal.sqlite3-wal", "journal.sqlite3-shm"):
        (root / name).unlink(missing_ok=True)
    (root / "journal.sqlite3").write_bytes(b"\x00garbage" * 4096)
    store = durably.DiskStore(root)
    c = client(store)
    api = c.get("/api/runs")
    assert api.status_code == 500 and "Fix:" in api.json()["error"]
    page = c.get("/runs/publish-0123")
    assert page.status_code == 500 and "The store could not be read" in page.text
    assert "journal.sqlite3" in page.text and "Fix:" in page.text
    assert "store-error" in c.get("/").text  # (where the runs page says it)
    with c.stream("GET", "/api/stream") as events:
        lines = events.iter_lines()
        assert next(lines) == "event: failed"
        said = json.loads(next(lines)[len("data: "):])
    assert "journal.sqlite3" in said["error"] and "Fix:" in said["error"]
    store.close()


_GATE = __import__("threading").Event()


@durably.task
def gated_step(i: int) -> int:
    assert _GATE.wait(60)
    return i


@durably.entrypoint
def gated(n: int) -> int:
    total = sum(parse(i) for i in range(n))
    durably.interrupt("go on?")
    return total + gated_step(0)


def test_progress_is_against_a_previous_attempt_only_when_it_finished(
        store: durably.Store) -> None:
    """An attempt after one that stopped part of the way (an interrupt here; Ctrl-C, a
    crash) has no total: its previous attempt's steps are a lower bound (``before``), never
    ``expected`` (the bar read 944 of 823)."""
    import threading

    from durably._ui.queries import RunsWatch, StepsCache

    run = gated.run(5)
    assert run.status == "interrupted"
    _GATE.clear()
    resumed = threading.Thread(target=gated.resume, args=(run.id, "yes"))
    resumed.start()
    try:
        watch = RunsWatch(store, StepsCache(store))
        for _ in range(600):
            row = watch.rows()[run.id]
            if row["status"] == "running" and row["steps"] >= 5:
                break
            __import__("time").sleep(0.05)
        assert row["status"] == "running"
        assert row["expected"] is None and row["before"] == 5  # (5 parse; the ask paused)
    finally:
        _GATE.set()
        resumed.join(60)
    assert durably.get_run(run.id, store=store).status == "finished"


def test_read_only_never_writes_the_store_files(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """``durably ui --read-only`` opens a store directory for reading only (as a store this
    process cannot write): browsing every page leaves its databases as they were (SQLite
    only adds the index a log is read through), and a write is refused."""
    import hashlib

    root = tmp_path / "s"
    writer = durably.DiskStore(root)
    durably.configure(store=writer)
    run = publish.run(3)
    writer.close()

    def databases() -> dict[str, str]:
        return {name: hashlib.sha256((root / name).read_bytes()).hexdigest()
                for name in ("journal.sqlite3", "cache/cache.db")}

    before = databases()
    files = {p.name for p in root.rglob("*") if p.is_file()}
    opened: list[durably.Store] = []

    def served(store: durably.Store, token: str, **options: Any) -> Any:
        opened.append(store)
        raise SystemExit(0)  # (the store is what the test looks at: no server)

    monkeypatch.setattr("durably._ui.create_app", served)
    CliRunner().invoke(cli, ["ui", "--dir", str(root), "--read-only"])
    (store,) = opened
    assert isinstance(store, durably.DiskStore)
    c = client(store, read_only=True)
    for path in ("/", "/api/runs", "/cache", f"/runs/{run.id}", f"/runs/{run.id}/history",
                 f"/api/runs/{run.id}/graph"):
        assert c.get(path).status_code == 200, path
    assert store.read_only
    with pytest.raises(durably.StoreError, match="opened for reading only"):
        store.cache_put("k", b"v")
    store.close()
    assert databases() == before
    # (what docs/dashboard.md says: beside them, only SQLite's index of the log and an
    # empty log, made to read the journal, appear)
    made = {p.name for p in root.rglob("*") if p.is_file()} - files
    assert made <= {"journal.sqlite3-shm", "journal.sqlite3-wal", "cache.db-shm",
                    "cache.db-wal"}, made
    assert all(p.stat().st_size == 0 for p in root.rglob("*-wal")), made


def test_the_header_names_a_store_directory_by_its_absolute_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    store = durably.DiskStore("rel-store")
    c = client(store)
    shown = f'title="the store">{tmp_path / "rel-store"}</span>'
    assert shown in c.get("/").text  # (before the store was used: relative, it was)
    c.get("/api/runs")
    assert shown in c.get("/").text
    store.close()
