"""What a store records: steps, runs, key records and events, and the compact form of replayed
steps the runtime buffers. Every backend stores these; how is its own."""

from __future__ import annotations

import dataclasses
import time
from typing import NamedTuple

__all__ = ["FINISHED_STEP", "EventRecord", "KeyRecord", "RunRecord", "StepRecord", "Replay",
           "ReplayRange", "now"]

FINISHED_STEP = ("ran", "cached")


@dataclasses.dataclass(frozen=True, slots=True)
class StepRecord:
    """One step of a run, as its journal records it.

    Attributes:
        run_id: The run the step belongs to.
        step_id: Stable identity of the step in the run (32 hex characters): parent step,
            cache key and occurrence; it never depends on timing.
        parent_id: The step that called this one, or None for a call from the entrypoint.
        task: The task's name.
        status: ``"ran"`` (executed), ``"cached"`` (served from the cross-run cache),
            ``"replayed"`` (served from this run's journal) or ``"failed"``.
        attempt: Which execution of the run (1 for the first, 2 after one resume, ...).
        position: Order of the call within its attempt (0-based).
        started: Start time, seconds since the epoch.
        ended: End time, seconds since the epoch.
        error: ``repr`` of the exception for a failed step; for a step kept from older code
            (``keep_finished=True``, a ``cached`` record) a note starting ``"kept: "``
            (see :attr:`kept_from`); else None.
        cache_key: The cache key of the call (32 hex characters; empty for ``cache=False``);
            for a kept step, the key its result was computed under.
        inputs: Short ``repr`` of the arguments (at most a few hundred characters), for
            steps that ran or were served from the cache; else None.
        output: Short ``repr`` of the result, likewise.
        result_digest: Digest of the result (32 hex characters) as older versions
            recorded it for the run graph's data-flow edges; "" in records journaled now
            (a result is known by identity: see ``input_digests``) and when the result
            carries no information (None, True, False).
        input_digests: Digests of the arguments and of the elements of list, tuple and
            dict arguments; then, for each of those that is an object an earlier step of
            the attempt returned (or an element of its result), ``"@"`` and that step's
            id: a data-flow edge of the run graph. (Older records: a later step whose
            argument digest equals an earlier step's result digest received that result.)
        output_digests: Digests of the elements of a list, tuple or dict result, as older
            versions recorded them (a fan-out edge); empty in records journaled now.
        saved: For a step served from the cross-run cache (``"cached"``): seconds the
            execution that produced its entry took (its body's wall clock, as that step's
            ``started``/``ended`` measured it: :attr:`KeyRecord.duration`), the time the
            cache saved; 0.0 for an entry written without it (by an older durably, or
            without a key record) and for every other status.
    """

    run_id: str
    step_id: str
    parent_id: str | None
    task: str
    status: str
    attempt: int
    position: int
    started: float
    ended: float
    error: str | None = None
    cache_key: str = ""
    inputs: str | None = None
    output: str | None = None
    result_digest: str = ""
    input_digests: tuple[str, ...] = ()
    output_digests: tuple[str, ...] = ()
    saved: float = 0.0

    @property
    def duration(self) -> float:
        """Seconds from start to end."""
        return self.ended - self.started

    @property
    def kept_from(self) -> str | None:
        """For a step kept from older code by a resume with ``keep_finished=True``: the id
        of the step record whose result it replayed (finished before its task's code
        changed); else None."""
        note = self.error
        if self.status != "cached" or not note or not note.startswith("kept: "):
            return None
        return note.partition("(step ")[2][:32] or None


@dataclasses.dataclass(slots=True)
class RunRecord:
    """The row of one run: what the store knows about it besides its steps.

    ``thread`` is the conversation thread the run is a call on
    (``entrypoint.run(..., thread="t1")``), or None for a run on no thread.
    """

    run_id: str
    entrypoint: str
    name: str
    status: str
    created: float
    updated: float
    attempt: int
    input_digest: str
    args: bytes | None = None
    result: bytes | None = None
    error: str | None = None
    thread: str | None = None

    def copy(self) -> RunRecord:
        """A copy (``dataclasses.replace(self)``, without its cost: made at every resume)."""
        return RunRecord(self.run_id, self.entrypoint, self.name, self.status, self.created,
                         self.updated, self.attempt, self.input_digest, self.args,
                         self.result, self.error, self.thread)


@dataclasses.dataclass(frozen=True, slots=True)
class KeyRecord:
    """What a cache key was made of, kept beside the entry so ``explain`` can say why a call
    misses.

    Attributes:
        task: Task identity (``module:name``).
        cache_key: The key (32 hex characters).
        code: The code fingerprint, or ``"v:<version>"`` for a task with ``version=``.
        inputs: Digest of each argument, by name.
        parts: Fingerprint of each user function or class the code depends on, by
            qualified name (empty with ``version=``).
        created: When the entry was written, seconds since the epoch.
        duration: Seconds the execution that produced the entry took (its body's wall
            clock, as its step record's ``started``/``ended`` measure it): what a hit on
            the entry saves (:attr:`StepRecord.saved`); 0.0 when unknown (an entry written
            by an older durably).
    """

    task: str
    cache_key: str
    code: str
    inputs: dict[str, str]
    parts: dict[str, str]
    created: float
    duration: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class EventRecord:
    """A journaled event of a run besides its steps: an attempt starting or ending, an
    ``interrupt()`` and its answer, a custom event written from inside a task.

    Attributes:
        run_id: The run.
        kind: ``"run_started"``, ``"run_finished"``, ``"run_failed"``,
            ``"run_interrupted"``, ``"interrupt"``, ``"answer"`` or ``"custom"``.
        time: Seconds since the epoch.
        attempt: The attempt of the run it happened in (0 for answers given between
            attempts).
        step_id: The step it happened in, or None (the entrypoint's own body, or the run).
        key: The interrupt id for ``"interrupt"`` and ``"answer"``, else "".
        data: Pickled payload (interrupt payload, answer value, custom data), or None.
    """

    run_id: str
    kind: str
    time: float
    attempt: int
    step_id: str | None = None
    key: str = ""
    data: bytes | None = None


#: a replayed step as the runtime buffers it: (position, started, ended, step_id, parent_id,
#: cache_key, task); with the run and attempt, it is a StepRecord of status "replayed"
Replay = tuple[int, float, float, str, "str | None", str, str]


class ReplayRange(NamedTuple):
    """Steps replayed one after the other from consecutive records of the journal:
    ``steps`` steps at positions ``position`` on of the attempt, replayed from the finished
    records (``ran``/``cached``) of the run that follow ``anchor`` in journal order
    (``(attempt, position, inclusive)``: after that record, or from it), ``skip`` of them
    skipped, between ``started`` and ``ended`` (seconds since the epoch). ``first`` and
    ``last`` are the step ids of the first and last of them (checked when the range is
    read); ``horizon``: the journal's last step rowid when the records were read (records
    journaled later are not among them). Each step's ids, parent, key and task are its
    record's."""

    position: int
    steps: int
    anchor: tuple[int, int, bool]
    skip: int
    first: str
    last: str
    started: float
    ended: float
    horizon: int


def now() -> float:
    """Wall-clock seconds since the epoch."""
    return time.time()
