"""A task's cache policy beyond its key: ``@task(expires_after=...)`` (an entry older than
that is a miss), ``@task(cache_if=...)`` (a result the callable refuses is not cached) and
:meth:`Task.refresh <durably.Task.refresh>` (one call that reads no entry and replaces it).

Only the cross-run cache follows a policy. A run's journal is its history: a step the run
already finished is replayed whatever its entry's age, and a result that is not cached is
still journaled, so it never executes twice in its run (as a ``cache=False`` step).

The call path asks a spec's ``policy`` only when it has one (``None`` for every task without
these options): a task without them pays nothing but that test.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from durably._store.records import now
from durably.exceptions import DefinitionError

if TYPE_CHECKING:
    from durably._runtime.context import RunContext
    from durably._runtime.spec import Spec
    from durably.store import Store

__all__ = ["ADMITTING", "CachePolicy", "fresh_entry", "make_policy"]

#: the names of the tasks with ``cache_if=`` defined in this process: a run resumed after a
#: crash does not put back the cache entries of their quick steps from its journal (see
#: ``_restore_cache``), since it cannot tell which of their results were refused
ADMITTING: set[str] = set()


class CachePolicy:
    """What decides, beyond the cache key, whether an entry is served and a result cached.

    Attributes:
        expires_after: Seconds an entry is served after it was written, or None: forever.
        cache_if: ``cache_if(result, duration)``, or None: every result is cached.
        refresh: Read no entry, and replace it (:meth:`Task.refresh`).
    """

    __slots__ = ("cache_if", "expires_after", "refresh")

    def __init__(self, expires_after: float | None, cache_if: Callable[[Any, float], Any] | None,
                 refresh: bool = False) -> None:
        self.expires_after = expires_after
        self.cache_if = cache_if
        self.refresh = refresh

    def refreshing(self) -> CachePolicy:
        """This policy for a :meth:`Task.refresh` call."""
        return CachePolicy(self.expires_after, self.cache_if, refresh=True)

    def expired(self, created: float | None) -> bool:
        """Whether an entry written at ``created`` (seconds since the epoch; None: unknown,
        an entry without a key record) is past ``expires_after``."""
        if self.expires_after is None:
            return False
        return created is None or now() - created > self.expires_after

    def admits(self, spec: Spec, store: Store, key: str, result: Any, duration: float) -> bool:
        """Whether ``result`` (its body took ``duration`` seconds) is cached. A refused
        result of a refresh takes the entry it was to replace out of the cache.

        Raises:
            DefinitionError: ``cache_if`` raised; the exception is its cause.
        """
        check = self.cache_if
        if check is None:
            return True
        try:
            admitted = bool(check(result, duration))
        except Exception as exc:
            raise DefinitionError(
                f"task {spec.name!r}: its cache_if={_named(check)} raised {exc!r} for a "
                f"result of type {type(result).__qualname__} (the body took {duration:.3f} "
                "s), so durably cannot tell whether to cache it. Fix: make cache_if return "
                "True or False for every result, for example cache_if=lambda result, "
                "duration: result is not None.") from exc
        if not admitted and self.refresh:
            store.cache_delete((key,))
        return admitted


def _named(func: Any) -> str:
    return getattr(func, "__qualname__", None) or repr(func)


def make_policy(kind: str, name: str, expires_after: Any, cache_if: Any,
                cache: bool) -> CachePolicy | None:
    """The policy of ``@task(expires_after=..., cache_if=...)``, or None when neither is
    given.

    Raises:
        DefinitionError: ``expires_after`` is not a positive :class:`datetime.timedelta` or
            number of seconds, ``cache_if`` is not callable, or either is given to a
            ``cache=False`` task (which has no cache entries to expire or refuse).
    """
    if expires_after is None and cache_if is None:
        return None
    seconds: float | None = None
    if expires_after is not None:
        if isinstance(expires_after, datetime.timedelta):
            seconds = expires_after.total_seconds()
        elif isinstance(expires_after, (int, float)) and not isinstance(expires_after, bool):
            seconds = float(expires_after)
        if seconds is None or not seconds > 0 or math.isinf(seconds):
            raise DefinitionError(
                f"@{kind}(expires_after=...) of {name!r} must be a positive "
                f"datetime.timedelta or number of seconds, not {expires_after!r}. Fix: "
                "expires_after=datetime.timedelta(hours=6), or expires_after=3600.")
    if cache_if is not None and not callable(cache_if):
        raise DefinitionError(
            f"@{kind}(cache_if=...) of {name!r} must be a callable taking the result and the "
            f"body's duration in seconds, not {cache_if!r}. Fix: cache_if=lambda result, "
            "duration: duration > 1.0")
    if not cache:
        given = "expires_after" if expires_after is not None else "cache_if"
        raise DefinitionError(
            f"@{kind}(cache=False, {given}=...) of {name!r}: a cache=False task has no cache "
            f"entries, so {given} would do nothing. Fix: drop {given}, or cache=False.")
    if cache_if is not None:
        ADMITTING.add(name)
    return CachePolicy(seconds, cache_if)


def fresh_entry(spec: Spec, store: Store, key: str, ctx: RunContext | None
                ) -> tuple[bytes, float] | None:
    """The cache entry of ``key`` as the spec's policy lets it be served (its ``policy`` is
    set), with the seconds the execution that produced it took, else None: never for a
    refresh; with ``expires_after``, only while its key record (its time) says it is young
    enough. ``ctx``: the run, whose queued cache writes it sees first (as
    :meth:`RunContext.pending_cache` does)."""
    policy = spec.policy
    if policy is None:
        return store.cache_get_timed(key)
    if policy.refresh:
        return None
    if ctx is not None:
        queued = ctx._cache_writes.get(key)
        if queued is not None:
            info = queued[1]
            expired = policy.expired(info.created if info is not None else None)
            return None if expired else (queued[0], info.duration if info is not None else 0.0)
    found = store.cache_get_timed(key)
    if found is None or policy.expires_after is None:
        return found
    record = store.find_key(spec.identity, key)
    return None if policy.expired(record.created if record is not None else None) else found
