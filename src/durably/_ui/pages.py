"""The dashboard's HTML pages, written out with every value escaped (no template engine:
the pages are few, and the live parts are drawn by ``static/app.js``)."""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Sequence
from html import escape
from typing import Any
from urllib.parse import urlencode

import durably
from durably._cli.support import _size
from durably.store import StepRecord

__all__ = ["Context", "cache_page", "failed", "history_page", "not_found", "refused", "run_page",
           "runs_page", "store_failed"]

#: characters of a question's payload shown (a 5 MB payload made a 5 MB page)
MAX_PAYLOAD = 20_000
#: keys of a large payload shown (each with its value cut to its share of MAX_PAYLOAD)
MAX_KEYS = 100
STATUSES = ("running", "crashed", "finished", "failed", "interrupted", "stopped", "forked")


@dataclasses.dataclass(frozen=True)
class Context:
    """What every page shows or needs: the store, whether actions are shown, the CSRF
    token of the forms, whether the store looks after a cache."""

    store: str
    read_only: bool
    csrf: str
    maintained: bool


def _h(value: Any) -> str:
    return escape(str(value), quote=True)


def _when(t: float | None) -> str:
    if t is None:
        return ""
    return datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def _seconds(s: float | None) -> str:
    if s is None:
        return ""
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 120:
        return f"{s:.2f} s"
    return f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"


def _rate(rate: float | None) -> str:
    return "" if rate is None else f"{rate * 100:.0f} %"


def _layout(ctx: Context, title: str, body: str, script: bool = True) -> str:
    mode = '<span class="badge ro">read-only</span>' if ctx.read_only else ""
    cache = '<a href="/cache">Cache</a>' if ctx.maintained else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_h(title)} · durably</title>
<link rel="stylesheet" href="/static/style.css"><link rel="icon" href="data:,"></head>
<body data-read-only="{'1' if ctx.read_only else ''}">
<header><a class="brand" href="/">durably</a><nav><a href="/">Runs</a>{cache}</nav>
<span class="store" title="the store">{_h(ctx.store)}</span>{mode}</header>
<main>{body}</main>
{'<script src="/static/app.js"></script>' if script else ''}
</body></html>
"""


def _csrf(ctx: Context) -> str:
    return f'<input type="hidden" name="csrf" value="{_h(ctx.csrf)}">'


def _notice(notice: str | None) -> str:
    return f'<p class="notice">{_h(notice)}</p>' if notice else ""


def refused(base: str) -> str:
    """The page of a request without the dashboard's token; ``base``: the dashboard's
    address as the request reached it (``http://host:port``)."""
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8">
<title>durably: token needed</title></head><body>
<h1>This dashboard needs its token</h1>
<p>Open the address <code>durably ui</code> printed when it started
(<code>{_h(base)}/?token=...</code>).</p></body></html>
"""


def not_found(ctx: Context, run_id: str) -> str:
    """The page of a run id the store does not hold."""
    return _layout(ctx, "not found", f"<h1>No run {_h(run_id)!s}</h1><p>The store holds no "
                   f'run with this id (deleted?). <a href="/">All runs</a></p>', script=False)


def store_failed(ctx: Context, message: str) -> str:
    """The page of a store that could not be read (a corrupt journal, say): its message,
    which says how to fix it."""
    return _layout(ctx, "store error", '<h1>The store could not be read</h1>'
                   f'<p class="error">{_h(message)}</p><p><a href="/">All runs</a></p>',
                   script=False)


def failed(ctx: Context, message: str, back: str = "/") -> str:
    """The page of an action the store refused, with why; ``back``: the dashboard's page
    the action came from (a path)."""
    return _layout(ctx, "not done", f'<h1>Not done</h1><p class="error">{_h(message)}</p>'
                   f'<p><a href="{_h(back)}">Back</a></p>', script=False)


def runs_page(ctx: Context, shown: int = 1_000, waiting: str | None = None) -> str:
    """The runs table: drawn and kept up to date by app.js from the stream of runs (the
    newest ``shown``; the older ones a page of ``shown`` at a time, ``?before=T``).
    ``waiting``: the directory of a store not made yet, where runs will appear."""
    wait = "" if waiting is None else (
        f'<p id="waiting" class="notice">No run was made in <code>{_h(waiting)}</code> yet: '
        "runs appear here, live, as soon as one is (for example "
        f"<code>DURABLY_DIR={_h(waiting)} python job.py</code>, or a script that stores "
        "there). Nothing is created here until then.</p>")
    statuses = "".join(f'<option value="{s}">{s}</option>' for s in STATUSES)
    body = f"""<h1>Runs</h1>
<form id="filters" class="filters">
<label>Entrypoint <select name="entrypoint"><option value="">all</option></select></label>
<label>Status <select name="status"><option value="">all</option>{statuses}</select></label>
<label>Started <select name="since"><option value="">any time</option>
<option value="3600">in the last hour</option><option value="86400">in the last day</option>
<option value="604800">in the last week</option></select></label>
<span id="live" class="live">connecting…</span></form>
<p id="store-error" class="error" hidden></p>{wait}
<p id="more" class="hint" hidden></p>
<table id="runs" class="runs" data-shown="{shown}"><thead><tr><th>Run</th><th>Entrypoint</th>
<th>Status</th>
<th>Started</th><th class="n">Duration</th><th class="n">Ran</th><th class="n">Cached</th>
<th class="n">Replayed</th><th class="n">Failed</th><th class="n">Time saved</th></tr></thead>
<tbody></tbody></table>
<p id="empty" class="empty" hidden>No runs match.</p>"""
    return _layout(ctx, "Runs", body)


def _interrupts(ctx: Context, run: durably.Run[Any], pending: list[dict[str, Any]],
                status: str) -> str:
    resume = f"durably resume {run.id}"
    if status != "interrupted":
        return ""
    if not pending:
        return (f'<section class="steer"><h2>Answered</h2><p>Every question of this run is '
                f"answered. The run continues when it is next resumed: run "
                f"<code>{_h(resume)}</code> where its code is (or call "
                f"<code>{_h(run.name)}.resume({_h(repr(run.id))})</code> from the app)."
                "</p></section>")
    several = len(pending) > 1
    items = []
    for p in pending:
        field = ("" if ctx.read_only else
                 f'<label>Answer (JSON{", or empty to answer later" if several else ""}) '
                 f'<textarea name="answer:{_h(p["id"])}" rows="2"'
                 f'{"" if several else " required"} placeholder="&quot;yes&quot;"></textarea>'
                 "</label>")
        items.append(f'<div class="interrupt"><div class="meta">interrupt <code>'
                     f'{_h(p["id"])}</code> of <b>{_h(p["task"])}</b></div>'
                     f'{_payload(p["payload"])}{field}</div>')
    form = ("".join(items) if ctx.read_only else
            f'<form method="post" action="/runs/{_h(run.id)}/answer" class="answer">'
            f'{_csrf(ctx)}{"".join(items)}<button type="submit">Answer</button></form>')
    value = "'{" + ", ".join(f'"{p["id"]}": JSON' for p in pending[:3]) + (
        ", ..." if len(pending) > 3 else "") + "}'" if several else "JSON"
    command = f"<code>{_h(resume)} --value {_h(value)}</code>"
    if ctx.read_only:
        hint = (f"This dashboard is read-only: answer with {command} where the run's code is "
                + ("(the questions left out of the JSON stay pending)." if several else
                   "(it journals the answer and continues the run)."))
    else:
        hint = ((f"The answers are journaled as {command} journals them (the questions "
                 "left empty stay pending)" if several else
                 f"The answer is journaled as {command} journals it")
                + f"; the run continues when it is next resumed (<code>{_h(resume)}</code>).")
    return (f'<section class="steer"><h2>Waiting for {len(pending)} answer(s)</h2>{form}'
            f'<p class="hint">{hint}</p></section>')


def _payload(payload: Any) -> str:
    """A question's payload: pretty-printed JSON when that is at most :data:`MAX_PAYLOAD`
    characters; else compact, a dict's keys one a line with each value cut on its own (a
    huge value never hides the keys after it), anything else cut at its end."""
    text = _json(payload, indent=2)
    if len(text) <= MAX_PAYLOAD:
        return f'<pre class="payload">{_h(text)}</pre>'
    if isinstance(payload, dict) and payload:
        keys = list(payload)[:MAX_KEYS]
        each = max(200, MAX_PAYLOAD // len(keys))
        lines = [f"  {_json(str(k))}: {_cut(_json(payload[k]), each)}" for k in keys]
        if len(payload) > len(keys):
            lines.append(f"  … ({len(payload) - len(keys):,} more keys, not shown)")
        text = "{\n" + ",\n".join(lines) + "\n}"
    else:
        text = _cut(_json(payload), MAX_PAYLOAD)
    return f'<pre class="payload">{_h(text)}</pre>'


def _json(value: Any, indent: int | None = None) -> str:
    """``value`` as JSON (``repr`` for what JSON cannot write), compact unless ``indent``."""
    return json.dumps(value, indent=indent, default=repr, ensure_ascii=False,
                      separators=None if indent else (", ", ": "))


def _cut(text: str, limit: int) -> str:
    """``text`` cut after ``limit`` characters, saying how many more there were."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]} … ({len(text) - limit:,} more characters, not shown)"


def _steps(run: durably.Run[Any], rows: Sequence[StepRecord], matching: int, page: int,
           size: int, task: str | None, status: str | None, tasks: list[str],
           next_after: int | None = None) -> str:
    pages = max(1, -(-matching // size))

    def link(n: int, text: str, after: int | None = None) -> str:
        query = urlencode({k: v for k, v in (("page", n), ("task", task or ""),
                                             ("status", status or ""),
                                             ("after", "" if after is None else str(after))) if v})
        return f'<a href="/runs/{_h(run.id)}?{_h(query)}#steps">{text}</a>'

    # (the next page of an unfiltered table starts after the last call shown: read alone)
    more = page + 1 < pages if next_after is None else True
    nav = (f'<span class="pager">{link(page, "‹ previous") if page else ""} page {page + 1:,} '
           f'of {max(pages, page + 1 + more):,} '
           f'{link(page + 2, "next ›", next_after) if more else ""}</span>')
    task_options = "".join(f'<option{" selected" if t == task else ""}>{_h(t)}</option>'
                           for t in tasks[:500])
    status_options = "".join(f'<option{" selected" if s == status else ""}>{s}</option>'
                             for s in ("ran", "cached", "replayed", "failed", "interrupted"))
    body = "".join(
        f'<tr><td class="n">{s.position:,}</td><td>{_h(s.task)}</td>'
        f'<td><span class="badge {_h(s.status)}">{_h(s.status)}</span></td>'
        f'<td>{_when(s.started)}</td><td class="n">{_seconds(s.duration)}</td>'
        f'<td class="repr">{_h(s.inputs or "")}</td>'
        f'<td class="repr">{_h(s.output or s.error or "")}</td></tr>' for s in rows)
    return f"""<section id="steps"><h2>Steps <small>{matching:,}</small></h2>
<form class="filters" method="get" action="/runs/{_h(run.id)}#steps">
<label>Task <select name="task"><option value="">all</option>{task_options}</select></label>
<label>Status <select name="status"><option value="">all</option>{status_options}</select>
</label><button type="submit">Filter</button>{nav}</form>
<table class="steps"><thead><tr><th class="n">#</th><th>Task</th><th>Status</th>
<th>Started</th><th class="n">Duration</th><th>Inputs</th><th>Output or error</th></tr></thead>
<tbody>{body}</tbody></table></section>"""


def _history(ctx: Context, run: durably.Run[Any],
             history: Sequence[durably.Checkpoint] | None, limit: int = 200,
             page: int | None = None) -> str:
    """The history section: the first ``limit`` checkpoints, or (``page``: 0-based, on the
    history's own page) that page of ``limit`` checkpoints, with links to the others."""
    if history is None:
        return (f'<section id="history"><h2>History</h2><p><a href="/runs/{_h(run.id)}/history">'
                "Open the history</a> (a big run's: it takes a few seconds to read) to fork "
                "from a checkpoint.</p></section>")
    if not history:
        return ""
    rows = []
    nav = ""
    start = 0
    if page is not None:
        pages = max(1, -(-len(history) // limit))
        page = min(max(page, 0), pages - 1)
        start = page * limit

        def link(n: int, text: str) -> str:
            return f'<a href="/runs/{_h(run.id)}/history?page={n}">{text}</a>'

        nav = (f'<p class="pager">{link(page, "‹ previous") if page else ""} page '
               f"{page + 1:,} of {pages:,} "
               f'{link(page + 2, "next ›") if page + 1 < pages else ""}</p>')
    for cp in history[start:start + limit]:
        if ctx.read_only:
            fork = (f'<code class="command">'
                    f"{_h(f'durably fork {run.id} --at {cp.id[:12]}')}</code>")
        else:
            fork = (f'<form method="post" action="/runs/{_h(run.id)}/fork">{_csrf(ctx)}'
                    f'<input type="hidden" name="at" value="{_h(cp.id)}">'
                    '<button type="submit">Fork</button></form>')
        rows.append(f"<tr><td><code>{_h(cp.id[:12])}</code></td><td>{_h(cp.kind)}</td>"
                    f"<td>{_h(cp.task)}</td><td>{_when(cp.time)}</td>"
                    f'<td class="repr">{_h(cp.state or "")}</td><td>{fork}</td></tr>')
    hint = ("run its command where the code is: the dashboard never runs your code."
            if ctx.read_only else "Fork makes the new run; it executes when you run "
            "<code>durably resume FORK</code> where the code is (the dashboard never runs "
            "your code).")
    return (f'<section id="history"><h2>History <small>{len(history):,} checkpoints, newest '
            'first</small></h2><p class="hint">To fork the run from a checkpoint (a new run '
            "that replays this one up to there and executes the rest with today's code), "
            f"{hint}</p>{nav}"
            '<table class="steps"><thead><tr><th>Checkpoint</th><th>Kind</th><th>Task</th>'
            "<th>Time</th><th>State</th><th>Fork from here</th></tr></thead><tbody>"
            f'{"".join(rows)}</tbody></table></section>')


def run_page(ctx: Context, run: durably.Run[Any], counts: dict[str, int], saved: float | None,
             rows: Sequence[StepRecord], matching: int, page: int, size: int,
             task: str | None, status: str | None, pending: list[dict[str, Any]],
             errors: list[dict[str, Any]], events: list[dict[str, Any]],
             history: Sequence[durably.Checkpoint] | None, tasks: list[str],
             notice: str | None = None, next_after: int | None = None,
             layout_seconds: float = 20, saved_by_cache: float = 0.0,
             result: Any = None) -> str:
    """The page of one run: its summary, result, questions, graph, steps, errors, events,
    history and actions. ``saved``: seconds the attempt saved
    (:meth:`durably.Run.time_saved`), of which ``saved_by_cache`` by the cache; None: not
    computed yet (a big run's, filled in by the page's script from the runs' rows).
    ``result``: a finished run's result (loaded without importing anything)."""
    state = run.status
    total = sum(counts.values())
    facts = "".join(f"<div><dt>{k}</dt><dd>{v}</dd></div>" for k, v in (
        ("entrypoint", f"<code>{_h(run.entrypoint)}</code>"),
        ("attempt", f"{run.attempt:,}"), ("started", _when(run.created)),
        ("updated", _when(run.updated)),
        ("steps", f'<span id="steps-total">{total:,}</span> — ' + ", ".join(
            f'<span id="steps-{k}">{counts.get(k, 0):,}</span> {k}'
            for k in ("ran", "cached", "replayed", "failed", "interrupted")
            if k != "interrupted" or counts.get(k))),
        ("time saved", _saved(run, saved, saved_by_cache))))
    error = _run_error(run.error) if run.error else ""
    if state == "finished":
        error += (f'<section id="result"><h2>Result</h2>{_payload(result)}</section>')
    failures = "".join(
        f'<details class="failure"><summary><b>{_h(e["task"])}</b> (attempt {e["attempt"]}, '
        f'{_when(e["time"])}): {_h(e["error"])}</summary><pre>{_h(e["traceback"])}</pre>'
        "</details>" for e in errors[:100])
    failures = (f'<section id="errors"><h2>Errors <small>{len(errors):,}</small></h2>'
                f"{failures}</section>" if errors else "")
    custom = "".join(f"<tr><td>{_when(e['time'])}</td><td>{e['attempt']}</td>"
                     f'<td class="repr">{_h(e["value"])}</td></tr>' for e in events[-200:])
    custom = (f'<section id="events"><h2>Custom events <small>{len(events):,}</small></h2>'
              '<table class="steps"><thead><tr><th>Time</th><th>Attempt</th><th>Value</th>'
              f"</tr></thead><tbody>{custom}</tbody></table></section>" if events else "")
    actions = "" if ctx.read_only else (
        f'<section id="actions"><h2>Delete</h2><form method="post" '
        f'action="/runs/{_h(run.id)}/delete" class="danger">{_csrf(ctx)}<label>Type the run '
        f'id to confirm <input name="confirm" autocomplete="off" placeholder="{_h(run.id)}">'
        '</label><button type="submit">Delete this run and its journal</button></form>'
        '<p class="hint">The cache is kept: its steps still serve later calls.</p></section>')
    forked = ('<p class="notice">This run is a fork that was not executed yet: it executes '
              f"when you run <code>{_h(f'durably resume {run.id}')}</code> where its code is "
              "(its finished steps before the checkpoint are replayed, the rest executed)."
              "</p>" if state == "forked" else "")
    body = f"""{_notice(notice)}<div class="title" id="run" data-run="{_h(run.id)}"
data-status="{_h(state)}"><h1>{_h(run.name)} <code>{_h(run.id)}</code></h1>
<span id="status"><span class="badge {_h(state)}">{_h(state)}</span></span></div>
<dl class="facts">{facts}</dl>{error}{forked}
{_interrupts(ctx, run, pending, state)}
<section id="graph-section"><h2>Graph</h2><div id="graph" class="graph"
data-run="{_h(run.id)}" data-layout-seconds="{layout_seconds:g}">drawing…</div></section>
{_steps(run, rows, matching, page, size, task, status, tasks, next_after)}
{failures}{custom}{_history(ctx, run, history)}{actions}"""
    return _layout(ctx, f"{run.name} {run.id}", body)


def _run_error(error: str) -> str:
    """A run's error: on one line when short, else its first line (cut at a word) with the
    whole text (up to :data:`MAX_PAYLOAD` characters) folded under it."""
    first = error.strip().splitlines()[0] if error.strip() else error
    if len(error) <= 200 and "\n" not in error.strip():
        return f'<p class="error">{_h(error)}</p>'
    if len(first) > 160:
        first = first[:160].rsplit(" ", 1)[0] + " …"
    return (f'<details class="error run-error"><summary>{_h(first)}</summary>'
            f"<pre>{_h(_cut(error, MAX_PAYLOAD))}</pre></details>")


def _saved(run: durably.Run[Any], saved: float | None, by_cache: float) -> str:
    """The run page's time saved: the figure, or a placeholder its script fills in."""
    if saved is None:
        later = "when the run ends" if run.status == "running" else "computing…"
        return f'<span id="time-saved" data-pending="1">{later}</span>'
    return (f'<span id="time-saved">{_seconds(saved) or "0 s"}'
            + (f" ({_seconds(by_cache)} by the cache)" if by_cache > 0 else "") + "</span>")


def history_page(ctx: Context, run: durably.Run[Any],
                 history: Sequence[durably.Checkpoint], page: int = 0, size: int = 500
                 ) -> str:
    """The checkpoints of a run (newest first), a page (0-based; past the last: the last)
    of ``size`` at a time, each with its Fork button (in read-only mode: its fork
    command)."""
    body = (f'<h1>{_h(run.name)} <code><a href="/runs/{_h(run.id)}">{_h(run.id)}</a></code>'
            f"</h1>{_history(ctx, run, history, limit=size, page=page)}")
    return _layout(ctx, f"history of {run.id}", body)


def _cache_size(stats: dict[str, Any]) -> str:
    """The cache's size: its entries' bytes (what the tasks' Bytes add up to, and what a
    prune says it removed), and the bytes its files take where that is more."""
    entries = stats.get("entry_bytes", stats["bytes"])
    disk = stats["bytes"]
    return (f'<span title="{entries:,} bytes">{_size(entries)}</span>'
            + (f' (<span title="{disk:,} bytes">{_size(disk)}</span> of files)'
               if disk != entries else ""))


def cache_page(ctx: Context, stats: dict[str, Any] | None, notice: str | None) -> str:
    """Cache statistics by task, and the prune form."""
    if stats is None:
        return _layout(ctx, "Cache", "<h1>Cache</h1><p>This store does not look after a cache "
                       "(capability \"maintenance\").</p>", script=False)
    rate = stats.get("hit_rate")
    rows = "".join(
        f"<tr><td>{_h(t['task'])}</td><td class=\"n\">{t['entries']:,}</td>"
        f"<td class=\"n\" title=\"{t['bytes']:,} bytes\">{_size(t['bytes'])}</td>"
        f"<td class=\"n\">{t['ran']:,}</td>"
        f"<td class=\"n\">{t['cached']:,}</td><td class=\"n\">{_rate(t['hit_rate'])}</td></tr>"
        for t in stats.get("tasks", []))
    prune = "" if ctx.read_only else f"""<section><h2>Prune</h2>
<form method="post" action="/cache/prune" class="danger">{_csrf(ctx)}
<label>Older than <input name="older_than" placeholder="30d"></label>
<label>Max size <input name="max_size" placeholder="5GB"></label>
<label>Task <input name="task" placeholder="all tasks"></label>
<label><input type="checkbox" name="confirm" value="yes"> remove these entries</label>
<button type="submit">Prune the cache</button></form>
<p class="hint">Journals are kept: runs still replay their finished steps.</p></section>"""
    body = f"""{_notice(notice)}<h1>Cache</h1><dl class="facts">
<div><dt>entries</dt><dd>{stats['entries']:,}</dd></div>
<div><dt>size</dt><dd>{_cache_size(stats)}</dd></div>
<div><dt>hit rate</dt><dd>{_rate(rate)}
({stats['cached']:,} cached, {stats['ran']:,} ran, {stats['runs']:,} runs)</dd></div></dl>
<table class="steps"><thead><tr><th>Task</th><th class="n">Entries</th><th class="n">Size</th>
<th class="n">Ran</th><th class="n">Cached</th><th class="n">Hit rate</th></tr></thead>
<tbody>{rows}</tbody></table>{prune}"""
    return _layout(ctx, "Cache", body, script=False)
