"""File contents as task inputs: :func:`file`."""

from __future__ import annotations

import contextvars
import os
from pathlib import Path
from typing import IO, Any

import xxhash

__all__ = ["File", "file"]

_CHUNK = 1 << 20
_O_BINARY: int = getattr(os, "O_BINARY", 0)  # (Windows: no newline translation)
#: the files digested while it is set (a call's inputs, a fingerprint's values), wherever
#: they are nested, each with its :func:`file_stamp` taken before its content was read: a
#: file written or touched after that (while its task runs, or before it started) keeps
#: that result out of the cache
SEEN: contextvars.ContextVar[list[tuple[File, Any]] | None] = contextvars.ContextVar(
    "durably_files_seen", default=None)


def file_stamp(f: File) -> tuple[int, ...] | None:
    """What os.stat() says of a file that an edit changes (None: it cannot be read)."""
    try:
        st = os.stat(f.path)
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


class File(os.PathLike[str]):
    """A path whose digest is the file's *content*: a task that takes a :class:`File`
    reruns when the file changes, and hits the cache while it does not.

    It is a path-like object: ``open(f)``, ``Path(f)`` and ``f.read_bytes()`` work.
    Immutable, like a path (setting its ``path`` raises ``AttributeError``). Made by
    :func:`file`.

    Example:
        >>> import durably, pathlib, tempfile
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "notes.txt"
        >>> _ = p.write_text("hello")
        >>> f = durably.file(p)
        >>> f.read_text(), pathlib.Path(f) == p
        ('hello', True)
    """

    __slots__ = ("path",)
    path: Path

    def __init__(self, path: str | os.PathLike[str]) -> None:
        object.__setattr__(self, "path", path if isinstance(path, Path) else Path(path))

    def __setattr__(self, name: str, value: Any) -> None:
        # immutable, like the paths it wraps: a task given one cannot change it in place, so
        # no state of it is taken before and after the body (see _runtime/effects.py)
        raise AttributeError(f"durably.File is immutable (cannot set {name!r}); make "
                             "another with durably.file(path)")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"durably.File is immutable (cannot delete {name!r})")

    def __fspath__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        return f"durably.file({str(self.path)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, File) and other.path == self.path

    def __hash__(self) -> int:
        return hash(("durably.File", self.path))

    def __reduce__(self) -> tuple[Any, ...]:
        return (File, (str(self.path),))

    def content_digest(self) -> str:
        """xxh3-128 of the file's bytes (32 hex characters), read in 1 MiB chunks.

        Raises:
            FileNotFoundError: the file does not exist (any other OSError propagates too).
        """
        # read with os.read, unbuffered: open() would add a buffer, an isatty() check, a
        # seek and a second stat (five system calls of the nine a small file cost; a
        # system call costs microseconds on a virtual machine, and every call of a task
        # given a file digests it)
        h = xxhash.xxh3_128()
        fd = os.open(self.path, os.O_RDONLY | _O_BINARY)
        try:
            while chunk := os.read(fd, _CHUNK):
                h.update(chunk)
        except OSError as exc:  # (a directory fails here, not at open): named, as open() does
            raise OSError(exc.errno, exc.strerror, str(self.path)) from None
        finally:
            os.close(fd)
        return str(h.hexdigest())

    def __durably_digest__(self) -> tuple[str, str]:
        seen = SEEN.get()
        if seen is not None:
            seen.append((self, file_stamp(self)))  # (before the read: a write after it shows)
        return (str(self.path), self.content_digest())

    def read_bytes(self) -> bytes:
        """The file's content, as :meth:`pathlib.Path.read_bytes`."""
        return self.path.read_bytes()

    def read_text(self, encoding: str | None = None, errors: str | None = None,
                  newline: str | None = None) -> str:
        """The file's content decoded as text, as :meth:`pathlib.Path.read_text` (its
        ``newline``, new in Python 3.13, is taken on every version), except that the
        encoding is UTF-8 unless ``encoding`` says otherwise (never the locale's).

        Args:
            encoding: The text encoding (default ``"utf-8"``).
            errors: How decoding errors are handled, as :func:`open` takes it
                (``"strict"`` by default, ``"replace"``, ``"ignore"``, ...).
            newline: How line endings are translated, as :func:`open` takes it (default:
                universal newlines, every ending read as ``"\\n"``).

        Raises:
            OSError: the file cannot be read; UnicodeDecodeError: not text in that
                encoding (with ``errors="strict"``).

        Example:
            >>> import durably, pathlib, tempfile
            >>> p = pathlib.Path(tempfile.mkdtemp()) / "latin.txt"
            >>> _ = p.write_bytes(b"caf\\xe9\\r\\n")
            >>> durably.file(p).read_text(errors="replace", newline="")
            'caf\\ufffd\\r\\n'
        """
        with open(self.path, encoding=encoding or "utf-8", errors=errors,
                  newline=newline) as f:
            return f.read()

    def open(self, mode: str = "rb", buffering: int = -1, encoding: str | None = None,
             errors: str | None = None, newline: str | None = None) -> IO[Any]:
        """Open the file, as :meth:`pathlib.Path.open` (same arguments), except that the
        mode is binary (``"rb"``) unless ``mode`` says otherwise.

        Raises:
            OSError: the file cannot be opened.

        Example:
            >>> import durably, pathlib, tempfile
            >>> p = pathlib.Path(tempfile.mkdtemp()) / "notes.txt"
            >>> _ = p.write_text("one")
            >>> with durably.file(p).open("r", encoding="ascii", errors="strict") as f:
            ...     f.read()
            'one'
        """
        return open(self.path, mode, buffering, encoding, errors, newline)


def file(path: str | os.PathLike[str]) -> File:
    """Mark a path as a file input: its digest is the path and the file's content.

    Pass it to a task instead of a plain path, so editing the file makes the task rerun
    (a plain string path would keep hitting the cache after the file changed).

    Args:
        path: A path to an existing file.

    Returns:
        A :class:`File` (path-like).

    Raises:
        FileNotFoundError: no file at ``path``.
        DefinitionError: ``path`` is not a path.

    Example:
        >>> import durably, pathlib, tempfile
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "data.txt"
        >>> _ = p.write_text("one")
        >>> before = durably.digest(durably.file(p))
        >>> _ = p.write_text("two")
        >>> durably.digest(durably.file(p)) == before
        False
    """
    try:
        p = Path(path)
    except TypeError:
        from durably.exceptions import DefinitionError

        raise DefinitionError(
            f"durably.file() takes a path (a str or a pathlib.Path), not {path!r} of type "
            f"{type(path).__name__}. Fix: durably.file('data/input.csv')") from None
    if not p.is_file():
        raise FileNotFoundError(
            f"durably.file({str(path)!r}): no such file"
            + (" (it is a directory)" if p.is_dir() else "")
        )
    return File(p)
