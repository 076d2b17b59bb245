"""The dashboard's web app (Starlette): pages, a JSON API, a stream of run changes
(server-sent events), the actions (answer, delete, prune) and the guard in front of
them all (the token, the cross-site checks, read-only mode)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
import secrets
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from importlib import resources
from typing import Any, overload
from urllib.parse import parse_qsl, urlencode, urlsplit

import anyio.to_thread
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import durably
from durably import render
from durably._runtime.history import NO_UPDATE, checkpoints, history_page, make_fork
from durably._runtime.interrupt import refuse_no_answer
from durably._store.urls import redact
from durably._ui import pages, queries
from durably.exceptions import DefinitionError, DurablyError, RunStateError
from durably.store import Store

__all__ = ["create_app", "is_local", "new_token"]

#: runs in the runs table (the newest; the older ones on pages of their own)
RUNS_SHOWN = 1_000
#: steps per page of a run's step table
PAGE_SIZE = 100
#: a run with more steps than this has its history on a page of its own (reading it takes
#: about 2.7 s of CPU for 100,000 steps)
INLINE_HISTORY = 2_000
#: a run whose latest attempt has more steps than this, some of them cached or replayed,
#: has its time saved computed apart from its page (it needs the whole journal: about 1.5 s
#: of CPU for 100,000 steps), and shown by the page once the runs' rows carry it
INLINE_SAVED = 10_000
#: checkpoints per page of a run's history
HISTORY_PAGE = 500
#: a graph with more nodes than this is not drawn (the browser would take minutes)
MAX_DRAWN = 2_000
#: seconds the browser lays a graph out before it gives up (its worker ended, the tab
#: never frozen), saying so with a way back to the collapsed graph
LAYOUT_SECONDS = 20
_STATIC = {"app.js": "application/javascript", "graph-worker.js": "application/javascript",
           "style.css": "text/css"}


_LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}

#: the policy of every page: only the dashboard's own scripts, styles, worker and
#: WebAssembly (Viz.js compiles Graphviz: ``'wasm-unsafe-eval'``, which allows compiling
#: WebAssembly and nothing else), no inline script, no plug-in, no form posted elsewhere,
#: and never shown in a frame (another page could lure a click on an action: clickjacking)
CSP = ("default-src 'self'; script-src 'self' 'wasm-unsafe-eval'; worker-src 'self'; "
       "style-src 'self'; img-src 'self' data:; connect-src 'self'; object-src 'none'; "
       "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
#: headers of every response, the refusals included
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),  # (frame-ancestors' predecessor, for older browsers)
    (b"x-content-type-options", b"nosniff"),
    # (no Referer to other sites; same-origin, not no-referrer: under no-referrer a browser
    # sends "Origin: null" with a form's POST, and the guard checks the Origin)
    (b"referrer-policy", b"same-origin"),
]


def is_local(host: str) -> bool:
    """Whether ``host`` (a name or address, an IPv6 one with or without brackets) is a
    loopback address or name: only this machine can connect to it."""
    if host.lower() in _LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class _NoStoreYet(Exception):
    """The dashboard waits for its store: no run was made there yet."""


class _State:
    def __init__(self, store: Store | None, token: str, read_only: bool, poll: float,
                 stopping: Callable[[], bool] = lambda: False, local_only: bool = True,
                 open_store: Callable[[], Store | None] | None = None, where: str = ""
                 ) -> None:
        self._store = store
        self._open_store = open_store
        self.where = where
        self.local_only = local_only
        self.stopping = stopping
        self.token = token
        self.read_only = read_only
        self.poll = poll
        self.csrf = hmac.new(token.encode(), b"durably-ui csrf", hashlib.sha256).hexdigest()
        self._steps: queries.StepsCache | None = None
        self._watch: queries.RunsWatch | None = None
        self.graphs: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._lock = threading.Lock()

    def ready(self) -> bool:
        """Whether the store is there (a store still to be made: looked for again)."""
        if self._store is None and self._open_store is not None:
            with self._lock:
                if self._store is None:
                    self._store = self._open_store()
        return self._store is not None

    @property
    def store(self) -> Store:
        if not self.ready():
            raise _NoStoreYet(self.where)
        assert self._store is not None
        return self._store

    @property
    def steps(self) -> queries.StepsCache:
        if self._steps is None:
            self._steps = queries.StepsCache(self.store)
        return self._steps

    @property
    def watch(self) -> queries.RunsWatch:
        if self._watch is None:
            self._watch = queries.RunsWatch(self.store, self.steps, RUNS_SHOWN)
        return self._watch


def create_app(store: Store | None, token: str, *, read_only: bool = False,
               poll: float = 0.5, stopping: Callable[[], bool] = lambda: False,
               local_only: bool = True, open_store: Callable[[], Store | None] | None = None,
               where: str = "") -> ASGIApp:
    """The dashboard for ``store`` as an ASGI app: every request needs ``token`` (as
    ``?token=`` once, which sets a cookie, or the header ``X-Durably-Token``); with
    ``read_only`` every action is hidden and refused. ``poll``: seconds between two looks at
    the store for changed runs, for the live pages. ``stopping``: whether the server is
    stopping (the live pages' streams then end, so that it stops without cancelling them).
    ``local_only``: a request whose Host is not a loopback name or address is refused (a
    page of another site whose name was pointed at this machine, DNS rebinding, cannot
    read it); False for a dashboard served on a non-local address. ``store`` None: no
    store was made yet at ``where`` (a directory); ``open_store`` opens it once it is there
    (else None), looked for at each request: until then the pages show no run and say where
    runs will appear.
    """
    state = _State(store, token, read_only, poll, stopping, local_only, open_store, where)

    def bound(handler: Callable[[Request, _State], Awaitable[Response]]
              ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            return await handler(request, state)
        return endpoint

    routes = [
        Route("/", bound(_runs_page)),
        Route("/runs/{run_id}", bound(_run_page)),
        Route("/runs/{run_id}/history", bound(_history_page)),
        Route("/cache", bound(_cache_page)),
        Route("/api/runs", bound(_api_runs)),
        Route("/api/stream", bound(_api_stream)),
        Route("/api/runs/{run_id}/graph", bound(_api_graph)),
        Route("/runs/{run_id}/answer", bound(_answer), methods=["POST"]),
        Route("/runs/{run_id}/delete", bound(_delete), methods=["POST"]),
        Route("/runs/{run_id}/fork", bound(_fork), methods=["POST"]),
        Route("/cache/prune", bound(_prune), methods=["POST"]),
        Route("/static/{name}", _static),
    ]
    async def store_failed(request: Request, exc: Exception) -> Response:
        # a store that cannot be read (a corrupt journal, a lost connection): its message
        # and fix, on the page, rather than a bare error 500
        message = str(exc)
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": message}, status_code=500)
        return HTMLResponse(pages.store_failed(_context(state), message), status_code=500)

    async def no_store_yet(request: Request, exc: Exception) -> Response:
        message = (f"no durably store at {state.where} yet: no run was made there. Runs "
                   "appear on the runs page once one is.")
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": message}, status_code=404)
        return HTMLResponse(pages.failed(_context(state), message), status_code=404)

    return _Guard(Starlette(routes=routes, exception_handlers={
        DurablyError: store_failed, _NoStoreYet: no_store_yet}), state)


# -- the guard ---------------------------------------------------------------------------------
class _Guard:
    """Every request carries the token (query, cookie or header); a POST comes from the
    dashboard's own pages (its Origin, else Referer, is the Host) and is refused in
    read-only mode. The CSRF token of the forms is checked by each action."""

    def __init__(self, app: ASGIApp, state: _State) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name.lower() for name, _ in message.get("headers", [])}
                message = {**message, "headers": [*message.get("headers", []), *(
                    (name, value) for name, value in SECURITY_HEADERS if name not in names)]}
            await send(message)

        request = Request(scope)
        refused = self._refused(request)
        if refused is not None:
            await refused(scope, receive, secured)
            return
        await self.app(scope, receive, secured)

    def _cookie(self, request: Request) -> str:
        port = request.url.port or (443 if request.url.scheme == "https" else 80)
        return f"durably_ui_{port}"  # (cookies are shared across ports: one per dashboard)

    def _refused(self, request: Request) -> Response | None:
        if self.state.local_only:
            host = urlsplit("//" + request.headers.get("host", "")).hostname or ""
            if not is_local(host):
                return PlainTextResponse(
                    f"refused: this dashboard answers to this machine's names only "
                    f"(localhost, 127.0.0.1, [::1]), not to Host {host!r}. Fix: open the "
                    "address durably ui printed; to serve other machines, start it with "
                    "--host and a non-local address.", status_code=403)
        token = self.state.token
        given = request.query_params.get("token")
        if given is not None and _same(given, token):
            if request.method == "GET":  # once: a cookie from now on, and a URL without it
                query = urlencode([(k, v) for k, v in request.query_params.multi_items()
                                   if k != "token"])
                response = RedirectResponse(request.url.path + (f"?{query}" if query else ""),
                                            status_code=303)
                response.set_cookie(self._cookie(request), token, httponly=True,
                                    samesite="strict", path="/")
                return response
        elif not any(_same(candidate, token) for candidate in (
                request.cookies.get(self._cookie(request), ""),
                request.headers.get("x-durably-token", "")) if candidate):
            base = f"{request.url.scheme}://{request.url.netloc}"
            return HTMLResponse(pages.refused(base), status_code=403)
        if request.method not in ("GET", "HEAD"):
            if self.state.read_only:
                return PlainTextResponse("this dashboard is read-only (durably ui "
                                         "--read-only): it takes no action", status_code=403)
            source = request.headers.get("origin") or request.headers.get("referer") or ""
            if urlsplit(source).netloc != request.headers.get("host", ""):
                return PlainTextResponse("refused: this action did not come from the "
                                         "dashboard's own page (its Origin is not this "
                                         "server)", status_code=403)
        return None


def _same(given: str, secret: str) -> bool:
    """Whether ``given`` is ``secret``, compared in constant time (as UTF-8: a token with
    other characters is simply wrong)."""
    return hmac.compare_digest(given.encode("utf-8", "replace"), secret.encode())


async def _form(request: Request, state: _State) -> dict[str, str]:
    """The form of an action, whose CSRF token is checked."""
    # (URL-encoded, as the pages send them: parsed here, without python-multipart)
    if request.headers.get("content-type", "").split(";")[0].strip() != \
            "application/x-www-form-urlencoded":
        raise _Refused("refused: an action takes a form (application/x-www-form-urlencoded)")
    body = await request.body()
    if len(body) > 1_000_000:
        raise _Refused("refused: the form is larger than 1 MB")
    fields = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
    if not _same(fields.get("csrf", ""), state.csrf):
        raise _Refused("refused: the form's CSRF token is missing or wrong (reload the page)")
    return fields


class _Refused(Exception):
    pass


def _blocking(func: Callable[..., Any], *args: Any) -> Awaitable[Any]:
    return anyio.to_thread.run_sync(func, *args)


# -- pages -------------------------------------------------------------------------------------
def _context(state: _State) -> pages.Context:
    if not state.ready():
        return pages.Context(store=state.where, read_only=state.read_only, csrf=state.csrf,
                             maintained=False)
    store = state.store  # (a directory: absolute, as it is once the store was used)
    where = (str(store.path.absolute()) if isinstance(store, durably.DiskStore)
             else redact(store.where))
    return pages.Context(store=where,
                         read_only=state.read_only, csrf=state.csrf,
                         maintained="maintenance" in state.store.capabilities)


async def _runs_page(request: Request, state: _State) -> Response:
    ready = await _blocking(state.ready)
    return HTMLResponse(pages.runs_page(_context(state), RUNS_SHOWN,
                                        waiting=None if ready else state.where))


def _page_number(request: Request) -> int:
    """The page a request asks for (``?page=N``, from 1), counted from 0: the first for a
    missing or unreadable one."""
    try:
        return max(0, int(request.query_params.get("page", "1")) - 1)
    except ValueError:
        return 0


async def _run_page(request: Request, state: _State) -> Response:
    run_id = request.path_params["run_id"]
    page = _page_number(request)
    try:
        after: int | None = int(request.query_params["after"])
    except (KeyError, ValueError):
        after = None
    task = request.query_params.get("task") or None
    status = request.query_params.get("status") or None

    def read() -> str | None:
        nonlocal page
        try:
            run = durably.get_run(run_id, store=state.store)
        except durably.NotFoundError:
            return None
        # an unfiltered table: counted by one aggregate query, and the first page, or the
        # one after a position, read alone, so a 100,000-step run opens without reading its
        # journal whole (its time saved, when that needs it, comes with the runs' rows). A
        # filter, or a page asked for by its number: the journal read once, kept while the
        # run is unchanged
        next_after: int | None = None
        saved: float | None
        if not (task or status or (page and after is None)):
            counts, tasks, total = queries.step_counts(state.store, run)
            rows, next_after = queries.steps_after(
                state.store, run, -1 if after is None else after, PAGE_SIZE)
            matching = total
            saved, by_cache = _time_saved(state, run, counts, total)
        else:
            found = state.steps.of(run)
            rows, matching = queries.step_page(found["steps"], page, PAGE_SIZE, task, status)
            if not rows and page:  # (a page past the last: the last)
                page = max(0, -(-matching // PAGE_SIZE) - 1)
                rows, matching = queries.step_page(found["steps"], page, PAGE_SIZE, task,
                                                   status)
            counts, saved, total = found["counts"], found["saved"], len(found["steps"])
            by_cache = found["saved_by_cache"]
            tasks = sorted({s.task for s in found["steps"]})
        rows = queries.with_origins(state.store, run, rows)
        history: list[durably.Checkpoint] | None = None  # (a big run's: on its own page)
        if total <= INLINE_HISTORY:
            history = _history_of(state.store, run)
        return pages.run_page(
            _context(state), run, counts, saved, rows, matching, page,
            PAGE_SIZE, task, status, queries.pending_of(state.store, run),
            queries.errors_of(state.store, run), queries.events_of(state.store, run),
            history, tasks, notice=request.query_params.get("notice"),
            next_after=next_after, layout_seconds=LAYOUT_SECONDS,
            saved_by_cache=by_cache, result=(queries.result_of(state.store, run)
                                             if run.status == "finished" else None))

    text = await _blocking(read)
    if text is None:
        return HTMLResponse(pages.not_found(_context(state), run_id), status_code=404)
    return HTMLResponse(text)


def _time_saved(state: _State, run: durably.Run[Any], counts: dict[str, int], total: int
                ) -> tuple[float | None, float]:
    """The seconds the run's latest attempt saved and their part by the cache (as
    :meth:`durably.Run.time_saved`): 0 with no step cached or replayed; else from the steps
    the dashboard keeps, or read if the attempt has at most :data:`INLINE_SAVED` steps;
    else None (not computed here: the page shows it once the runs' rows carry it)."""
    if not counts["cached"] and not counts["replayed"]:
        return 0.0, 0.0
    found = state.steps.kept(run)
    if found is None and total <= INLINE_SAVED:
        found = state.steps.of(run)
    if found is None:
        return None, 0.0
    return found["saved"], found["saved_by_cache"]


def _history_of(store: Store, run: durably.Run[Any]) -> list[durably.Checkpoint]:
    """The run's checkpoints, newest first (as :meth:`durably.Run.history`), their states
    loaded by :func:`queries.safe_load`: never by unpickling, which runs what a pickle
    says and imports the user's modules."""
    record = store.find_run(run.id)
    if record is None:
        return []
    try:
        return checkpoints(store, record, queries.safe_load)[::-1]
    except DurablyError:
        return []


class _Window(Sequence[durably.Checkpoint]):
    """A run's history (newest first) of which one page is read: its length is the run's
    number of checkpoints, its items those of the page (others raise IndexError)."""

    def __init__(self, page: list[durably.Checkpoint], offset: int, total: int) -> None:
        self._page, self._offset, self._total = page, offset, total

    def __len__(self) -> int:
        return self._total

    @overload
    def __getitem__(self, index: int) -> durably.Checkpoint: ...
    @overload
    def __getitem__(self, index: slice) -> list[durably.Checkpoint]: ...
    def __getitem__(self, index: int | slice) -> durably.Checkpoint | list[durably.Checkpoint]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._total))]
        i = index + self._total if index < 0 else index
        if not self._offset <= i < self._offset + len(self._page):
            raise IndexError(f"checkpoint {index} is not on the page read "
                             f"({self._offset} to {self._offset + len(self._page) - 1})")
        return self._page[i - self._offset]


def _history_window(store: Store, run: durably.Run[Any], page: int, size: int
                    ) -> Sequence[durably.Checkpoint]:
    """Page ``page`` (0-based; past the last: the last) of ``size`` checkpoints of the run's
    history, newest first, read alone (:func:`history_page`: the states of its checkpoints
    only, loaded by :func:`queries.safe_load`), in a sequence as long as the history."""
    record = store.find_run(run.id)
    if record is None:
        return []
    try:
        page = max(page, 0)
        found, total = history_page(store, record, page * size, size, queries.safe_load)
        if not found and total:  # (a page past the last: the last, read again)
            page = -(-total // size) - 1
            found, total = history_page(store, record, page * size, size, queries.safe_load)
    except DurablyError:
        return []
    return _Window(found, page * size, total)


async def _history_page(request: Request, state: _State) -> Response:
    run_id = request.path_params["run_id"]
    page = _page_number(request)

    def read() -> str | None:
        try:
            run = durably.get_run(run_id, store=state.store)
        except durably.NotFoundError:
            return None
        return pages.history_page(_context(state), run,
                                  _history_window(state.store, run, page, HISTORY_PAGE), page,
                                  HISTORY_PAGE)

    text = await _blocking(read)
    if text is None:
        return HTMLResponse(pages.not_found(_context(state), run_id), status_code=404)
    return HTMLResponse(text)


async def _cache_page(request: Request, state: _State) -> Response:
    def read() -> dict[str, Any] | None:
        if "maintenance" not in state.store.capabilities:
            return None
        return state.store.cache_stats()

    stats = await _blocking(read)
    return HTMLResponse(pages.cache_page(_context(state), stats,
                                         request.query_params.get("notice")))


async def _static(request: Request) -> Response:
    name = request.path_params["name"]
    if name == "viz.js":
        data = resources.files("durably._assets").joinpath("viz-global.js").read_bytes()
        return Response(data, media_type="application/javascript",
                        headers={"cache-control": "max-age=3600"})
    if name not in _STATIC:
        return PlainTextResponse("not found", status_code=404)
    data = resources.files("durably._ui").joinpath("static", name).read_bytes()
    return Response(data, media_type=_STATIC[name])


# -- the API -----------------------------------------------------------------------------------
async def _api_runs(request: Request, state: _State) -> Response:
    """The newest runs' rows (at most :data:`RUNS_SHOWN`); ``?before=T``: those of the
    runs updated last before ``T`` (seconds since the epoch), for the runs table's older
    pages. The header ``X-Durably-Runs`` says how many runs the store holds."""
    if not await _blocking(state.ready):
        return JSONResponse([], headers={"x-durably-runs": "0"})  # (no store yet: no run)
    before = request.query_params.get("before")
    if before is not None:
        try:
            when = float(before)
        except ValueError:
            return JSONResponse({"error": f"before must be a time in seconds since the epoch "
                                 f"(as the rows' updated), not {before!r}"}, status_code=400)
        found: list[dict[str, Any]] = await _blocking(state.watch.older, when)
    else:
        found = list((await _blocking(state.watch.rows)).values())
    return JSONResponse(found, headers={"x-durably-runs": str(state.watch.total)})


async def _api_stream(request: Request, state: _State) -> Response:
    """Server-sent events: ``runs`` (a list of changed rows, ``removed``: the ids of
    deleted runs, and ``total``: the runs of the store, of which the newest
    :data:`RUNS_SHOWN` have rows), the first one with every run, then one each time the
    store changed;
    ``failed`` (``error``: the store's message, with its fix) while the store cannot be
    read, and ``recovered`` once it can again."""
    async def events() -> AsyncIterator[str]:
        sent: dict[str, str] = {}
        failing = ""
        total = -1
        while True:
            if not await _blocking(state.ready):  # (no store yet: no run, looked for again)
                if not sent and total:
                    total = 0
                    yield 'event: runs\ndata: {"runs": [], "removed": [], "total": 0}\n\n'
                else:
                    yield ": no store yet\n\n"
                if await request.is_disconnected() or await _stopping(state):
                    return
                continue
            try:
                rows = await _blocking(state.watch.rows, state.poll / 2)
            except DurablyError as exc:  # (said on the page; looked at again, as it may be
                if str(exc) != failing:  # repaired meanwhile)
                    failing = str(exc)
                    yield f"event: failed\ndata: {json.dumps({'error': failing})}\n\n"
                else:
                    yield ": still failing\n\n"
                if await request.is_disconnected() or await _stopping(state, 4):
                    return
                continue
            if failing:
                failing = ""
                yield "event: recovered\ndata: {}\n\n"
            changed = []
            for run_id, row in rows.items():
                text = json.dumps(row, sort_keys=True, default=str)
                if sent.get(run_id) != text:
                    sent[run_id] = text
                    changed.append(row)
            removed = [run_id for run_id in sent if run_id not in rows]
            for run_id in removed:
                del sent[run_id]
            if changed or removed or not sent or total != state.watch.total:
                total = state.watch.total
                data = json.dumps({"runs": changed, "removed": removed, "total": total},
                                  default=str)
                yield f"event: runs\ndata: {data}\n\n"
            else:
                yield ": still here\n\n"  # (a comment: notices a closed connection)
            if await request.is_disconnected() or await _stopping(state):
                return

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"cache-control": "no-cache"})


async def _stopping(state: _State, polls: int = 1) -> bool:
    """Wait ``polls`` poll intervals, or less if the server stops: whether it stops."""
    for _ in range(polls * 5):
        if state.stopping():
            return True
        await asyncio.sleep(state.poll / 5)
    return state.stopping()


def _expand_at(graph: durably.RunGraph) -> dict[str, int]:
    """For each collapsed group of the graph (by its DOT node name), the ``collapse=`` that
    draws its calls: its count, or for a group nested in a group (a map inside each call of
    a map, whose node counts every inner call) its outermost group's: the calls of that one
    drawn one by one, each with its own group of inner calls."""
    index = {node.id: node for node in graph.nodes}
    found: dict[str, int] = {}
    for i, node in enumerate(graph.nodes):
        if node.count <= 1:
            continue
        outer = node
        for _ in range(len(graph.nodes)):  # (up the callers: never a cycle)
            above = index.get(outer.parent) if outer.parent is not None else None
            if above is None or above.count <= 1:
                break
            outer = above
        found[f"n{i}"] = outer.count
    return found


async def _api_graph(request: Request, state: _State) -> Response:
    """The run's graph as DOT (``dot``) and its collapsed groups (``groups``: DOT node name
    -> calls), collapsed at ``?collapse=N`` calls (default 20)."""
    run_id = request.path_params["run_id"]
    try:
        collapse = max(0, int(request.query_params.get("collapse", "20")))
    except ValueError:
        return JSONResponse({"error": "collapse must be a number of calls"}, status_code=400)

    def read() -> dict[str, Any] | None:
        try:
            run = durably.get_run(run_id, store=state.store)
        except durably.NotFoundError:
            return None
        status = run.status
        key = (run_id, run.attempt, run.updated, status, collapse)
        if key in state.graphs and status != "running":
            return state.graphs[key]
        graph = run.graph(collapse=collapse)
        if len(graph.nodes) > MAX_DRAWN:
            found: dict[str, Any] = {
                "error": f"{len(graph.nodes):,} nodes are too many to draw; the step table "
                         "lists them all"}
        else:
            found = {"dot": render.to_dot(graph), "nodes": len(graph.nodes),
                     "groups": _expand_at(graph)}
        if len(state.graphs) > 16:
            state.graphs.clear()
        state.graphs[key] = found
        return found

    found = await _blocking(read)
    if found is None:
        return JSONResponse({"error": f"no run {run_id!r}"}, status_code=404)
    return JSONResponse(found)


# -- actions -----------------------------------------------------------------------------------
def _back(path: str, notice: str) -> Response:
    return RedirectResponse(f"{path}?{urlencode({'notice': notice})}", status_code=303)


async def _action(request: Request, state: _State,
                  act: Callable[[dict[str, str]], Response]) -> Response:
    try:
        fields = await _form(request, state)
        response: Response = await _blocking(act, fields)
        return response
    except _Refused as exc:
        return PlainTextResponse(str(exc), status_code=403)
    except (DefinitionError, ValueError) as exc:  # (the form's fault)
        return HTMLResponse(pages.failed(_context(state), str(exc), _came_from(request)),
                            status_code=400)
    except durably.NotFoundError as exc:
        return HTMLResponse(pages.failed(_context(state), str(exc), _came_from(request)),
                            status_code=404)
    except DurablyError as exc:  # (the run's state: executing, answered meanwhile ...)
        return HTMLResponse(pages.failed(_context(state), str(exc), _came_from(request)),
                            status_code=409)


def _came_from(request: Request) -> str:
    """The path of the dashboard's page an action was sent from (its Referer, of this
    server), else the runs page."""
    referer = urlsplit(request.headers.get("referer", ""))
    if referer.netloc != request.headers.get("host", "") or not referer.path.startswith("/"):
        return "/"
    return referer.path + (f"?{referer.query}" if referer.query else "")


def _run_of(state: _State, run_id: str) -> durably.Run[Any]:
    """The run ``run_id`` names (its id, or a unique prefix of it), for an action.

    Raises:
        NotFoundError: the store holds no such run (said in the dashboard's words).
    """
    try:
        return durably.get_run(run_id, store=state.store)
    except durably.NotFoundError:
        raise durably.NotFoundError(f"no run {run_id!r} in this store (it was deleted?). "
                                    "Fix: pick a run on the runs page.") from None


async def _answer(request: Request, state: _State) -> Response:
    run_id = request.path_params["run_id"]

    def act(fields: dict[str, str]) -> Response:
        # (each question's box may be left empty: that question stays pending, as
        # resume with {id: value} for some of them leaves the others)
        answers = {}
        for key, text in fields.items():
            if key.startswith("answer:") and text.strip():
                try:
                    answers[key[7:]] = json.loads(text)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"the answer to interrupt {key[7:]} is not JSON "
                                     f"({exc.msg}): {text!r}. Fix: write it as JSON, for "
                                     "example \"yes\" (with the quotes), true or 42; or leave "
                                     "its box empty to answer it later.") from None
                # (null: refused as resume and durably resume --value null refuse it)
                refuse_no_answer(run_id, answers[key[7:]], fix=(
                    "type an answer as JSON, for example \"yes\" (with the quotes), true or "
                    "42."))
        _run_of(state, run_id)
        if not answers:
            raise ValueError(f"no answer was given to run {run_id!r}: every box was empty. "
                             "Fix: type an answer as JSON in at least one box, for example "
                             "\"yes\" (with the quotes); the questions left empty stay "
                             "pending.")
        queries.answer_interrupts(state.store, run_id, answers)
        left = sum(1 for key, text in fields.items()
                   if key.startswith("answer:") and not text.strip())
        return _back(f"/runs/{run_id}", f"answered {len(answers):,}" + (
            f"; {left:,} left pending" if left else ""))

    return await _action(request, state, act)


async def _fork(request: Request, state: _State) -> Response:
    """A fork of the run from checkpoint ``at`` (its id), made as ``durably fork`` makes it
    but not executed (the dashboard never runs the user's code): ``durably resume FORK``
    executes it where the code is."""
    run_id = request.path_params["run_id"]

    def act(fields: dict[str, str]) -> Response:
        source = state.store.find_run(run_id)
        if source is None:
            raise ValueError(f"no run {run_id!r} to fork: it was deleted meanwhile.")
        at = fields.get("at", "")
        if not at:
            raise ValueError(f"forking run {run_id!r} needs a checkpoint (at). Fix: press "
                             "Fork on a checkpoint of the run's history.")
        fork_id = make_fork(state.store, source, at, NO_UPDATE, load=queries.safe_load)
        return _back(f"/runs/{fork_id}", f"forked {run_id}: run durably resume {fork_id} "
                                         "to execute it")

    return await _action(request, state, act)


async def _delete(request: Request, state: _State) -> Response:
    run_id = request.path_params["run_id"]

    def act(fields: dict[str, str]) -> Response:
        # (a prefix of its id names the run, as for answering; none: not found)
        run = _run_of(state, run_id)
        if fields.get("confirm") not in (run_id, run.id):
            raise ValueError(f"deleting run {run.id!r} needs its id typed as the "
                             "confirmation. Fix: type the run's id in the box.")
        deleted = durably.delete_runs([run.id], store=state.store)
        if not deleted:
            if state.store.find_run(run.id) is None:
                raise durably.NotFoundError(f"no run {run.id!r}: it was deleted meanwhile.")
            raise RunStateError(f"run {run.id!r} was not deleted: a process is executing "
                                "it. Fix: delete it once it has ended (or stop it).")
        return _back("/", f"deleted {run.id}")

    return await _action(request, state, act)


async def _prune(request: Request, state: _State) -> Response:
    from durably._cli.support import _parse_duration, _parse_size, _size

    def act(fields: dict[str, str]) -> Response:
        if fields.get("confirm") != "yes":
            raise ValueError("pruning the cache needs the confirmation box ticked.")
        try:
            age = (_parse_duration("older than", fields["older_than"])
                   if fields.get("older_than") else None)
            size = (_parse_size("max size", fields["max_size"])
                    if fields.get("max_size") else None)
        except Exception as exc:  # noqa: BLE001 - the command's parse error, said as it is
            raise ValueError(str(getattr(exc, "message", exc))) from None
        if age is None and size is None:
            raise ValueError("pruning the cache needs Older than (a duration, such as 30d) "
                             "or Max size (such as 5GB), or both. Fix: fill one in.")
        removed = durably.prune(older_than=age, max_size=size, task=fields.get("task") or None,
                                store=state.store)
        return _back("/cache", f"removed {removed.entries:,} cache entries "
                               f"({_size(removed.bytes)})")

    return await _action(request, state, act)


def new_token() -> str:
    """A random token for the dashboard's URL (``secrets.token_urlsafe``, 32 bytes)."""
    return secrets.token_urlsafe(32)

