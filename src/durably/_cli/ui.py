"""``durably ui``: serve the dashboard of a store on this machine.

Apart from :mod:`durably.cli` only for its length (which imports it at its end, so that the
command is on it). Starlette and uvicorn are imported when the command runs, so ``durably``
works without the ``ui`` extra.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import threading
import webbrowser
from collections.abc import Callable

import click

import durably
from durably._cli.support import _fail
from durably._store.memory import MemoryStore
from durably.cli import _dir_option, _NoStoreYet, _store, _where, cli

__all__ = ["ui_command"]

def _local(host: str) -> bool:
    """Whether ``host`` is a loopback address or name (only this machine can connect)."""
    from durably._ui.app import is_local

    return is_local(host)


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port`` (as uvicorn binds it), for the server to listen on.

    Raises:
        click.ClickException: the port is taken, or the address is not this machine's (the
            command's ``durably: error:`` line, exit status 1).
    """
    try:
        family = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as exc:
        _fail(f"durably ui cannot listen on --host {host}: {exc.strerror}. Fix: give an "
              "address or name of this machine (default 127.0.0.1).")
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            _fail(f"durably ui cannot listen on port {port} of {host}: it is in use (another "
                  "durably ui?). Fix: pick another port with --port N, or --port 0 for any "
                  "free port.")
        _fail(f"durably ui cannot listen on {host}:{port}: {exc.strerror}. Fix: pick another "
              "--host or --port (--port 0: any free port).")
    sock.set_inheritable(True)
    return sock


def _opener(waiting: _NoStoreYet, read_only: bool) -> Callable[[], durably.Store | None]:
    """What opens the store ``waiting`` is about once a run made it (a ``FORMAT`` or a
    journal there), else None: never creating it (reading must not write)."""
    def open_store() -> durably.Store | None:
        path = waiting.path
        if not ((path / "FORMAT").exists() or (path / "journal.sqlite3").exists()):
            return None
        try:
            return durably.DiskStore(path, **({**waiting.options, "read_only": True}
                                       if read_only else waiting.options))
        except (durably.DurablyError, OSError):  # (being made this moment: looked at again)
            return None
    return open_store


@cli.command("ui")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="The address to listen on. Anything but a loopback address lets other "
                   "machines reach the dashboard (they still need its token).")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535),
              help="The port to listen on (0: any free port).")
@click.option("--open", "open_browser", is_flag=True, help="Open the dashboard in a browser.")
@click.option("--read-only", "read_only", is_flag=True,
              help="Show the runs only: no answering, deleting or pruning.")
@_dir_option
@click.pass_context
def ui_command(ctx: click.Context, host: str, port: int, open_browser: bool,
               read_only: bool) -> None:
    """Serve a dashboard of the store's runs in the browser: runs updated live, each run's
    graph, steps, errors and questions (answered from a form), the cache. It reads the
    store only; it never imports or runs your code. Needs pip install 'durably[ui]'."""
    try:
        import uvicorn

        from durably._ui import create_app, new_token
    except ImportError as exc:
        _fail(f"durably ui needs Starlette and uvicorn ({exc.name} is not installed). Fix: "
              "pip install 'durably[ui]'")
    ctx.meta["durably.read_only"] = read_only  # (a store directory: opened for reading only)
    ctx.meta["durably.may_wait"] = True
    waiting: _NoStoreYet | None = None
    store: durably.Store | None = None
    try:
        store = _store(ctx)
    except _NoStoreYet as exc:  # (a dashboard opened before the first run: it waits)
        waiting = exc
    if isinstance(store, MemoryStore):
        _fail("durably ui cannot watch a memory:// store: it lives in the process that "
              "made it, and this one would show its own, always empty. Fix: give the "
              "directory (--dir) or URL (--store) of a store your runs write to.")
    token = new_token()
    server: uvicorn.Server | None = None
    app = create_app(store, token, read_only=read_only,
                     stopping=lambda: server is not None and server.should_exit,
                     local_only=_local(host),
                     open_store=None if waiting is None else _opener(waiting, read_only),
                     where="" if waiting is None else str(waiting.path.absolute()))
    sock = _listen(host, port)
    if not _local(host):
        click.echo(f"warning: --host {host} is not a loopback address: other machines can "
                   "reach this dashboard (with its token) over plain HTTP. Use it only on a "
                   "network you trust.", err=True)
    # (the live pages' streams end once the server stops; any other request left after
    # 5 s is cancelled)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    running = server

    def announce() -> None:
        while not running.started:
            if running.should_exit:
                return
            threading.Event().wait(0.05)
        bound = sock.getsockname()[1]
        shown = f"[{host}]" if ":" in host else host
        url = f"http://{shown}:{bound}/?token={token}"
        about = (f"the store {_where(store)}" if store is not None else
                 f"no store at {waiting.path if waiting else ''} yet (its runs appear once one "
                 "is made there)")
        click.echo(f"durably ui: {about}"
                   f"{' (read-only)' if read_only else ''}\n"
                   f"open {url}\n(Ctrl-C stops it)")
        if open_browser and not webbrowser.open(url):
            click.echo("durably ui: no browser could be opened here (--open): open the "
                       "address above in one.", err=True)

    threading.Thread(target=announce, daemon=True, name="durably-ui-announce").start()
    with contextlib.suppress(KeyboardInterrupt):  # (uvicorn raises it again once stopped)
        server.run(sockets=[sock])
    click.echo("durably ui: stopped")
