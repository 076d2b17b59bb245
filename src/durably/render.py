"""Drawing a run graph: Mermaid and DOT text, SVG through Graphviz, a self-contained HTML
report, and the rich display of a notebook.

Every function takes a :class:`~durably.RunGraph` (from :meth:`Run.graph
<durably.Run.graph>`) and uses only its public attributes; the :class:`RunGraph` methods
``to_mermaid``, ``to_dot``, ``to_svg``, ``to_html``, ``save`` and ``_repr_mimebundle_`` call
them. What is drawn:

- one box per node: the task (``parse ×1,200`` for a collapsed group), its status and
  duration; a group shows its calls by status. Colours follow the status: ``ran`` green,
  ``cached`` blue, ``replayed`` grey (dashed), ``failed`` red, ``interrupted`` amber;
- a step called inside another step's body is drawn inside a box of its caller (a Mermaid
  ``subgraph``, a DOT ``cluster``) that also holds the caller's own node;
- exactly the graph's data-flow edges (``Edge``), labelled ``×n`` when one edge stands for
  several step-to-step edges between groups; nothing else connects the nodes;
- a title: the entrypoint, the run id and the run's status.

Text output is deterministic: nodes are named ``n0, n1, ...`` in the order of
``graph.nodes`` (never by step id), so the same graph always gives the same text. Only SVG
text needs the ``graphviz`` Python package and the Graphviz ``dot`` program (``pip install
'durably[graph]'`` and ``apt install graphviz`` / ``brew install graphviz``). The HTML report
and the notebook display draw the DOT text in the browser with Graphviz compiled to
WebAssembly (Viz.js, shipped with durably in ``durably/_assets``), so they need no system
program; Mermaid and DOT text need nothing either.
"""

from __future__ import annotations

import functools
import html
import importlib.resources
import json
import math
import os
import pathlib
import sys
import uuid
from collections.abc import Callable, Collection, Iterator
from typing import TYPE_CHECKING

from durably.exceptions import RenderError

if TYPE_CHECKING:
    from durably._trace.tracer import Node, RunGraph

__all__ = ["mimebundle", "save", "to_dot", "to_html", "to_mermaid", "to_svg"]

_STATUSES = ("ran", "cached", "replayed", "failed", "interrupted")

# status -> (fill, border): the same colours in Mermaid, DOT and the HTML report
_COLOURS: dict[str, tuple[str, str]] = {
    "ran": ("#d8f0dc", "#2e7d32"),
    "cached": ("#dbe8f7", "#1565c0"),
    "replayed": ("#ececec", "#757575"),
    "failed": ("#f9d6d5", "#c62828"),
    "interrupted": ("#fff1c7", "#b7791f"),
}
_OTHER = ("#ffffff", "#424242")  # a status this module does not know

_INSTALL_DOT = (
    "Install Graphviz: `apt install graphviz` (Debian/Ubuntu), `brew install graphviz` "
    "(macOS), `conda install -c conda-forge graphviz` (conda), or an installer from "
    "https://graphviz.org/download/ (Windows; put its bin folder on PATH)."
)
_WITHOUT_DOT = "Mermaid and DOT text need neither: use graph.to_mermaid() or graph.to_dot()."
_SUFFIXES = {".dot": "dot", ".gv": "dot", ".html": "html", ".mmd": "mermaid", ".svg": "svg"}


# -- shared helpers ----------------------------------------------------------------------------
def _format_duration(seconds: float) -> str:
    """A duration for people: ``0 s``, ``0.05 ms``, ``12 ms``, ``0.42 s``, ``12.3 s``,
    ``2 min 05 s``, ``1 h 02 min``.

    Args:
        seconds: The duration, in seconds (negative values count as 0).

    Returns:
        The text; ``?`` for a value that is not a finite number.

    Example:
        >>> [_format_duration(s) for s in (0, 0.00005, 0.012, 0.42, 12.34, 125, 3720)]
        ['0 s', '0.05 ms', '12 ms', '0.42 s', '12.3 s', '2 min 05 s', '1 h 02 min']
    """
    if not isinstance(seconds, int | float) or not math.isfinite(seconds):
        return "?"
    s = max(float(seconds), 0.0)
    if s == 0:
        return "0 s"
    if s < 0.001:
        return f"{s * 1000:.2f} ms"
    if s < 0.1:
        return f"{s * 1000:.0f} ms"
    if s < 10:
        return f"{s:.2f} s"
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        minutes, rest = divmod(round(s), 60)
        return f"{minutes} min {rest:02d} s"
    hours, rest = divmod(round(s / 60), 60)
    return f"{hours} h {rest:02d} min"


def _status_order(status: str) -> tuple[int, str]:
    return (_STATUSES.index(status), "") if status in _STATUSES else (len(_STATUSES), status)


def _statuses(node: Node) -> list[tuple[str, int]]:
    """The node's calls by status, in the order of ``_STATUSES`` (unknown ones last)."""
    counts = dict(node.statuses) if node.statuses else {node.status: node.count}
    return sorted(((s, n) for s, n in counts.items() if n), key=lambda sn: _status_order(sn[0]))


def _counts_text(counts: list[tuple[str, int]]) -> str:
    return " · ".join(f"{n:,} {s}" for s, n in counts)


def _duration_text(node: Node) -> str:
    """A step's duration as drawn: a replayed step's is the time it took when it ran (it
    took none now: ``run.steps`` and ``durably show`` say 0), and says so."""
    text = _format_duration(node.duration)
    return f"ran in {text}" if node.status == "replayed" else text


def _label_lines(node: Node) -> list[str]:
    """The lines of a node's label: the task, then status and duration (a group: its calls
    by status, then the total duration), then a failed step's error."""
    if node.count == 1:
        lines = [node.label, f"{node.status} · {_duration_text(node)}"]
    else:
        lines = [node.label, _counts_text(_statuses(node)),
                 f"{_format_duration(node.duration)} in all"]
    if node.error and node.status == "failed":
        lines.append(_clip(node.error, 60))
    return lines


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())  # one line: newlines and runs of blanks become one space
    return text if len(text) <= limit else text[: limit - 1] + "…"


_LINE_BREAKS = str.maketrans(dict.fromkeys("\t\n\x0b\x0c\r\x1c\x1d\x1e\x85\u2028\u2029", " "))


def _one_line(text: str) -> str:
    """The text with each line break (and tab) made a space: labels break only where we
    break them."""
    return text.translate(_LINE_BREAKS)


def _title(graph: RunGraph) -> str:
    attempt = f", attempt {graph.attempt}" if graph.attempt > 1 else ""
    return f"{graph.name} · run {graph.run_id} · {graph.status}{attempt}"


class _Layout:
    """Stable names (``n0, n1, ...`` in node order) and the nesting of the nodes."""

    def __init__(self, graph: RunGraph) -> None:
        self.graph = graph
        self.names: dict[str, str] = {}
        for i, n in enumerate(graph.nodes):
            self.names.setdefault(n.id, f"n{i}")
        self.children: dict[str, list[Node]] = {}
        self.roots: list[Node] = []
        for n in graph.nodes:
            if n.parent is not None and n.parent in self.names and n.parent != n.id:
                self.children.setdefault(n.parent, []).append(n)
            else:  # the entrypoint's own calls, and calls whose caller is not in the graph
                self.roots.append(n)
        for e in graph.edges:
            for end in (e.source, e.target):
                if end not in self.names:
                    raise RenderError(
                        f"the graph of run {graph.run_id!r} has an edge {e.source!r} -> "
                        f"{e.target!r} whose end {end!r} is not one of its nodes; a RunGraph "
                        "built by Run.graph() never has one: build its nodes and edges "
                        "together."
                    )

    def walk(self) -> Iterator[tuple[str, Node | None, int]]:
        """Drawing order: ``("node", n, depth)``, ``("open", n, depth)`` before the nodes
        nested in ``n`` (``n`` itself first among them), ``("close", None, depth)`` after."""
        seen: set[str] = set()

        def visit(n: Node, depth: int) -> Iterator[tuple[str, Node | None, int]]:
            if n.id in seen:  # a repeated id or a parent cycle: draw each node once
                return
            seen.add(n.id)
            kids = self.children.get(n.id, [])
            if not kids:
                yield "node", n, depth
                return
            yield "open", n, depth
            yield "node", n, depth + 1
            for k in kids:
                yield from visit(k, depth + 1)
            yield "close", None, depth

        for root in self.roots:
            yield from visit(root, 0)
        # nodes only reachable through a parent cycle: still drawn, at the top level
        for n in self.graph.nodes:
            if n.id not in seen:
                self.children.pop(n.id, None)
                yield from visit(n, 0)


# -- Mermaid -----------------------------------------------------------------------------------
_MERMAID_ESCAPES = {
    "#": "#35;", '"': "#quot;", "&": "#amp;", "<": "#lt;", ">": "#gt;", "`": "#96;",
}


def _mermaid_text(text: str) -> str:
    """Text safe inside a quoted Mermaid label (entity codes: ``#quot;``, ``#lt;``...)."""
    return "".join(_MERMAID_ESCAPES.get(c, c) for c in _one_line(text))


def _mermaid_class(status: str) -> str:
    return status if status in _COLOURS else "other"


def to_mermaid(graph: RunGraph) -> str:
    """The run graph as Mermaid flowchart text (``flowchart TD``).

    Nodes are ``n0, n1, ...`` in the order of ``graph.nodes``; a node's label gives its
    task, status and duration; its class (``ran``, ``cached``, ``replayed``, ``failed``,
    ``interrupted``) colours it. A step's nested calls sit in ``subgraph c<i>`` with the
    step's own node. The title (front matter) names the entrypoint, the run and its status.
    Label text is escaped with Mermaid entity codes (``#quot;``, ``#lt;``, ``#35;``...).

    Args:
        graph: The run graph.

    Returns:
        The Mermaid text, ending with a newline.

    Raises:
        RenderError: an edge of the graph names a node that is not in it.

    Example:
        >>> from durably._trace.tracer import Edge, Node, RunGraph
        >>> graph = RunGraph("r1", "etl", "finished", 1, nodes=(
        ...     Node("a" * 32, "load", "ran", None, 0.0, 0.42, statuses={"ran": 1}),
        ...     Node("b" * 32, "save", "cached", None, 0.5, 0.012, statuses={"cached": 1}),
        ... ), edges=(Edge("a" * 32, "b" * 32),))
        >>> print(to_mermaid(graph))  # doctest: +ELLIPSIS
        ---
        title: "etl · run r1 · finished"
        ---
        flowchart TD
            classDef ran fill:#d8f0dc,stroke:#2e7d32,color:#000
        ...
            n0["load<br/>ran · 0.42 s"]:::ran
            n1["save<br/>cached · 12 ms"]:::cached
            n0 --> n1
        <BLANKLINE>
    """
    layout = _Layout(graph)
    out = ["---", f"title: {json.dumps(_title(graph), ensure_ascii=False)}", "---",
           "flowchart TD"]
    for status, (fill, stroke) in (*_COLOURS.items(), ("other", _OTHER)):
        extra = ",stroke-dasharray:5 3" if status == "replayed" else ""
        extra += ",stroke-width:2px" if status == "failed" else ""
        out.append(f"    classDef {status} fill:{fill},stroke:{stroke},color:#000{extra}")
    for kind, node, depth in layout.walk():
        pad = "    " * (depth + 1)
        if kind == "close":
            out.append(f"{pad}end")
            continue
        assert node is not None
        name = layout.names[node.id]
        if kind == "open":
            out.append(f'{pad}subgraph c{name[1:]}["{_mermaid_text(node.label)}"]')
            continue
        label = "<br/>".join(_mermaid_text(line) for line in _label_lines(node))
        # a group is a "subroutine" box (double sides): it stands for many calls
        left, right = ('[["', '"]]') if node.count > 1 else ('["', '"]')
        out.append(f"{pad}{name}{left}{label}{right}:::{_mermaid_class(node.status)}")
    for e in graph.edges:
        a, b = layout.names[e.source], layout.names[e.target]
        out.append(f'    {a} -->|"×{e.count:,}"| {b}' if e.count > 1 else f"    {a} --> {b}")
    return "\n".join(out) + "\n"


# -- DOT ---------------------------------------------------------------------------------------
def _dot_text(text: str) -> str:
    """Text for inside a double-quoted DOT string whose newlines are our own line breaks:
    backslashes and quotes escaped, ``&`` written ``&amp;`` (Graphviz decodes HTML entities
    in labels), the user's newlines made spaces."""
    return _one_line(text).replace("&", "&amp;").replace("\\", "\\\\").replace('"', '\\"')


def _dot_quote(*lines: str) -> str:
    return '"' + "\\n".join(_dot_text(line) for line in lines) + '"'


def _tooltip(node: Node) -> list[str]:
    if node.count == 1:
        lines = [f"{node.label}: {node.status}, {_duration_text(node)}"]
    else:
        lines = [f"{node.label}: {_counts_text(_statuses(node))}; "
                 f"{_format_duration(node.duration)} in all"]
    for key, value in (("inputs", node.inputs), ("output", node.output),
                       ("error", node.error)):
        if value is not None:
            lines.append(f"{key}: {_clip(value, 200)}")
    return lines


#: how many steps that no edge touches a row of the DOT drawing holds (see to_dot)
_ROW = 8


def to_dot(graph: RunGraph) -> str:
    """The run graph as Graphviz DOT text (``digraph``).

    Nodes are ``n0, n1, ...`` in the order of ``graph.nodes``, filled by status; a step's
    nested calls sit in ``subgraph cluster_n<i>`` with the step's own node; a tooltip gives
    inputs, output and error. Strings are quoted with ``\\"`` and ``\\\\`` escaped.
    Steps that no data-flow edge touches (many calls drawn one by one, ``collapse=None``)
    are laid out in rows of 8, in call order, by invisible edges (``style=invis``), so the
    drawing stays readable instead of one row as wide as all of them.

    Args:
        graph: The run graph.

    Returns:
        The DOT text, ending with a newline. UTF-8 (``×`` is written as is).

    Raises:
        RenderError: an edge of the graph names a node that is not in it.

    Example:
        >>> from durably._trace.tracer import Node, RunGraph
        >>> graph = RunGraph("r1", "etl", "failed", 1, nodes=(
        ...     Node("a" * 32, "load", "failed", None, 0.0, 0.25, error="OSError('gone')"),
        ... ), edges=())
        >>> print(to_dot(graph))  # doctest: +ELLIPSIS
        digraph durably_run {
        ...
          n0 [label="load\\nfailed · 0.25 s\\nOSError('gone')", ...];
        }
        <BLANKLINE>
    """
    layout = _Layout(graph)
    linked = {end for e in graph.edges for end in (e.source, e.target)}
    loose: dict[str | None, list[str]] = {}  # per cluster: its nodes no edge touches
    inside: list[str | None] = [None]
    out = [
        "digraph durably_run {",
        f"  graph [label={_dot_quote(_title(graph))}, labelloc=t, fontname=\"Helvetica\", "
        "fontsize=14, rankdir=TB, nodesep=0.3, ranksep=0.4];",
        '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=11, '
        'margin="0.15,0.06"];',
        '  edge [color="#555555", fontname="Helvetica", fontsize=10];',
    ]
    for kind, node, depth in layout.walk():
        pad = "  " * (depth + 1)
        if kind == "close":
            inside.pop()
            out.append(f"{pad}}}")
            continue
        assert node is not None
        name = layout.names[node.id]
        if kind == "node" and node.id != inside[-1] and node.id not in linked:
            loose.setdefault(inside[-1], []).append(name)
        if kind == "open":
            inside.append(node.id)
            out.append(f"{pad}subgraph cluster_{name} {{")
            out.append(f"{pad}  label={_dot_quote(node.label)}; labeljust=l; "
                       'style="rounded,dashed"; color="#9e9e9e"; fontsize=11;')
            continue
        fill, border = _COLOURS.get(node.status, _OTHER)
        style = "filled" if node.count > 1 else "rounded,filled"
        if node.status == "replayed":
            style += ",dashed"
        attrs = [f"label={_dot_quote(*_label_lines(node))}", f'fillcolor="{fill}"',
                 f'color="{border}"']
        if node.count > 1:
            attrs.append("shape=box3d")
        if node.status == "failed":
            attrs.append("penwidth=2")
        attrs += [f'style="{style}"', f"tooltip={_dot_quote(*_tooltip(node))}"]
        out.append(f"{pad}{name} [{', '.join(attrs)}];")
    for e in graph.edges:
        a, b = layout.names[e.source], layout.names[e.target]
        label = f' [label="×{e.count:,}"]' if e.count > 1 else ""
        out.append(f"  {a} -> {b}{label};")
    # steps no edge touches sit side by side on one rank: 60 of them drew a row 100 times
    # wider than high. Invisible edges chain each to the one _ROW places after it, so
    # they fill rows of _ROW
    for names in loose.values():
        out.extend(f"  {a} -> {b} [style=invis];"
                   for a, b in zip(names, names[_ROW:], strict=False))
    out.append("}")
    return "\n".join(out) + "\n"


# -- SVG ---------------------------------------------------------------------------------------
def to_svg(graph: RunGraph) -> str:
    """The run graph as SVG text, laid out by Graphviz ``dot`` from :func:`to_dot`.

    Args:
        graph: The run graph.

    Returns:
        The SVG document (with its XML declaration).

    Raises:
        RenderError: the ``graphviz`` Python package is not installed (``pip install
            'durably[graph]'``), the ``dot`` program is not on ``PATH`` (the message says
            how to install it on each system), or ``dot`` failed.

    Example:
        >>> from durably._trace.tracer import Node, RunGraph
        >>> graph = RunGraph("r1", "etl", "finished", 1, (
        ...     Node("a" * 32, "load", "ran", None, 0.0, 0.42),), ())
        >>> try:
        ...     svg = to_svg(graph)
        ... except RenderError:  # no Graphviz here: the message says how to install it
        ...     svg = "<svg>...</svg>"
        >>> "<svg" in svg
        True
    """
    return _pipe_svg(to_dot(graph))


def _pipe_svg(dot: str) -> str:
    try:
        import graphviz
    except ImportError:
        raise RenderError(
            "drawing a run graph as SVG needs the `graphviz` Python package, which is not "
            "installed: pip install 'durably[graph]' (or pip install graphviz). It also needs "
            f"the Graphviz `dot` program. {_INSTALL_DOT} {_WITHOUT_DOT}"
        ) from None
    try:
        svg: str = graphviz.Source(dot).pipe(format="svg", encoding="utf-8")
    except graphviz.ExecutableNotFound:
        raise RenderError(
            "drawing a run graph as SVG needs the Graphviz `dot` program, which was not found "
            f"on PATH. {_INSTALL_DOT} {_WITHOUT_DOT}"
        ) from None
    except graphviz.CalledProcessError as exc:
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) \
            else str(exc.stderr or "")
        raise RenderError(
            f"Graphviz `dot` failed to draw the run graph (exit {exc.returncode}): "
            f"{stderr.strip() or exc}. Save the DOT text with graph.save('run.dot') and run "
            "`dot -Tsvg run.dot` to see why."
        ) from exc
    return svg


# -- HTML --------------------------------------------------------------------------------------
_CSS = """
body { font: 14px/1.45 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif;
       margin: 1.5em 2em; color: #1f2328; }
h1 { font-size: 1.4em; margin: 0 0 .2em; }
.run { color: #57606a; margin: 0 0 .8em; font-family: ui-monospace, Menlo, monospace; }
.summary { margin: 0 0 1.2em; }
.summary b { font-weight: 600; }
.graph { overflow: auto; border: 1px solid #d0d7de; border-radius: 6px; padding: .5em;
         margin-bottom: 1.5em; max-height: 80vh; }
.graph svg { max-width: 100%; height: auto; }
.graph svg text { font-family: Helvetica, Arial, "Liberation Sans", "Nimbus Sans", sans-serif; }
.note { color: #57606a; }
table { border-collapse: collapse; width: 100%; }
th, td { border-bottom: 1px solid #d0d7de; padding: .3em .6em; text-align: left;
         vertical-align: top; }
th { background: #f6f8fa; position: sticky; top: 0; }
tr.selected td { background: #fff8c5; }
.graph g.node { cursor: pointer; }
td.num { text-align: right; white-space: nowrap; }
td.code { font-family: ui-monospace, Menlo, monospace; font-size: 12px; word-break: break-all; }
.badge { display: inline-block; border-radius: 1em; padding: 0 .6em; margin: 0 .2em .1em 0;
         border: 1px solid; font-size: 12px; white-space: nowrap; }
"""


def _badges(counts: list[tuple[str, int]], *, numbers: bool) -> str:
    parts = []
    for status, n in counts:
        fill, border = _COLOURS.get(status, _OTHER)
        text = f"{n:,} {status}" if numbers else status
        parts.append(f'<span class="badge status-{html.escape(status)}" style="background:'
                     f'{fill};border-color:{border}">{html.escape(text)}</span>')
    return "".join(parts)


def _wall_time(graph: RunGraph) -> float | None:
    """The attempt's wall time: ``graph.wall_time`` where the graph has it, else the span
    from the first step's start to the last step's end (replayed steps take no time)."""
    given = getattr(graph, "wall_time", None)
    if isinstance(given, int | float):
        return float(given)
    if not graph.nodes:
        return None
    start = min(n.started for n in graph.nodes)
    end = max(n.started + (0.0 if n.status == "replayed" else n.duration) for n in graph.nodes)
    return max(end - start, 0.0)


def _summary(graph: RunGraph) -> str:
    counts = sorted(graph.counts().items(), key=lambda sn: _status_order(sn[0]))
    total = sum(n for _, n in counts)
    parts = [f"status <b>{html.escape(graph.status)}</b>",
             f"<b>{total:,}</b> step{'s' if total != 1 else ''}"
             + (f" {_badges(counts, numbers=True)}" if counts else "")]
    wall = _wall_time(graph)
    if wall is not None:
        parts.append(f"wall time <b>{html.escape(_format_duration(wall))}</b>")
    parts.append(f"time saved by the cache and the journal <b>"
                 f"{html.escape(_format_duration(graph.time_saved))}</b>")
    return " · ".join(parts)


def _rows(layout: _Layout, *, ids: bool = True) -> list[str]:
    """The table rows of the steps, ``<tr id="row-n0" ...>`` (without ids: ``ids=False``, for
    a notebook, where several graphs share a page)."""
    def cell(value: str | None, cls: str = "code") -> str:
        return f'<td class="{cls}">{html.escape(value) if value is not None else ""}</td>'

    rows = []
    opened: dict[str, int] = {}  # a caller's row sits at its box's depth, its calls below
    for kind, node, depth in layout.walk():
        if kind == "open" and node is not None:
            opened[node.id] = depth
        if kind != "node" or node is None:
            continue
        depth = opened.get(node.id, depth)
        name = layout.names[node.id]
        indent = f' style="padding-left:{0.6 + 1.2 * depth:.1f}em"' if depth else ""
        row_id = f' id="row-{name}"' if ids else ""
        rows.append(
            f'<tr{row_id} class="step status-{html.escape(node.status)}">'
            f"<td{indent}>{html.escape(node.label)}</td>"
            f"<td>{_badges(_statuses(node), numbers=node.count > 1)}</td>"
            f'<td class="num">{node.count:,}</td>'
            f'<td class="num">{html.escape(_format_duration(node.duration))}</td>'
            f"{cell(node.inputs)}{cell(node.output)}{cell(node.error)}</tr>"
        )
    return rows


# -- drawing in the browser -------------------------------------------------------------------
@functools.cache
def _viz_js() -> str:
    """The vendored Viz.js (Graphviz compiled to WebAssembly, ``_assets/viz-global.js``) as
    one script, after its licence, that defines the global ``Viz`` even on a page with an AMD
    loader (the classic notebook's RequireJS, where its UMD header would otherwise register a
    module instead), then draws the graphs that were waiting for it (see :data:`_DRAW_JS`)."""
    assets = importlib.resources.files("durably") / "_assets"
    try:
        source = (assets / "viz-global.js").read_text(encoding="utf-8")
        licence = (assets / "LICENSE-viz-js.txt").read_text(encoding="utf-8")
    except OSError as exc:
        raise RenderError(
            f"durably's copy of Viz.js, which draws run graphs in the browser, cannot be read "
            f"({exc}): the installation is incomplete; reinstall durably (pip install "
            "--force-reinstall durably)."
        ) from exc
    # (its licence goes with every copy: a page or an output that inlines it carries it)
    return (f"/*\n{licence.replace('*/', '* /')}*/\n"
            "(function (define, exports, module) {\n" + source + "\n}).call(globalThis);\n"
            "(globalThis.__durablyViz = globalThis.__durablyViz || {waiting: []})"
            ".waiting.splice(0).forEach(function (draw) { draw(); });")


#: a function (hostId, dot, rows) that draws DOT text into an element with Viz.js once it is
#: loaded (at once, or when the script of _viz_js runs later: a notebook's outputs may run in
#: any order); on failure the element keeps its text and its note says why. Clicking a node
#: highlights the table row ``rows + name`` (the HTML report's ``row-n0``...) unless rows is
#: null.
_DRAW_JS = """(function (hostId, dot, rows) {
  "use strict";
  var shared = globalThis.__durablyViz = globalThis.__durablyViz || {waiting: []};
  function link(svg) {
    svg.querySelectorAll("g.node").forEach(function (node) {
      var title = node.querySelector("title");
      var row = title && document.getElementById(rows + title.textContent);
      if (!row) return;
      node.addEventListener("click", function (event) {
        event.preventDefault();
        document.querySelectorAll("tr.selected").forEach(function (other) {
          other.classList.remove("selected");
        });
        row.classList.add("selected");
        row.scrollIntoView({block: "nearest"});
      });
    });
  }
  function draw() {
    var host = document.getElementById(hostId);
    if (!host) return;
    shared.instance = shared.instance || globalThis.Viz.instance();
    shared.instance.then(function (viz) {
      var svg = viz.renderSVGElement(dot);
      svg.setAttribute("role", "img");
      host.replaceChildren(svg);
      if (rows !== null) link(svg);
    }).catch(function (error) {
      var note = host.querySelector(".durably-note");
      if (note) note.textContent = "The graph could not be drawn in this browser: " +
        error + ". Its steps are listed below.";
    });
  }
  if (globalThis.Viz && globalThis.Viz.instance) draw(); else shared.waiting.push(draw);
})"""


def _script_json(value: object) -> str:
    """``value`` as JSON that is safe inside an HTML ``<script>``: ``<``, ``>`` and ``&``
    (and the line separators older JavaScript rejects in strings) as ``\\uXXXX`` escapes, so
    no text (``</script>``, ``<!--``) can end the script or change how it is parsed.

    Example:
        >>> _script_json("</script><!--")
        '"\\\\u003c/script\\\\u003e\\\\u003c!--"'
    """
    text = json.dumps(value, ensure_ascii=False)
    for char in "<>&\u2028\u2029":
        text = text.replace(char, f"\\u{ord(char):04x}")
    return text


def _draw_script(host_id: str, dot_js: str, rows: str | None) -> str:
    """The script of :data:`_DRAW_JS` for one element; ``dot_js`` is a JavaScript expression
    of the DOT text."""
    return f"{_DRAW_JS}({_script_json(host_id)}, {dot_js}, {_script_json(rows)});"


_TABLE_HEAD = ("<thead><tr><th>task</th><th>status</th><th>calls</th><th>duration</th>"
               "<th>inputs</th>\n<th>output</th><th>error</th></tr></thead>")


def to_html(graph: RunGraph) -> str:
    """A self-contained HTML report of the run: a title, a summary line (status, steps by
    status, wall time, time saved by the cache and the journal), the graph and a table of the
    steps (task, status, calls, duration, inputs, output, error; one row per collapsed
    group, with its calls by status). Clicking a node of the graph highlights its row.

    The browser draws the graph from :func:`to_dot`'s text with Graphviz compiled to
    WebAssembly (Viz.js, about 1.4 MB, inlined in the page): no system program is needed to
    write or to view it, and the page loads nothing from the network, so it works offline
    and sent by mail. The DOT text is embedded as JSON (``<script type="application/json"
    id="graph-dot">``) and every text of the run is HTML-escaped: no name, input or error
    can run as script. Without JavaScript the page still shows the summary and the table.

    Args:
        graph: The run graph.

    Returns:
        The HTML document.

    Raises:
        RenderError: an edge of the graph names a node that is not in it, or durably's copy
            of Viz.js is missing (an incomplete installation).

    Example:
        >>> from durably._trace.tracer import Node, RunGraph
        >>> graph = RunGraph("r1", "etl", "finished", 1, (
        ...     Node("a" * 32, "</script> <x>", "ran", None, 0.0, 0.42),), ())
        >>> page = to_html(graph)
        >>> page.startswith("<!DOCTYPE html>"), "&lt;/script&gt; &lt;x&gt;" in page
        (True, True)
        >>> page.count("</script>") == page.count("<script")  # the name ends no script
        True
    """
    layout = _Layout(graph)
    title = html.escape(_title(graph))
    rows = "\n".join(_rows(layout))
    dot = _script_json(to_dot(graph))
    draw = _draw_script("graph", 'JSON.parse(document.getElementById("graph-dot").textContent)',
                        "row-")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="durably">
<title>{title}</title>
<style>{_CSS}</style>
</head>
<body>
<h1>{html.escape(graph.name)}</h1>
<p class="run">run {html.escape(graph.run_id)} · attempt {graph.attempt}</p>
<p class="summary" id="summary">{_summary(graph)}</p>
<div class="graph" id="graph">
<p class="note durably-note">The graph is drawn here by JavaScript (Graphviz compiled to \
WebAssembly, inside this file). If it does not appear, JavaScript is off in this browser; \
the steps are listed below.</p>
</div>
<table id="steps">
{_TABLE_HEAD}
<tbody>
{rows}
</tbody>
</table>
<script type="application/json" id="graph-dot">{dot}</script>
<script>
{_viz_js()}
</script>
<script>
{draw}
</script>
</body>
</html>
"""


# -- files and notebooks -----------------------------------------------------------------------
def save(graph: RunGraph, path: str | os.PathLike[str]) -> pathlib.Path:
    """Write the run graph to a file whose suffix says the format: ``.svg`` (drawn by the
    Graphviz ``dot`` program), ``.dot`` or ``.gv`` (DOT text), ``.mmd`` (Mermaid text) or
    ``.html`` (the report of :func:`to_html`, drawn by the browser: no system program
    needed). Text is written as UTF-8; an existing file is replaced.

    Args:
        graph: The run graph.
        path: Where to write (``str`` or path-like); its folder must exist.

    Returns:
        The path written, as a :class:`pathlib.Path`.

    Raises:
        RenderError: the suffix is not one of the above (the message lists them), or an
            ``.svg`` was asked for without Graphviz (the message says how to install it).
        OSError: the file cannot be written.

    Example:
        >>> import tempfile, pathlib
        >>> from durably._trace.tracer import Node, RunGraph
        >>> graph = RunGraph("r1", "etl", "finished", 1, (
        ...     Node("a" * 32, "load", "ran", None, 0.0, 0.42),), ())
        >>> written = save(graph, pathlib.Path(tempfile.mkdtemp()) / "run.mmd")
        >>> written.read_text(encoding="utf-8").splitlines()[3]
        'flowchart TD'
    """
    target = pathlib.Path(path)
    kind = _SUFFIXES.get(target.suffix.lower())
    if kind is None:
        raise RenderError(
            f"cannot save a run graph as {str(target)!r}: unknown suffix "
            f"{target.suffix or '(none)'!r}. Use one of {', '.join(sorted(_SUFFIXES))} "
            "(.svg: drawn by Graphviz's dot program, .dot/.gv: DOT text, .mmd: Mermaid text, "
            ".html: report drawn by the browser)."
        )
    render: dict[str, Callable[[RunGraph], str]] = {
        "dot": to_dot, "html": to_html, "mermaid": to_mermaid, "svg": to_svg,
    }
    text = render[kind](graph)
    target.write_text(text, encoding="utf-8")
    return target


#: whether this process has put Viz.js in a notebook output already (see mimebundle)
_viz_shown = False


def _notebook_html(graph: RunGraph, layout: _Layout) -> str:
    """The ``text/html`` of a run graph in a notebook without ``dot``: the graph's title, a
    note and its steps as a table (what an untrusted or reopened output shows), and the
    scripts that replace them by the drawing (Viz.js itself in the first output of the
    process; see :func:`mimebundle`)."""
    global _viz_shown
    host = f"durably-graph-{uuid.uuid4().hex}"
    library = ""
    # Colab shows each output in a frame of its own: there, every output needs the library
    if not _viz_shown or "google.colab" in sys.modules:
        library = f"<script>\n{_viz_js()}\n</script>\n"
        _viz_shown = True
    rows = "\n".join(_rows(layout, ids=False))
    return (
        f'<div class="durably-run-graph" id="{host}">\n'
        f'<p class="durably-note"><b>{html.escape(_title(graph))}</b>. This graph is drawn '
        "by a script (Graphviz compiled to WebAssembly) that did not run here: the output is "
        "not trusted, or the notebook was reopened without running its cells. Run the cell "
        "again to draw it. Its steps:</p>\n"
        f"<table>\n{_TABLE_HEAD}\n<tbody>\n{rows}\n</tbody>\n</table>\n</div>\n"
        f"{library}<script>\n{_draw_script(host, _script_json(to_dot(graph)), None)}\n"
        "</script>\n"
    )


def mimebundle(graph: RunGraph, include: Collection[str] | None = None,
               exclude: Collection[str] | None = None) -> dict[str, str]:
    """What a notebook displays for a run graph (``RunGraph._repr_mimebundle_``), with a
    plain-text summary in every case:

    - with Graphviz (the ``graphviz`` package and the ``dot`` program): the SVG
      (``image/svg+xml``), which every front end shows, trusted or not;
    - without it: HTML (``text/html``) whose script draws the graph in the browser with
      Graphviz compiled to WebAssembly (Viz.js). The first such output of the process (the
      kernel) carries Viz.js (about 1.4 MB); later ones use it from the page. Where the
      script does not run (an untrusted output; a reopened notebook whose output carrying
      Viz.js is gone) the output shows the run's title, a note saying to run the cell again
      and the table of its steps. In Google Colab, whose outputs do not share a page, every
      output carries Viz.js.

    Args:
        graph: The run graph.
        include: The MIME types to produce, as IPython passes them (``None``: all).
        exclude: MIME types not to produce (``None``: none).

    Returns:
        ``{"image/svg+xml": svg, "text/plain": summary}`` or ``{"text/html": page,
        "text/plain": summary}``, without the types ``include``/``exclude`` leave out.

    Raises:
        RenderError: an edge of the graph names a node that is not in it.

    Example:
        >>> from durably._trace.tracer import Node, RunGraph
        >>> graph = RunGraph("r1", "etl", "finished", 1, (
        ...     Node("a" * 32, "load", "ran", None, 0.0, 0.42),), ())
        >>> sorted(mimebundle(graph)) in (["image/svg+xml", "text/plain"],
        ...                               ["text/html", "text/plain"])
        True
        >>> mimebundle(graph, include=["text/plain"])
        {'text/plain': '<RunGraph etl · run r1 · finished: 1 ran>'}
    """
    def wanted(mime: str) -> bool:
        return (include is None or mime in include) and (exclude is None or mime not in exclude)

    layout = _Layout(graph)
    counts = sorted(graph.counts().items(), key=lambda sn: _status_order(sn[0]))
    bundle = {"text/plain": f"<RunGraph {_title(graph)}: {_counts_text(counts) or 'no steps'}>"}
    if wanted("image/svg+xml"):
        try:
            return {"image/svg+xml": to_svg(graph), **bundle}
        except RenderError:
            pass
    if wanted("text/html"):
        return {"text/html": _notebook_html(graph, layout), **bundle}
    return bundle
