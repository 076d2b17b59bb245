"""Process-wide settings: the default store."""

from __future__ import annotations

import threading

from ._store import DiskStore, Store
from .exceptions import DefinitionError

__all__ = ["configure", "default_store"]

_lock = threading.Lock()
_default: Store | None = None


def default_store() -> Store:
    """The store used when none was chosen: set by :func:`configure`, else a
    :class:`DiskStore` at ``$DURABLY_DIR`` or ``./.durably``."""
    global _default
    store = _default
    if store is None:
        with _lock:
            if _default is None:
                _default = DiskStore()
            store = _default
    return store


def configure(*, store: Store | None = None) -> None:
    """Set process-wide defaults.

    Args:
        store: The store for every task and entrypoint that does not name its own
            (``@entrypoint(store=...)``). None restores the default ``DiskStore``
            (``$DURABLY_DIR``, else ``./.durably``), read again from the environment.

    Raises:
        DefinitionError: ``store`` does not implement the :class:`~durably.Store` protocol.

    Example:
        >>> import durably, tempfile
        >>> durably.configure(store=durably.DiskStore(tempfile.mkdtemp()))
        >>> durably.configure()  # back to $DURABLY_DIR or ./.durably
    """
    global _default
    if store is not None and not isinstance(store, Store):
        raise DefinitionError(
            f"configure(store=...) needs a durably store (DiskStore, MemoryStore or an object "
            f"implementing durably.Store), got {type(store).__qualname__}"
        )
    with _lock:
        _default = store
