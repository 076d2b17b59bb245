"""The exceptions durably raises, one tree under :class:`DurablyError`.

::

    DurablyError
    ├── DefinitionError        a decorator or an option used the wrong way
    ├── SerializationError     an argument cannot be digested, a result cannot be stored
    ├── StoreError             the store cannot be opened, read or written
    ├── NotFoundError          (also LookupError) no run with that id
    └── RunStateError          the run is not in a state that allows the operation

Exceptions raised by the body of a task or an entrypoint are never wrapped: they propagate
to the caller unchanged, and are recorded in the run's journal.

Every message says what was wrong, with which value, and how to fix it.
"""

from __future__ import annotations

__all__ = [
    "DefinitionError",
    "DurablyError",
    "NotFoundError",
    "RunStateError",
    "SerializationError",
    "StoreError",
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


class NotFoundError(DurablyError, LookupError):
    """No run (or entry) with the given id exists in the store."""


class RunStateError(DurablyError):
    """The run is not in a state that allows the operation (for example, it belongs to
    another entrypoint, or was started with other arguments)."""
