"""``durably ui`` in a real browser: headless Chromium (the system's, through Playwright)
against a uvicorn server on a free port, with runs made by other processes, as a user sees
them. Screenshots of the pages go to the test's ``tmp_path``."""

from __future__ import annotations

import contextlib
import functools
import http.server
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import durably

from .conftest import script_env, write_script

pytest.importorskip("uvicorn", reason="pip install -e '.[test]'")
import uvicorn

from durably._ui import create_app

pytestmark = pytest.mark.slow
TOKEN = "browser-test-token"
#: a run another process makes: 40 steps, slow enough to be watched as it executes
CRUNCH = """
import time
import durably

@durably.task
def parse(i):
    time.sleep(0.05)
    return i * 2

@durably.task
def total(xs):
    return sum(xs)

@durably.entrypoint
def crunch(n):
    return total([parse(i) for i in range(n)])

if __name__ == "__main__":
    print(crunch.run(40).status)
"""
APPROVE = """
import durably

@durably.task
def draft(topic):
    return f"a post about {topic}"

@durably.entrypoint
def publish(topic):
    text = draft(topic)
    verdict = durably.interrupt({"question": "Publish this?", "text": text})
    return f"{text}: {verdict}"

if __name__ == "__main__":
    print(publish.run("durability").id)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serve(store: durably.Store | None, port: int = 0, token: str = TOKEN, **options: Any
          ) -> Iterator[str]:
    """The dashboard of ``store`` (``create_app``'s ``options``), served by uvicorn in a
    thread on ``port`` (0: a free one): its base URL."""
    port = port or _free_port()
    config = uvicorn.Config(create_app(store, token, poll=0.3, **options), host="127.0.0.1",
                            port=port, log_level="warning", timeout_graceful_shutdown=1)
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not uv.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        uv.should_exit = True
        thread.join(10)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A dashboard of the DiskStore at ``tmp_path/"store"``, served by uvicorn in a thread:
    its base URL and the store's directory."""
    store = durably.DiskStore(tmp_path / "store")
    with serve(store) as base:
        yield base, store.path


def _start(tmp_path: Path, store_dir: Path, name: str, source: str) -> subprocess.Popen[str]:
    script = write_script(tmp_path / name, source)
    return subprocess.Popen([sys.executable, str(script)], env=script_env(store_dir),
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _finish(proc: subprocess.Popen[str]) -> str:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, f"the script failed:\n{out}\n{err}"
    return out


def test_a_request_without_the_token_is_refused(server: tuple[str, Path], page: Any) -> None:
    base, _ = server
    refused = page.goto(base + "/")
    assert refused is not None and refused.status == 403
    assert "needs its token" in page.inner_text("body")
    assert page.goto(base + "/?token=not-it").status == 403
    assert page.goto(f"{base}/?token={TOKEN}").status == 200
    assert page.url == base + "/"  # the token is dropped from the URL, kept in a cookie
    assert page.goto(base + "/cache").status == 200


def test_a_run_of_another_process_appears_and_finishes_live(server: tuple[str, Path],
                                                            page: Any, tmp_path: Path) -> None:
    base, store_dir = server
    page.goto(f"{base}/?token={TOKEN}")
    page.wait_for_selector("#live.on")
    assert page.locator("#runs tbody tr").count() == 0
    page.evaluate("window.notReloaded = true")
    proc = _start(tmp_path, store_dir, "crunch.py", CRUNCH)
    try:
        row = page.locator("#runs tbody tr").first
        row.wait_for(timeout=60_000)
        page.wait_for_selector("#runs tbody tr[data-status=running] .progress", timeout=60_000)
        page.screenshot(path=str(tmp_path / "runs-executing.png"))
        page.wait_for_selector("#runs tbody tr[data-status=finished]", timeout=60_000)
    finally:
        assert _finish(proc).strip() == "finished"
    assert page.evaluate("window.notReloaded") is True  # updated in place, never reloaded
    cells = row.locator("td").all_inner_texts()
    assert cells[1] == "crunch" and cells[2] == "finished"
    assert cells[5] == "41"  # ran: 40 parse and 1 total
    assert cells[9] == "0 ms"  # time saved: known, none (blank, "…", only while unknown)
    page.screenshot(path=str(tmp_path / "runs.png"))
    # its page draws its graph: an <svg> with the run's nodes
    row.locator("a").click()
    svg = page.wait_for_selector("#graph svg", timeout=60_000)
    labels = (svg.text_content() or "") if svg else ""
    assert "parse" in labels and "total" in labels and "×40" in labels
    page.screenshot(path=str(tmp_path / "run.png"), full_page=True)
    # the fan-out collapsed into one node expands when clicked
    page.locator("#graph g.node.group").first.click()
    page.wait_for_function(
        # (a function, not a string: the pages' policy forbids eval, which a string takes)
        "() => document.querySelectorAll('#graph svg g.node').length === 41", timeout=60_000)
    assert page.locator("#graph g.node.group").count() == 0
    page.locator("#graph-section").screenshot(path=str(tmp_path / "expanded.png"))
    page.click("#graph button.collapse")  # (and back)
    page.wait_for_selector("#graph g.node.group", timeout=60_000)
    assert page.locator("#graph svg g.node").count() == 2  # parse ×40, total


def test_an_interrupt_answered_in_the_form_finishes_after_durably_resume(
        server: tuple[str, Path], page: Any, tmp_path: Path) -> None:
    base, store_dir = server
    run_id = _finish(_start(tmp_path, store_dir, "approve.py", APPROVE)).strip()
    page.goto(f"{base}/?token={TOKEN}")
    page.locator(f"#runs tbody tr[data-run='{run_id}'] a").click()
    page.wait_for_selector(".steer")
    assert "Publish this?" in page.inner_text(".steer")
    assert "a post about durability" in page.inner_text(".steer")
    page.wait_for_selector("#graph svg", timeout=60_000)
    page.fill(".steer textarea", '"ship it"')
    page.screenshot(path=str(tmp_path / "interrupt.png"), full_page=True)
    page.click(".steer button[type=submit]")
    page.wait_for_selector("text=Every question of this run is answered")
    assert f"durably resume {run_id}" in page.inner_text(".steer")
    resumed = subprocess.run(
        [sys.executable, "-m", "durably", "resume", run_id], env=script_env(store_dir),
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "a post about durability: ship it" in resumed.stdout
    # the open page sees the run finish (its status changed: it reads the run again)
    page.wait_for_selector("#run[data-status=finished]", timeout=60_000)
    assert page.inner_text("#status") == "finished"
    assert page.locator(".steer").count() == 0


@durably.task
def link(i: int) -> int:
    return i + 1  # (equal to the next call's input: the calls are linked into a chain)


@durably.task
def merge(xs: list[int]) -> int:
    return sum(xs)


@durably.entrypoint
def bigfan(n: int) -> int:
    return merge([link(i) for i in range(n)])


def test_a_graph_too_hard_to_lay_out_never_freezes_the_page(
        server: tuple[str, Path], page: Any, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Expanding a fan-out whose graph Graphviz lays out for minutes (calls linked into a
    chain): the layout runs in a worker, ended after ``LAYOUT_SECONDS``; the page stays
    responsive, says why, and has a way back to the collapsed graph."""
    from durably._ui import app

    base, store_dir = server
    monkeypatch.setattr(app, "LAYOUT_SECONDS", 3)
    durably.configure(store=durably.DiskStore(store_dir))
    run = bigfan.run(400)
    page.goto(f"{base}/runs/{run.id}?token={TOKEN}")
    page.wait_for_selector("#graph g.node.group", timeout=60_000)
    page.locator("#graph g.node.group").first.click()
    page.wait_for_selector("text=to lay out, so it was not drawn", timeout=60_000)
    assert page.evaluate("1 + 1") == 2  # (the page answers: its thread is not laying out)
    page.locator("#graph-section").screenshot(path=str(tmp_path / "graph-too-hard.png"))
    page.click("#graph button.collapse")
    page.wait_for_selector("#graph g.node.group", timeout=60_000)
    assert "×400" in (page.text_content("#graph svg") or "")
    # more calls than are ever drawn: said, with the way back too
    monkeypatch.setattr(app, "MAX_DRAWN", 100)
    wide = bigfan.run(300)
    page.goto(f"{base}/runs/{wide.id}")
    page.wait_for_selector("#graph g.node.group", timeout=60_000)
    page.locator("#graph g.node.group").first.click()
    page.wait_for_selector("text=too many to draw", timeout=60_000)
    page.click("#graph button.collapse")
    page.wait_for_selector("#graph g.node.group", timeout=60_000)


@durably.task
def echo(text: str) -> str:
    return text.upper()


@durably.entrypoint
def shout(text: str) -> str:
    return echo(text)


def test_long_values_never_widen_the_page(server: tuple[str, Path], page: Any,
                                          tmp_path: Path) -> None:
    """Long inputs and outputs are cut in the step and history tables (with an ellipsis):
    the page is never wider than the window (it was 1,516 px in a 1,300 px one)."""
    base, store_dir = server
    durably.configure(store=durably.DiskStore(store_dir))
    run = shout.run("a long value, " * 400)
    page.set_viewport_size({"width": 1000, "height": 900})
    page.goto(f"{base}/runs/{run.id}?token={TOKEN}")
    page.wait_for_selector("#graph svg", timeout=60_000)
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    page.screenshot(path=str(tmp_path / "long-values.png"), full_page=True)


LONG = CRUNCH.replace("crunch.run(40)", "crunch.run(200)")


def test_a_running_runs_counts_are_updated_together(server: tuple[str, Path], page: Any,
                                                    tmp_path: Path) -> None:
    """On the page of a run that executes, the live total of steps and its parts (ran,
    cached, ...) are updated together (the total ran ahead of its parts: 188 — 65 ran)."""
    base, store_dir = server
    page.goto(f"{base}/?token={TOKEN}")
    proc = _start(tmp_path, store_dir, "long.py", LONG)
    try:
        page.wait_for_selector("#runs tbody tr[data-status=running] a", timeout=60_000)
        page.click("#runs tbody tr[data-status=running] a")
        page.wait_for_selector("#run[data-status=running]", timeout=60_000)
        page.evaluate("window.notReloaded = true")
        first = int(page.inner_text("#steps-total").replace(",", ""))
        page.wait_for_function(
            "() => window.notReloaded && Number(document.getElementById('steps-total').textContent"
            f".replace(/,/g, '')) > {first} + 5 && document.getElementById('steps-ran')"
            ".textContent === document.getElementById('steps-total').textContent",
            timeout=60_000)
    finally:
        _finish(proc)


def test_a_corrupt_journal_is_said_on_the_runs_page(server: tuple[str, Path], page: Any,
                                                   tmp_path: Path) -> None:
    """The runs page of a store whose journal is damaged says the store's message and fix
    (its stream's event failed), not an endless "reconnecting…"."""
    base, store_dir = server
    writer = durably.DiskStore(store_dir)
    durably.configure(store=writer)
    shout.run("hello")
    writer.close()
    for name in ("journal.sqlite3-wal", "journal.sqlite3-shm"):
        (store_dir / name).unlink(missing_ok=True)
    (store_dir / "journal.sqlite3").write_bytes(b"\x00garbage" * 4096)
    page.goto(f"{base}/?token={TOKEN}")
    said = page.wait_for_selector("#store-error:not([hidden])", timeout=60_000)
    text = said.inner_text() if said else ""
    assert "journal.sqlite3" in text and "Fix:" in text
    assert page.inner_text("#live") == "store error"
    page.screenshot(path=str(tmp_path / "corrupt.png"))


@durably.task
def halve(i: int) -> int:
    return i // 2


@durably.entrypoint
def halves(n: int) -> int:
    return sum(halve(i) for i in range(n))


@durably.entrypoint
def halves_again(n: int) -> int:
    return sum(halve(i) for i in range(n))


def test_a_big_runs_time_saved_is_filled_in_by_the_page(
        server: tuple[str, Path], page: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run too big for its time saved to be computed with its page (all its steps served
    from the cache here) opens with a placeholder, which the page's script replaces with
    the figure the runs' rows carry."""
    from durably._ui import app

    monkeypatch.setattr(app, "INLINE_SAVED", 10)
    base, store_dir = server
    durably.configure(store=durably.DiskStore(store_dir))
    halves.run(30)
    run = halves_again.run(30)
    assert run.counts()["cached"] == 30 and run.time_saved("cache") > 0
    served = page.goto(f"{base}/runs/{run.id}?token={TOKEN}")
    assert served is not None and 'id="time-saved" data-pending="1"' in served.text()
    page.wait_for_selector("#time-saved:not([data-pending])", timeout=60_000)
    assert page.inner_text("#time-saved").endswith("by the cache)")


def test_the_pages_refuse_to_be_framed_by_another_page(server: tuple[str, Path], page: Any,
                                                       tmp_path: Path) -> None:
    base, store_dir = server
    run_id = _finish(_start(tmp_path, store_dir, "approve.py", APPROVE)).strip()
    page.goto(f"{base}/?token={TOKEN}")  # (logged in: the cookie would be sent to a frame)
    # another page of this machine (another port: the same site for the cookie) frames it
    lure = tmp_path / "lure"
    lure.mkdir()
    (lure / "lure.html").write_text(
        f'<h1>lure</h1><iframe id="f" src="{base}/runs/{run_id}" width=900 height=600>'
        "</iframe>")
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(
        http.server.SimpleHTTPRequestHandler, directory=str(lure)))
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        page.goto(f"http://127.0.0.1:{other.server_address[1]}/lure.html")
        page.wait_for_load_state("load")
        framed = page.frames[1]
        deadline = time.monotonic() + 30
        while framed.url in ("", "about:blank"):  # (until the frame's answer is there)
            assert time.monotonic() < deadline, "the frame never loaded"
            page.wait_for_timeout(50)
        page.screenshot(path=str(tmp_path / "framed.png"))
    finally:
        other.shutdown()
        other.server_close()
    # Chromium shows its error page in the frame, never the dashboard's page or its forms
    assert framed.url.startswith("chrome-error:"), framed.url
    assert page.frame_locator("#f").locator(".steer").count() == 0
    # the dashboard's own page still draws its graph (Viz.js: a worker and WebAssembly,
    # allowed by the policy) and answers its question (the form's POST: its Origin kept)
    page.goto(f"{base}/runs/{run_id}")
    page.wait_for_selector("#graph svg", timeout=60_000)
    page.fill(".steer textarea", '"ship it"')
    page.click(".steer button[type=submit]")
    page.wait_for_selector("text=Every question of this run is answered")


MULTI = """
import durably

@durably.task
def approve(i):
    return durably.interrupt({"item": i, "note": "n" * 30000, "last": f"key after {i}"})

@durably.entrypoint
def multi(n):
    return approve.map(list(range(n)))

if __name__ == "__main__":
    print(multi.run(3).id)
"""


def test_one_of_several_questions_is_answered_in_the_form(
        server: tuple[str, Path], page: Any, tmp_path: Path) -> None:
    base, store_dir = server
    run_id = _finish(_start(tmp_path, store_dir, "multi.py", MULTI)).strip()
    page.goto(f"{base}/runs/{run_id}?token={TOKEN}")
    page.wait_for_selector(".steer")
    assert page.locator(".steer textarea").count() == 3
    # each payload shows its keys after a long value (each value cut on its own)
    assert page.locator(".steer pre.payload", has_text="key after").count() == 3
    assert "--value '{" in page.inner_text(".steer .hint")
    page.locator(".steer textarea").nth(1).fill('"yes"')
    page.screenshot(path=str(tmp_path / "several.png"), full_page=True)
    page.click(".steer button[type=submit]")  # (two boxes empty: no box is required)
    page.wait_for_selector("text=answered 1; 2 left pending")
    assert page.locator(".steer textarea").count() == 2
    assert "Waiting for 2 answer(s)" in page.inner_text(".steer")


WIDE = """
import durably

@durably.task
def boom(x):
    raise ValueError("WWWWWWWWWW MMMMMMMMMM WWWWWWWWWW MMMMMMMMMM WWWWWWWWWW " + str(x))

@durably.entrypoint
def failing(x):
    return boom(x)

if __name__ == "__main__":
    try:
        failing.run(3)
    except ValueError:
        print(durably.list_runs()[0].id)
"""


def test_a_failed_nodes_error_stays_inside_its_node(
        server: tuple[str, Path], page: Any, tmp_path: Path) -> None:
    base, store_dir = server
    run_id = _finish(_start(tmp_path, store_dir, "wide.py", WIDE)).strip()
    page.goto(f"{base}/runs/{run_id}?token={TOKEN}")
    page.wait_for_selector("#graph svg g.node", timeout=60_000)
    page.locator("#graph-section").screenshot(path=str(tmp_path / "failed-node.png"))
    spills = page.evaluate("""() => {
      const out = [];
      for (const node of document.querySelectorAll("#graph g.node")) {
        const shape = node.querySelector("path, polygon, ellipse").getBoundingClientRect();
        for (const line of node.querySelectorAll("text")) {
          const box = line.getBoundingClientRect();
          if (box.left < shape.left - 0.5 || box.right > shape.right + 0.5) {
            out.push(line.textContent);
          }
        }
      }
      return out;
    }""")
    assert spills == []
    assert "WWWWWWWWWW" in page.inner_text("#graph")


@durably.entrypoint
def tiny(i: int) -> int:
    return i


def test_the_runs_table_says_when_it_is_cut_and_pages_to_older_runs(
        page: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import durably._ui.app

    store = durably.DiskStore(tmp_path / "store")
    durably.configure(store=store)
    for i in range(7):
        tiny.run(i)
    made = [run.id for run in durably.list_runs()]  # (most recently updated first)
    monkeypatch.setattr(durably._ui.app, "RUNS_SHOWN", 3)
    with serve(store) as base:
        page.goto(f"{base}/?token={TOKEN}")
        page.wait_for_selector("#more:not([hidden])")
        assert page.inner_text("#more") == "The newest 3 of 7 runs (the most recently " \
                                           "updated) older ›"
        assert shown(page) == set(made[:3])
        page.screenshot(path=str(tmp_path / "runs-cut.png"))
        page.click("#more a")
        page.wait_for_selector("#more:has-text('updated before')")
        assert shown(page) == set(made[3:6])
        assert "3 of the 7 runs, updated before" in page.inner_text("#more")
        url = page.url
        page.click("#more a:has-text('older')")
        page.wait_for_url(lambda now: now != url)
        page.wait_for_selector("#more:has-text('updated before')")
        assert "1 of the 7 runs" in page.inner_text("#more")
        assert shown(page) == {made[6]}
        assert page.locator("#more a:has-text('older')").count() == 0  # (the last page)
        page.click("#more a:has-text('newest')")
        page.wait_for_selector("#live.on")
        assert shown(page) == set(made[:3])


def shown(page: Any) -> set[str]:
    """The ids of the runs in the runs table."""
    return {row.get_attribute("data-run") for row in page.locator("#runs tbody tr").all()}


def test_an_open_page_says_the_dashboard_was_restarted_with_a_new_address(
        page: Any, tmp_path: Path) -> None:
    store = durably.DiskStore(tmp_path / "store")
    durably.configure(store=store)
    run_id = tiny.run(1).id
    port = _free_port()
    runs = page.context.new_page()
    with serve(store, port) as base:
        runs.goto(f"{base}/?token={TOKEN}")
        runs.wait_for_selector("#live.on")
        page.goto(f"{base}/runs/{run_id}")
        page.wait_for_selector("#graph svg", timeout=60_000)
    with serve(store, port, token="the-new-token"):  # (restarted: a new token)
        for tab in (runs, page):
            note = tab.wait_for_selector("#restarted", timeout=30_000)
            assert note is not None
            assert "The dashboard was restarted" in note.inner_text()
            assert f"{base}/?token=" in note.inner_text()
        assert runs.inner_text("#live") == "restarted"
        page.screenshot(path=str(tmp_path / "restarted.png"))
        runs.close()


def test_the_graph_zooms_around_the_pointer_pans_and_fits_again(
        server: tuple[str, Path], page: Any, tmp_path: Path) -> None:
    base, store_dir = server
    run_id = _finish(_start(tmp_path, store_dir, "crunch.py", CRUNCH))  # (no id printed)
    del run_id
    page.goto(f"{base}/?token={TOKEN}")
    page.locator("#runs tbody tr a").first.click()
    page.locator("#graph g.node.group").first.click()  # (41 nodes: a wide graph)
    page.wait_for_function(
        "() => document.querySelectorAll('#graph svg g.node').length === 41", timeout=60_000)
    svg = page.locator("#graph svg")

    def view() -> list[float]:
        return [float(v) for v in (svg.get_attribute("viewBox") or "").split()]

    whole = view()
    box = svg.bounding_box()
    assert box is not None and box["height"] >= 200  # (room to zoom into a wide graph)
    x, y = box["x"] + box["width"] * 0.25, box["y"] + box["height"] / 2
    page.mouse.move(x, y)
    page.mouse.wheel(0, -600)  # (zoom in, around the pointer)
    page.wait_for_function("(w) => document.querySelector('#graph svg').viewBox.baseVal.width"
                           " < w", arg=whole[2])
    zoomed = view()
    assert zoomed[2] < whole[2] / 2 and zoomed[3] < whole[3] / 2
    # the point under the pointer stayed under it: it was a quarter of the way across
    assert abs((zoomed[0] + zoomed[2] * 0.25) - (whole[0] + whole[2] * 0.25)) < whole[2] * 0.02
    page.locator("#graph-section").screenshot(path=str(tmp_path / "zoomed.png"))
    page.mouse.down()
    page.mouse.move(x + 200, y + 50, steps=5)  # (drag: pan)
    page.mouse.up()
    panned = view()
    assert panned[0] < zoomed[0] and panned[1] < zoomed[1] and panned[2] == zoomed[2]
    assert page.locator("#graph svg g.node").count() == 41  # (a drag expands nothing)
    page.dblclick("#graph svg", position={"x": 5, "y": 5})
    assert view() == whole
    page.click("#graph .zoom button:has-text('+')")
    assert view()[2] < whole[2]
    page.click("#graph .zoom button:has-text('fit')")
    assert view() == whole


def test_a_dashboard_opened_before_the_first_run_shows_it_once_made(
        page: Any, tmp_path: Path) -> None:
    where = tmp_path / "not-yet"

    def open_store() -> durably.Store | None:
        return durably.DiskStore(where) if (where / "FORMAT").exists() else None

    with serve(None, open_store=open_store, where=str(where)) as base:
        page.goto(f"{base}/?token={TOKEN}")
        page.wait_for_selector("#live.on")
        assert f"No run was made in {where} yet" in page.inner_text("#waiting")
        page.screenshot(path=str(tmp_path / "waiting.png"))
        assert not where.exists()
        proc = _start(tmp_path, where, "approve.py", APPROVE)
        run_id = _finish(proc).strip()
        page.wait_for_selector(f"#runs tbody tr[data-run='{run_id}']", timeout=60_000)
        assert page.locator("#waiting").is_hidden()
