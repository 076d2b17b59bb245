"""What a graph run's checkpoints hold and how they are journaled: :class:`StateSnapshot`
(a checkpoint as ``get_state`` shows it), :class:`StepResult` (what a super-step journals),
the shapes of a node's update in it (:class:`Writes`, :class:`Sent`), and the bytes of the
state after a super-step (pickled whole, or as a splice of the state before it).

Apart from the super-step that writes them: this is the journal's format, read back by the
super-step loop, the state history and forks. StepResult, Writes and Sent are pickled into
journals, which earlier releases wrote as ``durably.stategraph.<name>`` (still found
there)."""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

from durably._trace.tracer import short_repr


@dataclasses.dataclass(frozen=True)
class StateSnapshot:
    """The state of a graph run at one checkpoint (after one super-step).

    Attributes:
        values: The state (a dict for a TypedDict state, else an instance).
        next: The nodes of the next super-step (empty when the run ended).
        step: The super-step number (0-based; -1 for the input before any step).
        checkpoint_id: The id to fork from (``app.fork(run_id, at=...)``).
        run_id: The run.
        status: The run's status.
        interrupts: Pending interrupts (when the run waits at this point).
    """

    values: Any
    next: tuple[str, ...]
    step: int
    checkpoint_id: str
    run_id: str
    status: str
    interrupts: tuple[Any, ...] = ()


class StepResult(dict):  # type: ignore[type-arg]
    """What a super-step journals: its index, next nodes, joins, updates (node by node),
    fingerprint, and the state after it, pickled: whole (``blob``) every
    :data:`FULL_STATE_EVERY` super-steps (from the first) and whenever the bytes of the
    state before it are not known, else as a splice of those bytes (``delta``, see
    :func:`_splice`). A state that plain pickle refuses, holds a large buffer or pickles to
    16 MiB or more is kept as the object (``state``, see :func:`_pickled_state`), as
    journals of earlier versions kept every state. Shown (history, ``durably show``) as the
    updates and the next nodes."""

    __slots__ = ()

    def __repr__(self) -> str:
        # abbreviated (reprlib): a step's output is shown short, and a state of many
        # megabytes must not be written out whole on every super-step to be cut
        shown = short_repr(self["state"], 1000) if "state" in self else \
            "update " + short_repr(self.get("updates"), 1000)
        return f"{shown} → next {self.get('next')}"


#: super-steps 0, 64, 128, ... (and any whose previous state's bytes are not known: after a
#: migration, after a fork's edited checkpoint, after a journal of an earlier version)
#: journal the whole pickled state; the others only where its bytes differ from the
#: previous one's, so a state that grows at every super-step (an agent's messages) is not
#: written out whole each time (quadratic in the run's length)
FULL_STATE_EVERY = 64
_CHUNK = 1 << 16  # bytes compared at once when looking for where two pickles differ
#: a state pickled to this many bytes or more is journaled as the object (spilled to a file)
_WHOLE_BYTES = 16 << 20


def _splice(old: bytes, new: bytes) -> tuple[int, int, bytes]:
    """``(head, tail, middle)`` with ``new == old[:head] + middle + old[len(old) - tail:]``:
    the bytes around the one region where ``new`` differs from ``old`` are not kept (a list
    that grew by a message: about the message's bytes). Exact whatever changed, in place or
    not: it compares the pickles, not the objects.

    Example:
        >>> _splice(b"abcdef", b"abXYef")
        (2, 2, b'XY')
        >>> _spliced(b"abcdef", _splice(b"abcdef", b"abef"))
        b'abef'
    """
    limit = min(len(old), len(new))
    head = 0
    while head + _CHUNK <= limit and old[head:head + _CHUNK] == new[head:head + _CHUNK]:
        head += _CHUNK
    hi = min(head + _CHUNK, limit)
    while head < hi:  # the longest equal run from head, bisected
        mid = (head + hi + 1) // 2
        if old[head:mid] == new[head:mid]:
            head = mid
        else:
            hi = mid - 1
    room = limit - head  # the tail never overlaps the head
    end_old, end_new = len(old), len(new)
    tail = 0
    while tail + _CHUNK <= room and (old[end_old - tail - _CHUNK:end_old - tail]
                                     == new[end_new - tail - _CHUNK:end_new - tail]):
        tail += _CHUNK
    hi = min(tail + _CHUNK, room)
    while tail < hi:
        mid = (tail + hi + 1) // 2
        if old[end_old - mid:end_old - tail] == new[end_new - mid:end_new - tail]:
            tail = mid
        else:
            hi = mid - 1
    return head, tail, new[head:end_new - tail]


def _pickled_state(state: dict[str, Any]) -> bytes | None:
    """The state pickled for a checkpoint: protocol 3, whose stream has no frame headers and
    no memo numbers on new objects' puts in the way of :func:`_splice` (protocol 4's frames
    put a length at the start that changes with any change). None, and the object is
    journaled as before (by the journal's own pickler, which refuses open files and spills
    large values to a file without a second copy), when plain pickle cannot (a lambda, a
    class only protocol 4 finds), when a value holds a large buffer (an array: never
    copied here), or when it comes to :data:`_WHOLE_BYTES` or more."""
    for value in state.values():
        size = getattr(value, "nbytes", None)
        if isinstance(value, (bytes, bytearray, str)):
            size = len(value)
        if isinstance(size, int) and size >= _WHOLE_BYTES // 4:
            return None
    try:
        data = pickle.dumps(state, protocol=3)
    except Exception:  # noqa: BLE001 - journaled as the object: the journal says what fails
        return None
    return data if len(data) < _WHOLE_BYTES else None


def _spliced(old: bytes, delta: tuple[int, int, bytes]) -> bytes:
    """The bytes :func:`_splice` was given as ``new``."""
    head, tail, middle = delta
    return old[:head] + middle + old[len(old) - tail:]


class Writes(list):  # type: ignore[type-arg]
    """The update of a subgraph node: the writes of its nodes, in the order applied."""

    __slots__ = ()


class Sent(list):  # type: ignore[type-arg]
    """The updates of a node's calls by :class:`Send` in one super-step, one per call in the
    order the routers returned them (each a dict, or a subgraph's :class:`Writes`)."""

    __slots__ = ()
