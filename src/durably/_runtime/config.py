"""Process-wide settings: the default store, the signing key, and ``$DURABLY_LOG``."""

from __future__ import annotations

import logging
import os
import sys
import threading
import warnings
from contextvars import ContextVar
from typing import Any

from durably._store.disk.signing import set_default_key
from durably._store.disk.store import DiskStore
from durably._store.integrity import _process_key_set
from durably._store.urls import open_store_at
from durably.store import Store, _not_a_store

__all__ = ["body_store", "configure", "default_store", "log_from_environment"]

_lock = threading.Lock()
_default: Store | None = None
_UNSET: Any = object()

#: the store of the caller whose item's body runs in this context, on a worker (a Dask
#: worker's thread, a worker process): set around the body by durably._executors.worker. It
#: wins over the process's default store, which the body of another caller (another store)
#: starting on another thread of the same worker changes while this one runs.
body_store: ContextVar[Store | None] = ContextVar("durably_body_store", default=None)


#: what a ``store=`` argument takes: a store, or a path or URL that opens one
StoreLike = Store | str | os.PathLike[str] | None

def default_store() -> Store:
    """The store used when none was chosen: set by :func:`configure`, else the store
    ``$DURABLY_STORE`` names (a URL or a path), else a :class:`DiskStore` at
    ``$DURABLY_DIR`` or ``./.durably``. Inside an item's body on a worker: the store of the
    caller that sent it (:data:`body_store`).

    Raises:
        DefinitionError: ``$DURABLY_STORE`` is a URL no installed backend opens.
    """
    global _default
    store = body_store.get()
    if store is not None:
        return store
    store = _default
    if store is None:
        with _lock:
            if _default is None:
                _default = _from_environment()
            store = _default
    return store


def _from_environment() -> Store:
    """``$DURABLY_STORE`` (it wins over ``$DURABLY_DIR``), else a DiskStore at
    ``$DURABLY_DIR`` or ``./.durably``."""
    url = os.environ.get("DURABLY_STORE", "")
    if url.strip():
        return open_store_at(url, {}, "$DURABLY_STORE")
    return DiskStore()


def configure(*, store: Store | str | os.PathLike[str] | None = _UNSET,
              key: bytes | str | None = _UNSET) -> None:
    """Set process-wide defaults. Called without arguments, restore them all.

    Args:
        store: The store for every task and entrypoint that does not name its own
            (``@entrypoint(store=...)``): a store object, or a URL or a path, as
            ``$DURABLY_STORE`` takes (``"/data/store"``,
            ``"file:///data/store?synchronous=full"``, ``"memory://tests"``, a scheme an
            installed backend registers). None restores the default: the store
            ``$DURABLY_STORE`` names, else a ``DiskStore`` at ``$DURABLY_DIR``, else
            ``./.durably``, read again from the environment.
        key: The signing key (bytes or str, at least 16 bytes) of every ``DiskStore`` not
            given its own ``key=``: each value is then signed when written and verified
            before it is unpickled, and a value not signed with it is never loaded. None
            falls back to ``$DURABLY_KEY``, then the file named by ``$DURABLY_KEY_FILE``,
            then no signing. Keep the key out of your code: read it from a file or a
            secret manager.

    Raises:
        DefinitionError: ``store`` does not implement the :class:`~durably.Store` protocol
            (or is a URL no installed backend opens), or ``key`` is not bytes or str of at
            least 16 bytes.

    Example:
        >>> import durably, secrets, tempfile
        >>> durably.configure(store=durably.DiskStore(tempfile.mkdtemp()),
        ...                   key=secrets.token_bytes(32))
        >>> durably.configure(store="memory://doctest")  # a URL or a path
        >>> durably.configure()  # back to $DURABLY_STORE, $DURABLY_DIR or ./.durably
    """
    global _default
    if store is _UNSET and key is _UNSET:
        store = key = None
    if key is not _UNSET:
        # the key first: a store the URL opens may need it (a PostgreSQL store refuses to
        # open unsigned); put back as it was if the store is refused
        previous = _process_key_set()
        set_default_key(key)  # (validates it before anything changes)
    try:
        if isinstance(store, (str, os.PathLike)):
            store = open_store_at(store, {}, "configure(store=...)")
        if store is not _UNSET and store is not None and not isinstance(store, Store):
            raise _not_a_store(store, "configure(store=...)",
                               "configure(store=durably.DiskStore(\"path/to/store\")) or "
                               "configure(store=\"path/to/store\")")
    except BaseException:
        if key is not _UNSET:
            set_default_key(previous)
        raise
    if store is not _UNSET:
        with _lock:
            _default = store


#: the handler ``$DURABLY_LOG`` gave the ``durably`` logger, if any
_env_handler: logging.Handler | None = None


def log_from_environment() -> None:
    """Apply ``$DURABLY_LOG`` (read when durably is imported): a level name (``debug``,
    ``info``, ``warning``, ``error``) sets the ``durably`` logger to it and sends its records
    to stderr, one line each, and only there (``debug`` logs every lookup of the cache, hit
    or miss, with the reason a miss missed). Unset or empty: logging is left to the
    application (the standard :mod:`logging` configuration). A value that is not a level
    is said in a warning, and ignored."""
    global _env_handler
    text = os.environ.get("DURABLY_LOG", "").strip()
    if not text:
        return
    level = logging.getLevelName(text.upper())
    if not isinstance(level, int):
        warnings.warn(f"durably: DURABLY_LOG={text!r} is not a logging level, and is ignored. "
                      "Fix: DURABLY_LOG=debug (every cache lookup), info or warning.",
                      stacklevel=2)
        return
    logger = logging.getLogger("durably")
    logger.setLevel(level)
    if _env_handler is None:
        _env_handler = logging.StreamHandler(sys.stderr)
        _env_handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(_env_handler)
        logger.propagate = False  # (once: not again through a handler the root may have)


log_from_environment()
