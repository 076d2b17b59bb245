"""Results and arguments to bytes and back.

The standard pickle (protocol 5) is tried first because it is several times faster on plain
data; what it cannot pickle by reference (lambdas, local classes, functions of ``__main__`` in
a notebook) falls back to cloudpickle, which pickles them by value. Either output is read back
with :func:`pickle.loads`.

Open files and streams are refused: cloudpickle would store a file opened for reading by its
content and give back an ``io.StringIO``, a different object that only looks like a success.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import cloudpickle

from .exceptions import SerializationError

__all__ = ["dumps", "loads"]

# in-memory buffers are values (plain pickle stores them as they are), not OS handles
_IN_MEMORY = (io.BytesIO, io.StringIO)


class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]
    """cloudpickle, refusing open files and streams anywhere in the value."""

    def __init__(self, file: io.BytesIO, what: str) -> None:
        super().__init__(file, protocol=5)
        self.what = what

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, io.IOBase) and not isinstance(obj, _IN_MEMORY):
            t = type(obj)
            name = getattr(obj, "name", None)
            shown = f" {name!r}" if isinstance(name, (str, bytes, int)) else ""
            raise SerializationError(
                f"cannot store {self.what}: it holds an open file or stream "
                f"({t.__module__}.{t.__qualname__}{shown}), which cannot be stored. Fix: "
                "use its path (or the data read from it) instead of the open file."
            )
        return super().reducer_override(obj)


def dumps(obj: Any, *, what: str) -> bytes:
    """Pickle ``obj``; ``what`` names it in the error ("the result of task 'x'").

    Raises:
        SerializationError: neither pickle nor cloudpickle can serialize the value, or it
            holds an open file or stream.
    """
    try:
        return pickle.dumps(obj, protocol=5)
    except Exception:  # noqa: BLE001 - fall back to the slower, more capable pickler
        pass
    try:
        with io.BytesIO() as file:
            _Pickler(file, what).dump(obj)
            return file.getvalue()
    except SerializationError:
        raise
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
