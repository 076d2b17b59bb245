"""``interrupt()``: pause a run durably for outside input; and the other calls a task makes
into its run (``idempotency_key()``, ``get_writer()``).

Interrupt ids are stable: the n-th ``interrupt()`` call under one step (or in the
entrypoint's own body) has the id ``xxh3_64(step id, n)``, the same in every attempt, so an
answer journaled between attempts finds its call again (LangGraph matches resume values to
interrupts by their order within a task in the same way).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import logging
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import xxhash

from durably.exceptions import NondeterminismError

if TYPE_CHECKING:
    from durably.store import Store

log = logging.getLogger("durably")

_ID_PREFIX = re.compile(r"[0-9a-f]{6,16}")
_MAX_EVENT_BYTES = 1 << 20  # a custom event bigger than this is journaled as its short repr

__all__ = [
    "Interrupt",
    "InterruptSignal",
    "get_writer",
    "idempotency_key",
    "interrupt",
    "pending_interrupts",
    "record_answers",
    "refuse_no_answer",
]


@dataclasses.dataclass(frozen=True)
class Interrupt:
    """One pending question of an interrupted run.

    Attributes:
        id: Stable id of the ``interrupt()`` call (16 hex characters): the same across
            replays and resumes of the run.
        payload: The value passed to ``interrupt()``.
        step_id: The step that called ``interrupt()`` (None: the entrypoint's own body).
        task: The name of that step's task (or of the entrypoint).
    """

    id: str
    payload: Any
    step_id: str | None = None
    task: str = ""


class InterruptSignal(BaseException):
    """Unwinds a run from ``interrupt()`` to its entrypoint. A ``BaseException``, so a user's
    ``except Exception:`` cannot swallow it (trio's ``Cancelled`` does the same).

    Several signals (parallel items of a fan-out) merge into one:
    ``InterruptSignal([*a.interrupts, *b.interrupts])``.
    """

    def __init__(self, interrupts: list[Interrupt]) -> None:
        super().__init__(interrupts)
        self.interrupts = list(interrupts)


# -- inside a run ----------------------------------------------------------------------------
def _active(what: str) -> Any:
    from durably._runtime.context import current_run, in_worker, live_run

    ctx = live_run()
    # a worker, or a process forked inside a run (it holds a run, not its own)
    if ctx is None and (in_worker.get() or current_run.get() is not None):
        from durably.exceptions import NoActiveRunError

        raise NoActiveRunError(
            f"{what} was called in a worker process (an item of a fan-out on processes, or "
            "a process forked inside a run) or on a Dask worker, which has no run (only an "
            "item's result comes back to it). Fix: fan out the items that call it on "
            "threads (executor='thread', the default).")
    if ctx is None:
        from durably.exceptions import NoActiveRunError

        raise NoActiveRunError(
            f"{what} was called outside a run. Fix: call it inside a task (or the body) of an "
            "@durably.entrypoint while the entrypoint runs."
        )
    return ctx


def interrupt(payload: Any = None) -> Any:
    """Pause the run durably until someone answers; return the answer.

    The first time a run reaches this call, the payload is journaled and the run stops: the
    caller of the entrypoint gets :class:`~durably.RunInterrupted` (with ``.run_id`` and
    ``.interrupts``; ``Entrypoint.run`` returns a handle with status ``"interrupted"``).
    ``pipeline.resume(run_id, value)`` continues the run from any process: its finished steps
    are replayed from the journal, and this call returns ``value``. As in LangGraph, the
    task that called ``interrupt()`` runs again from its start on resume, and so does the
    entrypoint's own code between tasks, so side effects belong in tasks that finish before
    the interrupt.

    The pause unwinds the stack with a ``BaseException``, so ``except Exception:`` in your
    code does not swallow it. Several ``interrupt()`` calls in one task are told apart by
    their order; each has a stable id (the same across replays and resumes).

    Args:
        payload: What the person answering needs to see (any picklable value).

    Returns:
        The answer given to ``resume`` for this interrupt.

    Raises:
        NoActiveRunError: called outside a run.
        SerializationError: the payload cannot be stored.

    Example:
        >>> import durably, tempfile
        >>> @durably.entrypoint(store=durably.DiskStore(tempfile.mkdtemp()))
        ... def greet(name):
        ...     answer = durably.interrupt(f"May I greet {name}?")
        ...     return f"hello {name}" if answer == "yes" else "no greeting"
        >>> try:
        ...     greet("ada")
        ... except durably.RunInterrupted as paused:
        ...     print(paused.interrupts[0].payload)
        ...     print(greet.resume(paused.run_id, "yes"))
        May I greet ada?
        hello ada
    """
    from durably._keys import serde as _serde
    from durably._keys.hashing import trace_digest
    from durably._runtime.context import current_step
    from durably._store.records import EventRecord, now
    from durably._trace.tracer import short_repr

    ctx = _active("durably.interrupt()")
    step = current_step.get()
    n = ctx.next_interrupt(step)
    interrupt_id = xxhash.xxh3_64_hexdigest(f"{step or ''}/interrupt/{n}".encode())
    if step is not None:
        ctx.uncacheable.add(step)  # its result depends on a person's answer: never cached
    ctx.consumed.add(interrupt_id)
    answer = ctx.answers.get(interrupt_id)
    if answer is None and ctx.asked:
        answer = _answer_of_a_changed_step(ctx, interrupt_id, step, payload)
    if answer is not None:
        asked = ctx.asked.get(interrupt_id)
        question = trace_digest(payload)
        if not asked or asked == question:
            return _serde.loads(answer)
        code = _asker_code(ctx, step)
        then = ctx.asked_code.get(interrupt_id)
        if then is not None and then == code:
            raise _nondeterministic(ctx, interrupt_id, step, payload)
        # the question changed with the code: asked again under an id of its own, so that
        # the answer to the old question stays with it (under the old id it would be
        # found again, and used, once the new question is answered)
        old_id = interrupt_id
        interrupt_id = xxhash.xxh3_64_hexdigest(f"{old_id}/again/{question}".encode())
        ctx.consumed.add(interrupt_id)
        again = ctx.answers.get(interrupt_id)
        if again is not None:
            return _serde.loads(again)
        log.warning(
            "durably: run %r: the question of interrupt %s changed since it was answered%s; "
            "the old answer is not used and the question is asked again (as interrupt %s): "
            "%s", ctx.run_id, old_id, " (the code was edited?)" if then is None else
            ", and so did the code that asks it", interrupt_id, short_repr(payload))
    else:  # (asked, not answered: the code that asks is journaled with the question)
        code = _asker_code(ctx, step)
    data = _serde.dumps(payload, what="the payload of interrupt()")
    t = now()
    events = [EventRecord(ctx.run_id, "interrupt", t, ctx.attempt, step, interrupt_id, data)]
    if code is not None:  # (what tells a changed question from an edit, when answered)
        events.append(EventRecord(ctx.run_id, "interrupt_code", t, ctx.attempt, step,
                                  interrupt_id, code.encode()))
    ctx.claim()  # (an attempt that only replayed so far: its start first)
    ctx.store.append_events(events)
    # named by the task asking (its step's call), also when the signal never reaches the
    # call (a submitted call nobody waits for: the run reports its interrupts all the same)
    task = ctx.name  # (asked by the entrypoint's own body)
    if step:
        caller = ctx.executing(step)
        task = caller.spec.name if caller is not None else ""
    pending = Interrupt(interrupt_id, payload, step, task)
    ctx.raised.append(pending)
    raise InterruptSignal([pending])


def _asker_code(ctx: Any, step: str | None) -> str | None:
    """The code version of what calls interrupt(): the step's task (as its key was made),
    or the entrypoint for its own body; None when not known."""
    if step is None:
        return None if ctx.entry is None else str(ctx.entry.code_version())
    code = getattr(ctx.executing(step), "code", None)
    return code if isinstance(code, str) else None


def _nondeterministic(ctx: Any, interrupt_id: str, step: str | None, payload: Any
                      ) -> NondeterminismError:
    """The error for a question that changed while the code asking it did not."""
    from durably._keys import serde as _serde
    from durably._trace.tracer import short_repr

    before = "?"
    with contextlib.suppress(Exception):  # (shown if it can be read)
        for e in ctx.store.list_events(ctx.run_id, ("interrupt",)):
            if e.key == interrupt_id and e.data is not None:
                before = short_repr(_serde.loads(e.data))
    call = ctx.executing(step)
    who = (f"task {call.spec.name!r}" if call is not None else
           f"entrypoint {ctx.name!r}" if step is None else "the step")
    return NondeterminismError(
        f"run {ctx.run_id!r}: {who} asked interrupt {interrupt_id} again with another "
        "question than the one answered, although its code and inputs are the same: "
        "something it computes before interrupt() differs on each execution (a random "
        "number, the time, an LLM call that is not a task of its own). The answer is not "
        f"applied to a question nobody saw. The question answered: {before}; asked now: "
        f"{short_repr(payload)}. Fix: compute that value in a task of its own (it is then "
        "journaled and replayed, so the question stays the same), or leave it out of the "
        "payload; then call the entrypoint again: it asks the question again.")


def _answer_of_a_changed_step(ctx: Any, interrupt_id: str, step: str | None,
                              payload: Any) -> bytes | None:
    """The answer to the same question asked by the step this one replaces, if there is
    one. An interrupt id follows its step's id, which follows the task's code: a
    task edited while its run waited for an answer (a deploy) asks under a new id. An
    answered question that no call of this attempt reached, with the same payload, asked
    by a step of the same task and inputs, called by a step of the same task and inputs
    (their code changed), whose answer no replay of this attempt spent, is that question:
    its answer is journaled for the new id too (later attempts find it there), with a
    warning. A step given other inputs (a migrated graph state) asks again; calls
    alike (a loop's) take those answers in the order they were asked. None when there is
    no such answer."""
    from durably._keys.hashing import trace_digest
    from durably._store.records import EventRecord, now
    from durably._trace.producers import digests_only

    call = ctx.executing(step)
    if call is None or not call.spec.cache:
        # (a cache=False asker's id follows its task, inputs and callers, never code: a new
        # id is another call; its inputs' flow digests leave small values out, so 3 and 5
        # would look alike)
        return None
    digest = trace_digest(payload)
    same = [i for i, d in ctx.asked.items()
            if d == digest and i in ctx.answers and i not in ctx.consumed]
    if not same:
        return None
    store = ctx.store
    # every step of the run: which finished (an answer its asker used is spent, even when
    # that asker is replayed now and calls interrupt() no more), and who called each
    records = store.list_steps(ctx.run_id)
    interrupted = {(r.attempt, r.step_id): r for r in records if r.status == "interrupted"}
    parents = {r.step_id: r.parent_id for r in records}

    def spent(asker: str | None) -> bool:  # it, or a step above it, replayed this attempt
        seen = 0
        while asker is not None and seen < 1000:
            if asker in ctx.spent:
                return True
            asker, seen = parents.get(asker), seen + 1
        return False

    # a caller as its task and inputs (None: the entrypoint's body); a caller whose record
    # or call is not found stands for itself alone (object()), so it matches nothing
    def caller(parent: str | None, attempt: int) -> Any:
        if parent is None:
            return None
        r = interrupted.get((attempt, parent))  # (it unwound with the question)
        return object() if r is None else (r.task, digests_only(r.input_digests))

    here: Any = None
    if call.parent is not None:
        up = ctx.executing(call.parent)
        here = object() if up is None else (up.spec.name, tuple(up.flow))
    # (in the order they were asked: identical calls, a loop's, take them in that order)
    found = []
    for e in store.list_events(ctx.run_id, ("interrupt",)):
        if e.key not in same or e.key in found or e.step_id is None:
            continue
        old = interrupted.get((e.attempt, e.step_id))
        # the same task and inputs, its caller the same task and inputs (not the same step
        # ids: an edit moves those), and an answer not spent by a replay in this attempt
        if (old is not None and not spent(e.step_id)
                and (old.task, digests_only(old.input_digests)) == (call.spec.name,
                                                                    tuple(call.flow))
                and caller(old.parent_id, e.attempt) == here):
            found.append(e.key)
    if not found:
        return None
    old_id = found[0]
    ctx.consumed.add(old_id)
    answer: bytes = ctx.answers[old_id]
    ctx.claim()
    store.append_events([EventRecord(ctx.run_id, "answer", now(), ctx.attempt, step,
                                     interrupt_id, answer)])
    ctx.answers[interrupt_id] = answer
    ctx.asked[interrupt_id] = digest
    log.warning(
        "durably: run %r: interrupt %s was answered, but the step that asked it changed since "
        "(its code was edited?): it asks the same question with the same inputs as interrupt "
        "%s, which takes that answer", ctx.run_id, old_id, interrupt_id)
    return answer


def idempotency_key() -> str:
    """A key for the current step that stays the same across replays and resumes of that
    step in this run (32 hex characters, from the run id and the step id): pass it to an
    external service so a write repeated after a crash is applied once.

    A step that crashed after its side effect but before its result was journaled runs
    again on resume; with this key the service can recognise the repeat. A fork is a new
    run, so its steps get new keys.

    Returns:
        32 lowercase hex characters.

    Raises:
        NoActiveRunError: called outside a task of a run.

    Example:
        >>> import durably, tempfile
        >>> @durably.task(cache=False)
        ... def charge(amount):
        ...     return durably.idempotency_key()
        >>> @durably.entrypoint(store=durably.DiskStore(tempfile.mkdtemp()))
        ... def checkout(amount):
        ...     return charge(amount)
        >>> key = checkout(10)
        >>> len(key), checkout(10) == key
        (32, True)
    """
    from durably._runtime.context import current_step

    ctx = _active("durably.idempotency_key()")
    step = current_step.get()
    if step is None:
        from durably.exceptions import NoActiveRunError

        raise NoActiveRunError(
            "durably.idempotency_key() was called in the entrypoint's own body, which "
            "re-executes on every attempt. Fix: call it inside the @durably.task that "
            "performs the external write."
        )
    return xxhash.xxh3_128_hexdigest(f"{ctx.run_id}\x00{step}".encode())


def get_writer() -> Callable[[Any], None]:
    """A function that writes custom events into the current run: they appear in
    ``Entrypoint.stream`` as ``Event(kind="custom", data=value)`` and are journaled with the
    run (``Run.events()``). A value that cannot be pickled, or whose pickle is over 1 MB, is
    journaled as its short ``repr`` (the live event still carries the value).

    Returns:
        ``write(value)``; the value must be picklable.

    Raises:
        NoActiveRunError: called outside a run.

    Example:
        >>> import durably, tempfile
        >>> @durably.task
        ... def fit(n):
        ...     write = durably.get_writer()
        ...     write({"progress": 0.5})
        ...     return n
        >>> @durably.entrypoint(store=durably.DiskStore(tempfile.mkdtemp()))
        ... def sweep(n):
        ...     return fit(n)
        >>> [e.data for e in sweep.stream(3) if e.kind == "custom"]
        [{'progress': 0.5}]
    """
    from durably._keys import serde as _serde
    from durably._runtime.context import current_step
    from durably._store.lease import _pid
    from durably._store.records import EventRecord, now
    from durably._trace.tracer import Event, short_repr

    ctx = _active("durably.get_writer()")
    step = current_step.get()

    def write(value: Any) -> None:
        if ctx.pid != _pid[0]:
            return  # a process forked inside the run: the run is its parent's
        t = now()
        try:
            data = _serde.dumps(value, what="a custom event")
        except Exception as exc:  # noqa: BLE001 - a progress note must never fail a run
            data = None
            log.warning("durably: a custom event of run %r is kept as its repr: %s",
                        ctx.run_id, exc)
        if data is None or len(data) > _MAX_EVENT_BYTES:
            data = _serde.dumps(short_repr(value, 2000), what="a custom event")
        ctx.claim()
        ctx.store.append_events([EventRecord(ctx.run_id, "custom", t, ctx.attempt, step, "",
                                             data)])
        ctx.emit(Event("custom", ctx.run_id, t, step, data=value, attempt=ctx.attempt))

    return write


# -- between attempts ------------------------------------------------------------------------
def pending_interrupts(store: Store, run_id: str, attempt: int) -> list[Interrupt]:
    """The interrupts of the run's latest attempt that have no answer yet, in the order the
    attempt reported them (a fan-out's: input order; parallel nodes': node order; the
    order asked, which threads make vary, when the attempt's end is not journaled)."""
    from durably._keys import serde as _serde

    events = store.list_events(run_id, ("interrupt", "answer", "run_interrupted"))
    order: dict[str, int] = {}
    for e in events:
        if e.kind == "run_interrupted" and e.attempt == attempt and e.data is not None:
            with contextlib.suppress(Exception):  # (an unreadable end: the order asked)
                ids = _serde.loads(e.data).get("interrupts") or []
                order = {i: n for n, i in enumerate(ids) if isinstance(i, str)}
    answered = {e.key for e in events if e.kind == "answer"}
    tasks = {s.step_id: s.task for s in store.list_steps(run_id, attempt=attempt)
             if s.status == "interrupted"}
    run = store.find_run(run_id)
    found: dict[str, Interrupt] = {}
    for e in events:
        if e.kind == "interrupt" and e.attempt == attempt and e.key not in answered:
            try:
                payload = _serde.loads(e.data) if e.data is not None else None
            except Exception as exc:  # noqa: BLE001 - a class defined in another script
                payload = f"<payload not loadable here: {exc}>"
            task = tasks.get(e.step_id or "", "") if e.step_id else (run.name if run else "")
            found.setdefault(e.key, Interrupt(e.key, payload, e.step_id, task))
    ranked = sorted(enumerate(found.values()),
                    key=lambda p: (order.get(p[1].id, len(order)), p[0]))
    return [i for _, i in ranked]


def _id_key(key: Any) -> str:
    """A mapping's key as an interrupt id is compared: trimmed, lower case ("" for a key
    that is not a string)."""
    return key.strip().lower() if isinstance(key, str) else ""


def _near_id(key: Any, ids: list[str]) -> str | None:
    """The pending interrupt id ``key`` names or was likely meant to name: one it is a
    prefix of (6 characters or more, whatever the case and surrounding spaces), one it
    contains (``"id:<id>"``), else the one it is close to (a character or two mistyped,
    dropped, added); None otherwise."""
    k = _id_key(key)
    if len(k) < 6:  # (an id's first 4 or 5 characters: too short to name it, meant to)
        short = [i for i in ids if len(k) >= 4 and i.startswith(k)]
        return short[0] if len(short) == 1 else None
    close = ([i for i in ids if i.startswith(k)] or [i for i in ids if i in k]
             or [i for i in ids if i[:6] == k[:6]]
             or ([i for i in ids if difflib.SequenceMatcher(None, k, i).ratio() >= 0.8]
                 if len(k) >= 10 else []))
    return close[0] if len(close) == 1 else None


def refuse_no_answer(run_id: str, value: Any, fix: str = (
        "resume(run_id, answer), for example resume(run_id, \"yes\") or "
        "resume(run_id, True).")) -> None:
    """Refuse None as an answer to run ``run_id``'s interrupts: an approval is never answered
    by accident (``resume`` and ``durably resume --value null`` refuse it, and so does the
    dashboard's form). ``fix``: how to give an answer, said after ``Fix:``.

    Raises:
        DefinitionError: ``value`` is None.
    """
    if value is None:
        from durably.exceptions import DefinitionError

        raise DefinitionError(
            f"resume({run_id!r}) was given no answer (None is not one: an approval must "
            f"never be answered by accident). Fix: {fix}")


def record_answers(store: Store, run_id: str, attempt: int, pending: list[Interrupt],
                   value: Any) -> None:
    """Match ``value`` to the pending interrupts and journal the answers (committed before
    the run continues).

    Raises:
        RunStateError: several interrupts are pending and ``value`` is not a mapping of
            their ids, or names an interrupt that is not pending.
    """
    from durably._keys import serde as _serde
    from durably._store.records import EventRecord, now
    from durably.exceptions import RunStateError

    ids = [i.id for i in pending]
    if isinstance(value, Mapping) and value and (
            all(_ID_PREFIX.fullmatch(_id_key(k)) for k in value)
            or any(_near_id(k, ids) is not None for k in value)):
        # keys that look like interrupt ids (or unique prefixes of 6+ characters) are ids, and
        # so is a mapping with a key close to a pending id (a typo, upper case, a character
        # too many): a stale, unknown or mistyped one is an error, never an answer
        answers = {}
        given: dict[str, Any] = {}  # the key each answer was given under
        for key, answer in value.items():
            k = _id_key(key)
            matches = [i for i in ids if len(k) >= 6 and i.startswith(k)]
            if len(matches) != 1:
                answered = {e.key for e in store.list_events(run_id, ("answer",))}
                near = _near_id(key, ids)
                why = ("was already answered" if len(k) >= 6 and any(
                           a.startswith(k) for a in answered)
                       else "names several pending interrupts" if matches
                       else f"is not an interrupt of this run (did you mean {near!r}?)" if near
                       else "is not an interrupt of this run")
                wrap = (f" To answer with this mapping itself, wrap it: {{{ids[0]!r}: {{...}}}}."
                        if len(ids) == 1 and not near else "")
                raise RunStateError(
                    f"run {run_id!r}: interrupt {key!r} {why}; pending: {ids}. Fix: answer "
                    f"with a mapping of pending interrupt ids to values.{wrap}")
            if matches[0] in answers:  # (a prefix and the full id, say: which one is meant?)
                raise RunStateError(
                    f"run {run_id!r}: the answer names interrupt {matches[0]} twice (as "
                    f"{given[matches[0]]!r} and {key!r}), with two answers. Fix: give each "
                    "pending interrupt one answer.")
            answers[matches[0]] = answer
            given[matches[0]] = key
    elif len(pending) == 1:
        answers = {ids[0]: value}
    else:
        raise RunStateError(
            f"run {run_id!r} waits for {len(pending)} answers ({ids}); a single value cannot "
            "say which. Fix: resume(run_id, {interrupt_id: value, ...}); answering some keeps "
            "the rest pending."
        )
    t = now()
    store.append_events([
        EventRecord(run_id, "answer", t, attempt, None, k,
                    _serde.dumps(v, what=f"the answer to interrupt {k}"))
        for k, v in answers.items()
    ])
