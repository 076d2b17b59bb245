"""The exceptions durably raises, one tree under :class:`DurablyError`.

::

    DurablyError
    ├── DefinitionError        a decorator or an option used the wrong way
    ├── SerializationError     an argument cannot be digested, a result cannot be stored
    ├── StoreError             the store cannot be opened, read or written
    │   └── CorruptJournalError  a run's journal rows are damaged or fail their signature
    ├── NotFoundError          (also LookupError) no run with that id
    ├── RunStateError          the run is not in a state that allows the operation
    │   └── NoActiveRunError   interrupt() / idempotency_key() called outside a run's step
    ├── RunInterrupted         the run paused at interrupt(): answer with resume()
    ├── RunCancelledError      the run was stopped by durably.cancel_run() (status stopped)
    │   └── RunTimeoutError    (also TimeoutError) it ran past @entrypoint(timeout=...)
    ├── TaskTimeoutError       (also TimeoutError) a task ran past its timeout=
    ├── ReplayedError          a step's failure replayed from the journal whose exception
    │                          could not be pickled: a stand-in of its type and message
    └── RenderError            a run graph cannot be drawn (graphviz missing, bad format)

    BaseException
    └── InterruptSignal        (internal) unwinds a run from interrupt() to its entrypoint;
                               never swallowed by ``except Exception:``

Exceptions raised by the body of a task or an entrypoint are never wrapped: they propagate
to the caller unchanged, and are recorded in the run's journal.

Every message says what was wrong, with which value, and how to fix it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from durably._runtime.interrupt import Interrupt

__all__ = [
    "CorruptJournalError",
    "DefinitionError",
    "DurablyError",
    "NoActiveRunError",
    "NondeterminismError",
    "NotFoundError",
    "RenderError",
    "ReplayedError",
    "RunBusyError",
    "RunCancelledError",
    "RunInterrupted",
    "RunStateError",
    "RunTimeoutError",
    "SerializationError",
    "StoreError",
    "TaskTimeoutError",
]


class DurablyError(Exception):
    """The root of every error durably raises itself."""


class DefinitionError(DurablyError, TypeError):
    """A decorator or one of its options was used the wrong way.

    Also a :class:`TypeError`, since it is raised for a value of the wrong kind
    (for example ``@task`` on a class, or ``version=3``).
    """


class SerializationError(DurablyError):
    """An argument could not be digested, or a result could not be stored.

    Raised before anything is written, so the store is unchanged.
    """


class StoreError(DurablyError):
    """The store could not be opened, read or written (a path, a permission, a full disk)."""


class CorruptJournalError(StoreError):
    """A run's journal cannot be trusted: a recorded result fails its checksum or its
    signature, or a row is garbage. Raised for that run alone; other runs and the cache keep
    working. The message names the run and says how to repair it
    (:meth:`DiskStore.repair_run <durably.DiskStore.repair_run>`) or start anew."""


class NotFoundError(DurablyError, LookupError):
    """No run (or entry) with the given id exists in the store."""


class RunStateError(DurablyError):
    """The run is not in a state that allows the operation (for example, it belongs to
    another entrypoint, or was started with other arguments; another process executes it
    now; or this process lost the run's lease while it executed it, and another process
    took the run over)."""


class RunBusyError(RunStateError):
    """Another call (a thread of this process, or another process) is executing the run
    right now: two must not execute one run. ``@entrypoint(wait=seconds)`` makes a call wait
    for it and return its result instead.

    Attributes:
        run_id: The run.
    """

    def __init__(self, message: str, run_id: str = "") -> None:
        super().__init__(message)
        self.run_id = run_id


class NoActiveRunError(RunStateError):
    """An operation that needs a run (``interrupt()``, ``idempotency_key()``,
    ``get_writer()``) was called outside one, or outside a task of one."""


class NondeterminismError(RunStateError):
    """A resumed run's step asked ``interrupt()`` a different question than the one that
    was answered, although the step's code and inputs are the same: something the step
    computes before ``interrupt()`` differs on each execution (a random number, the time,
    an LLM call that is not a task of its own). The answer is not applied to a question
    nobody saw; the message shows both questions and how to make the question stable."""


class RunInterrupted(DurablyError):
    """The run paused at ``interrupt()`` and waits for an answer.

    Attributes:
        run_id: The interrupted run: answer with ``<entrypoint>.resume(run_id, value)``.
        interrupts: The pending :class:`~durably.Interrupt` objects (``.id``, ``.payload``).
    """

    def __init__(self, run_id: str, interrupts: list[Interrupt], name: str = "") -> None:
        self.run_id = run_id
        self.interrupts = list(interrupts)
        self._name = name
        shown = "; ".join(f"{i.id}: {_short(i.payload)}" for i in self.interrupts[:5])
        more = f" (+{len(self.interrupts) - 5} more)" if len(self.interrupts) > 5 else ""
        super().__init__(
            f"run {run_id!r} is waiting for {len(self.interrupts)} answer(s) — {shown}{more}. "
            f"Answer with {name or '<entrypoint>'}.resume({run_id!r}, value) (several: a "
            "mapping {interrupt_id: value})."
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (RunInterrupted, (self.run_id, self.interrupts, self._name))


class RunCancelledError(DurablyError):
    """The run was stopped before it ended: :func:`durably.cancel_run` was called for it
    (from another thread, a web handler's cancel button). It stopped at its next step
    boundary: the step running then finished and is journaled, later steps did not start.
    Its status is ``stopped``, as after Ctrl-C, and it is resumable: calling the entrypoint
    again with the same arguments replays its finished steps and executes the rest.

    Attributes:
        run_id: The stopped run.
        steps: How many steps it had finished (ran, cached or replayed: kept in its journal).
    """

    def __init__(self, message: str, run_id: str = "", steps: int = 0) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.steps = steps

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.run_id, self.steps))


class RunTimeoutError(RunCancelledError, TimeoutError):
    """The run ran past its ``timeout=`` (seconds: ``@entrypoint(timeout=...)``,
    ``StateGraph.compile(timeout=...)``) and was stopped as :func:`durably.cancel_run` stops
    it: status ``stopped``, resumable. The timeout limits one call (an attempt): a call that
    continues the run has the whole timeout again, and replays exactly the steps the
    stopped call finished. Also a :class:`TimeoutError`.

    Attributes:
        run_id: The stopped run.
        steps: How many steps it had finished.
        timeout: The timeout, in seconds.
    """

    def __init__(self, message: str, run_id: str = "", steps: int = 0,
                 timeout: float = 0.0) -> None:
        super().__init__(message, run_id, steps)
        self.timeout = timeout

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.run_id, self.steps, self.timeout))


class RenderError(DurablyError):
    """A run graph cannot be drawn: the ``graphviz`` package or the ``dot`` program is
    missing, or the file format is unknown. The message says how to install or fix it."""


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class TaskTimeoutError(DurablyError, TimeoutError):
    """A task ran longer than its ``timeout=`` (seconds). Also a :class:`TimeoutError`, so
    ``retry=`` policies that retry timeouts catch it. An ``async`` task is cancelled; a sync
    task's body cannot be stopped by Python and is left to finish in a background thread
    (its result is discarded)."""


class ReplayedError(DurablyError):
    """A stand-in for the exception of a failed step, raised again when its run is replayed
    or resumed, when the original exception could not be pickled (or did not load back).

    Inside a run a failed step is part of the run's history: when the run is replayed, the
    step raises its recorded exception again instead of executing. When that exception
    cannot be stored, this stand-in is raised instead; it is also an instance of the
    nearest builtin exception class of the original (an ``except ValueError:`` that caught
    the original catches the stand-in), its message is the original's, and a note gives the
    original traceback's text.

    Attributes:
        original_type: ``module.qualname`` of the original exception's type.

    Example:
        >>> err = ReplayedError("ConnectionRefused: refused")
        >>> err.original_type
        ''
    """

    original_type: str = ""
