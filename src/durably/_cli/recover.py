"""``durably recover``: resume every crashed run of the store, one line per run.

Apart from :mod:`durably.cli` only for its length (which imports it at its end, so that
the command is on its group): it imports each run's entrypoint as
``durably resume`` and ``durably fork`` do (``_load``), and resumes the runs with
:func:`durably.recover`.
"""

from __future__ import annotations

from typing import Any

import click

import durably
from durably._cli.scripts import run_entrypoint
from durably._cli.support import _fail, _table, _when
from durably.cli import _dir_option, _entrypoint_named, _load, _store, _where, cli

__all__ = ["recover_command"]

_EXIT_INTERRUPTED = 3


@cli.command("recover")
@click.option("--entrypoint", "-e", "entrypoint", metavar="NAME",
              help="Only runs of this entrypoint (its name, or module:name).")
@click.option("--keep-finished", "keep_finished", is_flag=True,
              help="Keep the steps the runs finished under older code (the task fixed after "
                   "the crash): replay them, execute only the rest.")
@click.option("--dry-run", is_flag=True, help="List the crashed runs; resume none.")
@_dir_option
@click.pass_context
def recover_command(ctx: click.Context, entrypoint: str | None, keep_finished: bool,
                    dry_run: bool) -> None:
    """Resume every crashed run (its process died while executing it), oldest first (by
    entrypoint), one line each. Runs a live process executes, and runs waiting for an
    answer, are left alone. Exit status 1 if a run failed or could not be resumed (its
    entrypoint cannot be imported), 3 if one paused at interrupt()."""
    store = _store(ctx)
    crashed = sorted((r for r in durably.list_runs(entrypoint, store=store)
                      if r.status == "crashed"), key=lambda r: (r.created, r.id))
    if not crashed:
        of = f" of {entrypoint!r}" if entrypoint else ""
        click.echo(f"no crashed runs{of} in the store at {_where(store)}")
        return
    if dry_run:
        click.echo(_table(("RUN", "ENTRYPOINT", "ATTEMPT", "UPDATED"),
                          [(r.id, r.entrypoint, str(r.attempt), _when(r.updated))
                           for r in crashed], right=(2,)))
        return
    outcomes: list[str] = []
    for identity in dict.fromkeys(r.entrypoint for r in crashed):
        first = next(r for r in crashed if r.entrypoint == identity)
        try:  # (a run of `python job.py`: its recorded script loaded, as durably resume does)
            ep: Any = run_entrypoint(ctx, first, None, _load, _entrypoint_named, "recover")
        except click.ClickException as exc:
            for run in (r for r in crashed if r.entrypoint == identity):
                click.echo(f"run {run.id!r} ({identity}) skipped: {exc.format_message()}")
                outcomes.append("skipped")
            continue
        durably.configure(store=store)  # again: importing the module may have set another
        for recovered in durably.recover(ep, store=store, keep_finished=keep_finished):
            click.echo(str(recovered))
            outcomes.append(recovered.outcome)
    bad = sum(o in ("failed", "skipped") for o in outcomes)
    if bad:
        _fail(f"{bad} of {len(outcomes)} crashed runs were not recovered (see above; durably "
              "show RUN shows a run)")
    if "interrupted" in outcomes:
        raise click.exceptions.Exit(_EXIT_INTERRUPTED)
