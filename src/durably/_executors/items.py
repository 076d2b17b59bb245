"""The items of a fan-out (``Task.map``) or of a submitted call (``Task.submit``): what runs
(the task's :class:`Target`), one missing item, running an item's body in this process, and
reading an item's outcome back (journaling a failed body as the plain call path does).

Separate from the executors and submit (:mod:`durably._executors.pools`) and from the
fan-out (:mod:`durably._executors.fanout`) because both use these: an executor runs an
item's body, the fan-out and submit finish it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from durably._executors.worker import _describe_store, _Outcome, _pack
from durably._runtime.call import _acall_with_policy, _call_with_policy
from durably._runtime.context import StopRun, current_step
from durably._runtime.interrupt import InterruptSignal
from durably._runtime.spec import Spec
from durably._runtime.step import Call
from durably._store.records import now
from durably.store import Store

if TYPE_CHECKING:
    from durably._executors.pools import Executor

__all__ = ["Target"]


# -- what runs ------------------------------------------------------------------------------
class Target:
    """What a fan-out runs: the task's spec, its body for this process, the instance it is
    bound to, and a reference to the body that travels to worker processes."""

    __slots__ = ("_heads", "instance", "local", "ref", "spec")

    def __init__(self, spec: Spec, local: Callable[..., Any], instance: Any,
                 ref: tuple[Any, bool, Any, Any]) -> None:
        self.spec = spec
        self.local = local  # the body, called here (thread executor)
        self.instance = instance  # passed to begin_step, as a plain call would
        self.ref = ref  # (task, bound, instance, owner): the body in another process
        self._heads: dict[int, bytes] = {}  # by store (alive as long as the fan-out)

    def head(self, store: Store) -> bytes:
        """The pickled body reference and store description sent with every job."""
        head = self._heads.get(id(store))
        if head is None:
            where = _describe_store(store)
            head = _pack((self.ref, where), what=f"task {self.spec.name!r}")
            self._heads[id(store)] = head
        return head


class _Item:
    """One missing item of a fan-out: its position in the input, its call, its arguments."""

    __slots__ = ("args", "call", "handle", "index", "kwargs")

    def __init__(self, index: int, call: Call, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> None:
        self.index = index
        self.call = call
        self.args = args
        self.kwargs = kwargs
        self.handle: Any = None


class _Journaled:
    """What a thread returns for a task with ``retry=`` / ``timeout=``: the runtime's own
    policy loop ran the body and journaled every try and the result already."""

    __slots__ = ("ok", "value")

    def __init__(self, ok: bool, value: Any) -> None:
        self.ok = ok
        self.value = value


class _Failed:
    """The handle of an item that could not be dispatched at all."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


Done = Callable[[_Item, Any], None]


# -- running a body ---------------------------------------------------------------------------
def _run_here(call: Call, fn: Callable[..., Any], args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> Any:
    """The body of one item in a thread, inside a copy of the caller's context: tasks it
    calls are child steps of the item's step. A body that had not started when its run
    was told to stop (its entrypoint failed, durably.cancel_run) does not start."""
    ctx = call.ctx
    if ctx is not None:
        if ctx.stop:
            raise StopRun()
        current_step.set(call.step_id)
        ctx.items.enter(ctx, call.step_id, call)  # (for interrupt(): the step asking)
    call.started = now()
    spec = call.spec
    try:
        if spec.retry is not None or spec.timeout is not None:
            try:
                return _Journaled(True, _call_with_policy(spec, call, fn, args, kwargs))
            except BaseException as exc:  # noqa: BLE001 - journaled already: an outcome
                return _Journaled(False, exc)
        try:
            return fn(*args, **kwargs)
        finally:
            call.ended = now()  # the step's time is the body's, not its wait to be journaled
    finally:
        if ctx is not None:
            ctx.items.pop(call.step_id, None)


async def _run_here_async(call: Call, fn: Callable[..., Any], args: tuple[Any, ...],
                          kwargs: dict[str, Any]) -> Any:
    """The body of one async item, in a task of the caller's event loop: as
    :func:`_run_here` (registered as executing, for the steps it calls and interrupt())."""
    ctx = call.ctx
    if ctx is not None:
        current_step.set(call.step_id)
        ctx.items.enter(ctx, call.step_id, call)
    call.started = now()
    spec = call.spec
    try:
        if spec.retry is not None or spec.timeout is not None:
            try:
                return _Journaled(True, await _acall_with_policy(spec, call, fn, args, kwargs))
            except BaseException as exc:  # noqa: BLE001 - journaled already: an outcome
                return _Journaled(False, exc)
        try:
            return await fn(*args, **kwargs)
        finally:
            call.ended = now()
    finally:
        if ctx is not None:
            ctx.items.pop(call.step_id, None)


def _future_outcome(future: Any) -> _Outcome:
    if isinstance(future, _Failed):
        return _Outcome(False, future.exc, None)
    exc = future.exception() if isinstance(future, asyncio.Future) else future.exception(0)
    if exc is not None:
        return _Outcome(False, exc, None)
    result = future.result()
    if isinstance(result, _Journaled):
        return _Outcome(result.ok, result.value, None, True)
    return _Outcome(True, result, None)

def _outcomes_of(ex: Executor | None, done: list[tuple[_Item, Any]]) -> list[_Outcome]:
    if not done:
        return []
    if ex is None:  # asyncio tasks on this loop
        return [_future_outcome(h) for _, h in done]
    return ex._outcomes(done)

def _journal_failure(call: Call, exc: BaseException) -> None:
    """Journal a body's failure as the plain call path does (an interrupt is not one)."""
    if isinstance(exc, InterruptSignal):
        call.interrupted(exc)
    else:
        call.failed(exc)
