"""durably: make ordinary Python functions durable.

``@task`` caches a function's results on disk by its code and inputs; ``@entrypoint`` makes
each call a run with a journal that resumes exactly where it stopped. See the README and
``DESIGN.md`` for the semantics.
"""

from __future__ import annotations

from ._config import configure
from ._decorators import Entrypoint, Task, entrypoint, task
from ._explain import Explanation
from ._files import File, file
from ._hashing import ENCODING_VERSION, digest, register_encoder
from ._run import Run, get_run, list_runs
from ._store import DiskStore, StepRecord, Store
from .exceptions import (
    DefinitionError,
    DurablyError,
    NotFoundError,
    RunStateError,
    SerializationError,
    StoreError,
)

__version__ = "0.1.0"

__all__ = [
    "ENCODING_VERSION",
    "DefinitionError",
    "DiskStore",
    "DurablyError",
    "Entrypoint",
    "Explanation",
    "File",
    "NotFoundError",
    "Run",
    "RunStateError",
    "SerializationError",
    "StepRecord",
    "Store",
    "StoreError",
    "Task",
    "configure",
    "digest",
    "entrypoint",
    "file",
    "get_run",
    "list_runs",
    "register_encoder",
    "task",
]
