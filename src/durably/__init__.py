"""durably: make ordinary Python functions durable.

``@task`` caches a function's results on disk by its code and inputs; ``@entrypoint`` makes
each call a run with a journal that resumes exactly where it stopped. See the README and
``DESIGN.md`` for the semantics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from durably._decorators.entrypoints import Entrypoint, entrypoint, fork
from durably._decorators.recover import Recovered, recover
from durably._decorators.tasks import Task, task
from durably._decorators.threads import Final
from durably._keys.canonical import ENCODING_VERSION, register_encoder
from durably._keys.files import File, file
from durably._keys.hashing import digest
from durably._keys.moved import install_old_names
from durably._runtime.cancel import cancel_run, cancelled
from durably._runtime.config import configure
from durably._runtime.explain import Explanation
from durably._runtime.history import Checkpoint
from durably._runtime.interrupt import Interrupt, get_writer, idempotency_key, interrupt
from durably._runtime.prune import Removed, prune
from durably._runtime.retry import Retry
from durably._runtime.run import Run, delete_runs, get_run, list_runs
from durably._runtime.sleep import asleep, sleep
from durably._store.disk.store import DiskStore
from durably._store.records import StepRecord
from durably._store.urls import open_store
from durably._trace.tracer import Event, RunGraph
from durably.exceptions import (
    CorruptJournalError,
    DefinitionError,
    DurablyError,
    NoActiveRunError,
    NondeterminismError,
    NotFoundError,
    RenderError,
    ReplayedError,
    RunBusyError,
    RunCancelledError,
    RunInterrupted,
    RunStateError,
    RunTimeoutError,
    SerializationError,
    StoreError,
    TaskTimeoutError,
)
from durably.store import Store

if TYPE_CHECKING:
    from durably._store.postgres import PostgresStore
    from durably.stategraph import END, START, Command, Send, StateGraph

    from . import executors as executors

__version__ = "0.1.0"

_LAZY = {"StateGraph": "stategraph", "START": "stategraph", "END": "stategraph",
         "Send": "stategraph", "Command": "stategraph", "PostgresStore": "_store.postgres"}


def __getattr__(name: str) -> Any:
    """StateGraph, START, END, Send, Command, PostgresStore and the executors module are
    imported on first use, so ``import durably`` stays fast for scripts that only decorate
    functions."""
    import importlib

    if name in _LAZY:
        return getattr(importlib.import_module(f"durably.{_LAZY[name]}"), name)
    if name == "executors":
        return importlib.import_module("durably.executors")
    raise AttributeError(f"module 'durably' has no attribute {name!r}")

install_old_names()  # (a pickle of release 0.1.0 names its modules: durably._keys.moved)

__all__ = [
    "ENCODING_VERSION",
    "END",
    "START",
    "Checkpoint",
    "Command",
    "CorruptJournalError",
    "DefinitionError",
    "DiskStore",
    "DurablyError",
    "Entrypoint",
    "Event",
    "Explanation",
    "File",
    "Final",
    "Interrupt",
    "NoActiveRunError",
    "NondeterminismError",
    "NotFoundError",
    "PostgresStore",
    "Recovered",
    "Removed",
    "RenderError",
    "ReplayedError",
    "Retry",
    "Run",
    "RunBusyError",
    "RunCancelledError",
    "RunGraph",
    "RunInterrupted",
    "RunStateError",
    "RunTimeoutError",
    "Send",
    "SerializationError",
    "StateGraph",
    "StepRecord",
    "Store",
    "StoreError",
    "Task",
    "TaskTimeoutError",
    "asleep",
    "cancel_run",
    "cancelled",
    "configure",
    "delete_runs",
    "digest",
    "entrypoint",
    "file",
    "fork",
    "get_run",
    "get_writer",
    "idempotency_key",
    "interrupt",
    "list_runs",
    "open_store",
    "prune",
    "recover",
    "register_encoder",
    "sleep",
    "task",
]
