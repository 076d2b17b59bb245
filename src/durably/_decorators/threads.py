"""Conversation threads: an entrypoint called again and again on one thread
(``chat.run(message, thread="t1")``), each call a run of its own that sees what the thread's
last finished call saved (its ``previous`` parameter), as LangGraph's functional API does.

Which run a thread call is (:func:`resolve`): the thread's calls of an entrypoint are numbered,
their run ids ``<entrypoint>-<digest>@<thread>.<n>``. A call with the arguments of the
thread's latest call that did not finish (crashed, failed, stopped, or executing right now)
continues it; any other call is the next one, given the value saved by the thread's latest
finished call.
The value passed as ``previous`` is part of the run's stored arguments, so a resumed call sees
the same ``previous`` as its first attempt did. :class:`Final` separates what a call returns
from what it saves.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Generic, TypeVar

import xxhash

from durably._keys import serde as _serde
from durably._runtime.context import RunContext
from durably._runtime.run import Run, executing
from durably._runtime.spec import Spec
from durably._store.records import EventRecord, RunRecord, now
from durably.exceptions import DefinitionError, RunBusyError, RunStateError, SerializationError
from durably.store import Store

__all__ = ["PREVIOUS", "SAVED", "Final", "check_previous", "resolve", "save_final",
           "thread_option"]

#: the parameter of an entrypoint that receives the thread's previous saved value
PREVIOUS = "previous"

#: the kind of the event that journals a call's saved value (:class:`Final`'s ``save``)
SAVED = "saved"

_THREAD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:+=-]{0,99}")

V = TypeVar("V")
S = TypeVar("S")


@dataclasses.dataclass(frozen=True)
class Final(Generic[V, S]):
    """What an entrypoint returns to say: give ``value`` to the caller, and save ``save`` as
    what the next call on the same thread receives as ``previous`` (LangGraph's
    ``entrypoint.final``; also reachable as ``durably.entrypoint.final``).

    Without it, the next call receives the returned value itself. The run's result
    (:attr:`Run.result <durably.Run.result>`) is ``value``; ``save`` is journaled with the
    run (it must pickle).

    Attributes:
        value: The call's result.
        save: What the next call on the thread receives as ``previous``.

    Example:
        >>> import durably, tempfile
        >>> @durably.entrypoint(store=durably.DiskStore(tempfile.mkdtemp()))
        ... def count(word, *, previous=None):
        ...     total = (previous or 0) + len(word)
        ...     return durably.Final(value=f"{word}: {total}", save=total)
        >>> count.run("ab", thread="t").result, count.run("cde", thread="t").result
        ('ab: 2', 'cde: 5')
    """

    value: V
    save: S


def thread_option(thread: Any, run_id: Any, fresh: Any) -> str | None:
    """``thread=`` of a call, checked: None, or a thread id (1 to 100 letters, digits and
    ``. _ : + = -``, starting with a letter or digit), given without ``run_id``/``fresh``.

    Raises:
        DefinitionError: it is not such a str, or ``run_id`` or ``fresh=True`` is given too.
    """
    if thread is None:
        return None
    if not isinstance(thread, str) or not _THREAD.fullmatch(thread):
        raise DefinitionError(
            f"invalid thread {thread!r}: use 1 to 100 letters, digits and . _ : + = -, "
            "starting with a letter or digit (for example thread=\"user-42\").")
    if run_id is not None or fresh is not False:
        raise DefinitionError(
            f"thread={thread!r} is given with {'run_id' if run_id is not None else 'fresh'}"
            "=...: a call on a thread is the thread's next run (or continues its unfinished "
            "latest one), named by the thread. Fix: leave run_id and fresh out, or call "
            "without thread= for a run of your own naming.")
    return thread


def check_previous(spec: Spec) -> None:
    """Refuse an entrypoint whose ``previous`` parameter is not keyword-only.

    Raises:
        DefinitionError: it is positional (a call's own arguments could fill it).
    """
    param = spec.signature.parameters.get(PREVIOUS)
    if param is not None and param.kind is not param.KEYWORD_ONLY:
        raise DefinitionError(
            f"@entrypoint {spec.name!r} has a parameter 'previous' that is not keyword-only; "
            "a call on a thread passes the thread's previous saved value to it by name. Fix: "
            "make it keyword-only with a default: def f(message, *, previous=None).")


def _number(spec: Spec, thread: str, rec: RunRecord) -> int:
    """The number of a thread call's run on its thread (0 for a run that is not one)."""
    prefix = f"{_prefix(spec)}@{thread}."
    tail = rec.run_id[len(prefix):] if rec.run_id.startswith(prefix) else ""
    return int(tail) if tail.isdigit() else 0


def _prefix(spec: Spec) -> str:
    """The run ids' prefix of an entrypoint's calls on threads: its name, and a digest of
    its identity (two entrypoints named alike in two modules never share a run id)."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", spec.name).strip("-._")[:70] or "run"
    return f"{name}-{xxhash.xxh3_64_hexdigest(spec.identity.encode())[:8]}"


def saved_value(store: Store, rec: RunRecord) -> Any:
    """What a finished call saved for the next call on its thread: the ``save`` of the
    :class:`Final` its last attempt returned, else its result."""
    events = [e for e in store.list_events(rec.run_id, [SAVED]) if e.attempt == rec.attempt]
    if events and events[-1].data is not None:
        return _serde.loads(events[-1].data)
    return Run(rec, store).result


def resolve(spec: Spec, store: Store, thread: str, instance: Any, args: tuple[Any, ...],
            kwargs: dict[str, Any]) -> tuple[str, dict[str, Any], bool]:
    """The run a call on ``thread`` is: its id, the keyword arguments it is called with
    (``previous`` added when the entrypoint takes it and a call on the thread finished: else
    the parameter's default applies), and whether the run exists (the thread's unfinished
    latest call, continued).

    Raises:
        DefinitionError: ``previous`` is given by the caller.
        RunStateError: the thread's latest call waits for an answer (``interrupted``) and
            this call has other arguments.
        RunBusyError: the thread's latest call is executing right now (another thread or
            process), with other arguments.
    """
    takes = PREVIOUS in spec.signature.parameters
    if PREVIOUS in kwargs:
        raise DefinitionError(
            f"{spec.name}.run(..., thread={thread!r}) was given previous=...: on a thread, "
            "previous is what the thread's last finished call saved. Fix: leave it out.")
    calls = sorted(((n, rec) for rec in store.list_thread_runs(thread)
                    if rec.entrypoint == spec.identity and (n := _number(spec, thread, rec))),
                   key=lambda item: item[0])
    latest = calls[-1] if calls else None
    finished = [rec for _, rec in calls if rec.status == "finished"]
    previous = saved_value(store, finished[-1]) if finished else None
    # (the thread's first call, or none finished yet: the parameter's default)
    mine = {**kwargs, PREVIOUS: previous} if takes and finished else dict(kwargs)
    if latest is None:
        return _run_id(spec, thread, 1), mine, False
    n, rec = latest
    if rec.status == "finished":
        return _run_id(spec, thread, n + 1), mine, False
    if rec.args is not None and not isinstance(rec.args, _serde.Unreadable):
        _, stored = _serde.loads(rec.args)
        again = {**kwargs, PREVIOUS: stored[PREVIOUS]} if PREVIOUS in stored else dict(
            kwargs)
        if spec.digest_inputs(spec.arguments(instance, args, again)) == rec.input_digest:
            return rec.run_id, again, True  # the same call again: it continues
    if rec.status == "interrupted":
        raise RunStateError(
            f"thread {thread!r}: its latest call, run {rec.run_id!r}, waits for an answer to "
            "its interrupt(), so the thread cannot take another call yet. Fix: answer it "
            f"with {spec.name}.resume({rec.run_id!r}, answer), then call again.")
    if rec.status == "running" and executing(store, rec.run_id):
        raise busy(spec, thread, rec.run_id)
    # crashed, failed or stopped with other arguments: this call is the next one (that run
    # stays as it is, resumable by its id)
    return _run_id(spec, thread, n + 1), mine, False


def taken(spec: Spec, thread: str, rec: RunRecord | None) -> bool:
    """Whether ``rec``, found under the id a call on ``thread`` chose, is another call on that
    thread (it took the number first)."""
    return rec is not None and rec.entrypoint == spec.identity and rec.thread == thread


def busy(spec: Spec, thread: str, run_id: str) -> RunBusyError:
    """The error of a call on a thread whose latest call is executing now."""
    return RunBusyError(
        f"thread {thread!r} is executing a call of {spec.name!r} right now (run "
        f"{run_id!r}); the calls on one thread run one at a time, each seeing what the one "
        "before it saved. Fix: call again once it has finished, or give the entrypoint "
        "@entrypoint(wait=seconds) to wait for it.", run_id)


def _run_id(spec: Spec, thread: str, n: int) -> str:
    return f"{_prefix(spec)}@{thread}.{n}"


def _langgraph_final(result: Any) -> bool:
    """Whether ``result`` is LangGraph's ``entrypoint.final(value=..., save=...)`` (its
    class ``langgraph.func.entrypoint.final``), recognised without importing LangGraph."""
    kind = type(result)
    return (kind.__name__ == "final" and kind.__module__.split(".")[0] == "langgraph"
            and hasattr(result, "value") and hasattr(result, "save"))


def save_final(ctx: RunContext, result: Any) -> Any:
    """The value a run returns: a :class:`Final`'s ``value``, its ``save`` journaled with
    the run first; any other result as it is."""
    if _langgraph_final(result):  # LangGraph's own entrypoint.final: read as ours
        result = Final(value=result.value, save=result.save)
    if not isinstance(result, Final):
        return result
    data = _serde.dumps(result.save, what="the value saved by entrypoint.final(save=...)")
    if not isinstance(data, bytes):  # (spilled to a file: larger than an event holds)
        data.discard()
        raise SerializationError(
            f"run {ctx.run_id!r}: the value saved by entrypoint.final(save=...) pickles to "
            "more than an event of the journal holds. Fix: save something smaller (an id, a "
            "summary, a durably.File of the data).")
    ctx.claim()
    ctx.store.append_events([EventRecord(ctx.run_id, SAVED, now(), ctx.attempt, None, "",
                                         data)])
    return result.value
