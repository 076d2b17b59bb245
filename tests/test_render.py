"""durably.render: Mermaid and DOT text pinned by snapshots, escaping, SVG through Graphviz
(and the error without it), save() for every suffix, the notebook display, and the HTML
report opened in headless Chromium.

Snapshots live in tests/snapshots/; after an intended change of the output, rewrite them with
``DURABLY_UPDATE_SNAPSHOTS=1 .venv/bin/python -m pytest tests/test_render.py`` and review the
diff. The Graphviz ``dot`` program and Chromium are system packages that ``.ci/run`` installs
(Debian: ``graphviz``, ``chromium``); the tests that need them skip without them, saying how to
install them, and fail instead under ``DURABLY_REQUIRE_SYSTEM=1``, as ``.ci/run`` sets it
(system.py).
"""

from __future__ import annotations

import difflib
import os
import pathlib
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import durably
from durably import render
from durably._trace.tracer import Edge, Node, RunGraph
from durably.exceptions import RenderError
from durably.testing import MemoryStore

from . import system

SNAPSHOTS = pathlib.Path(__file__).parent / "snapshots"
SVG_NS = {"svg": "http://www.w3.org/2000/svg"}


# -- building graphs by hand --------------------------------------------------------------------
def sid(i: int) -> str:
    """A step id like the runtime's: 32 hex characters."""
    return f"{i:032x}"


def step(i: int, task: str, status: str, parent: int | None = None, duration: float = 0.1,
         **kw: object) -> Node:
    return Node(id=sid(i), task=task, status=status, parent=sid(parent) if parent else None,
                started=1_700_000_000.0 + i, duration=duration, statuses={status: 1},
                steps=(sid(i),), **kw)  # type: ignore[arg-type]


def edge(a: int | str, b: int | str, count: int = 1) -> Edge:
    return Edge(sid(a) if isinstance(a, int) else a, sid(b) if isinstance(b, int) else b, count)


def linear() -> RunGraph:
    return RunGraph("a1b2c3", "etl", "finished", 1, (
        step(1, "load", "ran", duration=0.42, inputs="path='data.csv'", output="[3 rows]"),
        step(2, "clean", "ran", duration=0.012, inputs="rows=[3 rows]", output="[2 rows]"),
        step(3, "save", "ran", duration=1.5, inputs="rows=[2 rows]", output="None"),
    ), (edge(1, 2), edge(2, 3)))


def fan_out() -> RunGraph:
    return RunGraph("fan-1", "sweep", "finished", 1, (
        step(1, "split", "ran", duration=0.05, output="[0, 1, 2]"),
        step(2, "train", "ran", duration=2.5, inputs="x=0", output="0.91"),
        step(3, "train", "cached", duration=0.003, inputs="x=1", output="0.87"),
        step(4, "train", "ran", duration=2.25, inputs="x=2", output="0.93"),
        step(5, "best", "ran", duration=0.0004, inputs="scores=[0.91, 0.87, 0.93]",
             output="0.93"),
    ), (edge(1, 2), edge(1, 3), edge(1, 4), edge(2, 5), edge(3, 5), edge(4, 5)))


def nested() -> RunGraph:
    return RunGraph("nest-7", "report", "finished", 1, (
        step(1, "fetch", "ran", duration=0.3),
        step(2, "build", "ran", duration=4.0),
        step(3, "section", "ran", parent=2, duration=1.25),
        step(4, "render_table", "cached", parent=3, duration=0.002),
        step(5, "section", "ran", parent=2, duration=2.5),
        step(6, "publish", "ran", duration=0.8),
    ), (edge(1, 3), edge(3, 5), edge(2, 6)))


def failed() -> RunGraph:
    return RunGraph("f-9", "ingest", "failed", 1, (
        step(1, "download", "ran", duration=12.5, output="b'...'"),
        step(2, "parse", "failed", duration=0.2, inputs="blob=b'...'",
             error="ValueError('bad row 17: \"x\" <missing>\\nsecond line')"),
    ), (edge(1, 2),))


def cached_rerun() -> RunGraph:
    return RunGraph("c-3", "etl", "finished", 2, (
        step(1, "load", "replayed", duration=0.42),
        step(2, "clean", "cached", duration=0.001),
        step(3, "model", "ran", duration=75.0),
        step(4, "wait_for_review", "interrupted", duration=0.0),
    ), (edge(1, 2), edge(2, 3)), time_saved=3.75)


def collapsed() -> RunGraph:
    group = Node(id=f"group:{sid(2)}:parse", task="parse", status="failed", parent=sid(2),
                 started=1_700_000_003.0, duration=61.25, count=1200,
                 statuses={"cached": 1150, "ran": 49, "failed": 1},
                 error="KeyError('title')", steps=tuple(sid(100 + i) for i in range(1200)))
    return RunGraph("big-1", "index", "failed", 1, (
        step(1, "list_files", "ran", duration=0.05),
        step(2, "index_all", "failed", duration=64.0),
        group,
        step(3, "merge", "ran", parent=2, duration=0.5),
    ), (edge(1, 2), Edge(group.id, sid(3), 1199)))


GRAPHS: dict[str, Callable[[], RunGraph]] = {
    "linear": linear, "fan_out": fan_out, "nested": nested, "failed": failed,
    "cached_rerun": cached_rerun, "collapsed": collapsed,
}


# -- snapshots ----------------------------------------------------------------------------------
def assert_snapshot(name: str, text: str) -> None:
    """Compare ``text`` with tests/snapshots/``name``; DURABLY_UPDATE_SNAPSHOTS=1 (re)writes
    it instead. A missing snapshot fails."""
    path = SNAPSHOTS / name
    if os.environ.get("DURABLY_UPDATE_SNAPSHOTS") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(text.encode("utf-8"))
        return
    if not path.exists():
        pytest.fail(f"snapshot {path} is missing: write it with DURABLY_UPDATE_SNAPSHOTS=1 "
                    ".venv/bin/python -m pytest tests/test_render.py, review it, commit it")
    expected = path.read_bytes().decode("utf-8")
    if text != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True),
                                            f"{name} (snapshot)", f"{name} (now)"))
        pytest.fail(f"output differs from snapshot {path} (rewrite with "
                    f"DURABLY_UPDATE_SNAPSHOTS=1 if the change is intended):\n{diff}")


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_mermaid_snapshot(name: str) -> None:
    assert_snapshot(f"{name}.mmd", render.to_mermaid(GRAPHS[name]()))


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_dot_snapshot(name: str) -> None:
    assert_snapshot(f"{name}.dot", render.to_dot(GRAPHS[name]()))


def test_methods_of_the_graph_call_the_render_module() -> None:
    g = fan_out()
    assert g.to_mermaid() == render.to_mermaid(g)
    assert g.to_dot() == render.to_dot(g)


def test_no_snapshot_is_left_over() -> None:
    names = {f"{n}.{ext}" for n in GRAPHS for ext in ("mmd", "dot")}
    assert {p.name for p in SNAPSHOTS.iterdir()} == names


# -- what is drawn ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_exactly_the_graphs_edges_and_nodes_are_drawn(name: str) -> None:
    g = GRAPHS[name]()
    names = {n.id: f"n{i}" for i, n in enumerate(g.nodes)}
    want = [(names[e.source], names[e.target]) for e in g.edges]
    mermaid = render.to_mermaid(g)
    assert re.findall(r"^    (n\d+) -->(?:\|[^|]*\|)? (n\d+)$", mermaid, re.M) == want
    assert mermaid.count("-->") == len(g.edges)
    dot = render.to_dot(g)
    assert re.findall(r"^  (n\d+) -> (n\d+)", dot, re.M) == want
    assert dot.count("->") == len(g.edges)
    for i in range(len(g.nodes)):  # each node declared once, with a label
        assert len(re.findall(rf"^\s+n{i}\[", mermaid, re.M)) == 1
        assert len(re.findall(rf"^\s+n{i} \[label=", dot, re.M)) == 1
    # step ids never appear in the text: names are stable and short
    assert not re.search(r"[0-9a-f]{32}", mermaid + dot)


def test_labels_show_status_duration_and_group_counts() -> None:
    """Labels: status and duration (a replayed step: the time it took when it ran, said so:
    it took none now, as run.steps and durably show say), groups by status."""
    mermaid = render.to_mermaid(collapsed())
    assert 'n2[["parse ×1,200<br/>49 ran · 1,150 cached · 1 failed<br/>1 min 01 s in all<br/>' \
           "KeyError('title')\"]]:::failed" in mermaid
    assert '-->|"×1,199"|' in mermaid
    dot = render.to_dot(collapsed())
    assert 'label="parse ×1,200\\n49 ran · 1,150 cached · 1 failed\\n1 min 01 s in all' in dot
    assert 'n2 -> n3 [label="×1,199"];' in dot
    assert "shape=box3d" in dot
    text = render.to_mermaid(cached_rerun())
    for label in ("load<br/>replayed · ran in 0.42 s", "clean<br/>cached · 1 ms",
                  "model<br/>ran · 1 min 15 s", "wait_for_review<br/>interrupted · 0 s"):
        assert label in text
    for status in ("replayed", "cached", "ran", "interrupted"):
        assert f":::{status}" in text and f"classDef {status} " in text


def test_nesting_is_a_subgraph_holding_the_caller_and_its_calls() -> None:
    mermaid = render.to_mermaid(nested())
    inner = mermaid[mermaid.index('subgraph c1["build"]'):]
    block = inner[: inner.index("\n    end\n")]
    assert [m for m in re.findall(r"(n\d)\[", block)] == ["n1", "n2", "n3", "n4"]
    assert 'subgraph c2["section"]' in block  # section (n2) holds render_table (n3)
    assert "n5" not in block and "n0" not in block
    dot = render.to_dot(nested())
    cluster = dot[dot.index("subgraph cluster_n1 {"):]
    assert "subgraph cluster_n2 {" in cluster
    assert cluster.index("n4 [") < cluster.index("\n  }\n") < cluster.index("n5 [")


def test_title_names_entrypoint_run_and_status() -> None:
    assert render.to_mermaid(failed()).startswith('---\ntitle: "ingest · run f-9 · failed"\n')
    assert 'label="etl · run c-3 · finished, attempt 2"' in render.to_dot(cached_rerun())


def test_output_is_deterministic() -> None:
    for make in GRAPHS.values():
        assert render.to_mermaid(make()) == render.to_mermaid(make())
        assert render.to_dot(make()) == render.to_dot(make())


def test_empty_graph_and_unknown_status() -> None:
    empty = RunGraph("e", "noop", "finished", 1, (), ())
    assert render.to_mermaid(empty).splitlines()[-1].startswith("    classDef other ")
    assert "n0" not in render.to_mermaid(empty) and "n0" not in render.to_dot(empty)
    odd = RunGraph("e", "noop", "running", 1, (step(1, "x", "started"),), ())
    assert 'n0["x<br/>started · 0.10 s"]:::other' in render.to_mermaid(odd)


def test_an_edge_to_a_missing_node_is_an_error() -> None:
    g = RunGraph("bad", "p", "finished", 1, (step(1, "a", "ran"),), (edge(1, 2),))
    with pytest.raises(RenderError, match="not one of its nodes"):
        render.to_mermaid(g)


def test_a_caller_outside_the_graph_draws_at_the_top_level() -> None:
    g = RunGraph("r", "p", "finished", 1, (step(2, "orphan", "ran", parent=1),), ())
    assert "subgraph" not in render.to_mermaid(g)
    assert "cluster" not in render.to_dot(g)


# -- escaping -----------------------------------------------------------------------------------
NASTY = 'we"ird <b>[x]</b> {y} |z| #quot; &amp; `tick` ×2 \\n back\\ end; %% ok'
LINE_BREAKS = "\t\n\x0b\x0c\r\x1c\x1d\x1e\x85\u2028\u2029"
MERMAID_ENTITIES = {"#35;": "#", "#quot;": '"', "#amp;": "&", "#lt;": "<", "#gt;": ">",
                    "#96;": "`"}


def mermaid_decode(label: str) -> str:
    return re.sub(r"#(?:35|quot|amp|lt|gt|96);", lambda m: MERMAID_ENTITIES[m[0]], label)


def first_label(mermaid: str) -> str:
    match = re.search(r'^\s+n0\[\["?|^\s+n0\["', mermaid, re.M)
    assert match is not None
    rest = mermaid[match.end():]
    return rest[: rest.index('"]')]


@given(st.text(st.characters(codec="utf-8"), min_size=1, max_size=40))
def test_mermaid_labels_round_trip(task: str) -> None:
    g = RunGraph("r", "p", "finished", 1, (step(1, task, "ran"),), ())
    label = first_label(render.to_mermaid(g))
    for bad in ('"', "<b", ">", "\n", "\r", "`"):
        assert bad not in label.replace("<br/>", "")
    shown = mermaid_decode(label.split("<br/>")[0])  # (a name may itself hold "<br/>")
    assert shown == "".join(" " if c in LINE_BREAKS else c for c in task)


def test_mermaid_escapes_the_nasty_name_and_the_title() -> None:
    g = RunGraph('run "1"', "p<\n>", "finished", 1, (step(1, NASTY, "ran"),), ())
    text = render.to_mermaid(g)
    assert text.splitlines()[1] == 'title: "p<\\n> · run run \\"1\\" · finished"'
    assert first_label(text) == (
        "we#quot;ird #lt;b#gt;[x]#lt;/b#gt; {y} |z| #35;quot; #amp;amp; #96;tick#96; ×2 "
        "\\n back\\ end; %% ok<br/>ran · 0.10 s")


def svg_node_lines(svg: str) -> dict[str, list[str]]:
    """The text lines of each node of a Graphviz SVG, by node name."""
    root = ET.fromstring(svg.encode("utf-8"))
    found: dict[str, list[str]] = {}
    for g in root.iter("{http://www.w3.org/2000/svg}g"):
        if g.get("class") == "node":
            title = g.find("svg:title", SVG_NS)
            assert title is not None and title.text
            found[title.text] = ["".join(t.itertext())
                                 for t in g.iter("{http://www.w3.org/2000/svg}text")]
    return found


def test_dot_escapes_quotes_backslashes_and_newlines(require_dot: str) -> None:
    g = RunGraph("r", 'p"q', "failed", 1, (
        step(1, NASTY, "failed", error='OSError("a\\\\b")\nline 2'),
        step(2, "tail\\", "ran"),
    ), (edge(1, 2),))
    dot = render.to_dot(g)
    assert 'n1 [label="tail\\\\\\nran · 0.10 s"' in dot  # the backslash is not an escape
    lines = svg_node_lines(render.to_svg(g))
    assert lines["n0"] == [NASTY, "failed · 0.10 s", 'OSError("a\\\\b") line 2']
    assert lines["n1"] == ["tail\\", "ran · 0.10 s"]


@settings(max_examples=25, deadline=None)
@given(st.text(st.characters(codec="utf-8", min_codepoint=0x20, exclude_characters="\x7f"),
               min_size=1, max_size=30).filter(lambda t: t.strip() == t))
def test_dot_labels_round_trip_through_graphviz(require_dot: str, task: str) -> None:
    g = RunGraph("r", "p", "finished", 1, (step(1, task, "ran"),), ())
    shown = "".join(" " if c in LINE_BREAKS else c for c in task)
    assert svg_node_lines(render.to_svg(g))["n0"] == [shown, "ran · 0.10 s"]


# -- SVG ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_svg_draws_every_node_and_edge(name: str, require_dot: str) -> None:
    g = GRAPHS[name]()
    svg = render.to_svg(g)
    assert svg.lstrip().startswith("<?xml") and svg.rstrip().endswith("</svg>")
    lines = svg_node_lines(svg)
    assert sorted(lines) == sorted(f"n{i}" for i in range(len(g.nodes)))
    for i, n in enumerate(g.nodes):
        assert lines[f"n{i}"][0] == n.label
    assert svg.count('class="edge"') == len(g.edges)
    assert svg.count('class="cluster"') == len({n.parent for n in g.nodes} - {None}
                                               & {n.id for n in g.nodes})
    assert g.to_svg() == svg


def test_svg_without_dot_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    with pytest.raises(RenderError) as info:
        render.to_svg(linear())
    message = str(info.value)
    for hint in ("`dot` program", "apt install graphviz", "brew install graphviz",
                 "conda install -c conda-forge graphviz", "graph.to_mermaid()"):
        assert hint in message


def test_svg_without_the_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "graphviz", None)  # import graphviz raises ImportError
    with pytest.raises(RenderError, match=r"pip install 'durably\[graph\]'.*apt install graphviz"):
        render.to_svg(linear())


def test_a_failing_dot_is_a_render_error(require_dot: str) -> None:
    with pytest.raises(RenderError, match=r"dot -Tsvg run\.dot"):
        render._pipe_svg("digraph { this is not dot")


# -- notebook display ---------------------------------------------------------------------------
def test_mimebundle_is_svg_with_graphviz(require_dot: str) -> None:
    bundle = fan_out()._repr_mimebundle_()
    assert sorted(bundle) == ["image/svg+xml", "text/plain"]
    assert "<svg" in bundle["image/svg+xml"]
    assert bundle["text/plain"] == "<RunGraph sweep · run fan-1 · finished: 4 ran · 1 cached>"


def test_mimebundle_is_mermaid_markdown_without_dot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    g = fan_out()
    bundle = render.mimebundle(g)
    assert sorted(bundle) == ["text/markdown", "text/plain"]
    assert bundle["text/markdown"] == f"```mermaid\n{render.to_mermaid(g)}```"


# -- save ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".svg", ".dot", ".gv", ".mmd", ".html", ".SVG"])
def test_save_each_suffix(suffix: str, tmp_path: pathlib.Path) -> None:
    if suffix.lower() == ".svg":
        system.dot()  # (the other suffixes need nothing: .html without dot shows Mermaid)
    g = nested()
    written = g.save(str(tmp_path / f"run{suffix}"))
    assert written == tmp_path / f"run{suffix}" and isinstance(written, pathlib.Path)
    text = written.read_text(encoding="utf-8")
    expected = {".svg": render.to_svg, ".dot": render.to_dot, ".gv": render.to_dot,
                ".mmd": render.to_mermaid, ".html": render.to_html}[suffix.lower()](g)
    assert text == expected
    assert render.save(g, written) == written  # a Path works too, and replaces the file


@pytest.mark.parametrize("name", ["run.png", "run", "run.mermaid"])
def test_save_unknown_suffix(name: str, tmp_path: pathlib.Path) -> None:
    with pytest.raises(RenderError, match=r"\.dot, \.gv, \.html, \.mmd, \.svg"):
        render.save(linear(), tmp_path / name)
    assert not (tmp_path / name).exists()


def test_save_svg_without_dot_writes_nothing(tmp_path: pathlib.Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    with pytest.raises(RenderError, match="apt install graphviz"):
        render.save(linear(), tmp_path / "run.svg")
    assert not (tmp_path / "run.svg").exists()
    assert render.save(linear(), tmp_path / "run.mmd").exists()  # text needs nothing


# -- HTML ---------------------------------------------------------------------------------------
def report_graph() -> RunGraph:
    """Nested, collapsed, failed and hostile text in one graph."""
    g = collapsed()
    extra = step(9, "<script>alert(1)</script>", "ran", duration=0.25,
                 inputs="q='<img src=x onerror=alert(1)>'", output="'&amp;'")
    return RunGraph(g.run_id, g.name, g.status, g.attempt, (*g.nodes, extra),
                    g.edges, time_saved=42.5)


def test_html_report_content(require_dot: str) -> None:
    page = render.to_html(report_graph())
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "<svg" in page and "<?xml" not in page
    assert "<script" not in page and "<img" not in page  # user text is escaped
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "q=&#x27;&lt;img src=x onerror=alert(1)&gt;&#x27;" in page
    assert "&#x27;&amp;amp;&#x27;" in page
    summary = page[page.index('id="summary"'):page.index("</p>", page.index('id="summary"'))]
    assert "status <b>failed</b>" in summary
    assert "<b>1,204</b> steps" in summary  # 1,200 calls of parse + 4 steps
    assert "1,150 cached" in summary and "52 ran" in summary and "2 failed" in summary
    assert "time saved by the cache and the journal <b>42.5 s</b>" in summary
    assert "wall time <b>" in summary
    rows = re.findall(r'<tr id="row-(n\d+)"', page)
    assert rows == ["n0", "n1", "n2", "n3", "n4"]  # one row per node, a group is one row
    group_row = page[page.index('<tr id="row-n2"'):]
    group_row = group_row[: group_row.index("</tr>")]
    assert "parse ×1,200" in group_row and "49 ran" in group_row and "KeyError" in group_row
    indents = re.findall(r'<tr id="row-n\d+"[^>]*><td( style="padding-left:[\d.]+em")?>', page)
    assert indents == ["", "", ' style="padding-left:1.8em"', ' style="padding-left:1.8em"', ""]


def test_html_is_self_contained() -> None:
    page = render.to_html(report_graph())
    assert not re.search(r"<(script|link|iframe|img|object|embed)\b", page)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "@import" not in page and "url(" not in page


def test_html_without_dot_embeds_mermaid_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    g = report_graph()
    page = render.to_html(g)
    assert "<svg" not in page and "<script" not in page
    assert '<pre class="mermaid-source">' in page
    assert "apt install graphviz" in page
    assert "flowchart TD" in page and "n0 --&gt; n1" in page


def dump_dom(browser: str, page: pathlib.Path, tmp_path: pathlib.Path) -> str:
    """The DOM of ``page`` after ``browser`` (a Chromium) loaded it headless."""
    profile = tmp_path / "chromium-profile"
    proc = subprocess.run(
        [browser, "--headless", "--disable-gpu", "--no-sandbox",
         "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
         f"--user-data-dir={profile}", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, f"chromium failed ({proc.returncode}): {proc.stderr[-2000:]}"
    return proc.stdout


@pytest.mark.slow
def test_html_report_renders_in_chromium(tmp_path: pathlib.Path, require_dot: str,
                                         require_chromium: str) -> None:
    g = report_graph()
    page = g.save(tmp_path / "run.html")
    dom = dump_dom(require_chromium, page, tmp_path)
    assert "<svg" in dom and 'class="node"' in dom
    assert dom.count('class="node"') == len(g.nodes)
    assert len(re.findall(r'<tr id="row-n\d+"', dom)) == len(g.nodes)
    assert "parse ×1,200" in dom
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in dom  # shown as text, not run


@pytest.mark.slow
def test_html_report_without_dot_renders_in_chromium(tmp_path: pathlib.Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     require_chromium: str) -> None:
    with monkeypatch.context() as m:
        m.setenv("PATH", "")
        page = render.save(nested(), tmp_path / "run.html")
    dom = dump_dom(require_chromium, page, tmp_path)
    assert '<pre class="mermaid-source">' in dom and "flowchart TD" in dom
    assert len(re.findall(r'<tr id="row-n\d+"', dom)) == len(nested().nodes)


# -- real runs, end to end ----------------------------------------------------------------------
def short(task: str) -> str:
    """A task's name without its qualifying prefix (tasks defined in a test are named
    ``test_x.<locals>.load``)."""
    return task.rpartition(".")[2]


def mermaid_nodes(text: str) -> dict[str, str]:
    """Mermaid node name -> the task at the start of its label (decoded)."""
    found = re.findall(r'^\s+(n\d+)\[\[?"([^"]*)"', text, re.M)
    return {name: mermaid_decode(label.split("<br/>")[0]) for name, label in found}


def mermaid_edges(text: str) -> list[tuple[str, str]]:
    return re.findall(r"^    (n\d+) -->(?:\|[^|]*\|)? (n\d+)$", text, re.M)


def test_a_real_run_draws_its_data_flow_and_nesting() -> None:
    @durably.task
    def load(n: int) -> list[int]:
        return list(range(1, n + 1))

    @durably.task
    def square(x: int) -> int:
        return x * x

    @durably.task
    def squares(xs: list[int]) -> list[int]:
        return [square(x) for x in xs]  # nested: drawn inside squares

    @durably.task
    def total(values: list[int]) -> int:
        return sum(values)

    @durably.entrypoint(store=MemoryStore())
    def pipeline(n: int) -> int:
        return total(squares(load(n)))

    run = pipeline.run(3)
    assert run.result == 14
    graph = run.graph()
    text = graph.to_mermaid()
    nodes = {name: short(task) for name, task in mermaid_nodes(text).items()}
    assert sorted(nodes.values()) == ["load", "square", "square", "square", "squares", "total"]
    edges = {(nodes[a], nodes[b]) for a, b in mermaid_edges(text)}
    assert {("load", "squares"), ("squares", "total")} <= edges
    assert len(mermaid_edges(text)) == len(graph.edges)  # exactly the graph's edges
    # the three calls of square sit in the box of squares, with squares' own node
    opening = re.search(r'^    subgraph (c\d+)\["([^"]*)"\]$', text, re.M)
    assert opening is not None and short(mermaid_decode(opening[2])) == "squares"
    box = text[opening.end(): text.index("\n    end\n", opening.end())]
    assert sorted(short(nodes[n]) for n in re.findall(r"(n\d+)\[", box)) == [
        "square", "square", "square", "squares"]
    assert "#lt;locals#gt;" in text  # the qualified names are escaped
    assert text.count(":::ran") == 6 and graph.to_mermaid() == text
    dot = graph.to_dot()
    assert dot.count("subgraph cluster_") == 1 and dot.count(" -> ") == len(graph.edges)
    assert f"run {run.id} · finished" in text and f"run {run.id} · finished" in dot


def test_a_real_rerun_and_a_failure_render(tmp_path: pathlib.Path, require_dot: str) -> None:
    broken = [True]

    @durably.task
    def parse(i: int) -> int:
        return i * 2 + 1_000  # not a small number: small ones are too common to be flows

    @durably.task
    def check(values: list[int]) -> int:
        if broken[0]:
            raise ValueError(f"bad <{len(values)}> \"values\"")
        return sum(values)

    @durably.entrypoint(store=MemoryStore())
    def index(n: int) -> int:
        return check([parse(i) for i in range(n)])

    with pytest.raises(ValueError, match="bad"):
        index.run(25)
    failed_run = durably.list_runs(index)[0]
    graph = failed_run.graph()
    text = graph.to_mermaid()
    assert re.search(r'\[\["[^"]*parse ×25<br/>25 ran<br/>', text)  # collapsed: 25 > 20
    assert re.search(r'check<br/>failed · [^"]*<br/>ValueError\(\'bad #lt;25#gt; '
                     r'#quot;values#quot;\'\)"\]:::failed', text)
    assert mermaid_edges(text) == [("n0", "n1")]
    assert '-->|"×25"|' in text
    assert f"run {failed_run.id} · failed" in text
    broken[0] = False
    rerun = index.run(25)
    graph = rerun.graph()
    assert graph.attempt == 2
    text = graph.to_mermaid()
    assert "25 replayed" in text and "check<br/>ran · " in text
    page = graph.save(tmp_path / "run.html").read_text(encoding="utf-8")
    assert "<svg" in page and "25 replayed" in page and "time saved by the cache" in page
    svg = svg_node_lines(graph.to_svg())
    assert [lines[0].rpartition(".")[2] for _, lines in sorted(svg.items())] == [
        "parse ×25", "check"]


def _loose(n: int, linked: int = 0) -> RunGraph:
    """A run of ``n`` steps no edge connects (collapse=None), after ``linked`` pairs that
    an edge does, and a step with 10 unconnected calls nested in it."""
    nodes = [Node(f"{i:032x}", "work", "ran", None, float(i), 0.01) for i in range(n)]
    edges = []
    for j in range(linked):
        a, b = f"a{j:031x}", f"b{j:031x}"
        nodes += [Node(a, "load", "ran", None, 0.0, 0.01),
                  Node(b, "fit", "ran", None, 0.0, 0.01)]
        edges.append(Edge(a, b))
    outer = f"c{0:031x}"
    nodes.append(Node(outer, "batch", "ran", None, 0.0, 0.5))
    nodes += [Node(f"d{i:031x}", "part", "ran", outer, 0.0, 0.01) for i in range(10)]
    return RunGraph("r-loose", "sweep", "finished", 1, tuple(nodes), tuple(edges))


def test_many_unconnected_steps_are_drawn_in_rows_in_dot() -> None:
    """graph(collapse=None) of 60 steps that no data flow connects drew one row 100 times
    wider than high: invisible edges chain each to the one 8 places after it."""
    graph = _loose(60, linked=2)
    dot = render.to_dot(graph)
    names = {n.id: f"n{i}" for i, n in enumerate(graph.nodes)}
    invisible = re.findall(r"^  (n\d+) -> (n\d+) \[style=invis\];$", dot, re.M)
    top = [names[f"{i:032x}"] for i in range(60)]
    nested = [names[f"d{i:031x}"] for i in range(10)]
    # the top level's unconnected steps, then the calls nested in "batch" among themselves
    # (the cluster's own node is left alone), each in call order
    assert invisible == [*zip(top, top[8:], strict=False),
                         *zip(nested, nested[8:], strict=False)]
    linked = {names[n.id] for n in graph.nodes if n.task in ("load", "fit")}
    assert not linked & {end for pair in invisible for end in pair}  # drawn by their edges
    assert dot.count(" -> ") == len(invisible) + 2
    row = render.to_dot(_loose(8))  # a row's worth at the top: nothing to chain there
    assert re.findall(r"^  (n\d+) -> (n\d+) \[style=invis\];$", row, re.M) == [
        ("n9", "n17"), ("n10", "n18")]


def test_many_unconnected_steps_draw_an_svg_of_readable_proportions(
        require_dot: None) -> None:
    svg = render.to_svg(_loose(60))
    found = re.search(r'<svg width="(\d+)pt" height="(\d+)pt"', svg)
    assert found is not None
    width, height = int(found.group(1)), int(found.group(2))
    assert width / height < 4, (width, height)  # (one row: 105 to 1)
    assert svg.count('class="node"') == 71
