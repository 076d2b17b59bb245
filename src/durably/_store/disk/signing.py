"""The process-wide signing key: the key of ``durably.configure(key=...)``, which every
:class:`~durably.DiskStore` not given a key of its own signs with, and its generation.

Apart from the store because it belongs to the process, not to one store, and because every
part of a store reads its generation: a store resolves its key again once it changed, and a
read-ahead checks the values it read before again. Read as ``signing._key_generation``: the
name is rebound by :func:`set_default_key`.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from durably._store.integrity import SigningKey, key_from, set_process_key

__all__ = ["set_default_key"]

_key_lock = threading.Lock()
_process_key: SigningKey | None = None
_key_generation = 0


def set_default_key(key: Any) -> None:
    """Sign with ``key`` in every :class:`DiskStore` not given its own (None: fall back to
    ``$DURABLY_KEY`` / ``$DURABLY_KEY_FILE``).

    Raises:
        DefinitionError: the key is not bytes or str, or shorter than 16 bytes.
    """
    global _process_key, _key_generation
    new = key if key is None or isinstance(key, SigningKey) else key_from(
        key, "configure(key=...)")
    with _key_lock:
        _process_key = new
        _key_generation += 1
        set_process_key(new)


def _ctx(*parts: str) -> bytes:
    """The context a signature binds a value to (which slot of which store it belongs in)."""
    return "\x00".join(parts).encode()


def _new_lock_in_child() -> None:
    global _key_lock
    _key_lock = threading.Lock()


#: a forked child gets a new lock (one a thread of the parent held at the fork would never
#: be released in the child)
os.register_at_fork(after_in_child=_new_lock_in_child)
