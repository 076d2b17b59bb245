"""The runtime: the task spec, the run context and its write buffer, the call path,
the attempt lifecycle, interrupts, history, retries and configuration."""

from typing import Any as _Any


def __getattr__(name: str) -> _Any:
    """A name release 0.1.0's module of this name had (an old pickle asks for it), where it
    is now (see :mod:`durably._keys.moved`)."""
    from durably._keys.moved import moved_name

    return moved_name(__name__, name)
