"""durably: make ordinary Python functions durable.

``@task`` caches a function's results on disk by its code and inputs; ``@entrypoint`` makes
each call a run with a journal that resumes exactly where it stopped. See the README and
``DESIGN.md`` for the semantics.
"""

from __future__ import annotations

from ._config import configure
from ._decorators import Entrypoint, Task, entrypoint, fork, task
from ._explain import Explanation
from ._files import File, file
from ._hashing import ENCODING_VERSION, digest, register_encoder
from ._history import Checkpoint
from ._interrupt import Interrupt, get_writer, idempotency_key, interrupt
from ._run import Run, get_run, list_runs
from ._store import DiskStore, StepRecord, Store
from ._tracer import Event, RunGraph
from .stategraph import END, START, StateGraph
from .exceptions import (
    DefinitionError,
    DurablyError,
    NoActiveRunError,
    NotFoundError,
    RenderError,
    RunInterrupted,
    RunStateError,
    SerializationError,
    StoreError,
)

__version__ = "0.1.0"

__all__ = [
    "ENCODING_VERSION",
    "END",
    "START",
    "Checkpoint",
    "DefinitionError",
    "DiskStore",
    "DurablyError",
    "Entrypoint",
    "Event",
    "Explanation",
    "File",
    "Interrupt",
    "NoActiveRunError",
    "NotFoundError",
    "RenderError",
    "Run",
    "RunGraph",
    "RunInterrupted",
    "RunStateError",
    "SerializationError",
    "StateGraph",
    "StepRecord",
    "Store",
    "StoreError",
    "Task",
    "configure",
    "digest",
    "entrypoint",
    "file",
    "fork",
    "get_run",
    "get_writer",
    "idempotency_key",
    "interrupt",
    "list_runs",
    "register_encoder",
    "task",
]
