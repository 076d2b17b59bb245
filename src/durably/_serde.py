"""Results and arguments to bytes and back.

The standard pickle (protocol 5) is tried first because it is several times faster on plain
data; what it cannot pickle by reference (lambdas, local classes, functions of ``__main__`` in
a notebook) falls back to cloudpickle, which pickles them by value. Either output is read back
with :func:`pickle.loads`.
"""

from __future__ import annotations

import pickle
from typing import Any

import cloudpickle

from .exceptions import SerializationError

__all__ = ["dumps", "loads"]


def dumps(obj: Any, *, what: str) -> bytes:
    """Pickle ``obj``; ``what`` names it in the error ("the result of task 'x'").

    Raises:
        SerializationError: neither pickle nor cloudpickle can serialize the value.
    """
    try:
        return pickle.dumps(obj, protocol=5)
    except Exception:  # noqa: BLE001 - fall back to the slower, more capable pickler
        pass
    try:
        return bytes(cloudpickle.dumps(obj, protocol=5))
    except Exception as exc:  # noqa: BLE001 - any failure: report it as ours
        raise SerializationError(
            f"cannot store {what}: a value of type {type(obj).__module__}."
            f"{type(obj).__qualname__} cannot be pickled ({exc}). Fix: return plain data "
            "(a list instead of a generator, a path instead of an open file, no locks or "
            "connections)."
        ) from None


def loads(data: bytes) -> Any:
    """Unpickle what :func:`dumps` wrote."""
    return pickle.loads(data)
