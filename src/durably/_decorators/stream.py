"""``Entrypoint.stream()``: a run's live events passed to the caller's loop as they happen,
from a worker thread in lockstep with the loop (sync) or from an asyncio task (async), and
the run stopped when the loop is left.

Separate from :mod:`.entrypoint`: the listener, the queue and the thread or task that
carry events to the consumer are machinery of their own; the run itself is the
entrypoint's (``_self_srun``, ``_self_arun``).
"""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any, NoReturn

from durably._runtime.context import StopRun
from durably._trace.tracer import Event
from durably.exceptions import DefinitionError

if TYPE_CHECKING:
    from durably._decorators.entrypoints import Entrypoint


class _Listener:
    """Passes a run's live events on, and can ask the run to stop.

    With ``lockstep``, the thread that emits an event waits until the consumer asks for the
    next one, so the run never gets ahead of the loop that reads it (a ``break`` stops the
    run right after the event the consumer saw)."""

    __slots__ = ("_ack", "closed", "ctx", "put")

    def __init__(self, put: Callable[[Event], Any], lockstep: bool = False) -> None:
        self.put = put
        self.ctx: Any = None
        self.closed = False
        self._ack = threading.Semaphore(0) if lockstep else None

    def __call__(self, event: Event) -> None:
        if self.closed:
            return
        self.put(event)
        if self._ack is not None:
            self._ack.acquire()

    def next(self) -> None:
        """The consumer wants the next event."""
        if self._ack is not None:
            self._ack.release()

    def stop(self) -> None:
        self.closed = True
        ctx = self.ctx
        if ctx is not None:
            ctx.stop = True
        if self._ack is not None:
            # wake every emitting thread (a fan-out, parallel nodes: each may be waiting)
            self._ack.release(max(64, threading.active_count()))


_DONE: Any = object()


def _stream_sync(ep: Entrypoint[Any, Any], wrapped: Any, instance: Any, args: Any,
                 kwargs: Any, run_id: str | None, fresh: bool, on_lease: Any = None,
                 thread: str | None = None) -> Iterator[Event]:
    events: queue.SimpleQueue[Any] = queue.SimpleQueue()
    listener = _Listener(events.put, lockstep=True)
    failure: list[BaseException] = []

    def work() -> None:
        try:
            ep._self_srun(wrapped, instance, args, kwargs, run_id, fresh, True, listener,
                          on_lease=on_lease, thread=thread)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the consumer
            failure.append(exc)
        finally:
            listener.closed = True
            events.put(_DONE)

    context = contextvars.copy_context()  # the caller's context vars, as .run() would see them
    worker = threading.Thread(target=context.run, args=(work,), name="durably-stream",
                              daemon=True)
    worker.start()
    try:
        while True:
            event = events.get()
            if event is _DONE:
                break
            yield event
            listener.next()
    finally:
        listener.stop()
        worker.join()
    if failure and not isinstance(failure[0], StopRun):
        raise failure[0]


class _AsyncStream:
    """What ``stream()`` of an async entrypoint returns: its async generator of events (``async
    for``, ``contextlib.aclosing``, ``aclose``), which a plain ``for`` refuses naming the fix
    (Python's own error said only that an async generator is not iterable)."""

    __slots__ = ("agen", "name")

    def __init__(self, name: str, agen: Any) -> None:
        self.name, self.agen = name, agen

    def __aiter__(self) -> Any:
        return self.agen.__aiter__()

    def __anext__(self) -> Any:
        return self.agen.__anext__()

    def asend(self, value: Any) -> Any:
        return self.agen.asend(value)

    def athrow(self, *exc: Any) -> Any:
        return self.agen.athrow(*exc)

    def aclose(self) -> Any:
        return self.agen.aclose()

    def __iter__(self) -> NoReturn:
        raise DefinitionError(
            f"{self.name}.stream() of an async entrypoint is an async iterator. Fix: "
            f"`async for event in {self.name}.stream(...)` inside a coroutine (close it "
            "with contextlib.aclosing), or make the entrypoint a plain def.")


async def _stream_async(ep: Entrypoint[Any, Any], wrapped: Any, instance: Any, args: Any,
                        kwargs: Any, run_id: str | None, fresh: bool, on_lease: Any = None,
                        thread: str | None = None) -> AsyncIterator[Event]:
    import asyncio  # (on a running loop: imported already; not at `import durably`)

    loop = asyncio.get_running_loop()
    events: asyncio.Queue[Any] = asyncio.Queue()
    listener = _Listener(lambda event: loop.call_soon_threadsafe(events.put_nowait, event))

    async def work() -> None:
        try:
            await ep._self_arun(wrapped, instance, args, kwargs, run_id, fresh, True, listener,
                                on_lease=on_lease, thread=thread)
        finally:
            loop.call_soon_threadsafe(events.put_nowait, _DONE)

    job = asyncio.ensure_future(work())
    try:
        while True:
            event = await events.get()
            if event is _DONE:
                break
            yield event
    finally:
        listener.stop()
        await asyncio.wait([job])
        if not job.cancelled():
            job.exception()  # retrieved: a StopRun after a break is expected, not an error
    exc = None if job.cancelled() else job.exception()
    if exc is not None and not isinstance(exc, StopRun):
        raise exc
