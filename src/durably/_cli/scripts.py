"""How ``durably resume`` and ``durably fork`` find the entrypoint of a run a script started
(``python job.py``: the entrypoint's identity is ``__main__.job:name``).

The run recorded the script's path (:attr:`durably.Run.script`). The command loads the
script as Python's :mod:`multiprocessing` loads it in a process it spawns: executed as the
module ``__mp_main__`` (so its ``if __name__ == "__main__":`` block does not run), which is
also ``__main__`` in this process (worker processes started from here load it the same
way), with the script's directory first on ``sys.path``, as ``python job.py`` has it. Its
tasks and entrypoints then have the identities and code fingerprints they had under
``python job.py``, so the run's finished steps replay. A script that is not where the run
recorded it is an error that gives the command with ``--script``.
"""

from __future__ import annotations

import importlib.machinery
import os
import shlex
import sys
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

import durably
from durably._cli.support import _describe, _fail, _usage
from durably._store.urls import redact

__all__ = ["run_entrypoint", "script_entrypoint", "script_option", "script_stem"]

F = TypeVar("F", bound=Callable[..., Any])


def script_option(func: F) -> F:
    """``--script PATH`` on a command that finds a run's entrypoint."""
    return click.option(
        "--script", "script", type=click.Path(path_type=Path), default=None, metavar="PATH",
        help="For a run started as `python job.py`: the script, if it is no longer where "
             "the run recorded it.")(func)


def again(ctx: click.Context, *args: str) -> Callable[[str], list[str]]:
    """The command line of this command again (``args``: its name and arguments), with the
    store options it was given and ``--script PATH``."""
    base = ["durably"]
    if ctx.meta.get("durably.dir") is not None:
        base += ["--dir", str(ctx.meta["durably.dir"])]
    if ctx.meta.get("durably.url") is not None:
        base += ["--store", redact(str(ctx.meta["durably.url"]))]
    return lambda path: [*base, *args, "--script", path]


def run_entrypoint(ctx: click.Context, run: durably.Run[Any], script: Path | None,
                   load: Callable[[str, str], Any], named: Callable[[Any, str], Any],
                   *args: str) -> Any:
    """The entrypoint of ``run``: its script loaded (a run started as ``python job.py``),
    or its module imported (``load``). ``args``: the command's name and arguments, for the
    command line an error gives."""
    if script_stem(run.entrypoint):
        return script_entrypoint(run, script, again(ctx, *args), named)
    if script is not None:
        _usage(f"--script is for runs started as `python job.py`; run {run.id!r} belongs to "
               f"{run.entrypoint!r}, imported from its module.")
    return load(run.entrypoint, "entrypoint")


def script_stem(identity: str) -> str:
    """``job`` for ``__main__.job:name`` (the script's file name without ``.py``), else
    ""."""
    module = identity.partition(":")[0]
    return module[len("__main__."):] if module.startswith("__main__.") else ""


def script_entrypoint(run: durably.Run[Any], script: Path | None,
                      again: Callable[[str], Sequence[str]],
                      named: Callable[[Any, str], Any]) -> Any:
    """The entrypoint of ``run``, whose identity says it was defined in a script run as
    ``python job.py``, loaded from ``script`` (``--script``) or from the path the run
    recorded.

    Args:
        run: The run.
        script: The script's path given on the command line, or None.
        again: The command line that would work with ``--script PATH``, for the error
            when the script cannot be found.
        named: Finds the entrypoint with an identity among a module's values.

    Raises:
        _CommandError: the script is not there (the message gives the command with
            ``--script``), cannot be run, or does not define the run's entrypoint.
    """
    stem = script_stem(run.entrypoint)
    recorded = run.script
    path = script if script is not None else Path(recorded) if recorded else None
    if path is None or not path.is_file():
        _fail(_not_found(run, stem, recorded, script, again))
    if path.stem != stem:
        _fail(f"run {run.id!r} belongs to {run.entrypoint!r}, defined in a script named "
              f"{stem}.py, and --script {path} is another file. Fix: "
              f"{shlex.join(again(_shown(path.with_name(stem + '.py'))))}")
    module = _execute(path)
    entry = named(module, run.entrypoint)
    if entry is None:
        name = run.entrypoint.partition(":")[2]
        _fail(f"script {path} defines no entrypoint {name!r} (run {run.id!r} belongs to "
              f"{run.entrypoint!r}): was it renamed? Fix: give the script that defines it "
              "with --script PATH.")
    return entry


def _shown(path: Path) -> str:
    """``path`` as a person would type it here: relative to the current directory when it
    is below it."""
    try:
        return str(path.absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _not_found(run: durably.Run[Any], stem: str, recorded: str | None, given: Path | None,
               again: Callable[[str], Sequence[str]]) -> str:
    """Why the script of ``run`` cannot be loaded, and the command that will work (with the
    script found in the current directory, if it is there)."""
    here = Path(f"{stem}.py")
    where = _shown(here) if here.is_file() else f"<path of {stem}.py>"
    fix = shlex.join(again(where))
    if given is not None:
        return f"--script {given}: no such file. Fix: {fix}"
    if recorded is None:
        return (f"run {run.id!r} was started by a script run as `python {stem}.py`, and did "
                "not record where that script is (it was started before durably recorded "
                f"it, or by code that is not in a file). Fix: {fix}")
    return (f"run {run.id!r} was started by the script {recorded} (`python {stem}.py`), "
            f"which is not there any more (moved or deleted). Fix: {fix}")


def _execute(path: Path) -> types.ModuleType:
    """Run the script at ``path`` as ``__mp_main__`` (also ``__main__`` here), as
    multiprocessing does in a process it spawns, and return its module."""
    path = path.absolute()
    try:
        code = compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
    except (OSError, SyntaxError, ValueError) as exc:
        _fail(f"cannot read the script {path}: {_describe(exc)}")
    module = types.ModuleType("__mp_main__")
    module.__file__ = str(path)
    module.__loader__ = importlib.machinery.SourceFileLoader("__mp_main__", str(path))
    sys.modules["__main__"] = sys.modules["__mp_main__"] = module
    folder = os.path.dirname(os.path.realpath(path))  # (python job.py: the script's folder)
    if not sys.path or sys.path[0] != folder:
        sys.path.insert(0, folder)
    argv, sys.argv = sys.argv, [str(path)]  # (its own arguments are not known here)
    try:
        exec(code, module.__dict__)  # (the user's script, as python would run it)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's script failed
        _fail(f"running the script {path} (as a module: its `if __name__ == \"__main__\":` "
              f"block does not run) to find its entrypoint failed: {_describe(exc)}")
    finally:
        sys.argv = argv
    return module
