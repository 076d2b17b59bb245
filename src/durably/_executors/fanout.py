"""Fan-out of a task over many inputs: ``Task.map`` on threads, worker processes or a Dask
cluster, without giving up exact resume.

How a fan-out keeps exact resume (DESIGN.md, "step identity"):

1. In the caller's thread and in input order, each item goes through the call path up to
   execution (:func:`~durably._runtime.runtime.begin_step`). Its step identity (parent step, cache
   key, occurrence) is assigned there, before anything runs, so it never depends on
   completion order; items the journal has are replayed, items the cache has are served,
   right there.
2. Only the bodies of the missing items go to the executor.
3. Each result comes back to the caller's thread, which journals and caches it (or journals
   the failure) as it arrives, so a run killed halfway keeps every item that finished.
   (``submit`` has no caller loop to come back to: its future is settled, journal first, in
   the thread that saw the body finish: see :mod:`durably._executors.pools`.)

Where the bodies run is the executors' part (:mod:`durably._executors.pools`); what an item
is and how its body runs here, :mod:`durably._executors.items`. This module holds the map
itself: the scan in input order, the window of items in flight, the wait that finishes each
as it comes back, and the stop (Ctrl-C, a lost lease) that still journals what ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import queue
from collections import deque
from collections.abc import Callable, Iterable, Sized
from typing import Any

from durably._executors.items import (
    Target,
    _Failed,
    _Item,
    _journal_failure,
    _outcomes_of,
    _run_here_async,
)
from durably._executors.pools import Dask, Executor, Thread, _check_workers, _resolve_executor
from durably._executors.progress import _Progress, progress_enabled
from durably._executors.worker import _Outcome
from durably._runtime.call import _SERVED, begin_step, cached_now, serve_cached
from durably._runtime.context import RunContext, StopRun, cutoff
from durably._runtime.failures import ReplayedFailure
from durably._runtime.interrupt import InterruptSignal
from durably._runtime.retry import Seceded
from durably._runtime.spec import Spec
from durably._runtime.step import _MISS
from durably._store.lease import RENEW_SECONDS
from durably.exceptions import DefinitionError

__all__ = ["map_async", "map_sync"]

log = logging.getLogger("durably")

_WAKE = min(5.0, RENEW_SECONDS / 2)  # seconds: the caller renews the run's lease this often
_STOP_WAKE = 0.5  # seconds: after a stop, how often the wait looks for bodies ended unseen


# -- the fan-out ----------------------------------------------------------------------------
def _items(iterables: tuple[Iterable[Any], ...], name: str) -> list[tuple[Any, ...]]:
    if not iterables:
        raise TypeError(f"{name}.map() needs at least one iterable of inputs")
    for i, it in enumerate(iterables):
        try:
            iter(it)  # (an iterator, a generator: itself, nothing read)
        except TypeError:
            shown = repr(it)[:40]
            raise DefinitionError(
                f"{name}.map() takes iterables of inputs (one per parameter, like map()); "
                f"argument {i + 1} is {shown}, of type {type(it).__name__}. Fix: "
                f"{name}.map([{shown}]) for one call, or {name}.map(range(...)).") from None
    if len(iterables) == 1:
        return [(arg,) for arg in iterables[0]]
    lengths = [len(it) if isinstance(it, Sized) else "?" for it in iterables]
    try:  # (never reads an endless one, itertools.repeat(x), past the others' end)
        return list(zip(*iterables, strict=True))
    except ValueError:
        raise DefinitionError(
            f"{name}.map() was given iterables of different lengths {lengths} ('?': an "
            "iterator): the items past the shortest would be dropped (the built-in map() "
            "and zip() do so silently). Fix: give iterables of one length (a constant "
            "argument: [value] * n rather than itertools.repeat(value), or "
            "functools.partial / a default in the task).") from None




def _scan(target: Target, items: list[tuple[Any, ...]], fan: _FanOut) -> list[_Item]:
    """Step 1 of a fan-out, in the caller's thread and in input order: step identities,
    replays and cache hits. Returns the items whose bodies must run: of several items with
    one cache key, the first; the others wait for it (see :meth:`_FanOut.settle_waiting`)."""
    spec, instance = target.spec, target.instance
    results, bar = fan.results, fan.bar
    missing = []
    first: dict[str, _Item] = {}
    for index, args in enumerate(items):
        try:
            value, call = begin_step(spec, instance, args, {})
        except ReplayedFailure as replayed_failure:  # (its failure, from the journal)
            fan.failures[index] = replayed_failure.error
            bar.counts["failed"] += 1
            continue
        if value is _MISS:
            item = _Item(index, call, args, {})
            # (a cache=False task's every call is its own side effect; a fork's first attempt
            # reads no cache: its duplicates would wait for nothing)
            if spec.cache and (call.ctx is None or call.ctx.read_cache):
                primary = first.setdefault(call.key, item)
                if primary is not item:
                    fan.waiting.setdefault(primary.index, []).append(item)
                    continue
            missing.append(item)
            continue
        results[index] = value
        replayed = call is _SERVED
        bar.counts["replayed" if replayed else "cached"] += 1
    return missing


class _FanOut:
    """The bookkeeping of one ``map``: results in input order, failures, progress."""

    __slots__ = ("abandoned", "bar", "failures", "results", "spec", "total", "waiting")

    def __init__(self, spec: Spec, total: int, progress: bool) -> None:
        #: a second Ctrl-C stopped the wait for the bodies still running
        self.abandoned = False
        #: items with the cache key of an earlier item, by that item's index: served from
        #: the cache once it finishes, as a second call of the task would be
        self.waiting: dict[int, list[_Item]] = {}
        self.spec = spec
        self.total = total
        self.results: list[Any] = [None] * total
        self.failures: dict[int, BaseException] = {}
        self.bar = _Progress(spec.name, total, progress)

    def finish(self, item: _Item, outcome: _Outcome) -> None:
        """Journal and cache one item's result (or journal its failure), as it arrives."""
        call = item.call
        if outcome.started is not None:
            call.started = outcome.started
        if outcome.ended is not None:
            call.ended = outcome.ended
        if outcome.journaled:
            if outcome.ok:
                self.results[item.index] = outcome.value
            else:
                self.failures[item.index] = outcome.value
            self.bar.count("ran" if outcome.ok else "failed")
            return
        if outcome.ok:
            try:
                self.results[item.index] = call.succeeded(outcome.value)
            except Exception as exc:  # noqa: BLE001 - the result cannot be stored: a failure
                self.failures[item.index] = exc
                self.bar.count("failed")
                return
            self.bar.count("ran")
        else:
            _journal_failure(call, outcome.value)
            self.failures[item.index] = outcome.value
            self.bar.count("failed")

    def settle_waiting(self, item: _Item) -> list[_Item]:
        """After ``item`` finished: serve the items waiting for it from the cache, as a
        second call of the task with those inputs would be. Returns those that must run
        after all (it failed, or its result was not cached): the first of them, the
        others waiting for it in turn."""
        waiting = self.waiting.pop(item.index, None)
        if not waiting:
            return []
        if item.index not in self.failures:
            for other in list(waiting):
                found = cached_now(other.call)
                if found is None:
                    continue
                try:
                    value = serve_cached(other.call, *found)
                except Exception as exc:  # noqa: BLE001 - (cannot journal it): its failure
                    waiting.remove(other)
                    self.failures[other.index] = exc
                    self.bar.count("failed")
                    continue
                if value is _MISS:  # (cannot load it: set aside) it runs after all
                    continue
                waiting.remove(other)
                self.results[other.index] = value
                self.bar.count("cached")
            if not waiting:
                return []
        if len(waiting) > 1:
            self.waiting[waiting[0].index] = waiting[1:]
        return waiting[:1]

    def raise_failures(self) -> None:
        """A stop (``StopRun``, ``KeyboardInterrupt``, ``SystemExit`` in an item) propagates
        as it is. Else interrupts win: one :class:`InterruptSignal` with every item's
        interrupts, in input order (other failures are journaled and named in a note). Else
        the failures, in input order, as one exception group."""
        if not self.failures:
            return
        ordered = [self.failures[i] for i in sorted(self.failures)]
        stops = [e for e in ordered if not isinstance(e, (Exception, InterruptSignal))]
        if stops:
            raise stops[0]
        signals = [e for e in ordered if isinstance(e, InterruptSignal)]
        errors = [e for e in ordered if not isinstance(e, InterruptSignal)]
        name, total = self.spec.name, self.total
        if signals:
            signal = signals[0] if len(signals) == 1 else InterruptSignal(
                [i for s in signals for i in s.interrupts])
            if errors:
                shown = "; ".join(repr(e)[:200] for e in errors[:5])
                signal.add_note(
                    f"durably: besides the interrupts, {len(errors)} item(s) of {name!r} failed "
                    f"(journaled; a rerun retries them): {shown}"
                )
            raise signal
        kept = total - len(errors)
        raise BaseExceptionGroup(
            f"{len(errors)} of {total} items of {name!r} failed; the {kept} that finished "
            "are kept, so a rerun executes only the failed and missing items",
            errors,
        )


def _take(batch: list[tuple[_Item, Any]], ex: Executor | None, fan: _FanOut,
          inflight: dict[int, _Item], outcomes: list[_Outcome] | None = None) -> list[_Item]:
    """Finish a batch of completed items (``outcomes`` already computed, or computed here).
    Returns the items that waited for them and must run now (see
    :meth:`_FanOut.settle_waiting`)."""
    failed = [(item, h) for item, h in batch if isinstance(h, _Failed)]
    done = [(item, h) for item, h in batch if not isinstance(h, _Failed)]
    if outcomes is None:
        outcomes = _outcomes_of(ex, done)
    again: list[_Item] = []
    for (item, _), outcome in zip(done, outcomes, strict=True):
        inflight.pop(item.index, None)
        fan.finish(item, outcome)
        again += fan.settle_waiting(item)
    for item, handle in failed:
        inflight.pop(item.index, None)
        fan.finish(item, _Outcome(False, handle.exc, None))
        again += fan.settle_waiting(item)
    return again

def _stopping(ctx: RunContext | None, parent: str | None) -> bool:
    """Whether a map under ``parent`` must start no more items: its run is stopping (a
    closed stream, a lost lease), it is inside an item of a map that is stopping (Ctrl-C),
    or inside a body abandoned by its timeout."""
    abandoned = cutoff.get()
    if abandoned is not None and abandoned.cut:
        return True
    return ctx is not None and (ctx.stop or (bool(ctx.halting) and ctx.halted(parent)))


def _halt(ctx: RunContext | None, inflight: dict[int, _Item]) -> list[str]:
    """Mark the items of a stopping map whose bodies still run: nothing inside them starts
    any more (see :meth:`RunContext.halted`). Returns the marks, for :func:`_unhalt`."""
    if ctx is None:
        return []
    marks = [item.call.step_id for item in inflight.values()]
    ctx.halting.update(marks)
    return marks


def _unhalt(ctx: RunContext | None, marks: list[str]) -> None:
    """The bodies of a stopping map ended: take their marks back (the run may go on, if the
    caller handles the stop)."""
    if ctx is not None:
        ctx.halting.difference_update(marks)


def _drain(inbox: queue.SimpleQueue[tuple[_Item, Any]]) -> list[tuple[_Item, Any]]:
    batch = []
    while True:
        try:
            batch.append(inbox.get_nowait())
        except queue.Empty:
            return batch


# the states of a concurrent.futures (or asyncio) future that has ended, and that was cancelled
_ENDED = frozenset({"FINISHED", "CANCELLED", "CANCELLED_AND_NOTIFIED"})
_CANCELLED = frozenset({"CANCELLED", "CANCELLED_AND_NOTIFIED"})


def _in_state(handle: Any, states: frozenset[str], ask: Callable[[], bool]) -> bool:
    """Whether a future's state is one of ``states``, read without taking its lock.

    After a Ctrl-C the wait asks this of running futures while a second Ctrl-C may land.
    ``Future.done()`` and ``cancelled()`` take the future's condition in a ``with`` block: a
    KeyboardInterrupt raised between the lock's acquire and the block's start leaves it held
    for ever, and the worker thread finishing that future then blocks in ``set_result`` (the
    interpreter's exit hangs joining it). The state is one attribute, read atomically; a
    future of another kind (Dask's) is asked (``ask``)."""
    state = getattr(handle, "_state", None)
    return state in states if type(state) is str else ask()


def _not_cancelled(batch: list[tuple[_Item, Any]]) -> list[tuple[_Item, Any]]:
    return [(i, h) for i, h in batch
            if isinstance(h, _Failed) or not _in_state(h, _CANCELLED, h.cancelled)]


def _ended_unseen(inflight: dict[int, _Item]) -> list[tuple[_Item, Any]]:
    """After a stop: items whose body ended but whose message never came (lost to a Ctrl-C,
    or a callback never attached), taken as they are."""
    return [(i, i.handle) for i in list(inflight.values())
            if i.handle is not None and _in_state(i.handle, _ENDED, i.handle.done)]


def _unended(inflight: dict[int, _Item]) -> int:
    """How many items in flight have not ended: after a stop cancelled the items not
    started, the bodies running (and, on worker processes, those already queued for the
    workers, which cannot be cancelled any more). An item cancelled or ended stays in
    ``inflight`` until its message is taken: it is not counted."""
    return sum(1 for i in inflight.values()
               if i.handle is None or not _in_state(i.handle, _ENDED, i.handle.done))


def _still_waited(batch: list[tuple[_Item, Any]], inflight: dict[int, _Item],
                  stopping: bool) -> list[tuple[_Item, Any]]:
    """The batch without items taken already (a message that came after the item was found
    done) and, after a stop, without the items it cancelled (never started: nothing to
    journal), which are no longer waited for."""
    batch = [(i, h) for i, h in batch if inflight.get(i.index) is i]
    if not stopping:
        return batch
    kept = _not_cancelled(batch)
    if len(kept) < len(batch):
        for item, handle in batch:
            if not isinstance(handle, _Failed) and _in_state(handle, _CANCELLED,
                                                             handle.cancelled):
                inflight.pop(item.index, None)
    return kept


def _put_back(batch: list[tuple[_Item, Any]], inflight: dict[int, _Item],
              put: Callable[[tuple[_Item, Any]], Any]) -> None:
    """The messages of a batch's items not taken yet go back to the inbox (else a Ctrl-C
    landing while it was taken would leave the wait for them endless)."""
    for item, handle in batch:
        if inflight.get(item.index) is item:
            put((item, handle))


def map_sync(target: Target, iterables: tuple[Iterable[Any], ...], executor: Any,
             max_workers: int | None, progress: bool | None) -> list[Any]:
    """``Task.map`` for a sync task: see :meth:`durably.Task.map`."""
    enabled = progress_enabled(progress)
    ex, owned = _resolve_executor(executor, max_workers)
    clean = False
    fan: _FanOut | None = None
    try:
        items = _items(iterables, target.spec.name)
        fan = _FanOut(target.spec, len(items), enabled)
        try:
            missing = _scan(target, items, fan)
            if missing:
                ex._prepare()
                fan.bar.start()
                window = max_workers if max_workers is not None else ex._window()
                with Seceded():  # (on a Dask worker: out of its pool while it waits)
                    _drive(ex, target, missing, fan, window)
        finally:
            fan.bar.close()
        clean = True
    finally:
        if owned:
            # after a failure or Ctrl-C too, the attempt ends only once the bodies still
            # running have ended (the items not started are dropped): else the next call of
            # the run would execute them again while they run. _drive waited for them already
            # (journaling each), unless a second Ctrl-C stopped that wait: then not again
            ex.shutdown(wait=fan is None or not fan.abandoned, cancel_futures=not clean)
    fan.raise_failures()
    return fan.results


def _drive(ex: Executor, target: Target, missing: list[_Item], fan: _FanOut,
           window: int | None) -> None:
    """Steps 2 and 3 of a fan-out: dispatch the missing bodies (at most ``window`` at once)
    and finish each as it comes back, in this thread."""
    inbox: queue.SimpleQueue[tuple[_Item, Any]] = queue.SimpleQueue()
    todo = deque(missing)
    inflight: dict[int, _Item] = {}
    ctx = missing[0].call.ctx
    parent = missing[0].call.parent
    if ctx is not None and not isinstance(ex, Thread):
        ctx.flush_cache()  # workers read the store: the run's queued results first

    def done(item: _Item, handle: Any) -> None:
        inbox.put((item, handle))

    def fill() -> None:
        if todo and _stopping(ctx, parent):
            raise StopRun()
        while todo and (window is None or len(inflight) < window):
            item = todo.popleft()
            inflight[item.index] = item
            try:
                ex._start(item, target, done)
            except Exception as exc:  # noqa: BLE001 - cannot be sent: that item's failure
                inbox.put((item, _Failed(exc)))
            except BaseException:
                # (Ctrl-C while it was sent) not sent: not waited for; sent, perhaps without
                # its callback: the stop's wait finds it done (see collect)
                if item.handle is None:
                    inflight.pop(item.index, None)
                raise

    def collect(stopping: bool = False) -> None:
        while inflight:
            batch: list[tuple[_Item, Any]] = []
            try:
                try:
                    batch.append(inbox.get(timeout=_STOP_WAKE if stopping else _WAKE))
                    empty = False
                except queue.Empty:
                    empty = True
                if empty:  # (outside the handler: a Ctrl-C here is not "during Empty")
                    if ctx is not None:
                        ctx.keep_lease()
                    if not stopping:
                        continue
                    batch = _ended_unseen(inflight)
                batch = _still_waited([*batch, *_drain(inbox)], inflight, stopping)
                again = _take(batch, ex, fan, inflight)
                if not stopping:
                    todo.extendleft(reversed(again))
            except BaseException:
                _put_back(batch, inflight, inbox.put)
                raise
            if ctx is not None:
                ctx.keep_lease()
            fill()

    try:
        fill()
        collect()
    except BaseException as stop:
        # Ctrl-C, or the store failed: start nothing more. The bodies already running end
        # before the attempt does, and each one that finishes is journaled as it ends, so a
        # rerun never executes it again. A second Ctrl-C kills worker processes; bodies on
        # threads cannot be stopped (the process ends only once they have), so not waiting
        # would only lose their results: they are waited for whatever comes
        todo.clear()
        marks = _halt(ctx, inflight)
        ex._cancel(list(inflight.values()))
        name = target.spec.name
        if isinstance(stop, KeyboardInterrupt) and inflight:
            running, queued = ex._running(_unended(inflight))
            log.warning("durably: Ctrl-C: %r starts nothing more; waiting for its %d running "
                        "bodies%s to finish, journaling each (%s)", name, running,
                        f" (and {queued} queued on the workers, too late to cancel)"
                        if queued else "",
                        "Ctrl-C again to kill the worker processes" if ex._stoppable() else
                        "bodies on threads cannot be stopped")
        told = False
        while True:
            try:
                collect(stopping=True)
            except Exception as exc:  # noqa: BLE001 - the first error is the one to report
                log.warning("durably: could not journal the finished items of %r: %s",
                            name, exc)
            except BaseException:
                if not ex._stoppable() and inflight:
                    if not told:
                        told = True
                        log.warning(
                            "durably: the %d running bodies of %r are on threads, which "
                            "cannot be stopped: the process ends only once they have, so "
                            "they are waited for and journaled. To stop now, kill the "
                            "process (kill -9 %d): those items then execute again on the "
                            "next call", _unended(inflight), name, os.getpid())
                    continue
                fan.abandoned = True  # (its bodies run on, or are killed: their marks stay)
                ex._stop_running()  # worker processes: killed, so the process ends now
                raise
            break
        _unhalt(ctx, marks)
        raise


async def map_async(target: Target, iterables: tuple[Iterable[Any], ...], executor: Any,
                    max_workers: int | None, progress: bool | None) -> list[Any]:
    """``Task.map`` for an async task: see :meth:`durably.Task.map`."""
    enabled = progress_enabled(progress)
    ex: Executor | None
    owned = False
    if executor is None or executor == "thread" or isinstance(executor, Thread):
        ex = None  # coroutines gathered on this event loop
        window = _check_workers(max_workers)
        if window is None and isinstance(executor, Thread):
            window = executor.max_workers
    else:
        ex, owned = _resolve_executor(executor, max_workers)
        window = max_workers if max_workers is not None else ex._window()
    items = _items(iterables, target.spec.name)
    fan = _FanOut(target.spec, len(items), enabled)
    try:
        missing = _scan(target, items, fan)
        if missing:
            if ex is not None:
                ex._prepare()
            fan.bar.start()
            with contextlib.nullcontext() if ex is None else Seceded():
                await _drive_async(ex, target, missing, fan, window)
    finally:
        fan.bar.close()
        if owned and ex is not None:
            ex.shutdown(wait=not fan.abandoned)
    fan.raise_failures()
    return fan.results


async def _drive_async(ex: Executor | None, target: Target, missing: list[_Item],
                       fan: _FanOut, window: int | None) -> None:
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[tuple[_Item, Any]] = asyncio.Queue()
    todo = deque(missing)
    inflight: dict[int, _Item] = {}
    ctx = missing[0].call.ctx
    parent = missing[0].call.parent
    if ctx is not None and ex is not None and not isinstance(ex, Thread):
        ctx.flush_cache()  # workers read the store: the run's queued results first

    def done(item: _Item, handle: Any) -> None:  # from a worker's thread
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            loop.call_soon_threadsafe(inbox.put_nowait, (item, handle))

    def start(item: _Item) -> None:
        if ex is not None:
            ex._start(item, target, done)
            return
        coro = _run_here_async(item.call, target.local, item.args, item.kwargs)
        task = loop.create_task(coro, context=contextvars.copy_context())
        item.handle = task
        task.add_done_callback(lambda t: inbox.put_nowait((item, t)))

    def fill() -> None:
        if todo and _stopping(ctx, parent):
            raise StopRun()
        while todo and (window is None or len(inflight) < window):
            item = todo.popleft()
            inflight[item.index] = item
            try:
                start(item)
            except Exception as exc:  # noqa: BLE001 - cannot be sent: that item's failure
                inbox.put_nowait((item, _Failed(exc)))
            except BaseException:  # (cancelled while it was sent) as in _drive's fill
                if item.handle is None:
                    inflight.pop(item.index, None)
                raise

    def drain() -> list[tuple[_Item, Any]]:
        batch = []
        while not inbox.empty():
            batch.append(inbox.get_nowait())
        return batch

    async def take(batch: list[tuple[_Item, Any]]) -> list[_Item]:
        done_ = [(i, h) for i, h in batch if not isinstance(h, _Failed)]
        if isinstance(ex, Dask):  # gathering results waits on the network: not on the loop
            outcomes = await loop.run_in_executor(None, _outcomes_of, ex, done_)
        else:
            outcomes = _outcomes_of(ex, done_)
        return _take(batch, ex, fan, inflight, outcomes)

    async def collect(stopping: bool = False) -> None:
        while inflight:
            batch: list[tuple[_Item, Any]] = []
            try:
                try:
                    batch.append(await asyncio.wait_for(inbox.get(),
                                                        _STOP_WAKE if stopping else _WAKE))
                except TimeoutError:
                    if ctx is not None:
                        ctx.keep_lease()
                    if not stopping:
                        continue
                    batch = _ended_unseen(inflight)
                batch = _still_waited([*batch, *drain()], inflight, stopping)
                again = await take(batch)
                if not stopping:
                    todo.extendleft(reversed(again))
            except BaseException:
                _put_back(batch, inflight, inbox.put_nowait)
                raise
            if ctx is not None:
                ctx.keep_lease()
            fill()

    try:
        fill()
        await collect()
    except BaseException as stop:
        # as in _drive: nothing more starts, and the bodies still running on workers are
        # journaled as they end; a coroutine here is cancelled, unless the run stops at a
        # step boundary (StopRun: a closed stream, a lost lease): it finishes and is
        # journaled, as a thread's body does. Cancelling again stops waiting
        todo.clear()
        marks = _halt(ctx, inflight)
        if ex is None:
            if not isinstance(stop, StopRun):
                for item in inflight.values():
                    item.handle.cancel()
        else:
            ex._cancel(list(inflight.values()))
        try:
            await collect(stopping=True)
        except Exception as exc:  # noqa: BLE001 - the first error is the one to report
            log.warning("durably: could not journal the finished items of %r: %s",
                        target.spec.name, exc)
        except BaseException:  # cancelled while the bodies finish: they are cancelled now
            if ex is None:
                for item in inflight.values():
                    item.handle.cancel()
            raise
        # (cancelled again: it stops waiting, and the marks of the bodies left running stay)
        _unhalt(ctx, marks)
        raise
