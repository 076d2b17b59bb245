"""The ``durably`` command: list and inspect runs, draw them, resume and fork them, explain a
cache miss, and look after the cache.

::

    durably runs [--entrypoint NAME] [--thread T] [--status S] [--limit N] [--json]
    durably show RUN [--all] [--json]
    durably history RUN [--json]
    durably graph RUN [-f mermaid|dot|svg|html] [-o FILE] [--attempt N] [--collapse N]
    durably resume [MODULE:ENTRYPOINT] RUN [--value JSON] [--keep-finished] [--script PATH]
    durably recover [--entrypoint NAME] [--keep-finished] [--dry-run]
    durably fork RUN [--at CHECKPOINT] [--update JSON] [--cache] [--script PATH]
    durably explain MODULE:TASK [ARG ...] [--json]
    durably cache stats [--json]
    durably cache prune [--older-than 30d] [--max-size 5GB] [--max-entries N] [--task NAME]
                        [--dry-run]
    durably cache clear [--task NAME] [--dry-run]
    durably ui [--host 127.0.0.1] [--port 8765] [--open] [--read-only]

The store is ``--store URL`` or ``--dir DIR`` (before or after the command's name), else
``$DURABLY_STORE`` (a URL or a path), else ``$DURABLY_DIR``, else ``./.durably``; a store
directory must exist. ``RUN`` is a run id or a unique prefix of one. ``MODULE`` is imported
the way ``python -m`` would, with the current directory first on ``sys.path``. An entrypoint
or task declared with its own store (``@entrypoint(store=...)``) keeps that store: ``--store``
and ``--dir`` choose the default store only.

Exit status: 0 success; 1 an error, said in one line on stderr (``durably: error: ...``; add
``--traceback`` for the traceback); 2 a usage error (an unknown option, a missing argument);
3 the run paused at ``interrupt()`` and waits for an answer (resume, fork); 130 Ctrl-C.

The command uses only durably's public API: stores through :mod:`durably.store`.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

import durably
from durably._cli.scripts import run_entrypoint, script_option, script_stem
from durably._cli.support import (
    _clip,
    _CommandError,
    _CtrlC,
    _describe,
    _duration,
    _fail,
    _fields,
    _jsonable,
    _one_line,
    _parse_call,
    _parse_duration,
    _parse_json,
    _short,
    _size,
    _table,
    _usage,
    _when,
)
from durably._runtime.run import RUN_STATUSES
from durably._store.urls import disk_location, open_store_at, redact
from durably.exceptions import DefinitionError, DurablyError

__all__ = ["cli", "main"]

F = TypeVar("F", bound=Callable[..., Any])

STATUSES = RUN_STATUSES
_FORMATS = {"mermaid": "mermaid", "mmd": "mermaid", "dot": "dot", "svg": "svg", "html": "html"}
_EXIT_INTERRUPTED = 3
_EXIT_CTRL_C = 130


class _Group(click.Group):
    """The root group: turns every error into one line (unless ``--traceback``)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort, BrokenPipeError):
            raise
        except KeyboardInterrupt as exc:
            if ctx.meta.get("durably.traceback"):
                raise
            from durably._runtime.ctrl_c import _marked

            stopped = _marked(exc)  # (a run it was executing: stopped, and how to continue)
            if stopped:
                click.echo(stopped.rstrip("\n"), err=True)
                raise click.exceptions.Exit(_EXIT_CTRL_C) from None
            raise _CtrlC("interrupted (Ctrl-C)") from None
        except Exception as exc:
            if ctx.meta.get("durably.traceback"):
                raise
            raise _CommandError(_describe(exc)) from None


# -- the store --------------------------------------------------------------------------------
def _set_dir(ctx: click.Context, _param: click.Parameter, value: Path | None) -> None:
    if value is not None:
        ctx.meta["durably.dir"] = value


def _set_store(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        ctx.meta["durably.url"] = value


_DIR_HELP = "The store directory (default: $DURABLY_STORE, else $DURABLY_DIR, else ./.durably)."
_STORE_HELP = ("The store's URL or path: a directory, file:///path, memory://, or a scheme an "
               "installed backend registers (default: $DURABLY_STORE).")


def _dir_option(func: F) -> F:
    """``--dir`` and ``--store`` on a command (``durably show RUN --dir DIR``), as on the
    group."""
    func = click.option(
        "--store", "store_url", metavar="URL", expose_value=False, callback=_set_store,
        is_eager=True, help=_STORE_HELP,
    )(func)
    return click.option(
        "--dir", "store_dir", type=click.Path(path_type=Path), expose_value=False,
        callback=_set_dir, is_eager=True, help=_DIR_HELP,
    )(func)


def _store(ctx: click.Context) -> durably.Store:
    """The store the command works on, configured as the process's default store (so
    entrypoints and tasks without a store of their own use it): ``--store``, ``--dir``,
    ``$DURABLY_STORE``, ``$DURABLY_DIR``, ``./.durably``, the first given."""
    cached = ctx.meta.get("durably.store")
    if isinstance(cached, durably.Store):
        return cached
    given = ctx.meta.get("durably.dir")
    url = ctx.meta.get("durably.url")
    if url is not None and given is not None:
        _usage("--store and --dir both choose the store: give one of them.")
    if url is not None:
        return _store_at(ctx, url, "--store")
    if given is not None:
        path, source = Path(given), "--dir"
    elif os.environ.get("DURABLY_STORE", "").strip():
        return _store_at(ctx, os.environ["DURABLY_STORE"], "$DURABLY_STORE")
    elif os.environ.get("DURABLY_DIR"):
        path, source = Path(os.environ["DURABLY_DIR"]), "$DURABLY_DIR"
    else:
        path, source = Path(".durably"), "the default, ./.durably"
    return _disk_store(ctx, path, source, {})


def _store_at(ctx: click.Context, url: str, source: str) -> durably.Store:
    """The store a URL names: a directory is checked as ``--dir``'s is."""
    try:
        disk = disk_location(url, source)
        if disk is not None:
            return _disk_store(ctx, Path(disk[0]), source, disk[1])
        store = open_store_at(url, {}, source)
    except (DefinitionError, ValueError) as exc:  # (a bad option in a file:// URL's query)
        if source == "--store":
            _usage(str(exc))
        _fail(str(exc))
    if not store.found():  # (a mistyped URL: the store there would be created empty)
        _fail(f"no durably store at {redact(url)!r} ({source}): nothing is stored there. "
              f"Fix: point {source.lstrip('$')} at the URL of an existing store.")
    durably.configure(store=store)
    ctx.meta["durably.store"] = store
    return store


class _NoStoreYet(Exception):
    """No store was made in the directory ``path`` yet (it is missing or empty): raised by
    :func:`_store` for a command that waits for one (``ctx.meta["durably.may_wait"]``),
    with the store's ``options``."""

    def __init__(self, path: Path, options: dict[str, Any]) -> None:
        super().__init__(str(path))
        self.path = path
        self.options = options


def _disk_store(ctx: click.Context, path: Path, source: str, options: dict[str, Any]
                ) -> durably.DiskStore:
    """The DiskStore at ``path``, which must be a store's directory."""
    path = path.expanduser()
    fix = ("Fix: pass --dir DIR or set DURABLY_DIR to the directory of the store."
           if source not in ("--store", "$DURABLY_STORE") else
           f"Fix: point {source.lstrip('$')} at the directory (or the URL) of a store.")
    if ctx.meta.get("durably.may_wait") and (
            not path.exists() or (path.is_dir() and not any(path.iterdir()))):
        raise _NoStoreYet(path, options)  # (durably ui: serves a dashboard that waits)
    if not path.exists():
        _fail(f"no durably store at {str(path)!r} ({source}): the directory does not exist. "
              + fix)
    if not path.is_dir():
        _fail(f"{str(path)!r} ({source}) is a file, not a durably store. " + fix)
    if not ((path / "FORMAT").exists() or (path / "journal.sqlite3").exists()):
        _fail(f"{str(path)!r} ({source}) is not a durably store (it has no FORMAT and no "
              "journal.sqlite3). " + fix)
    if ctx.meta.get("durably.read_only"):  # (durably ui --read-only: never writes it)
        options = {**options, "read_only": True}
    store = durably.DiskStore(path, **options)
    durably.configure(store=store)
    ctx.meta["durably.store"] = store
    return store


def _where(store: durably.Store) -> str:
    """The store as messages name it: its directory, else its URL (without a password),
    else what it is."""
    return redact(store.where)


def _maintained(store: durably.Store, what: str) -> durably.Store:
    """The store, which ``what`` needs to look after its cache (capability
    ``"maintenance"``)."""
    if "maintenance" not in store.capabilities:
        _fail(f"{what} needs a store that looks after its cache (capability \"maintenance\"); "
              f"the store {_where(store)} is a {type(store).__name__}, which does not. Fix: "
              "choose a store directory with --dir DIR or --store PATH, or a PostgreSQL "
              "store with --store postgresql://...")
    return store


def _find_run(store: durably.Store, text: str) -> durably.Run[Any]:
    """The run with this id, or the one run whose id starts with it."""
    if not text.strip():
        _usage("RUN is empty: give a run id or the start of one (durably runs lists them).")
    try:
        return durably.get_run(text, store=store)
    except durably.NotFoundError:
        found = [r for r in durably.list_runs(store=store) if r.id.startswith(text)]
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            shown = ", ".join(r.id for r in found[:5]) + (" ..." if len(found) > 5 else "")
            _fail(f"run id prefix {text!r} names {len(found)} runs ({shown}). Fix: give more "
                  "of the id.")
        _fail(f"no run {text!r} in the store at {_where(store)!r}. Fix: list the runs with "
              "`durably runs`, or choose the store with --dir DIR or DURABLY_DIR.")


# -- importing user code -----------------------------------------------------------------------
def _import_module(module: str) -> Any:
    """Import ``module`` as ``python -m`` would find it (the current directory first)."""
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module == exc.name or module.startswith(exc.name + ".")):
            _fail(f"cannot import module {module!r}: no module named {exc.name!r} in the "
                  f"current directory ({here}) or on sys.path. Fix: run durably from the "
                  "directory that holds it, or install its package.")
        _fail(f"importing module {module!r} failed: {_describe(exc)}")
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's module failed to import
        _fail(f"importing module {module!r} failed: {_describe(exc)}")


def _load(target: str, kind: str) -> Any:
    """The object named by ``MODULE:NAME``, checked to be an entrypoint or a task."""
    module, sep, name = target.partition(":")
    example = "flows:pipeline" if kind == "entrypoint" else "flows:score"
    if not sep or not module or not name:
        _usage(f"{target!r} is not MODULE:{kind.upper()}. Fix: name the module and the {kind} "
              f"with a colon, for example {example}.")
    if module.endswith(".py") or "/" in module or os.sep in module:
        _usage(f"{module!r} is a file name; give the module's name instead (job.py -> job, "
              f"pkg/flows.py -> pkg.flows) and run durably from the directory that holds it.")
    if module.startswith("__main__"):
        _fail(f"{target!r} names a script that ran as __main__; the command cannot import a "
              "script's __main__. Fix: give the module's name (job for job.py); a run started "
              "with `python job.py` is resumed or forked by its id alone (durably resume RUN, "
              "durably fork RUN), which loads the script it recorded.")
    mod = _import_module(module)
    if kind == "entrypoint":  # a compiled StateGraph runs as an entrypoint named after it
        found = _entrypoint_named(mod, f"{module}:{name}")
        if found is not None:
            return found
    obj: Any = mod
    for part in name.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            cls = durably.Entrypoint if kind == "entrypoint" else durably.Task
            have = sorted(k for k, v in vars(mod).items() if isinstance(v, cls))
            _fail(f"module {module!r} has no {name!r}. "
                  + (f"Its {kind}s: {', '.join(have)}." if have else
                     f"It defines no @durably.{kind}."))
    cls = durably.Entrypoint if kind == "entrypoint" else durably.Task
    if kind == "entrypoint" and type(obj).__name__ == "CompiledGraph":
        from durably.stategraph import CompiledGraph

        if isinstance(obj, CompiledGraph):  # a compiled StateGraph by its variable's name
            return obj._entry
    if not isinstance(obj, cls):
        what = ("a @durably.task" if isinstance(obj, durably.Task) else
                "a @durably.entrypoint" if isinstance(obj, durably.Entrypoint) else
                f"a {type(obj).__name__}")
        _fail(f"{target!r} is {what}, not a @durably.{kind}.")
    return obj


def _entrypoint_named(mod: Any, identity: str) -> Any:
    """The entrypoint with this identity among the module's entrypoints and compiled
    StateGraphs (``approval:approval`` for ``app = builder.compile()`` of a graph named
    approval), or None."""
    for value in list(vars(mod).values()):
        entry = getattr(value, "_entry", None) if not isinstance(value, durably.Entrypoint) \
            else value
        if isinstance(entry, durably.Entrypoint) and entry.spec.identity == identity:
            return entry
    return None


def _signature(func: Any) -> str:
    try:
        return str(inspect.signature(func))
    except (TypeError, ValueError):
        return "(...)"


def _await(value: Any) -> Any:
    """The value, or the result of an async entrypoint's coroutine."""
    if inspect.isawaitable(value):
        return asyncio.run(value)  # type: ignore[arg-type]
    return value


# -- output ------------------------------------------------------------------------------------
def _echo_json(value: Any) -> None:
    # ensure_ascii: a lone surrogate in a value (valid in Python, not in UTF-8) is escaped
    # instead of failing the output
    click.echo(json.dumps(value, indent=2, ensure_ascii=True, default=str))


def _run_fields(run: durably.Run[Any], status: str | None = None) -> dict[str, Any]:
    return {"id": run.id, "entrypoint": run.entrypoint, "name": run.name,
            "status": run.status if status is None else status, "attempt": run.attempt,
            "created": run.created, "updated": run.updated, "error": run.error,
            "thread": run.thread}


def _step_fields(s: durably.StepRecord) -> dict[str, Any]:
    return {"task": s.task, "status": s.status, "attempt": s.attempt, "position": s.position,
            "started": s.started, "ended": s.ended, "duration": s.duration,
            "inputs": s.inputs, "output": s.output, "error": s.error, "step_id": s.step_id,
            "parent_id": s.parent_id, "cache_key": s.cache_key}


def _interrupt_fields(i: durably.Interrupt) -> dict[str, Any]:
    return {"id": i.id, "task": i.task, "step_id": i.step_id, "payload": _jsonable(i.payload)}


def _result(run: durably.Run[Any], status: str) -> tuple[Any, str | None]:
    """The run's result and None, or None and why it cannot be read (``status``: the
    run's, as read once)."""
    if status != "finished":
        return None, None
    try:
        return run.result, None
    except DurablyError as exc:
        return None, _one_line(str(exc))


def _answer_hint(run: durably.Run[Any], pending: Sequence[durably.Interrupt]) -> str:
    value = "JSON" if len(pending) == 1 else "'{\"<interrupt id>\": JSON, ...}'"
    return f"answer with: durably resume {run.entrypoint} {run.id} --value {value}"


def _echo_interrupts(run: durably.Run[Any], pending: Sequence[durably.Interrupt]) -> None:
    click.echo(f"run {run.id!r} is waiting for {len(pending)} answer(s):")
    click.echo(_table(("INTERRUPT", "TASK", "PAYLOAD"),
                      [(i.id, i.task, _short(i.payload, 80)) for i in pending]))
    click.echo(_answer_hint(run, pending))


def _paused(store: durably.Store, run_id: str) -> NoReturn:
    """Print the pending interrupts of a run that paused again, and exit with status 3."""
    run = durably.get_run(run_id, store=store)
    _echo_interrupts(run, run.interrupts)
    raise click.exceptions.Exit(_EXIT_INTERRUPTED)


def _finished(run: durably.Run[Any], result: Any) -> None:
    click.echo(run.summary())
    click.echo(f"result: {_short(result, 200)}")


# -- the commands ------------------------------------------------------------------------------
_HELP = """Inspect durably runs, resume and fork them, and look after the cache.

\b
The store is --store URL or --dir DIR (before or after the command), else
$DURABLY_STORE (a URL or a path), else $DURABLY_DIR, else ./.durably. RUN
is a run id or a unique prefix of one. MODULE is imported like `python -m`
would, from the current directory. An entrypoint declared with its own
store (@entrypoint(store=...)) keeps it: --store and --dir set the default
store only.

\b
Exit status:
  0    success
  1    an error, said in one line on stderr (--traceback shows more)
  2    a usage error (unknown option, missing argument)
  3    the run paused at interrupt() and waits for an answer
  130  interrupted by Ctrl-C
"""


@click.group(cls=_Group, help=_HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--dir", "store_dir", type=click.Path(path_type=Path), expose_value=False,
              callback=_set_dir, help=_DIR_HELP)
@click.option("--store", "store_url", metavar="URL", expose_value=False, callback=_set_store,
              help=_STORE_HELP)
@click.option("--traceback", is_flag=True, help="Show the traceback of an error.")
@click.version_option(durably.__version__, "--version", prog_name="durably")
@click.pass_context
def cli(ctx: click.Context, traceback: bool) -> None:
    """The ``durably`` command group (see the module's docstring)."""
    ctx.meta["durably.traceback"] = traceback


@cli.command("runs")
@click.option("--entrypoint", "-e", "entrypoint", metavar="NAME",
              help="Only runs of this entrypoint (its name, or module:name).")
@click.option("--thread", "-t", "thread", metavar="THREAD",
              help="Only the calls on this conversation thread (entrypoint.run(..., "
                   "thread=THREAD)).")
@click.option("--status", "-s", "status", metavar="STATUS",
              help=f"Only runs with this status: {', '.join(STATUSES)}.")
@click.option("--limit", "-n", type=click.IntRange(min=0), default=0,
              help="At most this many runs (default 0: all).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: a list of runs.")
@_dir_option
@click.pass_context
def runs_command(ctx: click.Context, entrypoint: str | None, thread: str | None,
                 status: str | None, limit: int, as_json: bool) -> None:
    """List the runs in the store, most recently updated first."""
    if status is not None and status not in STATUSES:
        _usage(f"--status {status!r} is not a run status. Use one of: {', '.join(STATUSES)}.")
    store = _store(ctx)
    runs = durably.list_runs(entrypoint, thread=thread, store=store)
    total = len(runs)
    if status is None and limit:
        runs = runs[:limit]  # (a running run's status reads its lease: only those shown)
    # each status read once: a running run's may change meanwhile
    found = [(r, s) for r in runs if status in (None, s := r.status)]
    if status is not None:
        total = len(found)
    if limit:
        found = found[:limit]
    if as_json:
        _echo_json([_run_fields(r, s) for r, s in found])
        return
    if not found:
        what = " ".join(filter(None, [status, "runs" if not entrypoint else
                                      f"runs of {entrypoint!r}",
                                      f"on thread {thread!r}" if thread else ""]))
        click.echo(f"no {what} in the store at {_where(store)}"
                   + (_other_entrypoints(store) if entrypoint and not runs else ""))
        return
    click.echo(_table(("RUN", "ENTRYPOINT", "STATUS", "ATTEMPT", "UPDATED"),
                      [(r.id, r.entrypoint, s, str(r.attempt), _when(r.updated))
                       for r, s in found], right=(3,)))
    if total > len(found):
        click.echo(f"({len(found)} of {total} runs; --limit 0 lists all)")


@cli.command("delete")
@click.argument("run_ids", metavar="[RUN]...", nargs=-1)
@click.option("--older-than", "older_than", metavar="AGE",
              help="Only runs last updated longer ago than this: 30d, 12h, 90m, 45s (0: any).")
@click.option("--status", "-s", "statuses", metavar="STATUS", multiple=True,
              help="Only runs with this status (repeat for several): "
                   f"{', '.join(STATUSES[1:])}. Default: any but interrupted (runs waiting "
                   "for an answer are deleted only when asked for by --status interrupted, "
                   "or by id).")
@click.option("--entrypoint", "-e", "entrypoint", metavar="NAME",
              help="Only runs of this entrypoint (its name, or module:name).")
@click.option("--dry-run", is_flag=True, help="List the runs that would be deleted; delete "
              "nothing.")
@_dir_option
@click.pass_context
def delete_command(ctx: click.Context, run_ids: tuple[str, ...], older_than: str | None,
                   statuses: tuple[str, ...], entrypoint: str | None, dry_run: bool) -> None:
    """Delete runs and their journals: the RUNs named, or the runs matching the filters.

    The cache is kept (their steps still serve later calls); the large values in blobs/
    that only they referred to are removed (in a PostgreSQL store's blob store: collected by
    `durably cache prune` an hour later). A run being executed is never deleted: named,
    it is an error; matched by a filter, it is left out. A run waiting for an answer
    (interrupted) is left out by the filters unless --status interrupted is given. Examples:
    `durably delete RUN`, `durably delete --older-than 30d`, `durably delete --status
    failed --status crashed`.
    """
    wrong = [s for s in statuses if s not in STATUSES]
    if wrong:
        _usage(f"--status {wrong[0]!r} is not a run status. Use one of: "
               f"{', '.join(STATUSES[1:])}.")
    if not run_ids and older_than is None and not statuses and entrypoint is None:
        _usage("delete needs RUN ids or a filter: --older-than AGE, --status STATUS, "
               "--entrypoint NAME (--older-than 0 matches every run but those waiting for "
               "an answer).")
    age = _parse_duration("--older-than", older_than) if older_than is not None else None
    store = _store(ctx)
    ids = [_find_run(store, text).id for text in run_ids] if run_ids else None
    before = _blob_bytes(store)
    deleted = durably.delete_runs(ids, older_than=age, status=statuses or None,
                                  entrypoint=entrypoint, dry_run=dry_run, store=store)
    if not deleted and entrypoint is not None and durably.list_runs(store=store) and not (
            durably.list_runs(entrypoint, store=store)):  # (a misspelt name, most likely)
        _fail(f"no run in the store at {_where(store)} belongs to an entrypoint {entrypoint!r}"
              f"{_other_entrypoints(store)}. Fix: name one of them with --entrypoint "
              "(its name, or module:name).")
    noun = f"run{'' if len(deleted) == 1 else 's'}"
    waiting = [] if run_ids or statuses else durably.delete_runs(
        older_than=age, status="interrupted", entrypoint=entrypoint, dry_run=True, store=store)
    kept = (f"; {len(waiting):,} run{' is' if len(waiting) == 1 else 's are'} waiting for an "
            "answer (interrupted) and kept: add --status interrupted to delete "
            f"{'it' if len(waiting) == 1 else 'them'}" if waiting else "")
    for run_id in deleted:
        click.echo(run_id)
    if dry_run:
        click.echo(f"would delete {len(deleted):,} {noun} (dry run){kept}")
        return
    freed = before - _blob_bytes(store)
    later = (not isinstance(store, durably.DiskStore) and "maintenance" in store.capabilities
             and bool(deleted))  # (a shared blob store: collected after a grace period)
    click.echo(f"deleted {len(deleted):,} {noun} from {_where(store)}"
               + (f"; {_size(freed)} of large values freed in blobs/" if freed > 0 else "")
               + ("; large values no row refers to any more are collected by durably cache "
                  "prune after an hour" if later else "")
               + "; the cache is kept" + kept)


def _other_entrypoints(store: durably.Store) -> str:
    """What follows "no runs of NAME": the entrypoints that have runs in the store (an
    --entrypoint that matches none is most likely misspelt)."""
    names = sorted({(r.name, r.entrypoint) for r in durably.list_runs(store=store)})
    if not names:
        return " (it has no runs)"
    shown = ", ".join(f"{name} ({identity})" for name, identity in names[:10])
    return f" (entrypoints with runs: {shown}{', ...' if len(names) > 10 else ''})"


def _blob_bytes(store: durably.Store) -> int:
    """What the store's large values take apart from its journal (0: none kept apart)."""
    try:
        return store.large_value_bytes()
    except DurablyError:
        return 0


def _depths(steps: Sequence[durably.StepRecord]) -> list[int]:
    parents = {s.step_id: s.parent_id for s in steps}
    depths = []
    for s in steps:
        depth, parent, seen = 0, s.parent_id, set()
        while parent is not None and parent in parents and parent not in seen:
            seen.add(parent)
            depth += 1
            parent = parents[parent]
        depths.append(depth)
    return depths


@cli.command("show")
@click.argument("run_id", metavar="RUN")
@click.option("--all", "all_attempts", is_flag=True,
              help="The steps of every attempt (default: the latest attempt).")
@click.option("--json", "as_json", is_flag=True,
              help="Print JSON: the run's fields and its steps.")
@_dir_option
@click.pass_context
def show_command(ctx: click.Context, run_id: str, all_attempts: bool, as_json: bool) -> None:
    """Show a run: its status and its steps, with durations and cache hits."""
    store = _store(ctx)
    run = _find_run(store, run_id)
    status = run.status  # (first, and once: it may read the record again)
    steps = run.records() if all_attempts else run.steps
    counts = run.counts()
    pending = run.interrupts
    result, result_error = _result(run, status)
    if as_json:
        data = _run_fields(run, status)
        data.update(counts=counts, interrupts=[_interrupt_fields(i) for i in pending],
                    result=_jsonable(result), result_error=result_error,
                    steps=[_step_fields(s) for s in steps])
        _echo_json(data)
        return
    tried = counts["ran"] + counts["cached"]
    hits = (f"; cache hits {counts['cached']:,} of {tried:,} ({counts['cached'] / tried:.0%})"
            if tried else "")
    rows = [
        ("run", run.id),
        ("entrypoint", run.entrypoint),
        ("status", f"{status} (attempt {run.attempt})" + (
            ": the process executing it died; call the entrypoint again with the same "
            "arguments to resume it" if status == "crashed" else "")),
        ("created", _when(run.created)),
        ("updated", _when(run.updated)),
        ("steps", f"{sum(counts.values()):,} — {counts['ran']:,} ran, {counts['cached']:,} "
                  f"cached, {counts['replayed']:,} replayed, {counts['failed']:,} failed"
                  + hits),
    ]
    if run.error:
        rows.append(("error", _clip(run.error, 200)))
    if result_error:
        rows.append(("result", f"(not readable here: {_clip(result_error, 160)})"))
    elif status == "finished":
        rows.append(("result", _short(result, 200)))
    click.echo(_fields(rows))
    if pending:
        click.echo()
        _echo_interrupts(run, pending)
    click.echo()
    if not steps:
        click.echo("no steps")
        return
    headers = ["#", "TASK", "STATUS", "DURATION", "STEP", "OUTPUT"]
    if all_attempts:
        headers.insert(1, "ATTEMPT")
    # a replayed step's record has no output: show the one of the attempt that finished it
    replayed = any(s.status == "replayed" for s in steps)
    outputs = {s.step_id: s.output for s in reversed(run.records() if replayed else [])
               if s.status in ("ran", "cached")}
    table = []
    for s, depth in zip(steps, _depths(steps), strict=True):
        outcome = (s.error if s.status == "failed" else
                   outputs.get(s.step_id) if s.status == "replayed" else s.output)
        if s.kept_from is not None:  # (keep_finished=True: its result is older code's)
            outcome = f"kept from older code (step {s.kept_from[:12]}): {s.output}"
        row = [str(s.position + 1), "  " * depth + s.task, s.status, _duration(s.duration),
               s.step_id[:12], _clip(outcome, 60)]
        if all_attempts:
            row.insert(1, str(s.attempt))
        table.append(row)
    click.echo(_table(headers, table, right=(0, 1, 4) if all_attempts else (0, 3)))


@cli.command("history")
@click.argument("run_id", metavar="RUN")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: a list of checkpoints.")
@_dir_option
@click.pass_context
def history_command(ctx: click.Context, run_id: str, as_json: bool) -> None:
    """List a run's checkpoints, newest first: fork from one with `durably fork RUN --at ID`
    (6 or more of its first characters name it)."""
    store = _store(ctx)
    run = _find_run(store, run_id)
    points = run.history()
    if as_json:
        _echo_json([{"id": p.id, "kind": p.kind, "task": p.task, "time": p.time,
                     "state": p.state, "answer": p.answer, "steps_done": p.steps_done,
                     "step_id": p.step_id} for p in points])
        return
    if not points:
        click.echo(f"run {run.id!r} has no checkpoints yet (no finished step, no interrupt)")
        return
    click.echo(_table(("CHECKPOINT", "KIND", "TASK", "TIME", "STEPS", "STATE", "ANSWER"),
                      [(p.id[:12], p.kind, p.task, _when(p.time), str(p.steps_done),
                        _clip(p.state, 50), _clip(p.answer, 30)) for p in points],
                      right=(4,)))


@cli.command("graph")
@click.argument("run_id", metavar="RUN")
@click.option("--format", "-f", "fmt", metavar="FORMAT",
              help="mermaid (default), dot, svg (needs Graphviz) or html (a report the "
                   "browser draws: no Graphviz needed). Default with -o: from the file's "
                   "suffix (.mmd, .dot, .svg, .html).")
@click.option("--output", "-o", "output", type=click.Path(path_type=Path), metavar="FILE",
              help="Write to FILE (default: print to stdout).")
@click.option("--attempt", type=click.IntRange(min=1), help="Draw this attempt (default: the "
              "latest).")
@click.option("--collapse", type=click.IntRange(min=0), default=20, show_default=True,
              help="Draw more than this many calls of one task under one parent as one node "
                   "(0: draw every call).")
@_dir_option
@click.pass_context
def graph_command(ctx: click.Context, run_id: str, fmt: str | None, output: Path | None,
                  attempt: int | None, collapse: int) -> None:
    """Draw a run's graph: its steps, nested by call, and the data flowing between them."""
    kind = None
    if fmt is not None:
        kind = _FORMATS.get(fmt.lower())
        if kind is None:
            _usage(f"--format {fmt!r} is not a graph format. Use one of: mermaid, dot, svg, "
                  "html (for example -f dot).")
    store = _store(ctx)
    run = _find_run(store, run_id)
    if attempt is not None and attempt > run.attempt:
        _usage(f"--attempt {attempt}: run {run.id!r} has {run.attempt} attempt(s).")
    graph = run.graph(attempt=attempt, collapse=collapse or None)
    if kind is None and output is not None:
        try:
            written = graph.save(output)
        except OSError as exc:
            _fail(f"cannot write {str(output)!r}: {exc.strerror or exc}")
        except durably.RenderError as exc:
            if "unknown suffix" in str(exc):  # (-o g.xyz: a usage error, as -f png is)
                _usage(str(exc))
            raise
        click.echo(f"wrote the graph of run {run.id!r} to {written}", err=True)
        return
    render: dict[str, Callable[[], str]] = {
        "mermaid": graph.to_mermaid, "dot": graph.to_dot, "svg": graph.to_svg,
        "html": graph.to_html,
    }
    text = render[kind or "mermaid"]()
    if output is None:
        click.echo(text, nl=not text.endswith("\n"))
        return
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        _fail(f"cannot write {str(output)!r}: {exc.strerror or exc}")
    click.echo(f"wrote the graph of run {run.id!r} to {output}", err=True)


@cli.command("resume")
@click.argument("names", nargs=-1, required=True, metavar="[MODULE:ENTRYPOINT] RUN")
@click.option("--value", default=None, metavar="JSON",
              help="The answer to the pending interrupt(), as JSON ('\"yes\"', 42, "
                   "'{\"ok\": true}'); several pending: '{\"<interrupt id>\": JSON, ...}'.")
@click.option("--keep-finished", "keep_finished", is_flag=True,
              help="Keep the steps the run finished under older code (the task fixed after "
                   "a crash): replay them, execute only the rest. Continues a crashed, "
                   "failed or stopped run too.")
@script_option
@_dir_option
@click.pass_context
def resume_command(ctx: click.Context, names: tuple[str, ...], value: str | None,
                   keep_finished: bool, script: Path | None) -> None:
    """Answer an interrupted run and continue it (exit status 3 if it pauses again; no
    --value for a run whose questions were answered in durably ui);
    continue a crashed, failed or stopped run with its arguments (with --keep-finished,
    keeping what it finished under older code); execute a fork made by durably ui.
    Without MODULE:ENTRYPOINT, the entrypoint the run recorded (a run started as
    `python job.py`: its script, loaded without its __main__ block)."""
    if len(names) > 2:
        _usage(f"durably resume takes [MODULE:ENTRYPOINT] RUN, not {len(names)} names: "
               f"{' '.join(names)}")
    target, run_id = ("", names[0]) if len(names) == 1 else names
    answer = None if value is None else _parse_json("--value", value)
    store = _store(ctx)
    if not target or script_stem(target):
        found = _find_run(store, run_id)
        if target and found.entrypoint != target:
            _fail(f"run {found.id!r} belongs to entrypoint {found.entrypoint!r}, not "
                  f"{target!r}. Fix: durably resume {found.id}")
        ep = run_entrypoint(ctx, found, script, _load, _entrypoint_named, "resume", found.id,
                             *(["--value", value] if value is not None else
                               ["--value", "JSON"] if found.status == "interrupted" else []),
                             *(["--keep-finished"] if keep_finished else []))
    else:
        if script is not None:
            _usage("--script is for runs started as `python job.py`: give RUN alone (durably "
                   "resume RUN --script PATH), without MODULE:ENTRYPOINT.")
        ep = _load(target, "entrypoint")
    durably.configure(store=store)  # again: importing the module may have configured another
    home = ep.spec.store or store
    run = _find_run(home, run_id)
    if run.entrypoint != ep.spec.identity:
        _fail(f"run {run.id!r} belongs to entrypoint {run.entrypoint!r}, not "
              f"{ep.spec.identity!r}. Fix: durably resume {run.id}")
    if keep_finished and run.status in ("running", "crashed", "failed", "stopped",
                                        "finished") and value is None:
        if run.status == "running":
            _fail(f"run {run.id!r} is running: a process is executing it now. Fix: resume it "
                  f"once it ended (see it with durably show {run.id}).")
        _resume_and_report(ctx, home, run, lambda: ep.resume(run.id, keep_finished=True))
        return
    if value is None and run.status == "forked":
        # a fork made without executing it (durably ui's Fork button): executed as fork()
        # does, its finished steps before the checkpoint replayed, the rest executed
        _, _, args, kwargs = ep._self_stored_call(run.id, "resume", home)
        runner = ep._self_arun if ep.spec.is_async else ep._self_srun
        _resume_and_report(ctx, home, run, lambda: runner(ep.__wrapped__, None, args, kwargs,
                                                          run.id, False, False, None, False,
                                                          home))
        return
    if value is None and run.status in ("crashed", "failed", "stopped"):
        # continued with its stored arguments, as calling the entrypoint again would (a
        # script's run too: its recorded script was loaded above)
        _, _, args, kwargs = ep._self_stored_call(run.id, "resume", home)
        runner = ep._self_arun if ep.spec.is_async else ep._self_srun
        _resume_and_report(ctx, home, run, lambda: runner(ep.__wrapped__, None, args, kwargs,
                                                          run.id, False, False))
        return
    if run.status != "interrupted":
        fix = {
            "finished": f"Its result: durably show {run.id}.",
            "forked": f"Execute it with: durably resume {run.id} (without --value).",
            "running": f"A process is executing it now: answer once it pauses (see it with "
                       f"durably show {run.id}).",
        }.get(run.status, f"Fix: run `python {run.script}` again with its arguments to "
                          f"continue it, or durably resume {run.id} --keep-finished."
              if run.script else "Fix: call the entrypoint again with the same arguments to "
                                 "continue it.")
        _fail(f"run {run.id!r} is {run.status}, not interrupted: it waits for no answer. {fix}")
    if value is None and run.interrupts:  # an approval must never be answered by accident
        _fail(f"run {run.id!r} waits for an answer: give it with --value JSON (for example "
              f"--value '\"yes\"'; see it with durably show {run.id}).")
    _resume_and_report(ctx, home, run, lambda: ep.resume(run.id, answer))


def _resume_and_report(ctx: click.Context, home: durably.Store, run: durably.Run[Any],
                       resume: Callable[[], Any]) -> None:
    """Continue ``run`` by ``resume()`` (an answer, or ``--keep-finished``) and say how it
    ended: its result, its pause (exit status 3) or its failure."""
    try:
        result = _await(resume())
    except durably.RunInterrupted:
        _paused(home, run.id)
    except (DurablyError, KeyboardInterrupt):
        raise
    except Exception as exc:
        if ctx.meta.get("durably.traceback"):
            raise
        _fail(f"run {run.id!r} failed: {_describe(exc)} (recorded in its journal: durably "
              f"show {run.id}; --traceback shows where)")
    _finished(durably.get_run(run.id, store=home), result)


@cli.command("fork")
@click.argument("run_id", metavar="RUN")
@click.option("--at", "at", metavar="CHECKPOINT",
              help="A checkpoint id from `durably history RUN` (6+ of its first characters). "
                   "Default: the latest checkpoint.")
@click.option("--update", metavar="JSON",
              help="A new result for the checkpoint's step, or the answer to an interrupt "
                   "checkpoint, as JSON.")
@click.option("--cache", "use_cache", is_flag=True,
              help="Let steps after the checkpoint be served from the cache (default: they "
                   "execute).")
@script_option
@_dir_option
@click.pass_context
def fork_command(ctx: click.Context, run_id: str, at: str | None, update: str | None,
                 use_cache: bool, script: Path | None) -> None:
    """Start a new run from a checkpoint of RUN and execute it with today's code (the
    entrypoint's module is imported by the name the run recorded; a run started as
    `python job.py`: its script, loaded without its __main__ block)."""
    new_value = _parse_json("--update", update) if update is not None else None
    store = _store(ctx)
    run = _find_run(store, run_id)
    run_entrypoint(ctx, run, script, _load, _entrypoint_named, "fork", run.id,
                    *(["--at", at] if at is not None else []),
                    *(["--update", update] if update is not None else []),
                    *(["--cache"] if use_cache else []))
    durably.configure(store=store)
    points = run.history()
    chosen = [p for p in points if at is not None and p.id.startswith(at)]
    if at is not None and (len(at) < 6 or not chosen):
        _fail(f"--at {at!r}: "
              + ("give 6 or more characters of a checkpoint id" if len(at) < 6 else
                 f"run {run.id!r} has no such checkpoint")
              + f". Its checkpoints: durably history {run.id}.")
    if len(chosen) > 1:
        _fail(f"--at {at!r} names {len(chosen)} checkpoints of run {run.id!r}: give more "
              "characters.")
    options: dict[str, Any] = {"cache": use_cache, "store": store}
    if update is not None:
        options["update"] = new_value
    before = {r.id for r in durably.list_runs(store=store)}
    try:
        forked = _await(durably.fork(run.id, at, **options))
    except (DurablyError, KeyboardInterrupt):
        raise
    except Exception as exc:
        if ctx.meta.get("durably.traceback"):
            raise
        new = [r.id for r in durably.list_runs(store=store) if r.id not in before]
        name = f"run {new[0]!r}" if new else "the fork"
        _fail(f"{name} (forked from {run.id!r}) failed: {_describe(exc)} (--traceback shows "
              "where)")
    point = chosen[0] if chosen else (points[0] if points else None)
    where = f" at checkpoint {point.id[:12]} ({point.kind} {point.task})" if point else ""
    click.echo(f"forked run {run.id!r}{where} into run {forked.id!r}")
    if forked.status == "interrupted":
        _paused(store, forked.id)
    _finished(forked, _result(forked, forked.status)[0])


@cli.command("explain", context_settings={"ignore_unknown_options": True})
@click.argument("target", metavar="MODULE:TASK")
@click.argument("args", nargs=-1, metavar="[ARG|NAME=ARG]...")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@_dir_option
@click.pass_context
def explain_command(ctx: click.Context, target: str, args: tuple[str, ...],
                    as_json: bool) -> None:
    """Say whether a call of a task would be served from the cache, and if not, why.

    Each ARG is JSON when it parses as JSON (3, 2.5, true, null, "[1, 2]"), else a string;
    NAME=ARG passes a keyword argument. Nothing executes.
    """
    positional, keywords = _parse_call(args)
    store = _store(ctx)
    task = _load(target, "task")
    durably.configure(store=store)
    try:
        params = inspect.signature(task.spec.raw).parameters
    except (TypeError, ValueError):
        params = None
    if params is not None and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        unknown = [k for k in keywords if k not in params]
        if unknown:  # (said before a missing one: Python names that first)
            _usage(f"the arguments do not fit {target}{_signature(task)}: "
                   f"{task.spec.name}() has no parameter {unknown[0]!r}")
    try:
        why = task.explain(*positional, **keywords)
    except TypeError as exc:
        if isinstance(exc, DurablyError):
            raise
        _usage(f"the arguments do not fit {target}{_signature(task)}: {exc}")
    note = None
    if why.nearest is None and not why.hit:
        identity = task.spec.identity
        script = f"__main__.{identity}"
        if script in store.task_identities():
            note = (f"note: the cache has entries of {script!r}, written by running the module "
                    "as a script (python file.py); a task's identity includes how its module "
                    "was loaded, so those entries are not this task's.")
    if as_json:
        _echo_json({"task": why.task, "identity": task.spec.identity,
                    "cache_key": why.cache_key, "hit": why.hit, "reason": why.reason,
                    "changed_arguments": list(why.changed_arguments),
                    "changed_code": list(why.changed_code),
                    "version_change": list(why.version_change) if why.version_change else None,
                    "note": note})
        return
    click.echo(str(why))
    if note:
        click.echo(note)


def main() -> None:
    """Run the ``durably`` command (the console script); exits with its status.

    Example:
        >>> import subprocess, sys
        >>> subprocess.run([sys.executable, "-c", "from durably.cli import main; main()",
        ...                 "--version"], capture_output=True, text=True).stdout
        'durably, version 0.1.0\\n'
    """
    cli.main(prog_name="durably")



from durably._cli import cache as _cache  # noqa: E402, F401 - its commands, on cli
from durably._cli import recover as _recover  # noqa: E402, F401 - its command, on cli
from durably._cli import ui as _ui  # noqa: E402, F401 - its command, on cli
