"""durably.render: Mermaid and DOT text pinned by snapshots, escaping, SVG through Graphviz
(and the error without it), save() for every suffix, the notebook display (a real kernel's
outputs shown in a browser), and the HTML report drawn by Viz.js in headless Chromium driven by
Playwright, with no ``dot`` on PATH.

Snapshots live in tests/snapshots/; after an intended change of the output, rewrite them with
``DURABLY_UPDATE_SNAPSHOTS=1 .venv/bin/python -m pytest tests/test_render.py`` and review the
diff. The Graphviz ``dot`` program and Chromium are system packages that ``.ci/run`` installs
(Debian: ``graphviz``, ``chromium``); the tests that need them skip without them, saying how to
install them, and fail instead under ``DURABLY_REQUIRE_SYSTEM=1``, as ``.ci/run`` sets it
(system.py).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import pathlib
import re
import sys
import types
import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import Any

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
    names = {f"{n}.{ext}" for n in GRAPHS for ext in ("mmd", "dot")} | {"report.html"}
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


@pytest.fixture
def no_viz_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that has put Viz.js in no notebook output yet (as a fresh kernel)."""
    monkeypatch.setattr(render, "_viz_shown", False)
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)


def script_texts(page: str) -> list[str]:
    return re.findall(r"<script[^>]*>(.*?)</script>", page, re.S)


def test_mimebundle_without_dot_is_html_drawn_in_the_browser(
        monkeypatch: pytest.MonkeyPatch, no_viz_shown: None) -> None:
    """Without dot: HTML whose script draws with Viz.js; the first output of the process
    carries Viz.js, later ones use it from the page; each holds a readable fallback."""
    monkeypatch.setenv("PATH", "")
    g = fan_out()
    first, second = render.mimebundle(g), g._repr_mimebundle_()
    for bundle in (first, second):
        assert sorted(bundle) == ["text/html", "text/plain"]
        assert bundle["text/plain"] == \
            "<RunGraph sweep · run fan-1 · finished: 4 ran · 1 cached>"
        page = bundle["text/html"]
        # the fallback: the title, a note saying to run the cell, a row per node
        assert "<b>sweep · run fan-1 · finished</b>" in page and "Run the cell again" in page
        assert page.count('<tr class="step status-') == 5 and "row-n" not in page
        assert "```mermaid" not in page and "flowchart" not in page
        # the drawing script gets the DOT text as a JSON string, and its element's id
        draw = script_texts(page)[-1]
        host = re.search(r'<div class="durably-run-graph" id="(durably-graph-[0-9a-f]{32})">',
                         page)
        assert host is not None
        call = re.search(r'\}\)\("(durably-graph-[0-9a-f]+)", ("(?:[^"\\]|\\.)*"), null\);$',
                         draw)
        assert call is not None and call[1] == host[1]
        assert json.loads(call[2]) == render.to_dot(g)
    assert first["text/html"].count(render._viz_js()) == 1
    assert render._viz_js() not in second["text/html"]
    assert len(second["text/html"]) < 20_000 < 1_000_000 < len(first["text/html"])
    assert len(script_texts(first["text/html"])) == 2
    assert len(script_texts(second["text/html"])) == 1
    assert first["text/html"] != second["text/html"]  # (each output has an id of its own)


def test_mimebundle_leaves_out_what_ipython_excludes(monkeypatch: pytest.MonkeyPatch,
                                                     no_viz_shown: None) -> None:
    monkeypatch.setenv("PATH", "")
    g = linear()
    assert sorted(render.mimebundle(g, include=["text/plain"])) == ["text/plain"]
    assert sorted(g._repr_mimebundle_(exclude=["text/html"])) == ["text/plain"]
    assert render._viz_shown is False  # Viz.js was not used up by outputs without HTML
    assert render._viz_js() in render.mimebundle(g, include=["text/html"])["text/html"]


def test_mimebundle_prefers_html_when_svg_is_excluded(require_dot: str,
                                                      no_viz_shown: None) -> None:
    bundle = render.mimebundle(linear(), exclude={"image/svg+xml"})
    assert sorted(bundle) == ["text/html", "text/plain"]


def test_every_colab_output_carries_viz(monkeypatch: pytest.MonkeyPatch,
                                        no_viz_shown: None) -> None:
    """Colab shows each output in a frame of its own: none can use another's Viz.js."""
    monkeypatch.setenv("PATH", "")
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    for _ in range(2):
        assert render._viz_js() in render.mimebundle(linear())["text/html"]


#: a notebook front end in one page: each output's HTML set into its own element, then (a
#: trusted output) its scripts run as JupyterLab runs them (evalInnerHTMLScriptTags: each
#: replaced by a copy, which runs), or (untrusted) removed, as its sanitizer does
FRONT_END = """<!DOCTYPE html><html><head><meta charset="utf-8"></head><body>
PRELUDE
<div id="notebook"></div>
<script type="application/json" id="outputs">OUTPUTS</script>
<script>
JSON.parse(document.getElementById("outputs").textContent).forEach(function (output) {
  var host = document.createElement("div");
  host.className = "output";
  document.getElementById("notebook").appendChild(host);
  host.innerHTML = output.html;
  Array.from(host.getElementsByTagName("script")).forEach(function (script) {
    if (!output.trusted) { script.remove(); return; }
    var copy = document.createElement("script");
    Array.from(script.attributes).forEach(function (a) { copy.setAttribute(a.name, a.value); });
    copy.textContent = script.textContent;
    script.parentNode.replaceChild(copy, script);
  });
});
</script></body></html>"""


#: an AMD loader as the classic notebook has (RequireJS), whose define() must not be used
REQUIREJS = """<script>
window.define = function () { throw new Error("Viz.js called the page's AMD define()"); };
window.define.amd = {};
</script>"""


def show_outputs(page: Any, tmp_path: pathlib.Path, name: str,
                 outputs: list[tuple[str, bool]], prelude: str = "") -> None:
    """Open FRONT_END showing ``outputs`` (HTML, trusted) in a fresh page load, after the
    ``prelude`` HTML."""
    source = json.dumps([{"html": h, "trusted": t} for h, t in outputs])
    file = tmp_path / f"{name}.html"
    file.write_text(FRONT_END.replace("OUTPUTS", source.replace("<", "\\u003c"))
                    .replace("PRELUDE", prelude), encoding="utf-8")
    page.goto(file.as_uri())


def node_labels(page: Any, scope: str) -> list[str]:
    """The first text line of each node drawn in ``scope``."""
    return list(page.eval_on_selector_all(
        f"{scope} svg g.node", "nodes => nodes.map(n => n.querySelector('text').textContent)"))


@pytest.mark.slow
def test_notebook_display_without_dot_draws_in_a_browser(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, page: Any) -> None:
    """A real kernel without dot displays two run graphs: the first output carries Viz.js,
    the second does not; in a browser both draw, in whichever order their scripts run, and
    beside an AMD loader (the classic notebook's); without the first (a reopened notebook
    whose first output is gone) or untrusted, an output shows its steps and says to run the
    cell again."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("PATH", "")  # the kernel inherits it: no dot there
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in (
        "import shutil, durably\n"
        "from durably.testing import MemoryStore\n"
        "assert shutil.which('dot') is None\n"
        "@durably.task\n"
        "def load(n: int) -> list[int]:\n"
        "    return list(range(n))\n"
        "@durably.task\n"
        "def total(xs: list[int]) -> int:\n"
        "    return sum(xs)\n"
        "@durably.entrypoint(store=MemoryStore())\n"
        "def pipeline(n: int) -> int:\n"
        "    return total(load(n))\n"
        "run = pipeline.run(4)\n"
        "run.graph()",
        "pipeline.run(5).graph()",
    )]
    nbclient.NotebookClient(nb, timeout=180, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    results = [[o for o in cell.outputs if o.output_type == "execute_result"]
               for cell in nb.cells]
    assert [len(r) for r in results] == [1, 1], [cell.outputs for cell in nb.cells]
    first, second = (r[0].data for r in results)
    for data in (first, second):
        assert sorted(data) == ["text/html", "text/plain"]
        assert "pipeline · run" in data["text/plain"]
    assert render._viz_js() in first["text/html"]
    assert render._viz_js() not in second["text/html"]

    expected = ["load", "total"]
    for name, order, prelude in (("in-order", (first, second), ""),
                                 ("reversed", (second, first), ""),
                                 ("requirejs", (first, second), REQUIREJS)):
        show_outputs(page, tmp_path, name, [(d["text/html"], True) for d in order], prelude)
        page.wait_for_function(
            "document.querySelectorAll('.output svg').length === 2", timeout=60_000)
        for i in (1, 2):
            labels = node_labels(page, f".output:nth-child({i})")
            assert [label.rpartition(".")[2] for label in labels] == expected, (name, labels)
        assert page.locator(".durably-note").count() == 0 and page.locator("tr").count() == 0

    for name, outputs in (("first-gone", [(second["text/html"], True)]),
                          ("untrusted", [(first["text/html"], False),
                                         (second["text/html"], False)])):
        show_outputs(page, tmp_path, name, outputs)
        # (a drawing would start at once: the scripts have all run when the page has loaded)
        page.wait_for_load_state("load")
        assert page.locator("svg").count() == 0
        notes = page.locator(".durably-note")
        assert notes.count() == len(outputs)
        for i in range(len(outputs)):
            assert notes.nth(i).is_visible() and "Run the cell again" in notes.nth(i).inner_text()
        rows = page.locator("tr.step")
        assert rows.count() == 2 * len(outputs) and rows.first.is_visible()
        assert rows.first.inner_text().split("\t")[0].rpartition(".")[2] == "load"


# -- save ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".svg", ".dot", ".gv", ".mmd", ".html", ".SVG"])
def test_save_each_suffix(suffix: str, tmp_path: pathlib.Path) -> None:
    if suffix.lower() == ".svg":
        system.dot()  # (the other suffixes need nothing: the browser draws .html)
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


VIZ_ELIDED = "/* Viz.js (durably/_assets/viz-global.js, with its licence) */"


def without_viz(page: str) -> str:
    """The page with the inlined Viz.js (exactly once in it) replaced by a short comment."""
    assert page.count(render._viz_js()) == 1
    return page.replace(render._viz_js(), VIZ_ELIDED)


def embedded_dot(page: str) -> str:
    """The DOT text the page's ``graph-dot`` script holds (JSON)."""
    start = page.index('<script type="application/json" id="graph-dot">')
    text = page[page.index(">", start) + 1: page.index("</script>", start)]
    value = json.loads(text)
    assert isinstance(value, str)
    return value


def test_html_report_content() -> None:
    g = report_graph()
    page = render.to_html(g)
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    # three scripts: the DOT text (JSON, not run), Viz.js, the drawing; user text adds none
    assert re.findall(r"<script\b[^>]*>", page) == [
        '<script type="application/json" id="graph-dot">', "<script>", "<script>"]
    assert len(re.findall("</script", page, re.I)) == 3
    assert embedded_dot(page) == render.to_dot(g)
    page = without_viz(page)
    assert "<img" not in page  # user text is escaped
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


def test_html_report_snapshot() -> None:
    """The page around the inlined Viz.js, pinned: review its diff when it changes."""
    assert_snapshot("report.html", without_viz(render.to_html(report_graph())))


def test_html_is_the_same_without_dot(monkeypatch: pytest.MonkeyPatch) -> None:
    """The browser draws the graph: the page does not depend on a system program."""
    g = report_graph()
    with_path = render.to_html(g)
    monkeypatch.setenv("PATH", "")
    monkeypatch.setitem(sys.modules, "graphviz", None)  # nor on the graphviz package
    assert render.to_html(g) == with_path


def test_html_is_self_contained() -> None:
    page = without_viz(render.to_html(report_graph()))
    assert not re.search(r"<(link|iframe|img|object|embed)\b", page)
    assert not re.search(r"<script\b[^>]*\bsrc\b", page)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "@import" not in page and "url(" not in page


def test_the_vendored_viz_js_is_the_pinned_file_and_can_be_inlined() -> None:
    """Viz.js is inlined in a <script>: it must hold nothing that ends a script or opens an
    HTML comment there. Its digest is the one _assets/README.md gives."""
    assets = pathlib.Path(render.__file__).parent / "_assets"
    source = (assets / "viz-global.js").read_bytes()
    digest = re.search(r"sha256: ([0-9a-f]{64})", (assets / "README.md").read_text())
    assert digest is not None and hashlib.sha256(source).hexdigest() == digest[1]
    for bad in (rb"</script", rb"<!--", rb"<script"):
        assert not re.search(bad, source, re.I)
    assert "MIT" in render._viz_js()[:2000] and "Michael Daines" in render._viz_js()[:2000]


HOSTILE = st.lists(st.sampled_from(["</script>", "</SCRIPT ", "<script>", "<!--", "-->", "<",
                                    ">", "&", '"', "\\", "\u2028", "\u2029", "×", "x", " "]),
                   min_size=1, max_size=8).map("".join)


@settings(max_examples=50, deadline=None)
@given(HOSTILE | st.text(st.characters(codec="utf-8"), min_size=1, max_size=30))
def test_no_text_of_the_run_can_end_or_add_a_script(task: str) -> None:
    g = RunGraph("r", task, "failed", 1, (step(1, task, "failed", error=task,
                                                inputs=task, output=task),), ())
    page = render.to_html(g)
    assert len(re.findall("<script", page, re.I)) == 3
    assert len(re.findall("</script", page, re.I)) == 3
    assert "<!--" not in page
    assert embedded_dot(page) == render.to_dot(g)


def draw_report(page: Any, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
                graph: RunGraph) -> tuple[pathlib.Path, list[str]]:
    """Save ``graph`` as HTML with no ``dot`` on PATH and open it in ``page``; returns the
    file and the list of URLs the page requests (filled as it loads)."""
    with monkeypatch.context() as m:
        m.setenv("PATH", "")
        file = graph.save(tmp_path / "run.html")
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    page.goto(file.as_uri())
    page.wait_for_selector("#graph svg", timeout=60_000)
    return file, requests


@pytest.mark.slow
def test_html_report_draws_in_chromium_without_dot(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, page: Any) -> None:
    g = report_graph()
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    file, requests = draw_report(page, tmp_path, monkeypatch, g)
    assert requests == [file.as_uri()]  # nothing loaded from anywhere else
    # every node drawn, with its label (the first line of its text)
    drawn = page.eval_on_selector_all(
        "#graph svg g.node",
        "nodes => nodes.map(n => [n.querySelector('title').textContent,"
        " Array.from(n.querySelectorAll('text')).map(t => t.textContent)])")
    assert sorted(name for name, _ in drawn) == [f"n{i}" for i in range(len(g.nodes))]
    labels = {name: lines for name, lines in drawn}
    for i, node in enumerate(g.nodes):
        assert labels[f"n{i}"][0] == node.label
    assert labels["n2"][:2] == ["parse ×1,200", "49 ran · 1,150 cached · 1 failed"]
    assert labels["n4"][0] == "<script>alert(1)</script>"  # drawn as text
    assert page.locator("#graph svg g.edge").count() == len(g.edges)
    assert page.locator("#graph svg g.cluster").count() == 1
    assert page.locator("#graph .durably-note").count() == 0  # replaced by the drawing
    # the table: a row per node, user text shown as text; no script of the run ever ran
    rows = page.locator("tr[id^=row-n]")
    assert rows.count() == len(g.nodes)
    assert page.locator("#row-n4 td").first.inner_text() == "<script>alert(1)</script>"
    assert "<img src=x onerror=alert(1)>" in page.locator("#row-n4").inner_text()
    assert page.locator("#steps img, #graph img").count() == 0
    assert dialogs == []
    # clicking a node highlights its row, and only that one
    page.locator("#graph svg g.node", has=page.locator("title", has_text="n2")).click()
    assert page.eval_on_selector_all("tr.selected", "rows => rows.map(r => r.id)") == ["row-n2"]
    page.locator("#graph svg g.node", has=page.locator("title", has_text="n4")).click()
    assert page.eval_on_selector_all("tr.selected", "rows => rows.map(r => r.id)") == ["row-n4"]
    page.screenshot(path=str(tmp_path / "report.png"), full_page=True)


@pytest.mark.slow
def test_html_report_of_many_steps_draws_in_chromium(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, page: Any) -> None:
    g = _loose(60, linked=2)
    draw_report(page, tmp_path, monkeypatch, g)
    assert page.locator("#graph svg g.node").count() == len(g.nodes)
    box = page.locator("#graph svg").bounding_box()
    assert box is not None and box["width"] / box["height"] < 4  # rows, not one wide row


@pytest.mark.slow
def test_html_report_without_javascript_lists_the_steps(tmp_path: pathlib.Path,
                                                        browser: Any) -> None:
    file = render.save(report_graph(), tmp_path / "run.html")
    context = browser.new_context(java_script_enabled=False)
    try:
        page = context.new_page()
        page.goto(file.as_uri())
        assert page.locator("svg").count() == 0
        assert "JavaScript is off" in page.locator("#graph .durably-note").inner_text()
        assert page.locator("tr[id^=row-n]").count() == len(report_graph().nodes)
        assert "parse ×1,200" in page.locator("#row-n2").inner_text()
    finally:
        context.close()


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
    assert embedded_dot(page) == graph.to_dot()
    assert "25 replayed" in page and "time saved by the cache" in page
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
