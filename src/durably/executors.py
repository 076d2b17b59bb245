"""Where the bodies of a fan-out run: ``task.map(items, executor=...)`` and
``executor.submit(task, *args)``.

- :class:`Thread` (the default, ``executor="thread"``): threads of this process. Tasks
  called inside a body are child steps of the run.
- :class:`Process` (``executor="process"``): worker processes, for CPU-bound Python code.
  Functions, arguments and results travel with cloudpickle, so tasks defined in ``__main__``
  or in a notebook work.
- :class:`Dask` (``executor="dask"`` for the current client): a ``distributed.Client`` you
  created, on one machine or many (``pip install 'durably[dask]'``).

On every executor the step identity of each item is assigned in input order before
anything runs, and each result is journaled and cached by the caller as it comes back: a
fan-out killed halfway and run again executes exactly the items that had not finished.

A worker process has no run: tasks called inside a body there are plain cached calls
against the caller's store (a :class:`~durably.DiskStore` is shared by its directory, which
is process-safe). A worker that cannot reach that directory (a Dask worker on another machine
without a shared filesystem), or a store that cannot be shared (``MemoryStore``), gives that
worker an in-memory cache of its own, with a warning on the ``durably`` logger; the items'
own results always come back and are journaled and cached by the caller. A task's
``retry=`` and ``timeout=`` apply to every item; on threads each failed try is journaled, in
a worker process the tries happen there and the item's final outcome is journaled.

Example:
    >>> import durably, tempfile
    >>> from durably.executors import Thread
    >>> durably.configure(store=durably.DiskStore(tempfile.mkdtemp()))
    >>> @durably.task
    ... def inc(x):
    ...     return x + 1
    >>> inc.map(range(3), executor=Thread(max_workers=2))
    [1, 2, 3]
    >>> durably.configure()
"""

from __future__ import annotations

from durably._executors.pools import Dask, Executor, Process, Thread

__all__ = ["Dask", "Executor", "Process", "Thread"]
