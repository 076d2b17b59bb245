"""A run graph: who called whom and which result flowed into which call, drawn from the
run's journal as SVG (Graphviz), as a self-contained HTML report, and as Mermaid text.

    python examples/07_run_graph.py       # writes run_graph.svg, run_graph.html, run_graph.mmd

Open ``run_graph.html`` in a browser: the graph, then a table of the steps with their
status, duration, inputs and outputs. The same graph displays itself inline in Jupyter
(``run.graph()`` as the last expression of a cell), and ``durably graph RUN -o run.svg``
draws it from the command line. Only the SVG file needs Graphviz (``pip install
'durably[graph]'`` and the ``dot`` program): the browser draws the HTML report's graph itself.
"""

from __future__ import annotations

import time

import durably


@durably.task
def load(source: str) -> list[int]:
    time.sleep(0.05)
    return [ord(c) % 17 + i for i, c in enumerate(source)]


@durably.task
def normalize(values: list[int]) -> list[float]:
    top = max(values)
    return [v / top for v in values]


@durably.task
def score(values: list[float], weight: float) -> float:
    return round(weight * sum(values), 3)


@durably.task
def report(scores: list[float]) -> str:
    best = max(scores)
    return f"best score {best} of {len(scores)}"


@durably.task
def evaluate(source: str) -> list[float]:
    # tasks called inside a task are nested in its box in the drawing
    values = normalize(load(source))
    return [score(values, w) for w in (0.5, 1.0, 2.0)]


@durably.entrypoint
def pipeline(sources: list[str]) -> str:
    scores = [s for source in sources for s in evaluate(source)]
    return report(scores)


if __name__ == "__main__":
    run = pipeline.run(["alpha", "beta"])
    print("result:", run.result)
    # built from the journal: works for any run, from any process. A rerun replays the two
    # evaluate steps whole (their nested steps are not called again), so draw the attempt
    # that executed the steps (attempt 1) to see everything
    graph = run.graph(attempt=1)
    print(f"graph: {len(graph.nodes)} nodes, {len(graph.edges)} data-flow edges, "
          f"steps by status {graph.counts()}")
    print(graph.to_mermaid())
    for name in ("run_graph.mmd", "run_graph.html", "run_graph.svg"):
        try:
            print("wrote", graph.save(name))
        except durably.RenderError as exc:  # no Graphviz: Mermaid and HTML still work
            print(f"skipped {name}: {exc}")
