"""``durably cache stats|prune|clear``: look after the cache of a store.

Apart from :mod:`durably.cli` only for its length (which imports it at its end, so that the
group is on it).
"""

from __future__ import annotations

import click

import durably
from durably._cli.support import (
    _clip,
    _fields,
    _parse_duration,
    _parse_size,
    _percent,
    _size,
    _table,
    _usage,
    _when,
)
from durably.cli import _dir_option, _echo_json, _maintained, _store, _where, cli
from durably.store import match_tasks

__all__ = ["cache_group"]

#: the characters of a task's name shown in ``cache stats``'s table (a longer one is cut,
#: with an ellipsis, so that the table stays aligned; --json gives it whole)
TASK_WIDTH = 60


@cli.group("cache")
@_dir_option
def cache_group() -> None:
    """Look after the cache: statistics, pruning, clearing. Journals are never touched, so
    runs keep replaying their finished steps."""


@cache_group.command("stats")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@_dir_option
@click.pass_context
def cache_stats_command(ctx: click.Context, as_json: bool) -> None:
    """Entries, bytes, entries per task, and the hit rate of runs."""
    store = _maintained(_store(ctx), "durably cache stats")
    stats = store.cache_stats()
    kept = "on disk" if isinstance(store, durably.DiskStore) else "stored"
    if as_json:
        _echo_json(stats)
        return
    rate = (f"{_percent(stats['hit_rate'])} ({stats['cached']:,} cached, {stats['ran']:,} ran, "
            f"over the steps journaled by {stats['runs']:,} run(s))"
            if stats["hit_rate"] is not None else f"no cacheable steps in {stats['runs']:,} "
            "run(s)")
    click.echo(_fields([
        ("store", stats["path"]),
        ("entries", f"{stats['entries']:,}"),
        ("size", f"{_size(stats['bytes'])} {kept}, {_size(stats['entry_bytes'])} of entries"),
        ("stored", f"{_when(stats['oldest'])} … {_when(stats['newest'])}"
         if stats["entries"] else ""),
        ("hit rate", rate),
    ]))
    if stats["tasks"]:
        click.echo()
        click.echo(_table(("TASK", "ENTRIES", "SIZE", "RAN", "CACHED", "HIT RATE"),
                          [(_clip(t["task"], TASK_WIDTH), f"{t['entries']:,}",
                            _size(t["bytes"]), f"{t['ran']:,}",
                            f"{t['cached']:,}", _percent(t["hit_rate"]))
                           for t in stats["tasks"]], right=(1, 2, 3, 4, 5)))


@cache_group.command("prune")
@click.option("--older-than", "older_than", metavar="AGE",
              help="Remove entries stored longer ago than this: 30d, 12h, 90m, 45s.")
@click.option("--max-size", "max_size", metavar="SIZE",
              help="Then remove the oldest entries until the cache is at most this big: 5GB, "
                   "500MB, 1.5GiB, or bytes.")
@click.option("--max-entries", "max_entries", type=click.IntRange(min=0), metavar="N",
              help="Then remove the oldest entries until at most N are left.")
@click.option("--task", "task", metavar="NAME",
              help="Only this task's entries (its name, or module:name); the limits count "
                   "them alone.")
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
@_dir_option
@click.pass_context
def cache_prune_command(ctx: click.Context, older_than: str | None, max_size: str | None,
                        max_entries: int | None, task: str | None, dry_run: bool) -> None:
    """Remove cache entries by age, count and size, oldest first."""
    if older_than is None and max_size is None and max_entries is None:
        _usage("cache prune needs --older-than AGE, --max-size SIZE or --max-entries N, for "
               "example --older-than 30d or --max-size 5GB.")
    age = _parse_duration("--older-than", older_than) if older_than is not None else None
    size = _parse_size("--max-size", max_size) if max_size is not None else None
    store = _maintained(_store(ctx), "durably cache prune")
    before = store.cache_size()
    try:
        removed = store.prune(age, size, max_entries=max_entries, task=task, dry_run=dry_run)
    except ValueError as exc:
        _usage(str(exc).replace("a cache size limit", "--max-size"))
    _report(store, removed, before, dry_run)


@cache_group.command("clear")
@click.option("--task", "task", metavar="NAME",
              help="Only this task's entries (its name, or module:name). Default: every entry.")
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
@_dir_option
@click.pass_context
def cache_clear_command(ctx: click.Context, task: str | None, dry_run: bool) -> None:
    """Remove every cache entry, or one task's."""
    store = _maintained(_store(ctx), "durably cache clear")
    before = store.cache_size()
    removed = store.clear(task, dry_run=dry_run)
    if task is not None:
        click.echo(f"task {task!r}: {', '.join(match_tasks(store.task_identities(), task))}")
    _report(store, removed, before, dry_run)


def _report(store: durably.Store, removed: int, before: int, dry_run: bool) -> None:
    if dry_run:
        click.echo(f"would remove {removed:,} cache entr{'y' if removed == 1 else 'ies'} "
                   f"(dry run; the cache holds {_size(before)})")
        return
    after = store.cache_size()
    cache = (str(store.path / "cache") if isinstance(store, durably.DiskStore)  # (as in 0.1)
             else f"the cache of {_where(store)}")
    click.echo(f"removed {removed:,} cache entr{'y' if removed == 1 else 'ies'} from "
               f"{cache}: {_size(before)} -> {_size(after)}; journals are kept")
