"""Per-task retries (on tenacity) and timeouts.

A task with ``retry=`` executes its body again when it raises one of the listed exceptions,
waiting ``backoff × multiplier**n`` seconds (at most ``max_backoff``) between tries. Inside a
run, every failed try is journaled as a ``failed`` record of the step (``run.records()``,
the run graph), and the step's final record is ``ran`` or ``failed``. Interrupts and stops
are never retried. ``timeout=`` bounds each try: an ``async`` task is cancelled, a sync
task's body is abandoned in a background thread and :class:`~durably.TaskTimeoutError`
(a :class:`TimeoutError`) is raised.
"""

from __future__ import annotations

import contextvars
import dataclasses
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from durably.exceptions import DefinitionError, TaskTimeoutError

__all__ = ["Retries", "Retry", "Seceded", "call_with_timeout", "check_timeout", "retrying",
           "to_retry"]


@dataclasses.dataclass(frozen=True)
class Retry:
    """How a task retries a failed call (``@task(retry=Retry(...))``; ``retry=3`` is
    ``Retry(attempts=3)``).

    Attributes:
        attempts: Tries in all, the first included (>= 1).
        backoff: Seconds to wait before the second try.
        multiplier: Each later wait is this many times the previous one.
        max_backoff: The longest wait, in seconds.
        on: Exception types that are retried; others propagate at once.

    Example:
        >>> import durably
        >>> tries = []
        >>> @durably.task(cache=False, retry=durably.Retry(attempts=3, backoff=0,
        ...                                                on=(ConnectionError,)))
        ... def fetch(url):
        ...     tries.append(url)
        ...     if len(tries) < 3:
        ...         raise ConnectionError("flaky network")
        ...     return "page"
        >>> fetch("https://example.org"), len(tries)
        ('page', 3)
    """

    attempts: int = 3
    backoff: float = 1.0
    multiplier: float = 2.0
    max_backoff: float = 60.0
    on: tuple[type[BaseException], ...] = (Exception,)

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or isinstance(self.attempts, bool) or (
                self.attempts < 1):
            raise DefinitionError(f"Retry(attempts=...) must be an int >= 1, not "
                                  f"{self.attempts!r}")
        for name in ("backoff", "multiplier", "max_backoff"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise DefinitionError(f"Retry({name}=...) must be a number of seconds >= 0, "
                                      f"not {value!r}")
        on = self.on if isinstance(self.on, tuple) else (self.on,)
        if not on or not all(isinstance(t, type) and issubclass(t, BaseException) for t in on):
            raise DefinitionError(
                f"Retry(on=...) must be exception types, not {self.on!r}. Fix: "
                "on=(ConnectionError, TimeoutError)")
        object.__setattr__(self, "on", on)

    def for_error(self, exc: BaseException) -> Retry | None:
        """The policy that applies to a try that raised ``exc``: this one if ``exc`` is one
        of ``on``, else None (not retried)."""
        return self if isinstance(exc, self.on) else None


@dataclasses.dataclass(frozen=True)
class Retries:
    """Several policies on one task (``@task(retry=[Retry(...), Retry(...)])``, as LangGraph
    allows): a failed try is retried by the first policy whose ``on`` matches its exception,
    with that policy's attempts and waits (tries counted from the first, whichever failed).

    Attributes:
        policies: The policies, in order.
    """

    policies: tuple[Retry, ...]

    @property
    def attempts(self) -> int:
        """The most tries any policy allows."""
        return max(p.attempts for p in self.policies)

    def for_error(self, exc: BaseException) -> Retry | None:
        """The first policy whose ``on`` matches ``exc``, else None (not retried)."""
        return next((p for p in self.policies if isinstance(exc, p.on)), None)


def to_retry(retry: Any, name: str) -> Retry | Retries | None:
    """The policy of ``@task(retry=...)``: None, an int of attempts, a :class:`Retry`, or a
    list of them (the first matching a failure applies)."""
    if retry is None or isinstance(retry, (Retry, Retries)):
        return retry
    if isinstance(retry, int) and not isinstance(retry, bool):
        return Retry(attempts=retry)
    if isinstance(retry, (list, tuple)) and retry and all(
            isinstance(p, Retry) for p in retry):
        return retry[0] if len(retry) == 1 else Retries(tuple(retry))
    raise DefinitionError(
        f"@task(retry=...) of {name!r} must be a number of attempts, durably.Retry(...) or a "
        f"non-empty list of them, not {retry!r}. Fix: retry=3, "
        "retry=durably.Retry(attempts=3, backoff=2.0), or retry=[durably.Retry(on=(TimeoutError,"
        "), attempts=5), durably.Retry(attempts=2)] (the first matching a failure applies)")


def check_timeout(timeout: Any, name: str) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise DefinitionError(f"@task(timeout=...) of {name!r} must be a positive number of "
                              f"seconds, not {timeout!r}")
    return float(timeout)


def retrying(policy: Retry | Retries, never: tuple[type[BaseException], ...],
             is_async: bool) -> Any:
    """A tenacity ``Retrying`` (or ``AsyncRetrying``) for the policy (for several, the first
    matching each failure decides whether it is tried again and after how long)."""
    import tenacity

    def matched(state: Any) -> Retry | None:
        exc = state.outcome.exception() if state.outcome is not None else None
        return None if exc is None or isinstance(exc, never) else policy.for_error(exc)

    def stop(state: Any) -> bool:
        found = matched(state)
        return found is None or state.attempt_number >= found.attempts

    def wait(state: Any) -> float:
        found = matched(state)
        if found is None or not found.backoff:
            return 0.0
        return float(min(found.backoff * found.multiplier ** (state.attempt_number - 1),
                         found.max_backoff))

    def should_retry(exc: BaseException | None) -> bool:
        return (exc is not None and not isinstance(exc, never)
                and policy.for_error(exc) is not None)

    options: dict[str, Any] = {
        "stop": stop, "wait": wait, "retry": tenacity.retry_if_exception(should_retry),
        "reraise": True,
    }
    return tenacity.AsyncRetrying(**options) if is_async else tenacity.Retrying(**options)


def call_with_timeout(name: str, seconds: float, fn: Callable[..., Any],
                      args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Call a sync body in a worker thread (with the caller's context) and wait at most
    ``seconds``."""
    from durably._runtime.context import Cutoff, cutoff

    context = contextvars.copy_context()
    flag = Cutoff()
    context.run(cutoff.set, flag)
    box: dict[str, Any] = {}
    done = threading.Event()

    def target() -> None:
        try:
            box["value"] = context.run(fn, *args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            box["error"] = exc
        finally:
            done.set()

    deadline = time.monotonic() + seconds
    threading.Thread(target=target, name=f"durably-timeout-{name}", daemon=True).start()
    with Seceded():  # (on a Dask worker: the body's own maps may need this pool thread)
        finished = done.wait(max(deadline - time.monotonic(), 0.0))
    if not finished:
        flag.cut = True  # the tasks it calls from now on do not join the run
        raise TaskTimeoutError(
            f"task {name!r} did not finish within its timeout of {seconds:g} s. Its body "
            "keeps running in a background thread (Python cannot stop a sync function); "
            "its result will be discarded and the tasks it calls from now on are refused. "
            "Fix: raise timeout=, or make the task async (an async task is cancelled at "
            "its timeout).")
    if "error" in box:
        raise box["error"]
    return box["value"]


async def await_with_timeout(name: str, seconds: float, awaitable: Awaitable[Any]) -> Any:
    import asyncio  # (on a running loop: imported already; not at `import durably`)

    try:
        return await asyncio.wait_for(awaitable, seconds)
    except TimeoutError:
        raise TaskTimeoutError(
            f"task {name!r} did not finish within its timeout of {seconds:g} s and was "
            "cancelled. Fix: raise timeout=.") from None


#: per thread: how many waits of durably's are holding it out of a Dask worker's pool
_secession = threading.local()


class Seceded:
    """While durably waits in a body that itself runs on a Dask worker (a fan-out's items,
    a ``timeout=``'s thread), the thread leaves the worker's thread pool
    (``distributed.secede``) and rejoins it after (``distributed.rejoin``), as
    ``distributed.worker_client`` does: else every thread of the pool could be waiting for
    items that have no thread left to run on. Waits of one thread that overlap (maps
    gathered in an async body) rejoin once, after the last. Anywhere else (the client's
    process, a thread durably or the body started, a body the user seceded), nothing."""

    __slots__ = ("held",)

    def __init__(self) -> None:
        self.held = False

    def __enter__(self) -> None:
        depth = getattr(_secession, "depth", 0)
        if depth:
            _secession.depth = depth + 1
            self.held = True
            return
        # (never imported here: a Dask worker's process has it; importing it takes 0.3 s)
        distributed = sys.modules.get("distributed")
        if distributed is None or "distributed.worker" not in sys.modules:
            return
        # what distributed.worker_client looks at: set in the thread of a task a worker runs
        if not hasattr(getattr(distributed.worker, "thread_state", None), "start_time"):
            return
        try:
            distributed.secede()
        except (KeyError, AttributeError, ValueError):
            return  # seceded already (inside distributed.worker_client), or not a pool thread
        _secession.depth = 1
        self.held = True

    def __exit__(self, *exc: object) -> None:
        if not self.held:
            return
        self.held = False
        _secession.depth -= 1
        if _secession.depth == 0:
            import distributed

            # (waits until a thread of the pool finishes its task and leaves it this slot)
            distributed.rejoin()  # type: ignore[no-untyped-call]
